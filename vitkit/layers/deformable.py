"""Multi-scale deformable attention, from "Deformable DETR: Deformable Transformers for End-to-End Object Detection"
(Zhu et al., arXiv:2010.04159): the one deformable attention in vitkit, beside the dense `vitkit.layers.Attention`.

Each query attends, per head, to K points on each of L feature maps: the points lie at offsets predicted from the
query around the query's reference point, and their K x L weights (a softmax over levels and points) are predicted
from the query too. The values (all levels' tokens, projected once) are sampled bilinearly at the points and summed
with the weights (`vitkit.kernels.deformable`, on the path `vitkit.kernels.policy.deformable_path` picks); an output
projection mixes the heads (the paper's equation 3).

Letters used in shape comments: B batch, Q queries, N value tokens (all levels, concatenated; level l row-major over
its H_l x W_l pixels), D channels (= h * d), h heads, d head dim, L levels, K points per head and level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitkit.kernels.deformable import SpatialShapes, level_shapes, sample
from vitkit.kernels.policy import DEFORMABLE_BACKENDS, check_backend, deformable_path

# --- the record of `capture_attention` ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SampledAttention:
    """Where each query of a deformable attention layer looked and how much: what `capture_attention` records for it.

    Attributes:
        locations: (B, Q, h, L, K, 2) the sampling points, normalised (x, y): (0, 0) the top-left corner of a level's
            map, (1, 1) its bottom-right corner.
        weights: (B, Q, h, L, K) their attention weights; each query's and head's sum to one over levels and points.
        spatial_shapes: the levels' (H_l, W_l).
    """

    locations: Tensor
    weights: Tensor
    spatial_shapes: tuple[tuple[int, int], ...]

    def detach(self) -> SampledAttention:
        return SampledAttention(self.locations.detach(), self.weights.detach(), self.spatial_shapes)

    def dense_maps(self) -> list[Tensor]:
        """One dense attention map per level, (B, h, Q, H_l * W_l) (row-major pixels), in at least float32.

        Each weight is spread bilinearly over the four pixels around its point, as sampling reads them; a pixel
        outside the map gives its share to the nearest pixel on the map's border, so every weight is drawn and a
        query's maps sum to one over all levels. (The values sampled there were zero: near a border the maps show
        where the query looked more than what it read.) Each map takes B * h * Q * H_l * W_l elements: for an encoder,
        where every token is a query, select queries first.
        """
        B, Q, h, L, K, _ = self.locations.shape
        dtype = torch.promote_types(self.weights.dtype, torch.float32)
        maps = []
        for level, (H, W) in enumerate(self.spatial_shapes):
            loc = self.locations[:, :, :, level].to(dtype)  # (B, Q, h, K, 2)
            pixel = loc * torch.tensor([W, H], dtype=dtype, device=loc.device) - 0.5  # pixel centres at integers
            corner = pixel.floor()
            fx, fy = (pixel - corner).unbind(-1)  # (B, Q, h, K) each
            x0, y0 = corner.long().unbind(-1)
            xs = torch.stack([x0, x0 + 1, x0, x0 + 1], -1).clamp(0, W - 1)  # (B, Q, h, K, 4)
            ys = torch.stack([y0, y0, y0 + 1, y0 + 1], -1).clamp(0, H - 1)
            share = torch.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], -1)  # (B, Q, h, K, 4)
            share = share * self.weights[:, :, :, level, :, None].to(dtype)
            index = (ys * W + xs).permute(0, 2, 1, 3, 4).reshape(B, h, Q, K * 4)  # (B, h, Q, K, 4) -> (B, h, Q, 4K)
            share = share.permute(0, 2, 1, 3, 4).reshape(B, h, Q, K * 4)
            maps.append(share.new_zeros(B, h, Q, H * W).scatter_add_(-1, index, share))  # (B, h, Q, H W)
        return maps


# --- the layer ---------------------------------------------------------------------------------------------------

DeformableHook = Callable[[SampledAttention], None]  # what `capture_attention` installs on a deformable layer


class MultiScaleDeformableAttention(nn.Module):
    """Multi-scale deformable attention: queries (B, Q, D) attend to K points per head on each of L value maps.

    Parameter names and layout are the paper's code's and transformers' (`sampling_offsets`, `attention_weights`,
    `value_proj`, `output_proj`), so their state dicts load unchanged.

    Args:
        dim: channels D of queries, values and output; must be divisible by `num_heads`.
        num_heads: heads h; head dim d = D // h.
        num_levels: feature levels L the values come from.
        num_points: sampling points K per head and level.
        backend: one of `vitkit.kernels.policy.DEFORMABLE_BACKENDS`: "auto" (the gather for inference, the levelwise
            path in training), "gather", "levelwise" or "math" (the reference). All give the same values.
    """

    def __init__(
        self, dim: int, num_heads: int = 8, num_levels: int = 4, num_points: int = 4, backend: str = "auto"
    ) -> None:
        super().__init__()
        sizes = {"dim": dim, "num_heads": num_heads, "num_levels": num_levels, "num_points": num_points}
        for label, n in sizes.items():
            if n < 1:
                raise ValueError(f"{label} must be >= 1, got {n}")
        if dim % num_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.num_levels, self.num_points = dim, num_heads, num_levels, num_points
        self.head_dim = dim // num_heads
        self.backend = check_backend(backend, DEFORMABLE_BACKENDS)
        # Set by `capture_attention` while it is active; called with a `SampledAttention` of each forward.
        self.capture_hook: DeformableHook | None = None

        self.sampling_offsets = nn.Linear(dim, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(dim, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(dim, dim)
        self.output_proj = nn.Linear(dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's initialisation: offsets from the query start at zero, with biases that place head j's points
        k = 1..K at k pixels in direction 2 pi j / h (scaled so that the larger coordinate is k); attention weights
        start uniform (zero weight and bias); the value and output projections are Xavier-uniform with zero bias."""
        h, L, K = self.num_heads, self.num_levels, self.num_points
        theta = torch.arange(h, dtype=torch.float32) * (2 * math.pi / h)
        direction = torch.stack([theta.cos(), theta.sin()], -1)  # (h, 2)
        direction = direction / direction.abs().max(-1, keepdim=True).values  # on the square of side 2
        steps = torch.arange(1, K + 1, dtype=torch.float32)[:, None]  # (K, 1): point k at k pixels
        grid = direction[:, None, None, :] * steps  # (h, 1, 1, 2) * (K, 1) -> (h, 1, K, 2)
        with torch.no_grad():
            nn.init.zeros_(self.sampling_offsets.weight)
            self.sampling_offsets.bias.copy_(grid.expand(h, L, K, 2).reshape(-1))  # (h, L, K, 2) flattened
            nn.init.zeros_(self.attention_weights.weight)
            nn.init.zeros_(self.attention_weights.bias)
            for proj in (self.value_proj, self.output_proj):
                nn.init.xavier_uniform_(proj.weight)
                nn.init.zeros_(proj.bias)

    def forward(
        self,
        query: Tensor,
        reference_points: Tensor,
        value: Tensor,
        spatial_shapes: SpatialShapes,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Attend from `query` (B, Q, D) to `value` (B, N, D) around `reference_points` -> (B, Q, D).

        Args:
            query: (B, Q, D) the queries (with their position embedding added, as the paper's layers do).
            reference_points: (B, Q, L, 2) a point per query and level, normalised (x, y) in [0, 1] over the level's
                map; or (B, Q, L, 4) a box (cx, cy, w, h), around whose centre the offsets are scaled by half the
                box's size over K.
            value: (B, N, D) the levels' tokens concatenated, level l row-major over its H_l x W_l pixels.
            spatial_shapes: (L, 2) integer tensor, or L pairs, of (H_l, W_l); pairs of ints avoid reading a tensor
                (a device synchronisation) and keep the shapes symbolic under tracing.
            padding_mask: (B, N) bool, True where a value token is padding (its projected value is zeroed), or None.
        """
        shapes = self.check_inputs(query, reference_points, value, shapes=spatial_shapes, padding_mask=padding_mask)
        B, Q, _ = query.shape
        N = value.shape[1]
        h, L, K = self.num_heads, self.num_levels, self.num_points
        value = self.value_proj(value)  # (B, N, D)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)  # (B, N, D)
        value = value.view(B, N, h, self.head_dim)  # (B, N, h, d)
        weights = self.attention_weights(query).view(B, Q, h, L * K).softmax(-1).view(B, Q, h, L, K)
        locations = self.sampling_locations(query, reference_points, shapes)  # (B, Q, h, L, K, 2)
        if self.capture_hook is not None:
            self.capture_hook(SampledAttention(locations, weights, shapes))
        out = sample(value, shapes, locations, weights, path=self.path(self.training), training=self.training)
        return self.output_proj(out)

    def sampling_locations(self, query: Tensor, reference_points: Tensor, spatial_shapes: SpatialShapes) -> Tensor:
        """The sampling points (B, Q, h, L, K, 2), normalised (x, y): the reference point plus the offsets predicted
        from the query, in pixels of each level (reference points (B, Q, L, 2)) or in units of half the reference
        box's size over K (boxes (B, Q, L, 4)), as the paper. Computed in at least float32 (in bfloat16 a level
        wider than 128 pixels could not place a point within a pixel)."""
        shapes = level_shapes(spatial_shapes)
        B, Q, _ = query.shape
        h, L, K = self.num_heads, self.num_levels, self.num_points
        dtype = torch.promote_types(query.dtype, torch.float32)  # coordinates: a bfloat16 step is a pixel past 128
        offsets = self.sampling_offsets(query).view(B, Q, h, L, K, 2).to(dtype)  # (B, Q, h L K 2) -> (.., K, 2)
        centre = reference_points[:, :, None, :, None, :2].to(dtype).expand(B, Q, 1, L, K, 2).contiguous()
        if reference_points.shape[-1] == 2:  # offsets in pixels of each level: divided by (W_l, H_l)

            def size(n: int) -> Tensor:  # a 0-d tensor; from a symbolic size, under export, a symbolic one
                return torch.scalar_tensor(n, dtype=dtype, device=offsets.device)

            sizes = torch.stack([torch.stack([size(W), size(H)]) for H, W in shapes])  # (L, 2): (W_l, H_l)
            scale = (1 / sizes)[:, None].expand(L, K, 2).contiguous()  # (L, K, 2)
        else:  # offsets in units of half the box over K
            scale = reference_points[:, :, None, :, None, 2:].to(dtype) * (0.5 / K)  # (B, Q, 1, L, 1, 2)
        return torch.addcmul(centre, offsets, scale)  # (B, Q, h, L, K, 2)

    def path(self, training: bool) -> str:
        """Which of `vitkit.kernels.policy.DEFORMABLE_PATHS` samples a call in training mode (`training`) or not."""
        return deformable_path(self.backend, training)

    def check_inputs(
        self,
        query: Tensor,
        reference_points: Tensor,
        value: Tensor,
        *,
        shapes: SpatialShapes,
        padding_mask: Tensor | None = None,
    ) -> tuple[tuple[int, int], ...]:
        """ValueError unless the inputs agree with each other and with the layer; returns the levels' (H_l, W_l)."""
        D, L = self.dim, self.num_levels
        for label, t in (("query", query), ("value", value)):
            if t.ndim != 3 or t.shape[-1] != D:
                raise ValueError(f"deformable attention {label} must be (B, N, {D}), got shape {tuple(t.shape)}")
        B, Q, _ = query.shape
        if value.shape[0] != B:
            raise ValueError(
                f"deformable attention query {tuple(query.shape)} and value {tuple(value.shape)} must share the batch"
            )
        if reference_points.shape not in ((B, Q, L, 2), (B, Q, L, 4)):
            raise ValueError(
                f"reference_points must be ({B}, {Q}, {L}, 2) points or ({B}, {Q}, {L}, 4) boxes for query "
                f"{tuple(query.shape)} and {L} levels, got shape {tuple(reference_points.shape)}"
            )
        levels = level_shapes(shapes)
        if len(levels) != L:
            raise ValueError(f"spatial_shapes must give the layer's {L} levels, got {len(levels)}: {levels}")
        tokens = sum(H * W for H, W in levels)
        if value.shape[1] != tokens:
            raise ValueError(
                f"value has {value.shape[1]} tokens, but spatial_shapes {levels} have sum(H * W) = {tokens}"
            )
        if padding_mask is not None and (padding_mask.shape != value.shape[:2] or padding_mask.dtype != torch.bool):
            raise ValueError(
                f"padding_mask must be a bool tensor of shape {tuple(value.shape[:2])} (True: padding), got "
                f"{padding_mask.dtype} of shape {tuple(padding_mask.shape)}"
            )
        return levels
