"""Position logits for self-attention over a 2-D feature map: a term q . r added to the logits q k^T * scale.

Two forms, both computed from the queries and passed to `Attention.attend` as its additive bias:

- `RelPosEmbed2d`, the 2-D relative position logits of "Bottleneck Transformers for Visual Recognition"
  (Srinivas et al., arXiv:2101.11605), from "Attention Augmented Convolutional Networks" (arXiv:1904.09925):
  query i at (row x, column y) and key j at (row x', column y') get
  ``q_i . height_rel[x' - x] + q_i . width_rel[y' - y]``: the term depends only on the offset from query to key,
  with one table per axis of 2H - 1 and 2W - 1 rows shared by all heads.
- `FactorizedPosEmbed2d`, the simpler content-position form: a learned embedding per key *position*,
  r_j = rel_h[x'] + rel_w[y'] (per head), and the term ``q_i . r_j``. It knows where the key is but not where
  it is relative to the query: the same key position scores the same for every query with the same content.

- `DecomposedRelPos`, the decomposed relative positions of MViTv2 (arXiv:2112.01526) as ViTDet
  (arXiv:2203.16527) and SAM use them: query i at (x, y) and key j at (x', y') get
  ``q_i . rel_pos_h[x - x'] + q_i . rel_pos_w[y - y']`` (one table per axis, per layer, shared by the heads),
  indexed by the offset from key to query; its tables are resampled (linearly) for a map of another size.

`RelPosEmbed2d`'s and `FactorizedPosEmbed2d`'s tables are sized for one feature map (H, W); a map of another size
is a ValueError.

Letters: B batch, h heads, d head dim, H, W feature-map height and width, N = H * W positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers.helpers import to_2tuple


def relative_index(size: int) -> torch.Tensor:
    """(size, size) table row of each offset: entry [i, j] = j - i + size - 1, in [0, 2 * size - 2]."""
    pos = torch.arange(size)
    return pos[None, :] - pos[:, None] + size - 1


def _check_tokens(q: torch.Tensor, feat_size: tuple[int, int], what: str) -> None:
    H, W = feat_size
    if q.ndim != 4 or q.shape[2] != H * W:
        raise ValueError(
            f"{what} expects queries (B, heads, {H * W}, head_dim) for a {H}x{W} feature map, got shape "
            f"{tuple(q.shape)}"
        )


class RelPosEmbed2d(nn.Module):
    """2-D relative position logits (BoTNet): (B, h, N, d) queries -> (B, h, N, N) logits.

    Parameter names and shapes follow timm's `PosEmbedRel` (``height_rel`` (2H - 1, d), ``width_rel``
    (2W - 1, d)), so timm BoTNet weights load unchanged. The logits are not multiplied by the attention
    scale (timm's default and the paper's pseudo-code: softmax(q k^T * scale + rel_logits)).

    Args:
        feat_size: (H, W) of the feature map attended over; an int for a square map.
        head_dim: query channels d per head.
    """

    def __init__(self, feat_size: int | tuple[int, int], head_dim: int) -> None:
        super().__init__()
        self.feat_size = to_2tuple(feat_size)
        H, W = self.feat_size
        self.head_dim = head_dim
        self.height_rel = nn.Parameter(torch.empty(2 * H - 1, head_dim))
        self.width_rel = nn.Parameter(torch.empty(2 * W - 1, head_dim))
        self.register_buffer("height_index", relative_index(H), persistent=False)
        self.register_buffer("width_index", relative_index(W), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated normal with std d^-0.5, as timm initialises the tables."""
        for table in (self.height_rel, self.width_rel):
            nn.init.trunc_normal_(table, std=self.head_dim**-0.5)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        _check_tokens(q, self.feat_size, type(self).__name__)
        B, nh, N, d = q.shape
        H, W = self.feat_size
        q = q.reshape(B, nh, H, W, d)  # (B, h, N, d) -> (B, h, H, W, d): query at row x, column y
        rel_h = self.height_rel[self.height_index]  # (H, H, d): [x, x'] -> height_rel[x' - x]
        rel_w = self.width_rel[self.width_index]  # (W, W, d): [y, y'] -> width_rel[y' - y]

        logits_h = torch.einsum("bnxyd,xkd->bnxyk", q, rel_h)  # (B, h, H, W, H): key row x'
        logits_w = torch.einsum("bnxyd,ykd->bnxyk", q, rel_w)  # (B, h, H, W, W): key column y'
        logits = logits_h[..., :, None] + logits_w[..., None, :]  # (B, h, H, W, H, W)
        return logits.reshape(B, nh, N, N)  # (B, h, N, N): query (x, y) row-major, key (x', y') row-major

    def extra_repr(self) -> str:
        return f"feat_size={self.feat_size}, head_dim={self.head_dim}"


