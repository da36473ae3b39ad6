"""Where a vision transformer looks: class-token attention of one layer, attention rollout across layers, and the
heat map drawn over the image.

Attention rollout: "Quantifying Attention Flow in Transformers", Abnar & Zuidema, arXiv:2005.00928. Each layer's
attention (heads fused) is mixed with the identity for the residual connection, A' = (A + I) / 2, rows
renormalised, and the layers are multiplied from the last to the first: R = A'_L ... A'_1.

The weights come from `vitkit.capture_attention`, so every attention backend works. `attention_figure` draws them
as a matplotlib figure (the image beside its map, a colour bar, a title naming the model, the maps and the
prediction); the figure helpers at the end of this file (fonts that cover a text, a figure as a PIL image, saving
into a new folder) serve the other figures of `vitkit.viz` too.
Letters: B batch, h heads, L layers, N tokens (P prefix tokens, then the Hp x Wp patch grid).
"""

from __future__ import annotations

import functools
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from vitkit.data import preprocess
from vitkit.layers import capture_attention, to_2tuple
from vitkit.models.interface import require_model
from vitkit.models.registry import family_of

if TYPE_CHECKING:
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

# A perceptually ordered dark-blue -> teal -> yellow colour map (viridis' end points and three inner stops).
COLORMAP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
FONT = "DejaVu Sans"  # matplotlib's own font (Latin, Greek, Cyrillic); installed fonts are added for other scripts
DPI = 100  # pixels per inch of the figures drawn here
HEADS_PER_ROW = 6  # `head="all"` wraps the heads of a layer into rows of at most this many maps


def _fuse_heads(attn: torch.Tensor, head: int | None) -> torch.Tensor:
    """(B, h, N, N) -> (B, N, N): one head, or the mean over heads when `head` is None."""
    if head is None:
        return attn.mean(dim=1)
    return attn[:, _check_index(head, attn.shape[1], "head", f"{attn.shape[1]} heads")]


def _query_row(attn: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
    """(B, N, N) -> (B, Hp, Wp): the class token's row over the patch tokens, or the mean row without prefix tokens."""
    B, N, _ = attn.shape
    Hp, Wp = grid
    if N != num_prefix_tokens + Hp * Wp:
        raise ValueError(
            f"attention over {N} tokens does not match {num_prefix_tokens} prefix tokens and a {Hp}x{Wp} grid "
            "(attention maps need a model whose layers attend over the whole image, such as ViT / DeiT)"
        )
    row = attn[:, 0] if num_prefix_tokens > 0 else attn.mean(dim=1)  # (B, N)
    return row[:, num_prefix_tokens:].reshape(B, Hp, Wp)  # (B, Hp, Wp)


def cls_attention(
    attn: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int], head: int | None = None
) -> torch.Tensor:
    """How much the class token attends to each patch in one layer: (B, h, N, N) -> (B, Hp, Wp).

    Args:
        attn: one layer's attention weights, as captured by `vitkit.capture_attention`.
        num_prefix_tokens: class / distillation tokens before the patch tokens; with none, the mean attention
            each patch receives from all tokens is used.
        grid: the patch grid (Hp, Wp).
        head: one head, or None for the mean over heads.
    """
    return _query_row(_fuse_heads(attn, head), num_prefix_tokens, grid)


