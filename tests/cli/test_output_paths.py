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
