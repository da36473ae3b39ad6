"""Multi-head attention pooling ("MAP"): one learned query attends over the tokens, and its output is the pooled
feature.

SigLIP's image tower pools this way ("Sigmoid Loss for Language Image Pre-Training", Zhai et al., arXiv:2303.15343;
the head of big_vision's ViT with `pool_type="map"`, after "Scaling Vision Transformers", arXiv:2106.04560):

    y = Attention(query = probe, key = value = tokens)      (B, 1, D)
    y = y + Mlp(LayerNorm(y))
    pooled = y[:, 0]                                         (B, D)

The attention is the shared `vitkit.layers.Attention` (its dispatch, capture and cost), with the projections laid out
as timm's `AttentionPoolLatent` names them, so timm's state dicts load unchanged: `latent` (the probe, 1 x 1 x D),
`q` (D -> D) for the probe, `kv` (D -> 2D, rows k then v) for the tokens, `proj`, `norm`, `mlp`.

Letters: B batch, N tokens, D channels, h heads, d = D / h.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitkit.layers.attention import Attention
from vitkit.layers.cost import CostContext, OpCost, Ops, Value, copy_op, given, linear, residual, sequence, view
from vitkit.layers.mlp import Mlp


class AttentionPool(Attention):
    """Attention pooling of tokens (B, N, D) -> (B, D) through one learned probe query.

    Args:
        dim: token channels D; must be divisible by `num_heads`.
        num_heads: heads h.
        mlp_ratio: hidden width of the MLP after the attention, as a multiple of D.
        qkv_bias: biases on the q and kv projections.
        norm_eps: epsilon of the LayerNorm before the MLP.
        act: the MLP's activation (`vitkit.layers.mlp.ACTIVATIONS`).
        backend: the attention backend ("auto", "sdpa", "math").
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        norm_eps: float = 1e-6,
        act: str = "gelu",
        backend: str = "auto",
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, backend=backend)
        del self.qkv  # the probe and the tokens have their own projections
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # the probe query
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act=act)
        nn.init.trunc_normal_(self.latent, std=dim**-0.5)  # as timm initialises the probe

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        """Tokens x (B, N, D) -> the pooled features (B, D)."""
        probe = self.latent.expand(x.shape[0], -1, -1)  # (B, 1, D)
        y = super().forward(probe, key=x)  # (B, 1, D)
        y = y + self.mlp(self.norm(y))
        return y[:, 0]  # (B, D)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> list[Tensor]:
        """q (B, h, 1, d) from the probe through `q`; k and v (B, h, N, d) from the tokens through `kv`."""
        (B, Nq, _), N = query.shape, key.shape[1]
        q = self.q(query).reshape(B, Nq, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, 1, d)
        kv = self.kv(key).reshape(B, N, 2, self.num_heads, self.head_dim)  # (B, N, 2D) -> (B, N, 2, h, d)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # (2, B, h, N, d) -> 2 x (B, h, N, d)
        return [q, k, v]

    def cost(self, name: str, x: Value, ctx: CostContext) -> list[OpCost]:  # type: ignore[override]
        """The operators of `forward` on tokens x (B, N, D), in forward order."""
        B, _, D = x.shape
        ops = Ops(x)
        ops(super().cost(name, given((B, 1, D)), ctx, key=x))  # the probe, expanded: a view of a weight
        ops(residual(name, ops.out, ctx, sequence(name, ops.out, ctx, self, "norm", "mlp")))
        return ops + [copy_op(name, "take_probe", ops.out, (B, D), ctx, copies=False)]  # y[:, 0]: a view

    def cost_project(
        self, name: str, query: Value, key: Value, value: Value, ctx: CostContext
    ) -> tuple[Ops, list[Value]]:
        """The probe's and the tokens' projection GEMMs, and q (B, h, 1, d), k, v (B, h, N, d): views of them."""
        (B, Nq, _), N = query.shape, key.shape[1]
        h, d = self.num_heads, self.head_dim
        ops = Ops(query)
        q = ops(linear(name, "q", query, self.q, ctx))  # B D^2 MACs
        kv = ops(linear(name, "kv", key, self.kv, ctx))  # 2 B N D^2 MACs
        return ops, [view(q, (B, h, Nq, d)), view(kv, (B, h, N, d)), view(kv, (B, h, N, d))]
