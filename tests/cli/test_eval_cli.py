"""`vitkit eval` on a folder with an unreadable image, and on model directories whose config.json lacks the data's
description, checked against explicit computations."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit.cli.eval as eval_cli
from vitkit.cli import main
from vitkit.infer import evaluate_detector_dir, evaluate_model_dir
from vitkit.models.registry import create_model
from vitkit.viz import confusion_image
from vitkit.weights import ModelInfo, save_pretrained

CLASSES = ("circle", "square", "triangle")
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("vit_digits_patch7_28", embed_dim=16, depth=1, num_heads=2, num_classes=3).eval()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A folder of class folders: 4 random 28x28 images each, and a truncated file in the last."""
    root = tmp_path_factory.mktemp("shapes")
    rng = np.random.default_rng(1)
    for name in CLASSES:
        (root / name).mkdir()
        for k in range(4):
            Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(root / name / f"{k}.png")
    (root / CLASSES[-1] / "broken.png").write_bytes((root / CLASSES[0] / "0.png").read_bytes()[:50])
    return root


def _expected(model, data, mean=MEAN, std=STD) -> dict:
    """images, loss and top-1 of the readable images of `data`, computed with numpy and the model."""
    probabilities, labels = [], []
    for label, name in enumerate(CLASSES):
        for path in sorted((data / name).glob("[0-9].png")):
            pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
            x = (torch.from_numpy(pixels) - torch.tensor(mean)) / torch.tensor(std)
            with torch.no_grad():
                probabilities.append(model(x.permute(2, 0, 1)[None]).softmax(-1)[0])
            labels.append(label)
    p, y = torch.stack(probabilities), torch.tensor(labels)  # (N, K), (N,)
    loss = -p[torch.arange(len(y)), y].log().mean().item()
    return {"images": len(y), "loss": loss, "top1": (p.argmax(1) == y).float().mean().item()}


