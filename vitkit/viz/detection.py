"""Pictures of a detector's output: labelled boxes on the image, and each detection beside the decoder
cross-attention of its query over the image (the DETR paper's figure 6).

Boxes are (x0, y0, x1, y1) in pixels of the image given; small images are drawn enlarged (`enlarge`) so that
labels stay readable.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
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


MAX_FONT = 32  # pixels: a large image's labels stay the size of a small one's, not of its objects' surroundings


def _font(image: Image.Image) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=max(12, min(min(image.size) // 18, MAX_FONT)))


Tab = tuple[float, float, float, float]  # a label's filled tab (x0, y0, x1, y1)
MAX_LABELS = 20  # more boxes than this are numbered, with a legend beside or under the picture, not labelled
LABEL_SHARE = 0.25  # ... as are boxes whose labels would cover more than this share of the picture together
MAX_NUMBERED = 60  # more boxes than this (a large image in tiles) are outlined in their class's colour, with a key of
# the classes and their counts beside the picture: detections.json lists each


def _draw_box(
    draw: ImageDraw.ImageDraw,
    box: Sequence[float],
    text: str,
    colour: tuple[int, int, int],
    font: ImageFont.ImageFont,
) -> None:
    """A rectangle and its label on a filled tab, placed by `tab_place`."""
    draw.rectangle(tuple(box), outline=colour, width=max(2, round(font.size / 6)))
    tab = tab_place(tuple(box), *_tab_size(draw, text, font), draw.im.size, [])
    _draw_tab(draw, tab, text, colour, font)


def _tab_size(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont) -> tuple[float, float]:
    """(width, height) of the filled tab that holds `text`: the text with a margin of 3 px across and 2 px down."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    return right - left + 6, bottom - top + 4


def _draw_tab(
    draw: ImageDraw.ImageDraw, tab: Tab, text: str, colour: tuple[int, int, int], font: ImageFont.ImageFont
) -> None:
    """`text` in white on `tab` filled with `colour`."""
    top = draw.textbbox((0, 0), text, font=font)[1]
    draw.rectangle(tab, fill=colour)
    draw.text((tab[0] + 3, tab[1] + 2 - top), text, fill="white", font=font)


def _overlaps(tabs: Sequence[Tab], rects: Sequence[Sequence[float]]) -> np.ndarray:
    """(len(tabs), len(rects)): the area each of `tabs` shares with each of `rects` (0 where they only touch)."""
    a, b = np.asarray(tabs, dtype=float).reshape(-1, 1, 4), np.asarray(rects, dtype=float).reshape(1, -1, 4)
    across = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    down = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    return across.clip(min=0) * down.clip(min=0)


def tab_place(
    box: Tab, tab_w: float, tab_h: float, size: tuple[int, int], taken: Sequence[Tab], others: Sequence[Tab] = ()
) -> Tab:
    """Where a label tab of `tab_w` x `tab_h` goes for `box` on a picture of `size` (W, H), among: above the top-left
    corner, inside it, below the bottom-left corner, inside it, the same on the right, then beside the box (left
    and right of its top and bottom edges); each moved onto the picture where it sticks out, after those of its
    kind that lie on it. The first that covers no tab of `taken` (the labels placed before) and the fewest of
    `others` (the other boxes, so that a label hides no object it can avoid); when each covers a tab, the one
    covering the least area of them. A tab larger than the picture goes to its top or left edge."""
    x0, y0, x1, y1 = box
    W, H = size
    around = [(x, y) for x in (x0, x1 - tab_w) for y in (y0 - tab_h, y0, y1, y1 - tab_h)]
    beside = [(x, y) for y in (y0, y1 - tab_h) for x in (x0 - tab_w, x1)]
    spots = []
    for kind in (around, beside):
        spots += [(x, y) for x, y in kind if 0 <= x <= W - tab_w and 0 <= y <= H - tab_h]
        spots += [(min(max(x, 0), max(W - tab_w, 0)), min(max(y, 0), max(H - tab_h, 0))) for x, y in kind]
    candidates = [(x, y, x + tab_w, y + tab_h) for x, y in dict.fromkeys(spots)]
    covered = _overlaps(candidates, taken).sum(1)  # the area of the tabs before that each would cover
    hidden = (_overlaps(candidates, others) > 0).sum(1)  # the other boxes it would lie over
    return candidates[np.lexsort((np.arange(len(candidates)), hidden, covered))[0]]


