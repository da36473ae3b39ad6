"""The pre-norm transformer encoder block: x + Attention(norm1(x)); x + Mlp(norm2(x)).

The attention is over all tokens, or, as in ViTDet's windowed blocks (arXiv:2203.16527), within windows of the
patch grid, optionally with decomposed relative positions (`vitkit.layers.rel_pos.DecomposedRelPos`).

Letters: B batch, N tokens (P prefix tokens, then an H x W grid of patches), C channels, nW windows per image,
M window side.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers.attention import Attention
from vitkit.layers.drop import DropPath
from vitkit.layers.mlp import Mlp
from vitkit.layers.rel_pos import DecomposedRelPos
from vitkit.layers.window import padded_size, window_partition, window_reverse


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
        window_size: M > 0: attend within M x M windows of the patch grid (ViTDet), the grid zero-padded at the
            bottom and right to whole windows after `norm1` (padding tokens are keys, unmasked, as in ViTDet); the
            prefix tokens join every window and leave as the mean of their copies. 0: attend over all tokens.
        rel_pos_size: (H, W) of decomposed relative position tables (a window's, or the grid's at the model's
            image size); None: none. Prefix tokens get no position term.

    A block with windows or relative positions needs the patch grid: `forward(x, grid, prefix)`.
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
        window_size: int = 0,
        rel_pos_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim, num_heads, qkv_bias, attn_drop, proj_drop, attn_backend, head_dim=head_dim, proj_bias=proj_bias
        )
        self.window_size = window_size
        self.rel_pos = DecomposedRelPos(rel_pos_size, self.attn.head_dim) if rel_pos_size is not None else None
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, act=act)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    @property
    def needs_grid(self) -> bool:
        """Whether forward needs the patch grid: windows or relative positions."""
        return self.window_size > 0 or self.rel_pos is not None

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None, prefix: int = 0) -> torch.Tensor:
        """Tokens x (B, N, C) -> (B, N, C); `grid` (H, W) and `prefix` P say how the N = P + H * W tokens lie, needed
        by a block with windows or relative positions (`needs_grid`)."""
        if self.needs_grid:  # (no name holds norm1's output: it is freed once the attention has projected it)
            x = x + self.drop_path1(self.ls1(self._attention(self.norm1(x), grid, prefix)))
        else:
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def _attention(self, x: torch.Tensor, grid: tuple[int, int] | None, prefix: int) -> torch.Tensor:
        """Attention over the normalised tokens x (B, P + H * W, C), in windows and / or with relative positions."""
        B, N, C = x.shape
        if grid is None or N != prefix + grid[0] * grid[1]:
            raise ValueError(
                f"a block with windows or relative positions needs the patch grid of its {N} tokens after {prefix} "
                f"prefix token(s), got grid {grid}"
            )
        if not self.window_size:
            return self.attn(x, pos=self._position_term(grid, prefix))
        H, W = grid
        M = (self.window_size, self.window_size)
        Hp, Wp = padded_size(grid, M)
        head, patches = x[:, :prefix], x[:, prefix:].reshape(B, H, W, C)
        patches = F.pad(patches, (0, 0, 0, Wp - W, 0, Hp - H))  # zero rows below, columns right: (B, Hp, Wp, C)
        windows = window_partition(patches, M).reshape(-1, M[0] * M[1], C)  # (B * nW, M * M, C)
        nW = windows.shape[0] // B
        if prefix:
            # (expand, not repeat_interleave(nW, dim=0): the ONNX exporter tiles a symbolic repeat count on the
            # wrong axis, so the copies come out B, not B * nW, once the image size is dynamic)
            copies = head[:, None].expand(B, nW, prefix, C).reshape(B * nW, prefix, C)  # (B * nW, P, C)
            windows = torch.cat([copies, windows], dim=1)  # (B * nW, P + M * M, C)
        windows = self.attn(windows, pos=self._position_term(M, prefix))
        patches = window_reverse(windows[:, prefix:].reshape(-1, *M, C), M, Hp, Wp)[:, :H, :W]  # (B, H, W, C)
        head = windows[:, :prefix].reshape(B, nW, prefix, C).mean(dim=1)  # (B, P, C): the mean of the copies
        return torch.cat([head, patches.reshape(B, H * W, C)], dim=1)

    def _position_term(
        self, grid: tuple[int, int], prefix: int
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The relative position logits as `Attention`'s `pos`: queries (B, h, P + n, d) -> (B, h, P + n, P + n),
        zero in the prefix tokens' rows and columns; None without relative positions."""
        rel_pos = self.rel_pos
        if rel_pos is None:
            return None

        def term(q: torch.Tensor) -> torch.Tensor:
            logits = rel_pos(q[:, :, prefix:], grid)  # (B, h, n, n)
            return F.pad(logits, (prefix, 0, prefix, 0)) if prefix else logits

        return term