def _eval(model_dir, data, capsys, *extra) -> tuple[dict, str]:
    assert main(["eval", "--model-dir", str(model_dir), "--data", str(data), "--json", *extra]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_unreadable_images_are_listed_with_the_reason(model, data, capsys, tmp_path):
    trained = ModelInfo(CLASSES, MEAN, STD, data=str(data), val_fraction=0.0, split_seed=0)
    directory = save_pretrained(model, tmp_path / "run", trained)
    report, err = _eval(directory, data, capsys)
    broken = str(data / CLASSES[-1] / "broken.png")
    assert {k: report[k] for k in ("images", "loss", "top1")} == pytest.approx(_expected(model, data), rel=1e-4)
    assert [item["image"] for item in report["skipped"]] == [broken] and report["skipped"][0]["reason"]
    assert err.splitlines() == ["skipped 1 unreadable image:", f"  {broken}: {report['skipped'][0]['reason']}"]
    plot = tmp_path / "new" / "folder" / "confusion.png"
    assert main(["eval", "--model-dir", str(directory), "--data", str(data), "--plot", str(plot)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"confusion matrix written to {plot}"
    result, info = evaluate_model_dir(str(directory), str(data))  # the matrix of this evaluation, drawn by the library
    expected = np.asarray(confusion_image(result.confusion, info.classes).convert("RGB"))
    assert np.array_equal(np.asarray(Image.open(plot).convert("RGB")), expected)


def test_a_directory_without_its_datas_description_needs_the_data(model, data, capsys, tmp_path):
    named = save_pretrained(model, tmp_path / "named", ModelInfo(CLASSES, MEAN, STD))
    assert main(["eval", "--model-dir", str(named)]) == 2
    err = capsys.readouterr().err
    assert f"{named} does not say the data its model was trained on (config.json has no 'data')" in err
    assert "(--data)" in err
    with pytest.raises(ValueError, match=r"name the data to evaluate on \(data\)$"):  # the library's argument
        evaluate_model_dir(str(named))
    report, err = _eval(named, data, capsys)
    assert {k: report[k] for k in ("images", "loss", "top1")} == pytest.approx(_expected(model, data), rel=1e-4)
    assert list(report["per_class"]) == list(CLASSES) and err.count("note:") == 1
    assert "using the class names saved with the model, the mean / std saved with the model" in err


def test_a_model_whose_training_data_is_gone_names_it_as_the_models(model, data, capsys, tmp_path):
    """The data a model directory records, moved or deleted since: the error says it is the data the model was
    trained on (the user never typed that path) and how to evaluate on other data; for a detector too."""
    gone = tmp_path / "gone"
    moved = save_pretrained(model, tmp_path / "moved", ModelInfo(CLASSES, MEAN, STD, data=str(gone)))
    assert main(["eval", "--model-dir", str(moved)]) == 2
    said = f"{moved} was trained on {gone}, which is gone (moved or deleted): name the data to evaluate on (--data)"
    assert said in capsys.readouterr().err
    detector = create_model("deformable_detr_small", num_classes=2, img_size=64)
    directory = save_pretrained(detector, tmp_path / "detector", ModelInfo(("a", "b"), MEAN, STD, data=str(gone)))
    with pytest.raises(ValueError, match=rf"{re.escape(str(gone))}, which is gone .*to evaluate on \(data\)$"):
        evaluate_detector_dir(str(directory))


def test_a_classifier_on_detection_data_is_told_so(model, tmp_path, capsys):
    from vitkit.data import write_shapes_folder

    directory = save_pretrained(model, tmp_path / "classifier", ModelInfo(CLASSES, MEAN, STD))
    shapes = write_shapes_folder(tmp_path / "shapes", train=2, val=1)
    for data in (str(shapes), "builtin:digits-detect"):
        assert main(["eval", "--model-dir", str(directory), "--data", data]) == 2
        said = f"{directory} holds a classifier, and {data} is detection data (boxes, not class folders)"
        assert said in capsys.readouterr().err


def test_a_model_without_class_names_takes_the_datas(model, data, capsys, tmp_path):
    plain = save_pretrained(model, tmp_path / "plain")  # neither names nor statistics: ImageNet's
    report, err = _eval(plain, data, capsys)
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert {k: report[k] for k in ("images", "loss", "top1")} == pytest.approx(_expected(model, data, *imagenet))
    assert list(report["per_class"]) == list(CLASSES)
    assert f"the class names of {data} (none saved with the model)" in err and "ImageNet's mean / std" in err
    two = tmp_path / "two"
    for name in CLASSES[:2]:
        (two / name).mkdir(parents=True)
        Image.new("RGB", (28, 28)).save(two / name / "0.png")
    assert main(["eval", "--model-dir", str(plain), "--data", str(two)]) == 2
    assert f"{two} has 2 classes ['circle', 'square'], the model has 3" in capsys.readouterr().err
    # a folder holding only train/ is read as `vitkit.data.eval_split` reads it, not as class folders named "train"
    only_train = tmp_path / "only_train"
    (only_train / "train" / "circle").mkdir(parents=True)
    Image.new("RGB", (28, 28)).save(only_train / "train" / "circle" / "0.png")
    assert main(["eval", "--model-dir", str(plain), "--data", str(only_train)]) == 2
    assert f"{only_train} holds train/ but no val/: evaluate on a folder of class folders" in capsys.readouterr().err


def test_top5_is_shown_only_with_more_than_five_classes(model, data, capsys, tmp_path):
    """With 3 classes the five most probable are every class: top-5 is always 1 and left out, printed and in JSON."""
    directory = save_pretrained(model, tmp_path / "three", ModelInfo(CLASSES, MEAN, STD))
    report, _ = _eval(directory, data, capsys)
    assert "top5" not in report and report["top1"] == pytest.approx(_expected(model, data)["top1"])
    assert main(["eval", "--model-dir", str(directory), "--data", str(data)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "top-1" in first and "top-5" not in first


@pytest.mark.parametrize("plot", ["pics", "confusion.xyz", "confusion"])
def test_a_plot_path_that_cannot_take_a_picture_is_refused_before_evaluating(
    model, data, capsys, tmp_path, monkeypatch, plot
):
    directory = save_pretrained(model, tmp_path / "run", ModelInfo(CLASSES, MEAN, STD))
    (tmp_path / "pics").mkdir()
    calls = []
    monkeypatch.setattr(eval_cli, "evaluate_model_dir", lambda *a, **k: calls.append(a))
    assert main(["eval", "--model-dir", str(directory), "--data", str(data), "--plot", str(tmp_path / plot)]) == 2
    err = capsys.readouterr().err
    assert not calls  # refused before the evaluation
    assert str(tmp_path / plot) in err and ".png" in err


def test_the_plot_is_written_in_every_format_its_help_and_errors_name(model, data, capsys, tmp_path):
    """The confusion matrix is a figure: vector formats too, and the refusal of an unknown suffix names them."""
    directory = save_pretrained(model, tmp_path / "run", ModelInfo(CLASSES, MEAN, STD))
    args = ["eval", "--model-dir", str(directory), "--data", str(data), "--plot"]
    assert main([*args, str(tmp_path / "confusion.xyz")]) == 2
    err = capsys.readouterr().err
    assert "confusion.xyz: .xyz is not a picture format vitkit can write; use .png, .jpg, .pdf, .svg" in err
    for suffix, start in ((".svg", b"<?xml"), (".pdf", b"%PDF")):
        plot = tmp_path / f"confusion{suffix}"
        assert main([*args, str(plot)]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == f"confusion matrix written to {plot}"
        assert plot.read_bytes().startswith(start)


def test_a_zero_std_is_refused_when_written_and_when_read(tmp_path, capsys):
    """A zero std would divide every image by zero: refused by save_pretrained, and in a config.json by every command
    that reads it (predict, eval, attention), naming the file."""
    model = create_model("vit_digits_patch7_28", embed_dim=16, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"std must be > 0 for every channel"):
        save_pretrained(model, tmp_path / "config", ModelInfo(mean=(0.5,), std=(0.0,)))
    trained = ModelInfo(tuple("0123456789"), (0.5,), (0.5,), data="builtin:mnist5k", val_fraction=0.0, split_seed=0)
    directory = save_pretrained(model, tmp_path / "model", trained)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "std": [0.0]}))
    image = tmp_path / "digit.png"
    Image.new("RGB", (28, 28)).save(image)
    for command in (["predict", "--model-dir", str(directory), str(image)], ["eval", "--model-dir", str(directory)]):
        assert main(command) == 2
        assert "config.json: std must be > 0 for every channel" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["[1, 2]", '"detection"', "null"])
def test_a_config_json_that_is_not_an_object_is_named(tmp_path, capsys, text):
    (tmp_path / "config.json").write_text(text)
    assert main(["eval", "--model-dir", str(tmp_path)]) == 2
    assert "config.json has no 'family' and 'config' entries: not a vitkit model directory" in capsys.readouterr().err


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_a_batch_size_below_one_is_refused_not_replaced_by_the_default(model, data, capsys, tmp_path, batch):
    directory = save_pretrained(model, tmp_path / "run", ModelInfo(CLASSES, MEAN, STD))
    assert main(["eval", "--model-dir", str(directory), "--data", str(data), "--batch-size", batch]) == 2
    assert f"batch_size must be positive, got {batch}" in capsys.readouterr().err


def test_a_folder_of_some_of_the_models_classes_is_scored_on_them(model, data, capsys, tmp_path):
    """A test set of two of the model's three classes: each image keeps its class's index in the model; a class the
    model does not know is refused naming it."""
    directory = save_pretrained(model, tmp_path / "run", ModelInfo(CLASSES, MEAN, STD))
    some = tmp_path / "some"
    for name in CLASSES[1:]:
        (some / name).mkdir(parents=True)
        for path in (data / name).glob("[0-9].png"):
            (some / name / path.name).write_bytes(path.read_bytes())
    report, _ = _eval(directory, some, capsys)
    assert {k: report[k] for k in ("images", "loss", "top1")} == pytest.approx(_expected(model, some), rel=1e-4)
    assert report["images"] == 8
    (some / "hexagon").mkdir()
    (some / "hexagon" / "0.png").write_bytes((data / CLASSES[0] / "0.png").read_bytes())
    assert main(["eval", "--model-dir", str(directory), "--data", str(some)]) == 2
    assert "['hexagon'] are not among them" in capsys.readouterr().err
