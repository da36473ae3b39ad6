"""Swin Transformer: equivalence with timm, window helpers against hand-computed cases, backends, capture, I/O,
analytic costs against torch's FlopCounterMode."""

import pytest
import timm
import torch
from timm.models import swin_transformer as timm_swin
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis import measure_matmul_flops, profile
from vitkit.layers import set_attention_backend, to_2tuple
from vitkit.models.registry import create_model, list_models, model_entry
from vitkit.models.swin import (
    SwinConfig,
    SwinTransformer,
    WindowAttention,
    relative_position_index,
    shift_mask,
    window_partition,
    window_reverse,
)

SWIN_VARIANTS = [
    "swin_tiny_patch4_window7_224",
    "swin_small_patch4_window7_224",
    "swin_base_patch4_window7_224",
    "swin_base_patch4_window12_384",
    "swin_large_patch4_window7_224",
    "swin_large_patch4_window12_384",
]
# A narrow, shallow Swin for fast tests; every stage still has a regular and a shifted block.
SMALL = dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
M = -100.0  # the shift-mask value


def timm_and_vitkit(name: str, timm_kwargs: dict | None = None, **overrides) -> tuple[torch.nn.Module, SwinTransformer]:
    """A random-weight timm model and the vitkit model of the same variant holding its weights (strict load)."""
    reference = timm.create_model(name, pretrained=False, **(timm_kwargs or {}), **overrides).eval()
    vitkit_overrides = dict(overrides)
    if timm_kwargs and timm_kwargs.get("strict_img_size") is False:
        vitkit_overrides["dynamic_img_size"] = True
    model = create_model(name, **vitkit_overrides).eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    return reference, model


def test_registry_lists_the_swin_variants():
    assert list_models("swin_*") == sorted(SWIN_VARIANTS)


def test_swin_tiny_matches_timm_at_224():
    torch.manual_seed(0)
    reference, model = timm_and_vitkit("swin_tiny_patch4_window7_224")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        features = model.forward_features(x)
        torch.testing.assert_close(features, reference.forward_features(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.forward_head(features), reference(x), atol=1e-5, rtol=1e-5)
    assert features.shape == (1, 7, 7, 768)


def test_swin_base_window12_384_matches_timm():
    torch.manual_seed(0)
    reference, model = timm_and_vitkit("swin_base_patch4_window12_384", num_classes=10, **SMALL)
    assert model.layers[0].blocks[0].attn.relative_position_bias_table.shape == (23 * 23, 1)
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SWIN_VARIANTS)
def test_state_dict_names_and_shapes_equal_timm(name):
    with torch.device("meta"):
        reference = timm.create_model(name, pretrained=False)
        model = create_model(name)
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    buffers = {name for name, _ in model.named_buffers()}
    assert any(b.endswith("attn.relative_position_index") for b in buffers)
    assert any(b.endswith("attn_mask") for b in buffers)
    assert not any("relative_position_index" in k or "attn_mask" in k for k in model.state_dict())


def test_swin_tiny_parameter_count():
    with torch.device("meta"):
        model = create_model("swin_tiny_patch4_window7_224")
    assert sum(p.numel() for p in model.parameters()) == 28_288_354


def test_window_partition_cuts_row_major_windows_and_reverse_restores():
    x = torch.randn(2, 6, 8, 3)
    windows = window_partition(x, (2, 4))
    assert windows.shape == (2 * 3 * 2, 2, 4, 3)
    for b in range(2):
        for i in range(3):
            for j in range(2):
                expected = x[b, 2 * i : 2 * i + 2, 4 * j : 4 * j + 4]
                torch.testing.assert_close(windows[b * 6 + i * 2 + j], expected, rtol=0, atol=0)
    torch.testing.assert_close(window_reverse(windows, (2, 4), 6, 8), x, rtol=0, atol=0)


