"""Every output is checked before the work: an export's suffix must name its format, and a file or folder under a
path that is a file, or in a folder that cannot be written, is refused naming the path and why, before any model
is read or any image decoded; an export over an existing file says it replaced it."""

from __future__ import annotations

import os

import pytest
import torch

import vitkit
from vitkit.cli import main

MISSING = "no_model_here"  # read after the checks: the errors below are about the outputs, not the model


def test_an_export_is_named_for_its_format(tmp_path, capsys):
    assert main(["export", "--model-dir", MISSING, "--format", "onnx", "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert "ends in .pt (a TorchScript file's suffix); --format onnx writes an ONNX file: name it" in err
    assert str(tmp_path / "m.onnx") in err and MISSING not in err
    assert main(["export", "--model-dir", MISSING, "--format", "torchscript", "--out", str(tmp_path / "m")]) == 2
    assert "ends in nothing (no suffix); --format torchscript writes a TorchScript file" in capsys.readouterr().err
    folder = tmp_path / "exports"
    folder.mkdir()
    assert main(["export", "--model-dir", MISSING, "--format", "onnx", "--out", str(folder)]) == 2
    said = f"--out {folder} is a folder; --format onnx writes one file: name it, e.g. {folder / 'model.onnx'}"
    assert said in capsys.readouterr().err


def test_an_export_over_a_file_says_it_replaced_it(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    vitkit.save_pretrained(model, tmp_path / "model")
    out = tmp_path / "m.pt"
    out.write_bytes(b"an older file")
    assert main(["export", "--model-dir", str(tmp_path / "model"), "--format", "torchscript", "--out", str(out)]) == 0
    assert f"replaced the file that was at {out}" in capsys.readouterr().err
    assert out.read_bytes() != b"an older file"


@pytest.mark.parametrize(
    "command",
    [
        ["export", "--model-dir", MISSING, "--format", "onnx", "--out", "{blocked}/m.onnx"],
        ["eval", "--model-dir", MISSING, "--plot", "{blocked}/pr.png"],
        ["attention", "--model-dir", MISSING, "a.png", "--out", "{blocked}/a.png"],
        ["predict", "--model", "detr_resnet50", "--pretrained", "a.png", "--out", "{blocked}/found"],
        ["predict", "--model", "vit_tiny_patch16_224", "--pretrained", "a.png", "--json", "{blocked}/p.json"],
    ],
    ids=["export", "eval", "attention", "predict", "predict_json"],
)
def test_an_output_under_a_file_is_refused_before_the_work(tmp_path, capsys, command):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    assert main([part.replace("{blocked}", str(blocked)) for part in command]) == 2
    err = capsys.readouterr().err
    assert f"{blocked} is a file, not a folder" in err and MISSING not in err


@pytest.mark.parametrize("inside", [False, True], ids=["the_file", "under_it"])
def test_a_training_run_into_a_file_is_refused_naming_it(tmp_path, capsys, inside):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    out = blocked / "run" if inside else blocked
    assert main(["train", "--epochs", "1", "--out", str(out)]) == 2
    said = f"cannot use {out} as the output folder: {blocked} is a file, not a folder"
    assert said in capsys.readouterr().err and blocked.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes everywhere")
def test_a_folder_that_cannot_be_written_is_named(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["export", "--model-dir", MISSING, "--format", "onnx", "--out", str(locked / "m.onnx")]) == 2
    assert f"may not write in {locked}" in capsys.readouterr().err


@pytest.fixture
def saved(tmp_path):
    """A tiny classifier's and a tiny detector's folders, and a folder of two PNG images."""
    torch.manual_seed(0)
    vitkit.save_pretrained(
        vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3), tmp_path / "cls"
    )
    vitkit.save_pretrained(vitkit.create_model("detr_digits", num_classes=3), tmp_path / "det")
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    for name in ("a.png", "b.png"):
        Image.new("RGB", (40, 30), (90, 120, 150)).save(images / name)
    return tmp_path


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (
            ["predict", "--model-dir", "{cls}", "{images}/a.png", "--json={cls}/config.json"],
            "a file of the model folder",
        ),
        (["predict", "--model-dir", "{cls}", "{images}", "--csv={images}/b.png"], "--csv takes the CSV file to write"),
        (
            ["predict", "--model-dir", "{cls}", "{images}", "--csv={cls}/model.safetensors"],
            "is a file of the model folder",
        ),
        (["predict", "--model-dir", "{det}", "{images}/a.png", "--json={images}/a.png"], "--json takes the JSON file"),
        (
            ["predict", "--model-dir", "{det}", "{images}", "--out", "{images}"],
            "would be written to {images}/a.png, an image this command reads",
        ),
        (
            ["attention", "--model-dir", "{cls}", "{images}/a.png", "--out", "{images}/a.png"],
            "is {images}/a.png, which this command reads",
        ),
    ],
    ids=["json-config", "csv-image", "csv-weights", "json-image", "pictures-over-images", "attention-input"],
)
def test_an_output_never_replaces_what_the_command_reads(saved, capsys, command, said):
    """Before any work: a report or picture written over an image read, or over a file of the model folder, is
    refused, and both stay as they were."""
    before = {p: p.read_bytes() for p in saved.rglob("*") if p.is_file()}
    fill = {"{cls}": str(saved / "cls"), "{det}": str(saved / "det"), "{images}": str(saved / "images")}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    assert main([filled(part) for part in command]) == 2
    assert filled(said) in capsys.readouterr().err
    assert {p: p.read_bytes() for p in saved.rglob("*") if p.is_file()} == before


def test_a_plot_over_an_image_of_the_data_is_refused(saved, capsys):
    """check-data's picture over an image of the folder it reads."""
    assert main(["check-data", str(saved / "images"), "--plot", str(saved / "images" / "b.png")]) == 2
    assert f"is an image of {saved / 'images'}, which this command reads" in capsys.readouterr().err


def test_an_earlier_output_in_the_model_folder_is_replaced(saved):
    """Only the model's own files (configs, weights) are kept from being written over: a report written into its
    folder by an earlier run of the command is replaced on the next."""
    report = saved / "cls" / "preds.json"
    report.write_text("[]")
    assert main(["predict", "--model-dir", str(saved / "cls"), str(saved / "images"), f"--json={report}"]) == 0
    assert report.read_text() != "[]"
