"""The results `vitkit eval --json` and `vitkit predict --json` print: `EvalResult.to_dict`, `Prediction.to_dict`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from vitkit.data import DataInfo
from vitkit.models.registry import create_model
from vitkit.train import EvalResult, Prediction, predict, predict_files


def test_eval_result_to_dict():
    confusion = torch.tensor([[2, 1, 0], [0, 0, 0], [1, 0, 3]])  # class b has no images
    result = EvalResult(0.5, 5 / 7, 6 / 7, 7, confusion, ("bad.png",), ("a", "b", "c"))
    data = result.to_dict()
    assert data == {
        "images": 7,
        "loss": 0.5,
        "top1": 5 / 7,
        "top5": 6 / 7,
        "per_class": {"a": pytest.approx(2 / 3), "b": None, "c": pytest.approx(3 / 4)},
        "confusion": [[2, 1, 0], [0, 0, 0], [1, 0, 3]],
        "skipped": ["bad.png"],
    }
    assert json.loads(json.dumps(data))["per_class"]["b"] is None
    unnamed = EvalResult(0.5, 5 / 7, 6 / 7, 7, confusion, ())
    assert list(unnamed.class_accuracies()) == ["0", "1", "2"] and math.isnan(unnamed.per_class[1])


def test_prediction_to_dict():
    prediction = Prediction("digit.png", [("7", 0.75), ("1", 0.25)])
    assert prediction.to_dict() == {
        "image": "digit.png",
        "top": [{"class": "7", "probability": 0.75}, {"class": "1", "probability": 0.25}],
    }


def test_predict_files_is_predict_on_the_opened_images(tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_digits_patch7_28", depth=1, num_classes=3).eval()
    info = DataInfo("test", ("x", "y", "z"), (0.5,) * 3, (0.25,) * 3, val_fraction=0.0, split_seed=0)
    paths = []
    for k, shade in enumerate((0, 128, 255)):
        paths.append(str(tmp_path / f"{k}.png"))
        Image.new("RGB", (28, 28), (shade, 255 - shade, shade // 2)).save(paths[-1])
    results = predict_files(model, info, paths, top_k=2)
    expected = predict(model, info, [Image.open(p) for p in paths], top_k=2)
    assert [r.image for r in results] == paths
    assert [r.top for r in results] == expected and all(len(r.top) == 2 for r in results)
