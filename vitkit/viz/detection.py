"""Pictures of a detector's output: labelled boxes on the image, and each detection beside the decoder
cross-attention of its query over the image (the DETR paper's figure 6).

Boxes are (x0, y0, x1, y1) in pixels of the image given; small images are drawn enlarged (`enlarge`) so that
labels stay readable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image, ImageDraw, ImageFont

from vitkit.viz.attention import AttentionMaps, draw_attention

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Distinct, saturated box colours (Tableau 10), one per class index modulo its length.
BOX_COLOURS = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)  # fmt: skip
MIN_SIDE = 224  # images whose shorter side is below this are drawn enlarged by a whole factor
PANELS_PER_ROW = 4  # detections a row of the attention figure, after the picture of them all


def enlarge(image: Image.Image, min_side: int = MIN_SIDE) -> tuple[Image.Image, int]:
    """(image scaled by a whole factor so its shorter side is at least `min_side` (nearest neighbour, so pixels stay
    sharp), the factor)."""
    factor = max(1, math.ceil(min_side / min(image.size)))
    if factor == 1:
        return image.convert("RGB"), 1
    size = (image.width * factor, image.height * factor)
    return image.convert("RGB").resize(size, Image.Resampling.NEAREST), factor


def _font(image: Image.Image) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=max(12, min(image.size) // 18))


def _draw_box(
    draw: ImageDraw.ImageDraw, box: Sequence[float], text: str, colour: tuple[int, int, int], font: ImageFont.ImageFont
) -> None:
    """A rectangle and, above its top-left corner (inside when there is no room), its label on a filled tab."""
    x0, y0, x1, y1 = box
    width = max(2, round(font.size / 6))
    draw.rectangle((x0, y0, x1, y1), outline=colour, width=width)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tab_w, tab_h = right - left + 6, bottom - top + 4
    ty = y0 - tab_h if y0 - tab_h >= 0 else y0
    draw.rectangle((x0, ty, x0 + tab_w, ty + tab_h), fill=colour)
    draw.text((x0 + 3, ty + 2 - top), text, fill="white", font=font)


def draw_detections(
    image: Image.Image,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    scores: Sequence[float],
    classes: Sequence[str] | None = None,
) -> Image.Image:
    """`image` (enlarged if small) with each box outlined and labelled "label score".

    Args:
        boxes: (x0, y0, x1, y1) in pixels of `image`.
        labels: each box's class name; scores: its probability.
        classes: all class names, so that a class keeps its colour across images (default: colours by `labels`'
            order of first appearance).
    """
    if not len(boxes) == len(labels) == len(scores):
        raise ValueError(f"expected one label and score per box: {len(boxes)}, {len(labels)}, {len(scores)}")
    picture, factor = enlarge(image)
    draw, font = ImageDraw.Draw(picture), _font(picture)
    palette = list(classes) if classes is not None else list(dict.fromkeys(labels))
    order = sorted(range(len(boxes)), key=lambda i: scores[i])  # the most probable drawn last, on top
    for i in order:
        _draw_box(
            draw, [v * factor for v in boxes[i]], f"{labels[i]} {scores[i]:.2f}", _colour(labels[i], palette), font
        )
    return picture


def _colour(label: str, palette: list[str]) -> tuple[int, int, int]:
    """The box colour of class `label`: its place in `palette` (the class names) picks one of BOX_COLOURS."""
    return BOX_COLOURS[palette.index(label) % len(BOX_COLOURS)] if label in palette else BOX_COLOURS[0]


def object_attention_maps(
    image: Image.Image,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    scores: Sequence[float],
    heats: torch.Tensor,
    classes: Sequence[str] | None = None,
    model: str = "a detector",
    what: str = "each object's query: decoder cross-attention over the image",
) -> AttentionMaps:
    """DETR's figure 6 as `AttentionMaps` for `draw_attention`: first the image with every detection, then one panel
    per detection, its box drawn on the image under its query's attention map.

    Args:
        boxes, labels, scores, classes: as for `draw_detections`.
        heats: (n, h, w) attention of each detection's query over the feature map of the whole image.
        model, what: the model and the maps in words, for the title.
    """
    if heats.ndim != 3 or len(heats) != len(boxes):
        raise ValueError(f"expected one (h, w) map per box: {len(boxes)} boxes, maps of shape {tuple(heats.shape)}")
    base, factor = enlarge(image)
    palette = list(classes) if classes is not None else list(dict.fromkeys(labels))
    marks = []
    for box, label, score in zip(boxes, labels, scores, strict=True):
        mark = Image.new("RGBA", base.size, (0, 0, 0, 0))  # the box and its label only, over the map
        text, colour = f"{label} {score:.2f}", _colour(label, palette)
        _draw_box(ImageDraw.Draw(mark), [v * factor for v in box], text, colour, _font(mark))
        marks.append(mark)
    return AttentionMaps(
        view=draw_detections(image, boxes, labels, scores, classes),
        heats=heats.float().cpu(),
        titles=tuple(f"{label} {score:.2f}" for label, score in zip(labels, scores, strict=True)),
        columns=min(max(len(boxes), 1), PANELS_PER_ROW),
        model=model,
        what=what,
        values="attention of the object's query",
        prediction=None,
        panels=(base,) * len(boxes),
        marks=tuple(marks),
        view_title=f"{len(boxes)} detection{'' if len(boxes) == 1 else 's'}",
    )


def object_attention_figure(
    image: Image.Image,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    scores: Sequence[float],
    heats: torch.Tensor,
    classes: Sequence[str] | None = None,
    alpha: float = 0.6,
    model: str = "a detector",
    what: str = "each object's query: decoder cross-attention over the image",
) -> Figure:
    """`draw_attention(object_attention_maps(...), alpha)`: the detections, then each beside its query's map (one
    colour scale and bar for all, a title naming the model and the maps). Save it with `vitkit.viz.save_picture`
    (or its `savefig`)."""
    return draw_attention(object_attention_maps(image, boxes, labels, scores, heats, classes, model, what), alpha)
