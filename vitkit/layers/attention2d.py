"""Multi-head self-attention over a CNN feature map (B, C, H, W).

The map is flattened to H*W tokens of C channels, attended with the shared `Attention`, and folded back,
so it drops into any convolutional network where a 3x3 convolution or a non-local block would go.

Letters: B batch, C channels, H, W feature-map height and width, N = H * W tokens.
"""

from __future__ import annotations

import torch

from vitkit.layers.attention import Attention


class Attention2d(Attention):
    """Self-attention on a feature map: (B, C, H, W) -> (B, C, H, W).

    Args:
        dim: channels C of the feature map; must be divisible by `num_heads`.
        num_heads: number of heads.
        qkv_bias, attn_drop, proj_drop, backend: as for `Attention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str = "sdpa",
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, backend)
        self.dim = dim

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.ndim != 4:
            raise ValueError(f"Attention2d expects a feature map (B, C, H, W), got shape {tuple(x.shape)}")
        B, C, H, W = x.shape
        if C != self.dim:
            raise ValueError(f"Attention2d was built for {self.dim} channels, got {C} (input shape {tuple(x.shape)})")
        tokens = x.flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, C, N) -> (B, N, C)
        tokens = super().forward(tokens, bias)  # (B, N, C)
        return tokens.transpose(1, 2).reshape(B, C, H, W)  # (B, C, N) -> (B, C, H, W)
