"""Attention drawn: heat maps coloured and blended over an image, and the attention figure (`draw_attention`: the
image as the model sees it beside its maps, one colour bar, a title naming the model, the maps and the prediction).

The maps themselves, an `AttentionMaps`, come from `vitkit.infer.attention_maps` (a classifier's class-token
attention or rollout; for a model with registers, with the attention that goes to the tokens before the patches,
`PrefixShares`, written under each map) or `vitkit.viz.detection.object_attention_maps` (a detector's objects).
The figure helpers at the end of this file (fonts that cover a text, a figure as a PIL image, saving into a new
folder) serve the other figures of `vitkit.viz` too.

Letters: Hp, Wp the map's size, H, W the picture's, n maps.
"""

from __future__ import annotations

import functools
import io
import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from PIL import Image

from vitkit.data.sources import IMAGE_EXTENSIONS
from vitkit.data.transforms import Framing, convert_image

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

# A perceptually ordered dark-blue -> teal -> yellow colour map (viridis' end points and three inner stops).
COLORMAP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
FONT = "DejaVu Sans"  # matplotlib's own font (Latin, Greek, Cyrillic); installed fonts are added for other scripts
DPI = 100  # pixels per inch of the figures drawn here


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


def check_alpha(alpha: float) -> None:
    """ValueError unless `alpha`, the weight of a heat map blended over a picture, is in [0, 1]."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def _upsample(heat: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A map (Hp, Wp) resized (bilinear) to `size` (H, W)."""
    return F.interpolate(heat[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]


def overlay(image: Image.Image, heat: torch.Tensor, alpha: float = 0.5) -> Image.Image:
    """`image` with the heat map (Hp, Wp) upsampled (bilinear) to its size, coloured and blended with weight `alpha`."""
    check_alpha(alpha)
    upsampled = _upsample(heat, (image.height, image.width))
    colours = Image.fromarray(colorize(upsampled).numpy())  # (H, W, 3) uint8: RGB
    return Image.blend(image.convert("RGB"), colours, alpha)


def model_view(
    image: Image.Image,
    img_size: tuple[int, int],
    min_side: int = 224,
    channels: int = 3,
    framing: Framing | None = None,
) -> Image.Image:
    """The part of `image` a model of `img_size` and `channels` sees in evaluation (`vitkit.data.eval_transform`:
    its channels by `convert_image`, transparency on white; resized and centre-cropped as `framing` says, by default
    to cover), as RGB, drawn at a whole multiple of `img_size` at least `min_side` pixels high so that small inputs
    stay visible."""
    scale = max(1, math.ceil(min_side / min(img_size)))
    H, W = img_size[0] * scale, img_size[1] * scale
    box = (framing or Framing()).crop_box((image.height, image.width), img_size)
    return convert_image(image, channels).convert("RGB").resize((W, H), Image.Resampling.BICUBIC, box=box)


@dataclass(frozen=True)
class PrefixShares:
    """The attention a ViT's maps leave out, per map: what goes to each token before the patches (class,
    distillation, registers). Drawn under the maps of a model with registers ("Vision Transformers Need Registers",
    arXiv:2309.16588: there the registers take the attention that artifact patches take without them)."""

    names: tuple[str, ...]  # the P prefix tokens in order: "class", "distillation", "register 0", ...
    query: str  # whose attention the maps show: "class token", or "all tokens" (their mean) without one
    shares: torch.Tensor  # (n, P): each map's query's attention to each prefix token; its map holds the rest
    from_patches: torch.Tensor  # (n, P): the patch tokens' mean attention to each prefix token (not drawn)
    caption: str  # what the numbers under the maps are, the last line of the figure's title


@dataclass(frozen=True)
class AttentionMaps:
    """One image's attention maps as `draw_attention` draws them (made by `vitkit.infer.attention_maps` or
    `vitkit.viz.detection.object_attention_maps`)."""

    view: Image.Image  # the image as the model sees it (`model_view`), RGB
    heats: torch.Tensor  # (n, Hp, Wp): the maps, in reading order
    titles: tuple[str, ...]  # one per map: "mean of 2 heads", "head 3", "layer 1, head 0", "rollout"
    columns: int  # maps per row of the figure
    model: str  # the model in words: "runs/x/final: ViT, 2 layers x 2 heads"
    what: str  # the maps in words: "layer 1 (of 0..1), mean of 2 heads", "attention rollout over 2 layers", ...
    values: str  # what a map's values are (the colour bar's label)
    prediction: tuple[str, float] | None  # (class, probability) of a classifier; None for a model without one
    panels: tuple[Image.Image, ...] | None = None  # the picture under each map (default: `view` under every one)
    marks: tuple[Image.Image, ...] | None = None  # RGBA pictures drawn over each map (a detection's box), or None
    view_title: str = "input (as the model sees it)"  # the first panel's title
    prefix: PrefixShares | None = None  # the attention to the tokens before the patches, or None: not shown


def draw_attention(maps: AttentionMaps, alpha: float = 0.5) -> Figure:
    """`maps` as a matplotlib figure: the image as the model sees it, then each map blended over it (or over its
    own picture, `maps.panels`) with weight `alpha` and `maps.marks` on top (titled, `maps.columns` a row), one
    colour bar for all of them (one scale, from the smallest to the largest value shown), and a title naming the
    model, the maps and the prediction. With `maps.prefix`, each map's shares of the tokens before the patches are
    written under it (`share_note`), and their caption ends the title. Without maps (a detector that found
    nothing) the figure is the first panel and the title."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    check_alpha(alpha)
    n, columns = len(maps.heats), maps.columns
    rows = max(1, math.ceil(n / columns))
    title = f"{maps.model}\n{maps.what}"
    if maps.prediction is not None:
        title += f"  ·  predicted {maps.prediction[0]} ({maps.prediction[1]:.1%})"
    if maps.prefix is not None:
        title += f"\n{maps.prefix.caption}"
    fonts, missing = fonts_for([title, *maps.titles])
    title = spell(title, missing)
    cell = max(1.4, min(3.0, 20 / (columns + 1)))  # inches per map: larger when few, never below legibility
    shown = columns + 1 if n else 1  # without maps, the first panel alone
    width = shown * cell + (1.2 if n else 0.0)
    if not n:
        width = max(width, EMPTY_FIGURE_WIDTH)
    title = wrap_title(title, width, 10 if cell >= 2 else 9)
    size = 9 if cell >= 2 else 7
    notes = _notes(maps, cell, size - 1)
    lines = rows * max((note.count("\n") + 1 for note in notes), default=0)  # under each row of maps
    height = rows * cell + 0.6 + 0.17 * title.count("\n") + lines * (size - 1) * NOTE_LEADING / 72
    figure = new_figure(width, height)
    layout = figure.add_gridspec(rows, shown)
    low, high = (float(maps.heats.min()), float(maps.heats.max())) if n else (0.0, 1.0)
    norm, cmap = Normalize(low, high if high > low else low + 1e-6), colormap()
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
        if notes:
            _write_under(ax, notes[k], size - 1)
        panels.append(ax)
    if n:
        bar = figure.colorbar(ScalarMappable(norm, cmap), ax=panels, shrink=0.9 if rows > 1 else 0.8, aspect=25)
        bar.set_label(maps.values, fontsize=size)
    figure.suptitle(title, fontsize=10 if cell >= 2 else 9, fontfamily=fonts, parse_math=False)
    return figure


EMPTY_FIGURE_WIDTH = 4.5  # inches of a figure of one panel (a detector that found nothing), for its title
NOTE_LEADING = 1.6  # a line of the text under a panel, in font sizes
NBSP = "\u00a0"  # joins a name to its number in that text, so that wrapping never parts them


def share_note(names: Sequence[str], shares: torch.Tensor) -> str:
    """The shares (P,) of the prefix tokens `names` in a few words: the registers' sum beside the other tokens'
    shares, then each register's below, without the leading zero ("registers 0.31 · class 0.02",
    "r0 .12  r1 .08  r2 .06  r3 .05")."""
    registers, others, total = [], [], 0.0
    for name, share in zip(names, shares.tolist(), strict=True):
        if name.startswith("register "):
            registers.append(f"r{name.removeprefix('register ')}{NBSP}{f'{share:.2f}'.removeprefix('0')}")
            total += share
        else:
            others.append(f"{name}{NBSP}{share:.2f}")
    if not registers:
        return " · ".join(others)
    return " · ".join([f"registers{NBSP}{total:.2f}", *others]) + "\n" + "  ".join(registers)


def _notes(maps: AttentionMaps, cell: float, size: float) -> list[str]:
    """The text under each map (`share_note`), wrapped to a panel `cell` inches wide at `size` points; none without
    `maps.prefix`."""
    if maps.prefix is None:
        return []
    return [wrap_title(share_note(maps.prefix.names, shares), cell, size) for shares in maps.prefix.shares]


def _write_under(ax: Axes, text: str, size: float) -> None:
    """`text` centred under the panel `ax` (inside the figure's layout, which makes room for it)."""
    ax.text(
        0.5,
        -0.02,
        text,
        transform=ax.transAxes,
        ha="center",
        va="top",
        fontsize=size,
        linespacing=1.15,
        fontfamily=FONT,
        parse_math=False,
    )


def wrap_title(title: str, width: float, fontsize: float) -> str:
    """`title` with each line broken at spaces to fit a figure `width` inches wide at `fontsize` points (a
    character taken as 0.6 of the font size wide), so that a narrow figure does not cut its title off."""
    chars = max(20, int(width * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars, break_long_words=False) for line in title.split("\n"))


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


# The picture formats help texts and errors name: a few of those PIL writes, and those a matplotlib figure adds
COMMON_IMAGE_FORMATS = (".png", ".jpg")
COMMON_FIGURE_FORMATS = (".pdf", ".svg")


def picture_formats(figure: bool = False) -> str:
    """The common picture formats a picture (with `figure`, a matplotlib figure) is written in, for help texts and
    errors: ".png, .jpg" (".png, .jpg, .pdf, .svg"); `check_picture_path` takes these and every other that PIL (and
    matplotlib) write."""
    return ", ".join(COMMON_IMAGE_FORMATS + (COMMON_FIGURE_FORMATS if figure else ()))


def writable_suffixes(figure: bool = False) -> set[str]:
    """The file suffixes a picture can be written under: every format PIL writes, and with `figure` matplotlib's."""
    formats = set(Image.registered_extensions())
    if figure:
        from matplotlib.backend_bases import FigureCanvasBase

        formats |= {f".{kind}" for kind in FigureCanvasBase.get_supported_filetypes()}
    return formats


def check_picture_path(path: str | os.PathLike, figure: bool = False) -> Path:
    """`path` as a Path when a picture can be written there, else IsADirectoryError / ValueError saying what is
    expected: a file name whose suffix names a format PIL writes (.png, .jpg, ...; for a matplotlib `figure` also
    matplotlib's: .pdf, .svg, ...: `writable_suffixes`). Commands call it before their work, so a wrong name costs
    nothing."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder: expected a file name such as {path / 'picture.png'}")
    if not path.suffix:
        raise ValueError(f"{path} has no suffix to tell the picture's format: expected a name such as {path}.png")
    if path.suffix.lower() not in writable_suffixes(figure):
        raise ValueError(
            f"{path}: {path.suffix} is not a picture format vitkit can write; use {picture_formats(figure)}"
        )
    return check_writable(path)


def check_writable(path: str | os.PathLike, folder: bool = False) -> Path:
    """`path` when a file (or with `folder`, a folder) can be made there: OSError naming the path and why not (an
    ancestor that is a file, or a folder this process may not write in). Called before any work is done."""
    path = Path(path)
    if not folder and path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a folder; give a file name")
    if folder and path.exists() and not path.is_dir():
        raise NotADirectoryError(f"cannot write into {path}: it is a file; give a folder")
    ancestor = path if folder and path.is_dir() else path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(f"cannot write {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {path}: this user may not write in {ancestor}")
    return path


MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".pdparams")  # weights, exports


def _model_file(path: Path) -> bool:
    """Whether `path`, in a model folder, is part of the model (its configs, weights or exports) rather than an
    output written there earlier (a picture, a report)."""
    return path.name.endswith("config.json") or path.suffix.lower() in MODEL_FILE_SUFFIXES


def check_keeps_inputs(path: str | os.PathLike, reads: Sequence[str | os.PathLike], flag: str) -> None:
    """ValueError when writing the file `path` would replace a file the command reads: one of `reads` (files), a
    model file (configs, weights) of a model folder among them (a folder holding a config.json), or an image below
    a folder among them.
    Called before any work, with the command's option `flag` ("--out") in the message."""
    target = Path(path)
    if not target.is_file():
        return  # nothing there to replace
    target = target.resolve()
    for item in reads:
        source = Path(item)
        if source.is_file() and source.resolve() == target:
            raise ValueError(
                f"{flag} {path} is {item}, which this command reads: writing it would replace it; choose another name"
            )
        if source.is_dir() and target.is_relative_to(source.resolve()):
            if (source / "config.json").is_file() and _model_file(target):
                raise ValueError(
                    f"{flag} {path} is a file of the model folder {item}, which this command reads: writing it "
                    "would replace it; choose a path outside that folder"
                )
            if target.suffix.lower() in IMAGE_EXTENSIONS:
                raise ValueError(
                    f"{flag} {path} is an image of {item}, which this command reads: writing it would replace it; "
                    "choose another name"
                )


def save_picture(picture: Image.Image | Figure, path: str | os.PathLike) -> Path:
    """Write a PIL image or a matplotlib figure to `path`, in the format its suffix names (.png, .jpg, ...; a
    figure also .pdf, .svg), creating its folder. Returns the path."""
    path = check_picture_path(path, figure=not isinstance(picture, Image.Image))
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(picture, Image.Image):
        picture.save(path)
    else:
        picture.savefig(path, dpi=picture.dpi, facecolor="white")
    return path


@functools.cache
def font_characters(font_path: str) -> frozenset[int]:
    """The code points a font file draws."""
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(font_path).get_charmap())


def fonts_for(texts: Sequence[str]) -> tuple[list[str], str]:
    """(font families that together draw `texts`: `FONT` first, then installed fonts for the characters it lacks,
    for matplotlib's per-glyph fallback; the characters no installed font draws, in order of first appearance)."""
    from matplotlib import font_manager

    needed = dict.fromkeys(c for text in texts for c in text if c.isprintable() and not c.isspace())
    missing = [c for c in needed if ord(c) not in font_characters(font_manager.findfont(FONT))]
    families = [FONT]
    for entry in font_manager.fontManager.ttflist if missing else ():
        if entry.name in families or entry.name.startswith("Last Resort"):  # matplotlib's placeholder boxes
            continue
        try:
            drawn = font_characters(entry.fname)
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
