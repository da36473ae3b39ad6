"""Multi-head scaled dot-product attention: the one attention implementation in vitkit.

Every model (ViT, DeiT, Swin's window attention, BoTNet's relative-position attention) computes
softmax(q k^T * scale + bias) v through `Attention.attend`, so every backend, the attention capture
and the cost accounting live here once. Three paths compute it, chosen per call by `Attention.path`, which
`cost()` calls too, so a profile always counts the path that runs:

- `reference_attention`: the formula as written, the `math` backend; the other paths are tested against it.
- `explicit_attention`: the same values with one N x N buffer and no extra operand copies: `auto` takes it for
  bf16 on CPUs with bf16 instructions, and capturing layers take it (unless the backend is `math`).
- `blocked_attention`: the explicit path over blocks of queries, one (n, rows, Nk) buffer reused: `auto` takes it
  for bf16 inference on those CPUs where the whole N x N weights would exceed the layer's budget (high resolution).
- torch's fused `scaled_dot_product_attention` everywhere else; it never keeps the N x N weights.

Letters used in shape comments: B batch, N tokens (Nq queries, Nk keys), C channels (= h * d), h heads,
d head dim (dv of the values), n = B * h (the batch of the explicit path's batched matmuls).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.layers import helpers
from vitkit.layers.cost import (
    SOFTMAX_FLOPS,
    CostContext,
    OpCost,
    Ops,
    Value,
    copy_op,
    cost_of,
    dropout_ops,
    elementwise_op,
    holding,
    linear,
    linear_op,
    matmul_op,
    new_value,
    numel,
    view,
)

if TYPE_CHECKING:
    from vitkit.layers.deformable import MultiScaleDeformableAttention, SampledAttention

Hook = Callable[[Tensor], None]  # what `capture_attention` installs: called with the weights (B, h, Nq, Nk)

BACKENDS = ("auto", "sdpa", "math")
"""`sdpa`: torch's fused scaled_dot_product_attention (flash / memory-efficient kernels, never keeps the
N x N weights); `math`: softmax(q k^T * scale + bias) v as written, the reference; `auto` (the default): the
fused kernel, except where the explicit path is measured faster (see `Attention.path`)."""

PATHS = ("fused", "explicit", "blocked", "reference")
"""What `Attention.path` picks for a call: torch's fused kernel, `explicit_attention`, `blocked_attention`,
`reference_attention`."""

EXPLICIT_MAX_BYTES = 32 * 2**20
"""Default of `Attention(explicit_max_bytes=...)`: the largest N x N weight tensor (bytes, all batch elements and
heads of one call) that the `auto` backend forms on the explicit path."""


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def _as_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
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
    """`reference_attention`'s values in less time and memory: the fast path for bf16 on CPU and for capture.

    Measured on CPU in bf16 for ViT-S/16 at 224 (batch 16, 197 tokens, 6 heads): 5.7 ms a layer against the
    fused kernel's 11.3 ms, forward and backward 18 ms against 43 ms. What it does differently:
    - one batch dim n = B * h: the reshapes copy the strided heads of q and k once, and baddbmm folds the scale
      into the product (q * scale and a 4-D matmul would copy them again; 15% slower on CPU in bf16);
    - baddbmm with beta=0 ignores its (broadcast) zero input, so no second N x N buffer is made;
    - q's and k's copies are freed before v's is made;
    - without autograd history to keep, the bias is added and the softmax taken in place: one N x N buffer is
      all the memory it takes.
    """
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
    the number of queries; the products run on the same batched GEMMs as the explicit path.
    """
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


