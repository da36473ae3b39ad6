"""`vitkit predict` over many images: files, folders and glob patterns, the table, CSV and JSON, unreadable files,
exit codes, and model directories whose config.json lacks the data's description."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main
from vitkit.models.registry import create_model
from vitkit.weights import ModelInfo, export_weights, save_pretrained

CLASSES = ("circle", "square", "triangle")
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("vit_digits_patch7_28", embed_dim=16, depth=1, num_heads=2, num_classes=3).eval()


@pytest.fixture(scope="module")
def model_dir(model, tmp_path_factory):
    """A model directory as vitkit train writes it: the model and its data's description."""
    trained = ModelInfo(CLASSES, MEAN, STD, data="data", val_fraction=0.0, split_seed=0)
    return save_pretrained(model, tmp_path_factory.mktemp("model"), trained)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """7 random 28x28 RGB images in a nested tree beside a text file; returns the root."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in ("a/1.png", "a/2.jpg", "a/deep/3.png", "b/4.png", "b/5.bmp", "6.png", "7.png"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(path, quality=100)
    (root / "a" / "notes.txt").write_text("not an image")
    return root


def _probabilities(model, path, mean=MEAN, std=STD) -> torch.Tensor:
    """Softmax of the model on a 28x28 image (already the model's size), normalised with numpy: (K,)."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
    x = (torch.from_numpy(pixels) - torch.tensor(mean)) / torch.tensor(std)  # (H, W, 3)
    with torch.no_grad():
        return model(x.permute(2, 0, 1)[None]).softmax(dim=-1)[0]


def _check_rows(rows, model, paths, classes=CLASSES, top_k=3, mean=MEAN, std=STD):
    """JSON rows against the explicit probabilities of each path, in order."""
    assert [row["image"] for row in rows] == [str(p) for p in paths]
    for row, path in zip(rows, paths, strict=True):
        values, indices = _probabilities(model, path, mean, std).topk(top_k)
        assert [t["class"] for t in row["top"]] == [classes[i] for i in indices.tolist()]
        assert [t["probability"] for t in row["top"]] == pytest.approx(values.tolist(), rel=1e-4, abs=1e-6)


def test_files_folders_and_patterns_in_one_call(model, model_dir, images, capsys):
    args = ["predict", "--model-dir", str(model_dir), str(images / "a"), f"{images}/**/[4-6].*"]
    assert main([*args, str(images / "7.png"), "--json", "--batch-size", "2"]) == 0
    captured = capsys.readouterr()
    expected = ["a/1.png", "a/2.jpg", "a/deep/3.png", "6.png", "b/4.png", "b/5.bmp", "7.png"]  # pattern: sorted
    _check_rows(json.loads(captured.out), model, [images / name for name in expected])
    assert captured.err == ""  # a directory with its data's description: no note, nothing skipped


def test_the_table_has_one_row_per_image(model, model_dir, images, capsys):
    assert main(["predict", "--model-dir", str(model_dir), str(images / "b"), "--top-k", "2"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["image", "label_1", "prob_1", "label_2", "prob_2"]
    assert len(rows) == 2
    for row, name in zip(rows, ("4.png", "5.bmp"), strict=True):
        image, first, p1, second, p2 = row.split()
        values, indices = _probabilities(model, images / "b" / name).topk(2)
        assert image == str(images / "b" / name) and [first, second] == [CLASSES[i] for i in indices.tolist()]
        assert [float(p1), float(p2)] == pytest.approx(values.tolist(), abs=6e-5)  # printed with 4 decimals


def test_csv_and_json_files_hold_the_rows_printed(model, model_dir, images, capsys, tmp_path):
    csv_file, json_file = tmp_path / "new" / "p.csv", tmp_path / "other" / "deeper" / "p.json"
    args = ["predict", "--model-dir", str(model_dir), str(images), "--top-k", "2", "--workers", "2"]
    assert main([*args, "--csv", str(csv_file), "--json", str(json_file)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[0] == "image" and len(out) == 1 + 7 + 2  # the table, then where the files went
    assert out[-2:] == [f"CSV written to {csv_file}", f"JSON written to {json_file}"]
    rows = json.loads(json_file.read_text())
    _check_rows(rows, model, sorted(p for p in images.rglob("*") if p.suffix != ".txt" and p.is_file()), top_k=2)
    with csv_file.open(newline="") as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["image", "label_1", "prob_1", "label_2", "prob_2"]
    expected = [[r["image"]] + [v for t in r["top"] for v in (t["class"], str(t["probability"]))] for r in rows]
    assert table[1:] == expected


def test_unreadable_files_are_skipped_and_listed(model, model_dir, images, capsys, tmp_path):
    truncated, text = tmp_path / "truncated.png", tmp_path / "text.jpg"
    truncated.write_bytes((images / "6.png").read_bytes()[:60])
    text.write_text("not an image")
    args = ["predict", "--model-dir", str(model_dir), str(truncated), str(images / "6.png"), str(text)]
    assert main([*args, "--json"]) == 0
    captured = capsys.readouterr()
    _check_rows(json.loads(captured.out), model, [images / "6.png"])
    err = captured.err.splitlines()
    assert err[0].startswith(f"vitkit predict: warning: cannot read image {truncated}: ")
    assert err[1].startswith(f"vitkit predict: warning: cannot read image {text}: ")
    assert err[2] == "skipped 2 unreadable images:" and err[3].startswith(f"  {text}: ")
    assert main(["predict", "--model-dir", str(model_dir), str(truncated), str(text)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "none of the 2 images could be read" in captured.err


def test_mistakes_are_errors_naming_what_is_wrong(model_dir, images, capsys, tmp_path):
    base = ["predict", "--model-dir", str(model_dir)]
    for items, message in (
        ([f"{images}/*.gif"], f"the pattern '{images}/*.gif' matches no image files"),
        ([str(images / "missing")], f"{images / 'missing'} does not exist"),
        ([str(tmp_path)], f"{tmp_path} holds no images"),
        ([str(images / "6.png"), "--threshold", "0.3"], "--threshold only applies to a detector"),
        ([str(images / "6.png"), "--out", "x"], "--out only applies to a detector"),
        (["--json", str(images / "6.png"), str(images / "7.png")], "--json takes the JSON file to write"),
    ):
        assert main([*base, *items]) == 2
        assert message in capsys.readouterr().err


def test_an_image_of_which_the_model_sees_little_gets_a_note(model_dir, capsys, tmp_path):
    """The classifier sees the centre crop of the image resized to cover its 28x28: below half of the image's area
    (`MIN_KEPT`), a note says how much and how to have all of it seen; a 2:1 image (half) gets none."""
    sizes = {"strip.png": (4000, 20), "half.png": (56, 28), "more.png": (57, 28), "tall.png": (28, 2000)}
    for name, size in sizes.items():
        Image.new("RGB", size, (200, 30, 30)).save(tmp_path / name)
    assert main(["predict", "--model-dir", str(model_dir), str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 4  # classified all the same: a note, not an error
    notes = captured.err.splitlines()
    how = "as it resizes an image to cover 28x28 and crops the centre; to classify all of it, crop the part that "
    assert notes == [
        f"vitkit predict: note: {tmp_path / 'more.png'}: the model saw 49.1% of it, the centre 28x28 of its 57x28 "
        f"pixels (width x height), {how}matters or pad the image to a square",
        f"vitkit predict: note: {tmp_path / 'strip.png'}: the model saw 0.5% of it, the centre 20x20 of its 4000x20 "
        f"pixels (width x height), {how}matters or pad the image to a square",
        f"vitkit predict: note: {tmp_path / 'tall.png'}: the model saw 1.4% of it, the centre 28x28 of its 28x2000 "
        f"pixels (width x height), {how}matters or pad the image to a square",
    ]


def test_a_checkpoint_file_names_the_command_that_makes_it_a_model(model, images, capsys, tmp_path):
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    assert main(["predict", "--model-dir", str(tmp_path / "weights.pth"), str(images / "6.png")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"vitkit predict: error: {tmp_path / 'weights.pth'} is a checkpoint file without a config: make it a model "
        f"directory with the registered model it fits, vitkit convert {tmp_path / 'weights.pth'} --model NAME --out "
        "DIR (see `vitkit models`), and give that directory"
    )


def test_a_directory_without_its_datas_description(model, images, capsys, tmp_path):
    named = save_pretrained(model, tmp_path / "named", ModelInfo(CLASSES, MEAN, STD))
    assert main(["predict", "--model-dir", str(named), str(images / "b"), "--json"]) == 0
    captured = capsys.readouterr()
    _check_rows(json.loads(captured.out), model, [images / "b" / "4.png", images / "b" / "5.bmp"])
    assert captured.err.count("note:") == 1
    assert f"{named} holds no description of the data its model was trained on" in captured.err
    plain = save_pretrained(model, tmp_path / "plain")  # no names, no statistics: indices and ImageNet's
    assert main(["predict", "--model-dir", str(plain), str(images / "7.png"), "--json"]) == 0
    captured = capsys.readouterr()
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    _check_rows(json.loads(captured.out), model, [images / "7.png"], ("0", "1", "2"), 3, *imagenet)
    assert "class indices (0, 1, ...) as names" in captured.err and "ImageNet's mean / std" in captured.err


def test_a_hugging_face_export_predicts_with_its_id2label(model, images, capsys, tmp_path):
    exported = export_weights(model, tmp_path / "hf", "hf", ModelInfo(CLASSES, MEAN, STD))
    assert main(["predict", "--model-dir", str(exported), str(images / "6.png"), "--json"]) == 0
    captured = capsys.readouterr()
    _check_rows(json.loads(captured.out), model, [images / "6.png"])
    assert "using the class names saved with the model, the mean / std saved with the model" in captured.err


def test_precision_runs_the_forward_under_bf16_autocast_and_defaults_to_the_runs(model, images, capsys, tmp_path):
    def rows(model_dir, *flags):
        assert main(["predict", "--model-dir", str(model_dir), str(images / "b"), "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    run = tmp_path / "run"
    model_dir = save_pretrained(model, run / "best", ModelInfo(CLASSES, MEAN, STD, data="d"))
    fp32 = rows(model_dir)
    _check_rows(fp32, model, [images / "b" / "4.png", images / "b" / "5.bmp"])
    bf16 = rows(model_dir, "--precision", "bf16")
    fp32_values, bf16_values = (np.array([t["probability"] for r in found for t in r["top"]]) for found in (fp32, bf16))
    assert np.abs(bf16_values - fp32_values).max() > 1e-5  # not fp32's values: the forward ran in bf16
    assert bf16_values == pytest.approx(fp32_values, abs=0.02)
    # a model directory of a run that validated in bf16 predicts in bf16 unless told otherwise
    (run / "config.json").write_text(json.dumps({"batch_size": 2, "epochs": 1, "data": "d", "out": str(run),
                                                 "precision": "bf16"}))  # fmt: skip
    assert rows(model_dir) == bf16
    assert rows(model_dir, "--precision", "fp32") == fp32


def test_a_bf16_that_measures_slower_here_runs_as_asked_and_is_said_once(model, images, capsys, tmp_path, monkeypatch):
    """`--precision bf16`, or a run's saved bf16, on a CPU whose bf16 products measure slower than fp32 (a Xeon
    with AVX512-BF16 and no AMX, faked): the command runs bf16 and says so once, with both rates; fp32 and `auto`
    say nothing."""
    from vitkit.analysis import precision

    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: precision.MatmulRates(fp32=255e9, bf16=162e9))
    run = tmp_path / "run"
    model_dir = save_pretrained(model, run / "best", ModelInfo(CLASSES, MEAN, STD, data="d"))
    args = ["predict", "--model-dir", str(model_dir), str(images / "6.png"), "--json"]
    assert main(args) == 0
    fp32 = capsys.readouterr()
    assert "warning" not in fp32.err
    for saved, flags in ((None, ["--precision", "bf16"]), ("bf16", [])):
        if saved:  # the run that wrote the model validated in bf16
            (run / "config.json").write_text(json.dumps({"batch_size": 2, "epochs": 1, "data": "d", "out": str(run),
                                                         "precision": saved}))  # fmt: skip
        assert main(args + flags) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out) != json.loads(fp32.out)  # run as asked: in bf16
        assert captured.err.count("warning") == 1
        assert (
            "vitkit predict: warning: bf16 is slower than fp32 on this CPU "
        ) in captured.err and (
            "matrix products run at 162.0 GFLOP/s in bf16 against 255.0 in fp32 (1.6x slower); use fp32 (--precision "
            "fp32) or the faster of the two (--precision auto)"
        ) in captured.err
    for flags in (["--precision", "fp32"], ["--precision", "auto"]):
        assert main(args + flags) == 0
        assert "warning" not in capsys.readouterr().err


def test_a_high_depth_image_that_reads_nearly_black_gets_a_note(model_dir, capsys, tmp_path):
    """16-bit images are scaled to 8 bits by their depth: one whose values reach 235 of 0..65535 (8-bit values stored
    in 16 bits, as microscopes write) reads as 0..1 and gets a note with the fix; one that fills its range, an 8-bit
    one and a 16-bit one just above the line (16 in 8 bits) get none. `vitkit attention` says it the same way."""
    ramp = np.linspace(0, 1, 28 * 28).reshape(28, 28)
    for name, top in {"dim.png": 235, "full.png": 65535, "edge.png": 16 * 257}.items():
        Image.fromarray((ramp * top).round().astype(np.uint16)).save(tmp_path / name)
    Image.fromarray((ramp * 20).round().astype(np.uint8)).save(tmp_path / "dark8.png")  # 8 bits: as it is
    assert main(["predict", "--model-dir", str(model_dir), str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 4  # predicted all the same: a note, not an error
    note = (
        f"vitkit predict: note: {tmp_path / 'dim.png'} is 16-bit with values up to 235 of 0..65535: scaled to 8 bits "
        "by its depth it is nearly black (0..1), and the model sees it so; stretch each file to its full range"
    )
    assert captured.err.count("note:") == 1 and note in captured.err
    out = tmp_path / "attention.png"
    assert main(["attention", "--model-dir", str(model_dir), str(tmp_path / "dim.png"), "--out", str(out)]) == 0
    assert note.replace("vitkit predict", "vitkit attention") in capsys.readouterr().err
