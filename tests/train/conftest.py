from __future__ import annotations

from pathlib import Path

import pytest

from vitkit.data import load_builtin, load_digits_detect, write_coco_folder, write_image_folder
from vitkit.train import TrainConfig

# A ViT small enough that a training epoch on a few dozen 28x28 images takes a fraction of a second.
TINY_MODEL = {"img_size": 28, "patch_size": 7, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 1.0}


@pytest.fixture(scope="session")
def digit_folder(tmp_path_factory) -> Path:
    """40 MNIST digits (4 per class) as an ImageFolder tree of PNG files."""
    _, test, info = load_builtin("mnist5k")
    return write_image_folder(test, info.classes, tmp_path_factory.mktemp("digits"), per_class=4)


@pytest.fixture(scope="session")
def tiny_config(digit_folder):
    """Factory of short runs: 30 training and 10 held-out digits, batches of 8, a tiny ViT, two epochs."""

    def make(out: Path, **changes) -> TrainConfig:
        fields = dict(
            out=str(out),
            data=str(digit_folder),
            val_fraction=0.25,
            model="vit_tiny_patch16_224",
            model_args=dict(TINY_MODEL),
            epochs=2,
            batch_size=8,
            warmup_epochs=0.5,
            device="cpu",
        )
        return TrainConfig(**{**fields, **changes})

    return make


@pytest.fixture(scope="session")
def train_command():
    """The `vitkit train` command line (after `python -m`) of a config made by `tiny_config`."""

    def command(config: TrainConfig, batch_size: int | None = None) -> list[str]:
        args = ["vitkit", "train", "--out", config.out, "--data", config.data, "--model", config.model]
        args += ["--val-fraction", str(config.val_fraction), "--epochs", str(config.epochs), "--device", "cpu"]
        args += ["--batch-size", str(batch_size or config.batch_size), "--warmup-epochs", str(config.warmup_epochs)]
        for key, value in config.model_args.items():
            args += ["--model-arg", f"{key}={value}"]
        return args

    return command


# detr_digits' layout small enough that an epoch on 24 canvases takes a fraction of a second.
TINY_DETR = {
    "backbone_width": 8,
    "hidden_dim": 16,
    "num_heads": 2,
    "dim_feedforward": 32,
    "num_queries": 6,
    "dec_layers": 2,
}


@pytest.fixture(scope="session")
def digits_coco(tmp_path_factory) -> Path:
    """A COCO-format folder of digits-detect canvases: 24 training canvases, 8 validation canvases."""
    train, val, _ = load_digits_detect()
    root = tmp_path_factory.mktemp("digits_coco")
    write_coco_folder(train, root, "train", limit=24)
    write_coco_folder(val, root, "val", limit=8)
    return root


@pytest.fixture(scope="session")
def tiny_detector_config(digits_coco):
    """Factory of short detector runs: 24 training and 8 held-out canvases, batches of 8, a tiny DETR, two epochs."""

    def make(out: Path, **changes) -> TrainConfig:
        fields = dict(
            out=str(out),
            data=str(digits_coco),
            model="detr_digits",
            model_args=dict(TINY_DETR),
            epochs=2,
            batch_size=8,
            device="cpu",
        )
        return TrainConfig(**{**fields, **changes})

    return make
