"""Swin weights from timm, torchvision and transformers load into vitkit with equal logits, and export back."""

import re

import pytest
import timm
import torch
import transformers
from safetensors.torch import load_file
from torchvision.models.swin_transformer import SwinTransformer

import vitkit

# Two stages of a regular and a shifted block each; both stage maps (16x16, 8x8) hold whole 4x4 windows.
TINY = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=5)
TV_TINY = dict(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], num_classes=5)
HF_TINY = dict(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4)
NAME = "swin_tiny_patch4_window7_224"


def images() -> torch.Tensor:
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_timm_round_trip(tmp_path):
    torch.manual_seed(0)
    theirs = timm.create_model(NAME, pretrained=False, **TINY).eval()
    torch.save(theirs.state_dict(), tmp_path / "swin.pth")
    ours = vitkit.create_model(NAME, **TINY).eval()
    assert vitkit.load_weights(ours, tmp_path / "swin.pth").format == "vitkit"
    with torch.no_grad():
        assert_same(ours(images()), theirs(images()))
    back = timm.create_model(NAME, pretrained=False, **TINY).eval()
    back.load_state_dict(load_file(vitkit.export_weights(ours, tmp_path / "out.safetensors", format="timm")))
    with torch.no_grad():
        assert_same(back(images()), theirs(images()))


def test_torchvision_round_trip(tmp_path):
    torch.manual_seed(0)
    theirs = SwinTransformer(**TV_TINY).eval()
    torch.save(theirs.state_dict(), tmp_path / "swin_t.pth")
    ours = vitkit.create_model(NAME, **TINY).eval()
    report = vitkit.load_weights(ours, tmp_path / "swin_t.pth")
    assert report.format == "torchvision" and report.loaded == len(ours.state_dict())
    assert sorted(report.dropped) == [f"features.{f}.{b}.attn.relative_position_index" for f in (1, 3) for b in (0, 1)]
    with torch.no_grad():
        expected = theirs(images())
        assert_same(ours(images()), expected)

    exported = torch.load(vitkit.export_weights(ours, tmp_path / "back.pth", format="torchvision"))
    assert set(exported) == set(theirs.state_dict())
    back = SwinTransformer(**TV_TINY).eval()
    back.load_state_dict(exported)
    with torch.no_grad():
        assert_same(back(images()), expected)


def test_hf_classifier_round_trip(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.SwinForImageClassification(transformers.SwinConfig(**HF_TINY, num_labels=5)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    c = ours.config
    assert (c.img_size, c.embed_dim, c.depths, c.num_heads, c.window_size, c.num_classes) == (
        64,
        16,
        (2, 2),
        (2, 4),
        4,
        5,
    )
    with torch.no_grad():
        expected = theirs(pixel_values=images()).logits
        assert_same(ours(images()), expected)

    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = transformers.SwinForImageClassification.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert_same(back(pixel_values=images()).logits, expected)
    assert set(load_file(tmp_path / "back" / "model.safetensors")) == set(
        load_file(tmp_path / "hf" / "model.safetensors")
    )

    # The names transformers 5 uses inside the model load too.
    fresh = vitkit.create_model(NAME, **TINY).eval()
    assert vitkit.load_weights(fresh, theirs.state_dict()).format == "hf"
    with torch.no_grad():
        assert_same(fresh(images()), expected)


def test_hf_base_model(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.SwinModel(transformers.SwinConfig(**HF_TINY)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    assert ours.config.num_classes == 0
    with torch.no_grad():
        out = theirs(pixel_values=images())
        assert_same(ours.forward_features(images()).flatten(1, 2), out.last_hidden_state)  # (B, H*W, C)
        assert_same(ours(images()), out.pooler_output)
    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = transformers.SwinModel.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert_same(back(pixel_values=images()).pooler_output, out.pooler_output)


def test_windows_larger_than_a_stage_are_refused(tmp_path):
    shrunk = vitkit.create_model(NAME, **{**TINY, "img_size": 32, "window_size": 7})  # stage 1 is 4x4 < 7
    for fmt in ("torchvision", "hf"):
        with pytest.raises(
            ValueError, match=re.escape("keeps window_size 7 at every stage, but stage 1 of this model")
        ):
            vitkit.export_weights(shrunk, tmp_path / ("x.pth" if fmt == "torchvision" else "x"), format=fmt)


def test_swin_checkpoint_into_a_vit_is_named(tmp_path):
    torch.save(SwinTransformer(**TV_TINY).state_dict(), tmp_path / "swin_t.pth")
    vit = vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=1)
    with pytest.raises(
        ValueError, match="not a checkpoint of a vit model .* it looks like a torchvision swin checkpoint"
    ):
        vitkit.load_weights(vit, tmp_path / "swin_t.pth")
