"""Where a detector looks for each object it finds: the object attention of each detection's query (the decoder's
cross-attention), as data and as a figure. A dense cross-attention (DETR) gives a map over the feature map (DETR's
figure 6); a multi-scale deformable one (Deformable DETR) the points each query sampled on every level, with their
weights (Deformable DETR's figure 5). What `capture_attention` records for the layer decides which.

Letters: Q object queries, h heads (or, of a map, its height and width h, w), L levels, K points per head and level,
n detections.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from PIL import Image

from vitkit.detection import Postprocessing
from vitkit.infer.detect import (
    Detection,
    add_masks,
    detector_inputs,
    detector_outputs,
    image_detections,
    reading,
)
from vitkit.layers import capture_attention
from vitkit.layers.deformable import SampledAttention
from vitkit.models.interface import VitkitDetector
from vitkit.models.registry import family_of
from vitkit.viz import object_attention_figure
from vitkit.viz.detection import sampled_attention_figure
from vitkit.weights import ModelInfo

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class _Captured:
    """One image's detections with what the chosen decoder layer's cross-attention recorded for their queries."""

    detections: list[Detection]  # most probable first
    queries: list[int]  # each detection's query, in the same order
    record: torch.Tensor | SampledAttention  # the layer's `capture_attention` record for the whole batch of one
    layers: int  # the decoder's object-attention layers
    padded: tuple[int, int]  # (H, W) of the padded input image
    real: tuple[int, int]  # (H, W) of the image's real (unpadded) part of the input


def _capture(
    model: VitkitDetector,
    info: ModelInfo,
    image: Image.Image,
    threshold: float,
    postprocessing: Postprocessing | None,
    layer: int,
) -> _Captured:
    names = model.object_attention_layers() if isinstance(model, VitkitDetector) else []
    if not names:
        raise ValueError(f"{type(model).__name__} has no cross-attention layers (a DETR detector has)")
    if not -len(names) <= layer < len(names):
        raise ValueError(f"layer {layer} is out of range for a decoder of {len(names)} layers")
    pixels, mask, sizes = detector_inputs(model, info, [image])
    with capture_attention(model, [names[layer]]) as maps:
        outputs = detector_outputs(model.eval(), pixels, mask)
    # each query its best class, so that each detection has its own query's attention; NMS as the model's settings say
    one_per_query = replace(reading(model, postprocessing), top_k=None)
    (result,) = one_per_query(outputs, sizes, threshold)
    order = result["scores"].argsort(descending=True, stable=True)  # as `image_detections` orders them
    real = (int(mask[0, :, 0].sum()), int(mask[0, 0, :].sum()))  # real rows of column 0, real columns of row 0
    if "pred_masks" in outputs:  # each object's mask, drawn beside where its query looked
        add_masks(result, outputs["pred_masks"][0], mask[0], tuple(sizes[0].tolist()))
    return _Captured(
        image_detections(result, info),
        result["queries"][order].tolist(),
        maps[names[layer]],
        len(names),
        (pixels.shape[-2], pixels.shape[-1]),
        real,
    )


def _check_head(head: int | None, heads: int) -> None:
    if head is not None and not -heads <= head < heads:
        raise ValueError(f"head {head} is out of range for {heads} heads")


def _dense_attention(model: VitkitDetector, captured: _Captured, head: int | None) -> torch.Tensor:
    """The dense record's maps (n, h, w) of the detections' queries over `model.feature_grid`."""
    attn = captured.record[0].float()  # (heads, Q, h * w)
    _check_head(head, attn.shape[0])
    attn = attn.mean(0) if head is None else attn[head]  # (Q, h * w)
    h, w = model.feature_grid(captured.padded)
    queries = captured.queries
    return attn[queries].reshape(len(queries), h, w) if queries else attn.new_zeros(0, h, w)  # (n, h, w)


@dataclass(frozen=True)
class SampledPoints:
    """Where each detection's query sampled in a deformable cross-attention layer, in pixels of the image given.

    Attributes:
        points: (n, h, L, K, 2) the sampling points (x, y) in continuous pixel coordinates of the image ((0, 0) its
            top-left corner, (width, height) its bottom-right corner); points on the padding lie beyond.
        weights: (n, h, L, K) their attention weights; each detection's and head's sum to one.
        spatial_shapes: the levels' (H_l, W_l) maps, for the padded input of `input_size`.
        input_size: (H, W) of the (padded) input image the model ran on.
    """

    points: torch.Tensor
    weights: torch.Tensor
    spatial_shapes: tuple[tuple[int, int], ...]
    input_size: tuple[int, int]


def sampled_points(
    record: SampledAttention,
    queries: list[int],
    padded: tuple[int, int],
    real: tuple[int, int],
    image_size: tuple[int, int],
) -> SampledPoints:
    """The `SampledAttention` of one image (batch of one) at `queries`, its locations in pixels of the image.

    A location (x, y) normalised over a level's padded map lies at (x W_pad, y H_pad) in the padded input (`padded`
    (H_pad, W_pad)); the image's real part is its top-left `real` (H, W) pixels, the image resized to it, so the
    point is at (x W_pad width / W, y H_pad height / H) in the image of `image_size` (height, width).
    """
    (H_pad, W_pad), (H, W), (height, width) = padded, real, image_size
    scale = torch.tensor([W_pad * width / W, H_pad * height / H], dtype=torch.float64)
    locations = record.locations[0, queries].double()  # (n, h, L, K, 2)
    return SampledPoints(
        points=locations * scale,
        weights=record.weights[0, queries].double(),
        spatial_shapes=record.spatial_shapes,
        input_size=padded,
    )


def _level_names(samples: SampledPoints) -> list[str]:
    """Each level in words: its map's size and its stride over the input."""
    H = samples.input_size[0]
    return [f"level {i}: {h}x{w} (stride {round(H / h)})" for i, (h, w) in enumerate(samples.spatial_shapes)]


