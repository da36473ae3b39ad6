"""facebookresearch/detr's checkpoints (the layout of `detr-r50-e632da11.pth` and of the training checkpoints its
`main.py` writes) give the same predictions in vitkit as transformers' `DetrForObjectDetection` with the same
weights, and export back.

The original names and shapes come from a module tree built here as facebookresearch/detr builds its DETR
(models/backbone.py: torchvision's ResNet with frozen BatchNorm, cut after layer4, as `backbone.0.body`;
models/transformer.py: `nn.MultiheadAttention`, `linear1` / `linear2`, `norm1..3`; models/detr.py: the heads); the
values come from a random transformers model through the renames transformers' conversion script applies, written
out below. Nothing here goes through vitkit's table.
"""

import argparse
import re

import pytest
import torch
import torchvision
from safetensors.torch import load_file
from test_convert_detr import assert_same, hf_detr, padded_batch, predictions
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops.misc import FrozenBatchNorm2d

import vitkit
from vitkit.cli import main

# The transformers model of test_convert_detr: width 64, 4 heads, 2 + 2 layers, FFN 128, 10 queries, 5 classes.
SMALL = dict(hidden=64, heads=4, enc=2, dec=2, ffn=128, queries=10, classes=5)
# The same model in vitkit, on a ResNet-18 (basic blocks 2-2-2-2, 64 wide).
VITKIT_SMALL = dict(
    backbone_width=64, hidden_dim=64, num_heads=4, enc_layers=2, dec_layers=2, dim_feedforward=128, num_queries=10,
    num_classes=5,
)  # fmt: skip

# Original name -> transformers' file name, applied in order (transformers' convert_detr_original_pytorch_checkpoint).
TO_TRANSFORMERS = (
    (r"^backbone\.0\.body\.", "model.backbone.conv_encoder.model."),
    (r"^input_proj\.", "model.input_projection."),
    (r"^query_embed\.", "model.query_position_embeddings."),
    (r"^class_embed\.", "class_labels_classifier."),
    (r"^bbox_embed\.", "bbox_predictor."),
    (r"^transformer\.decoder\.norm\.", "model.decoder.layernorm."),
    (r"^transformer\.(encoder|decoder)\.(layers\.\d+)\.norm1\.", r"transformer.\1.\2.self_attn_layer_norm."),
    (r"^transformer\.encoder\.(layers\.\d+)\.norm2\.", r"transformer.encoder.\1.final_layer_norm."),
    (r"^transformer\.decoder\.(layers\.\d+)\.norm2\.", r"transformer.decoder.\1.encoder_attn_layer_norm."),
    (r"^transformer\.decoder\.(layers\.\d+)\.norm3\.", r"transformer.decoder.\1.final_layer_norm."),
    (r"\.multihead_attn\.", ".encoder_attn."),
    (r"\.linear1\.", ".fc1."),
    (r"\.linear2\.", ".fc2."),
    (r"^transformer\.", "model."),
)


def transformers_name(key: str) -> str:
    for pattern, repl in TO_TRANSFORMERS:
        key = re.sub(pattern, repl, key)
    return key


def tree(**children: nn.Module) -> nn.Module:
    module = nn.Module()
    for name, child in children.items():
        module.add_module(name, child)
    return module


