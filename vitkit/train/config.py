"""The configuration of a training run: one frozen dataclass, written resolved to OUT/config.json."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitkit.data import DEFAULT_DATA, augment_defaults
from vitkit.weights.io import read_json

CONFIG_NAME = "config.json"
DEFAULT_OUT = "runs/train"
PRECISIONS = ("fp32", "bf16")  # fp32, or bfloat16 autocast of the forward pass

# The default model: a small ViT for the bundled 28x28 digits, 16 tokens of 7x7 patches (models/vit.py).
DEFAULT_MODEL = "vit_digits_patch7_28"
# Runs written before the digits model had a name saved it as this model with these fields replaced: the same
# architecture, which a resumed run accepts under either spelling (`current_model_name`).
LEGACY_DEFAULT_MODEL = "vit_tiny_patch16_224"
LEGACY_DEFAULT_MODEL_ARGS: dict[str, Any] = {
    "img_size": 28,
    "patch_size": 7,
    "embed_dim": 128,
    "depth": 4,
    "num_heads": 4,
    "mlp_ratio": 2.0,
}


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] = dataclasses.MISSING,  # type: ignore[assignment]
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A `TrainConfig` field that `vitkit train` offers as an option (`vitkit.cli.options.add_config_options`).

    The option's type follows the field's annotation: int, float or str; a bool is a switch that sets True; a dict
    takes KEY=VALUE pairs, repeatable.

    Args:
        default, default_factory: as for `dataclasses.field`.
        help: the option's --help text; " (default: X)" is appended unless the default is None, a bool or a factory.
        flag: the option's name when it is not --field-name.
        metavar, choices: as for `argparse.ArgumentParser.add_argument`.
    """
    cli = {"help": help, "flag": flag, "metavar": metavar, "choices": choices}
    metadata = {k: v for k, v in cli.items() if v is not None}
    return field(default=default, default_factory=default_factory, metadata=metadata)


@dataclass(frozen=True)
class TrainConfig:
    """A training run. Every field is a `vitkit train` option, with its --help text in `help`; the comments say
    what the help leaves out."""

    # None: DEFAULT_MODEL, unless init is given
    model: str | None = option(None, help="registry name (see 'vitkit models'); default: a small ViT for 28x28 digits")
    # config fields replaced in the model, e.g. {"depth": 6}
    model_args: dict[str, Any] = option(
        default_factory=dict,
        flag="--model-arg",
        metavar="KEY=VALUE",
        help="replace a model config field, e.g. --model-arg depth=6 (repeatable)",
    )
    # start from this save_pretrained directory instead of a fresh model; not together with model
    init: str | None = option(
        None, help="fine-tune from this save_pretrained directory (position table and head adapted)"
    )
    # "builtin:NAME" or an ImageFolder path
    data: str = option(
        DEFAULT_DATA, help="builtin:NAME or a folder: train/ and val/ of class folders, or class folders"
    )
    val_fraction: float = option(0.1, help="share of each class held out from a folder without val/")
    epochs: int = option(40, help="passes over the training data")
    # the global batch is batch_size * processes
    batch_size: int = option(64, help="images per step and process")
    lr: float = option(2e-3, help="peak learning rate (AdamW)")
    min_lr: float = option(1e-5, help="learning rate at the end of the cosine decay")
    # fractions allowed, at most the whole run
    warmup_epochs: float = option(2.0, help="linear warmup, in epochs")
    # never on norms, biases, tokens, position tables
    weight_decay: float = option(0.05, help="decoupled weight decay on weight matrices")
    label_smoothing: float = option(0.1, help="cross-entropy label smoothing")  # in [0, 1)
    clip_grad: float = option(1.0, help="clip the gradient norm to this value (0: off)")  # the global norm
    # in [0, 1); the average is what is validated and saved
    ema_decay: float = option(0.0, help="keep an EMA of the weights with this decay, e.g. 0.999 (0: off)")
    img_size: int | None = option(None, help="training image side (default: the model's)")
    # bf16: bfloat16 autocast of the forward pass
    precision: str = option("fp32", help="fp32, or bf16 autocast", choices=PRECISIONS)
    device: str | None = option(None, help="cpu or cuda (default: cuda when available)", choices=("cpu", "cuda"))
    workers: int = option(0, help="data loader worker processes")  # 0 loads in the training process
    seed: int = option(0, help="seed of initialisation, data order, augmentation and splits")
    # the random resized crop keeps min_scale..1 of the area
    min_scale: float | None = option(None, help="smallest area kept by the random crop (default: the data's)")
    # the data's default: 0 for digits, 0.5 for folders
    hflip: float | None = option(None, help="horizontal flip probability (default: the data's)")
    randaugment: int = option(0, help="RandAugment magnitude 0..30 (0: off)")
    mixup: float = option(0.0, help="MixUp alpha (0: off)")
    cutmix: float = option(0.0, help="CutMix alpha (0: off)")  # with both on, each batch picks one
    grad_checkpointing: bool = option(False, help="recompute blocks in backward to save memory")
    # receives config.json, metrics.jsonl, checkpoint.pt, best/, final/
    out: str = option(DEFAULT_OUT, help="output folder", metavar="DIR")

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
        if self.precision not in PRECISIONS:
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
            model_args=dict(self.model_args),
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

    @classmethod
    def for_resume(cls, out: str | os.PathLike = DEFAULT_OUT, **changes: Any) -> TrainConfig:
        """The configuration that continues the run in `out`: its config.json with the fields in `changes`
        replaced, or, when `out` holds no config.json yet, a new configuration of `changes`. This is what
        `vitkit train --out OUT --resume [options]` trains: pass it to `fit(config, resume=True)`.

        Args:
            out: the run's output folder.
            changes: fields to set; a resumed run refuses any but `vitkit.train.loop.RESUME_MAY_CHANGE` that
                differ from the checkpoint's.
        """
        if (Path(out) / CONFIG_NAME).is_file():
            return dataclasses.replace(cls.load(out), out=os.fspath(out), **changes)
        return cls(out=os.fspath(out), **changes)


def current_model_name(values: Mapping[str, Any]) -> dict[str, Any]:
    """Config values (as in config.json) with an older run's spelling of the default model, LEGACY_DEFAULT_MODEL
    with LEGACY_DEFAULT_MODEL_ARGS replaced, written as DEFAULT_MODEL with only the other replaced fields."""
    values = dict(values)
    model_args = values.get("model_args") or {}
    if values.get("model") == LEGACY_DEFAULT_MODEL and set(LEGACY_DEFAULT_MODEL_ARGS) <= set(model_args):
        values["model"] = DEFAULT_MODEL
        legacy = LEGACY_DEFAULT_MODEL_ARGS
        values["model_args"] = {k: v for k, v in model_args.items() if k not in legacy or legacy[k] != v}
    return values