class FactorizedPosEmbed2d(nn.Module):
    """Factorized content-position logits: (B, h, N, d) queries -> (B, h, N, N) logits ``q_i . r_j``.

    The key-position embedding r_j = rel_h[row of j] + rel_w[column of j] is learned per head:
    ``rel_h`` (h, d, H, 1) varies down the rows and ``rel_w`` (h, d, 1, W) along the columns. Unlike
    `RelPosEmbed2d` it encodes absolute key positions, not query-to-key offsets. The logits are not multiplied
    by the attention scale.

    Args:
        feat_size: (H, W) of the feature map attended over; an int for a square map.
        num_heads: heads h (each has its own embedding).
        head_dim: query channels d per head.
    """

    def __init__(self, feat_size: int | tuple[int, int], num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.feat_size = to_2tuple(feat_size)
        H, W = self.feat_size
        self.head_dim = head_dim
        self.rel_h = nn.Parameter(torch.empty(num_heads, head_dim, H, 1))
        self.rel_w = nn.Parameter(torch.empty(num_heads, head_dim, 1, W))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated normal with std d^-0.5, like the relative tables."""
        for table in (self.rel_h, self.rel_w):
            nn.init.trunc_normal_(table, std=self.head_dim**-0.5)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        _check_tokens(q, self.feat_size, type(self).__name__)
        r = (self.rel_h + self.rel_w).flatten(2)  # (h, d, H, W) -> (h, d, N): key positions row-major

        return q @ r  # (B, h, N, d) @ (h, d, N) -> (B, h, N, N)

    def extra_repr(self) -> str:
        return f"feat_size={self.feat_size}, num_heads={self.rel_h.shape[0]}, head_dim={self.head_dim}"


def resample_rel_table(table: torch.Tensor, length: int) -> torch.Tensor:
    """A relative position table (L, d) as one of `length` rows: itself, or linearly resampled (align_corners
    False), as ViTDet and transformers' `get_rel_pos` resample theirs."""
    if table.shape[0] == length:
        return table
    resized = F.interpolate(table.t()[None], size=length, mode="linear")  # (1, d, L) -> (1, d, length)
    return resized[0].t()  # (length, d)


class DecomposedRelPos(nn.Module):
    """Decomposed relative position logits (MViTv2, ViTDet): (B, h, N, d) queries over an (H, W) map -> (B, h, N, N).

    ``rel_pos_h`` (2H - 1, d) and ``rel_pos_w`` (2W - 1, d) hold one row per offset; query (x, y) and key (x', y')
    get ``q . rel_pos_h[x - x' + H - 1] + q . rel_pos_w[y - y' + W - 1]``, unscaled. For a map of another size the
    tables are resampled linearly to 2H' - 1 and 2W' - 1 rows first. Zero at initialisation (ViTDet's default).

    Args:
        size: (H, W) the tables are sized for (a window, or the patch grid at the model's image size).
        head_dim: query channels d per head.
    """

    def __init__(self, size: int | tuple[int, int], head_dim: int) -> None:
        super().__init__()
        self.size = to_2tuple(size)
        H, W = self.size
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * H - 1, head_dim))
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * W - 1, head_dim))

    @staticmethod
    def offsets(table: torch.Tensor, n: int) -> torch.Tensor:
        """(n, n, d): entry [x, x'] is the row of `table` (resampled to 2n - 1 rows) for the offset x - x'."""
        pos = torch.arange(n, device=table.device)
        return resample_rel_table(table, 2 * n - 1)[pos[:, None] - pos[None, :] + n - 1]

    def forward(self, q: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        _check_tokens(q, grid, type(self).__name__)
        B, nh, N, d = q.shape
        H, W = grid
        q = q.reshape(B, nh, H, W, d)  # query at row x, column y
        logits_h = torch.einsum("bnxyd,xkd->bnxyk", q, self.offsets(self.rel_pos_h, H))  # (B, h, H, W, H): key row
        logits_w = torch.einsum("bnxyd,ykd->bnxyk", q, self.offsets(self.rel_pos_w, W))  # (B, h, H, W, W): column
        logits = logits_h[..., :, None] + logits_w[..., None, :]  # (B, h, H, W, H, W)
        return logits.reshape(B, nh, N, N)  # query (x, y) row-major, key (x', y') row-major

    def extra_repr(self) -> str:
        return f"size={self.size}, head_dim={self.rel_pos_h.shape[1]}"
