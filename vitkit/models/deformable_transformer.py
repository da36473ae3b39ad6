"""Deformable DETR's transformer: the post-norm encoder and decoder layers whose attention over the image is
multi-scale deformable attention, and the reference points, boxes and proposal encodings they read.

"Deformable DETR: Deformable Transformers for End-to-End Object Detection", Zhu et al., arXiv:2010.04159. The layers
share DETR's post-norm shape (`vitkit.models.transformer`), but every call differs: reference points, levels and
padding masks instead of attention masks, the level positions only on the queries.

Letters: B batch, L levels, (H_l, W_l) level l's map, N = sum H_l W_l tokens, D width, Q queries, L_d decoder layers,
F = D / 2 position features per axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.layers import Attention, Mlp, MultiScaleDeformableAttention
from vitkit.layers.pos_embed import POS_SCALE, POS_TEMPERATURE
from vitkit.models.detr import BoxMLP

INVERSE_SIGMOID_EPS = 1e-5  # keeps the logarithm of `inverse_sigmoid` finite at 0 and 1


def inverse_sigmoid(x: Tensor, eps: float = INVERSE_SIGMOID_EPS) -> Tensor:
    """log(x / (1 - x)) of x clamped to [0, 1], each side kept >= `eps` (the paper's `inverse_sigmoid`)."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def box_from_reference(delta: Tensor, reference_logit: Tensor) -> Tensor:
    """A box head's output (..., 4) around a reference's inverse sigmoid -> the box (cx, cy, w, h) in [0, 1]: the
    delta added to a reference box (..., 4), or to the centre of a reference point (..., 2) (the size alone)."""
    if reference_logit.shape[-1] == 4:
        return (delta + reference_logit).sigmoid()
    return torch.cat([delta[..., :2] + reference_logit, delta[..., 2:]], -1).sigmoid()


def level_references(reference: Tensor, valid_ratios: Tensor | None, num_levels: int) -> Tensor:
    """Reference points (B, Q, 2) or boxes (B, Q, 4), relative to each image's real part, -> (B, Q, L, 2 | 4)
    relative to each level's padded map: scaled by the levels' valid ratios (B, L, 2) (w, h), or as they are
    without padding (None)."""
    if valid_ratios is None:
        return reference[:, :, None].expand(-1, -1, num_levels, -1)  # (B, Q, 1, 2|4) -> (B, Q, L, 2|4)
    scale = valid_ratios if reference.shape[-1] == 2 else torch.cat([valid_ratios, valid_ratios], -1)  # (B, L, 2|4)
    return reference[:, :, None] * scale[:, None]  # (B, Q, 1, 2|4) * (B, 1, L, 2|4)


def valid_ratios(masks: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """Each level's real share of its padded map (B, L, 2), (width, height): the real columns of the first row and
    the real rows of the first column, over the map's size. masks: L x (B, H_l, W_l), True where real."""
    ratios = []
    for mask in masks:
        _, H, W = mask.shape
        height = mask[:, :, 0].sum(1).to(dtype) / H  # (B,)
        width = mask[:, 0, :].sum(1).to(dtype) / W
        ratios.append(torch.stack([width, height], -1))  # (B, 2)
    return torch.stack(ratios, 1)  # (B, L, 2)


def encoder_reference_points(
    shapes: Sequence[tuple[int, int]], ratios: Tensor | None, batch: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """Every token's own centre as its reference point on every level: (B, N, L, 2), (x, y) relative to each level's
    padded map. A token's centre is taken relative to its image's real part on its own level (ratios (B, L, 2), None
    without padding), then scaled to each level by that level's valid ratio."""
    points = []
    for level, (H, W) in enumerate(shapes):
        # (H,) and (W,) the row and column centres in pixels; arange keeps a symbolic size symbolic under export
        y = torch.arange(H, dtype=dtype, device=device) + 0.5
        x = torch.arange(W, dtype=dtype, device=device) + 0.5
        if ratios is None:
            y, x = (y / H)[None], (x / W)[None]  # (1, H), (1, W)
        else:
            y = y[None] / (ratios[:, level, 1:] * H)  # (B, H): over the real height
            x = x[None] / (ratios[:, level, :1] * W)  # (B, W)
        grid = torch.stack([x[:, None, :].expand(-1, H, W), y[:, :, None].expand(-1, H, W)], -1)  # (., H, W, 2)
        points.append(grid.flatten(1, 2))  # (., H W, 2), row-major
    reference = torch.cat(points, 1)  # (1 | B, N, 2)
    if ratios is None:
        return reference[:, :, None].expand(batch, -1, len(shapes), -1)  # (B, N, L, 2)
    return reference[:, :, None] * ratios[:, None]  # (B, N, 1, 2) * (B, 1, L, 2) -> (B, N, L, 2)


def proposal_encoding(boxes: Tensor, num_features: int) -> Tensor:
    """The sine encoding of boxes (B, Q, 4) in [0, 1] -> (B, Q, 4F): for each of cx, cy, w, h (in that order) F
    features sin(2 pi v / t_0), cos(2 pi v / t_0), sin(2 pi v / t_1), ... with DETR's wavelengths.

    Computed in float32 whatever the boxes' dtype, as transformers does (the paper's code computes everything of the
    two-stage queries in float32), and returned in the boxes' dtype.
    """
    i = torch.arange(num_features, dtype=torch.float32, device=boxes.device)
    wavelengths = POS_TEMPERATURE ** (2 * torch.div(i, 2, rounding_mode="floor") / num_features)  # (F,)
    pos = boxes.to(torch.float32) * POS_SCALE  # (B, Q, 4)
    pos = pos[..., None] / wavelengths  # (B, Q, 4, F)
    pos = torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), dim=4).flatten(2)  # (B, Q, 4, F/2, 2) -> (B, Q, 4F)
    return pos.to(boxes.dtype)


class BoxDelta(BoxMLP):
    """DETR's box head without its sigmoid: Linear -> ReLU -> Linear -> ReLU -> Linear, (..., D) -> (..., 4), the
    change to a reference box's inverse sigmoid (`box_from_reference`)."""

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


class DeformableEncoderLayer(nn.Module):
    """Post-norm encoder layer on the tokens x (B, N, D) of all levels:
    x = norm1(x + msda(q = x + pos, around each token's centre, v = x)); x = norm2(x + ffn(x)).

    Args:
        dim: width D.
        num_heads: attention heads.
        num_levels: feature levels L.
        num_points: sampling points per head and level.
        dim_feedforward: hidden width of the ReLU feed-forward block.
        drop: dropout after the attention and in the feed-forward block.
        deformable_backend: the deformable attention's backend.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_levels: int,
        num_points: int,
        dim_feedforward: int,
        drop: float,
        deformable_backend: str,
    ) -> None:
        super().__init__()
        self.self_attn = MultiScaleDeformableAttention(dim, num_heads, num_levels, num_points, deformable_backend)
        self.self_attn_drop = nn.Dropout(drop)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim_feedforward, drop=drop, act="relu")
        self.norm2 = nn.LayerNorm(dim)

    def forward(
        self,
        x: Tensor,
        pos: Tensor,
        reference_points: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        padding_mask: Tensor | None,
    ) -> Tensor:
        """x, pos (B, N, D); reference_points (B, N, L, 2); padding_mask (B, N) True at padding, or None."""
        attended = self.self_attn(x + pos, reference_points, x, spatial_shapes, padding_mask)  # positions: queries only
        x = self.norm1(x + self.self_attn_drop(attended))
        return self.norm2(x + self.mlp(x))


class DeformableDecoderLayer(nn.Module):
    """Post-norm decoder layer on the query slots tgt (B, Q, D):
    tgt = norm1(tgt + self_attn(q = k = tgt + query_pos, v = tgt));
    tgt = norm2(tgt + msda(q = tgt + query_pos, around the references, v = memory));
    tgt = norm3(tgt + ffn(tgt)).

    Args as `DeformableEncoderLayer`, and `attn_drop`: dropout on the self-attention's weights, `backend`: its
    backend.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_levels: int,
        num_points: int,
        dim_feedforward: int,
        drop: float,
        attn_drop: float,
        backend: str,
        deformable_backend: str,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = MultiScaleDeformableAttention(dim, num_heads, num_levels, num_points, deformable_backend)
        self.cross_attn_drop = nn.Dropout(drop)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim_feedforward, drop=drop, act="relu")
        self.norm3 = nn.LayerNorm(dim)

    def forward(
        self,
        tgt: Tensor,
        query_pos: Tensor,
        reference_points: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        padding_mask: Tensor | None,
        allowed: Tensor | None = None,
    ) -> Tensor:
        """tgt, query_pos (B, Q, D); reference_points (B, Q, L, 2 | 4); memory (B, N, D); padding_mask (B, N) True
        at padding, or None; allowed (Q, Q) True where query i may attend to query j in the self-attention, or None
        (all)."""
        tgt = self.norm1(tgt + self.self_attn(tgt + query_pos, allowed, value=tgt))
        attended = self.cross_attn(tgt + query_pos, reference_points, memory, spatial_shapes, padding_mask)
        tgt = self.norm2(tgt + self.cross_attn_drop(attended))
        return self.norm3(tgt + self.mlp(tgt))


