"""The pre-norm transformer encoder block: x + Attention(norm1(x)); x + Mlp(norm2(x)).

Letters: B batch, N tokens, C channels.
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.layers.attention import Attention
from vitkit.layers.drop import DropPath
from vitkit.layers.mlp import Mlp


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch (CaiT, arXiv:2103.17239), initialised to `init_values`."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm encoder block on tokens (B, N, C) -> (B, N, C).

    Args:
        dim: channels C.
        num_heads: attention heads.
        mlp_ratio: hidden width of the MLP as a multiple of C.
        qkv_bias: bias on the fused qkv projection.
        proj_drop: dropout after the attention projection and in the MLP.
        attn_drop: dropout on the attention weights.
        drop_path: stochastic-depth rate of both residual branches.
        init_values: LayerScale initial value, or None for no LayerScale.
        norm_eps: LayerNorm epsilon.
        attn_backend: "auto", "sdpa" or "math".
        act: the MLP's activation (`vitkit.layers.mlp.ACTIVATIONS`).
        head_dim: the attention's head width, when heads x head_dim differs from dim (see `Attention`).
        proj_bias: bias on the attention's output projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_eps: float = 1e-6,
        attn_backend: str = "auto",
        act: str = "gelu",
        head_dim: int | None = None,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim, num_heads, qkv_bias, attn_drop, proj_drop, attn_backend, head_dim=head_dim, proj_bias=proj_bias
        )
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, act=act)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

