"""Position embeddings: resampling a learned absolute table to another grid, and fixed 2-D sin-cos tables.

Letters: P prefix tokens (class, distillation), D embedding dim, (H, W) the token grid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resample_abs_pos_embed(
    pos_embed: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resample a learned position table (1, P + H*W, D) to the grid `new_size`, keeping the P prefix rows.

    Bicubic with antialiasing, in float32, as timm's `resample_abs_pos_embed`, so weights trained at one
    resolution give timm's outputs at another. `old_size` defaults to a square grid.
    """
    num_pos = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = int(round(num_pos**0.5))
        if side * side != num_pos:
            raise ValueError(f"cannot infer a square grid from {num_pos} position embeddings; pass old_size")
        old_size = (side, side)
    if old_size[0] * old_size[1] != num_pos:
        raise ValueError(f"position table has {num_pos} grid entries, which is not a {old_size[0]}x{old_size[1]} grid")
    if tuple(new_size) == tuple(old_size):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    D = grid.shape[-1]
    grid = grid.float().reshape(1, old_size[0], old_size[1], D).permute(0, 3, 1, 2)  # (1, D, H, W)
    grid = F.interpolate(grid, size=tuple(new_size), mode=interpolation, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, D).to(pos_embed.dtype)  # (1, H'*W', D)
    return torch.cat([prefix, grid], dim=1)


def sincos_2d_pos_embed(
    embed_dim: int, grid_size: tuple[int, int], temperature: float = 10000.0, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """Fixed 2-D sin-cos position table (1, P + H*W, D) as in MAE and big_vision.

    The first half of the channels encodes the row, the second half the column; each half is
    [sin(pos * w_k), cos(pos * w_k)] with w_k = temperature^(-k / (D/4)), k < D/4. Prefix rows are zero.
    """
    if embed_dim % 4 != 0:
        raise ValueError(f"sin-cos position embedding needs embed_dim divisible by 4, got {embed_dim}")
    H, W = grid_size
    quarter = embed_dim // 4
    omega = temperature ** -(torch.arange(quarter, dtype=torch.float64) / quarter)  # (D/4,)
    rows, cols = torch.meshgrid(
        torch.arange(H, dtype=torch.float64), torch.arange(W, dtype=torch.float64), indexing="ij"
    )
    out_h = rows.reshape(-1, 1) * omega  # (H*W, D/4)
    out_w = cols.reshape(-1, 1) * omega  # (H*W, D/4)
    table = torch.cat([out_h.sin(), out_h.cos(), out_w.sin(), out_w.cos()], dim=1)  # (H*W, D)
    table = torch.cat([torch.zeros(num_prefix_tokens, embed_dim, dtype=torch.float64), table], dim=0)
    return table.float().unsqueeze(0)
