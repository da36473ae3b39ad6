"""`vitkit train --init` for detectors: from a transformers DETR / Deformable DETR directory (small configs, random
weights, never downloaded), the same weights as facebookresearch/detr and fundamentalvision/Deformable-DETR files,
a vitkit detector directory, and a torchvision ResNet classifier (the backbone alone). Every tensor but the class
heads equals the checkpoint's, the class heads are fresh for the data's classes (at the focal loss's prior where it
trains with it), the report and the run's summary say what was loaded, kept and reset, and a backbone of another
size names its layers and the models it fits."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
import torch
import torchvision
import transformers
from torch import nn

import vitkit
from vitkit.cli.messages import TRAIN, cli_message
from vitkit.data.shapes import write_shapes_folder
from vitkit.detection import FOCAL_PRIOR
from vitkit.train import fit, load_for_finetune
from vitkit.train.loop import build_training_model
from vitkit.train.model import describe_init
from vitkit.weights import CheckpointMismatch, deformable_detr, detr, load_report, saved_config

# transformers' own ResNet, narrow (bottleneck blocks 1-2-1-1 from a 16-channel stem), under 2 + 2 layers of width 64
# with 4 heads; 10 queries; COCO's 91 classes.
NARROW_RESNET = dict(
    layer_type="bottleneck", depths=[1, 2, 1, 1], embedding_size=16, hidden_sizes=[64, 128, 256, 512]
)  # fmt: skip
SMALL = dict(
    d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=10, num_labels=91, attn_implementation="eager",
)  # fmt: skip
# deformable_detr_digits' layout as small as test_fit_detector's (D a multiple of 32, its GroupNorm groups)
TINY_DEFORMABLE_DETR = dict(
    backbone_width=8, hidden_dim=32, num_heads=2, dim_feedforward=32, num_queries=6, enc_layers=1, dec_layers=2
)  # fmt: skip
BIAS = -math.log((1 - FOCAL_PRIOR) / FOCAL_PRIOR)  # a class at probability FOCAL_PRIOR under the sigmoid


pytestmark = pytest.mark.usefixtures("hub_offline")  # tests/conftest.py: no Hub look-ups


def randomize(model: nn.Module) -> nn.Module:
    """Every floating parameter and buffer random at a scale that keeps activations O(1), off its initial value."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point() or t.ndim == 0:
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif t.ndim == 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t[0].numel()))
    return model.eval()


@pytest.fixture(scope="module")
def hf_deformable_detr(tmp_path_factory):
    """transformers' `DeformableDetrForObjectDetection` with box refinement (a class head per decoder layer), saved
    with save_pretrained: (the model, its directory)."""
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(**NARROW_RESNET, out_features=["stage2", "stage3", "stage4"])
    config = transformers.DeformableDetrConfig(
        **SMALL, backbone_config=backbone, encoder_n_points=2, decoder_n_points=3, with_box_refine=True
    )
    theirs = randomize(transformers.DeformableDetrForObjectDetection(config))
    directory = tmp_path_factory.mktemp("hf") / "deformable_detr"
    theirs.save_pretrained(directory)
    return theirs, directory


@pytest.fixture(scope="module")
def hf_detr(tmp_path_factory):
    """transformers' `DetrForObjectDetection`, saved with save_pretrained: (the model, its directory)."""
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(**NARROW_RESNET, out_features=["stage4"])
    config = transformers.DetrConfig(**SMALL, use_timm_backbone=False, backbone_config=backbone)
    theirs = randomize(transformers.DetrForObjectDetection(config))
    directory = tmp_path_factory.mktemp("hf") / "detr"
    theirs.save_pretrained(directory)
    return theirs, directory


def config_fields(directory) -> dict:
    """The fields of the model saved in `directory`, as --model-arg would give them (the classes aside)."""
    fields = dataclasses.asdict(saved_config(directory))
    del fields["num_classes"]
    return fields


