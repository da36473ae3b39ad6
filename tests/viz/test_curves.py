"""Training curves: the series drawn are the metrics lines' values, the picture is a whole PNG written atomically."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pytest
from PIL import Image

from vitkit.viz import write_curves
from vitkit.viz.curves import curve_series


def _classifier(epochs: int) -> list[dict]:
    return [
        {"epoch": e, "train_loss": 2.3 * math.exp(-e / 4), "val_loss": 2.0 * math.exp(-e / 5), "val_acc": e / 10}
        for e in range(1, epochs + 1)
    ]


def test_series_are_the_logged_values():
    records = _classifier(3)
    panels = curve_series(records)
    assert panels["loss"] == {
        "train_loss": ([1, 2, 3], [r["train_loss"] for r in records]),
        "val_loss": ([1, 2, 3], [r["val_loss"] for r in records]),
    }
    assert panels["metric"] == {"val_acc": ([1, 2, 3], [0.1, 0.2, 0.3])}


def test_a_detectors_series_skip_epochs_with_nothing_to_score():
    records = [
        {"epoch": 1, "train_loss": 5.0, "loss_ce": 1.0, "ap": None, "ap50": None},
        {"epoch": 2, "train_loss": 4.0, "loss_ce": 0.9, "ap": 0.1, "ap50": 0.3},
    ]
    panels = curve_series(records)
    assert panels["loss"] == {"train_loss": ([1, 2], [5.0, 4.0])}  # no validation loss is logged
    assert panels["metric"] == {"ap": ([2], [0.1]), "ap50": ([2], [0.3])}


@pytest.mark.parametrize("epochs", [1, 12])
def test_write_curves_draws_a_png_in_place(tmp_path, epochs):
    path = tmp_path / "curves.png"
    path.write_bytes(b"an older picture")
    assert write_curves(_classifier(epochs), path) == path
    assert Image.open(path).size == (1000, 400)
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary file left beside it
    pixels = matplotlib.image.imread(path)[..., :3]  # (H, W, 3) in [0, 1]
    blue = (np.abs(pixels - np.array([0x1F, 0x77, 0xB4]) / 255).sum(-1) < 0.1).sum()  # matplotlib's first colour
    assert blue > 50  # the curves are drawn, not only the axes


def test_no_records_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no metrics lines to draw"):
        write_curves([], tmp_path / "curves.png")
