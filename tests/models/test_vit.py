"""ViT and DeiT against timm with the same weights (fp32, eval), and input checking."""

import pytest
import timm
import torch

import vitkit


def paired(name: str, **overrides):
    """A timm model and a vitkit model of the same variant, the vitkit one loaded from timm's state dict."""
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, **overrides).eval()
    ours = vitkit.create_model(name, **overrides).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


@pytest.mark.parametrize(
    "name",
    ["vit_small_patch16_224", "vit_base_patch32_384", "deit_tiny_distilled_patch16_224", "deit_tiny_patch16_224"],
)
def test_logits_equal_timm(name):
    theirs, ours = paired(name)
    x = torch.randn(2, 3, *ours.patch_embed.img_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(global_pool="avg"),
        dict(class_token=False, global_pool="avg"),
        dict(init_values=0.1),
        dict(num_classes=0),
        dict(img_size=(64, 96)),
    ],
    ids=["avg", "no-cls", "layerscale", "no-head", "rect"],
)
def test_options_equal_timm(overrides):
    theirs, ours = paired("vit_tiny_patch16_224", depth=2, **overrides)
    size = overrides.get("img_size", 224)
    x = torch.randn(2, 3, *((size, size) if isinstance(size, int) else size))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            ours.forward_head(ours.forward_features(x), pre_logits=True),
            theirs.forward_head(theirs.forward_features(x), pre_logits=True),
            atol=1e-5,
            rtol=1e-5,
        )


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
@pytest.mark.parametrize("size", [(160, 256), (224, 224), (48, 32)])
def test_dynamic_img_size_equals_timm(name, size):
    theirs, ours = paired(name, depth=2, dynamic_img_size=True)
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", ["NCHW", "NLC"])
@pytest.mark.parametrize("indices", [None, 2, [0, -1]])
def test_forward_intermediates_equal_timm(fmt, indices):
    theirs, ours = paired("deit_tiny_distilled_patch16_224", depth=3, dynamic_img_size=True)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = theirs.forward_intermediates(x, indices=indices, output_fmt=fmt, intermediates_only=True)
        got = ours.forward_intermediates(x, indices=indices, output_fmt=fmt, intermediates_only=True)
        expected_norm = theirs.forward_intermediates(x, indices=indices, norm=True, intermediates_only=True)
        got_norm = ours.forward_intermediates(x, indices=indices, norm=True, intermediates_only=True)
    assert len(got) == len(expected)
    for a, b in zip(got + got_norm, expected + expected_norm, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if fmt == "NCHW":
        assert got[0].shape == (2, 192, 4, 6)
    with torch.no_grad():  # timm's default: the final features too
        final, both = theirs.forward_intermediates(x, indices=indices, output_fmt=fmt)
        mine, ours_both = ours.forward_intermediates(x, indices=indices, output_fmt=fmt)
    for a, b in zip([mine, *ours_both], [final, *both], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_forward_intermediates_bad_arguments():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, img_size=32)
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(ValueError, match="block index 5 is out of range for a 2-block model"):
        model.forward_intermediates(x, indices=[5])
    with pytest.raises(ValueError, match="last 3 blocks of a 2-block model"):
        model.forward_intermediates(x, indices=3)


def test_distilled_heads_match_timm_distillation_training():
    theirs, ours = paired("deit_tiny_distilled_patch16_224", depth=2)
    theirs.set_distilled_training(True)
    x = torch.randn(2, 3, 224, 224)
    theirs.train()
    ours.train()
    cls_t, dist_t = theirs(x)
    cls_o, dist_o = ours.forward_distill(x)
    torch.testing.assert_close(cls_o, cls_t, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dist_o, dist_t, atol=1e-5, rtol=1e-5)
    assert ours(x).shape == (2, 1000)  # forward keeps its one return type in training too
    with pytest.raises(ValueError, match="needs a distilled model"):
        vitkit.create_model("deit_tiny_patch16_224", depth=1).forward_distill(x)


def test_sincos_position_embedding_is_fixed_and_follows_the_grid():
    from vitkit.layers import sincos_2d_pos_embed

    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32, pos_embed="sincos", dynamic_img_size=True)
    assert not model.pos_embed.requires_grad
    torch.testing.assert_close(model.pos_embed.detach(), sincos_2d_pos_embed(192, (2, 2), num_prefix_tokens=1))
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 1000)


