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


Tab = tuple[float, float, float, float]  # a label's filled tab (x0, y0, x1, y1)


def _draw_box(
    draw: ImageDraw.ImageDraw,
    box: Sequence[float],
    text: str,
    colour: tuple[int, int, int],
    font: ImageFont.ImageFont,
    taken: list[Tab] | None = None,
) -> None:
    """A rectangle and its label on a filled tab: above its top-left corner (inside when there is no room), or,
    where that would cover a tab in `taken` (the labels drawn before, to which this one is added), the first of
    the other corners, above or below the box, that covers none."""
    draw.rectangle(tuple(box), outline=colour, width=max(2, round(font.size / 6)))
    _draw_label(draw, box, text, colour, font, taken)


def _draw_label(
    draw: ImageDraw.ImageDraw,
    box: Sequence[float],
    text: str,
    colour: tuple[int, int, int],
    font: ImageFont.ImageFont,
    taken: list[Tab] | None = None,
) -> None:
    """`box`'s label on a filled tab, placed by `tab_place` clear of the tabs in `taken` (then added to them)."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tab_w, tab_h = right - left + 6, bottom - top + 4
    tab = tab_place(tuple(box), tab_w, tab_h, draw.im.size, taken or [])
    if taken is not None:
        taken.append(tab)
    draw.rectangle(tab, fill=colour)
    draw.text((tab[0] + 3, tab[1] + 2 - top), text, fill="white", font=font)


def tab_place(box: Tab, tab_w: float, tab_h: float, size: tuple[int, int], taken: list[Tab]) -> Tab:
    """Where a label tab of `tab_w` x `tab_h` goes for `box` on a picture of `size` (W, H): the first of above the
    top-left corner, inside it, below the bottom-left corner, inside it, and the same on the right, that lies on
    the picture and covers no tab of `taken`; the first on the picture when each covers one."""
    x0, y0, x1, y1 = box
    W, H = size
    candidates = []
    for x in (x0, x1 - tab_w):
        for y in (y0 - tab_h, y0, y1, y1 - tab_h):
            candidates.append((x, y, x + tab_w, y + tab_h))
    on_picture = [t for t in candidates if t[0] >= 0 and t[1] >= 0 and t[2] <= W and t[3] <= H] or candidates[1:2]
    for tab in on_picture:
        if not any(tab[0] < o[2] and o[0] < tab[2] and tab[1] < o[3] and o[1] < tab[3] for o in taken):
            return tab
    return on_picture[0]


def _banner(picture: Image.Image, text: str) -> None:
    """`text` on a dark band across the top of `picture`: what a picture without boxes says."""
    draw, font = ImageDraw.Draw(picture), _font(picture)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    height = bottom - top + 10
    draw.rectangle((0, 0, picture.width, height), fill=(32, 32, 32))
    draw.text(((picture.width - (right - left)) / 2, 5 - top), text, fill="white", font=font)


def draw_detections(
    image: Image.Image,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    scores: Sequence[float] | None,
    classes: Sequence[str] | None = None,
    empty: str = "no detections",
) -> Image.Image:
    """`image` (enlarged if small) with each box outlined and labelled "label score", the labels placed so that none
    covers another where the boxes leave room (`tab_place`); without boxes, `empty` written across its top.

    Args:
        boxes: (x0, y0, x1, y1) in pixels of `image`.
        labels: each box's class name; scores: its probability (None: ground truth, labels alone).
        classes: all class names, so that a class keeps its colour across images (default: colours by `labels`'
            order of first appearance).
        empty: what the picture says when there is no box (e.g. "no detections above 0.50").
    """
    if len(boxes) != len(labels) or scores is not None and len(scores) != len(boxes):
        given = "-" if scores is None else len(scores)
        raise ValueError(f"expected one label and score per box: {len(boxes)}, {len(labels)}, {given}")
    picture, factor = enlarge(image)
    if not len(boxes):
        _banner(picture, empty)
        return picture
    draw, font = ImageDraw.Draw(picture), _font(picture)
    palette = list(classes) if classes is not None else list(dict.fromkeys(labels))
    order = sorted(range(len(boxes)), key=lambda i: scores[i]) if scores is not None else list(range(len(boxes)))
    scaled = [[v * factor for v in box] for box in boxes]
    for i in order:  # every outline first, so that none crosses a label
        draw.rectangle(tuple(scaled[i]), outline=_colour(labels[i], palette), width=max(2, round(font.size / 6)))
    taken: list[Tab] = []
    for i in reversed(order):  # the most probable label first: it takes its place above its box
        text = labels[i] if scores is None else f"{labels[i]} {scores[i]:.2f}"
        _draw_label(draw, scaled[i], text, _colour(labels[i], palette), font, taken)
    return picture


def labelled_grid(
    panels: Sequence[tuple[str, Image.Image]], columns: int = 4, side: int = 320, title: str = ""
) -> Image.Image:
    """Pictures (e.g. `draw_detections` of ground truth) in a grid of `columns`, each fitted in `side` x `side` px
    under its caption; `title` above the grid."""
    if not panels:
        raise ValueError("no pictures to lay out")
    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    caption = 18
    top = 26 if title else 0
    grid = Image.new("RGB", (columns * (side + 8) + 8, top + rows * (side + caption + 8) + 8), "white")
    draw = ImageDraw.Draw(grid)
    font = ImageFont.load_default(size=13)
    if title:
        draw.text((8, 6), title, fill="black", font=font)
    for n, (name, picture) in enumerate(panels):
        picture = picture.copy()
        picture.thumbnail((side, side))
        x, y = 8 + (n % columns) * (side + 8), top + 8 + (n // columns) * (side + caption + 8)
        draw.text((x, y), name[:48], fill="black", font=font)
        grid.paste(picture, (x, y + caption))
    return grid


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
    empty: str = "no detections",
) -> AttentionMaps:
    """DETR's figure 6 as `AttentionMaps` for `draw_attention`: first the image with every detection, then one panel
    per detection, its box drawn on the image under its query's attention map.

    Args:
        boxes, labels, scores, classes: as for `draw_detections`.
        heats: (n, h, w) attention of each detection's query over the feature map of the whole image.
        model, what: the model and the maps in words, for the title.
        empty: the first panel's title when there is no detection (e.g. "no detections above 0.50").
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
        view=draw_detections(image, boxes, labels, scores, classes, empty),
        heats=heats.float().cpu(),
        titles=tuple(f"{label} {score:.2f}" for label, score in zip(labels, scores, strict=True)),
        columns=min(max(len(boxes), 1), PANELS_PER_ROW),
        model=model,
        what=what,
        values="attention of the object's query",
        prediction=None,
        panels=(base,) * len(boxes),
        marks=tuple(marks),
        view_title=f"{len(boxes)} detection{'' if len(boxes) == 1 else 's'}" if len(boxes) else empty,
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
    empty: str = "no detections",
) -> Figure:
    """`draw_attention(object_attention_maps(...), alpha)`: the detections, then each beside its query's map (one
    colour scale and bar for all, a title naming the model and the maps); without detections the picture alone,
    saying `empty`. Save it with `vitkit.viz.save_picture` (or its `savefig`)."""
    maps = object_attention_maps(image, boxes, labels, scores, heats, classes, model, what, empty)
    return draw_attention(maps, alpha)