def attention_rollout(
    attns: list[torch.Tensor], num_prefix_tokens: int, grid: tuple[int, int], head: int | None = None
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema) of layers `attns` (first to last, each (B, h, N, N)) -> (B, Hp, Wp).

    `head` picks one head in every layer instead of the mean over heads.
    """
    if not attns:
        raise ValueError("attention rollout needs at least one layer")
    rollout = None
    for attn in attns:
        fused = _fuse_heads(attn.float(), head)  # (B, N, N)
        eye = torch.eye(fused.shape[-1], device=fused.device)
        mixed = (fused + eye) / 2  # the residual path carries the token itself
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout  # (B, N, N)
    return _query_row(rollout, num_prefix_tokens, grid)


def _check_index(index: int, count: int, name: str, owner: str) -> int:
    """`index` (negative from the end) of one of `count` things (`name` "head" of `owner` "4 heads") as
    0..count-1; ValueError naming the valid range otherwise."""
    if not -count <= index < count:
        valid = f"0..{count - 1}, or -{count}..-1 from the end" if count > 1 else "0 or -1"
        raise ValueError(f"{name} {index} is out of range for {owner} (valid: {valid})")
    return index % count


def _capture(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], int, tuple[int, int]]:
    """One forward pass of `model` on `images` (B, C, H, W) in evaluation mode with its attention recorded:
    (output, each attention layer's weights (B, h, N, N) from first to last, prefix tokens P, grid (Hp, Wp))."""
    tokens = require_model(model, "attention maps").token_grid(tuple(images.shape[-2:]))
    if tokens is None:
        raise ValueError(
            f"{type(model).__name__} has no token grid for attention maps: its attention layers do not all attend "
            "over the whole image on one grid (attention maps need a model such as ViT / DeiT)"
        )
    prefix, grid = tokens
    was_training = model.training
    model.eval()
    with torch.no_grad(), capture_attention(model) as maps:
        output = model(images)
    model.train(was_training)
    return output, list(maps.values()), prefix, grid


def attention_map(
    model: nn.Module, images: torch.Tensor, layer: int = -1, head: int | None = None, rollout: bool = False
) -> torch.Tensor:
    """Run `model` on `images` (B, C, H, W) and return its attention over the patch grid (B, Hp, Wp).

    Args:
        model: a vitkit model whose attention layers all attend over one token grid of the whole image
            (`token_grid` is not None: ViT / DeiT; Swin's windows and BoTNet's shrinking maps are refused).
        layer: the attention layer (an index into the model's attention layers, negative from the end), ignored
            with `rollout`.
        head: one head, or None for the mean over heads.
        rollout: attention rollout across all layers instead of one layer's class-token attention.
    """
    _, layers, prefix, grid = _capture(model, images)
    if rollout:
        return attention_rollout(layers, prefix, grid, head)
    _check_index(layer, len(layers), "layer", f"a model with {len(layers)} attention layers")
    return cls_attention(layers[layer], prefix, grid, head)


def colorize(values: torch.Tensor, low: float | None = None, high: float | None = None) -> torch.Tensor:
    """Values (...) -> uint8 RGB (..., 3) through `COLORMAP`, `low` and `high` (default: min and max) at the ends."""
    low = values.min().item() if low is None else low
    high = values.max().item() if high is None else high
    scaled = ((values - low) / (high - low)).clamp(0, 1) if high > low else torch.zeros_like(values)
    stops = torch.tensor(COLORMAP, dtype=torch.float32)  # (S, 3)
    position = scaled.float() * (len(COLORMAP) - 1)
    lower = position.floor().long().clamp(max=len(COLORMAP) - 2)
    weight = (position - lower).unsqueeze(-1)  # (..., 1)
    rgb = stops[lower] * (1 - weight) + stops[lower + 1] * weight  # (..., 3)
    return rgb.round().to(torch.uint8)


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def _upsample(heat: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A map (Hp, Wp) resized (bilinear) to `size` (H, W)."""
    return F.interpolate(heat[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]


def overlay(image: Image.Image, heat: torch.Tensor, alpha: float = 0.5) -> Image.Image:
    """`image` with the heat map (Hp, Wp) upsampled (bilinear) to its size, coloured and blended with weight `alpha`."""
    _check_alpha(alpha)
    upsampled = _upsample(heat, (image.height, image.width))
    colours = Image.fromarray(colorize(upsampled).numpy())  # (H, W, 3) uint8: RGB
    return Image.blend(image.convert("RGB"), colours, alpha)


def model_view(image: Image.Image, img_size: tuple[int, int], min_side: int = 224) -> Image.Image:
    """The part of `image` a model of `img_size` sees in evaluation (shorter side resized, centre crop), drawn at
    a whole multiple of `img_size` at least `min_side` pixels high so that small inputs stay visible."""
    scale = max(1, math.ceil(min_side / min(img_size)))
    H, W = img_size[0] * scale, img_size[1] * scale
    factor = max(H / image.height, W / image.width)
    resized = image.convert("RGB").resize(
        (max(W, round(image.width * factor)), max(H, round(image.height * factor))), Image.Resampling.BICUBIC
    )
    left, top = (resized.width - W) // 2, (resized.height - H) // 2
    return resized.crop((left, top, left + W, top + H))


def attention_overlay(
    model: nn.Module,
    image: Image.Image,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    layer: int = -1,
    head: int | None = None,
    rollout: bool = False,
    alpha: float = 0.5,
) -> Image.Image:
    """`image` as `model` sees it (`model_view`) with its attention map (`attention_map`) drawn over it.

    `mean` and `std` are the normalisation statistics of the model's training data (`vitkit.data.DataInfo`).
    """
    img_size = to_2tuple(require_model(model, "attention maps").config.img_size)
    device = next(model.parameters()).device
    pixels = preprocess(image, img_size, model.config.in_chans, mean, std)[None].to(device)  # (1, C, H, W)
    heat = attention_map(model, pixels, layer, head, rollout)[0].cpu()  # (Hp, Wp)
    return overlay(model_view(image, img_size), heat, alpha)


@dataclass(frozen=True)
class AttentionMaps:
    """One image's attention maps as `draw_attention` draws them (made by `attention_maps`)."""

    view: Image.Image  # the image as the model sees it (`model_view`), RGB
    heats: torch.Tensor  # (n, Hp, Wp): the maps, in reading order
    titles: tuple[str, ...]  # one per map: "mean of 2 heads", "head 3", "layer 1, head 0", "rollout"
    columns: int  # maps per row of the figure
    model: str  # the model in words: "runs/x/final: vit, 2 layers x 2 heads"
    what: str  # the maps in words: "layer 1 (of 0..1), mean of 2 heads", "attention rollout over 2 layers", ...
    values: str  # what a map's values are (the colour bar's label)
    prediction: tuple[str, float] | None  # (class, probability) of a classifier; None for a model without one
    panels: tuple[Image.Image, ...] | None = None  # the picture under each map (default: `view` under every one)
    marks: tuple[Image.Image, ...] | None = None  # RGBA pictures drawn over each map (a detection's box), or None
    view_title: str = "input (as the model sees it)"  # the first panel's title


def _check_options(layer: int | None, head: int | str | None, rollout: bool, grid: bool) -> None:
    """Refuse the combinations in which an option would be ignored."""
    if isinstance(head, str) and head not in ("mean", "all"):
        raise ValueError(f"head must be an index, 'mean' or 'all', got {head!r}")
    if rollout and grid:
        raise ValueError(
            "rollout and grid do not combine: rollout is one map through all layers, a grid one map per layer and head"
        )
    if rollout and layer is not None:
        raise ValueError(f"layer {layer} does not apply to attention rollout, which runs through every layer")
    if rollout and head not in (None, "mean"):
        raise ValueError(
            f"head {head} does not apply to attention rollout, which takes the mean of the heads of every layer"
        )
    if grid and layer is not None:
        raise ValueError(f"layer {layer} does not apply to a grid, which draws every layer")
    if grid and head is not None:
        raise ValueError(f"head {head} does not apply to a grid, which draws every head of every layer")


def attention_maps(
    model: nn.Module,
    image: Image.Image,
    mean: Sequence[float],
    std: Sequence[float],
    layer: int | None = None,
    head: int | str | None = None,
    rollout: bool = False,
    grid: bool = False,
    class_names: Sequence[str] | None = None,
    name: str | None = None,
) -> AttentionMaps:
    """The attention maps of `model` on `image` (one forward pass), with the prediction and the words to title them.

    Args:
        model: a vitkit model whose attention layers attend over one token grid of the whole image (ViT / DeiT).
        image: any PIL image; it is preprocessed as in evaluation (`vitkit.data.preprocess`).
        mean, std: the normalisation the model was trained with.
        layer: one attention layer, negative from the end (default: the last); not with `rollout` or `grid`.
        head: one head index, "mean" (the default) or "all" (one map per head of the layer); with `rollout` only
            "mean", with `grid` none.
        rollout: attention rollout across all layers (heads averaged) instead of one layer.
        grid: every layer (rows) x every head (columns).
        class_names: one per class of the classifier, in label order (default: the class index).
        name: the model in the title (default: its family).
    """
    _check_options(layer, head, rollout, grid)
    config = require_model(model, "attention maps").config
    num_classes = getattr(config, "num_classes", 0)
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for a model with {num_classes} classes")
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    pixels = preprocess(image, img_size, config.in_chans, tuple(mean), tuple(std))[None].to(device)  # (1, C, H, W)
    output, layers, prefix, token_grid = _capture(model, pixels)
    layers = [attn.float().cpu() for attn in layers]  # each (1, h, N, N)
    L, h = len(layers), layers[0].shape[1]
    index = _check_index(-1 if layer is None else layer, L, "layer", f"a model with {L} attention layers")
    of_layers = f"layer {index} (of 0..{L - 1})"
    if rollout:
        heats = attention_rollout(layers, prefix, token_grid)  # (1, Hp, Wp)
        titles, columns, what = ("rollout",), 1, f"attention rollout over {L} layers, mean of {h} heads"
    elif grid:
        heats = torch.cat([cls_attention(a, prefix, token_grid, j) for a in layers for j in range(h)])  # (L h, Hp, Wp)
        titles = tuple(f"layer {i}, head {j}" for i in range(L) for j in range(h))
        columns, what = h, "every layer (rows) and head (columns)"
    elif head == "all":
        heats = torch.cat([cls_attention(layers[index], prefix, token_grid, j) for j in range(h)])  # (h, Hp, Wp)
        titles = tuple(f"head {j}" for j in range(h))
        columns, what = math.ceil(h / math.ceil(h / HEADS_PER_ROW)), f"{of_layers}, each of {h} heads"
    else:
        one = None if head in (None, "mean") else _check_index(int(head), h, "head", f"{h} heads")
        heats = cls_attention(layers[index], prefix, token_grid, one)  # (1, Hp, Wp)
        which = f"mean of {h} heads" if one is None else f"head {one} of {h}"
        titles, columns, what = (which,), 1, f"{of_layers}, {which}"
    if rollout:
        values = "rollout: share of the class token's attention" if prefix else "rollout: mean share of each patch"
    else:
        values = "attention of the class token" if prefix else "mean attention each patch receives"
    prediction = None
    if num_classes > 0:
        probabilities = output.float().softmax(dim=-1)[0].cpu()  # (K,)
        k = int(probabilities.argmax())
        prediction = (class_names[k] if class_names is not None else str(k), float(probabilities[k]))
    described = f"{family_of(model).name}, {L} layers x {h} heads, {token_grid[0]}x{token_grid[1]} patches"
    return AttentionMaps(
        view=model_view(image, img_size),
        heats=heats,
        titles=titles,
        columns=columns,
        model=f"{name}: {described}" if name else described,
        what=what,
        values=values,
        prediction=prediction,
    )


def draw_attention(maps: AttentionMaps, alpha: float = 0.5) -> Figure:
    """`maps` as a matplotlib figure: the image as the model sees it, then each map blended over it (or over its
    own picture, `maps.panels`) with weight `alpha` and `maps.marks` on top (titled, `maps.columns` a row), one
    colour bar for all of them
    (one scale, from the smallest to the largest value shown), and a title naming the model, the maps and the
    prediction. Without maps (a detector that found nothing) the figure is the first panel and the title."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    _check_alpha(alpha)
    n, columns = len(maps.heats), maps.columns
    rows = max(1, math.ceil(n / columns))
    title = f"{maps.model}\n{maps.what}"
    if maps.prediction is not None:
        title += f"  ·  predicted {maps.prediction[0]} ({maps.prediction[1]:.1%})"
    fonts, missing = fonts_for([title, *maps.titles])
    title = spell(title, missing)
    cell = max(1.4, min(3.0, 20 / (columns + 1)))  # inches per map: larger when few, never below legibility
    figure = new_figure((columns + 1) * cell + 1.2, rows * cell + 1.0)
    layout = figure.add_gridspec(rows, columns + 1)
    low, high = (float(maps.heats.min()), float(maps.heats.max())) if n else (0.0, 1.0)
    norm, cmap = Normalize(low, high if high > low else low + 1e-6), colormap()
    size = 9 if cell >= 2 else 7
    view = figure.add_subplot(layout[0, 0])
    view.imshow(maps.view)
    view.set_title(maps.view_title, fontsize=size, fontfamily=fonts)
    view.set_axis_off()
    panels = [view]
    for k, (heat, text) in enumerate(zip(maps.heats, maps.titles, strict=True)):
        ax = figure.add_subplot(layout[k // columns, 1 + k % columns])
        under = maps.view if maps.panels is None else maps.panels[k]
        ax.imshow(under)
        ax.imshow(_upsample(heat, (under.height, under.width)).numpy(), cmap=cmap, norm=norm, alpha=alpha)
        if maps.marks is not None:
            ax.imshow(maps.marks[k])  # transparent but for the marks: drawn unblended over the map
        ax.set_title(text, fontsize=size, fontfamily=fonts, parse_math=False)
        ax.set_axis_off()
        panels.append(ax)
    if n:
        bar = figure.colorbar(ScalarMappable(norm, cmap), ax=panels, shrink=0.9 if rows > 1 else 0.8, aspect=25)
        bar.set_label(maps.values, fontsize=size)
    figure.suptitle(title, fontsize=10 if cell >= 2 else 9, fontfamily=fonts, parse_math=False)
    return figure


def attention_figure(
    model: nn.Module,
    image: Image.Image,
    mean: Sequence[float],
    std: Sequence[float],
    layer: int | None = None,
    head: int | str | None = None,
    rollout: bool = False,
    grid: bool = False,
    class_names: Sequence[str] | None = None,
    name: str | None = None,
    alpha: float = 0.5,
) -> tuple[Figure, AttentionMaps]:
    """`draw_attention(attention_maps(...), alpha)`: (the figure, the maps it shows). Arguments as for
    `attention_maps`; save the figure with `save_picture` (or its `savefig`)."""
    _check_alpha(alpha)
    maps = attention_maps(model, image, mean, std, layer, head, rollout, grid, class_names, name)
    return draw_attention(maps, alpha), maps


def colormap() -> Colormap:
    """`COLORMAP` as a matplotlib colour map (the stops evenly spaced, linear between them, as `colorize`)."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("vitkit", [tuple(c / 255 for c in rgb) for rgb in COLORMAP])


def new_figure(width: float, height: float, dpi: int = DPI) -> Figure:
    """An empty matplotlib figure of `width` x `height` inches, drawn at `dpi` pixels per inch, laid out by
    matplotlib's constrained layout. Made without pyplot, so nothing global (backend, open figures) is touched."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=dpi, layout="constrained")


def figure_image(figure: Figure) -> Image.Image:
    """A matplotlib figure drawn at its dpi as an RGB PIL image."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi, facecolor="white")
    buffer.seek(0)
    with Image.open(buffer) as image:
        return image.convert("RGB")


def save_picture(picture: Image.Image | Figure, path: str | os.PathLike) -> Path:
    """Write a PIL image or a matplotlib figure to `path`, in the format its suffix names (.png, .jpg, ...; a
    figure also .pdf, .svg), creating its folder. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder: expected a file name such as {path / 'attention.png'}")
    if not path.suffix:
        raise ValueError(f"{path} has no suffix to tell the picture's format: expected a name such as {path}.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(picture, Image.Image):
        picture.save(path)
    else:
        picture.savefig(path, dpi=picture.dpi, facecolor="white")
    return path


@functools.cache
def _characters(font_path: str) -> frozenset[int]:
    """The code points a font file draws."""
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(font_path).get_charmap())


def fonts_for(texts: Sequence[str]) -> tuple[list[str], str]:
    """(font families that together draw `texts`: `FONT` first, then installed fonts for the characters it lacks,
    for matplotlib's per-glyph fallback; the characters no installed font draws, in order of first appearance)."""
    from matplotlib import font_manager

    needed = dict.fromkeys(c for text in texts for c in text if c.isprintable() and not c.isspace())
    missing = [c for c in needed if ord(c) not in _characters(font_manager.findfont(FONT))]
    families = [FONT]
    for entry in font_manager.fontManager.ttflist if missing else ():
        if entry.name in families or entry.name.startswith("Last Resort"):  # matplotlib's placeholder boxes
            continue
        try:
            drawn = _characters(entry.fname)
        except (OSError, RuntimeError):  # a font file FreeType cannot read
            continue
        if any(ord(c) in drawn for c in missing):
            families.append(entry.name)
            missing = [c for c in missing if ord(c) not in drawn]
            if not missing:
                break
    return families, "".join(missing)


def spell(text: str, missing: str) -> str:
    """`text` with each character of `missing` (no installed font draws it) written as its code point, <U+732B>."""
    return "".join(f"<U+{ord(c):04X}>" if c in missing else c for c in text)
