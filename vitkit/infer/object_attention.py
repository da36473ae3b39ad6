"""Where a detector looks for each object it finds: the object attention of each detection's query over the feature
map (the decoder's cross-attention, DETR's figure 6), as data and as a figure.

Letters: Q object queries, h, w feature-map size, n detections.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from PIL import Image

from vitkit.data import DetectionInfo
from vitkit.detection import Postprocessing
from vitkit.infer.detect import DETR_POSTPROCESSING, Detection, detector_inputs, detector_outputs, image_detections
from vitkit.layers import capture_attention
from vitkit.models.interface import VitkitDetector
from vitkit.models.registry import family_of
from vitkit.viz import object_attention_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _object_attention(
    model: VitkitDetector,
    info: DetectionInfo,
    image: Image.Image,
    threshold: float,
    postprocessing: Postprocessing,
    layer: int,
    head: int | None,
) -> tuple[list[Detection], torch.Tensor, int, int]:
    """`detection_attention`'s (detections, maps (n, h, w)), with the decoder's layers L and heads per layer."""
    names = model.object_attention_layers() if isinstance(model, VitkitDetector) else []
    if not names:
        raise ValueError(f"{type(model).__name__} has no cross-attention layers (a DETR detector has)")
    if not -len(names) <= layer < len(names):
        raise ValueError(f"layer {layer} is out of range for a decoder of {len(names)} layers")
    pixels, mask, sizes = detector_inputs(model, info, [image])
    with capture_attention(model, [names[layer]]) as maps:
        outputs = detector_outputs(model.eval(), pixels, mask)
    attn = maps[names[layer]][0].float()  # (heads, Q, h * w)
    heads = attn.shape[0]
    if head is not None and not -heads <= head < heads:
        raise ValueError(f"head {head} is out of range for {heads} heads")
    attn = attn.mean(0) if head is None else attn[head]  # (Q, h * w)
    # each query its best class, so that each detection has its own query's map; NMS as the model's settings say
    one_per_query = replace(postprocessing, top_k=None)
    (result,) = one_per_query(outputs, sizes, threshold)
    order = result["scores"].argsort(descending=True, stable=True)  # as `image_detections` orders them
    queries = result["queries"][order].tolist()
    h, w = model.feature_grid(tuple(pixels.shape[-2:]))
    heat = attn[queries].reshape(len(queries), h, w) if queries else attn.new_zeros(0, h, w)  # (n, h, w)
    return image_detections(result, info), heat, len(names), heads


@torch.no_grad()
def detection_attention(
    model: VitkitDetector,
    info: DetectionInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
    layer: int = -1,
    head: int | None = None,
) -> tuple[list[Detection], torch.Tensor]:
    """Each detection of `image` with the decoder cross-attention of its query over the feature map (DETR's
    figure 6): (detections most probable first, maps (n, h, w) in the same order, each summing to one). Each map
    belongs to one query, so each query gives its best class (`postprocessing.top_k` does not apply); duplicates are
    suppressed as `postprocessing.nms_iou` says.

    Args:
        layer: the decoder layer (an index into its object-attention layers, `object_attention_layers`, negative
            from the end).
        head: one head, or None for the mean over heads.
    """
    detections, heat, _, _ = _object_attention(model, info, image, threshold, postprocessing, layer, head)
    return detections, heat


@torch.no_grad()
def detection_attention_figure(
    model: VitkitDetector,
    info: DetectionInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
    layer: int = -1,
    head: int | None = None,
    alpha: float = 0.6,
    name: str | None = None,
) -> tuple[Figure, list[Detection]]:
    """DETR's figure 6 for `image`: the detections, then each beside its query's cross-attention over the image
    (`detection_attention`, `vitkit.viz.object_attention_figure`: one colour bar, a title naming the model, the
    layer and the heads); `name` is the model in the title (default: its family). Returns (figure, detections)."""
    detections, heats, L, h = _object_attention(model, info, image, threshold, postprocessing, layer, head)
    which = f"mean of {h} heads" if head is None else f"head {head % h} of {h}"
    described = f"{family_of(model).display_name}, {L} decoder layers x {h} heads"
    above = f"{len(detections)} object{'' if len(detections) == 1 else 's'} above {threshold:.2f}"
    figure = object_attention_figure(
        image,
        [d.box for d in detections],
        [d.label for d in detections],
        [d.score for d in detections],
        heats,
        info.classes,
        alpha,
        model=f"{name}: {described}" if name else described,
        what=f"decoder layer {layer % L} (of 0..{L - 1}) cross-attention of each object's query, {which}  ·  {above}",
    )
    return figure, detections
