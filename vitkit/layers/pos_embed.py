"""Position embeddings: resampling a learned absolute table to another grid, fixed 2-D sin-cos tables, and DETR's
sine encoding of the real pixels of a padded feature map (with the pixel mask resampled to the map).

Letters: P prefix tokens (class, distillation), D embedding dim, (H, W) the token grid; for DETR's encoding B batch,
(h, w) the feature map, N = h * w, F = D / 2 features per axis.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

POS_TEMPERATURE = 10000  # the sine encoding's wavelengths grow geometrically up to 2 pi * this
POS_SCALE = 2 * math.pi  # normalised positions run over (0, 2 pi]
POS_EPS = 1e-6  # keeps the normalisation finite in all-padding columns


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
    """vitkit's fixed 2-D sin-cos position table (1, P + H*W, D).

    The first half of the channels encodes the row, the second half the column; each half is
    [sin(pos * w_k), cos(pos * w_k)] with w_k = temperature^(-k / (D/4)), k < D/4. Prefix rows are zero.
    `big_vision_sincos_2d` is the table of big_vision and vit-pytorch's SimpleViT.
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


def big_vision_sincos_2d(
    embed_dim: int, grid_size: tuple[int, int], temperature: float = 10000.0, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """The fixed 2-D sin-cos table (1, P + H*W, D) of big_vision's `posemb_sincos_2d` ("Better plain ViT baselines
    for ImageNet-1k", Beyer et al., arXiv:2205.01580), which vit-pytorch's SimpleViT uses.

    Channels [sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k)] for column x and row y,
    w_k = temperature^(-k / (D/4 - 1)), k < D/4: the column first, the last frequency exactly 1 / temperature.
    Prefix rows are zero.
    """
    if embed_dim % 4 != 0 or embed_dim < 8:
        raise ValueError(
            f"big_vision's sin-cos position embedding needs embed_dim a multiple of 4, >= 8, got {embed_dim}"
        )
    H, W = grid_size
    quarter = embed_dim // 4
    omega = temperature ** -(torch.arange(quarter, dtype=torch.float64) / (quarter - 1))  # (D/4,)
    rows, cols = torch.meshgrid(
        torch.arange(H, dtype=torch.float64), torch.arange(W, dtype=torch.float64), indexing="ij"
    )
    x = cols.reshape(-1, 1) * omega  # (H*W, D/4)
    y = rows.reshape(-1, 1) * omega  # (H*W, D/4)
    table = torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # (H*W, D)
    table = torch.cat([torch.zeros(num_prefix_tokens, embed_dim, dtype=torch.float64), table], dim=0)
    return table.float().unsqueeze(0)


def nearest_indices(n_in: int, n_out: int, device: torch.device) -> torch.Tensor:
    """The input positions nearest-neighbour resampling reads for n_out outputs from n_in inputs: floor(i * n_in /
    n_out) with the ratio and the product rounded to float32, as `F.interpolate(mode="nearest")` computes them."""
    i = torch.arange(n_out, dtype=torch.float32, device=device)
    return (i * (n_in / n_out)).floor().long().clamp(max=n_in - 1)  # (n_out,)


def nearest_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A pixel mask (B, H, W) at the feature map's size (B, h, w), nearest-neighbour as DETR's
    `F.interpolate(mask[None].float(), size)`, written as index arithmetic: the same pixels in PyTorch and in an
    ONNX export (ONNX's Resize divides by h / H instead of multiplying by H / h, and at some sizes reads the row or
    column next to PyTorch's, moving the padding edge)."""
    _, H, W = mask.shape
    h, w = size
    rows = nearest_indices(H, h, mask.device)  # (h,)
    cols = nearest_indices(W, w, mask.device)  # (w,)
    return mask.index_select(1, rows).index_select(2, cols)  # (B, H, W) -> (B, h, W) -> (B, h, w)


class SinePositionEmbedding(nn.Module):
    """DETR's 2-D sine position encoding of the real pixels of a padded feature map (no parameters).

    A position's row y and column x count the real positions up to it (1-based), less `offset`, normalised by the
    image's real height and width to (0, 2 pi]; each gives F = D / 2 features sin(y / t_0), cos(y / t_0),
    sin(y / t_1), ... with wavelengths t_i = 10000^(2 floor(i / 2) / F); the y features come first.

    Args:
        num_features: F, the features per axis.
        offset: subtracted from the counts before normalising: 0 for DETR, 0.5 for Deformable DETR (the centres of
            the real positions, (y - 0.5) / height).
    """

    def __init__(self, num_features: int, offset: float = 0.0) -> None:
        super().__init__()
        self.num_features = num_features  # F
        self.offset = offset

    def forward(self, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """mask (B, h, w), True where the map is real -> encoding (B, h * w, 2F) computed in `dtype`: float32 as
        DETR's code, the images' dtype as transformers' Deformable DETR (float64 there in float64)."""
        y = mask.cumsum(1, dtype=dtype)  # (B, h, w): real rows up to here, 1-based
        x = mask.cumsum(2, dtype=dtype)  # (B, h, w): real columns up to here
        # each column's real height, each row's real width: the last row's and column's counts (taken with select,
        # not a slice, whose symbolic length torch.export cannot reconcile with some map sizes)
        height, width = y[:, -1].unsqueeze(1) + POS_EPS, x[:, :, -1].unsqueeze(2) + POS_EPS
        if self.offset:
            y, x = y - self.offset, x - self.offset
        y = y / height * POS_SCALE
        x = x / width * POS_SCALE
        i = torch.arange(self.num_features, device=mask.device).to(dtype)
        wavelengths = POS_TEMPERATURE ** (2 * torch.div(i, 2, rounding_mode="floor") / self.num_features)  # (F,)
        pos_y = y[..., None] / wavelengths  # (B, h, w, F), pairs of features share a wavelength
        pos_x = x[..., None] / wavelengths
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)  # (B, h, w, F/2, 2) ->
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)  # (B, h, w, F)
        return torch.cat((pos_y, pos_x), dim=3).flatten(1, 2)  # (B, h, w, 2F) -> (B, N, 2F)

