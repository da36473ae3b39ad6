"""Multi-scale deformable sampling, the computation behind `vitkit.layers.MultiScaleDeformableAttention`: each query's
and head's values bilinearly sampled at K points on each of L levels (zeros outside the maps) and summed with the
points' attention weights (the paper's equation 3, "Deformable DETR", arXiv:2010.04159). Three paths, picked by
`vitkit.kernels.policy.deformable_path`:

- `reference_deformable_attention`: the equation as the paper's code writes it, one `grid_sample` per level, then the
  weighted sum over levels and points: the `math` backend and the reference the other paths are tested against;
- `gathered_deformable_attention`: the same values from one `embedding_bag` over all levels: the four pixels around
  every point found by index arithmetic on the flattened values (each level bordered by one pixel of zeros), their
  bilinear weights times the attention weights weighting the bag's sum. No per-level samples nor their stack;
  its backward (torch's embedding-bag gradients) is slow;
- `levelwise_deformable_attention`: the reference's `grid_sample` per level, a few rows of (batch, head) at a time,
  each chunk's samples summed into the output in place while in cache, with a backward written out
  (`_LevelwiseSampling`: the samples taken again) that keeps no samples.

`sample` runs one and states its rows for `vitkit.cost.tracer` (`sample_rows`).

Letters used in shape comments: B batch, Q queries, N value tokens (all levels, concatenated; level l row-major over
its H_l x W_l pixels), h heads, d head dim, L levels, K points per head and level, Np the value tokens of the levels
with their zero border (sum of (H_l + 2) (W_l + 2)), n = B * Q * h (the bags of the gather).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.cost import costed
from vitkit.cost.rows import (
    CostContext,
    OpCost,
    Ops,
    Value,
    copy_op,
    elementwise_op,
    holding,
    new_value,
    numel,
    view,
)

BILINEAR_FLOPS = 8
"""FLOPs of bilinear sampling per sampled channel: 4 multiply-adds, one per pixel around the point. All paths count
them: `grid_sample`'s outputs, and the gather's 4 (weighted) rows per point and channel."""

SpatialShapes = Tensor | Sequence[Sequence[int]]  # (L, 2) integer tensor, or L pairs, of (H_l, W_l)


def level_shapes(spatial_shapes: SpatialShapes) -> tuple[tuple[int, int], ...]:
    """The levels' (H_l, W_l) as ints, from an (L, 2) integer tensor or a sequence of pairs. Symbolic sizes (under
    `torch.export`) stay symbolic, so that an exported graph keeps the image size dynamic."""
    if isinstance(spatial_shapes, Tensor):
        if spatial_shapes.ndim != 2 or spatial_shapes.shape[1] != 2 or spatial_shapes.is_floating_point():
            raise ValueError(
                f"spatial_shapes must be an (L, 2) integer tensor of (H, W), got {spatial_shapes.dtype} "
                f"of shape {tuple(spatial_shapes.shape)}"
            )
        spatial_shapes = spatial_shapes.tolist()
    shapes = tuple(tuple(s if isinstance(s, torch.SymInt) else int(s) for s in hw) for hw in spatial_shapes)
    if not shapes or any(len(hw) != 2 or min(hw) < 1 for hw in shapes):
        raise ValueError(f"spatial_shapes must be L >= 1 pairs (H, W) of positive sizes, got {shapes}")
    return shapes  # type: ignore[return-value]


# --- the three paths ---------------------------------------------------------------------------------------------


def reference_deformable_attention(
    value_heads: Tensor, spatial_shapes: SpatialShapes, locations: Tensor, weights: Tensor
) -> Tensor:
    """sum over levels l and points k of weights[l, k] * bilinear(value_l, location[l, k]), per query and head, as the
    paper's code writes it: the `math` backend and the reference.

    Args:
        value_heads: (B, N, h, d) the projected values, level l's tokens row-major over its H_l x W_l pixels.
        spatial_shapes: the levels' (H_l, W_l).
        locations: (B, Q, h, L, K, 2) sampling points, normalised (x, y) in [0, 1] over each map (outside: zeros).
        weights: (B, Q, h, L, K) attention weights.

    Returns:
        (B, Q, h * d), in the values' dtype. Sampling (`grid_sample`, bilinear, zero padding, align_corners=False)
        runs in at least float32, as `torch.autocast` runs it: in bfloat16 torch's CPU kernel computes the pixel
        coordinates in bfloat16 (a step of one pixel beyond 128) and, given a map that is not contiguous, reads
        outside it.
    """
    shapes = level_shapes(spatial_shapes)
    B, N, h, d = value_heads.shape
    _, Q, _, L, K, _ = locations.shape
    dtype = torch.promote_types(value_heads.dtype, torch.float32)  # what grid_sample runs in
    grids = 2 * locations.to(dtype) - 1  # (B, Q, h, L, K, 2) in grid_sample's [-1, 1]
    levels = value_heads.split([H * W for H, W in shapes], dim=1)  # L x (B, H_l W_l, h, d)
    sampled = [
        _sample_level(value_l, hw, grids[:, :, :, level])  # (B h, d, Q, K)
        for level, (value_l, hw) in enumerate(zip(levels, shapes, strict=True))
    ]
    sampled = torch.stack(sampled, dim=-2).flatten(-2)  # L x (B h, d, Q, K) -> (B h, d, Q, L, K) -> (B h, d, Q, L K)
    weights = weights.transpose(1, 2).reshape(B * h, 1, Q, L * K)  # (B, h, Q, L, K) -> (B h, 1, Q, L K)
    out = (sampled * weights).sum(-1).view(B, h * d, Q)  # (B h, d, Q) -> (B, h d, Q)
    return out.transpose(1, 2).contiguous().to(value_heads.dtype)  # (B, Q, h d)


def _sample_level(value_l: Tensor, shape: tuple[int, int], grid: Tensor) -> Tensor:
    """One level's values (B, H W, h, d) sampled at its points `grid` (B, Q, h, K, 2) in [-1, 1], in the grid's dtype
    -> (B h, d, Q, K)."""
    (B, _, h, d), (H, W), (_, Q, _, K, _) = value_l.shape, shape, grid.shape
    value_l = value_l.permute(0, 2, 3, 1).reshape(B * h, d, H, W).to(grid.dtype)  # (B, h, d, H W) -> (B h, d, H, W)
    grid = grid.transpose(1, 2).reshape(B * h, Q, K, 2)  # (B, h, Q, K, 2) -> (B h, Q, K, 2)
    return F.grid_sample(value_l, grid, mode="bilinear", padding_mode="zeros", align_corners=False)  # (B h, d, Q, K)


def levelwise_deformable_attention(
    value_heads: Tensor, spatial_shapes: SpatialShapes, locations: Tensor, weights: Tensor
) -> Tensor:
    """`reference_deformable_attention`'s values, each level's samples summed into the output as soon as they are
    taken, a few rows of (batch, head) at a time, with a backward written out (`_LevelwiseSampling`): the training
    path of the `auto` backend.

    The points and weights are laid out level by level with the queries last ((L, B h, K, Q, 2) and (L, B h, K, Q)),
    so that `grid_sample` writes a chunk's samples as (rows, d, K, Q) and the weighted sum over a level's K points is
    K in-place multiply-adds over contiguous rows: no stack of the levels, no product of samples and weights, and no
    samples kept for backward (it takes them again, chunk by chunk). Sampling runs in at least float32, as in the
    reference.

    Args and result as `reference_deformable_attention`.
    """
    shapes = level_shapes(spatial_shapes)
    B, N, h, d = value_heads.shape
    _, Q, _, L, K, _ = locations.shape
    dtype = torch.promote_types(value_heads.dtype, torch.float32)  # what grid_sample runs in
    # (B, Q, h, L, K, 2) -> (L, B, h, K, Q, 2): always a new tensor, so that the arithmetic in place leaves the
    # caller's locations alone
    grids = locations.permute(3, 0, 2, 4, 1, 5).to(dtype, memory_format=torch.contiguous_format, copy=True)
    grids = grids.mul_(2).sub_(1).view(L, B * h, K, Q, 2)  # in grid_sample's [-1, 1]
    weights = weights.to(dtype).permute(3, 0, 2, 4, 1).contiguous().view(L, B * h, K, Q)  # (B, Q, h, L, K) ->
    rows = chunk_rows(B * h, d * K * Q * dtype.itemsize, value_heads.device)
    out = _LevelwiseSampling.apply(value_heads, grids, weights, shapes, rows)  # (B h, d, Q)
    return out.view(B, h * d, Q).transpose(1, 2).contiguous().to(value_heads.dtype)  # (B, Q, h d)


CHUNK_BYTES = 4 * 2**20
"""Bytes of samples per thread that `levelwise_deformable_attention` takes at once on CPU."""


def chunk_rows(rows: int, row_bytes: int, device: torch.device) -> int:
    """Rows of (batch, head), of `row_bytes` of samples each, that `levelwise_deformable_attention` samples at once:
    on CPU `CHUNK_BYTES` a thread (at least a row; torch's `grid_sample` kernel shares out its batch rows), so that
    a chunk's samples stay in cache for the weighted sum, and few chunks where the rows are small (the decoder's 300
    queries); on other devices all of them."""
    if device.type != "cpu":
        return rows
    return min(rows, max(1, torch.get_num_threads()) * max(1, CHUNK_BYTES // row_bytes))


def in_cache(samples: Tensor) -> bool:
    """Whether a chunk's `samples` are few enough (on CPU, at most `CHUNK_BYTES` a thread: the chunks
    `chunk_rows` makes unless one row is larger) that two passes over them cost less than the 2 d operators of a
    channel at a time: 48 against 154 us for (16, 16, 4, 420), 195 against 367 for (2, 32, 4, 5440), 2.4 against
    2.1 ms for (2, 32, 4, 21760), 22 MB (BENCHMARKS.md's machine G). Off the CPU, always."""
    if samples.device.type != "cpu":
        return True
    return samples.numel() * samples.element_size() <= max(1, torch.get_num_threads()) * CHUNK_BYTES


class _LevelwiseSampling(torch.autograd.Function):
    """sum over levels l and points k of weights[l, :, k] * grid_sample(value_l, grids[l, :, k]) -> (B h, d, Q),
    `rows` rows of B h at a time.

    Forward keeps each level's map (B h, d, H, W), not its samples. Backward takes, per level and chunk of rows, the
    samples again for the weights' gradient (the sum over d of samples times the output's gradient: one product and
    one sum where the chunk is in cache, else accumulated a channel at a time), and the samples' gradient (the
    output's times each point's weight) through `grid_sampler_2d_backward` to the map and the points.
    """

    @staticmethod
    def forward(
        ctx, value_heads: Tensor, grids: Tensor, weights: Tensor, shapes: tuple[tuple[int, int], ...], rows: int
    ) -> Tensor:
        B, _, h, d = value_heads.shape
        _, Bh, K, Q, _ = grids.shape
        out = grids.new_empty(Bh, d, Q)
        maps = []
        for level, value_l in enumerate(value_heads.split([H * W for H, W in shapes], dim=1)):
            H, W = shapes[level]
            map_l = grids.new_empty(B, h, d, H * W).copy_(value_l.permute(0, 2, 3, 1))  # (B, h, d, H W) in float
            maps.append(map_l.view(Bh, d, H, W))
            for first in range(0, Bh, rows):
                chunk = slice(first, first + rows)
                sampled = torch.grid_sampler_2d(maps[-1][chunk], grids[level, chunk], 0, 0, False)  # (rows, d, K, Q)
                into, chunk_weights = out[chunk], weights[level, chunk, None]  # (rows, d, Q), (rows, 1, K, Q)
                for k in range(K):  # (rows, d, Q) += (rows, d, Q) * (rows, 1, Q); bilinear, zeros outside
                    if level == 0 and k == 0:
                        torch.mul(sampled[:, :, 0], chunk_weights[:, :, 0], out=into)
                    else:
                        into.addcmul_(sampled[:, :, k], chunk_weights[:, :, k])
                del sampled
        ctx.save_for_backward(grids, weights, *maps)
        ctx.shapes, ctx.rows, ctx.value_shape, ctx.value_dtype = shapes, rows, value_heads.shape, value_heads.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None]:
        grids, weights, *maps = ctx.saved_tensors
        B, N, h, d = ctx.value_shape
        _, Bh, K, Q, _ = grids.shape
        need_value, need_grids, need_weights = ctx.needs_input_grad[:3]
        grad = grad.contiguous()[:, :, None]  # (B h, d, 1, Q)
        grad_value = grad.new_empty(B, N, h, d, dtype=ctx.value_dtype) if need_value else None
        grad_grids = torch.empty_like(grids) if need_grids else None
        grad_weights = torch.empty_like(weights) if need_weights else None
        # one buffer for every chunk's samples' gradient: a fresh one each time costs more in page faults than the
        # multiply that fills it
        grad_sampled = grad.new_empty(min(ctx.rows, Bh), d, K, Q) if need_value or need_grids else None
        start = 0
        for level, (H, W) in enumerate(ctx.shapes):
            grad_map = grad.new_empty(Bh, d, H, W) if need_value else None
            for first in range(0, Bh, ctx.rows):
                chunk = slice(first, first + ctx.rows)
                map_l, grid, chunk_grad = maps[level][chunk], grids[level, chunk], grad[chunk]
                if need_weights:  # sum over d of (rows, d, K, Q) * (rows, d, 1, Q)
                    sampled = torch.grid_sampler_2d(map_l, grid, 0, 0, False)
                    into = grad_weights[level, chunk]  # (rows, K, Q)
                    if in_cache(sampled):  # one product in place and one sum: two operators, not 2 d
                        torch.sum(sampled.mul_(chunk_grad), 1, out=into)
                    else:  # a channel at a time: one pass over the samples, the (rows, K, Q) sum in cache
                        torch.mul(sampled[:, 0], chunk_grad[:, 0], out=into)
                        for c in range(1, d):
                            into.addcmul_(sampled[:, c], chunk_grad[:, c])
                    del sampled
                if grad_sampled is not None:
                    chunk_sampled = grad_sampled[: map_l.shape[0]]  # (rows, d, 1, Q) * (rows, 1, K, Q)
                    torch.mul(chunk_grad, weights[level, chunk, None], out=chunk_sampled)
                    mask = [need_value, need_grids]
                    chunk_map, chunk_grid = torch.ops.aten.grid_sampler_2d_backward(
                        chunk_sampled, map_l, grid, 0, 0, False, mask
                    )
                    if need_value:
                        grad_map[chunk] = chunk_map
                    if need_grids:
                        grad_grids[level, chunk] = chunk_grid
                    del chunk_map, chunk_grid
            if need_value:  # (B h, d, H, W) -> (B, H W, h, d)
                grad_value[:, start : start + H * W].copy_(grad_map.view(B, h, d, H * W).permute(0, 3, 1, 2))
            start += H * W
        return grad_value, grad_grids, grad_weights, None, None


