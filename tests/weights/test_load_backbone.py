"""A ResNet classifier's file (torchvision's `resnet18` / `resnet50`, timm's of the same names, random weights) into a
detector: the backbone becomes the file's and computes what its body computes, `fc` is dropped, the rest keeps its
initialisation and the report says so; a file of another ResNet names the layers that do not fit and the models it
fits; such a file is never written."""

import math

import pytest
import timm
import torch
import torchvision

import vitkit
from vitkit.weights import CheckpointMismatch

# detr_digits' and deformable_detr_digits' layouts at a size that loads in milliseconds (the backbone aside)
TINY = dict(hidden_dim=32, num_heads=2, dim_feedforward=32, num_queries=6, enc_layers=1, dec_layers=2)
# detr_digits dilates its last stage (DC5); the classifier's body does not
DETECTORS = {"detr_digits": dict(dilation=False), "deformable_detr_digits": {}}


def classifier(library: str, name: str) -> torch.nn.Module:
    """A ResNet classifier of `library` with every weight, bias and BatchNorm statistic moved off its initial value,
    at a scale that keeps activations O(1) (norms around 1, matrices ~ 1 / sqrt(fan_in)); step counts as they are."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False) if library == "timm" else getattr(torchvision.models, name)()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, t in [*model.named_parameters(), *model.named_buffers()]:
            if key.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif t.ndim == 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1 + (1.0 if key.endswith("weight") else 0.0))
            elif t.ndim > 1:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t[0].numel()))
    return model.eval()


def body(resnet: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """layer4's map of a torchvision or timm ResNet, written out: stem, max-pool, the four stages."""
    act = resnet.act1 if hasattr(resnet, "act1") else resnet.relu  # timm's name, torchvision's
    x = resnet.maxpool(act(resnet.bn1(resnet.conv1(x))))
    for stage in (resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4):
        x = stage(x)
    return x


@pytest.fixture(scope="module")
def resnet50_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("resnet50") / "resnet50.pth"
    torch.save(classifier("torchvision", "resnet50").state_dict(), path)
    return path


@pytest.mark.parametrize(
    ("library", "name"),
    [("torchvision", "detr_digits"), ("torchvision", "deformable_detr_digits"), ("timm", "deformable_detr_digits")],
)
def test_a_resnet_classifier_fills_the_backbone_alone(tmp_path, library, name):
    theirs = classifier(library, "resnet18")
    torch.save(theirs.state_dict(), tmp_path / "resnet18.pth")
    torch.manual_seed(1)
    ours = vitkit.create_model(name, backbone_width=64, num_classes=3, **TINY, **DETECTORS[name]).eval()
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    report = vitkit.load_weights(ours, tmp_path / "resnet18.pth")

    state, source = ours.state_dict(), theirs.state_dict()
    backbone = [k for k in state if k.startswith("backbone.")]
    assert report.format == "torchvision" and report.loaded_keys == backbone and report.loaded == len(backbone) == 100
    for key in backbone:  # torchvision's names under `backbone.`
        assert torch.equal(state[key], source[key.removeprefix("backbone.")]), key
    for key in state.keys() - set(backbone):
        assert torch.equal(state[key], before[key]), key  # as initialised
    assert report.reset == [k for k in state if k.startswith("class_embed.")] and report.checkpoint_classes is None
    assert report.uncovered == [k for k in state if not k.startswith(("backbone.", "class_embed."))]
    counts = [k for k in source if k.endswith(".num_batches_tracked")]  # torchvision's and timm's BatchNorm2d
    assert sorted(report.dropped) == sorted(["fc.weight", "fc.bias", *counts]) and len(counts) == 20
    assert not report.head_reset and report.adapted

    # The backbone's frozen norms are the classifier's BatchNorms in eval mode: equal maps, in float64.
    x = torch.randn(2, 3, 48, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours.double().backbone(x)[-1], body(theirs.double(), x), rtol=1e-10, atol=1e-10)


def test_a_resnet_of_another_size_names_the_layers_and_the_models_it_fits(resnet50_file):
    path = resnet50_file
    half_width_resnet18 = vitkit.create_model("deformable_detr_digits", **TINY)
    with pytest.raises(CheckpointMismatch) as caught:
        vitkit.load_weights(half_width_resnet18, path)
    # ResNet-18 at width 32 has 40 layers (stem conv and norm, 8 blocks of 2 convs and 2 norms, 3 shortcuts of a conv
    # and a norm), all in ResNet-50 under the same names, of other shapes; ResNet-50 has 106 (stem 2, 16 blocks of
    # 3 convs and 3 norms, 4 shortcuts of 2): 66 the model lacks.
    assert caught.value.problem == (
        f"{path} is a torchvision ResNet with backbone_width 64, backbone_depths (3, 4, 6, 3), backbone_block "
        "bottleneck; the model's backbone has backbone_width 32, backbone_depths (2, 2, 2, 2), backbone_block basic; "
        "40 layers of another shape [backbone.conv1, backbone.bn1, backbone.layer1.0.conv1, backbone.layer1.0.bn1, "
        "...] (backbone.conv1.weight: checkpoint (64, 3, 7, 7), model (32, 3, 7, 7)); 66 layers not in the model "
        "[backbone.layer1.0.conv3, backbone.layer1.0.bn3, backbone.layer1.0.downsample.0, "
        "backbone.layer1.0.downsample.1, ...]"
    )
    assert caught.value.fields == dict(backbone_width=64, backbone_depths=(3, 4, 6, 3), backbone_block="bottleneck")
    assert caught.value.models == [
        "deformable_detr_resnet50", "deformable_detr_resnet50_box_refine", "deformable_detr_resnet50_two_stage"
    ]  # fmt: skip
    assert caught.value.reset_head is None  # no classifier choice makes it fit
    # The models named do fit.
    report = vitkit.load_weights(vitkit.create_model("deformable_detr_resnet50", **TINY), path)
    assert report.loaded == 265 and report.format == "torchvision"  # 53 convs, 53 norms of 4 tensors


def test_a_resnet_file_is_named_as_one_for_other_models(resnet50_file):
    with pytest.raises(CheckpointMismatch, match=r"it looks like a torchvision ResNet checkpoint \(first keys") as c:
        vitkit.load_weights(vitkit.create_model("vit_tiny_patch16_224"), resnet50_file)
    assert c.value.models == [
        "detr_resnet50", "detr_resnet50_dc5", "detr_resnet50_panoptic", "deformable_detr_resnet50",
        "deformable_detr_resnet50_box_refine", "deformable_detr_resnet50_two_stage",
    ]  # fmt: skip


@pytest.mark.parametrize(("name", "whole"), [("detr_digits", "detr"), ("deformable_detr_digits", "deformable_detr")])
def test_a_detector_is_not_written_as_a_resnet_classifier(tmp_path, name, whole):
    model = vitkit.create_model(name, backbone_width=64, **TINY)
    with pytest.raises(ValueError, match=f"write the whole model as vitkit, hf or {whole}$"):
        vitkit.export_weights(model, tmp_path / "resnet.pth", "torchvision")
    assert not (tmp_path / "resnet.pth").exists()
