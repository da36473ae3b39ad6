"""Writing inference results for people and programs: the predictions as an aligned table or CSV, any results as
JSON, a detector's boxes drawn on each image."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.data import open_image
from vitkit.infer.classify import Prediction
from vitkit.infer.detect import ImageDetections
from vitkit.viz import draw_detections


def _output_file(path: str | os.PathLike) -> Path:
    """`path` with its folder created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def prediction_table(predictions: Sequence[Prediction]) -> list[list[str]]:
    """Rows of strings, a header first: image, label_1, prob_1, ..., label_k, prob_k (k the most classes any image
    has; probabilities as Python prints floats). The rows `write_predictions_csv` writes."""
    k = max((len(p.top) for p in predictions), default=0)
    header = ["image"] + [f"{what}_{rank}" for rank in range(1, k + 1) for what in ("label", "prob")]
    rows = [[p.image] + [str(v) for name, prob in p.top for v in (name, prob)] for p in predictions]
    return [header, *rows]


def format_predictions(predictions: Sequence[Prediction]) -> str:
    """The predictions as a text table with aligned columns: one line per image, a header first; probabilities
    with four decimals."""
    header = prediction_table(predictions)[0]
    cells = [header] + [[p.image] + [v for name, prob in p.top for v in (name, f"{prob:.4f}")] for p in predictions]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in cells)


def write_predictions_csv(predictions: Sequence[Prediction], path: str | os.PathLike) -> Path:
    """Write `prediction_table` as CSV to `path` (its folder created); returns the path."""
    path = _output_file(path)
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(prediction_table(predictions))
    return path


def write_json(rows: Any, path: str | os.PathLike) -> Path:
    """Write plain JSON values to `path` (its folder created), indented; returns the path."""
    path = _output_file(path)
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return path


def picture_paths(images: Sequence[str | os.PathLike], out: str | os.PathLike) -> list[Path]:
    """Where `write_detections` draws each of `images`: OUT/<image name>.png, images of the same name from other
    folders numbered (name_1.png, ...)."""
    pictures: list[Path] = []
    for image in images:
        stem, k = Path(image).stem, 0
        while (picture := Path(out) / (f"{stem}_{k}.png" if k else f"{stem}.png")) in pictures:
            k += 1
        pictures.append(picture)
    return pictures


def write_detections(
    found: Sequence[ImageDetections],
    out: str | os.PathLike,
    classes: Sequence[str] | None = None,
    threshold: float | None = None,
) -> tuple[list[Path], Path]:
    """Draw each image's detections (`vitkit.viz.draw_detections`) to OUT/<image name>.png and write them all to
    OUT/detections.json (a list of `ImageDetections.to_dict`, each with its "picture"); returns (pictures, json).
    A picture without detections says so, with the `threshold` they were read above when given.

    Images of the same name from different folders get a numbered suffix (name_1.png, ...)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pictures = picture_paths([item.image for item in found], out)
    rows = []
    for item, picture in zip(found, pictures, strict=True):
        detections = item.detections
        drawn = draw_detections(
            open_image(item.image),
            [d.box for d in detections],
            [d.label for d in detections],
            [d.score for d in detections],
            classes,
            "no detections" + ("" if threshold is None else f" above {threshold:.2f}"),
            [d.mask_array() for d in detections] if any(d.mask is not None for d in detections) else None,
        )
        drawn.save(picture)
        rows.append({**item.to_dict(), "picture": str(picture)})
    path = out / "detections.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return pictures, path
