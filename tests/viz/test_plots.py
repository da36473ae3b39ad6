"""Plots: the cost scaling plot (matplotlib) drawn from `vitkit.analysis.report.scaling` points."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitkit.analysis.report import ScalePoint, crossover
from vitkit.viz import plot_scaling

BLUE = np.array([0x1F, 0x77, 0xB4])  # matplotlib's first colour


def test_plot_scaling_draws_the_points_in_a_png(tmp_path, saved_figures):
    pytest.importorskip("matplotlib")

    points = [
        ScalePoint(side, (side // 16) ** 2, side**3, 100 * side**2, side**2, 2 * side**2) for side in (64, 128, 256)
    ]
    assert crossover(points) == points[1]  # 128^3 >= 100 * 128^2, and not at 64
    saved = saved_figures
    path = tmp_path / "scaling.png"
    plot_scaling(points, str(path), "a model")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1210, 462)  # 11 x 4.2 inches at 110 dpi
        pixels = np.asarray(image.convert("RGB"), dtype=int)  # (H, W, 3)
    (figure,) = saved
    ax_flops, ax_mem = figure.axes
    sides = [64, 128, 256]
    assert (ax_flops.get_title(), ax_flops.get_xlabel(), ax_flops.get_ylabel()) == (
        "a model", "image side (px)", "GFLOPs per forward",
    )  # fmt: skip
    assert (ax_mem.get_title(), ax_mem.get_xlabel(), ax_mem.get_ylabel()) == (
        "activation memory", "image side (px)", "peak activations (MiB)",
    )  # fmt: skip
    assert ax_flops.get_yscale() == ax_mem.get_yscale() == "log"
    quadratic, linear, crossing = ax_flops.get_lines()
    assert list(quadratic.get_xdata()) == list(linear.get_xdata()) == sides
    assert list(quadratic.get_ydata()) == pytest.approx([s**3 / 1e9 for s in sides])
    assert list(linear.get_ydata()) == pytest.approx([100 * s**2 / 1e9 for s in sides])
    assert list(crossing.get_xdata()) == [128, 128]  # the vertical line at the crossover
    (note,) = ax_flops.texts
    assert note.get_text() == "N^2 terms dominate from 128px\n(64 tokens)" and note.xy == (128, 100 * 128**2 / 1e9)
    sdpa, math = ax_mem.get_lines()
    assert list(sdpa.get_xdata()) == list(math.get_xdata()) == sides
    assert list(sdpa.get_ydata()) == pytest.approx([s**2 / 2**20 for s in sides])
    assert list(math.get_ydata()) == pytest.approx([2 * s**2 / 2**20 for s in sides])
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in (ax_flops, ax_mem)]
    assert legends == [
        ["attention N^2 terms", "linear terms (qkv, proj, MLP, ...)"],
        ["sdpa (fused)", "math (reference, N x N)"],
    ]
    # the PNG is this figure: each panel's first curve has matplotlib's first colour at its ends (at 128 the
    # crossover's grey line crosses it)
    for ax, line in ((ax_flops, quadratic), (ax_mem, sdpa)):
        for x, y in zip(line.get_xdata()[::2], line.get_ydata()[::2], strict=True):
            column, row = ax.transData.transform((x, y))
            assert np.abs(pixels[round(pixels.shape[0] - row), round(column)] - BLUE).max() <= 12, (x, y)


@pytest.mark.parametrize("classes, boxed", [(21, (9, 15, 18)), (80, tuple(range(5)))])
def test_a_pr_plot_names_the_classes_without_ground_truth_within_the_figure(classes, boxed):
    """Many classes without ground truth (a VOC-named folder holding three of them; 75 of 80) are named in lines that
    stay inside the figure, the rest counted; the curves drawn take the palette's first colours in their order."""
    from matplotlib import colormaps

    from vitkit.viz.plots import ABSENT_LINES, pr_curves_figure

    names = [f"class name {i}" for i in range(classes)]
    recall = np.linspace(0, 1, 101)
    rows = [{"boxes": 2 if k in boxed else 0, "ap50": 0.5} for k in range(classes)]
    curves = [np.linspace(1, 0, 101) if k in boxed else np.full(101, -1.0) for k in range(classes)]
    figure = pr_curves_figure(recall, curves, names, rows)
    figure.canvas.draw()
    ax = figure.axes[0]
    title = ax.title.get_window_extent()
    assert 0 <= title.x0 and title.x1 <= figure.bbox.width
    lines = ax.get_title().splitlines()
    absent = classes - len(boxed)
    assert lines[1].startswith(f"(no ground truth for {absent}: class name ") and lines[-1].endswith(")")
    assert len(lines) <= 1 + ABSENT_LINES
    named = ax.get_title().count("class name ")
    assert named == absent or lines[-1].endswith(f" and {absent - named} more)")
    tab = "tab20" if len(boxed) > 10 else "tab10"
    assert [line.get_color() for line in ax.lines] == [colormaps[tab](k) for k in range(len(boxed))]
