"""Plots (matplotlib): the confusion matrix of an evaluation, and cost and activation memory against image size."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from PIL import Image

from vitkit.analysis.report import ScalePoint, crossover
from vitkit.viz.attention import colormap, figure_image, fonts_for, new_figure, save_picture, spell

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_LABEL = 40  # characters of a class name shown on an axis; longer names end in "…"
MAX_MATRIX = 14.0  # inches: the matrix grows with the class count up to this side, its cells shrink beyond
CELL = 0.55  # inches per cell while the matrix fits in MAX_MATRIX (up to 25 classes)
MIN_FONT = 6.0  # points: tick labels smaller than this are thinned out (every n-th class) instead
LEGEND_FONT = 8.0  # points: the index -> name legend


def _text_width(text: str, points: float) -> float:
    """Inches a line of `text` takes at `points` (DejaVu Sans averages about 0.6 em per character)."""
    return len(text) * 0.6 * points / 72


@dataclass(frozen=True)
class _MatrixLayout:
    """How a confusion matrix of K classes is laid out: sizes in inches, fonts in points."""

    labels: list[str]  # the axes' label of each class: its name (cut to MAX_LABEL) or, `by_index`, its index
    by_index: bool  # the classes are labelled by index, named in a legend beside the matrix
    cell: float  # the side of a cell
    tick_font: float
    step: int  # every step-th class is labelled (1 unless the labels would be smaller than MIN_FONT)
    rotation: int  # of the x labels, in degrees
    legend: list[str]  # the legend's lines, a header first (empty without legend)
    legend_rows: int
    legend_columns: int
    legend_width: float
    width: float  # of the figure
    height: float


def _matrix_layout(classes: Sequence[str], missing: str) -> _MatrixLayout:
    """The layout of the confusion matrix of `classes`; with characters no font draws (`missing`), by index."""
    K = len(classes)
    by_index = bool(missing)
    labels = (
        [str(k) for k in range(K)]
        if by_index
        else [n if len(n) <= MAX_LABEL else n[: MAX_LABEL - 1] + "…" for n in classes]
    )
    cell = min(CELL, MAX_MATRIX / K)  # inches
    tick_font = min(10.0, cell * 72 * 0.6)
    step = math.ceil(MIN_FONT / tick_font) if tick_font < MIN_FONT else 1
    tick_font = max(tick_font, MIN_FONT)
    label_width = max(_text_width(label, tick_font) for label in labels[::step])
    rotation = 45 if K <= 30 else 90
    matrix = K * cell
    legend: list[str] = []
    legend_rows = legend_columns = 0
    legend_width = 0.0
    if by_index:
        legend_rows = max(10, math.floor((matrix + 1) / (LEGEND_FONT * 1.5 / 72)))
        legend_columns = math.ceil((K + 1) / legend_rows)
        legend = ["index  class", *(f"{k}  {spell(name, missing)}" for k, name in enumerate(classes))]
        column_width = max(_text_width(e, LEGEND_FONT) for e in legend) + 0.3
        legend_width = legend_columns * column_width
    return _MatrixLayout(
        labels=labels,
        by_index=by_index,
        cell=cell,
        tick_font=tick_font,
        step=step,
        rotation=rotation,
        legend=legend,
        legend_rows=legend_rows,
        legend_columns=legend_columns,
        legend_width=legend_width,
        width=max(4.5, matrix + label_width + 2.0 + legend_width),
        height=max(3.5, matrix + label_width * (0.75 if rotation == 45 else 1.0) + 1.4),
    )


def _label_axes(ax: Axes, layout: _MatrixLayout, fonts: list[str]) -> None:
    """Class labels on both axes (every `layout.step`-th class), and the axes' titles."""
    ticks = list(range(0, len(layout.labels), layout.step))
    names = [layout.labels[k] for k in ticks]
    rotation = layout.rotation
    ax.set_xticks(
        ticks,
        names,
        rotation=rotation,
        ha="right",
        va="top" if rotation == 45 else "center",
        rotation_mode="anchor",
        fontsize=layout.tick_font,
        fontfamily=fonts,
        parse_math=False,
    )
    ax.set_yticks(ticks, names, fontsize=layout.tick_font, fontfamily=fonts, parse_math=False)
    ax.set_xlabel("predicted class" + (" (index)" if layout.by_index else ""))
    ax.set_ylabel("true class" + (" (index)" if layout.by_index else ""))