def assert_finetuned(model: nn.Module, reference: nn.Module, heads: list[str], rows: int) -> None:
    """Every tensor but the class heads `heads` equals the reference's; each head has `rows` outputs and is not the
    reference's first rows."""
    state, expected = model.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    for key, value in state.items():
        if key.rsplit(".", 1)[0] in heads:
            assert value.shape[0] == rows and expected[key].shape[0] != rows, key
            assert not torch.equal(value, expected[key][:rows]), key  # not the checkpoint's head cut by position
        else:
            assert torch.equal(value, expected[key]), key


def test_from_a_transformers_deformable_detr_directory(hf_deformable_detr, tmp_path):
    theirs, directory = hf_deformable_detr
    model = load_for_finetune(directory, 3, prior=FOCAL_PRIOR)
    reference = vitkit.from_pretrained(directory)  # transformers' weights in vitkit's names, 91 classes
    heads = ["class_embed.0", "class_embed.1"]  # a head per decoder layer
    assert_finetuned(model, reference, heads, 3)
    assert model.config.num_classes == 3 and model.config.box_refine
    for head in model.class_embed:
        assert torch.equal(head.bias, torch.full((3,), BIAS))
    # A few tensors against transformers' own names: the backbone's stem, a fused q | k | v, a box head.
    source = theirs.state_dict()
    stem = next(k for k in source if k.endswith("embedder.embedder.convolution.weight"))
    assert torch.equal(model.backbone.conv1.weight, source[stem])
    qkv = torch.cat([source[f"model.decoder.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(model.decoder.layers[1].self_attn.qkv.weight, qkv)
    assert torch.equal(model.bbox_embed[1].layers[2].weight, source["bbox_embed.1.layers.2.weight"])

    report = load_report(model)
    assert (report.source, report.format) == (str(directory), "hf")
    loaded = len(reference.state_dict()) - 4
    assert describe_init(report, 3) == (
        f"loaded {loaded} tensors (level_embed, backbone, input_proj, encoder, decoder, query_embed, reference_points, "
        "bbox_embed); reset class_embed.0..1 for 3 classes (the checkpoint's head has 91)"
    )

    # The same weights into the registry model (--model), and as fundamentalvision/Deformable-DETR's file.
    named = load_for_finetune(
        directory, 3, model="deformable_detr_digits", prior=FOCAL_PRIOR, **config_fields(directory)
    )
    assert_finetuned(named, reference, heads, 3)
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": deformable_detr.ORIGINAL.from_vitkit(reference.state_dict()), "epoch": 49}, path)
    original = load_for_finetune(path, 3, model="deformable_detr_digits", prior=FOCAL_PRIOR, **config_fields(directory))
    assert_finetuned(original, reference, heads, 3)
    assert load_report(original).format == "deformable_detr" and load_report(original).checkpoint_classes == 91


def test_from_a_transformers_detr_directory(hf_detr, tmp_path):
    theirs, directory = hf_detr
    reference = vitkit.from_pretrained(directory)
    # softmax cross-entropy ("ce"): a fresh head as DETR initialises it, 3 classes and "no object"
    model = load_for_finetune(directory, 3)
    assert_finetuned(model, reference, ["class_embed"], 4)
    assert model.class_embed.bias.unique().numel() == 4
    source = theirs.state_dict()
    assert torch.equal(model.bbox_embed.layers[0].weight, source["bbox_predictor.layers.0.weight"])
    assert describe_init(load_report(model), 3) == (
        f"loaded {len(reference.state_dict()) - 2} tensors (backbone, input_proj, query_embed, encoder, decoder, "
        "bbox_embed); reset class_embed for 3 classes (the checkpoint's head has 91)"
    )
    # the focal loss: every class and "no object" start at the prior
    focal = load_for_finetune(directory, 3, prior=FOCAL_PRIOR)
    assert_finetuned(focal, reference, ["class_embed"], 4)
    assert torch.equal(focal.class_embed.bias, torch.full((4,), BIAS))
    # facebookresearch/detr's file
    path = tmp_path / "detr.pth"
    torch.save({"model": detr.ORIGINAL.from_vitkit(reference.state_dict())}, path)
    original = load_for_finetune(path, 3, model="detr_digits", **config_fields(directory))
    assert_finetuned(original, reference, ["class_embed"], 4)
    assert load_report(original).format == "detr"


def test_from_a_vitkit_detector_directory(tmp_path):
    torch.manual_seed(0)
    trained = randomize(vitkit.create_model("deformable_detr_digits", num_classes=91, **TINY_DEFORMABLE_DETR))
    vitkit.save_pretrained(trained, tmp_path / "coco")
    for model in (
        load_for_finetune(tmp_path / "coco", 3, prior=FOCAL_PRIOR),
        load_for_finetune(tmp_path / "coco", 3, model="deformable_detr_digits", prior=0.01, **TINY_DEFORMABLE_DETR),
    ):
        assert_finetuned(model, trained, ["class_embed.0", "class_embed.1"], 3)
        assert all(torch.equal(head.bias, torch.full((3,), BIAS)) for head in model.class_embed)
        assert load_report(model).reset == [f"class_embed.{i}.{t}" for i in range(2) for t in ("weight", "bias")]
    # The same classes: the whole model, its head included, nothing to say beyond the count.
    same = load_for_finetune(tmp_path / "coco", 91, prior=FOCAL_PRIOR)
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in same.state_dict().items())
    report = load_report(same)
    assert not report.adapted and report.reset == [] and report.loaded == len(trained.state_dict())
    vitkit.save_pretrained(vitkit.create_model("vit_digits_patch7_28"), tmp_path / "vit")
    with pytest.raises(ValueError, match="prior is the starting probability of a detector's classes; vit is no"):
        load_for_finetune(tmp_path / "vit", 3, prior=FOCAL_PRIOR)


def test_from_a_resnet_classifier_the_backbone_alone(tmp_path):
    torch.manual_seed(0)
    resnet18 = randomize(torchvision.models.resnet18())
    torch.save(resnet18.state_dict(), tmp_path / "resnet18.pth")
    args = dict(TINY_DEFORMABLE_DETR, backbone_width=64)  # torchvision's ResNet-18: 64 wide, basic blocks 2-2-2-2
    torch.manual_seed(1)
    fresh = vitkit.create_model("deformable_detr_digits", num_classes=3, **args)
    torch.manual_seed(1)
    model = load_for_finetune(tmp_path / "resnet18.pth", 3, model="deformable_detr_digits", prior=FOCAL_PRIOR, **args)
    state, source, initial = model.state_dict(), resnet18.state_dict(), fresh.state_dict()
    for key, value in state.items():
        if key.startswith("backbone."):
            assert torch.equal(value, source[key.removeprefix("backbone.")]), key
        elif not key.startswith("class_embed."):
            assert torch.equal(value, initial[key]), key  # the rest as the registry model initialises it
    assert all(torch.equal(head.bias, torch.full((3,), BIAS)) for head in model.class_embed)
    assert describe_init(load_report(model), 3) == (
        "loaded 100 tensors (backbone); kept as initialised: level_embed, input_proj, encoder, decoder, query_embed, "
        "reference_points, bbox_embed (not in the checkpoint); reset class_embed.0..1 for 3 classes (the checkpoint "
        "has no class head)"
    )

    torch.save(torchvision.models.resnet50().state_dict(), tmp_path / "resnet50.pth")
    with pytest.raises(CheckpointMismatch) as caught:  # into deformable_detr_digits' half-width ResNet-18
        load_for_finetune(tmp_path / "resnet50.pth", 3, model="deformable_detr_digits", **TINY_DEFORMABLE_DETR)
    message = cli_message(caught.value, TRAIN)
    assert message.startswith(f"{tmp_path / 'resnet50.pth'} is a torchvision ResNet with backbone_width 64, ")
    assert "; 40 layers of another shape [backbone.conv1, backbone.bn1, " in message
    assert "; 66 layers not in the model [backbone.layer1.0.conv3, " in message
    assert message.endswith(
        ": pass --model NAME with a registered model of that size: deformable_detr_resnet50, "
        "deformable_detr_resnet50_box_refine, deformable_detr_resnet50_two_stage, or pass --model-arg "
        'backbone_width=64 --model-arg backbone_depths=[3,4,6,3] --model-arg backbone_block="bottleneck"'
    )


def test_a_run_from_a_transformers_directory_alone_builds_the_saved_model(
    hf_deformable_detr, tiny_detector_config, tmp_path
):
    _, directory = hf_deformable_detr
    config = tiny_detector_config(tmp_path / "run", model=None, model_args={}, init=str(directory)).resolved()
    assert config.model is None and config.detection_loss == "focal"  # Deformable DETR's recipe
    model = build_training_model(config, num_classes=10)
    assert model.config.num_classes == 10 and model.config.hidden_dim == 64
    assert all(torch.equal(head.bias, torch.full((10,), BIAS)) for head in model.class_embed)
    assert load_report(model).checkpoint_classes == 91


def test_fit_says_what_the_checkpoint_gave(tmp_path, tiny_detector_config, caplog):
    torch.manual_seed(0)
    coco = randomize(vitkit.create_model("deformable_detr_digits", num_classes=91, **TINY_DEFORMABLE_DETR))
    vitkit.save_pretrained(coco, tmp_path / "coco")
    config = tiny_detector_config(
        tmp_path / "run",
        model="deformable_detr_digits",
        model_args=TINY_DEFORMABLE_DETR,
        init=str(tmp_path / "coco"),
        epochs=1,
    )
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(config)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    lines = summary.splitlines()
    assert lines[0].startswith(f"training deformable_detr_digits (detection), initialised from {tmp_path / 'coco'}: ")
    assert lines[1] == (
        f"  init    vitkit layout: loaded {len(coco.state_dict()) - 4} tensors (level_embed, backbone, input_proj, "
        "encoder, decoder, query_embed, reference_points, bbox_embed); reset class_embed.0..1 for 10 classes (the "
        "checkpoint's head has 91)"
    )
    assert lines[2].startswith("  data    ")
    final = vitkit.from_pretrained(tmp_path / "run" / "final")
    assert final.config.num_classes == 10 and final.class_embed[1].weight.shape == (10, 32)


def test_from_a_hub_repository(hf_deformable_detr, tiny_detector_config, hub_cache, tmp_path, caplog):
    """--init hf-hub:ORG/REPO: the repository's files (a small one in the place of SenseTime's, in the test's Hub
    cache) give the run the weights they give from a path, and the run says and saves where they came from."""
    _, directory = hf_deformable_detr
    hub_cache.put("SenseTime/deformable-detr", directory, commit="0123456789abcdef0123456789abcdef01234567")
    source = "hf-hub:SenseTime/deformable-detr"
    pinned = f"{source}@0123456789abcdef0123456789abcdef01234567"
    config = tiny_detector_config(tmp_path / "run", model=None, model_args={}, init=source, epochs=1, img_size=96)
    assert config.resolved().init == source and config.resolved().detection_loss == "focal"
    models = []
    for init in (source, str(directory)):
        torch.manual_seed(0)
        run = dataclasses.replace(config, init=init).resolved()
        models.append(build_training_model(run, num_classes=10))
    hub, path = models
    assert all(torch.equal(a, b) for a, b in zip(hub.state_dict().values(), path.state_dict().values(), strict=True))
    assert load_report(hub).source == pinned and vitkit.weights.model_info(hub).weights == pinned
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(config)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert pinned in summary
    final = tmp_path / "run" / "final"
    assert vitkit.weights.read_model_info(final).weights == pinned
    assert vitkit.from_pretrained(final).config.num_classes == 10
    # resumed with the cache gone (offline): the repository is not looked up again, the run's own model stands in
    import shutil

    shutil.rmtree(hub_cache.hub / "models--SenseTime--deformable-detr")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(dataclasses.replace(config, epochs=2), resume=True)
    assert f"{source}, a Hub repository, is not looked up again: its architecture is read from" in caplog.text
    assert vitkit.weights.read_model_info(final).weights == pinned  # still the commit the run started from


# deformable_detr_vit_small_dinov2 at the size of the small DINOv2 below: its backbone 2 blocks of width 64
SMALL_DINOV2 = dict(embed_dim=64, depth=2, num_heads=2, window_size=4, global_blocks=(1,))


def test_a_dinov2_directory_fills_a_vit_backbone_and_the_detector_trains(tmp_path, tiny_detector_config, caplog):
    """--init with transformers' DINOv2-with-registers directory and --model deformable_detr_vit_small_dinov2 (its
    windows kept, smaller): the backbone takes every tensor of the directory (without windows its tokens equal
    transformers' model's), the rest starts as initialised, the summary says so, and the run trains on a shapes
    folder and evaluates."""
    torch.manual_seed(0)
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=518,
        patch_size=14, num_register_tokens=4,
    )  # fmt: skip
    theirs = randomize(transformers.Dinov2WithRegistersModel(config))
    theirs.save_pretrained(tmp_path / "dinov2")
    fields = dict(backbone_args=SMALL_DINOV2, **TINY_DEFORMABLE_DETR)
    del fields["backbone_width"]
    model = load_for_finetune(tmp_path / "dinov2", 4, model="deformable_detr_vit_small_dinov2", **fields)
    report = load_report(model)
    assert report.loaded == len(vitkit.from_pretrained(tmp_path / "dinov2").state_dict())
    assert describe_init(report, 4).startswith(f"loaded {report.loaded} tensors (backbone); kept as initialised: ")
    directory = vitkit.from_pretrained(tmp_path / "dinov2").state_dict()
    body = model.backbone.body.state_dict()
    for key, tensor in directory.items():  # every tensor as the directory's model holds it
        torch.testing.assert_close(body[key], tensor, rtol=0, atol=0)
    # without windows, the backbone's tokens are transformers' model's
    fields_global = dict(fields, backbone_args=dict(SMALL_DINOV2, window_size=0, global_blocks=()))
    plain = load_for_finetune(tmp_path / "dinov2", 4, model="deformable_detr_vit_small_dinov2", **fields_global)
    x = torch.randn(1, 3, 112, 140)
    with torch.no_grad():
        ours = plain.backbone.body.forward_intermediates(x, [1], norm=True, intermediates_only=True)[
            0
        ]  # (1, 64, 8, 10)
        ref = theirs(pixel_values=x).last_hidden_state[:, 5:]  # past the class token and the 4 registers
    torch.testing.assert_close(ours.flatten(2).transpose(1, 2), ref, atol=1e-4, rtol=1e-4)
    shapes = write_shapes_folder(tmp_path / "shapes", train=16, val=4)  # `vitkit example-data shapes`, smaller
    run = tiny_detector_config(
        tmp_path / "run", model="deformable_detr_vit_small_dinov2", model_args=fields, init=str(tmp_path / "dinov2"),
        epochs=1, img_size=112, data=str(shapes),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        result = fit(run)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert "loaded" in summary.splitlines()[1] and "(backbone); kept as initialised" in summary.splitlines()[1]
    assert "\n  check   train 16 images, " in summary  # `vitkit check-data`'s line, its warnings at the end
    assert "\n  warning rare classes in train, fewer than 10 boxes: " in summary
    assert result.epochs_done == 1 and result.best_metric == "ap" and math.isfinite(result.last["train_loss"])
    assert result.last["ap"] is not None  # evaluated on the folder's val/
    final = vitkit.from_pretrained(tmp_path / "run" / "final")
    assert final.config.backbone == "vit_small_patch14_reg4_dinov2" and final.config.num_classes == 4
