"""Multi-head scaled dot-product attention: the one dense attention layer in vitkit.

Every model (ViT, DeiT, Swin's window attention, BoTNet's relative-position attention, DETR's encoder and decoder)
computes softmax(q k^T * scale + bias) v through `Attention.attend`, so every backend, the attention capture and the
costs serve them all. The computation and its paths are `vitkit.kernels.attention`; this module projects the tokens
to heads and back.

Letters used in shape comments: B batch, N tokens (Nq queries, Nk keys), C channels (= h * d), h heads, d head dim.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.kernels.attention import EXPLICIT_MAX_BYTES, AttentionOptions, Hook, attention
from vitkit.kernels.policy import ATTENTION_BACKENDS, BACKENDS, check_backend, knows

if TYPE_CHECKING:
    from vitkit.layers.deformable import MultiScaleDeformableAttention, SampledAttention


class Attention(nn.Module):
    """Multi-head self-attention over tokens (B, N, C) with one fused qkv projection.

    Heads are split by reshape/permute and computed as one batched matmul, never a loop over heads.

    Args:
        dim: token channels C; must be divisible by `num_heads` unless `head_dim` is given.
        num_heads: number of heads h; head dim d = C // h.
        qkv_bias: add a bias to the fused q, k, v projection.
        attn_drop: dropout on the attention weights (training only).
        proj_drop: dropout after the output projection.
        backend: one of `vitkit.kernels.policy.ATTENTION_BACKENDS`: "auto" (the fused kernel unless the explicit
            path is faster for the call), "sdpa" (the fused kernel) or "math" (the reference formula); all give the
            same values.
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
        self.backend = check_backend(backend, ATTENTION_BACKENDS)
        self.explicit_max_bytes = explicit_max_bytes
        self.attn_drop = attn_drop
        # Set by `capture_attention` while it is active; called with the (B, h, Nq, Nk) weights.
        self.capture_hook: Hook | None = None

        self.qkv = nn.Linear(dim, inner * 3, bias=qkv_bias)
        self.proj = nn.Linear(inner, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self,
        x: Tensor,
        bias: Tensor | None = None,
        *,
        key: Tensor | None = None,
        value: Tensor | None = None,
        pos: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """Attend from the queries x (B, Nq, C) over `key` (B, Nk, C) and `value` (B, Nk, C) -> (B, Nq, C).

        Without `key` and `value` this is self-attention over x. `key` defaults to x and `value` to `key`, so
        DETR's encoder, whose queries and keys carry the positions and whose values do not, is
        ``attn(x + pos, value=x)`` and its cross-attention ``attn(tgt + query_pos, mask, key=memory + pos,
        value=memory)``. `bias` is added to the logits, broadcastable to (B, h, Nq, Nk); a boolean one is a mask
        (True: may attend). `pos`, when given, computes a position term from the queries (B, h, Nq, d) that is
        added to the logits as well (`vitkit.layers.rel_pos`: ViTDet's decomposed relative positions).
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
        if pos is not None:
            term = pos(q)  # (B, h, Nq, Nk)
            bias = term if bias is None else bias + term
        x = self.attend(q, k, v, bias)  # (B, Nq, hd)
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

    def options(self) -> AttentionOptions:
        """How this layer asks for attention now (its backend, budget, capture, and dropout in training)."""
        return AttentionOptions(
            self.scale, self.backend, self.attn_drop if self.training else 0.0, self.capture_hook,
            self.explicit_max_bytes, self.training,
        )  # fmt: skip

    def path(
        self, device: torch.device, dtype: torch.dtype, weights_bytes: int, dropout: float = 0.0, grad: bool = False
    ) -> str:
        """Which of `vitkit.kernels.policy.ATTENTION_PATHS` computes a call of this layer on `device` in `dtype`
        whose N x N weights take `weights_bytes`, with dropout at rate `dropout` and a gradient to keep (`grad`)."""
        options = dataclasses.replace(self.options(), dropout=dropout, training=False)
        return options.path(device, dtype, weights_bytes, grad)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
        """softmax(q k^T * scale + bias) v for q (B, h, Nq, d), k (B, h, Nk, d), v (B, h, Nk, dv), the heads merged:
        (B, Nq, h * dv), on the path `vitkit.kernels.policy.attention_path` picks (`vitkit.kernels.attention`).
        `bias` broadcasts to (B, h, Nq, Nk); a boolean one is a mask (True: may attend)."""
        return attention(q, k, v, bias, self.options())


def attention_layers(model: nn.Module) -> list[tuple[str, Attention | MultiScaleDeformableAttention]]:
    """The model's attention layers as (qualified name, module), in registration order: the dense `Attention` and
    the multi-scale deformable `vitkit.layers.deformable.MultiScaleDeformableAttention`. Both kinds have a `backend`
    (`BACKENDS`) and a `capture_hook`; check the kind before using anything else."""
    from vitkit.layers.deformable import MultiScaleDeformableAttention as Deformable  # deformable imports this module

    kinds = (Attention, Deformable)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]


def set_attention_backend(model: nn.Module, backend: str, explicit_max_bytes: int | None = None) -> nn.Module:
    """Switch the attention layers of `model` that know `backend` to it; returns the model.

    "auto" and "math" (the reference) switch every layer, dense and deformable; "sdpa" the dense layers
    (`vitkit.kernels.policy.ATTENTION_BACKENDS`); "gather" and "levelwise" the deformable ones
    (`DEFORMABLE_BACKENDS`). `explicit_max_bytes`, when given, replaces each dense layer's budget for the explicit
    path under "auto". `attention_backend` does the same for the length of a `with` block.
    """
    check_backend(backend, BACKENDS)
    if explicit_max_bytes is not None and explicit_max_bytes < 0:
        raise ValueError(f"explicit_max_bytes must be >= 0, got {explicit_max_bytes}")
    layers = [layer for _, layer in attention_layers(model)]
    switched = [layer for layer in layers if knows(backend, deformable=not isinstance(layer, Attention))]
    if layers and not switched:
        raise ValueError(f"{type(model).__name__} has no attention layer with a {backend!r} backend")
    for layer in switched:
        layer.backend = backend
    for layer in layers:
        if explicit_max_bytes is not None and isinstance(layer, Attention):
            layer.explicit_max_bytes = explicit_max_bytes
    return model


@contextmanager
def attention_backend(model: nn.Module, backend: str) -> Iterator[nn.Module]:
    """`set_attention_backend` inside a `with` block: every layer's own backend comes back after it."""
    layers = [layer for _, layer in attention_layers(model)]
    before = [layer.backend for layer in layers]
    set_attention_backend(model, backend)
    try:
        yield model
    finally:
        for layer, previous in zip(layers, before, strict=True):
            layer.backend = previous


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