def pad_levels(value_heads: Tensor, spatial_shapes: SpatialShapes) -> Tensor:
    """(B, N, h, d) -> (B, Np, h, d): each level's H_l x W_l map inside a border of one pixel of zeros, row-major over
    its (H_l + 2) x (W_l + 2) pixels, the levels one after the other."""
    shapes = level_shapes(spatial_shapes)
    B, _, h, d = value_heads.shape
    sizes = [(H + 2) * (W + 2) for H, W in shapes]
    table = value_heads.new_empty(B, sum(sizes), h, d)
    levels = value_heads.split([H * W for H, W in shapes], dim=1)  # L x (B, H_l W_l, h, d)
    start = 0
    for value_l, size, (H, W) in zip(levels, sizes, shapes, strict=True):
        padded_l = table[:, start : start + size].view(B, H + 2, W + 2, h, d)  # a view of the table
        padded_l[:, 1:-1, 1:-1] = value_l.view(B, H, W, h, d)
        for border in (padded_l[:, 0], padded_l[:, -1], padded_l[:, 1:-1, 0], padded_l[:, 1:-1, -1]):
            border.zero_()  # top and bottom rows, left and right columns
        start += size
    return table


@dataclass(frozen=True)
class _PaddedLevels:
    """Per-level constants of the gather, each laid out over (L, K, ...) so that it broadcasts over the outer dims
    (B, Q, h) of the points only: a broadcast inside the last dims runs an order of magnitude slower on CPU."""

    size: Tensor  # (L, K, 2): (W_l, H_l)
    upper: Tensor  # (L, K, 2): (W_l + 1, H_l + 1), the last pixel of the padded map
    step: Tensor  # (L, K, 2) int: rows of the table one pixel right, one pixel down (h, (W_l + 2) h)
    corners: Tensor  # (L, K, 4) int: rows of the four pixels from the top-left one: 0, h, (W_l + 2) h, (W_l + 3) h
    first: Tensor  # (B, 1, h, L, K) int: the table row of batch b, head j, level l's top-left padded pixel

    @classmethod
    def build(
        cls, shapes: tuple[tuple[int, int], ...], B: int, h: int, K: int, dtype: torch.dtype, device: torch.device
    ) -> _PaddedLevels:
        sizes = [(H + 2) * (W + 2) for H, W in shapes]
        Np, L = sum(sizes), len(shapes)
        index = torch.int32 if B * Np * h < 2**31 else torch.int64

        def per_level(rows: list[list[int]], dtype: torch.dtype) -> Tensor:  # (L, C) -> (L, K, C)
            return torch.tensor([[row] * K for row in rows], dtype=dtype, device=device)

        starts = [sum(sizes[:level]) for level in range(L)]
        first = [[[[(b * Np + s) * h + j] * K for s in starts] for j in range(h)] for b in range(B)]  # (B, h, L, K)
        return cls(
            size=per_level([[W, H] for H, W in shapes], dtype),
            upper=per_level([[W + 1, H + 1] for H, W in shapes], dtype),
            step=per_level([[h, (W + 2) * h] for H, W in shapes], index),
            corners=per_level([[0, h, (W + 2) * h, (W + 3) * h] for H, W in shapes], index),
            first=torch.tensor(first, dtype=index, device=device)[:, None],  # (B, 1, h, L, K)
        )


