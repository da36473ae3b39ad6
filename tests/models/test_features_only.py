"""timm's features models: `vitkit.create_model(name, features_only=True, out_indices=...)` against
`timm.create_model(..., features_only=True)` with the same weights (moved off their initial values), in float64: the
same maps, the same `feature_info`, the same parameters kept after pruning; and the errors of what has no such
model."""

from __future__ import annotations

import re

import pytest
import timm
import torch
from timm.models._features import FeatureGetterNet

import vitkit
from vitkit.models.backbone import FeatureMaps

# small variants (two or three blocks per model, a 64-pixel Swin) built the same way in both libraries
SMALL = {
    "vit_tiny_patch16_224": dict(depth=4),
    "deit_tiny_distilled_patch16_224": dict(depth=3),
    "vit_small_patch14_reg4_dinov2": dict(depth=3, img_size=56),
    "swin_tiny_patch4_window7_224": dict(depths=(1, 1, 2, 1), embed_dim=32, num_heads=(1, 2, 4, 8), img_size=64),
    "botnet26t_256": dict(img_size=128),  # timm's own depths and widths (no arguments of its)
}
SIZE = {"vit_small_patch14_reg4_dinov2": 56, "swin_tiny_patch4_window7_224": 64, "botnet26t_256": 128}


def features_pair(name: str, out_indices=None, norm: bool = False):
    """timm's features model and vitkit's of the variant, both holding one set of perturbed weights (float64)."""
    torch.manual_seed(0)
    full = timm.create_model(name, **SMALL[name]).double()
    with torch.no_grad():
        for p in full.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    weights = full.state_dict()
    if norm:  # timm's features model with the final norm: its getter around the model, as create_model builds it
        model = timm.create_model(name, **SMALL[name]).double()
        model.load_state_dict(weights)
        theirs = FeatureGetterNet(model, 3 if out_indices is None else out_indices, norm=True)
    else:
        chosen = {} if out_indices is None else {"out_indices": out_indices}
        theirs = timm.create_model(name, features_only=True, **SMALL[name], **chosen).double()
        if hasattr(theirs, "model"):  # a ViT's features model keeps the model under `model.`
            keyed = {f"model.{k}": v for k, v in weights.items()}
        else:  # Swin's and BoTNet's flatten their stages (`layers_<i>`, `stages_<i>`) and stem (`stem_conv1`)
            keyed = {re.sub(r"^(layers|stages|stem)\.([^.]+)", r"\1_\2", k): v for k, v in weights.items()}
        theirs.load_state_dict({k: v for k, v in keyed.items() if k in theirs.state_dict()}, strict=True)
    ours = vitkit.create_model(name, **SMALL[name]).double()
    ours.load_state_dict(weights)
    return theirs.eval(), FeatureMaps(ours, out_indices, norm=norm).eval()


@pytest.mark.parametrize(
    ("name", "out_indices"),
    [
        ("vit_tiny_patch16_224", None),  # timm's default: the last three blocks
        ("vit_tiny_patch16_224", (0, 2)),  # the later blocks pruned
        ("deit_tiny_distilled_patch16_224", 2),
        ("vit_small_patch14_reg4_dinov2", (-2, -1)),
        ("swin_tiny_patch4_window7_224", None),  # every stage
        ("swin_tiny_patch4_window7_224", (1, 2)),  # the last stage, its norm and the head pruned
        ("botnet26t_256", None),  # the stem's output before its pool, then every stage
        ("botnet26t_256", (0, 2)),  # the last two stages and the head pruned
    ],
)
def test_features_equal_timm(name, out_indices):
    theirs, ours = features_pair(name, out_indices)
    x = torch.randn(2, 3, SIZE.get(name, 224), SIZE.get(name, 224), dtype=torch.float64)
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    if name.startswith("swin"):  # timm's Swin features are channels-last
        expected = [m.permute(0, 3, 1, 2) for m in expected]
    assert len(got) == len(expected) == len(ours.feature_info)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert ours.feature_info.channels() == theirs.feature_info.channels()
    assert ours.feature_info.reduction() == theirs.feature_info.reduction()
    assert [tuple(m.shape[1:2]) for m in got] == [(c,) for c in ours.feature_info.channels()]
    # the same parameters kept: nothing unused left to train (timm prunes the same blocks, norm and head)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    if hasattr(theirs, "model"):
        assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    loss = sum(m.sum() for m in ours(x))
    loss.backward()
    assert all(p.grad is not None for p in ours.parameters() if p.requires_grad)


def test_norm_and_channels_last():
    theirs, ours = features_pair("vit_tiny_patch16_224", (1, 3), norm=True)
    x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(ours(x), theirs(x), strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    theirs, ours = features_pair("swin_tiny_patch4_window7_224", (3,), norm=True)
    ours.output_fmt = "NHWC"
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x)[0].permute(0, 2, 3, 1), atol=1e-10, rtol=1e-10)


