"""train, predict and attention estimate their peak memory before allocating and refuse a run that would not fit,
naming the command's own flags; --ignore-memory-check runs it anyway with a warning."""

from __future__ import annotations

import pytest

import vitkit
from vitkit.analysis import estimate_memory
from vitkit.cli import main
from vitkit.data import load_builtin, write_image_folder

TINY = ["--model", "vit_tiny_patch16_224", "--model-arg", "img_size=28", "--model-arg", "patch_size=7"]
TINY += ["--model-arg", "embed_dim=16", "--model-arg", "depth=1", "--model-arg", "num_heads=2"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """20 digit images in class folders, and a tiny classifier saved without its data's description."""
    _, test, info = load_builtin("mnist5k")
    data = write_image_folder(test, info.classes, tmp_path_factory.mktemp("digits"), per_class=2)
    model_dir = tmp_path_factory.mktemp("model")
    model = vitkit.create_model(
        "vit_tiny_patch16_224", num_classes=10, img_size=28, patch_size=7, embed_dim=16, depth=1, num_heads=2
    )
    vitkit.save_pretrained(model, model_dir)
    return data, model_dir


@pytest.fixture
def one_mebibyte(monkeypatch):
    """The machine seen with 1 MiB available: too little to train the tiny model at batch 64."""
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": 2**20)


@pytest.fixture
def four_kibibytes(monkeypatch):
    """The machine seen with 4 KiB available: too little for one forward pass of the tiny model."""
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": 2**12)


def test_train_is_refused_before_it_writes_anything(digits, one_mebibyte, tmp_path, capsys):
    data, _ = digits
    out = tmp_path / "run"
    args = ["train", *TINY, "--data", str(data), "--val-fraction", "0.5", "--epochs", "1", "--device", "cpu"]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "VisionTransformer training at batch 64" in err and "but only 1 MiB is available" in err
    assert "--batch-size" in err and "(the largest batch that fits)" in err and "--ignore-memory-check" in err
    assert not out.exists() or not any(out.iterdir())  # nothing written, nothing moved
    with pytest.warns(UserWarning, match="available"):
        assert main([*args, "--out", str(out), "--ignore-memory-check"]) == 0
    assert (out / "final" / "model.safetensors").is_file()


def test_predict_is_refused_with_its_own_flags(digits, monkeypatch, capsys):
    data, model_dir = digits
    image = str(sorted(data.rglob("*.png"))[0])
    one = estimate_memory(vitkit.from_pretrained(model_dir), None, 1, training=False).needed_bytes
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": int(one / 0.9) + 16)
    assert main(["predict", "--model-dir", str(model_dir), image, "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "inference at batch 4" in err and "--batch-size 1 (the largest batch that fits)" in err
    assert "--ignore-memory-check" in err and "--grad-checkpointing" not in err and "--img-size" not in err
    assert main(["predict", "--model-dir", str(model_dir), image, "--batch-size", "1"]) == 0
    with pytest.warns(UserWarning, match="available"):
        assert (
            main(["predict", "--model-dir", str(model_dir), image, "--batch-size", "4", "--ignore-memory-check"]) == 0
        )


def test_attention_is_refused_before_it_draws(digits, four_kibibytes, tmp_path, capsys):
    data, model_dir = digits
    image = str(sorted(data.rglob("*.png"))[0])
    figure = tmp_path / "attention.png"
    assert main(["attention", "--model-dir", str(model_dir), image, "--out", str(figure)]) == 2
    err = capsys.readouterr().err
    assert "--ignore-memory-check" in err and "--batch-size" not in err and not figure.exists()
    with pytest.warns(UserWarning, match="available"):
        assert (
            main(["attention", "--model-dir", str(model_dir), image, "--out", str(figure), "--ignore-memory-check"])
            == 0
        )
    assert figure.is_file()