def original_detr(
    backbone: str = "resnet18",
    dilation: bool = False,
    hidden: int = 64,
    heads: int = 4,
    enc: int = 2,
    dec: int = 2,
    ffn: int = 128,
    queries: int = 10,
    classes: int = 5,
) -> nn.Module:
    """facebookresearch/detr's DETR module tree (names and shapes; no forward)."""
    resnet = getattr(torchvision.models, backbone)(
        replace_stride_with_dilation=[False, False, dilation], norm_layer=FrozenBatchNorm2d
    )
    body = IntermediateLayerGetter(resnet, return_layers={"layer4": "0"})  # drops avgpool and fc
    channels = 512 if backbone in ("resnet18", "resnet34") else 2048

    def encoder_layer() -> nn.Module:
        return tree(
            self_attn=nn.MultiheadAttention(hidden, heads),
            linear1=nn.Linear(hidden, ffn),
            linear2=nn.Linear(ffn, hidden),
            norm1=nn.LayerNorm(hidden),
            norm2=nn.LayerNorm(hidden),
        )

    def decoder_layer() -> nn.Module:
        return tree(
            self_attn=nn.MultiheadAttention(hidden, heads),
            multihead_attn=nn.MultiheadAttention(hidden, heads),
            linear1=nn.Linear(hidden, ffn),
            linear2=nn.Linear(ffn, hidden),
            norm1=nn.LayerNorm(hidden),
            norm2=nn.LayerNorm(hidden),
            norm3=nn.LayerNorm(hidden),
        )

    return tree(
        transformer=tree(
            encoder=tree(layers=nn.ModuleList([encoder_layer() for _ in range(enc)])),  # post-norm: no final norm
            decoder=tree(layers=nn.ModuleList([decoder_layer() for _ in range(dec)]), norm=nn.LayerNorm(hidden)),
        ),
        class_embed=nn.Linear(hidden, classes + 1),
        bbox_embed=tree(
            layers=nn.ModuleList([nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 4)])
        ),
        query_embed=nn.Embedding(queries, hidden),
        input_proj=nn.Conv2d(channels, hidden, 1),
        backbone=nn.Sequential(tree(body=body), nn.Identity()),  # Joiner(Backbone, sine position encoding)
    )


def original_state(theirs: dict[str, torch.Tensor], original: nn.Module) -> dict[str, torch.Tensor]:
    """The original-layout state dict holding transformers' tensors `theirs` (its file names)."""
    out, used = {}, set()
    for key, like in original.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        if leaf.startswith("in_proj_"):  # nn.MultiheadAttention: q, k, v stacked along dim 0
            names = [f"{transformers_name(prefix + '.')}{p}_proj.{leaf[len('in_proj_') :]}" for p in "qkv"]
            value = torch.cat([theirs[n] for n in names])
        else:
            names = [transformers_name(key)]
            value = theirs[names[0]]
        assert value.shape == like.shape, (key, value.shape, like.shape)
        out[key] = value.clone()
        used.update(names)
    assert used == set(theirs)  # every transformers tensor has its place: the table above is whole
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(transformers model, its weights in the original layout)."""
    theirs = hf_detr(backbone="resnet18", use_timm_backbone=True)
    directory = tmp_path_factory.mktemp("hf")
    theirs.save_pretrained(directory)
    return theirs, original_state(load_file(directory / "model.safetensors"), original_detr(**SMALL))


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_original_checkpoint_gives_the_same_predictions(checkpoint, tmp_path, backend):
    theirs, state = checkpoint
    path = tmp_path / "detr-r18.pth"
    torch.save({"model": state}, path)  # as the released files: {"model": state_dict}
    ours = vitkit.create_model("detr_tiny", **VITKIT_SMALL, attn_backend=backend).eval()
    report = vitkit.load_weights(ours, path)
    assert (report.format, report.unwrapped, report.loaded) == ("detr", ["entry 'model'"], len(ours.state_dict()))
    images, mask = padded_batch()
    expected = predictions(theirs, images, mask)
    assert expected[1].std() > 0.05  # boxes that vary: the comparison sees every layer
    assert_same(predictions(ours, images, mask), expected)
    # nn.MultiheadAttention's in_proj is vitkit's fused qkv as it is
    in_proj = state["transformer.decoder.layers.1.multihead_attn.in_proj_weight"]
    assert torch.equal(ours.decoder.layers[1].cross_attn.qkv.weight, in_proj)


def test_training_checkpoint_with_optimizer_and_args(checkpoint, tmp_path, capsys):
    """main.py's checkpoint.pth: the model beside the optimizer, schedule, epoch and its argparse.Namespace."""
    theirs, state = checkpoint
    params = [nn.Parameter(t.clone()) for t in state.values() if t.is_floating_point()][:4]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4)
    sum(p.sum() for p in params).backward()
    optimizer.step()  # moment buffers in the optimizer's state
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 200)
    args = argparse.Namespace(lr=1e-4, backbone="resnet18", dilation=False, pre_norm=False, frozen_weights=None)
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {"model": state, "optimizer": optimizer.state_dict(), "lr_scheduler": schedule.state_dict(), "epoch": 299,
         "args": args},
        path,
    )  # fmt: skip
    ours = vitkit.create_model("detr_tiny", **VITKIT_SMALL).eval()
    assert vitkit.load_weights(ours, path).format == "detr"
    images, mask = padded_batch()
    assert_same(predictions(ours, images, mask), predictions(theirs, images, mask))

    # `vitkit convert` reads it (format recognised) and writes it back in the original layout
    sets = [a for k, v in VITKIT_SMALL.items() for a in ("--set", f"{k}={v}")]
    assert main(["convert", str(path), str(tmp_path / "vk"), "--model", "detr_tiny", *sets]) == 0
    assert "detr layout" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "vk"), str(tmp_path / "back.pth"), "--to", "detr"]) == 0
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    assert set(back) == {"model"} and back["model"].keys() == state.keys()
    assert all(torch.equal(back["model"][k], v) for k, v in state.items())


