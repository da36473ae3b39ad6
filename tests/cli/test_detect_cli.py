"""`vitkit train / eval / predict / attention` on a detector, end to end on a few digits-detect canvases written as a
COCO-format folder."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from vitkit import from_pretrained
from vitkit.cli import main
from vitkit.data import load_digits_detect, write_coco_folder
from vitkit.detection import COCO_METRICS
from vitkit.infer import (
    detect_files,
    detection_attention,
    detection_attention_figure,
    detection_reading,
    evaluate_detector_dir,
    inference_info,
)
from vitkit.infer.tiles import detect_tiled
from vitkit.train import TrainConfig
from vitkit.util import counted
from vitkit.viz import enlarge
from vitkit.viz.attention import figure_image
from vitkit.weights import read_model_info

TINY = ["--model", "detr_digits", "--model-arg", "backbone_width=8", "--model-arg", "hidden_dim=16"]
TINY += ["--model-arg", "num_heads=2", "--model-arg", "dim_feedforward=32", "--model-arg", "num_queries=6"]
TINY += ["--model-arg", "dec_layers=2"]


def _loaded(directory):
    """(model, its classes and normalisation, how its outputs are read) of a model directory, as the commands read
    them."""
    model = from_pretrained(directory)
    return model, inference_info(model), detection_reading(model, directory)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny detector trained for two epochs on 16 canvases; returns (run folder, COCO folder)."""
    train, val, _ = load_digits_detect()
    data = tmp_path_factory.mktemp("coco")
    write_coco_folder(train, data, "train", limit=16)
    write_coco_folder(val, data, "val", limit=4)
    out = tmp_path_factory.mktemp("run")
    args = ["train", *TINY, "--data", str(data), "--epochs", "2", "--batch-size", "8", "--device", "cpu"]
    assert main([*args, "--out", str(out), "--force"]) == 0
    return out, data


def test_train_writes_a_detector_run(trained, capsys):
    out, _ = trained
    assert {p.name for p in (out / "final").iterdir()} == {"config.json", "model.safetensors"}
    saved = read_model_info(out / "final")  # what the data and the run's evaluation said, in config.json
    assert saved.category_ids == tuple(range(10)) and saved.postprocess["nms_iou"] == 0.7 and saved.data is not None
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and set(COCO_METRICS) <= set(lines[-1])
    assert {k for k in lines[-1] if k.startswith("ap/")} == {f"ap/{d}" for d in range(10)}  # each digit's AP


