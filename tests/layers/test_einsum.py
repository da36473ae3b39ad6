"""Attention written with einsum against the `math` backend (forward and backward) and the per-head loop."""

import pytest
import torch
from test_attention import explicit_attention  # the per-head loop: tests/layers/test_attention.py

from vitkit.kernels.attention import reference_attention
from vitkit.layers import Attention, Attention2d, attention_einsum, multihead_attention_einsum


def grads(out: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(out.square().sum(), tensors))


def test_attention_einsum_equals_the_reference_forward_and_backward_with_a_bias():
    torch.manual_seed(0)
    B, h, Nq, Nk, d, dv = 2, 3, 7, 9, 8, 5
    q, k = torch.randn(B, h, Nq, d, requires_grad=True), torch.randn(B, h, Nk, d, requires_grad=True)
    v = torch.randn(B, h, Nk, dv, requires_grad=True)
    bias = torch.randn(1, h, Nq, Nk, requires_grad=True)  # broadcast over the batch, like Swin's table
    ours = attention_einsum(q, k, v, d**-0.5, bias)
    reference = reference_attention(q, k, v, bias, d**-0.5)
    torch.testing.assert_close(ours, reference)
    for g_ours, g_ref in zip(grads(ours, q, k, v, bias), grads(reference, q, k, v, bias), strict=True):
        torch.testing.assert_close(g_ours, g_ref)


def test_attention_einsum_takes_a_boolean_mask_like_the_reference():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    mask = torch.rand(2, 1, 6, 6) > 0.3
    mask[..., 0] = True  # every query may attend somewhere
    ours = attention_einsum(q, k, v, 0.5, mask)
    torch.testing.assert_close(ours, reference_attention(q, k, v, mask, 0.5))
    assert not torch.allclose(ours, attention_einsum(q, k, v, 0.5))  # the mask mattered


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_multihead_einsum_equals_the_math_backend_and_the_per_head_loop(qkv_bias):
    torch.manual_seed(0)
    layer = Attention(32, num_heads=4, qkv_bias=qkv_bias, backend="math")
    x = torch.randn(2, 10, 32, requires_grad=True)
    bias = torch.randn(1, 4, 10, 10, requires_grad=True)
    params = [p for p in layer.parameters()]
    ours = multihead_attention_einsum(layer, x, bias)
    reference = layer(x, bias)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
    for g_ours, g_ref in zip(grads(ours, x, bias, *params), grads(reference, x, bias, *params), strict=True):
        torch.testing.assert_close(g_ours, g_ref, atol=1e-5, rtol=1e-5)
    if qkv_bias:  # the loop reads the qkv bias
        with torch.no_grad():
            torch.testing.assert_close(ours, explicit_attention(layer, x, bias), atol=1e-6, rtol=1e-5)


def test_multihead_einsum_reads_the_weights_as_views():
    layer = Attention(24, num_heads=3)
    w = layer.qkv.weight.t().unflatten(1, (3, 3, 8))  # the (C, 3, h, d) view the function takes
    assert w.data_ptr() == layer.qkv.weight.data_ptr()
    # channel (h, d) of q is row h * d of the fused weight: the order the layer's reshape splits heads in
    assert torch.equal(w[:, 0, 2, 5], layer.qkv.weight[2 * 8 + 5])
    assert torch.equal(w[:, 2, 1, 0], layer.qkv.weight[2 * 24 + 8])


def test_multihead_einsum_errors():
    layer = Attention(16, num_heads=2)
    with pytest.raises(ValueError, match=r"attention query must be \(B, N, 16\), got shape \(2, 5, 8\)"):
        multihead_attention_einsum(layer, torch.randn(2, 5, 8))
    layer.proj = torch.nn.Identity()
    with pytest.raises(ValueError, match="needs linear qkv and proj layers .* got Linear and Identity"):
        multihead_attention_einsum(layer, torch.randn(2, 5, 16))
    assert isinstance(Attention2d(16, 2), Attention)  # a map layer takes (B, C, H, W), not tokens
    with pytest.raises(ValueError, match=r"must be \(B, N, 16\), got shape \(1, 16, 2, 2\)"):
        multihead_attention_einsum(Attention2d(16, 2), torch.randn(1, 16, 2, 2))