def test_export_writes_the_original_layout(checkpoint, tmp_path):
    _, state = checkpoint
    ours = vitkit.create_model("detr_tiny", **VITKIT_SMALL).eval()
    vitkit.load_weights(ours, state)
    written = vitkit.export_weights(ours, tmp_path / "detr.pth", format="detr")
    obj = torch.load(written, weights_only=True)
    assert set(obj) == {"model"}  # what DETR's main.py --resume and hubconf read: checkpoint["model"]
    original = original_detr(**SMALL)
    expected = original.state_dict()
    assert {k: v.shape for k, v in obj["model"].items()} == {k: v.shape for k, v in expected.items()}
    original.load_state_dict(obj["model"])  # strict: exactly the original module tree's keys
    assert all(torch.equal(obj["model"][k], v) for k, v in state.items())

    flat = vitkit.export_weights(ours, tmp_path / "detr.safetensors", format="detr")  # one flat mapping
    assert all(torch.equal(t, state[k]) for k, t in load_file(flat).items()) and load_file(flat).keys() == state.keys()
    again = vitkit.create_model("detr_tiny", **VITKIT_SMALL)
    assert vitkit.load_weights(again, flat).format == "detr"
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values(), strict=True))
    # vitkit's own names are still recognised as vitkit's (the original shares input_proj and query_embed)
    assert vitkit.load_weights(again, ours.state_dict()).format == "vitkit"


def test_resnet50_dc5_layout_round_trip(tmp_path):
    """Bottleneck blocks (conv3 / bn3, a downsample in layer1) with DC5: the tree of detr-r50-dc5 at a small width."""
    original = original_detr("resnet50", dilation=True, **{**SMALL, "classes": 91})
    torch.manual_seed(0)
    state = {k: torch.randn_like(v) for k, v in original.state_dict().items()}
    ours = vitkit.create_model("detr_resnet50_dc5", **{**VITKIT_SMALL, "num_classes": 91})
    report = vitkit.load_weights(ours, {"model": state})
    assert report.format == "detr" and report.loaded == len(state)
    assert torch.equal(
        ours.backbone.layer1[0].downsample[1].running_var, state["backbone.0.body.layer1.0.downsample.1.running_var"]
    )
    vitkit.export_weights(ours, tmp_path / "r50dc5.pth", format="detr")
    back = torch.load(tmp_path / "r50dc5.pth", weights_only=True)["model"]
    assert back.keys() == state.keys() and all(torch.equal(back[k], v) for k, v in state.items())

    # a BatchNorm2d's step counter (DETR's frozen norms have none) is dropped and reported
    counters = {f"backbone.0.body.{n}.num_batches_tracked": torch.tensor(5) for n in ("bn1", "layer4.2.bn3")}
    report = vitkit.load_weights(ours, {**state, **counters})
    assert sorted(report.dropped) == sorted(counters) and report.loaded == len(state)


