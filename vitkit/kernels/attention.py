"""Scaled dot-product attention, softmax(q k^T * scale + bias) v, and its paths: the computations behind
`vitkit.layers.Attention`.

- `reference_attention`: the formula as written, the `math` backend; the other paths are tested against it.
- `explicit_attention`: the same values with one N x N buffer and no extra operand copies (one batch dim n = B * h,
  the scale folded into baddbmm, the bias added and the softmax taken in place when no gradient is needed).
- `blocked_attention`: the explicit path without autograd, a block of queries at a time in one reused buffer.
- torch's fused `scaled_dot_product_attention`, which never keeps the N x N weights.

`attention` runs the path `vitkit.kernels.policy.attention_path` picks for its `AttentionOptions` and merges the
heads; `attention_rows` states its rows for `vitkit.cost.tracer` on the device and dtype costed.

Letters used in shape comments: B batch, N tokens (Nq queries, Nk keys), h heads, d head dim (dv of the values),
n = B * h (the batch of the explicit path's batched matmuls).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.cost import costed
from vitkit.cost.rows import (
    SOFTMAX_FLOPS,
    CostContext,
    OpCost,
    Ops,
    Value,
    copy_op,
    dropout_ops,
    elementwise_op,
    holding,
    matmul_op,
    new_value,
    numel,
)
from vitkit.kernels.policy import attention_path

Hook = Callable[[Tensor], None]  # what `capture_attention` installs: called with the weights (B, h, Nq, Nk)

EXPLICIT_MAX_BYTES = 32 * 2**20
"""The largest N x N weight tensor (bytes, all batch elements and heads of one call) that the `auto` backend forms on
the explicit path by default (`Attention(explicit_max_bytes=...)`): a memory budget, since in training each layer
keeps its weights for the backward pass."""


@dataclass(frozen=True)
class AttentionOptions:
    """How a layer asks for attention, beside q, k, v and the bias."""

    scale: float  # the logits' factor (d^-0.5)
    backend: str = "auto"  # one of `vitkit.kernels.policy.ATTENTION_BACKENDS`
    dropout: float = 0.0  # dropout on the weights (0 outside training)
    hook: Hook | None = None  # called with the weights (B, h, Nq, Nk) (`capture_attention`): forms them explicitly
    explicit_max_bytes: int = EXPLICIT_MAX_BYTES  # `auto`'s budget for the explicit path's N x N weights
    training: bool = False  # the layer is in training mode: a path with a fast backward (and costed with it)

    def path(self, device: torch.device, dtype: torch.dtype, weights_bytes: int, grad: bool = False) -> str:
        """The path (`vitkit.kernels.policy.attention_path`) of a call whose N x N weights take `weights_bytes`."""
        return attention_path(
            self.backend, device, dtype, weights_bytes, dropout=self.dropout, grad=grad or self.training,
            capture=self.hook is not None, explicit_max_bytes=self.explicit_max_bytes,
        )  # fmt: skip


def _as_bias(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean mask (True: may attend) as the additive bias 0 / -inf; an additive bias unchanged."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float, dropout: float = 0.0, hook: Hook | None = None
) -> Tensor:
    """softmax(q k^T * scale + bias) v, written as the formula: the `math` backend and the reference.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv); the leading dims (B, h) broadcast, and `bias` broadcasts to
    (..., Nq, Nk) (a boolean one is a mask, True: may attend). `hook` is called with the weights.
    """
    attn = (q * scale) @ k.transpose(-2, -1)  # (B, h, Nq, d) @ (B, h, d, Nk) -> (B, h, Nq, Nk)
    if bias is not None:
        attn = attn + _as_bias(bias, q.dtype)  # (B, h, Nq, Nk)
    attn = attn.softmax(dim=-1)  # (B, h, Nq, Nk), each row sums to one
    if hook is not None:
        hook(attn)
    attn = F.dropout(attn, dropout)
    # an fp32 bias on bf16 logits promotes the weights to fp32; the product is taken in v's dtype
    return attn.to(v.dtype) @ v  # (B, h, Nq, Nk) @ (B, h, Nk, dv) -> (B, h, Nq, dv)


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float, dropout: float = 0.0, hook: Hook | None = None
) -> Tensor:
    """`reference_attention`'s values with one N x N buffer: q's and k's heads copied once to (n, N, d) and freed
    after the product, the scale in baddbmm's alpha (beta=0 ignores its zero input), and without autograd history to
    keep, the bias added and the softmax taken in place."""
    lead = q.shape[:-2]  # (B, h)
    if not k.shape[:-2] == v.shape[:-2] == lead:  # broadcast k and v against q (no-op for vitkit's layers)
        lead = torch.broadcast_shapes(lead, k.shape[:-2], v.shape[:-2])
        q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))  # each (B, h, N, d)
    (Nq, d), Nk, dv, n = q.shape[-2:], k.shape[-2], v.shape[-1], math.prod(lead)
    bias = _as_bias(bias, q.dtype)
    q3, k3 = q.reshape(n, Nq, d), k.reshape(n, Nk, d)  # (n, Nq, d), (n, Nk, d): copies of the strided heads
    attn = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0, alpha=scale)  # (n, Nq, Nk)
    attn = attn.view(*lead, Nq, Nk)  # (B, h, Nq, Nk)
    del q3, k3
    if attn.requires_grad or (bias is not None and bias.requires_grad and torch.is_grad_enabled()):
        attn = attn.softmax(dim=-1) if bias is None else (attn + bias).softmax(dim=-1)  # (B, h, Nq, Nk)
    else:
        if bias is not None:
            attn.add_(bias)  # in place: (B, h, Nq, Nk)
        torch.softmax(attn, dim=-1, out=attn)  # in place: (B, h, Nq, Nk)
    if hook is not None:
        hook(attn)
    attn = F.dropout(attn, dropout)
    v3 = v.reshape(n, Nk, dv)  # (n, Nk, dv): a copy of the strided heads
    # an fp32 bias on bf16 logits promotes the weights to fp32; the product is taken in v's dtype
    out = torch.bmm(attn.reshape(n, Nq, Nk).to(v3.dtype), v3)  # (n, Nq, Nk) @ (n, Nk, dv) -> (n, Nq, dv)
    return out.view(*lead, Nq, dv)  # (B, h, Nq, dv)


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float, max_bytes: int) -> Tensor:
    """`explicit_attention`'s values, without autograd, a block of queries at a time: each block's weights
    (n, rows, Nk) are formed in one buffer of at most `max_bytes` (at least one query row), normalised in place and
    multiplied into their rows of the output. Memory: q's, k's and v's copies, the buffer and the output, whatever
    the number of queries."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))  # each (B, h, N, d); no-op for vitkit's layers
    (Nq, d), Nk, dv, n = q.shape[-2:], k.shape[-2], v.shape[-1], math.prod(lead)
    bias = _as_bias(bias, q.dtype)
    per_row = bias is not None and bias.ndim >= 2 and bias.shape[-2] == Nq  # else it broadcasts over the queries
    q3, k3, v3 = q.reshape(n, Nq, d), k.reshape(n, Nk, d), v.reshape(n, Nk, dv)  # copies of the strided heads
    rows = max(1, min(Nq, max_bytes // max(1, n * Nk * q.element_size())))  # queries per block
    buffer = q3.new_empty(n * rows * Nk)  # one block's weights, reused
    out = v3.new_empty(n, Nq, dv)
    for start in range(0, Nq, rows):
        stop = min(Nq, start + rows)
        attn = buffer[: n * (stop - start) * Nk].view(n, stop - start, Nk)  # contiguous, also for the last block
        torch.baddbmm(attn, q3[:, start:stop], k3.transpose(1, 2), beta=0, alpha=scale, out=attn)  # (n, rows, Nk)
        if bias is not None:
            attn.view(*lead, stop - start, Nk).add_(bias[..., start:stop, :] if per_row else bias)
        torch.softmax(attn, dim=-1, out=attn)
        torch.bmm(attn.to(v3.dtype), v3, out=out[:, start:stop])  # (n, rows, Nk) @ (n, Nk, dv) -> (n, rows, dv)
    return out.view(*lead, Nq, dv)  # (B, h, Nq, dv)


def _weights_bytes(q_shape: tuple[int, ...], Nk: int, itemsize: int) -> int:
    return math.prod(q_shape[:-1]) * Nk * itemsize  # (B, h, Nq) x Nk


def attention_rows(
    name: str, ctx: CostContext, q: Value, k: Value, v: Value, bias: Value | None, options: AttentionOptions
) -> list[OpCost]:
    """The rows of `attention` on q (B, h, Nq, d), k (B, h, Nk, d), v (B, h, Nk, dv) on the path `ctx` takes (a
    layer in training mode is costed with its backward)."""
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    logits = (*lead, Nq, Nk)
    path = options.path(ctx.device, ctx.dtype, _weights_bytes(q.shape, Nk, ctx.itemsize))
    dropout, explicit_max_bytes = options.dropout, options.explicit_max_bytes
    heads_qk = numel(logits) * d  # B*h*Nq*Nk*d multiply-adds, = BN^2C for self-attention
    heads_v = numel(logits) * dv
    merged = (lead[0], Nq, numel(lead[1:]) * dv)  # (B, Nq, h dv)
    ops = Ops(q)
    if path == "fused":  # one kernel: nothing N x N is written; autograd keeps q, k, v (and the output)
        scaled = ops(elementwise_op(name, "q*scale", q, 1, ctx, stored=False))  # BNC (inside the kernel)
        ops(matmul_op(name, "q@k^T", (scaled, k), logits, heads_qk, ctx, stored=False))
        if bias is not None:
            ops(elementwise_op(name, "+bias", (ops.out, bias), 1, ctx, stored=False))  # BhN^2
        ops(elementwise_op(name, "softmax", ops.out, SOFTMAX_FLOPS, ctx, stored=False))  # 5BhN^2
        out = matmul_op(name, "attn@v", (ops.out, v), (*lead, Nq, dv), heads_v, ctx)
        # torch's fused kernels take no gradient for a bias: with one (a trained table) it runs its math path,
        # which keeps the N x N weights for backward
        weights = (new_value(logits, ctx),) if bias is not None else ()
        ops(dataclasses.replace(out, saved=(q, k, v, out.output, *weights)))
        # the kernel writes its output in (B, Nq, h, dv) order: merging the heads is a view
        return ops + [copy_op(name, "merge_heads", ops.out, merged, ctx, copies=False)]
    if path == "blocked":  # q's, k's and v's copies, one block's weights (reused), the output written by blocks
        q3, k3, v3 = (ops(copy_op(name, f"{t}_copy", x, x.shape, ctx)) for t, x in zip("qkv", (q, k, v), strict=True))
        rows = max(1, min(Nq, explicit_max_bytes // max(1, numel(lead) * Nk * ctx.itemsize)))
        ops(elementwise_op(name, "q*scale", q, 1, ctx, stored=False))  # BNC, in baddbmm's alpha
        block = ops(matmul_op(name, "q@k^T", (q3, k3), (*lead, rows, Nk), heads_qk, ctx))
        # the bias and the softmax run on every block in place: their FLOPs are the whole (B, h, Nq, Nk)'s
        if bias is not None:
            add = elementwise_op(name, "+bias", (block, bias), 1, ctx, in_place=True)
            ops(dataclasses.replace(add, flops=numel(logits)))
        softmax = elementwise_op(name, "softmax", block, SOFTMAX_FLOPS, ctx, in_place=True)
        ops(dataclasses.replace(softmax, flops=SOFTMAX_FLOPS * numel(logits)))
        # q's and k's copies are read by every block: alive until the last product
        ops(holding(matmul_op(name, "attn@v", (block, v3), (*lead, Nq, dv), heads_v, ctx), q3, k3))
        return ops + [copy_op(name, "merge_heads", ops.out, merged, ctx)]  # (B, h, Nq, dv) -> (B, Nq, h dv)
    if path == "reference":  # q * scale and the 4-D matmuls' copies of q, k and v are written out
        scaled = ops(elementwise_op(name, "q*scale", q, 1, ctx))  # BNC, laid out as q: (B, N, h, d)
        copies = (ops(copy_op(name, "q_copy", scaled, q.shape, ctx)), ops(copy_op(name, "k_copy", k, k.shape, ctx)))
        # q's and k's copies (reshaped to (n, Nq, d), k^T to (n, d, Nk)) are made inside the matmul, which still
        # holds q * scale
        ops(matmul_op(name, "q@k^T", (scaled, *copies), logits, heads_qk, ctx, saves=copies))
    else:  # explicit: q's and k's copies (reshaped to (n, N, d)), the scale folded into baddbmm, freed after it
        copies = (ops(copy_op(name, "q_copy", q, q.shape, ctx)), ops(copy_op(name, "k_copy", k, k.shape, ctx)))
        ops(elementwise_op(name, "q*scale", q, 1, ctx, stored=False))  # BNC, in baddbmm's alpha
        ops(matmul_op(name, "q@k^T", copies, logits, heads_qk, ctx))
    in_place = path == "explicit" and not options.training  # without grad: the bias and softmax in its one buffer
    if bias is not None:
        ops(elementwise_op(name, "+bias", (ops.out, bias), 1, ctx, in_place=in_place))  # BhN^2
    ops(elementwise_op(name, "softmax", ops.out, SOFTMAX_FLOPS, ctx, in_place=in_place, saves_output=True))
    weights = ops(dropout_ops(name, ops.out, dropout, dropout > 0, ctx))  # on the weights, training only
    v_copy = ops(copy_op(name, "v_copy", v, v.shape, ctx))  # (n, Nk, dv) copy of the strided heads
    ops(matmul_op(name, "attn@v", (weights, v_copy), (*lead, Nq, dv), heads_v, ctx))
    return ops + [copy_op(name, "merge_heads", ops.out, merged, ctx)]  # (B, h, Nq, dv) -> (B, Nq, h dv)


@costed(attention_rows)
def attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, options: AttentionOptions) -> Tensor:
    """softmax(q k^T * scale + bias) v for q (B, h, Nq, d), k (B, h, Nk, d), v (B, h, Nk, dv), the heads merged:
    (B, Nq, h * dv), on the path `options` takes for the call. `bias` broadcasts to (B, h, Nq, Nk); a boolean one is
    a mask (True: may attend)."""
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias))
    path = options.path(q.device, q.dtype, _weights_bytes(q.shape, k.shape[-2], q.element_size()), grad)
    scale, dropout = options.scale, options.dropout
    if path == "fused":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    elif path == "blocked":
        out = blocked_attention(q, k, v, bias, scale, options.explicit_max_bytes)
    else:
        kernel = reference_attention if path == "reference" else explicit_attention
        out = kernel(q, k, v, bias, scale, dropout, options.hook)
    B, h, Nq, dv = out.shape
    return out.transpose(1, 2).reshape(B, Nq, h * dv)  # (B, Nq, h, dv) -> (B, Nq, h dv)