def gathered_deformable_attention(
    value_heads: Tensor, spatial_shapes: SpatialShapes, locations: Tensor, weights: Tensor
) -> Tensor:
    """`reference_deformable_attention`'s values from one `embedding_bag` over all levels.

    The values, each level inside a border of one pixel of zeros, are a table of B * Np * h rows of d channels. Each
    point's padded pixel coordinates (location * size + 0.5, clamped to the border) give the row of the pixel at its
    top-left and the fractions (fx, fy) towards the next; its four pixels' rows follow by adding constants, and their
    weights are the bilinear (1 - fx or fx) x (1 - fy or fy) times the point's attention weight. The bag of each query
    and head sums its L x K x 4 weighted rows. A point outside the map lands on the zero border, as `grid_sample`'s
    zero padding reads it. Coordinates are computed in at least float32. Without autograd the arithmetic is done in
    place; its gradients are exact but slower to compute than `grid_sample`'s (module docstring).

    Args and result as `reference_deformable_attention`.
    """
    shapes = level_shapes(spatial_shapes)
    B, N, h, d = value_heads.shape
    _, Q, _, L, K, _ = locations.shape
    dtype = torch.promote_types(locations.dtype, torch.float32)
    levels = _PaddedLevels.build(shapes, B, h, K, dtype, locations.device)
    grad = torch.is_grad_enabled() and (locations.requires_grad or weights.requires_grad)
    table = pad_levels(value_heads, shapes)  # (B, Np, h, d)
    corner, frac = _padded_pixels(locations.to(dtype), levels, grad)  # (B, Q, h, L, K, 2) each
    rows = _corner_rows(corner, levels)  # (B, Q, h, L, K, 4)
    del corner
    mix = _corner_weights(frac, weights.to(dtype)).to(table.dtype)  # (B, Q, h, L, K, 4)
    del frac
    n = B * Q * h
    bag = table.dtype
    if grad and table.is_cuda and bag == torch.bfloat16:  # torch's CUDA gradient of the bag's weights has no bf16
        bag = torch.float32
    out = F.embedding_bag(
        rows.view(n, L * K * 4), table.view(-1, d).to(bag), mode="sum", per_sample_weights=mix.view(n, -1).to(bag)
    )
    return out.view(B, Q, h * d).to(table.dtype)  # (n, d) -> (B, Q, h d)


