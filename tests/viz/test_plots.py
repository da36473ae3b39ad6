"""Plots: the cost scaling plot (matplotlib) drawn from `vitkit.analysis.report.scaling` points."""

from __future__ import annotations

import pytest
from PIL import Image

from vitkit.analysis.report import ScalePoint, crossover
from vitkit.viz import plot_scaling


def test_plot_scaling_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    points = [
        ScalePoint(side, (side // 16) ** 2, side**3, 100 * side**2, side**2, 2 * side**2) for side in (64, 128, 256)
    ]
    assert crossover(points) == points[1]  # 128^3 >= 100 * 128^2, and not at 64
    path = tmp_path / "scaling.png"
    plot_scaling(points, str(path), "a model")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1210, 462)  # 11 x 4.2 inches at 110 dpi