def test_wrong_and_partial_checkpoints(checkpoint, tmp_path):
    _, state = checkpoint
    ours = vitkit.create_model("detr_tiny", **VITKIT_SMALL)

    partial = {k: v for k, v in state.items() if not k.startswith("transformer.decoder.layers.1.")}
    # the last decoder layer missing reads as a shallower DETR
    with pytest.raises(ValueError, match=r"state dict is a DETR with dec_layers 1, the model has 2: .*dec_layers=1"):
        vitkit.load_weights(ours, partial)
    no_bias = {k: v for k, v in state.items() if k != "transformer.encoder.layers.0.self_attn.in_proj_bias"}
    with pytest.raises(ValueError, match=re.escape("1 missing ['encoder.layers.0.self_attn.qkv.bias']")):
        vitkit.load_weights(ours, no_bias)
    # a pre-norm model (--pre_norm) has an encoder norm that vitkit's post-norm DETR has no place for
    pre_norm = {
        **state,
        "transformer.encoder.norm.weight": torch.ones(64),
        "transformer.encoder.norm.bias": torch.zeros(64),
    }
    with pytest.raises(ValueError, match=re.escape("2 unexpected ['transformer.encoder.norm.weight'")):
        vitkit.load_weights(ours, pre_norm)
    deeper = vitkit.create_model("detr_tiny", **{**VITKIT_SMALL, "enc_layers": 3})
    with pytest.raises(ValueError, match=re.escape("is a DETR with enc_layers 2, the model has 3: build the model")):
        vitkit.load_weights(deeper, state)
    other_classes = vitkit.create_model("detr_tiny", **{**VITKIT_SMALL, "num_classes": 7})
    with pytest.raises(ValueError, match="has a classifier for 5 classes, the model 7"):
        vitkit.load_weights(other_classes, state)

    vit = vitkit.create_model("vit_base_patch16_224", img_size=32, patch_size=4, embed_dim=32, depth=1, num_heads=4)
    with pytest.raises(
        ValueError,
        match=r"not a checkpoint of a vit model in a known format \(.*, detr, deformable_detr.*\): it looks like a "
        r"detr checkpoint",
    ):
        vitkit.load_weights(vit, {"model": state})
    with pytest.raises(ValueError, match="there is no detr layout for vit models"):
        vitkit.load_weights(vit, state, format="detr")
    with pytest.raises(ValueError, match="there is no detr layout for vit models"):
        vitkit.export_weights(vit, tmp_path / "vit.pth", format="detr")


def test_exports_the_original_code_cannot_build(tmp_path):
    narrow = vitkit.create_model("detr_tiny")  # a 32-wide ResNet-18 layout: no torchvision model
    with pytest.raises(
        ValueError, match=r"facebookresearch/detr's DETR needs a torchvision ResNet \(resnet18, .*width 32"
    ):
        vitkit.export_weights(narrow, tmp_path / "out.pth", format="detr")
    basic_dc5 = vitkit.create_model(
        "detr_tiny", backbone_width=64, dilation=True
    )  # torchvision's BasicBlock does not dilate
    with pytest.raises(ValueError, match="bottleneck blocks to dilate \\(DC5\\): torchvision's resnet18 cannot"):
        vitkit.export_weights(basic_dc5, tmp_path / "out.pth", format="detr")
    assert not (tmp_path / "out.pth").exists()