def test_relative_position_index_window_2_by_hand():
    # Tokens (y, x) in a 2x2 window: 0=(0,0) 1=(0,1) 2=(1,0) 3=(1,1); index = (dy + 1) * 3 + (dx + 1).
    expected = torch.tensor(
        [
            [4, 3, 1, 0],
            [5, 4, 2, 1],
            [7, 6, 4, 3],
            [8, 7, 5, 4],
        ]
    )
    torch.testing.assert_close(relative_position_index((2, 2)), expected, rtol=0, atol=0)
    attn = WindowAttention(8, num_heads=2, window_size=(2, 2))
    torch.testing.assert_close(attn.relative_position_index, expected, rtol=0, atol=0)
    assert attn.relative_position_bias_table.shape == (9, 2)
    assert "relative_position_index" not in attn.state_dict()


@pytest.mark.parametrize("window", [(3, 3), (2, 5), (7, 7)])
def test_relative_position_index_matches_timm(window):
    expected = timm_swin.get_relative_position_index(*window)
    torch.testing.assert_close(relative_position_index(window), expected, rtol=0, atol=0)


def test_shift_mask_window_2_shift_1_by_hand():
    # A 4x4 map, 2x2 windows, shift 1: each side splits into rows/cols {0, 1}, {2}, {3}.
    mask = shift_mask((4, 4), (2, 2), (1, 1))
    expected = torch.tensor(
        [
            # window (0, 0): one region
            [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
            # window (0, 1): columns 2 and 3 are different regions
            [[0, M, 0, M], [M, 0, M, 0], [0, M, 0, M], [M, 0, M, 0]],
            # window (1, 0): rows 2 and 3 are different regions
            [[0, 0, M, M], [0, 0, M, M], [M, M, 0, 0], [M, M, 0, 0]],
            # window (1, 1): four regions
            [[0, M, M, M], [M, 0, M, M], [M, M, 0, M], [M, M, M, 0]],
        ]
    )
    torch.testing.assert_close(mask, expected, rtol=0, atol=0)


@pytest.mark.parametrize("resolution", [(8, 8), (8, 4), (12, 10), (3, 9)])
def test_block_window_shift_and_mask_match_timm(resolution):
    reference = timm_swin.SwinTransformerBlock(16, resolution, num_heads=2, window_size=4, shift_size=2)
    model = SwinTransformer(
        SwinConfig(img_size=resolution, patch_size=1, depths=(2,), num_heads=(2,), embed_dim=16, window_size=4)
    )
    block = model.layers[0].blocks[1]
    assert block.window_size == reference.window_size
    assert block.shift_size == reference.shift_size
    if reference.attn_mask is None:
        assert block.attn_mask is None
    else:
        torch.testing.assert_close(block.attn_mask, reference.attn_mask, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("img_size", "input_size", "batch"),
    [
        (64, (96, 128), 2),
        (64, (32, 160), 2),
        (224, (160, 256), 2),
        ((64, 128), (128, 64), 2),
        # one image whose stage-2 map (4 x 8) is a single row of two windows: the windows are a strided view
        (64, (64, 128), 1),
    ],
)
def test_other_input_sizes_match_timm(img_size, input_size, batch):
    torch.manual_seed(0)
    reference, model = timm_and_vitkit(
        "swin_tiny_patch4_window7_224", {"strict_img_size": False}, img_size=img_size, num_classes=10, **SMALL
    )
    x = torch.randn(batch, 3, *input_size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-5)


def small_model(**overrides) -> SwinTransformer:
    """A 64x64 Swin with window 4: stage maps 16, 8, 4, 2, so the last stage has a clipped, unshifted window."""
    fields = {"img_size": 64, "window_size": 4, "num_classes": 10, **SMALL, **overrides}
    return create_model("swin_tiny_patch4_window7_224", **fields)


def test_sdpa_and_math_agree_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    results = {}
    for backend in ("sdpa", "math"):
        torch.manual_seed(1)
        model = small_model(attn_backend=backend, drop_path_rate=0.0)
        xi = x.clone().requires_grad_(True)
        logits = model(xi)
        logits.square().sum().backward()
        results[backend] = (logits.detach(), xi.grad, {n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(results["sdpa"][0], results["math"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results["sdpa"][1], results["math"][1], atol=1e-5, rtol=1e-5)
    for name, grad in results["sdpa"][2].items():
        torch.testing.assert_close(grad, results["math"][2][name], atol=1e-5, rtol=1e-5, msg=name)
    assert results["sdpa"][2]["layers.0.blocks.1.attn.relative_position_bias_table"].abs().sum() > 0


def explicit_window_weights(attn: WindowAttention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + table[offset] + mask) per head, with the bias looked up pair by pair."""
    B_, N, C = x.shape
    h, d = attn.num_heads, C // attn.num_heads
    Wh, Ww = attn.window_size
    bias = torch.empty(h, N, N)
    for i in range(N):
        for j in range(N):
            dy, dx = i // Ww - j // Ww, i % Ww - j % Ww
            bias[:, i, j] = attn.relative_position_bias_table[(dy + Wh - 1) * (2 * Ww - 1) + dx + Ww - 1]
    q, k, _ = (attn.qkv(x)[..., i * C : (i + 1) * C].reshape(B_, N, h, d).transpose(1, 2) for i in range(3))
    logits = q @ k.transpose(-2, -1) / d**0.5 + bias
    if mask is not None:
        logits = logits + mask.repeat(B_ // mask.shape[0], 1, 1)[:, None]
    return logits.softmax(-1)


def test_capture_attention_records_every_window_of_every_block():
    torch.manual_seed(0)
    model = small_model().eval()
    inputs = {}
    shifted = model.layers[0].blocks[1]
    shifted.attn.register_forward_pre_hook(lambda module, args: inputs.update(x=args[0], mask=args[1]))
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        model(torch.randn(2, 3, 64, 64))
    assert list(maps) == [f"layers.{s}.blocks.{i}.attn" for s in range(4) for i in range(2)]
    # stage resolution 16, 8, 4, 2 against window 4: nW = 16, 4, 1, 1 windows of min(res, 4)**2 tokens
    for s, (nW, N) in enumerate([(16, 16), (4, 16), (1, 16), (1, 4)]):
        for i in range(2):
            weights = maps[f"layers.{s}.blocks.{i}.attn"]
            assert weights.shape == (2 * nW, SMALL["num_heads"][s], N, N)
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    with torch.no_grad():
        expected = explicit_window_weights(shifted.attn, inputs["x"], inputs["mask"])
    torch.testing.assert_close(maps["layers.0.blocks.1.attn"], expected, atol=1e-5, rtol=1e-5)
    masked = (shifted.attn_mask < 0).repeat(2, 1, 1)[:, None].expand_as(expected)
    assert masked.any() and maps["layers.0.blocks.1.attn"][masked].max() < 1e-30


def test_forward_intermediates_match_timm():
    torch.manual_seed(0)
    reference, model = timm_and_vitkit("swin_tiny_patch4_window7_224", img_size=64, num_classes=10, **SMALL)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = reference.forward_intermediates(x, norm=True, intermediates_only=True)
        nchw = model.forward_intermediates(x, norm=True, intermediates_only=True)
        nhwc = model.forward_intermediates(x, indices=[-1], output_fmt="NHWC", norm=True, intermediates_only=True)
        last_two = model.forward_intermediates(x, indices=2, intermediates_only=True)
        features = model.forward_features(x)
    assert [tuple(y.shape) for y in nchw] == [(2, 32, 16, 16), (2, 64, 8, 8), (2, 128, 4, 4), (2, 256, 2, 2)]
    for ours, theirs in zip(nchw, expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nhwc[0], features, rtol=0, atol=0)
    torch.testing.assert_close(last_two[0], expected[2], atol=1e-5, rtol=1e-5)
    assert model.num_features == 256
    with torch.no_grad():  # timm's default: the final features too
        final, both = reference.forward_intermediates(x, indices=[1])
        mine, ours_both = model.forward_intermediates(x, indices=[1])
    for a, b in zip([mine, *ours_both], [final, *both], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NLC")
    with pytest.raises(ValueError, match="stage index 4"):
        model.forward_intermediates(x, indices=[4])


def test_init_follows_timm():
    torch.manual_seed(0)
    model = create_model("swin_tiny_patch4_window7_224")
    table = torch.cat(
        [m.relative_position_bias_table.flatten() for m in model.modules() if isinstance(m, WindowAttention)]
    )
    assert abs(table.std().item() - 0.02) < 0.002 and table.abs().max() <= 2
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = torch.cat([m.weight.flatten() for m in linears])
    assert abs(weights.std().item() - 0.02) < 0.001
    assert all(m.bias is None or not m.bias.any() for m in linears)


def test_bad_input_sizes_raise_value_error():
    dynamic = small_model(dynamic_img_size=True)
    with pytest.raises(ValueError, match="image height 48 is not a multiple of 32"):
        dynamic(torch.randn(1, 3, 48, 64))
    with pytest.raises(ValueError, match="image width 36 is not a multiple of 32"):
        dynamic(torch.randn(1, 3, 64, 36))
    with pytest.raises(ValueError, match="expected images of size 64x64, got 96x96"):
        small_model()(torch.randn(1, 3, 96, 96))
    with pytest.raises(ValueError, match="expected 3 input channels, got 1"):
        dynamic(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match="img_size height 100 is not a positive multiple of 32"):
        SwinConfig(img_size=100)
    with pytest.raises(ValueError, match="stage 1 width 192 is not divisible by num_heads 5"):
        SwinConfig(num_heads=(3, 5, 12, 24))
    with pytest.raises(ValueError, match="one head count per stage"):
        SwinConfig(num_heads=(3, 6, 12))


def test_save_and_from_pretrained_round_trip(tmp_path):
    torch.manual_seed(0)
    model = small_model(depths=[2, 2, 2, 2]).eval()
    assert model.config.depths == (2, 2, 2, 2)
    vitkit.save_pretrained(model, tmp_path / "swin")
    loaded = vitkit.from_pretrained(tmp_path / "swin")
    assert loaded.config == model.config
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def counted_matmul_flops(model: torch.nn.Module, size: tuple[int, int], batch: int) -> int:
    """torch's FlopCounterMode total of one forward pass on the model's device (on meta it counts from shapes)."""
    x = torch.randn(batch, 3, *size, device=next(model.parameters()).device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


# Other valid sizes per training size: maps padded to whole windows in every stage (160 x 256 at window 7), a
# last stage one window tall and two wide (224 x 448), stages smaller than the window (224 x 224 at window 12).
OTHER_SIZES = {224: [(160, 256), (224, 448)], 384: [(224, 224), (256, 416)]}
# Multiply-adds per image at the training size, in billions, as the Swin paper reports them ("FLOPs", Table 1).
PAPER_GMACS = {
    "swin_tiny_patch4_window7_224": 4.5,
    "swin_small_patch4_window7_224": 8.7,
    "swin_base_patch4_window7_224": 15.4,
    "swin_base_patch4_window12_384": 47.0,
    "swin_large_patch4_window7_224": 34.5,
    "swin_large_patch4_window12_384": 103.9,
}


@pytest.mark.parametrize("name", SWIN_VARIANTS)
def test_profile_matmul_flops_and_params_equal_torch_counts(name):
    default = model_entry(name).config.img_size
    with torch.device("meta"):
        params = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
        model = create_model(name, attn_backend="math", dynamic_img_size=True).eval()
    assert profile(name).macs / 1e9 == pytest.approx(PAPER_GMACS[name], abs=0.1)  # the paper rounds to 0.1
    for size in [to_2tuple(default), *OTHER_SIZES[default]]:
        report = profile(name, size, batch=2)  # analytic only: built on the meta device, no forward pass
        assert report.params == params
        assert report.matmul_flops == sum(op.matmul_flops for op in report.ops) == 2 * report.macs
        assert report.matmul_flops == counted_matmul_flops(model, size, batch=2), size


@pytest.mark.parametrize(
    ("img_size", "window_size", "input_size", "batch"),
    [(64, 4, (64, 64), 2), (64, 4, (64, 128), 1), (224, 7, (160, 256), 1), ((64, 128), 4, (96, 32), 2)],
)
def test_small_model_analytic_flops_equal_measured_with_both_backends(img_size, window_size, input_size, batch):
    model = small_model(img_size=img_size, window_size=window_size, dynamic_img_size=True).eval()
    analytic = sum(op.matmul_flops for op in model.cost(input_size, batch))
    assert profile(model, input_size, batch).params == sum(p.numel() for p in model.parameters())
    assert analytic == measure_matmul_flops(model, input_size, batch)  # sdpa: the fused CPU kernel
    assert analytic == counted_matmul_flops(set_attention_backend(model, "math"), input_size, batch)


def test_cost_rows_follow_forward_with_padded_windows():
    # 224 training size, window 7, run at 160 x 256: stage 0 is 40 x 64, padded to 42 x 70 = 6 x 10 windows.
    B, h, C = 2, SMALL["num_heads"][0], SMALL["embed_dim"]
    nW, N, d = 6 * 10, 7 * 7, C // h
    model = small_model(img_size=224, window_size=7, dynamic_img_size=True)
    ops = model.cost((160, 256), batch=B)
    for op in ops:
        model.get_submodule(op.module)  # every row names a real module

    def block(name: str) -> dict[str, list]:
        rows: dict[str, list] = {}
        for op in ops:
            if op.module == name or op.module.startswith(name + "."):
                rows.setdefault(op.op, []).append(op)
        return rows

    first, second, last = block("layers.0.blocks.0"), block("layers.0.blocks.1"), block("layers.3.blocks.1")
    # the first block pads to whole windows and does not roll; the second (shifted) rolls there and back, and makes
    # its mask for this size (a training size would read its buffer): regions compared, -100 where they differ
    assert "roll" not in first and len(second["roll"]) == 2
    for rows in (first, second):
        (pad,) = rows["constant_pad_nd"]
        assert pad.out_shape == (B, 42, 70, C)
        (logits,) = rows["q@k^T"]
        assert logits.in_shape == (B * nW, h, N, d) and logits.out_shape == (B * nW, h, N, N)
        assert logits.macs == B * nW * h * N * N * d
        assert rows["+bias"][0].flops == B * nW * h * N * N
        assert rows["qkv"][0].macs == B * nW * N * C * 3 * C
    assert second["masked_fill"][0].out_shape == (nW, N, N) and "masked_fill" not in first
    shifted_bias = [op for op in second["add"] if op.module.endswith(".attn")]  # the table's bias + each window's mask
    assert [op.flops for op in shifted_bias] == [nW * h * N * N]
    # in training mode (as built), the second block's branches have stochastic depth (the first's rate is 0)
    assert model.layers[0].blocks[0].drop_path1.drop_prob == 0 < model.layers[0].blocks[1].drop_path1.drop_prob
    assert "bernoulli_" not in first and len(second["bernoulli_"]) == 2
    reduction = next(op for op in ops if (op.module, op.op) == ("layers.1.downsample", "reduction"))
    assert reduction.in_shape == (B, 20, 32, 4 * C) and reduction.macs == B * 20 * 32 * 4 * C * 2 * C
    # the last stage (5 x 8) against the window 7 built for 7 x 7: padded to 7 x 14, two windows, no shift
    assert last["q@k^T"][0].in_shape == (B * 2, SMALL["num_heads"][3], N, 8 * C // SMALL["num_heads"][3])
    assert "masked_fill" not in last and "roll" not in last


def test_cost_rejects_the_sizes_forward_rejects():
    dynamic = small_model(dynamic_img_size=True)
    with pytest.raises(ValueError, match="image height 48 is not a multiple of 32"):
        dynamic.cost((48, 64))
    with pytest.raises(ValueError, match="expected images of size 64x64, got 96x96"):
        small_model().cost((96, 96))
    with pytest.raises(ValueError, match="image width 100 is not a multiple of 32"):
        profile("swin_tiny_patch4_window7_224", (224, 100))