class Attention(nn.Module):
    """Multi-head self-attention over tokens (B, N, C) with one fused qkv projection.

    Heads are split by reshape/permute and computed as one batched matmul, never a loop over heads.

    Args:
        dim: token channels C; must be divisible by `num_heads` unless `head_dim` is given.
        num_heads: number of heads h; head dim d = C // h.
        qkv_bias: add a bias to the fused q, k, v projection.
        attn_drop: dropout on the attention weights (training only).
        proj_drop: dropout after the output projection.
        backend: "auto" (the fused kernel unless the explicit path is faster for the call), "sdpa" (fused
            kernel) or "math" (the reference formula); all give the same values.
        explicit_max_bytes: with "auto", the largest N x N weights (bytes, one call) formed explicitly: a memory
            budget, since in training each layer keeps its weights for the backward pass.
        head_dim: d, when the heads' total width h * d differs from C (vit-pytorch's `dim_head`): q, k, v are
            projected from C to h * d channels and the output projection maps h * d back to C.
        proj_bias: add a bias to the output projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str = "auto",
        explicit_max_bytes: int = EXPLICIT_MAX_BYTES,
        head_dim: int | None = None,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        if head_dim is None and dim % num_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = head_dim or dim // num_heads
        inner = num_heads * self.head_dim  # h * d, = C unless head_dim says otherwise
        self.scale = self.head_dim**-0.5
        self.backend = check_backend(backend)
        self.explicit_max_bytes = explicit_max_bytes
        self.attn_drop = attn_drop
        # Set by `capture_attention` while it is active; called with the (B, h, Nq, Nk) weights.
        self.capture_hook: Hook | None = None

        self.qkv = nn.Linear(dim, inner * 3, bias=qkv_bias)
        self.proj = nn.Linear(inner, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: Tensor, bias: Tensor | None = None, *, key: Tensor | None = None, value: Tensor | None = None
    ) -> Tensor:
        """Attend from the queries x (B, Nq, C) over `key` (B, Nk, C) and `value` (B, Nk, C) -> (B, Nq, C).

        Without `key` and `value` this is self-attention over x. `key` defaults to x and `value` to `key`, so
        DETR's encoder, whose queries and keys carry the positions and whose values do not, is
        ``attn(x + pos, value=x)`` and its cross-attention ``attn(tgt + query_pos, mask, key=memory + pos,
        value=memory)``. `bias` is added to the logits, broadcastable to (B, h, Nq, Nk); a boolean one is a mask
        (True: may attend).
        """
        key = x if key is None else key
        value = key if value is None else value
        self.check_inputs(x, key, value)
        B, Nq, _ = x.shape
        if key is x and value is x:  # self-attention: one GEMM
            qkv = self.qkv(x).reshape(B, Nq, 3, self.num_heads, self.head_dim)  # (B, N, 3hd) -> (B, N, 3, h, d)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (3, B, h, N, d) -> 3 x (B, h, N, d)
        else:
            q, k, v = self.project(x, key, value)  # (B, h, Nq, d), (B, h, Nk, d), (B, h, Nk, d)
        x = self.attend(q, k, v, bias)  # (B, h, Nq, d)
        x = x.transpose(1, 2).reshape(B, Nq, self.num_heads * self.head_dim)  # (B, Nq, h, d) -> (B, Nq, hd)
        return self.proj_drop(self.proj(x))

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> list[Tensor]:
        """q, k, v, each (B, h, N, d), through the rows q | k | v of the fused `qkv` weight (3hd, C).

        Neighbouring projections of one tensor share a GEMM: DETR's q = k from x + pos takes one (B, N, 2C)
        product and v another; cross-attention's k and v from one memory share theirs.
        """
        weight, bias = self.qkv.weight, self.qkv.bias  # (3hd, C), (3hd,)
        C = self.num_heads * self.head_dim  # rows per part
        inputs, heads, start = (query, key, value), [], 0
        while start < 3:
            stop = start + 1
            while stop < 3 and inputs[stop] is inputs[start]:
                stop += 1
            rows = slice(start * C, stop * C)
            x = inputs[start]
            y = F.linear(x, weight[rows], None if bias is None else bias[rows])  # (B, N, nC), n = stop - start
            y = y.reshape(*x.shape[:2], stop - start, self.num_heads, self.head_dim)  # (B, N, n, h, d)
            heads += y.permute(2, 0, 3, 1, 4).unbind(0)  # (n, B, h, N, d) -> n x (B, h, N, d)
            start = stop
        return heads

    def check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        """ValueError unless query (B, Nq, C), key and value (B, Nk, C) agree with each other and with the layer."""
        C = self.dim
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != 3 or t.shape[-1] != C:
                raise ValueError(f"attention {name} must be (B, N, {C}), got shape {tuple(t.shape)}")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(
                f"attention query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                "must share the batch, and key and value the tokens"
            )

    def path(
        self, device: torch.device, dtype: torch.dtype, weights_bytes: int, dropout: float = 0.0, grad: bool = False
    ) -> str:
        """Which of `PATHS` computes a call on `device` in `dtype` whose N x N weights take `weights_bytes`, with
        dropout at rate `dropout` on the weights, and autograd history to keep when `grad`.

        "math" always runs the reference. Capturing needs the weights, so it takes the explicit path, which forms
        them with the least memory. So does dropout on CPU, where torch's fused kernel has none and
        `scaled_dot_product_attention` falls back to its math kernel (which keeps more for backward). "auto" takes
        the explicit path on CPU in bf16 while the weights fit in `explicit_max_bytes`, and the blocked path beyond
        that when no gradient is needed: on CPUs with AVX512-BF16 torch's fused kernel runs its blocks far below
        the bf16 GEMM rate (it was slower at every size measured, up to 4,097 tokens). On CPUs with AMX tiles
        (`vitkit.layers.helpers.cpu_amx`) the fused kernel runs its blocks on the tiles: there inference takes it
        (ViT-B/16 at 1024 px: 1.13 s against the blocked path's 3.21 s; Swin-T at 224 15% faster; ViT at 224 a
        tie), and training keeps the explicit path, whose backward is 2.5x faster than the fused kernel's. On
        CPUs without bf16 instructions torch emulates bf16 products, 20x slower than its fused kernel, which
        computes in fp32 (`vitkit.layers.helpers.native_cpu_bf16`). In fp32 on CPU the fused kernel is as fast or
        faster and needs no N x N memory; on GPUs the fused kernels are the fast path.
        """
        if self.backend == "math":
            return "reference"
        if self.capture_hook is not None or (dropout > 0 and device.type == "cpu"):
            return "explicit"
        if self.backend != "auto" or device.type != "cpu" or dtype != torch.bfloat16 or not helpers.native_cpu_bf16():
            return "fused"
        if not grad and helpers.cpu_amx():
            return "fused"
        if weights_bytes <= self.explicit_max_bytes:
            return "explicit"
        return "fused" if grad else "blocked"

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """softmax(q k^T * scale + bias) v for q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) -> (..., Nq, dv).

        The leading dims (B, h) of q, k and v broadcast, as in torch's scaled_dot_product_attention, and `bias`
        broadcasts to (..., Nq, Nk); a boolean `bias` is a mask (True: may attend). `path` picks the computation.
        """
        dropout = self.attn_drop if self.training else 0.0
        weights_bytes = math.prod(q.shape[:-1]) * k.shape[-2] * q.element_size()  # (B, h, Nq) x Nk in q's dtype
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias))
        path = self.path(q.device, q.dtype, weights_bytes, dropout, grad or self.training)
        if path == "fused":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=self.scale)
        if path == "blocked":
            return blocked_attention(q, k, v, bias, self.scale, self.explicit_max_bytes)
        attention = reference_attention if path == "reference" else explicit_attention
        return attention(q, k, v, bias, self.scale, dropout, self.capture_hook)

    def cost(
        self,
        name: str,
        x: Value,
        ctx: CostContext,
        bias: Value | None = None,
        key: Value | None = None,
        value: Value | None = None,
    ) -> list[OpCost]:
        """The operators of `forward` on queries x (B, Nq, C), in forward order, for the path `ctx` selects; `bias`,
        `key` and `value` as in `forward`."""
        key = x if key is None else key
        value = key if value is None else value
        ops, (q, k, v) = self.cost_project(name, x, key, value, ctx)
        ops(self.cost_attend(name, q, k, v, ctx, bias))
        ops(self.cost_merge_heads(name, q, k, ops.out, ctx))  # (B, h, Nq, d) -> (B, Nq, C)
        ops(linear(name, "proj", ops.out, self.proj, ctx))  # BNqC^2 MACs
        return ops + cost_of(f"{name}.proj_drop", self.proj_drop, ops.out, ctx)

    def cost_project(
        self, name: str, query: Value, key: Value, value: Value, ctx: CostContext
    ) -> tuple[Ops, list[Value]]:
        """The projection GEMMs of `forward` (one per run of neighbouring q, k, v made from one input, as in
        `project`) and q (B, h, Nq, d), k, v (B, h, Nk, d): views of them, kept until forward returns."""
        inputs, ops, heads, start = (query, key, value), Ops(query), [], 0
        while start < 3:
            stop = start + 1
            while stop < 3 and inputs[stop] is inputs[start]:
                stop += 1
            x, n = inputs[start], stop - start
            inner = self.num_heads * self.head_dim
            gemm = linear_op(name, "qkv"[start:stop], x, n * inner, ctx, bias=self.qkv.bias is not None)  # nBNC hd
            ops(dataclasses.replace(gemm, named=True))
            B, N, _ = x.shape
            heads += [view(gemm.output, (B, self.num_heads, N, self.head_dim))] * n  # (B, h, N, d) of (B, N, nC)
            start = stop
        return ops, heads

    def cost_path(self, q: Value, k: Value, ctx: CostContext) -> str:
        """`path` for queries q (B, h, Nq, d) and keys k (B, h, Nk, d) in `ctx`, in this layer's mode."""
        dropout = self.attn_drop if self.training else 0.0  # a layer in training mode is costed with its backward
        return self.path(
            ctx.device, ctx.dtype, numel(q.shape[:-1]) * k.shape[-2] * ctx.itemsize, dropout, self.training
        )

    def cost_merge_heads(self, name: str, q: Value, k: Value, out: Value, ctx: CostContext) -> OpCost:
        """(B, h, N, d) -> transpose (B, N, h, d) -> reshape (B, N, C): a copy, except after the fused kernel,
        which writes its output in (B, N, h, d) order so that the reshape is a view."""
        B, h, N, d = out.shape
        return copy_op(name, "merge_heads", out, (B, N, h * d), ctx, copies=self.cost_path(q, k, ctx) != "fused")

    def cost_attend(
        self, name: str, q: Value, k: Value, v: Value, ctx: CostContext, bias: Value | None = None
    ) -> list[OpCost]:
        """The operators of `attend` for q (B, h, Nq, d), k (B, h, Nk, d), v (B, h, Nk, dv) and an optional bias."""
        *lead, Nq, d = q.shape
        Nk, dv = k.shape[-2], v.shape[-1]
        logits = (*lead, Nq, Nk)
        path = self.cost_path(q, k, ctx)
        heads_qk = numel(logits) * d  # B*h*Nq*Nk*d multiply-adds, = BN^2C for self-attention
        heads_v = numel(logits) * dv
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
            return [*ops, dataclasses.replace(out, saved=(q, k, v, out.output, *weights))]
        if path == "blocked":  # q's, k's and v's copies, one block's weights (reused), the output written by blocks
            q3, k3, v3 = (
                ops(copy_op(name, f"{t}_copy", x, x.shape, ctx)) for t, x in zip("qkv", (q, k, v), strict=True)
            )
            rows = max(1, min(Nq, self.explicit_max_bytes // max(1, numel(lead) * Nk * ctx.itemsize)))
            ops(elementwise_op(name, "q*scale", q, 1, ctx, stored=False))  # BNC, in baddbmm's alpha
            block = ops(matmul_op(name, "q@k^T", (q3, k3), (*lead, rows, Nk), heads_qk, ctx))
            # the bias and the softmax run on every block in place: their FLOPs are the whole (B, h, Nq, Nk)'s
            if bias is not None:
                add = elementwise_op(name, "+bias", (block, bias), 1, ctx, in_place=True)
                ops(dataclasses.replace(add, flops=numel(logits)))
            softmax = elementwise_op(name, "softmax", block, SOFTMAX_FLOPS, ctx, in_place=True)
            ops(dataclasses.replace(softmax, flops=SOFTMAX_FLOPS * numel(logits)))
            # q's and k's copies are read by every block: alive until the last product
            return ops + [holding(matmul_op(name, "attn@v", (block, v3), (*lead, Nq, dv), heads_v, ctx), q3, k3)]
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
        in_place = path == "explicit"  # without grad the explicit path adds and normalises in its one buffer
        if bias is not None:
            ops(elementwise_op(name, "+bias", (ops.out, bias), 1, ctx, in_place=in_place))  # BhN^2
        ops(elementwise_op(name, "softmax", ops.out, SOFTMAX_FLOPS, ctx, in_place=in_place, saves_output=True))
        weights = ops(dropout_ops(name, ops.out, self.attn_drop, self.training, ctx))  # on the weights, training only
        v_copy = ops(copy_op(name, "v_copy", v, v.shape, ctx))  # (n, Nk, dv) copy of the strided heads
        ops(matmul_op(name, "attn@v", (weights, v_copy), (*lead, Nq, dv), heads_v, ctx))
        return ops


def attention_layers(model: nn.Module) -> list[tuple[str, Attention | MultiScaleDeformableAttention]]:
    """The model's attention layers as (qualified name, module), in registration order: the dense `Attention` and
    the multi-scale deformable `vitkit.layers.deformable.MultiScaleDeformableAttention`. Both kinds have a `backend`
    (`BACKENDS`) and a `capture_hook`; check the kind before using anything else."""
    from vitkit.layers.deformable import MultiScaleDeformableAttention as Deformable  # deformable imports this module

    kinds = (Attention, Deformable)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]


def set_attention_backend(model: nn.Module, backend: str, explicit_max_bytes: int | None = None) -> nn.Module:
    """Switch every attention layer of `model`, dense and deformable, to `backend` ("auto", "sdpa" or "math");
    returns the model.

    `explicit_max_bytes`, when given, replaces each dense layer's budget for the explicit path under "auto".
    """
    check_backend(backend)
    if explicit_max_bytes is not None and explicit_max_bytes < 0:
        raise ValueError(f"explicit_max_bytes must be >= 0, got {explicit_max_bytes}")
    for _, layer in attention_layers(model):
        layer.backend = backend
        if explicit_max_bytes is not None and isinstance(layer, Attention):
            layer.explicit_max_bytes = explicit_max_bytes
    return model


@contextmanager
def capture_attention(
    model: nn.Module, layers: Iterable[str] | None = None
) -> Iterator[dict[str, torch.Tensor | SampledAttention]]:
    """Record attention weights while the context is open.

    Yields an ordered dict, filled during forward passes run inside the context, mapping each attention layer's
    qualified name (e.g. ``blocks.0.attn``) to what it recorded, detached. A dense `Attention` records its weights
    (B, h, Nq, Nk), whose rows sum to one. A multi-scale deformable layer records a
    `vitkit.layers.deformable.SampledAttention`: where each query looked (its sampling locations (B, Q, h, L, K, 2))
    and how much (their weights (B, Q, h, L, K)); its `dense_maps()` spreads them over each level's pixels,
    (B, h, Q, H_l * W_l) per level, summing to one over the levels. A layer called again replaces its entry (the
    last forward pass wins). Works with every backend: a capturing dense layer forms its weights (on the explicit
    path, or the reference with "math") only while the context is open; outside it nothing is recorded and nothing
    N x N is kept. A deformable layer's record costs nothing to make: it holds tensors the layer computes anyway.

    Args:
        model: any module containing vitkit attention layers (`attention_layers`).
        layers: names of the layers to capture, or one name (default: all). Capturing one dense layer costs that
            layer's N x N map only.

    Contexts nest: a layer captured by an inner context records into the outer one's dict as well.
    """
    found = attention_layers(model)
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no vitkit Attention layers (dense or multi-scale deformable) to capture"
        )
    if layers is not None:
        wanted = [layers] if isinstance(layers, str) else list(layers)
        available = dict(found)
        unknown = [name for name in wanted if name not in available]
        if unknown:
            names = ", ".join(name for name, _ in found[:4])
            raise ValueError(f"no attention layer named {unknown}; attention layers are e.g. {names}, ...")
        found = [(name, available[name]) for name in wanted]

    maps: dict[str, torch.Tensor | SampledAttention] = OrderedDict()
    previous = [layer.capture_hook for _, layer in found]

    def hook_for(
        name: str, outer: Callable[[torch.Tensor | SampledAttention], None] | None
    ) -> Callable[[torch.Tensor | SampledAttention], None]:
        def store(attn: torch.Tensor | SampledAttention) -> None:
            maps[name] = attn.detach()
            if outer is not None:  # an enclosing capture of the same layer records it too
                outer(attn)

        return store

    for (name, layer), outer in zip(found, previous, strict=True):
        layer.capture_hook = hook_for(name, outer)
    try:
        yield maps
    finally:
        for (_, layer), hook in zip(found, previous, strict=True):
            layer.capture_hook = hook
