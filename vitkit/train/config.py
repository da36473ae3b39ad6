"""The configuration of a training run: one frozen dataclass, written resolved to OUT/config.json."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitkit.data import DEFAULT_DATA, augment_defaults
from vitkit.weights.io import read_json

CONFIG_NAME = "config.json"

# The default model: a small ViT for the bundled 28x28 digits, 16 tokens of 7x7 patches.
DEFAULT_MODEL = "vit_tiny_patch16_224"
DEFAULT_MODEL_ARGS: dict[str, Any] = {
    "img_size": 28,
    "patch_size": 7,
    "embed_dim": 128,
    "depth": 4,
    "num_heads": 4,
    "mlp_ratio": 2.0,
}


@dataclass(frozen=True)
class TrainConfig:
    out: str = "runs/train"  # output folder: config.json, metrics.jsonl, checkpoint.pt, best/, final/
    data: str = DEFAULT_DATA  # "builtin:NAME" or an ImageFolder path (train/ + val/, or class folders)
    val_fraction: float = 0.1  # share of every class held out when an ImageFolder path has no val/ folder
    model: str | None = None  # registry name; None: DEFAULT_MODEL with DEFAULT_MODEL_ARGS (unless init is given)
    model_args: dict[str, Any] = field(default_factory=dict)  # config fields replaced in the model, e.g. depth
    init: str | None = None  # start from this save_pretrained directory (fine-tuning) instead of a fresh model
    img_size: int | None = None  # training image side; None: the model's own img_size
    epochs: int = 40  # passes over the training set
    batch_size: int = 64  # images per step and process (the global batch is batch_size * processes)
    lr: float = 2e-3  # peak learning rate of AdamW
    min_lr: float = 1e-5  # learning rate at the end of the cosine decay
    warmup_epochs: float = 2.0  # linear warmup length in epochs (fractions allowed), at most the whole run
    weight_decay: float = 0.05  # decoupled weight decay on weight matrices (not norms, biases, tokens, tables)
    label_smoothing: float = 0.1  # cross-entropy label smoothing
    clip_grad: float = 1.0  # clip the global gradient norm to this value; 0 turns clipping off
    ema_decay: float = 0.0  # keep an exponential moving average of the weights with this decay; 0 is off
    precision: str = "fp32"  # "fp32", or "bf16" for bfloat16 autocast of the forward pass
    device: str | None = None  # "cpu" or "cuda"; None: cuda when available
    workers: int = 0  # data loader worker processes (0 loads in the training process)
    seed: int = 0  # seeds model initialisation, data order, augmentation and the held-out split
    min_scale: float | None = None  # random resized crop keeps min_scale..1 of the area; None: the data's default
    hflip: float | None = None  # horizontal flip probability; None: the data's default (0 for digits, 0.5 folders)
    randaugment: int = 0  # RandAugment magnitude (0..30); 0 is off
    mixup: float = 0.0  # MixUp alpha; 0 is off
    cutmix: float = 0.0  # CutMix alpha; 0 is off (with both on, each batch picks one)
    grad_checkpointing: bool = False  # recompute blocks in backward to save activation memory

    def __post_init__(self) -> None:
        positive = {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr}
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        nonnegative = {
            "min_lr": self.min_lr,
            "warmup_epochs": self.warmup_epochs,
            "weight_decay": self.weight_decay,
            "clip_grad": self.clip_grad,
            "workers": self.workers,
            "mixup": self.mixup,
            "cutmix": self.cutmix,
        }
        for name, value in nonnegative.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0 is off), got {self.ema_decay}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.init is not None and self.model is not None:
            raise ValueError(f"give a model name ({self.model!r}) or init ({self.init!r}), not both")
        if self.img_size is not None and self.img_size <= 0:
            raise ValueError(f"img_size must be positive, got {self.img_size}")

    def resolved(self) -> TrainConfig:
        """The same run with every None default filled in, as written to config.json."""
        augment = augment_defaults(self.data)
        default_model = self.model is None and self.init is None
        return dataclasses.replace(
            self,
            model=DEFAULT_MODEL if default_model else self.model,
            model_args={**DEFAULT_MODEL_ARGS, **self.model_args} if default_model else dict(self.model_args),
            min_scale=self.min_scale if self.min_scale is not None else augment["min_scale"],
            hflip=self.hflip if self.hflip is not None else augment["hflip"],
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def save(self, directory: str | os.PathLike) -> Path:
        """Write config.json into `directory`; returns its path."""
        path = Path(directory) / CONFIG_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> TrainConfig:
        """The configuration an earlier run saved in `directory`/config.json."""
        path = Path(directory) / CONFIG_NAME
        values = read_json(path)
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{path}: unknown training option(s) {unknown}")
        return cls(**values)