@torch.no_grad()
def detection_attention(
    model: VitkitDetector,
    info: ModelInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
    layer: int = -1,
    head: int | None = None,
) -> tuple[list[Detection], torch.Tensor]:
    """Each detection of `image` with the decoder cross-attention of its query over the feature map (DETR's
    figure 6): (detections most probable first, maps (n, h, w) in the same order, each summing to one). Each map
    belongs to one query, so each query gives its best class (`postprocessing.top_k` does not apply); duplicates are
    suppressed as `postprocessing.nms_iou` says. For dense cross-attention (DETR); a deformable one samples points
    instead (`detection_sampling`).

    Args:
        layer: the decoder layer (an index into its object-attention layers, `object_attention_layers`, negative
            from the end).
        head: one head, or None for the mean over heads.
    """
    captured = _capture(model, info, image, threshold, postprocessing, layer)
    if isinstance(captured.record, SampledAttention):
        raise ValueError(
            f"{type(model).__name__}'s cross-attention samples points on several maps, not one dense map: "
            "use detection_sampling"
        )
    return captured.detections, _dense_attention(model, captured, head)


@torch.no_grad()
def detection_sampling(
    model: VitkitDetector,
    info: ModelInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
    layer: int = -1,
) -> tuple[list[Detection], SampledPoints]:
    """Each detection of `image` with the points its query sampled in a deformable decoder cross-attention layer
    (Deformable DETR's figure 5): (detections most probable first, their `SampledPoints` in the same order, in
    pixels of `image`). Detections as `detection_attention` selects them; `layer` as there."""
    captured = _capture(model, info, image, threshold, postprocessing, layer)
    if not isinstance(captured.record, SampledAttention):
        raise ValueError(
            f"{type(model).__name__}'s cross-attention is dense, not sampled points: use detection_attention"
        )
    size = (image.height, image.width)
    return captured.detections, sampled_points(captured.record, captured.queries, captured.padded, captured.real, size)


