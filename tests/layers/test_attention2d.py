"""Attention2d and its position options against explicit implementations written here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision
from timm.layers.bottleneck_attn import PosEmbedRel
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitkit.cost import trace
from vitkit.layers.attention import Attention, capture_attention
from vitkit.layers.attention2d import Attention2d
from vitkit.layers.rel_pos import FactorizedPosEmbed2d, RelPosEmbed2d


def loop_rel_logits(q: torch.Tensor, height_rel: torch.Tensor, width_rel: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """Relative logits by definition: one entry per (query row, query col, key row, key col)."""
    B, nh, N, d = q.shape
    out = torch.zeros(B, nh, N, N, dtype=q.dtype)
    for qr in range(H):
        for qc in range(W):
            for kr in range(H):
                for kc in range(W):
                    r = height_rel[kr - qr + H - 1] + width_rel[kc - qc + W - 1]  # (d,)
                    out[:, :, qr * W + qc, kr * W + kc] = q[:, :, qr * W + qc] @ r
    return out


def explicit_attention(layer: Attention2d, x: torch.Tensor, pos_logits) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T d^-0.5 + pos_logits(q)) v with the layer's weights, computed per head in the notes' layout
    (B, h, d, N). Returns the output map and the attention weights (B, h, N, N)."""
    B, C, H, W = x.shape
    h, d = layer.num_heads, C // layer.num_heads
    w_q, w_k, w_v = layer.qkv.weight.reshape(3, C, C)
    b_q, b_k, b_v = layer.qkv.bias.reshape(3, C)
    flat = x.reshape(B, C, H * W)
    q = (torch.einsum("oc,bcn->bon", w_q, flat) + b_q[:, None]).reshape(B, h, d, H * W)
    k = (torch.einsum("oc,bcn->bon", w_k, flat) + b_k[:, None]).reshape(B, h, d, H * W)
    v = (torch.einsum("oc,bcn->bon", w_v, flat) + b_v[:, None]).reshape(B, h, d, H * W)
    energy = q.transpose(-1, -2) @ k * d**-0.5 + pos_logits(q)
    attn = energy.softmax(dim=-1)
    out = (v @ attn.transpose(-1, -2)).reshape(B, C, H * W)  # out[:, :, i] = sum_j attn[i, j] v[:, :, j]
    out = torch.einsum("oc,bcn->bon", layer.proj.weight, out) + layer.proj.bias[:, None]
    return out.reshape(B, C, H, W), attn


def test_relative_logits_match_loop_and_timm():
    torch.manual_seed(0)
    H, W, d = 3, 5, 4
    emb = RelPosEmbed2d((H, W), d)
    q = torch.randn(2, 3, H * W, d)
    expected = loop_rel_logits(q, emb.height_rel.detach(), emb.width_rel.detach(), H, W)
    torch.testing.assert_close(emb(q), expected, rtol=1e-5, atol=1e-5)

    ref = PosEmbedRel((H, W), d, scale=1.0)
    ref.load_state_dict(emb.state_dict(), strict=True)
    torch.testing.assert_close(emb(q), ref(q.reshape(6, H * W, d)).reshape(2, 3, H * W, H * W), rtol=1e-5, atol=1e-5)


