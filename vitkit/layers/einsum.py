"""Multi-head attention written with `torch.einsum`: the "matrix view" of the same computation.

`attention_einsum` is softmax(q k^T * scale + bias) v with every product spelled out as an index expression, and
`multihead_attention_einsum` runs a whole `Attention` layer that way, its projections included, reading the fused
weights as (C, h, d) tensors: one einsum per projection, no reshape or transpose of activations anywhere. Both
give the values of the layer's `math` backend (`tests/layers/test_einsum.py` holds them to it, forward and backward).

They are for reading and for checking, not a fourth attention backend: `torch.einsum` lowers these expressions to
the same batched matmuls as `reference_attention` (the `math` backend), so a backend name would add a path to every
dispatch, cost and export rule without computing anything faster. Models run `Attention`.

Letters: b batch, n query tokens, m key tokens, c channels (= h * d), h heads, d head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitkit.layers.attention import Attention


def attention_einsum(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None = None) -> Tensor:
    """softmax(q k^T * scale + bias) v for q (B, h, Nq, d), k (B, h, Nk, d), v (B, h, Nk, dv) -> (B, h, Nq, dv).

    Args:
        q, k, v: queries, keys and values, one (N, d) matrix per batch element and head.
        scale: the logit scale, d^-0.5 for scaled dot-product attention.
        bias: added to the logits, broadcastable to (B, h, Nq, Nk); a boolean one is a mask (True: may attend).
    """
    logits = torch.einsum("bhnd,bhmd->bhnm", q, k) * scale  # (B, h, Nq, Nk): q_n . k_m, summed over d
    if bias is not None:
        logits = logits.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else logits + bias
    weights = logits.softmax(dim=-1)  # (B, h, Nq, Nk): each row a distribution over the keys m
    return torch.einsum("bhnm,bhmd->bhnd", weights.to(v.dtype), v)  # (B, h, Nq, dv): sum_m w_nm v_m


def multihead_attention_einsum(layer: Attention, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """`layer(x, bias)` for self-attention on tokens x (B, N, C), every product an einsum (dropout not applied).

    The fused projection `layer.qkv` maps C to 3C channels ordered (q|k|v, head, d); read as three (C, h, d)
    tensors, each head's projection C -> d is one slice of an einsum instead of a reshape and a transpose of the
    activations, and the output projection reads its (C, C) weight as (C, h, d), so merging the heads and
    projecting them is one sum over (h, d).
    """
    if not (isinstance(layer.qkv, nn.Linear) and isinstance(layer.proj, nn.Linear)):
        raise ValueError(
            f"multihead_attention_einsum needs linear qkv and proj layers (vitkit.layers.Attention), got "
            f"{type(layer.qkv).__name__} and {type(layer.proj).__name__}"
        )
    layer.check_inputs(x, x, x)
    C = x.shape[-1]
    h, d = layer.num_heads, layer.head_dim
    w_qkv = layer.qkv.weight.t().unflatten(1, (3, h, d))  # (3C, C) -> W^T (C, 3C) -> (C, 3, h, d): a view
    w_q, w_k, w_v = w_qkv.unbind(1)  # 3 x (C, h, d): channel c of the input -> channel d of head h
    q = torch.einsum("bnc,chd->bhnd", x, w_q)  # (B, h, N, d) = x W_q, per head
    k = torch.einsum("bnc,chd->bhnd", x, w_k)  # (B, h, N, d)
    v = torch.einsum("bnc,chd->bhnd", x, w_v)  # (B, h, N, d)
    if layer.qkv.bias is not None:
        b_q, b_k, b_v = layer.qkv.bias.view(3, h, 1, d).unbind(0)  # 3 x (h, 1, d), broadcast over B and N
        q, k, v = q + b_q, k + b_k, v + b_v
    out = attention_einsum(q, k, v, layer.scale, bias)  # (B, h, N, d)
    w_o = layer.proj.weight.view(C, h, d)  # (C_out, C_in) -> (C_out, h, d): input channels grouped by head
    out = torch.einsum("bhnd,chd->bnc", out, w_o)  # (B, N, C): concatenate the heads and project, in one sum
    return out if layer.proj.bias is None else out + layer.proj.bias