@torch.no_grad()
def detection_attention_figure(
    model: VitkitDetector,
    info: ModelInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
    layer: int = -1,
    head: int | None = None,
    alpha: float = 0.6,
    name: str | None = None,
) -> tuple[Figure, list[Detection], str]:
    """Where each detection's query looked in `image`, with a title naming the model, the layer and the heads;
    `name` is the model in the title (default: its family). Returns (figure, detections, the title's line saying
    what is drawn, unwrapped).

    What the layer records picks the drawing: a dense cross-attention (DETR) gives DETR's figure 6, each detection
    beside its query's map over the image (`detection_attention`, `vitkit.viz.object_attention_figure`, one colour
    bar); a deformable one (`SampledAttention`) Deformable DETR's figure 5, a dot at each point the query sampled,
    its area its attention weight, coloured by level (`detection_sampling`,
    `vitkit.viz.detection.sampled_attention_figure`; `alpha` does not apply). `head`: one head, or None for all of
    them (the mean of the dense maps; every head's points, each weight divided by the heads).
    """
    captured = _capture(model, info, image, threshold, postprocessing, layer)
    detections, L = captured.detections, captured.layers
    above = f"{len(detections)} object{'' if len(detections) == 1 else 's'} above {threshold:.2f}"
    boxes, labels, scores = [d.box for d in detections], [d.label for d in detections], [d.score for d in detections]
    masks = [d.mask_array() for d in detections] if any(d.mask is not None for d in detections) else None
    if isinstance(captured.record, SampledAttention):
        samples = sampled_points(
            captured.record, captured.queries, captured.padded, captured.real, (image.height, image.width)
        )
        n, h, levels, K = samples.weights.shape
        _check_head(head, h)
        which = f"all {h} heads" if head is None else f"head {head % h} of {h}"
        shown = h if head is None else 1
        chosen = slice(None) if head is None else slice(head % h, head % h + 1)
        points = samples.points[:, chosen].reshape(n, shown * levels * K, 2)  # (n, h', L, K, 2) -> (n, h' L K, 2)
        weights = samples.weights[:, chosen].reshape(n, shown * levels * K) / shown  # (n, h' L K): sum to one
        groups = torch.arange(levels)[None, None, :, None].expand(n, shown, levels, K)  # each point's level
        described = f"{family_of(model).display_name}, {L} decoder layers x {h} heads x {levels} levels x {K} points"
        figure = sampled_attention_figure(
            image,
            boxes,
            labels,
            scores,
            points,
            weights,
            groups.reshape(n, shown * levels * K),
            _level_names(samples),
            info.classes,
            model=f"{name}: {described}" if name else described,
            what=(
                what := _what(
                    f"decoder layer {layer % L} (of 0..{L - 1}) sampling points of each object's query, {which}",
                    above,
                    threshold,
                    detections,
                )
            ),  # fmt: skip
            empty=f"no detections above {threshold:.2f}",
            masks=masks,
        )
        return figure, detections, what
    heats = _dense_attention(model, captured, head)
    h = captured.record.shape[1]
    which = f"mean of {h} heads" if head is None else f"head {head % h} of {h}"
    described = f"{family_of(model).display_name}, {L} decoder layers x {h} heads"
    figure = object_attention_figure(
        image,
        boxes,
        labels,
        scores,
        heats,
        info.classes,
        alpha,
        model=f"{name}: {described}" if name else described,
        what=(
            what := _what(
                f"decoder layer {layer % L} (of 0..{L - 1}) cross-attention of each object's query, {which}",
                above,
                threshold,
                detections,
            )
        ),  # fmt: skip
        empty=f"no detections above {threshold:.2f}",
        masks=masks,
    )
    return figure, detections, what


def _what(drawn: str, above: str, threshold: float, detections: list) -> str:
    """The figure's line saying what it draws; with no detection, that there is no query to draw and why."""
    if detections:
        return f"{drawn}  ·  {above}"
    layer = drawn.split(")")[0] + ")"
    return f"{layer}: no object above {threshold:.2f}, so no query to draw; a lower threshold shows the likeliest ones"
