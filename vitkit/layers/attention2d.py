"""Multi-head self-attention over a CNN feature map (B, C, H, W).

The map is flattened to H*W tokens of C channels, attended with the shared `Attention`, and folded back,
so it drops into any convolutional network where a 3x3 convolution or a non-local block would go
(BoTNet's "bottleneck transformer" block is a ResNet bottleneck with its 3x3 convolution replaced this way).

Letters: B batch, C channels, H, W feature-map height and width, N = H * W tokens, h heads, d head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.layers.attention import Attention
from vitkit.layers.helpers import to_2tuple
from vitkit.layers.rel_pos import FactorizedPosEmbed2d, RelPosEmbed2d

POS_KINDS = ("none", "relative", "factorized")
"""Position logits of `Attention2d`: none; BoTNet's 2-D relative logits; factorized content-position logits."""


class Attention2d(Attention):
    """Self-attention on a feature map: (B, C, H, W) -> (B, C, H, W).

    With a position option the logits gain a term computed from the queries (see `vitkit.layers.rel_pos`):

    - ``pos="relative"``: softmax(q k^T * scale + R) v with R[i, j] = q_i . (height_rel[x_j - x_i]
      + width_rel[y_j - y_i]), the 2-D relative logits of BoTNet (arXiv:2101.11605): the term depends on the
      offset from query to key, so attention is translation-equivariant in its position part.
    - ``pos="factorized"``: softmax(q k^T * scale + q r^T) v with one learned embedding per key position,
      r_j = rel_h[x_j] + rel_w[y_j] (per head). Simpler, but it encodes where the key is, not where it is
      relative to the query.

    Both position terms are added unscaled, and both tie the layer to one feature-map size.

    Args:
        dim: channels C of the feature map; must be divisible by `num_heads`.
        num_heads: number of heads.
        qkv_bias, attn_drop, proj_drop, backend: as for `Attention`.
        pos: "none", "relative" or "factorized".
        feat_size: (H, W) the feature map must have (an int for a square map); required with a position
            option, whose tables are sized for it, and not accepted without one.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str = "auto",
        pos: str = "none",
        feat_size: int | tuple[int, int] | None = None,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, backend)
        if pos not in POS_KINDS:
            raise ValueError(f"pos must be one of {POS_KINDS}, got {pos!r}")
        if pos != "none" and feat_size is None:
            raise ValueError(f"pos={pos!r} needs feat_size, the (H, W) its position tables are sized for")
        if pos == "none" and feat_size is not None:
            raise ValueError(f"feat_size={feat_size!r} is only used with pos='relative' or 'factorized'")
        self.dim = dim
        self.pos = pos
        self.feat_size = to_2tuple(feat_size) if feat_size is not None else None
        self.pos_embed: nn.Module | None = None
        if pos == "relative":
            self.pos_embed = RelPosEmbed2d(feat_size, self.head_dim)
        elif pos == "factorized":
            self.pos_embed = FactorizedPosEmbed2d(feat_size, num_heads, self.head_dim)

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError unless x is a (B, dim, H, W) map of the size the position tables were built for."""
        name = type(self).__name__
        if x.ndim != 4:
            raise ValueError(f"{name} expects a feature map (B, C, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.dim:
            raise ValueError(
                f"{name} was built for {self.dim} channels, got {x.shape[1]} (input shape {tuple(x.shape)})"
            )
        if self.feat_size is not None and tuple(x.shape[-2:]) != self.feat_size:
            H, W = self.feat_size
            raise ValueError(
                f"{name}'s {self.pos} position tables are sized for a {H}x{W} feature map, "
                f"got {x.shape[-2]}x{x.shape[-1]}"
            )

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project the map x (B, C, H, W) to queries, keys and values, each (B, h, N, d)."""
        B, C, H, W = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, C, N) -> (B, N, C)
        qkv = self.qkv(tokens).reshape(B, H * W, 3, self.num_heads, self.head_dim)  # (B, N, 3, h, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (3, B, h, N, d) -> 3 x (B, h, N, d)
        return q, k, v

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attend over the map x (B, C, H, W); `bias` is added to the logits, broadcastable to (B, h, N, N)."""
        self.check_input(x)
        B, C, H, W = x.shape
        q, k, v = self.qkv_heads(x)  # each (B, h, N, d)
        if self.pos_embed is not None:
            pos_logits = self.pos_embed(q)  # (B, h, N, N)
            bias = pos_logits if bias is None else bias + pos_logits
        out = self.attend(q, k, v, bias)  # (B, N, C)
        out = self.proj_drop(self.proj(out))  # (B, N, C)
        return out.transpose(1, 2).reshape(B, C, H, W)  # (B, C, N) -> (B, C, H, W)