def _padded_pixels(locations: Tensor, levels: _PaddedLevels, grad: bool) -> tuple[Tensor, Tensor]:
    """(the top-left pixel of each point in padded pixel coordinates, clamped so that its four pixels lie in the padded
    map; the point's fractions towards the next pixel right and down), each (B, Q, h, L, K, 2)."""
    half = torch.tensor(0.5, dtype=locations.dtype, device=locations.device)
    zero = torch.zeros((), dtype=locations.dtype, device=locations.device)
    pixel = torch.addcmul(half, locations, levels.size)  # location * size - 0.5, + 1 for the border
    # outside (0, size + 1) a point reads only the zero border: clamped, it still does; with grad, out of place
    pixel = pixel.clamp(zero, levels.upper) if grad else pixel.clamp_(zero, levels.upper)
    corner = pixel.detach().floor().clamp_(max=levels.size)  # at size + 1 exactly: the last pixel, fraction 1
    return corner, pixel - corner


def _corner_rows(corner: Tensor, levels: _PaddedLevels) -> Tensor:
    """Table rows (B, Q, h, L, K, 4) of the four pixels around each point from its top-left pixel (B, Q, h, L, K, 2):
    top-left, top-right, bottom-left, bottom-right."""
    rows = corner.to(levels.step.dtype).mul_(levels.step).sum(-1, dtype=levels.step.dtype)  # (B, Q, h, L, K)
    rows += levels.first  # batch, level and head
    return rows[..., None] + levels.corners  # (B, Q, h, L, K, 1) + (L, K, 4) -> (B, Q, h, L, K, 4)


