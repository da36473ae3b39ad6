"""Training curves: the series drawn are the metrics lines' values, the picture is a whole PNG written atomically."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pytest
from PIL import Image

from vitkit.viz import write_curves
from vitkit.viz.curves import curve_series

BLUE, ORANGE = np.array([0x1F, 0x77, 0xB4]), np.array([0xFF, 0x7F, 0x0E])  # matplotlib's first two colours


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
    masks = [{**r, "segm_ap": 0.05, "segm_ap50": 0.2} for r in records]  # a detector with a mask head
    assert curve_series(masks)["metric"] == {
        "ap": ([2], [0.1]), "ap50": ([2], [0.3]), "segm_ap": ([1, 2], [0.05, 0.05]), "segm_ap50": ([1, 2], [0.2, 0.2])
    }  # fmt: skip


@pytest.mark.parametrize("epochs", [1, 12])
def test_write_curves_draws_a_png_in_place(tmp_path, saved_figures, epochs):
    saved = saved_figures
    path = tmp_path / "curves.png"
    path.write_bytes(b"an older picture")
    records = _classifier(epochs)
    assert write_curves(records, path) == path
    assert Image.open(path).size == (1000, 400)
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary file left beside it
    pixels = matplotlib.image.imread(path)[..., :3]  # (H, W, 3) in [0, 1]
    blue = (np.abs(pixels - BLUE / 255).sum(-1) < 0.1).sum()
    assert blue > 50  # the curves are drawn, not only the axes
    (figure,) = saved
    ax_loss, ax_metric = figure.axes
    logged = list(range(1, epochs + 1))
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax_loss.get_lines()}
    assert drawn == {
        "train": (logged, [r["train_loss"] for r in records]),
        "val": (logged, [r["val_loss"] for r in records]),
    }
    accuracy, best = ax_metric.get_lines()
    assert accuracy.get_label() == "val accuracy"
    assert (list(accuracy.get_xdata()), list(accuracy.get_ydata())) == (logged, [r["val_acc"] for r in records])
    assert (list(best.get_xdata()), list(best.get_ydata()), best.get_marker()) == ([epochs], [epochs / 10], "*")
    assert ax_metric.get_title() == f"validation accuracy (best {epochs / 10:.3f}, epoch {epochs})"
    assert (ax_loss.get_title(), ax_loss.get_ylabel(), ax_metric.get_ylabel()) == ("loss", "loss", "accuracy")
    assert ax_loss.get_xlabel() == ax_metric.get_xlabel() == "epoch"
    assert ax_loss.get_xlim() == ax_metric.get_xlim() == (0.5, epochs + 0.5)
    assert ax_metric.get_ylim() == (-0.02, 1.02)
    assert figure.get_suptitle() == f"training curves after {epochs} epoch{'s' if epochs > 1 else ''}"
    # the PNG is this figure: the validation loss's points (drawn last) in matplotlib's second colour where its
    # axes put them, the training loss's first point, clear of them, in its first
    points = [(epoch, loss, ORANGE) for epoch, loss in zip(*drawn["val"], strict=True)]
    for epoch, loss, colour in [*points, (1, records[0]["train_loss"], BLUE)]:
        column, row = ax_loss.transData.transform((epoch, loss))
        assert np.abs(pixels[round(pixels.shape[0] - row), round(column)] - colour / 255).max() <= 0.05, epoch


def test_no_records_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no metrics lines to draw"):
        write_curves([], tmp_path / "curves.png")