# Colours of the sampling points of a deformable attention figure, one per level (or head) in order: bright and
# distinct from each other on dark and light images alike.
POINT_COLOURS = ("#ff2d2d", "#ffb000", "#00e5ff", "#7dff3a", "#ff4fd8", "#ffffff", "#9b7bff", "#ff8a5c")
DOT_AREA = 0.015  # a dot's area for weight 1, as a share of its panel's area (weights of one panel sum to one)


def sampled_attention_figure(
    image: Image.Image,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    scores: Sequence[float],
    points: torch.Tensor,
    weights: torch.Tensor,
    groups: torch.Tensor,
    group_names: Sequence[str],
    classes: Sequence[str] | None = None,
    model: str = "a detector",
    what: str = "each object's query: the points its deformable cross-attention sampled",
    empty: str = "no detections",
) -> Figure:
    """The Deformable DETR paper's figure 5 for `image`: the detections, then one panel per detection, its box on the
    image and a dot at each point its query sampled, the dot's area proportional to the point's attention weight and
    its colour its group's (a feature level, or a head), with a legend of the groups.

    Panels show `image` enlarged by a whole factor f (`enlarge`); their data coordinates are the enlarged picture's
    pixel indices, so a point at (x, y) in continuous pixel coordinates of `image` ((0, 0) its top-left corner) is
    drawn at (f x - 0.5, f y - 0.5). A dot's area in points^2 is weight * DOT_AREA * (the panel's area in points^2).

    Args:
        boxes, labels, scores, classes: as for `draw_detections`.
        points: (n, P, 2) each detection's P sampling points (x, y) in pixels of `image`.
        weights: (n, P) their attention weights (each detection's summing to at most one).
        groups: (n, P) integer: each point's group, an index into `group_names`, which names them for the legend.
        model, what: the model and the points in words, for the title.
        empty: what the picture says when there is no detection (e.g. "no detections above 0.50"); the figure is
            then the picture alone.
    """
    n = len(boxes)
    if points.ndim != 3 or points.shape[0] != n or points.shape[-1] != 2:
        raise ValueError(f"expected points (n, P, 2) for n = {n} boxes, got shape {tuple(points.shape)}")
    if weights.shape != points.shape[:2] or groups.shape != points.shape[:2]:
        raise ValueError(
            f"expected weights and groups (n, P) = {tuple(points.shape[:2])} like the points, got "
            f"{tuple(weights.shape)} and {tuple(groups.shape)}"
        )
    if groups.numel() and not 0 <= int(groups.min()) <= int(groups.max()) < len(group_names):
        raise ValueError(f"groups must index the {len(group_names)} group names, got values {groups.unique().tolist()}")
    from matplotlib.lines import Line2D

    from vitkit.viz.attention import EMPTY_FIGURE_WIDTH, fonts_for, new_figure, spell, wrap_title

    base, factor = enlarge(image)
    palette = list(classes) if classes is not None else list(dict.fromkeys(labels))
    columns = min(max(n, 1), PANELS_PER_ROW)
    rows = max(1, math.ceil(n / columns))
    titles = [f"{label} {score:.2f}" for label, score in zip(labels, scores, strict=True)]
    title = f"{model}\n{what}"
    fonts, missing = fonts_for([title, *titles, *group_names])
    cell = max(1.4, min(3.0, 20 / (columns + 1)))  # inches per panel, as `draw_attention`
    width = (columns + 1) * cell if n else max(cell, EMPTY_FIGURE_WIDTH)  # without detections, the picture alone
    title = wrap_title(title, width, 10 if cell >= 2 else 9)
    figure = new_figure(width, rows * cell + (1.2 if n else 0.6) + 0.17 * title.count("\n"))
    layout = figure.add_gridspec(rows, columns + 1 if n else 1)
    size = 9 if cell >= 2 else 7
    view = figure.add_subplot(layout[0, 0])
    view.imshow(draw_detections(image, boxes, labels, scores, classes, empty))
    view.set_title(f"{n} detection{'' if n == 1 else 's'}" if n else empty, fontsize=size, fontfamily=fonts)
    view.set_axis_off()
    area = DOT_AREA * (cell * 72) ** 2  # points^2 of weight 1: a share of the panel
    colours = [POINT_COLOURS[g % len(POINT_COLOURS)] for g in range(len(group_names))]
    for k in range(n):
        ax = figure.add_subplot(layout[k // columns, 1 + k % columns])
        ax.imshow(base.convert("L").convert("RGB"), alpha=0.75)  # grey, so that the coloured dots stand out
        mark = Image.new("RGBA", base.size, (0, 0, 0, 0))
        colour = _colour(labels[k], palette)  # the label where it stands in the first panel's picture
        _draw_box(ImageDraw.Draw(mark), [v * factor for v in boxes[k]], titles[k], colour, _font(mark))
        ax.imshow(mark)
        order = weights[k].argsort(descending=True)  # the heaviest drawn first, under the lighter ones
        xy = points[k][order].float() * factor - 0.5
        ax.scatter(
            xy[:, 0].numpy(),
            xy[:, 1].numpy(),
            s=(weights[k][order].float() * area).numpy(),
            c=[colours[int(g)] for g in groups[k][order]],
            edgecolors="black",
            linewidths=0.4,
            alpha=0.9,
        )
        ax.set_xlim(-0.5, base.width - 0.5)
        ax.set_ylim(base.height - 0.5, -0.5)
        ax.set_title(titles[k], fontsize=size, fontfamily=fonts, parse_math=False)
        ax.set_axis_off()
    if n:
        handles = [
            Line2D([], [], linestyle="", marker="o", markersize=7, markerfacecolor=c, markeredgecolor="black")
            for c in colours
        ]
        figure.legend(
            handles,
            [spell(name, missing) for name in group_names],
            loc="outside lower center",
            ncols=min(len(group_names), 6),
            fontsize=size,
            title="dot area: attention weight",
            title_fontsize=size,
            frameon=False,
        )
    figure.suptitle(spell(title, missing), fontsize=10 if cell >= 2 else 9, fontfamily=fonts, parse_math=False)
    return figure