def _corner_weights(frac: Tensor, weights: Tensor) -> Tensor:
    """Weights (B, Q, h, L, K, 4) of the four pixels (`_corner_rows`' order): bilinear in the fractions (B, Q, h, L,
    K, 2), times the point's attention weight (B, Q, h, L, K)."""
    both = torch.stack([1 - frac, frac], -1)  # (B, Q, h, L, K, 2 (x, y), 2 (this pixel, the next))
    down = both[..., 1, :] * weights[..., None]  # (B, Q, h, L, K, 2): (1 - fy, fy) * weight
    return (down[..., :, None] * both[..., 0, None, :]).flatten(-2)  # (B, Q, h, L, K, 2, 2) -> (B, Q, h, L, K, 4)


PATHS = {
    "gather": gathered_deformable_attention,
    "levelwise": levelwise_deformable_attention,
    "reference": reference_deformable_attention,
}


def _in(ctx: CostContext, dtype: torch.dtype) -> CostContext:
    """`ctx` with values of `dtype`: the float32 coordinates and samples of a bfloat16 pass, integer indices."""
    return dataclasses.replace(ctx, dtype=dtype)


def cost_reference(
    name: str,
    heads: Value,
    locations: Value,
    weights: Value,
    shapes: tuple[tuple[int, int], ...],
    ctx: CostContext,
) -> list[OpCost]:
    """The operators of `reference_deformable_attention` on values (B, N, h, d), locations (B, Q, h, L, K, 2) and
    weights (B, Q, h, L, K), in `ctx`'s dtype, sampling in at least float32."""
    B, N, h, d = heads.shape
    _, Q, _, L, K, _ = locations.shape
    sample = _in(ctx, torch.promote_types(ctx.dtype, torch.float32))
    cast = sample.dtype != ctx.dtype
    ops = Ops(locations)  # in at least float32 already (`MultiScaleDeformableAttention.sampling_locations`)
    ops(elementwise_op(name, "2*locations", ops.out, 1, sample))  # one multiply per coordinate
    grids = ops(elementwise_op(name, "-1", ops.out, 1, sample))  # one subtraction per coordinate
    samples = []
    for level, (H, W) in enumerate(shapes):  # `_sample_level`
        value_l = ops(copy_op(name, f"value{level}", heads, (B * h, d, H, W), ctx, copies=B > 1))  # (B h, d, H, W)
        if cast:  # `.to` keeps a view's strides: a full copy
            value_l = ops(copy_op(name, f"value{level}_float", value_l, value_l.shape, sample))
        grid = ops(copy_op(name, f"grid{level}", grids, (B * h, Q, K, 2), sample, copies=B > 1 and Q > 1))
        out = new_value((B * h, d, Q, K), sample)  # 4 multiply-adds per sampled channel
        flops = BILINEAR_FLOPS * numel(out.shape)
        samples.append(ops(OpCost(name, f"grid_sample{level}", (value_l, grid), out, 0, flops, (value_l, grid))))
    stacked = ops(OpCost(name, "stack", tuple(samples), new_value((B * h, d, Q, L * K), sample), 0, 0))
    weights_heads = ops(copy_op(name, "weights_heads", weights, (B * h, 1, Q, L * K), ctx, copies=B > 1 and Q > 1))
    product = (B * h, d, Q, L * K)  # one multiply per sampled channel
    op = OpCost(name, "weighted", (stacked, weights_heads), new_value(product, sample), 0, numel(product))
    ops(dataclasses.replace(op, saved=(stacked, weights_heads)))
    ops(OpCost(name, "sum", (ops.out,), new_value((B * h, d, Q), sample), 0, numel(product)))  # one add each
    # the transposed (B, Q, h d) made contiguous, while the function still holds the grids, stack and weights
    held = (grids, stacked, weights_heads)
    ops(holding(copy_op(name, "merge_heads", ops.out, (B, Q, h * d), sample, copies=Q > 1), *held))
    if cast:
        ops(holding(copy_op(name, "to_dtype", ops.out, (B, Q, h * d), ctx), *held))
    return ops