def test_relative_attention_matches_explicit():
    torch.manual_seed(0)
    H, W = 3, 4
    layer = Attention2d(16, 2, pos="relative", feat_size=(H, W)).eval()
    x = torch.randn(2, 16, H, W)
    table_h, table_w = layer.pos_embed.height_rel.detach(), layer.pos_embed.width_rel.detach()

    def rel(q_bhdn: torch.Tensor) -> torch.Tensor:
        return loop_rel_logits(q_bhdn.transpose(-1, -2), table_h, table_w, H, W)

    with torch.no_grad():
        expected, _ = explicit_attention(layer, x, rel)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_factorized_matches_content_position_formula():
    torch.manual_seed(0)
    H, W, heads, C = 3, 4, 2, 16
    layer = Attention2d(C, heads, pos="factorized", feat_size=(H, W)).eval()
    assert layer.pos_embed.rel_h.shape == (heads, C // heads, H, 1)
    assert layer.pos_embed.rel_w.shape == (heads, C // heads, 1, W)
    x = torch.randn(2, C, H, W)
    r = torch.zeros(heads, C // heads, H, W)
    for row in range(H):
        for col in range(W):
            r[:, :, row, col] = layer.pos_embed.rel_h[:, :, row, 0] + layer.pos_embed.rel_w[:, :, 0, col]

    def content_position(q_bhdn: torch.Tensor) -> torch.Tensor:
        return q_bhdn.transpose(-1, -2) @ r.reshape(heads, C // heads, H * W)  # q_i . r_j

    with torch.no_grad():
        expected, _ = explicit_attention(layer, x, content_position)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_no_position_is_token_attention():
    torch.manual_seed(0)
    layer = Attention2d(16, 4).eval()
    assert sorted(layer.state_dict()) == ["proj.bias", "proj.weight", "qkv.bias", "qkv.weight"]
    ref = Attention(16, 4).eval()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 16, 3, 5)
    bias = torch.randn(2, 4, 15, 15)
    with torch.no_grad():
        expected = ref(x.flatten(2).transpose(1, 2), bias).transpose(1, 2).reshape(2, 16, 3, 5)
        torch.testing.assert_close(layer(x, bias), expected, rtol=1e-6, atol=1e-6)
        expected_plain, _ = explicit_attention(layer, x, lambda q: 0.0)
        torch.testing.assert_close(layer(x), expected_plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos", ["none", "relative", "factorized"])
def test_sdpa_matches_math_forward_backward(pos):
    torch.manual_seed(0)
    feat = (4, 3) if pos != "none" else None
    sdpa = Attention2d(16, 4, pos=pos, feat_size=feat, backend="sdpa")
    math = copy.deepcopy(sdpa)
    math.backend = "math"
    x = torch.randn(2, 16, 4, 3)
    grad_out = torch.randn(2, 16, 4, 3)
    results = []
    for layer in (sdpa, math):
        xi = x.clone().requires_grad_(True)
        out = layer(xi)
        params = [p for _, p in sorted(layer.named_parameters())]
        grads = torch.autograd.grad(out, [xi, *params], grad_out)
        results.append((out, grads))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    for g_sdpa, g_math in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(g_sdpa, g_math, rtol=1e-5, atol=1e-5)
    if pos != "none":
        assert all(p.abs().sum() > 0 for p in results[0][1][1:])  # the position tables get gradients


@pytest.mark.parametrize("pos", ["relative", "factorized"])
def test_capture_attention_shapes_rows_and_values(pos):
    torch.manual_seed(0)
    H, W = 3, 4
    layer = Attention2d(16, 2, pos=pos, feat_size=(H, W)).eval()
    model = nn.Sequential(layer)
    x = torch.randn(2, 16, H, W)
    with torch.no_grad():
        plain = model(x)
        with capture_attention(model) as maps:
            captured = model(x)
        q = layer.qkv_heads(x)[0]  # (B, h, N, d)
        _, expected = explicit_attention(layer, x, lambda q_bhdn: layer.pos_embed(q))
    assert list(maps) == ["0"]
    attn = maps["0"]
    assert attn.shape == (2, 2, H * W, H * W)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 2, H * W))
    torch.testing.assert_close(attn, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(captured, plain, rtol=1e-5, atol=1e-5)


def test_drop_in_torchvision_resnet18_stage():
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10)
    # 64x64 input: layer3 sees 4x4 maps, layer4 2x2; replace the second 3x3 conv of each stage's second block.
    net.layer3[1].conv2 = Attention2d(256, 4, pos="factorized", feat_size=4)
    net.layer4[1].conv2 = Attention2d(512, 8, pos="relative", feat_size=2)
    x = torch.randn(2, 3, 64, 64)
    out = net(x)
    assert out.shape == (2, 10)
    F.cross_entropy(out, torch.tensor([1, 7])).backward()
    for block in (net.layer3[1].conv2, net.layer4[1].conv2):
        for name, p in block.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match="factorized position tables are sized for a 4x4 feature map, got 6x6"):
        net(torch.randn(1, 3, 96, 96))


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="pos must be one of"):
        Attention2d(16, 2, pos="absolute", feat_size=4)
    with pytest.raises(ValueError, match="needs feat_size"):
        Attention2d(16, 2, pos="relative")
    with pytest.raises(ValueError, match="only used with pos"):
        Attention2d(16, 2, feat_size=4)
    layer = Attention2d(16, 2, pos="relative", feat_size=(3, 4))
    with pytest.raises(ValueError, match="feature map \\(B, C, H, W\\)"):
        layer(torch.randn(2, 12, 16))
    with pytest.raises(ValueError, match="built for 16 channels, got 8"):
        layer(torch.randn(2, 8, 3, 4))
    with pytest.raises(ValueError, match="sized for a 3x4 feature map, got 4x3"):
        layer(torch.randn(2, 16, 4, 3))
    with pytest.raises(ValueError, match="queries \\(B, heads, 12, head_dim\\) for a 3x4"):
        RelPosEmbed2d((3, 4), 8)(torch.randn(1, 2, 10, 8))
    with pytest.raises(ValueError, match="queries \\(B, heads, 12, head_dim\\) for a 3x4"):
        FactorizedPosEmbed2d((3, 4), 2, 8)(torch.randn(1, 2, 10, 8))


@pytest.mark.parametrize("pos", ["none", "relative", "factorized"])
def test_analytic_cost_equals_flop_counter(pos):
    with torch.device("meta"):
        layer = Attention2d(32, 4, backend="math", pos=pos, feat_size=(3, 5) if pos != "none" else None)
        x = torch.empty(2, 32, 3, 5)
    ops = trace(layer, x)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(x)
    assert sum(op.matmul_flops for op in ops) == counter.get_total_flops()