class DeformableEncoder(nn.Module):
    """`DeformableEncoderLayer` x depth over the tokens of all levels (B, N, D); no final norm."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DeformableEncoderLayer(**layer) for _ in range(depth)])

    def forward(
        self,
        x: Tensor,
        pos: Tensor,
        reference_points: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        padding_mask: Tensor | None,
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, pos, reference_points, spatial_shapes, padding_mask)
        return x  # (B, N, D)


class DeformableDecoder(nn.Module):
    """`DeformableDecoderLayer` x depth from the query slots (B, Q, D); no final norm: each layer's output is read
    as it is, and fed to the next."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DeformableDecoderLayer(**layer) for _ in range(depth)])

    def forward(
        self,
        tgt: Tensor,
        query_pos: Tensor,
        reference: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        padding_mask: Tensor | None = None,
        valid_ratios: Tensor | None = None,
        box_heads: Sequence[nn.Module] | None = None,
        allowed: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Query slots tgt and their positions query_pos (B, Q, D), reference points (B, Q, 2) or boxes (B, Q, 4) in
        [0, 1] of each image's real part, memory (B, N, D) -> (the states of every layer (L_d, B, Q, D), the boxes
        of every layer (L_d, B, Q, 4) with `box_heads`, else None).

        With `box_heads` (iterative box refinement), layer l's head turns its output into a box around its reference
        (`box_from_reference`), and that box, without gradient, is the next layer's reference. `allowed` (Q, Q)
        limits which queries each one's self-attention sees (denoising groups), as `DeformableDecoderLayer`.
        """
        num_levels = len(spatial_shapes)
        states, boxes = [], []
        for i, layer in enumerate(self.layers):
            points = level_references(reference, valid_ratios, num_levels)  # (B, Q, L, 2|4)
            tgt = layer(tgt, query_pos, points, memory, spatial_shapes, padding_mask, allowed)
            states.append(tgt)
            if box_heads is not None:
                boxes.append(box_from_reference(box_heads[i](tgt), inverse_sigmoid(reference)))  # (B, Q, 4)
                reference = boxes[-1].detach()
        return torch.stack(states), torch.stack(boxes) if boxes else None