def cost_levelwise(
    name: str,
    heads: Value,
    locations: Value,
    weights: Value,
    shapes: tuple[tuple[int, int], ...],
    ctx: CostContext,
) -> list[OpCost]:
    """The operators of `levelwise_deformable_attention` on values (B, N, h, d), locations (B, Q, h, L, K, 2) and
    weights (B, Q, h, L, K), in `ctx`'s dtype, sampling in at least float32. The weighted sum is one multiply for
    the first point and a multiply-add for each other, per sampled channel."""
    B, N, h, d = heads.shape
    _, Q, _, L, K, _ = locations.shape
    sample = _in(ctx, torch.promote_types(ctx.dtype, torch.float32))
    ops = Ops(locations)  # in at least float32 already (`MultiScaleDeformableAttention.sampling_locations`)
    grids = ops(copy_op(name, "grids", locations, (L, B * h, K, Q, 2), sample))  # the levels' layout
    ops(elementwise_op(name, "2*locations", grids, 1, sample, in_place=True))  # one multiply per coordinate
    ops(elementwise_op(name, "-1", grids, 1, sample, in_place=True))  # one subtraction per coordinate
    levels = ops(copy_op(name, "weights_levels", weights, (L, B * h, K, Q), sample))
    # `_LevelwiseSampling`: the output, then per level its map and the chunks' samples and weighted sums (counted as
    # one operator each, over a chunk's samples); the maps live to its end (without autograd) or its backward's end
    rows, size = chunk_rows(B * h, d * K * Q * sample.itemsize, ctx.device), (B * h, d, Q)
    out = ops(OpCost(name, "output", (levels,), new_value(size, sample), 0, 0))
    first = len(ops) - 1
    maps = []
    for level, (H, W) in enumerate(shapes):
        maps.append(ops(copy_op(name, f"value{level}", heads, (B * h, d, H, W), sample)))  # in float
        sampled = new_value((rows, d, K, Q), sample)  # a chunk's; 4 multiply-adds per sampled channel
        flops = BILINEAR_FLOPS * numel((B * h, d, K, Q))
        ops(OpCost(name, f"grid_sample{level}", (maps[-1], grids), sampled, 0, flops))
        multiplies = (2 * K - 1 if level == 0 else 2 * K) * numel(size)  # a multiply, then multiply-adds
        ops(OpCost(name, f"weighted{level}", (out, sampled, levels), view(out, size), 0, multiplies))
    # one backward for the function, at its last operator: the output's gradient, the inputs' gradients, the buffer
    # of a chunk's samples' gradient, a level's map gradient, and either a chunk's samples taken again or the map's
    # and points' gradients of a chunk
    chunk, largest = sampled.nbytes, max(m.nbytes for m in maps)
    transient = max(chunk, largest * rows // (B * h) + chunk // d * 2 // K)
    whole = out.nbytes + heads.nbytes + grids.nbytes + levels.nbytes + chunk + largest + transient
    for i in range(first, len(ops)):
        ops[i] = dataclasses.replace(ops[i], backward_bytes=whole if i == len(ops) - 1 else 0)
    ops[-1] = holding(ops[-1], *maps)
    # the function's saved tensors, all freed when its backward ends: on its first operator
    ops[first] = dataclasses.replace(ops[first], saved=(grids, levels, *maps))
    # the transposed (B, Q, h d) made contiguous, while the caller still holds the grids and weights
    ops(holding(copy_op(name, "merge_heads", out, (B, Q, h * d), sample, copies=Q > 1), grids, levels))
    if sample.dtype != ctx.dtype:
        ops(holding(copy_op(name, "to_dtype", ops.out, (B, Q, h * d), ctx), grids, levels))
    return ops


def cost_gather(
    name: str,
    heads: Value,
    locations: Value,
    weights: Value,
    shapes: tuple[tuple[int, int], ...],
    ctx: CostContext,
    grad: bool = False,
) -> list[OpCost]:
    """The operators of `gathered_deformable_attention` on values (B, N, h, d), locations (B, Q, h, L, K, 2) and
    weights (B, Q, h, L, K), with autograd (`grad`: the clamp of the pixel coordinates out of place) or without. The
    index and weight arithmetic counts one FLOP per element and operation, integer or not; the bag 4 multiply-adds
    per sampled channel."""
    B, N, h, d = heads.shape
    _, Q, _, L, K, _ = locations.shape
    Np = sum((H + 2) * (W + 2) for H, W in shapes)
    coord = _in(ctx, torch.promote_types(ctx.dtype, torch.float32))
    index = _in(ctx, torch.int32 if B * Np * h < 2**31 else torch.int64)
    points, corners, n = (B, Q, h, L, K), (B, Q, h, L, K, 4), B * Q * h
    xy = locations.shape
    ops = Ops(heads)
    # `_PaddedLevels`: the per-level constants, made from the shapes and held to the end of the function
    constants = {"size": (coord, 2), "upper": (coord, 2), "step": (index, 2), "corners": (index, 4)}
    size, upper, step, corner_steps = (
        ops(OpCost(name, f"level_{label}", (heads,), new_value((L, K, c), kind), 0, 0))
        for label, (kind, c) in constants.items()
    )
    first = ops(OpCost(name, "level_first", (heads,), new_value((B, 1, h, L, K), index), 0, 0))
    held = (size, upper, step, corner_steps, first)
    table = ops(copy_op(name, "pad_levels", heads, (B, Np, h, d), ctx))  # zeros, then each level's map copied in
    # `_padded_pixels`: clamped to [zero, upper] (with autograd out of place: it keeps both bounds)
    loc = locations  # in at least float32 already (`MultiScaleDeformableAttention.sampling_locations`)
    half = ops(OpCost(name, "half", (loc,), new_value((), coord), 0, 0))  # 0-d: the offset of the border, 0.5
    zero = ops(OpCost(name, "zero", (loc,), new_value((), coord), 0, 0))  # 0-d: the lower bound
    pixel = OpCost(name, "pixels", (loc, size, half), new_value(xy, coord), 0, 2 * numel(xy), (size,))
    pixel = ops(pixel)  # addcmul: 2 each; its backward needs the sizes
    bounds = (pixel, zero, upper)
    clamp = elementwise_op(name, "clamp", bounds, 2, coord, in_place=not grad, saves=bounds if grad else ())
    pixel = ops(clamp)  # 2 comparisons each
    corner = ops(elementwise_op(name, "floor", pixel, 1, coord))
    ops(elementwise_op(name, "clamp_corner", corner, 1, coord, in_place=True))  # to the upper bound
    frac = ops(holding(elementwise_op(name, "fraction", (pixel, corner), 1, coord), loc))  # pixel - corner
    # `_corner_rows`, while the caller holds `corner`
    ops(copy_op(name, "corner_index", corner, xy, index))  # the integer corner
    ops(elementwise_op(name, "index_step", ops.out, 1, index, in_place=True))  # times the rows per pixel, per level
    summed = ops(OpCost(name, "index_sum", (ops.out,), new_value(points, index), 0, numel(xy)))  # x + y: 1 each
    ops(elementwise_op(name, "index_first", summed, 1, index, in_place=True))  # + the level's first row
    rows = ops(holding(OpCost(name, "corner_rows", (summed,), new_value(corners, index), 0, numel(corners)), corner))
    # `_corner_weights`, while the caller holds `frac`
    w = ops(copy_op(name, "weights_float", weights, points, coord)) if coord.dtype != ctx.dtype else weights
    one_minus = ops(elementwise_op(name, "1-fraction", frac, 1, coord))
    both = ops(OpCost(name, "stack", (one_minus, frac), new_value((*xy, 2), coord), 0, 0))
    down = OpCost(name, "weight_y", (both, w), new_value((*points, 2), coord), 0, 2 * numel(points), (both, w))
    down = ops(down)  # (1 - fy, fy) * weight
    mix = OpCost(name, "corner_weights", (down, both), new_value(corners, coord), 0, numel(corners), (down, both))
    mix = ops(holding(mix, frac, w))
    if coord.dtype != ctx.dtype:
        mix = ops(copy_op(name, "corner_weights_cast", mix, corners, ctx))
    # embedding_bag: the offsets of its bags (made by F.embedding_bag), and its own bag sizes and maximum indices
    books = ops(OpCost(name, "bag_offsets", (rows,), new_value((3, n), index), 0, 0))
    bag = OpCost(name, "embedding_bag", (table, rows, mix), new_value((n, d), ctx), 0, 2 * numel(corners) * d)
    bag = dataclasses.replace(bag, output=view(bag.output, (B, Q, h * d)), saved=(table, rows, mix, books))  # (n, d)
    return [*ops, holding(bag, books, *held)]


def sample_rows(
    name: str,
    ctx: CostContext,
    value_heads: Value,
    spatial_shapes: SpatialShapes,
    locations: Value,
    weights: Value,
    *,
    path: str,
    training: bool = False,
) -> list[OpCost]:
    """The rows of `sample` on `path` (a layer in training mode is costed with its backward)."""
    shapes = level_shapes(spatial_shapes)
    if path == "gather":
        return cost_gather(name, value_heads, locations, weights, shapes, ctx, grad=training)
    paths = {"levelwise": cost_levelwise, "reference": cost_reference}
    return paths[path](name, value_heads, locations, weights, shapes, ctx)


@costed(sample_rows)
def sample(
    value_heads: Tensor,
    spatial_shapes: SpatialShapes,
    locations: Tensor,
    weights: Tensor,
    *,
    path: str,
    training: bool = False,
) -> Tensor:
    """The deformable attention of values (B, N, h, d) at locations (B, Q, h, L, K, 2) with weights (B, Q, h, L, K)
    -> (B, Q, h * d), on `path` (`vitkit.kernels.policy.DEFORMABLE_PATHS`); `training` says only how to cost it."""
    return PATHS[path](value_heads, spatial_shapes, locations, weights)