def place_labels(boxes: Sequence[Tab], sizes: Sequence[tuple[float, float]], size: tuple[int, int]) -> list[Tab]:
    """The tab of each box's label (`tab_place`), in the order given: each placed clear of those before it where its
    box leaves room, so the first boxes get the first choice."""
    tabs: list[Tab] = []
    for n, (box, (tab_w, tab_h)) in enumerate(zip(boxes, sizes, strict=True)):
        tabs.append(tab_place(box, tab_w, tab_h, size, tabs, [*boxes[:n], *boxes[n + 1 :]]))
    return tabs


def labels_fit(tabs: Sequence[Tab], size: tuple[int, int]) -> bool:
    """Whether label tabs (`place_labels`) keep a picture of `size` (W, H) readable: at most MAX_LABELS of them, all
    on the picture, none covering another, together covering at most LABEL_SHARE of it."""
    W, H = size
    if len(tabs) > MAX_LABELS or sum((t[2] - t[0]) * (t[3] - t[1]) for t in tabs) > LABEL_SHARE * W * H:
        return False
    if any(t[0] < 0 or t[1] < 0 or t[2] > W or t[3] > H for t in tabs):
        return False
    return not np.triu(_overlaps(tabs, tabs), 1).any()


def _banner(picture: Image.Image, text: str) -> None:
    """`text` on a dark band across the top of `picture`: what a picture without boxes says."""
    draw, font = ImageDraw.Draw(picture), _font(picture)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    height = bottom - top + 10
    draw.rectangle((0, 0, picture.width, height), fill=(32, 32, 32))
    draw.text(((picture.width - (right - left)) / 2, 5 - top), text, fill="white", font=font)


