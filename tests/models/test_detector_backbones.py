"""A detector's backbone is a choice: a Swin's stage maps equal timm's (features_only and forward_intermediates) in
float64; a ViT's maps through ViTDet's simple feature pyramid have the paper's shapes; a Deformable DETR on either
pads images of any size as a user would, with the padding masked; configs that would leave parameters unused, or
name no classifier, are refused before anything is built."""

from __future__ import annotations

import re

import pytest
import timm
import torch
import torch.nn.functional as F

import vitkit
from vitkit.models.backbone import ClassifierBackbone

SMALL_SWIN = dict(embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), window_size=4, img_size=64)
TIMM_ANY_SIZE = dict(strict_img_size=False)  # timm pads to whole windows as vitkit does with dynamic_img_size
SMALL_VIT = dict(embed_dim=64, depth=3, num_heads=2)


def nudge(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g, dtype=t.dtype) * 0.05)
    return model.eval()


def test_swin_stage_maps_equal_timm_in_float64():
    torch.manual_seed(0)
    theirs = timm.create_model("swin_tiny_patch4_window7_224", num_classes=0, **SMALL_SWIN, **TIMM_ANY_SIZE)
    theirs = nudge(theirs.double())
    ours = ClassifierBackbone("swin_tiny_patch4_window7_224", (2, 3, 4), fields=SMALL_SWIN).double().eval()
    ours.body.load_state_dict(theirs.state_dict())
    features = (
        timm.create_model(
            "swin_tiny_patch4_window7_224", features_only=True, out_indices=(1, 2, 3), **SMALL_SWIN, **TIMM_ANY_SIZE
        )
        .double()
        .eval()
    )
    renamed = {k.replace("layers.", "layers_", 1): v for k, v in theirs.state_dict().items()}  # FeatureListNet's
    features.load_state_dict({k: renamed[k] for k in features.state_dict()})  # every tensor it has (no final norm)
    x = torch.randn(2, 3, 96, 128, dtype=torch.float64)  # another size than the config's: 3x4 windows of 4
    with torch.no_grad():
        maps = ours(x)
        expected = theirs.forward_intermediates(x, indices=[1, 2, 3], norm=True, intermediates_only=True)
        raw = [m.permute(0, 3, 1, 2) if m.shape[-1] != m.shape[1] else m for m in features(x)]
    assert ours.out_channels == [64, 128, 256] and ours.strides == [8.0, 16.0, 32.0]
    assert [tuple(m.shape) for m in maps] == [(2, 64, 12, 16), (2, 128, 6, 8), (2, 256, 3, 4)]
    for got, want in zip(maps, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    for got, want in zip(maps[:2], raw[:2], strict=True):  # features_only: the stages as they are
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(maps[2], theirs.norm(raw[2].permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


def test_vit_simple_feature_pyramid_has_the_papers_shapes():
    """ViTDet's pyramid from the last block of a patch-16 ViT: strides 4, 8, 16, 32 with D/4, D/2, D, D channels;
    scale 1 is the block's (normed) map and scale 0.5 its 2x2 max pool."""
    torch.manual_seed(0)
    backbone = nudge(ClassifierBackbone("vit_tiny_patch16_224", (3,), (4.0, 2.0, 1.0, 0.5), SMALL_VIT))
    x = torch.randn(1, 3, 256, 320)
    with torch.no_grad():
        maps = backbone(x)
        (last,) = backbone.body.forward_intermediates(x, [2], norm=True, intermediates_only=True)
    assert [tuple(m.shape) for m in maps] == [(1, 16, 64, 80), (1, 32, 32, 40), (1, 64, 16, 20), (1, 64, 8, 10)]
    assert backbone.out_channels == [16, 32, 64, 64] and backbone.strides == [4.0, 8.0, 16.0, 32.0]
    assert backbone.feature_sizes((256, 320)) == [tuple(m.shape[-2:]) for m in maps]
    assert torch.equal(maps[2], last) and torch.equal(maps[3], F.max_pool2d(last, 2))
    # taps (RF-DETR, LW-DETR): one scale per chosen block
    taps = ClassifierBackbone("vit_tiny_patch16_224", (1, 2, 3), (2.0, 1.0, 0.5), SMALL_VIT)
    assert taps.out_channels == [32, 64, 64] and [tuple(m.shape) for m in taps(x)][0] == (1, 32, 32, 40)


WINDOWED_DINOV2 = dict(depth=2, window_size=3, global_blocks=(1,), rel_pos=True)  # 3x3 windows pad an 8x10 grid


@pytest.mark.parametrize(
    ("detector", "fields"),
    [
        ("deformable_detr_resnet50", dict(backbone="swin_tiny_patch4_window7_224", backbone_args=SMALL_SWIN)),
        (
            "deformable_detr_resnet50",
            dict(
                backbone="vit_small_patch14_reg4_dinov2", backbone_args=dict(depth=2), backbone_scales=(2.0, 1.0, 0.5)
            ),
        ),
        (
            "deformable_detr_resnet50",
            dict(backbone="vit_small_patch14_reg4_dinov2", backbone_args=WINDOWED_DINOV2, backbone_scales=(1.0, 0.5)),
        ),
        ("detr_resnet50", dict(backbone="swin_tiny_patch4_window7_224", backbone_args=SMALL_SWIN)),
        ("detr_resnet50", dict(backbone="vit_small_patch14_reg4_dinov2", backbone_args=WINDOWED_DINOV2)),
    ],
    ids=["swin", "vit_dinov2", "windowed_vit_dinov2", "detr_swin", "detr_windowed_vit_dinov2"],
)
def test_a_detector_pads_images_to_its_backbone_as_a_user_would(detector, fields):
    torch.manual_seed(0)
    model = nudge(vitkit.create_model(detector, img_size=128, enc_layers=1, dec_layers=2, **fields))
    multiple = model.backbone.size_multiple
    x = torch.randn(2, 3, 100, 130)
    H, W = -(-100 // multiple) * multiple, -(-130 // multiple) * multiple
    padded = F.pad(x, (0, W - 130, 0, H - 100))
    mask = torch.zeros(2, H, W, dtype=torch.bool)
    mask[:, :100, :130] = True
    with torch.no_grad():
        out, expected = model(x), model(padded, mask)
    torch.testing.assert_close(out["pred_logits"], expected["pred_logits"], rtol=0, atol=0)
    assert torch.equal(out["pred_boxes"], expected["pred_boxes"])
    if hasattr(model, "level_sizes"):  # Deformable DETR's levels start with the backbone's maps
        maps = model.backbone.feature_sizes((H, W))
        assert model.level_sizes((100, 130))[: len(maps)] == maps
    else:  # DETR reads the last map
        assert model.feature_grid((H, W)) == model.backbone.feature_sizes((H, W))[-1]
    x.requires_grad_(False)
    model.train()(x)["pred_logits"].sum().backward()  # every backbone parameter takes part
    assert all(p.grad is not None for p in model.backbone.parameters())


def test_configs_that_cannot_work_are_refused():
    cases = [
        (dict(backbone="swin_tiny_patch4_window7_224", backbone_stages=(1, 2, 3)), "must include Swin's last stage 4"),
        (dict(backbone="vit_base_patch16_siglip_224", backbone_scales=(1.0,)), "global_pool 'map'"),
        (dict(backbone="botnet50"), "is a BoTNet model, which gives no maps"),
        (dict(backbone="vit_tiny_patch16_224", backbone_scales=(1.0, 2.0)), "must be decreasing"),
        (dict(backbone="vit_tiny_patch16_224", backbone_stages=(3, 6), backbone_scales=(2.0, 1.0, 0.5)), "one per"),
        (dict(backbone_scales=(1.0,)), "a Swin or ViT backbone's; a ResNet's fields are"),
        (dict(backbone="vit_tni"), "backbone must be 'resnet' or a registered Swin or ViT variant"),
        (dict(backbone="vit_tiny_patch16_224", backbone_args=dict(depht=3)), "ViTConfig has no field(s) ['depht']"),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            vitkit.create_model("deformable_detr_resnet50", **fields)
    detr_cases = [
        (dict(backbone="vit_tiny_patch16_224", backbone_scales=(1.0, 0.5)), "DETR reads one map"),
        (dict(backbone_args=dict(depth=3)), "a Swin or ViT backbone's; a ResNet's fields are"),
        (dict(backbone="vit_tiny_patch16_224", backbone_args=dict(global_blocks=(1,))), "needs window_size > 0"),
    ]
    for fields, message in detr_cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            vitkit.create_model("detr_resnet50", **fields)
    for export in ("hf", "detr"):
        with pytest.raises(ValueError, match="keep it in vitkit's layout"):
            vitkit.export_weights(
                vitkit.create_model("detr_resnet50", backbone="vit_tiny_patch16_224", backbone_args=dict(depth=1)),
                "unused", format=export,
            )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("vit_small_patch14_reg4_dinov2", dict(img_size=70, dynamic_img_size=True, **WINDOWED_DINOV2)),
        ("detr_resnet50", dict(img_size=96, backbone="vit_tiny_patch16_224", backbone_args=WINDOWED_DINOV2)),
    ],
    ids=["windowed_vit", "detr_windowed_vit"],
)
def test_windowed_models_cost_what_the_dispatcher_counts(name, fields):
    """Windows (padded), relative positions and DETR on a ViT, costed from the forward: their matmul FLOPs are what
    PyTorch's dispatcher counts, their activation memory what it measures."""
    from vitkit.analysis import profile

    model = vitkit.create_model(name, **fields, attn_backend="math").eval()
    size = (fields["img_size"], fields["img_size"] + 14)
    report = profile(model, size, batch=1, measure=True)
    assert report.matmul_flops == report.measured_matmul_flops
    assert report.activation_bytes == pytest.approx(report.measured_activation_bytes, rel=0.01)
