"""Multi-head attention pooling ("MAP"): one learned query attends over the tokens, and its output is the pooled
feature.

SigLIP's image tower pools this way ("Sigmoid Loss for Language Image Pre-Training", Zhai et al., arXiv:2303.15343;
the head of big_vision's ViT with `pool_type="map"`, after "Scaling Vision Transformers", arXiv:2106.04560):

    y = Attention(query = probe, key = value = tokens)      (B, 1, D)
    y = y + Mlp(LayerNorm(y))
    pooled = y[:, 0]                                         (B, D)

The attention is the shared `vitkit.layers.Attention`'s (its dispatch, capture and cost), with the projections laid
out as timm's `AttentionPoolLatent` names them, so timm's state dicts load unchanged: `latent` (the probe, 1 x 1 x D),
`q` (D -> D) for the probe, `kv` (D -> 2D, rows k then v) for the tokens, `proj`, `norm`, `mlp`.

Letters: B batch, N tokens, D channels, h heads, d = D / h.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitkit.layers.attention import Attention
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
        B, N, D = x.shape
        h, d = self.num_heads, self.head_dim
        # the probe's query is the same for every image: projected once, then broadcast over the batch
        q = self.q(self.latent).reshape(1, 1, h, d).transpose(1, 2).expand(B, -1, -1, -1)  # (B, h, 1, d)
        kv = self.kv(x).reshape(B, N, 2, h, d)  # (B, N, 2D) -> (B, N, 2, h, d)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # (2, B, h, N, d) -> 2 x (B, h, N, d)
        y = self.attend(q, k, v)  # (B, 1, D): the shared dispatch (backends, capture)
        y = self.proj_drop(self.proj(y))  # (B, 1, D)
        y = y + self.mlp(self.norm(y))
        return y[:, 0]  # (B, D)