def _legend(
    picture: Image.Image, entries: Sequence[tuple[str, str, tuple[int, int, int]]], font: ImageFont.ImageFont
) -> Image.Image:
    """`picture` with a white legend of `entries` (number, what it stands for, colour) beside it, or under it where
    that keeps the whole closer to a square: each number on its tab, as on the picture, then the text, in columns
    read down one after the other."""
    measure = ImageDraw.Draw(picture)
    size = font.size  # a number's tab, or a colour's swatch (blank) as tall as the text
    tabs = [(w, max(h, size)) for w, h in (_tab_size(measure, number, font) for number, _, _ in entries)]
    texts = [measure.textbbox((0, 0), text, font=font) for _, text, _ in entries]
    gap = max(4, font.size // 3)
    cell_w = max(w + gap + right for (w, _), (_, _, right, _) in zip(tabs, texts, strict=True)) + 2 * gap
    cell_h = max(max(h for _, h in tabs), max(b[3] - b[1] for b in texts)) + gap
    n, W, H = len(entries), picture.width, picture.height
    columns = max(1, min(n, (W - gap) // cell_w))  # under the picture, as many columns as its width holds
    under = (max(W, columns * cell_w + gap), H + -(-n // columns) * cell_h + 2 * gap)
    rows = max(1, min(n, (H - gap) // cell_h))  # beside it, as many rows as its height holds
    side = (W + -(-n // rows) * cell_w + gap, max(H, rows * cell_h + gap))
    beside = max(side) / min(side) < max(under) / min(under)
    if not beside:
        rows = -(-n // columns)
    legend = Image.new("RGB", side if beside else under, "white")
    legend.paste(picture, (0, 0))
    draw = ImageDraw.Draw(legend)
    left, top = (W + gap, gap) if beside else (gap, H + gap)
    for k, ((number, text, colour), (tab_w, tab_h), box) in enumerate(zip(entries, tabs, texts, strict=True)):
        x, y = left + (k // rows) * cell_w, top + (k % rows) * cell_h
        _draw_tab(draw, (x, y, x + tab_w, y + tab_h), number, colour, font)
        middle = y + tab_h / 2 - (box[1] + box[3]) / 2  # the text's middle level with the number's
        draw.text((x + tab_w + gap, middle), text, fill="black", font=font)
    return legend


def draw_detections(
    image: Image.Image,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    scores: Sequence[float] | None,
    classes: Sequence[str] | None = None,
    empty: str = "no detections",
    masks: Sequence[np.ndarray | None] | None = None,
) -> Image.Image:
    """`image` (enlarged if small) with each box outlined and labelled "label score", the most probable first, each
    label whole on the picture and clear of the others and of other boxes where it can be (`place_labels`);
    without boxes, `empty` written across its top. With `masks`, each object's mask is filled translucent in its
    box's colour and outlined, beneath the boxes and labels (the most probable on top).

    When the labels would not keep the picture readable (`labels_fit`: more than MAX_LABELS, covering more than
    LABEL_SHARE of it, or some that cannot be placed apart), each box gets a small number instead (1 the most
    probable; for ground truth, the order given), its outline thinner, and a legend of the numbers' labels goes
    beside the picture or under it: the picture returned is then larger than the image. Past MAX_NUMBERED boxes
    (a large image of many objects), the boxes are outlined in their class's colour with no number, and the legend
    is a key of the classes with their counts.

    Args:
        boxes: (x0, y0, x1, y1) in pixels of `image`.
        labels: each box's class name; scores: its probability (None: ground truth, labels alone).
        classes: all class names, so that a class keeps its colour across images (default: colours by `labels`'
            order of first appearance).
        empty: what the picture says when there is no box (e.g. "no detections above 0.50").
        masks: each box's mask, (height, width) bool in pixels of `image`, or None where it has none.
    """
    if masks is not None and len(masks) != len(boxes):
        raise ValueError(f"expected one mask (or None) per box: {len(boxes)} boxes, {len(masks)} masks")
    if len(boxes) != len(labels) or scores is not None and len(scores) != len(boxes):
        given = "-" if scores is None else len(scores)
        raise ValueError(f"expected one label and score per box: {len(boxes)}, {len(labels)}, {given}")
    picture, factor = enlarge(image)
    if not len(boxes):
        _banner(picture, empty)
        return picture
    draw, font = ImageDraw.Draw(picture), _font(picture)
    palette = list(classes) if classes is not None else list(dict.fromkeys(labels))
    order = sorted(range(len(boxes)), key=lambda i: -scores[i]) if scores is not None else list(range(len(boxes)))
    scaled = [tuple(v * factor for v in boxes[i]) for i in order]  # the most probable first: its label goes first
    texts = [labels[i] if scores is None else f"{labels[i]} {scores[i]:.2f}" for i in order]
    colours = [_colour(labels[i], palette) for i in order]
    if masks is not None:  # beneath everything else
        picture = _fill_masks(picture, [masks[i] for i in order], colours, factor)
        draw = ImageDraw.Draw(picture)
    width = max(2, round(font.size / 6))  # of the outlines
    numbered = len(order) > MAX_LABELS
    if not numbered:
        tabs = place_labels(scaled, [_tab_size(draw, text, font) for text in texts], picture.size)
        numbered = not labels_fit(tabs, picture.size)
    shown = texts
    if len(order) > MAX_NUMBERED:  # too many even to number: outlines in the classes' colours, a key of the classes
        width = max(1, width // 2)
        for box, colour in zip(reversed(scaled), reversed(colours), strict=True):
            draw.rectangle(box, outline=colour, width=width)
        counts = Counter(labels[i] for i in order)
        key = [(name, _colour(name, palette)) for name in dict.fromkeys(labels[i] for i in order)]
        return _legend(picture, [("  ", f"{name} ({counts[name]})", colour) for name, colour in key], font)
    if numbered:  # too many labels to read: numbers on the boxes (thinner), a legend beside or under
        font, width = ImageFont.load_default(size=max(11, round(font.size * 0.6))), max(1, width // 2)
        shown = [str(n + 1) for n in range(len(order))]
        tabs = place_labels(scaled, [_tab_size(draw, number, font) for number in shown], picture.size)
    for box, colour in zip(reversed(scaled), reversed(colours), strict=True):  # every outline first, so that none
        draw.rectangle(box, outline=colour, width=width)  # crosses a label; the most probable on top
    for tab, text, colour in reversed(list(zip(tabs, shown, colours, strict=True))):  # where numbers could not be
        _draw_tab(draw, tab, text, colour, font)  # placed apart, the most probable on top
    if numbered:
        return _legend(picture, list(zip(shown, texts, colours, strict=True)), font)
    return picture


MASK_ALPHA = 0.45  # a mask's fill: this share of its colour over the image


def _mask_pixels(mask: np.ndarray, factor: int, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(inside, edge): a mask in image pixels on a picture of `shape` (the image enlarged `factor` times), bool each;
    the edge the inside pixels not all of whose four neighbours are inside."""
    inside = np.kron(mask, np.ones((factor, factor), dtype=bool)) if factor > 1 else mask.astype(bool)
    inside = inside[: shape[0], : shape[1]]
    core = inside.copy()
    core[1:] &= inside[:-1]
    core[:-1] &= inside[1:]
    core[:, 1:] &= inside[:, :-1]
    core[:, :-1] &= inside[:, 1:]
    return inside, inside & ~core


def _fill_masks(
    picture: Image.Image, masks: Sequence[np.ndarray | None], colours: Sequence[tuple[int, int, int]], factor: int
) -> Image.Image:
    """`picture` (the image enlarged `factor` times) with each mask (in image pixels, the most probable first)
    filled at MASK_ALPHA in its colour and its edge pixels drawn in full colour; the most probable on top. Masks of
    one colour (one class) are filled once where they overlap, so that a crowd of them does not hide the image: their
    edges tell them apart."""
    canvas = np.asarray(picture.convert("RGB")).astype(np.float32)  # (H f, W f, 3)
    filled: dict[tuple[int, int, int], np.ndarray] = {}  # each colour's pixels filled so far
    for mask, colour in reversed(list(zip(masks, colours, strict=True))):
        if mask is None or not mask.any():
            continue
        inside, edge = _mask_pixels(mask, factor, canvas.shape[:2])
        done = filled.get(tuple(colour))
        fresh = inside if done is None else inside & ~done
        rgb = np.array(colour, dtype=np.float32)
        canvas[fresh] = canvas[fresh] * (1 - MASK_ALPHA) + rgb * MASK_ALPHA
        canvas[edge] = rgb
        filled[tuple(colour)] = inside if done is None else done | inside
    return Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))


def _mask_mark(mark: Image.Image, mask: np.ndarray, colour: tuple[int, int, int], factor: int) -> Image.Image:
    """An RGBA overlay `mark` with `mask` (image pixels) filled faintly in `colour` and its edge drawn opaque."""
    layer = np.array(mark)  # (H f, W f, 4)
    inside, edge = _mask_pixels(mask, factor, layer.shape[:2])
    layer[inside] = (*colour, round(255 * MASK_ALPHA / 2))
    layer[edge] = (*colour, 255)
    return Image.fromarray(layer, "RGBA")


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
    masks: Sequence[np.ndarray | None] | None = None,
) -> AttentionMaps:
    """DETR's figure 6 as `AttentionMaps` for `draw_attention`: first the image with every detection, then one panel
    per detection, its box drawn on the image under its query's attention map.

    Args:
        boxes, labels, scores, classes: as for `draw_detections`.
        heats: (n, h, w) attention of each detection's query over the feature map of the whole image.
        model, what: the model and the maps in words, for the title.
        empty: the first panel's title when there is no detection (e.g. "no detections above 0.50").
        masks: each detection's mask (a detector that predicts masks), filled on the first panel.
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
        view=draw_detections(image, boxes, labels, scores, classes, empty, masks),
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
    masks: Sequence[np.ndarray | None] | None = None,
) -> Figure:
    """`draw_attention(object_attention_maps(...), alpha)`: the detections (with their `masks` where given), then
    each beside its query's map (one colour scale and bar for all, a title naming the model and the maps); without
    detections the picture alone, saying `empty`. Save it with `vitkit.viz.save_picture` (or its `savefig`)."""
    maps = object_attention_maps(image, boxes, labels, scores, heats, classes, model, what, empty, masks)
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
    masks: Sequence[np.ndarray | None] | None = None,
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
        masks: each detection's mask (a detector that predicts masks): filled on the first panel, and outlined on
            the detection's own panel under its points.
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
    view.imshow(draw_detections(image, boxes, labels, scores, classes, empty, masks))
    view.set_title(f"{n} detection{'' if n == 1 else 's'}" if n else empty, fontsize=size, fontfamily=fonts)
    view.set_axis_off()
    area = DOT_AREA * (cell * 72) ** 2  # points^2 of weight 1: a share of the panel
    colours = [POINT_COLOURS[g % len(POINT_COLOURS)] for g in range(len(group_names))]
    for k in range(n):
        ax = figure.add_subplot(layout[k // columns, 1 + k % columns])
        ax.imshow(base.convert("L").convert("RGB"), alpha=0.75)  # grey, so that the coloured dots stand out
        mark = Image.new("RGBA", base.size, (0, 0, 0, 0))
        colour = _colour(labels[k], palette)  # the label where it stands in the first panel's picture
        if masks is not None and masks[k] is not None:  # the object's mask under its box and points
            mark = _mask_mark(mark, masks[k], colour, factor)
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