def test_mean_pooling_pools_patch_tokens_only():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32, global_pool="avg").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        pooled = model.forward_head(tokens, pre_logits=True)
    torch.testing.assert_close(pooled, model.fc_norm(tokens[:, 1:].mean(1)))


@pytest.mark.parametrize(
    ("make_input", "message"),
    [
        (lambda: torch.randn(3, 224, 224), r"4-D image batch \(B, C, H, W\)"),
        (lambda: torch.randn(1, 1, 224, 224), "expected 3 input channels, got 1"),
        (lambda: torch.randn(1, 3, 160, 224), "expected images of size 224x224, got 160x224"),
        (lambda: torch.randint(0, 255, (1, 3, 224, 224)), "floating-point image tensor, got dtype torch.int64"),
    ],
)
def test_bad_input_is_a_clear_error(make_input, message):
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1)
    with pytest.raises(ValueError, match=message):
        model(make_input())


def test_dynamic_size_not_divisible_by_patch():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, dynamic_img_size=True)
    with pytest.raises(ValueError, match="image width 100 is not a positive multiple of patch size 16"):
        model(torch.randn(1, 3, 96, 100))


def test_capture_attention_on_vit():
    model = vitkit.create_model("deit_tiny_distilled_patch16_224", depth=2, img_size=64).eval()
    with vitkit.capture_attention(model) as maps, torch.no_grad():
        model(torch.randn(2, 3, 64, 64))
    assert list(maps) == ["blocks.0.attn", "blocks.1.attn"]
    for attn in maps.values():
        assert attn.shape == (2, 3, 2 + 16, 2 + 16)
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3, 18))


def test_capturing_one_layer_costs_its_map_only():
    from vitkit.analysis import PeakMemory

    model = vitkit.create_model("vit_tiny_patch16_224", depth=3, dynamic_img_size=True).eval()
    x = torch.randn(2, 3, 320, 320)
    with torch.inference_mode(), PeakMemory() as plain:
        model(x)
    with torch.inference_mode(), vitkit.capture_attention(model, layers=["blocks.1.attn"]), PeakMemory() as captured:
        model(x)
    N = 1 + 20 * 20
    one_map = 2 * 3 * N * N * 4  # (B, h, N, N) float32
    assert captured.peak - plain.peak == one_map


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_dinov2_backbones_equal_timm_in_float64(name, dynamic):
    """DINOv2 (LayerScale) and DINOv2 with registers (4 register tokens after the class token; no position row for
    either): the tokens and the embedding equal timm's in float64, every weight moved off its initial value (the
    tiny class and register tokens, the LayerScale gammas at 1e-5 would hide a wrong order or a missing position)."""
    small = dict(img_size=56, depth=2, embed_dim=48, num_heads=3, dynamic_img_size=dynamic)
    theirs, ours = paired(name, **small)
    generator = torch.Generator().manual_seed(1)
    moved = {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(moved)
    ours.load_state_dict(moved)
    theirs, ours = theirs.double(), ours.double()
    sizes = [(56, 56), (70, 42)] if dynamic else [(56, 56)]  # other sizes: the table resampled as timm does
    for size in sizes:
        x = torch.randn(2, 3, *size, dtype=torch.float64, generator=generator)
        with torch.no_grad():
            torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)
    registers = 4 if "reg4" in name else 0
    assert ours.num_prefix_tokens == 1 + registers and ours.token_grid((56, 56)) == (1 + registers, (4, 4))
    # with registers the table covers the patches only (the class token has no row either); a backbone, no head
    assert ours.pos_embed.shape[1] == 16 + (0 if registers else 1) and ours.config.num_classes == 0
    assert ("reg_token" in ours.no_weight_decay()) == bool(registers)