def test_create_model_features_only():
    model = vitkit.create_model("swin_tiny_patch4_window7_224", features_only=True, out_indices=(1, 2, 3))
    assert isinstance(model, FeatureMaps) and model.feature_info.reduction() == [8, 16, 32]
    maps = model(torch.randn(1, 3, 224, 224))
    assert [tuple(m.shape) for m in maps] == [(1, 192, 28, 28), (1, 384, 14, 14), (1, 768, 7, 7)]
    vit = vitkit.create_model("vit_tiny_patch16_224", features_only=True, out_indices=1, img_size=112)
    assert [tuple(m.shape) for m in vit(torch.randn(1, 3, 112, 112))] == [(1, 192, 7, 7)]


def test_features_only_errors():
    with pytest.raises(ValueError, match=r"out_indices=\(1, 2\) chooses a features model's outputs: pass features"):
        vitkit.create_model("vit_tiny_patch16_224", out_indices=(1, 2))
    with pytest.raises(ValueError, match="features_only needs a model with timm's forward_intermediates"):
        vitkit.create_model("detr_tiny", features_only=True)
    with pytest.raises(ValueError, match="block index 12 is out of range for a 12-block model"):
        vitkit.create_model("vit_tiny_patch16_224", features_only=True, out_indices=(12,))
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NHWC', got 'NLC'"):
        FeatureMaps(vitkit.create_model("vit_tiny_patch16_224", depth=2), output_fmt="NLC")


def test_botnet_forward_intermediates_equal_timm():
    """timm's ByobNet numbering (0 the stem before its pool, 1..4 the stages) and its default, the final features
    too."""
    torch.manual_seed(0)
    theirs = timm.create_model("botnet26t_256", img_size=128).double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = vitkit.create_model("botnet26t_256", img_size=128).double().eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 3, 128, 128, dtype=torch.float64)
    with torch.no_grad():
        final, expected = theirs.forward_intermediates(x, indices=[0, -2])
        mine, got = ours.forward_intermediates(x, indices=[0, -2])
        last_two = ours.forward_intermediates(x, indices=2, intermediates_only=True)
    for a, b in zip([mine, *got], [final, *expected], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert [tuple(m.shape) for m in got] == [(1, 64, 64, 64), (1, 1024, 8, 8)]
    assert [m.shape[1] for m in last_two] == [1024, 2048]
    assert ours.feature_info() == [(64, 2), (256, 4), (512, 8), (1024, 16), (2048, 32)]
    with pytest.raises(ValueError, match="output index 5 is out of range for a 5-output model"):
        ours.forward_intermediates(x, indices=[5])


def test_a_features_model_from_a_folder_and_its_errors(tmp_path):
    """`from_pretrained(path, features_only=True)` cuts the saved model, keeping its normalisation (not its class
    names); a features model refuses a checkpoint of the whole model, naming the ways that load one."""
    from vitkit.weights import ModelInfo, model_info

    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=3, img_size=32, num_classes=2).eval()
    vitkit.save_pretrained(model, tmp_path / "saved", ModelInfo(classes=("a", "b"), mean=(0.5,) * 3, std=(0.5,) * 3))
    features = vitkit.from_pretrained(tmp_path / "saved", features_only=True, out_indices=(0, 1)).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model.forward_intermediates(x, indices=(0, 1), intermediates_only=True)
        for a, b in zip(features(x), expected, strict=True):
            torch.testing.assert_close(a, b)
    assert len(features.model.blocks) == 2 and model_info(features).mean == (0.5,) * 3
    assert model_info(features).classes is None
    with pytest.raises(ValueError, match=r"a features model takes its weights before it is cut.*from_pretrained"):
        vitkit.load_weights(features, tmp_path / "saved")
    with pytest.raises(ValueError, match="pass features_only=True too"):
        vitkit.from_pretrained(tmp_path / "saved", out_indices=1)
    with pytest.raises(ValueError, match=r"save the whole model .*from_pretrained\(DIR, features_only=True"):
        vitkit.save_pretrained(features, tmp_path / "features")  # its pruned model fits no config
    assert not (tmp_path / "features").exists()


def test_feature_info_follows_the_maps_for_any_order_asked():
    """The maps come in block order, once each, whatever the order of out_indices: feature_info follows them."""
    model = vitkit.create_model(
        "swin_tiny_patch4_window7_224",
        features_only=True,
        out_indices=(3, 1, 3),
        **SMALL["swin_tiny_patch4_window7_224"],
    )
    maps = model(torch.randn(1, 3, 64, 64))
    assert [m.shape[1] for m in maps] == model.feature_info.channels() == [64, 256]
    assert model.out_indices == [1, 3]