def _write_counts(ax: Axes, counts: torch.Tensor, shares: torch.Tensor, cell: float) -> None:
    """Each cell's count (K, K) written in it, when the largest fits a cell of side `cell`."""
    K = len(counts)
    count_font = min(10.0, cell * 72 * 0.4)
    widest = len(str(int(counts.max()))) if K else 1
    if count_font < 5 or _text_width("0" * widest, count_font) > cell * 0.85:
        return
    for i in range(K):
        for j in range(K):
            ink = "white" if shares[i, j] < 0.5 else "black"  # readable on the dark and the light end of the map
            ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", color=ink, fontsize=count_font)


def _draw_legend(ax: Axes, layout: _MatrixLayout, fonts: list[str]) -> None:
    """The index -> name legend, in columns of `layout.legend_rows` lines."""
    ax.set_axis_off()
    for k, entry in enumerate(layout.legend):
        column, row = divmod(k, layout.legend_rows)
        ax.text(
            column / layout.legend_columns,
            1 - row / layout.legend_rows,
            entry,
            transform=ax.transAxes,
            va="top",
            fontsize=LEGEND_FONT,
            fontfamily=fonts,
            parse_math=False,
        )


def confusion_figure(confusion: torch.Tensor, classes: Sequence[str], title: str | None = None) -> Figure:
    """A confusion matrix (K, K) (rows: true class, columns: predicted class) as a matplotlib figure.

    Each cell is coloured by its share of the row (so every class reads on the same scale, shown by a colour bar)
    and shows its count where the count fits the cell. The figure grows with K; class names label both axes
    (the x labels rotated), in `FONT` and, for characters it lacks, any installed font that has them. Names
    with characters no installed font draws are replaced on the axes by their indices, and a legend beside the
    matrix maps each index to its name (those characters written as code points, <U+732B>). The title gives
    the accuracy (the diagonal's share of all images), after `title` when one is given.
    """
    K = len(classes)
    if tuple(confusion.shape) != (K, K):
        raise ValueError(f"confusion matrix of shape {tuple(confusion.shape)} does not match {K} classes")
    counts = confusion.detach().double().cpu()
    total, correct = int(counts.sum()), int(counts.trace())
    shares = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)  # (K, K)
    fonts, missing = fonts_for(list(classes))
    layout = _matrix_layout(classes, missing)
    figure = new_figure(layout.width, layout.height)
    if layout.by_index:
        grid = figure.add_gridspec(1, 2, width_ratios=(layout.width - layout.legend_width, layout.legend_width))
        ax = figure.add_subplot(grid[0, 0])
        _draw_legend(figure.add_subplot(grid[0, 1]), layout, fonts)
    else:
        ax = figure.add_subplot()
    image = ax.imshow(shares.numpy(), cmap=colormap(), vmin=0.0, vmax=1.0)
    _label_axes(ax, layout, fonts)
    _write_counts(ax, counts, shares, layout.cell)
    figure.colorbar(image, ax=ax, shrink=0.8, label="share of the true class's images")
    summary = f"accuracy {correct / total:.1%} ({correct} of {total} images, {K} classes)" if total else "no images"
    ax.set_title(f"{title}\n{summary}" if title else summary, fontfamily=fonts, parse_math=False)
    return figure


def confusion_image(confusion: torch.Tensor, classes: Sequence[str], title: str | None = None) -> Image.Image:
    """`confusion_figure` drawn as an RGB PIL image (e.g. ``confusion_image(c, names).save("confusion.png")``)."""
    return figure_image(confusion_figure(confusion, classes, title))


