"""Training curves: the loss and the validation metric against epoch, from the lines of a run's metrics.jsonl
(`vitkit.train.loop`), drawn with matplotlib."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from vitkit.util import atomic_write

# Panel -> (metrics key, legend label), in drawing order; keys a run does not log are left out.
PANELS: dict[str, tuple[tuple[str, str], ...]] = {
    "loss": (("train_loss", "train"), ("val_loss", "val")),
    "metric": (
        ("val_acc", "val accuracy"), ("ap", "AP"), ("ap50", "AP50"), ("segm_ap", "mask AP"), ("segm_ap50", "mask AP50")
    ),
}

Series = dict[str, tuple[list[int], list[float]]]  # metrics key -> (epochs, values)


def curve_series(records: Iterable[Mapping[str, Any]]) -> dict[str, Series]:
    """The curves `write_curves` draws: panel ("loss", "metric") -> metrics key -> (epochs, values).

    Epochs whose value is missing or None (a detector's AP with nothing to score) are left out of that curve, and
    a curve without values is left out of its panel.
    """
    records = list(records)
    panels: dict[str, Series] = {}
    for panel, keys in PANELS.items():
        series: Series = {}
        for key, _ in keys:
            points = [(int(r["epoch"]), float(r[key])) for r in records if r.get(key) is not None]
            if points:
                series[key] = ([e for e, _ in points], [v for _, v in points])
        panels[panel] = series
    per_class: Series = {}  # a detector's AP per class ("ap/NAME"), drawn thin beside the overall
    for key in dict.fromkeys(k for r in records for k in r if k.startswith("ap/")):
        points = [(int(r["epoch"]), float(r[key])) for r in records if r.get(key) is not None]
        if points:
            per_class[key] = ([e for e, _ in points], [v for _, v in points])
    panels["per_class"] = per_class
    return panels


def write_curves(records: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Draw the training curves of a run's metrics lines (dicts as in metrics.jsonl) to the PNG `path`.

    Left: the training loss and, when logged, the validation loss. Right: the validation metric, accuracy for a
    classifier, COCO AP and AP50 for a detector (its mask AP and AP50 dashed beside them when it predicts masks, each
    class's AP as a thin line when the run logs it), on
    [0, 1], its best epoch marked and named in the title. The file
    is replaced atomically, so a reader never sees half a picture. Returns the path.
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise OSError("drawing the training curves needs matplotlib: pip install matplotlib") from err
    records = list(records)
    if not records:
        raise ValueError("no metrics lines to draw: the run has not finished an epoch")
    panels = curve_series(records)
    labels = {key: label for keys in PANELS.values() for key, label in keys}
    fig = Figure(figsize=(10, 4), dpi=100, layout="constrained")
    ax_loss, ax_metric = fig.subplots(1, 2)
    last = max(int(r["epoch"]) for r in records)
    marker = 4 if last <= 30 else 0  # points while they can be told apart
    for (key, (epochs, values)), style in zip(panels["loss"].items(), ("o-", "s--"), strict=False):
        ax_loss.plot(epochs, values, style, markersize=marker, label=labels[key])
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    metric_series = panels["metric"]
    for key, (epochs, values) in metric_series.items():  # a mask-predicting detector's mask AP dashed
        ax_metric.plot(epochs, values, "o--" if key.startswith("segm_") else "o-", markersize=marker, label=labels[key])
    for key, (epochs, values) in panels["per_class"].items():
        ax_metric.plot(epochs, values, "-", linewidth=1.0, alpha=0.7, label=f"AP {key[3:][:24]}")
    name = "accuracy" if "val_acc" in metric_series else "AP" if metric_series else "metric"
    title = f"validation {name}"
    if metric_series:
        key, (epochs, values) = next(iter(metric_series.items()))  # the one that picks the best model
        best = max(range(len(values)), key=values.__getitem__)
        ax_metric.plot([epochs[best]], [values[best]], "*", color="black", markersize=12, zorder=3)
        title += f" (best {values[best]:.3f}, epoch {epochs[best]})"
    ax_metric.set(xlabel="epoch", ylabel=name, title=title, ylim=(-0.02, 1.02))
    for ax in (ax_loss, ax_metric):
        if last <= 15:
            ax.set_xticks(range(1, last + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.5, last + 0.5)
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()[0]
        if handles:
            ax.legend(loc="best", fontsize=8 if len(handles) > 4 else None)
    fig.suptitle(f"training curves after {last} epoch{'s' if last != 1 else ''}")
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    return path
