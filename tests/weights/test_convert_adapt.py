"""Fitting a checkpoint to the model: position-table resampling (as timm), reset_head, training-checkpoint
wrappers, non-strict loading and format recognition."""

import argparse

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed as timm_resample
from timm.models.vision_transformer import checkpoint_filter_fn

import vitkit

TINY = dict(patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5)


def timm_model(name: str = "vit_tiny_patch16_224", img_size: int = 32, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **{**TINY, "img_size": img_size, **overrides}).eval()


@pytest.mark.parametrize("name, prefix", [("vit_tiny_patch16_224", 1), ("deit_tiny_distilled_patch16_224", 2)])
@pytest.mark.parametrize("new_size", [48, 24])
def test_pos_embed_resampled_as_timm(tmp_path, name, prefix, new_size):
    source = timm_model(name).state_dict()
    torch.save(source, tmp_path / "ckpt.pth")
    ours = vitkit.create_model(name, **TINY, img_size=new_size).eval()
    report = vitkit.load_weights(ours, tmp_path / "ckpt.pth")
    grid = new_size // 4
    assert report.resampled == [f"pos_embed: 8x8 -> {grid}x{grid} grid"]
    expected = timm_resample(source["pos_embed"], (grid, grid), num_prefix_tokens=prefix)
    torch.testing.assert_close(ours.pos_embed.data, expected, atol=1e-6, rtol=1e-6)

    # timm's own loading of a checkpoint into a model of another size gives the same logits.
    theirs = timm_model(name, img_size=new_size)
    theirs.load_state_dict(checkpoint_filter_fn(source, theirs))
    x = torch.randn(2, 3, new_size, new_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_resampling_needs_a_square_checkpoint_grid():
    source = vitkit.create_model("vit_tiny_patch16_224", **TINY, img_size=(32, 48)).state_dict()
    ours = vitkit.create_model("vit_tiny_patch16_224", **TINY, img_size=32)
    with pytest.raises(
        ValueError, match=r"state dict: position table \(1, 97, 32\) is not 1 prefix rows plus a square"
    ):
        vitkit.load_weights(ours, source)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_reset_head_keeps_the_models_head(name):
    source = timm_model(name).state_dict()
    ours = vitkit.create_model(name, **{**TINY, "num_classes": 7}, img_size=32)
    with pytest.raises(ValueError, match=r"classifier for 5 classes, the model 7: .*num_classes=5.*reset_head=True"):
        vitkit.load_weights(ours, source)
    own_head = {k: v.clone() for k, v in ours.state_dict().items() if k.startswith("head")}
    report = vitkit.load_weights(ours, source, reset_head=True)
    assert report.head_reset and report.loaded == len(source) - len(own_head)
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(value, own_head[key] if key in own_head else source[key], atol=0, rtol=0)


def test_head_presence_must_agree_unless_reset():
    with_head = timm_model().state_dict()
    backbone = vitkit.create_model("vit_tiny_patch16_224", **{**TINY, "num_classes": 0}, img_size=32)
    with pytest.raises(ValueError, match=r"has a classifier but the model has none \(num_classes=0\)"):
        vitkit.load_weights(backbone, with_head)
    assert vitkit.load_weights(backbone, with_head, reset_head=True).loaded == len(with_head) - 2

    classifier = vitkit.create_model("vit_tiny_patch16_224", **TINY, img_size=32)
    with pytest.raises(ValueError, match=r"has no classifier \(a backbone checkpoint\) but the model has one"):
        vitkit.load_weights(classifier, backbone.state_dict())
    vitkit.load_weights(classifier, backbone.state_dict(), reset_head=True)
    torch.testing.assert_close(classifier.pos_embed, backbone.pos_embed, atol=0, rtol=0)


def test_training_checkpoint_wrappers_are_removed(tmp_path):
    theirs = timm_model()
    wrapped = {
        "epoch": 3,
        "args": argparse.Namespace(lr=0.1, model="vit_tiny_patch16_224"),  # as timm's train.py saves it
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]},
        "model": {f"module._orig_mod.{k}": v for k, v in theirs.state_dict().items()},
    }
    torch.save(wrapped, tmp_path / "checkpoint.pth.tar.pth")
    ours = vitkit.create_model("vit_tiny_patch16_224", **TINY, img_size=32).eval()
    report = vitkit.load_weights(ours, tmp_path / "checkpoint.pth.tar.pth")
    assert report.unwrapped == ["entry 'model'", "prefix 'module.'", "prefix '_orig_mod.'"]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_non_strict_loads_what_fits_and_reports_the_rest():
    source = timm_model().state_dict()
    source["extra.weight"] = torch.zeros(3)
    source["blocks.0.norm1.weight"] = torch.zeros(7)
    del source["norm.bias"]
    ours = vitkit.create_model("vit_tiny_patch16_224", **TINY, img_size=32)
    with pytest.raises(ValueError, match=r"1 missing \['norm.bias'\]; 1 unexpected \['extra.weight'\]; 1 shape-mis"):
        vitkit.load_weights(ours, source)
    report = vitkit.load_weights(ours, source, strict=False)
    assert (report.missing, report.unexpected) == (["norm.bias"], ["extra.weight"])
    assert report.mismatched == ["blocks.0.norm1.weight"] and report.loaded == len(source) - 2
    torch.testing.assert_close(ours.blocks[1].attn.qkv.weight.data, source["blocks.1.attn.qkv.weight"])
    assert "missing (left as initialised): norm.bias" in report.summary()


def test_format_can_be_named_and_must_fit():
    source = timm_model().state_dict()
    ours = vitkit.create_model("vit_tiny_patch16_224", **TINY, img_size=32)
    assert vitkit.load_weights(ours, source, format="timm").format == "vitkit"
    formats = (
        r"\('auto', 'vitkit', 'timm', 'torchvision', 'hf', 'detr', 'deformable_detr', 'vit-pytorch', " r"'paddlevit'\)"
    )
    with pytest.raises(ValueError, match=f"format must be one of {formats}"):
        vitkit.load_weights(ours, source, format="jax")
    with pytest.raises(ValueError, match=r"state dict is in the timm / vitkit layout, not torchvision's: read it as "):
        vitkit.load_weights(ours, source, format="torchvision")