def plot_scaling(points: list[ScalePoint], path: str | os.PathLike, title: str) -> None:
    """Draw FLOPs (N^2 and linear terms) and peak activation memory against image side to a PNG (its folder made)."""
    sides = [p.side for p in points]
    figure = new_figure(11, 4.2, dpi=110)
    ax_flops, ax_mem = figure.subplots(1, 2)
    ax_flops.plot(sides, [p.quadratic_flops / 1e9 for p in points], "o-", label="attention N^2 terms")
    ax_flops.plot(sides, [p.linear_flops / 1e9 for p in points], "s-", label="linear terms (qkv, proj, MLP, ...)")
    cross = crossover(points)
    if cross is not None:
        ax_flops.axvline(cross.side, color="grey", linestyle="--")
        ax_flops.annotate(
            f"N^2 terms dominate from {cross.side}px\n({cross.tokens} tokens)",
            (cross.side, cross.linear_flops / 1e9),
            xytext=(12, -90),
            textcoords="offset points",
        )
    ax_flops.set(xlabel="image side (px)", ylabel="GFLOPs per forward", yscale="log", title=title)
    ax_flops.legend()
    ax_mem.plot(sides, [p.activation_bytes_sdpa / 2**20 for p in points], "o-", label="sdpa (fused)")
    ax_mem.plot(sides, [p.activation_bytes_math / 2**20 for p in points], "s-", label="math (reference, N x N)")
    ax_mem.set(xlabel="image side (px)", ylabel="peak activations (MiB)", yscale="log", title="activation memory")
    ax_mem.legend()
    save_picture(figure, path)


ABSENT_WIDTH = 70  # characters of a line of a precision-recall plot's title that fit beside its legend
ABSENT_LINES = 3  # lines of classes without ground truth it names before "and N more"


def _wrapped(lead: str, names: Sequence[str]) -> list[str]:
    """`lead` and `names`, comma-separated, in lines of at most ABSENT_WIDTH characters; past ABSENT_LINES lines the
    rest are counted ("and 12 more")."""
    lines, line = [], lead
    for i, name in enumerate(names):
        word = f" {name}" + ("," if i < len(names) - 1 else "")
        last = len(lines) == ABSENT_LINES - 1
        if len(line) + len(word) > ABSENT_WIDTH - (len(" and 99 more") if last else 0):
            if last:  # what is left, counted
                return [*lines, f"{line} and {len(names) - i} more"]
            lines, line = [*lines, line], word.lstrip()
        else:
            line += word
    return [*lines, line]


def pr_curves_figure(
    recall: Sequence[float],
    precision: Sequence[Sequence[float]],
    classes: Sequence[str],
    per_class: Sequence[dict],
    title: str | None = None,
) -> Figure:
    """A detector's precision-recall curve of each class at IoU 0.5 (COCO's interpolation, `CocoEvaluator.pr_curves`),
    one line per class labelled with its AP50 and box count; a class without ground truth is named, not drawn. With
    many classes the legend takes its own column."""
    from matplotlib import colormaps

    figure = new_figure(9 if len(classes) > 8 else 7, 5, dpi=110)
    fonts, missing = fonts_for(classes)
    ax = figure.subplots()
    drawn = sum(row["boxes"] > 0 for row in per_class)
    colours = colormaps["tab20" if drawn > 10 else "tab10"]  # in the order drawn: classes without boxes take none
    absent = []
    for name, curve, row in zip(classes, precision, per_class, strict=True):
        shown = spell(name[:MAX_LABEL], missing)
        if row["boxes"] == 0:
            absent.append(shown)
            continue
        ap50 = row["ap50"]
        boxes = f"{row['boxes']} box" + ("" if row["boxes"] == 1 else "es")
        label = f"{shown}  AP50 {ap50:.2f}  ({boxes})" if not math.isnan(ap50) else shown
        k = len(ax.lines)
        ax.plot(recall, curve, "-", color=colours(k % colours.N), linewidth=1.6, label=label)
    heading = title or "precision-recall at IoU 0.5, per class"
    if absent:
        heading += "\n(" + "\n".join(_wrapped(f"no ground truth for {len(absent)}:", absent)) + ")"
    # a curve along precision 0 (a class never found) sits above the axis, not under it
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1.01), ylim=(-0.02, 1.02), title=heading)
    ax.grid(alpha=0.3)
    if len(classes) > len(absent):
        ax.legend(
            loc="upper left" if len(classes) > 8 else "lower left",
            bbox_to_anchor=(1.02, 1.0) if len(classes) > 8 else None,
            prop={"family": fonts, "size": 8},
        )  # fmt: skip
    return figure


def pr_curves_image(
    recall: Sequence[float],
    precision: Sequence[Sequence[float]],
    classes: Sequence[str],
    per_class: Sequence[dict],
    title: str | None = None,
) -> Image.Image:
    """`pr_curves_figure` drawn as an RGB PIL image."""
    return figure_image(pr_curves_figure(recall, precision, classes, per_class, title))
