"""Multi-head scaled dot-product attention: the one attention implementation in vitkit.

Every model (ViT, DeiT, Swin's window attention, BoTNet's relative-position attention) computes
softmax(q k^T * scale + bias) v through `Attention.attend`, so every backend, the attention capture
and the cost accounting live here once.

Letters used in shape comments: B batch, N tokens, C channels (= h * d), h heads, d head dim.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers.cost import SOFTMAX_FLOPS, OpCost, elementwise_op, linear_op, matmul_op, numel

BACKENDS = ("auto", "sdpa", "math")
"""`sdpa`: torch's fused scaled_dot_product_attention (flash / memory-efficient kernels, never keeps the
N x N weights); `math`: the explicit softmax(q k^T * scale + bias) v, the reference; `auto` (the default): the
fused kernel, except where the explicit path is measured faster (see `explicit_is_faster`)."""

EXPLICIT_MAX_BYTES = 32 * 2**20
"""Largest N x N weight tensor (bytes, all batch elements and heads of one call) that `auto` forms explicitly."""


def explicit_is_faster(device: torch.device, dtype: torch.dtype, weights_bytes: int) -> bool:
    """Whether `auto` takes the explicit path for a call on `device` in `dtype` whose weights take `weights_bytes`.

    On CPU in bfloat16, torch's fused kernel runs its q k^T and attn v blocks far below the bf16 GEMM rate: for
    ViT-S/16 at 224 (batch 16, 197 tokens, 6 heads) the explicit path's two batched bf16 matmuls and softmax take
    5.7 ms a layer against the fused kernel's 11.3 ms, forward and backward 18 ms against 43 ms. It was faster
    at every size measured (up to 4,097 tokens), but it keeps the N x N weights, so it is taken only while one
    call's weights, counted in q's dtype, fit in `EXPLICIT_MAX_BYTES`: a memory budget, not a speed limit. In
    training each layer's weights are kept for the backward (a fp32 bias, such as Swin's table under autocast,
    keeps them in fp32), so a model holds up to depth x that budget more than with the fused kernel. In fp32 on CPU
    the two paths are within a few percent and the fused kernel, which needs no N x N memory, is used; on GPUs the
    fused kernels are the fast path and always used.
    """
    return device.type == "cpu" and dtype == torch.bfloat16 and weights_bytes <= EXPLICIT_MAX_BYTES


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {backend!r}")
    return backend


class Attention(nn.Module):
    """Multi-head self-attention over tokens (B, N, C) with one fused qkv projection.

    Heads are split by reshape/permute and computed as one batched matmul, never a loop over heads.

    Args:
        dim: token channels C; must be divisible by `num_heads`.
        num_heads: number of heads h; head dim d = C // h.
        qkv_bias: add a bias to the fused q, k, v projection.
        attn_drop: dropout on the attention weights (training only).
        proj_drop: dropout after the output projection.
        backend: "auto" (the fused kernel unless the explicit path is faster for the call), "sdpa" (fused
            kernel) or "math" (explicit reference); all give the same values.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.backend = check_backend(backend)
        self.attn_drop = attn_drop
        # Set by `capture_attention` while it is active; called with the (B, h, Nq, Nk) weights.
        self.capture_hook: Callable[[torch.Tensor], None] | None = None

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attend over tokens x (B, N, C); `bias` is added to the logits, broadcastable to (B, h, N, N)."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, h, N, d)
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        x = self.attend(q, k, v, bias)  # (B, h, N, d)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, N, h, d) -> (B, N, C)
        return self.proj_drop(self.proj(x))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """softmax(q k^T * scale + bias) v for q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) -> (..., Nq, dv).

        The leading dims (B, h) of q, k and v broadcast, as in torch's scaled_dot_product_attention, and `bias`
        broadcasts to (..., Nq, Nk); a boolean `bias` is a mask (True: may attend). The fused kernel runs unless
        the backend is "math", the weights are being captured, or the backend is "auto" and the explicit path is
        faster for this call; then the weights (..., Nq, Nk) are formed explicitly.
        """
        dropout = self.attn_drop if self.training else 0.0
        if self.capture_hook is None and not self._explicit(q, k):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=self.scale)
        if bias is not None and bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill_(~bias, float("-inf"))
        lead = q.shape[:-2]  # (B, h)
        if not k.shape[:-2] == v.shape[:-2] == lead:  # broadcast k and v against q (no-op for vitkit's layers)
            lead = torch.broadcast_shapes(lead, k.shape[:-2], v.shape[:-2])
            q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))
        (Nq, d), Nk, dv, n = q.shape[-2:], k.shape[-2], v.shape[-1], math.prod(lead)
        # One batch dim of B*h: the reshapes copy the strided heads once, and baddbmm folds the scale into the
        # product (q*scale and a 4-D matmul would copy them again; measured 15% slower on CPU in bf16).
        q3, k3 = q.reshape(n, Nq, d), k.reshape(n, Nk, d)
        # beta=0: the (broadcast) zero input is ignored and no second N x N buffer is made
        attn = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0, alpha=self.scale)
        attn = attn.view(*lead, Nq, Nk)
        del q3, k3  # their copies, if any, are freed before v's is made
        if attn.requires_grad or (bias is not None and bias.requires_grad and torch.is_grad_enabled()):
            attn = attn.softmax(dim=-1) if bias is None else (attn + bias).softmax(dim=-1)
        else:  # no autograd history to keep: one N x N buffer, updated in place, is all the memory it takes
            if bias is not None:
                attn.add_(bias)
            torch.softmax(attn, dim=-1, out=attn)
        if self.capture_hook is not None:
            self.capture_hook(attn)
        attn = F.dropout(attn, dropout)
        v3 = v.reshape(n, Nk, dv)
        # an fp32 bias on bf16 logits promotes the weights to fp32; the product is taken in v's dtype
        return torch.bmm(attn.reshape(n, Nq, Nk).to(v3.dtype), v3).view(*lead, Nq, dv)

    def _explicit(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        if self.backend != "auto":
            return self.backend == "math"
        weights_bytes = math.prod(q.shape[:-1]) * k.shape[-2] * q.element_size()  # (B, h, Nq) x Nk
        return explicit_is_faster(q.device, q.dtype, weights_bytes)

    def cost(
        self, name: str, shape: tuple[int, int, int], bias: bool = False, held: int = 0, dtype_bytes: int = 4
    ) -> list[OpCost]:
        """Analytic cost of `forward` on tokens of `shape` (B, N, C), one row per operator in forward order.

        Args:
            name: this layer's qualified module name, used in the rows.
            shape: input shape (B, N, C).
            bias: whether an additive bias is passed to the logits.
            held: activation bytes the caller keeps alive meanwhile (e.g. the residual stream).
            dtype_bytes: bytes per activation element; with the "auto" backend, 2 stands for bf16 on CPU.
        """
        # q@k^T and attn@v: B*h*N*N*d = BN^2C MACs each; softmax: 5 FLOPs per weight (BhN^2 weights).
        B, N, C = shape
        h, d = self.num_heads, self.head_dim
        heads, logits = (B, h, N, d), (B, h, N, N)
        # The fused kernel never stores the N x N logits or weights; the explicit path (math or capturing) does.
        explicit = self.backend == "math" or self.capture_hook is not None
        if self.backend == "auto" and dtype_bytes == 2:
            explicit = explicit or explicit_is_faster(torch.device("cpu"), torch.bfloat16, numel(logits) * 2)
        nn_bytes = numel(logits) * dtype_bytes if explicit else 0
        head_bytes = numel(heads) * dtype_bytes
        held_in = held + numel(shape) * dtype_bytes  # the input stays referenced until forward returns
        live = held_in + 3 * head_bytes  # + the (B, N, 3C) projection, alive while q, k, v are in use
        ops = [linear_op(name, "qkv", shape, 3 * C, self.qkv.bias is not None, held, dtype_bytes)]  # 3BNC^2 MACs
        ops.append(elementwise_op(name, "q*scale", heads, 1, live, dtype_bytes))  # BNC (in the fused kernel or q@k^T)
        # The explicit path's batched matmuls copy their strided operands: q's and k's copies sit beside q@k^T,
        # v's copy beside attn@v (measured with vitkit.analysis.PeakMemory).
        copies = (2 if explicit else 0) * head_bytes
        qk_live = live + copies
        ops.append(matmul_op(name, "q@k^T", heads, logits, B * h * N * N * d, qk_live, dtype_bytes, False, explicit))
        # The explicit path adds the bias and takes the softmax in place in its one N x N buffer (see `attend`).
        if bias:
            ops.append(elementwise_op(name, "+bias", logits, 1, live + nn_bytes, dtype_bytes, False))  # BhN^2
        ops.append(elementwise_op(name, "softmax", logits, SOFTMAX_FLOPS, live + nn_bytes, dtype_bytes, False))
        v_copy = head_bytes if explicit else 0
        ops.append(matmul_op(name, "attn@v", logits, heads, B * h * N * N * d, live + nn_bytes + v_copy, dtype_bytes))
        ops.append(matmul_op(name, "merge_heads", heads, (B, N, C), 0, held_in + head_bytes, dtype_bytes))  # a copy
        if isinstance(self.proj, nn.Linear):
            bias_on = self.proj.bias is not None
            ops.append(linear_op(name, "proj", (B, N, C), C, bias_on, held_in, dtype_bytes))  # BNC^2 MACs
        return ops


def attention_layers(model: nn.Module) -> list[tuple[str, Attention]]:
    """The model's attention layers as (qualified name, module), in registration order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Attention)]


def set_attention_backend(model: nn.Module, backend: str) -> nn.Module:
    """Switch every attention layer of `model` to `backend` ("auto", "sdpa" or "math"); returns the model."""
    check_backend(backend)
    for _, layer in attention_layers(model):
        layer.backend = backend
    return model


@contextmanager
def capture_attention(model: nn.Module, layers: Iterable[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Record attention weights while the context is open.

    Yields an ordered dict, filled during forward passes run inside the context, mapping each attention
    layer's qualified name (e.g. ``blocks.0.attn``) to its detached weights (B, h, Nq, Nk), whose rows sum
    to one. A layer called again replaces its entry (the last forward pass wins). Works with every backend:
    a capturing layer forms its weights explicitly only while the context is open; outside it nothing is
    recorded and nothing N x N is kept.

    Args:
        model: any module containing vitkit `Attention` layers.
        layers: names of the layers to capture (default: all). Capturing one layer costs that layer's
            N x N map only.
    """
    found = attention_layers(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no vitkit Attention layers to capture")
    if layers is not None:
        wanted = list(layers)
        available = dict(found)
        unknown = [name for name in wanted if name not in available]
        if unknown:
            names = ", ".join(name for name, _ in found[:4])
            raise ValueError(f"no attention layer named {unknown}; attention layers are e.g. {names}, ...")
        found = [(name, available[name]) for name in wanted]

    maps: dict[str, torch.Tensor] = OrderedDict()
    previous = [layer.capture_hook for _, layer in found]

    def hook_for(name: str) -> Callable[[torch.Tensor], None]:
        def store(attn: torch.Tensor) -> None:
            maps[name] = attn.detach()

        return store

    for name, layer in found:
        layer.capture_hook = hook_for(name)
    try:
        yield maps
    finally:
        for (_, layer), hook in zip(found, previous, strict=True):
            layer.capture_hook = hook
