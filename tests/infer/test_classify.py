"""The results `vitkit eval` and `vitkit predict` print (`EvalResult.to_dict`, `Prediction.to_dict`, the table and
CSV), prediction over many files (`image_paths`, `predict_paths`) and model directories whose config.json lacks the
class names, normalisation or the training data's description."""

from __future__ import annotations

import csv
import io
import json
import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import Unreadable
from vitkit.infer import (
    EvalResult,
    Prediction,
    format_predictions,
    image_paths,
    inference_info,
    missing_info_note,
    predict,
    predict_files,
    predict_paths,
    progress_bar,
    write_predictions_csv,
)
from vitkit.infer.files import PROGRESS_MIN_IMAGES
from vitkit.models.registry import create_model
from vitkit.weights import ModelInfo, from_pretrained, save_pretrained


def test_eval_result_to_dict():
    confusion = torch.tensor([[2, 1, 0], [0, 0, 0], [1, 0, 3]])  # class b has no images
    skipped = (Unreadable("bad.png", "image file is truncated"),)
    result = EvalResult(0.5, 5 / 7, 6 / 7, 7, confusion, skipped, ("a", "b", "c"))
    data = result.to_dict()
    assert data == {
        "images": 7,
        "loss": 0.5,
        "top1": 5 / 7,
        "top5": 6 / 7,
        "per_class": {"a": pytest.approx(2 / 3), "b": None, "c": pytest.approx(3 / 4)},
        "confusion": [[2, 1, 0], [0, 0, 0], [1, 0, 3]],
        "skipped": [{"image": "bad.png", "reason": "image file is truncated"}],
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
    info = ModelInfo(("x", "y", "z"), (0.5,) * 3, (0.25,) * 3)
    paths = []
    for k, shade in enumerate((0, 128, 255)):
        paths.append(str(tmp_path / f"{k}.png"))
        Image.new("RGB", (28, 28), (shade, 255 - shade, shade // 2)).save(paths[-1])
    results = predict_files(model, info, paths, top_k=2)
    expected = predict(model, info, [Image.open(p) for p in paths], top_k=2)
    assert [r.image for r in results] == paths
    assert [r.top for r in results] == expected and all(len(r.top) == 2 for r in results)


def _shades(folder, count: int) -> list[str]:
    """`count` 28x28 RGB images of different colours in `folder`, as paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(count):
        shade = 255 * k // max(count - 1, 1)
        paths.append(str(folder / f"{k}.png"))
        Image.new("RGB", (28, 28), (shade, 255 - shade, (3 * shade) % 256)).save(paths[-1])
    return paths


@pytest.fixture
def classifier():
    torch.manual_seed(0)
    model = create_model("vit_digits_patch7_28", depth=1, num_classes=3).eval()
    info = ModelInfo(("x", "y", "z"), (0.5,) * 3, (0.25,) * 3)
    return model, info


def test_image_paths_expands_folders_and_patterns(tmp_path):
    for name in ("b/2.png", "b/deep/er/1.JPG", "a.png", "b/notes.txt", "c/x.webp", "odd[1].png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    root = str(tmp_path)
    found = image_paths([f"{root}/b", f"{root}/a.png", f"{root}/**/*.png", f"{root}/odd[1].png", f"{root}/?"])
    names = [p.relative_to(tmp_path).as_posix() for p in found]
    # folders sorted at any depth (images only), then the pattern's new matches, each file once; the literal name
    # with brackets is that file; "?" matches the one-letter folders, whose images come in
    assert names == ["b/2.png", "b/deep/er/1.JPG", "a.png", "odd[1].png", "c/x.webp"]
    assert image_paths([f"{root}/b/notes.txt"]) == [tmp_path / "b" / "notes.txt"]  # a file named is taken as is
    for item, message in (
        (f"{root}/*.gif", "matches no image files"),
        (f"{root}/missing.png", "does not exist"),
        (f"{root}/**/*.txt", "matches no image files"),
    ):
        with pytest.raises(FileNotFoundError, match=message) as caught:
            image_paths([f"{root}/a.png", item])
        assert item in str(caught.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no images"):
        image_paths([tmp_path / "empty"])


@pytest.mark.parametrize("batch_size", [1, 2, 32])
def test_predict_paths_skips_unreadable_files_and_agrees_with_predict_files(classifier, tmp_path, batch_size):
    model, info = classifier
    good = _shades(tmp_path, 5)
    truncated, text = tmp_path / "truncated.png", tmp_path / "text.png"
    truncated.write_bytes(open(good[0], "rb").read()[:40])
    text.write_text("not an image")
    paths = [good[0], str(truncated), *good[1:3], str(text), *good[3:]]
    met = []
    result = predict_paths(model, info, paths, top_k=2, batch_size=batch_size, on_unreadable=met.append)
    assert [s.name for s in result.skipped] == [str(truncated), str(text)] == [s.name for s in met]
    assert all(s.error for s in result.skipped) and "truncated" in result.skipped[0].error
    expected = predict_files(model, info, good, top_k=2)
    assert [p.image for p in result.predictions] == good
    for got, want in zip(result.predictions, expected, strict=True):
        assert [name for name, _ in got.top] == [name for name, _ in want.top]
        assert [p for _, p in got.top] == pytest.approx([p for _, p in want.top], rel=1e-5, abs=1e-6)
    assert result.to_dicts() == [p.to_dict() for p in result.predictions]
    with pytest.raises(ValueError, match="top_k must be positive"):
        predict_paths(model, info, good, top_k=0)


def test_prediction_table_and_csv(tmp_path):
    predictions = [Prediction("a.png", [("cat", 0.75), ("dog", 0.25)]), Prediction("dir/b.png", [("dog", 1.0)])]
    lines = format_predictions(predictions).splitlines()
    assert lines[0].split() == ["image", "label_1", "prob_1", "label_2", "prob_2"]
    assert [line.split() for line in lines[1:]] == [
        ["a.png", "cat", "0.7500", "dog", "0.2500"],
        ["dir/b.png", "dog", "1.0000"],
    ]
    assert len({line.index("label_1") for line in lines[:1]} | {lines[1].index("cat"), lines[2].index("dog")}) == 1
    path = write_predictions_csv(predictions, tmp_path / "new" / "folder" / "p.csv")
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["image", "label_1", "prob_1", "label_2", "prob_2"]
    assert rows[1] == ["a.png", "cat", "0.75", "dog", "0.25"] and rows[2] == ["dir/b.png", "dog", "1.0"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_for_more_than_a_screenful_on_a_terminal(monkeypatch):
    for stream, total, shown in (
        (_Terminal(), PROGRESS_MIN_IMAGES + 1, True),
        (_Terminal(), PROGRESS_MIN_IMAGES, False),
        (io.StringIO(), 1000, False),
    ):
        monkeypatch.setattr(sys, "stderr", stream)
        with progress_bar(total, None) as bar:
            bar.update(total)
        assert (f"/{total} [" in stream.getvalue()) == shown  # tqdm draws "n/total [elapsed..."


def _explicit_probabilities(model, path, mean, std) -> torch.Tensor:
    """Softmax of the model on a 28x28 image, normalised with numpy."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
    x = (torch.from_numpy(pixels) - torch.tensor(mean)) / torch.tensor(std)  # (H, W, 3)
    with torch.no_grad():
        return model(x.permute(2, 0, 1)[None]).softmax(dim=-1)[0]  # (K,)


def test_a_directory_without_its_datas_description_uses_the_models_config(classifier, tmp_path):
    model, _ = classifier
    (path,) = _shades(tmp_path / "images", 1)
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    for names, stats in ((("x", "y", "z"), ((0.2, 0.3, 0.4), (0.5, 0.6, 0.7))), (None, None)):
        directory = save_pretrained(model, tmp_path / str(names is None), ModelInfo(names, *(stats or (None, None))))
        loaded = from_pretrained(directory)
        info = inference_info(loaded)
        mean, std = stats or imagenet
        assert info.classes == (names or ("0", "1", "2")) and info.mean == pytest.approx(mean)
        assert info.std == pytest.approx(std) and info.data is None
        (prediction,) = predict_paths(loaded, info, [path], top_k=3).predictions
        probabilities = _explicit_probabilities(model, path, mean, std)
        assert [p for _, p in prediction.top] == pytest.approx(probabilities.sort(descending=True).values.tolist())
        note = missing_info_note(directory)
        assert f"{directory} holds no description of the data its model was trained on" in note
        assert "image size and channels of the model's config" in note
        if names:
            assert "the class names saved with the model, the mean / std saved with the model" in note
        else:
            assert "class indices (0, 1, ...) as names" in note and "ImageNet's mean / std" in note
    trained = ModelInfo(("a", "b", "c"), (0.5,), (0.5,), data="builtin:mnist5k", val_fraction=0.0, split_seed=0)
    save_pretrained(model, directory, trained)
    assert missing_info_note(directory) is None and inference_info(from_pretrained(directory)) == trained
    headless = save_pretrained(create_model("vit_digits_patch7_28", depth=1, num_classes=0), tmp_path / "backbone")
    with pytest.raises(ValueError, match=r"no classifier \(num_classes 0\): nothing to predict"):
        predict_paths(from_pretrained(headless), inference_info(from_pretrained(headless)), [path])