def test_eval_prints_the_map_of_the_final_epoch(trained, capsys, tmp_path):
    out, data = trained
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert main(["eval", "--model-dir", str(out / "final"), "--json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 4 and report["skipped"] == []
    assert {k: report[k] for k in COCO_METRICS} == pytest.approx({k: last[k] for k in COCO_METRICS}, nan_ok=True)
    assert [row["class"] for row in report["per_class"]] == [str(d) for d in range(10)]
    annotations = json.loads((data / "annotations" / "instances_val.json").read_text())["annotations"]
    assert sum(row["boxes"] for row in report["per_class"]) == len(annotations)
    for row in report["per_class"]:  # each class as last epoch's ap/NAME, the curve at IoU 0.5 over COCO's recalls
        assert row["ap"] == pytest.approx(last[f"ap/{row['class']}"], nan_ok=True)
        assert len(row["precision"]) == len(report["recall"]) == 101
    assert main(["eval", "--model-dir", str(out / "final")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("images 4  ap ") and all(f"  {k} " in text for k in COCO_METRICS)
    assert "  class   boxes      AP    AP50  AP_small" in text and "(few boxes)" in text
    plot = tmp_path / "pr.png"
    assert main(["eval", "--model-dir", str(out / "final"), "--plot", str(plot)]) == 0
    assert f"precision-recall curves written to {plot}" in capsys.readouterr().out
    assert Image.open(plot).size[0] > 600


def test_eval_names_category_ids_that_differ_from_the_model_s(trained, capsys, tmp_path):
    out, data = trained
    other = tmp_path / "renumbered"
    shutil.copytree(data, other)
    path = other / "annotations" / "instances_val.json"
    coco = json.loads(path.read_text())
    top = max(c["id"] for c in coco["categories"])
    ids = {c["id"]: top - c["id"] + 100 for c in coco["categories"]}  # the same names, under ids in reverse order
    for c in coco["categories"]:
        c["id"] = ids[c["id"]]
    for a in coco["annotations"]:
        a["category_id"] = ids[a["category_id"]]
    path.write_text(json.dumps(coco))
    assert main(["eval", "--model-dir", str(out / "final"), "--data", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{other} numbers the model's classes otherwise: {{100: " in err, err
    assert "give the annotations the model's ids and names" in err


def test_eval_batches_a_detector_as_its_run_validated_it(trained, monkeypatch, tmp_path, capsys):
    """Padding within a batch moves a detector's outputs near the image borders, so eval takes the batch size (and
    the precision) of the run that wrote the directory (its config.json one folder up), else 8 (and fp32), unless
    --batch-size (--precision) says; another batch size than the run's is noted."""
    from vitkit.cli import eval as eval_cli

    seen, real = [], eval_cli.evaluate_detector_dir

    def recorded(directory, data, batch_size, device, workers, precision, *tiles):
        seen.append((batch_size, precision))
        return real(directory, data, batch_size, device, workers, precision, *tiles)

    monkeypatch.setattr(eval_cli, "evaluate_detector_dir", recorded)
    out, _ = trained
    run = tmp_path / "run"
    shutil.copytree(out / "final", run / "final")
    config = json.loads((out / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "batch_size": 3, "precision": "bf16"}))
    shutil.copytree(out / "final", tmp_path / "alone")
    notes = []
    for directory, extra in ((run / "final", []), (tmp_path / "alone", []), (run / "final", ["--batch-size", "5"])):
        assert main(["eval", "--model-dir", str(directory), "--device", "cpu", *extra]) == 0
        notes.append("padding within a batch moves" in capsys.readouterr().err)
    assert seen == [(3, "bf16"), (8, "fp32"), (5, "bf16")]
    assert notes == [False, False, True]  # only where a batch size other than the run's was given


def test_predict_and_eval_in_tiles(trained, capsys, tmp_path):
    """`--tile`: predict merges the tiles' detections of an image larger than a tile as `detect_tiled` does, eval
    scores whole images in tiles as `evaluate_detector_dir` does; each says so. --overlap needs tiles, and an image
    above Pillow's pixel limit (--max-pixels) is refused before any work."""
    out, data = trained
    canvases = sorted((data / "val").glob("*.png"))
    big = Image.new("RGB", (192, 192))
    for k, path in enumerate(canvases[:4]):
        big.paste(Image.open(path).convert("RGB"), (96 * (k % 2), 96 * (k // 2)))
    big.save(tmp_path / "big.png")
    model, info, reading = _loaded(out / "final")
    assert main(["predict", "--model-dir", str(out / "final"), str(tmp_path / "big.png"), "--tile", "96",
                 "--out", str(tmp_path / "found"), "--threshold", "0.01", "--device", "cpu"]) == 0  # fmt: skip
    said = capsys.readouterr()
    assert "images larger than 96 px a side in tiles of 96 px, sharing 0.25 of a side" in said.err
    (listed,) = json.loads((tmp_path / "found" / "detections.json").read_text())
    expected = detect_tiled(model, info, big, 96, 0.25, 0.01, reading.one_per_query())
    assert [d["box"] for d in listed["detections"]] == [list(d.box) for d in expected] and expected
    assert main(["eval", "--model-dir", str(out / "final"), "--tile", "64", "--json", "--device", "cpu"]) == 0
    said = capsys.readouterr()
    assert "whole images in tiles of 64 px, sharing 0.25 of a side" in said.err
    result, _ = evaluate_detector_dir(str(out / "final"), device="cpu", tile=64)
    assert json.loads(said.out)["ap"] == pytest.approx(result.metrics["ap"], abs=1e-12)
    assert main(["predict", "--model-dir", str(out / "final"), str(tmp_path / "big.png"), "--overlap", "0.3"]) == 2
    assert "--overlap applies to tiles: give --tile PX too" in capsys.readouterr().err
    assert main(["predict", "--model-dir", str(out / "final"), str(tmp_path / "big.png"), "--tile", "10"]) == 2
    assert "--tile 10: a tile of under 32 px holds a few pixels of an object" in capsys.readouterr().err
    assert main(["predict", "--model-dir", str(out / "final"), str(tmp_path / "big.png"), "--max-pixels", "1000",
                 "--out", str(tmp_path / "again")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "is 192x192, 36,864 pixels: more than twice Pillow's limit of 1,000" in err and "--max-pixels 36864" in err
    assert not (tmp_path / "again").exists()


def test_predict_draws_and_lists_the_detections_of_a_folder(trained, capsys, tmp_path):
    out, data = trained
    args = ["predict", "--model-dir", str(out / "final"), str(data / "val"), "--threshold", "0.05"]
    assert main([*args, "--out", str(tmp_path / "pred"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    images = sorted((data / "val").glob("*.png"))
    assert [row["image"] for row in rows] == [str(p) for p in images]
    model, info, settings = _loaded(out / "final")  # the recipe's top-k pairs and NMS
    assert settings.nms_iou == 0.7
    expected = detect_files(model, info, images, 0.05, settings.one_per_query())  # one box per object
    assert rows == [found.to_dict() for found in expected]
    pairs = detect_files(model, info, images, 0.05, settings)  # the top-k pairs evaluation scores
    assert sum(len(f.detections) for f in pairs) > sum(len(row["detections"]) for row in rows)
    listing = json.loads((tmp_path / "pred" / "detections.json").read_text())
    assert [row["picture"] for row in listing] == [str(tmp_path / "pred" / p.name) for p in images]
    for row, path in zip(listing, images, strict=True):
        picture = Image.open(row["picture"])
        assert picture.size == (288, 288)  # 96 px drawn three times larger
        plain, _ = enlarge(Image.open(path))
        changed = np.abs(np.asarray(picture, dtype=int) - np.asarray(plain, dtype=int)).sum(-1) > 0
        assert changed.any() == bool(row["detections"])  # boxes drawn where there are detections, nothing else
    assert main(["predict", "--model-dir", str(out / "final"), str(images[0]), "--out", str(tmp_path / "one")]) == 0
    assert "detections written to" in capsys.readouterr().out


def test_predict_shows_detections_above_the_threshold_training_chose(trained, capsys, tmp_path):
    """Without --threshold, predict keeps the detections above the threshold the run chose on the validation split
    (saved in the model's config.json); --threshold replaces it."""
    out, data = trained
    model, info, settings = _loaded(out / "final")
    chosen = evaluate_detector_dir(str(out / "final"))[0].threshold  # the best F1's, None where nothing was found
    assert settings.threshold == (None if chosen is None else pytest.approx(chosen))  # written by vitkit train
    final = tmp_path / "final"  # a threshold of its own, as a run that found objects writes
    shutil.copytree(out / "final", final)
    saved = json.loads((final / "config.json").read_text())
    saved["postprocess"]["threshold"] = 0.2
    (final / "config.json").write_text(json.dumps(saved))
    model, info, settings = _loaded(final)
    assert settings.threshold == 0.2
    images = sorted((data / "val").glob("*.png"))
    args = ["predict", "--model-dir", str(final), str(data / "val"), "--out", str(tmp_path / "p"), "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    shown = settings.one_per_query()
    assert rows == [found.to_dict() for found in detect_files(model, info, images, settings.threshold, shown)]
    assert main([*args, "--threshold", "0.999"]) == 0
    assert all(not row["detections"] for row in json.loads(capsys.readouterr().out))


def test_predict_skips_unreadable_images_of_folders_and_patterns(trained, capsys, tmp_path):
    out, data = trained
    images = sorted((data / "val").glob("*.png"))
    folder = tmp_path / "mixed"
    (folder / "inner").mkdir(parents=True)
    shutil.copy(images[0], folder / "inner" / "first.png")
    (folder / "inner" / "broken.png").write_bytes(images[0].read_bytes()[:70])
    listing = tmp_path / "new" / "rows.json"
    args = ["predict", "--model-dir", str(out / "final"), str(folder), f"{data}/val/*[23].png", "--threshold", "0"]
    assert main([*args, "--out", str(tmp_path / "pred"), "--json", str(listing)]) == 0
    captured = capsys.readouterr()
    readable = [folder / "inner" / "first.png", *sorted((data / "val").glob("*[23].png"))]
    model, info, settings = _loaded(out / "final")
    expected = detect_files(model, info, readable, 0.0, settings.one_per_query())
    assert json.loads(listing.read_text()) == [found.to_dict() for found in expected]
    assert (
        captured.out.splitlines()[0] == f"{readable[0]}: {counted(len(expected[0].detections), 'object')}"
        and f"JSON written to {listing}" in captured.out
    )
    broken = folder / "inner" / "broken.png"
    assert captured.err.startswith(f"vitkit predict: warning: cannot read image {broken}: ")
    assert "skipped 1 unreadable image:" in captured.err
    assert len(json.loads((tmp_path / "pred" / "detections.json").read_text())) == len(readable)
    assert main(["predict", "--model-dir", str(out / "final"), str(broken)]) == 1
    for extra in (["--top-k", "2"], ["--csv", str(tmp_path / "x.csv")], ["--batch-size", "4"]):
        assert main(["predict", "--model-dir", str(out / "final"), str(images[0]), *extra]) == 2
        assert f"{extra[0]} only applies to a classifier" in capsys.readouterr().err


def test_a_detector_directory_without_its_datas_description(trained, capsys, tmp_path):
    """A copy of the model whose config.json lost its data's description (the data, the category ids), and one that
    also lost the class names and statistics: the COCO folder's category ids are the class indices and its
    statistics ImageNet's, so both predict and evaluate as the directory with them does."""
    out, data = trained
    saved = read_model_info(out / "final")
    assert saved.mean == (0.485, 0.456, 0.406) and saved.category_ids == tuple(range(10))
    named, plain = tmp_path / "named", tmp_path / "plain"
    config = json.loads((out / "final" / "config.json").read_text())
    for directory, dropped in ((named, ()), (plain, ("classes", "mean", "std"))):
        directory.mkdir()
        shutil.copy(out / "final" / "model.safetensors", directory / "model.safetensors")
        dropped = {"data", "category_ids", *dropped}
        (directory / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in dropped}))
    image = str(sorted((data / "val").glob("*.png"))[0])
    args = [image, "--threshold", "0.05", "--json", "--out", str(tmp_path / "pred")]
    assert main(["predict", "--model-dir", str(out / "final"), *args]) == 0
    reference = json.loads(capsys.readouterr().out)
    for directory, names in ((named, "the class names saved with the model"), (plain, "class indices (0, 1, ...)")):
        assert main(["predict", "--model-dir", str(directory), *args]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out) == reference and captured.err.count("note:") == 1
        assert f"{directory} holds no description of the data its model was trained on" in captured.err
        assert names in captured.err
    assert main(["eval", "--model-dir", str(plain)]) == 2
    assert "name the data to evaluate on" in capsys.readouterr().err
    assert main(["eval", "--model-dir", str(out / "final"), "--json"]) == 0
    reference = json.loads(capsys.readouterr().out)
    assert main(["eval", "--model-dir", str(plain), "--data", str(data), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == reference and f"the class names of {data}" in captured.err


def test_attention_draws_each_detection_with_its_map(trained, capsys, tmp_path):
    out, data = trained
    image = str(sorted((data / "val").glob("*.png"))[0])
    target = tmp_path / "attention.png"
    args = ["attention", "--model-dir", str(out / "final"), image, "--out", str(target), "--threshold", "0"]
    assert main(args) == 0
    model, info, settings = _loaded(out / "final")
    settings = settings.one_per_query()  # one panel per object
    shown, _ = detection_attention(model, info, Image.open(image), 0.0, settings)
    objects = f"{len(shown)} object{'' if len(shown) == 1 else 's'} above 0.00"
    assert 1 <= len(shown) <= 6 and objects in capsys.readouterr().out
    # every query left by NMS is shown, one panel each after the picture of them all: the library's figure
    figure, found, _ = detection_attention_figure(model, info, Image.open(image), 0.0, settings)
    assert found == shown and len(figure.axes) == 1 + len(shown) + 1  # and the colour bar
    assert Image.open(target).size == figure_image(figure).size
    assert main([*args[:-2], "--rollout"]) == 2
    assert "a detector's figure shows each object" in capsys.readouterr().err


def test_attention_and_explore_note_a_model_trained_on_tiles(trained, capsys, tmp_path):
    out, data = trained
    tiled = tmp_path / "tiled"
    shutil.copytree(out / "final", tiled)
    config = json.loads((tiled / "config.json").read_text())
    (tiled / "config.json").write_text(json.dumps({**config, "tile": 32}))
    image = sorted((data / "val").glob("*.png"))[0]
    width, height = Image.open(image).size
    note = f"the model was trained on tiles of 32 px, and shows {image.name} ({width}x{height}) whole, resized"
    assert main(["attention", "--model-dir", str(tiled), str(image), "--out", str(tmp_path / "a.png")]) == 0
    assert f"vitkit attention: note: {note}" in capsys.readouterr().err
    assert main(["explore", "--model-dir", str(tiled), str(image), "--out", str(tmp_path / "e.html")]) == 0
    assert f"vitkit explore: note: {note}" in capsys.readouterr().err
    assert main(["attention", "--model-dir", str(out / "final"), str(image), "--out", str(tmp_path / "b.png")]) == 0
    assert "tiles" not in capsys.readouterr().err


def test_train_alone_on_detection_data_trains_the_default_detector(monkeypatch, tmp_path):
    seen = {}

    def fake_fit(config: TrainConfig, resume: bool, force: bool, **memory):
        seen.update(config=config.resolved())
        return type("Result", (), {"interrupted": False})()

    monkeypatch.setattr("vitkit.cli.train.fit", fake_fit)
    assert main(["train", "--data", "builtin:digits-detect", "--out", str(tmp_path)]) == 0
    assert seen["config"].model == "deformable_detr_small" and seen["config"].task == "detection"
    args = ["train", "--data", "builtin:digits-detect", "--model", "vit_digits_patch7_28", "--out", str(tmp_path)]
    assert main(args) == 2


def test_an_image_that_would_not_fit_in_memory_is_refused_before_any_work(trained, capsys, tmp_path, monkeypatch):
    out, data = trained
    monkeypatch.setattr("vitkit.cli.options.available_memory", lambda device: 50_000)  # 96x96 takes about 83 kB
    path = sorted((data / "val").glob("*.png"))[0]
    args = ["predict", "--model-dir", str(out / "final"), str(path), "--out", str(tmp_path / "found")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{path} is 96x96: reading it takes about 0.1 MiB and 0.0 MiB of memory is available" in err
    assert "--ignore-memory-check" in err and not (tmp_path / "found").exists()
    assert main([*args, "--ignore-memory-check"]) == 0
