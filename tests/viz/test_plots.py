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
