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
from vitkit.train.recipe import (
    CLASSIFICATION,
    CLASSIFIER_RECIPE,
    DEFAULT_MODEL,
    DETR_RECIPE,
    SMALL_DETR_RECIPE,
    recipe_for,
    resolve_task,
)
from vitkit.weights.io import read_json

CONFIG_NAME = "config.json"
DEFAULT_OUT = "runs/train"
PRECISIONS = ("fp32", "bf16")  # fp32, or bfloat16 autocast of the forward pass
DETECTION_LOSSES = ("ce", "focal")  # DETR's softmax cross-entropy, Deformable DETR's sigmoid focal loss
CLASSIFICATION_ONLY = ("label_smoothing", "mixup", "cutmix", "randaugment", "min_scale", "hflip")
DETECTION_ONLY = ("backbone_lr", "detection_loss", "box_cls_loss")

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


def recipe_defaults(name: str) -> str:
    """ "default: <classifier's>; small DETRs <theirs>; DETR <DETR's>" for a recipe field, for --help (not applicable
    values left out)."""
    found = [
        (label, getattr(recipe, name))
        for label, recipe in (("", CLASSIFIER_RECIPE), ("small DETRs ", SMALL_DETR_RECIPE), ("DETR ", DETR_RECIPE))
    ]
    return "default: " + "; ".join(f"{label}{value:g}" for label, value in found if value is not None)


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
    what the help leaves out. Options left at None take the value of the run's recipe (`vitkit.train.recipe`):
    the classifier recipe, the small DETRs' (detr_digits, detr_tiny) or DETR's."""

    # None: DEFAULT_MODEL, or DEFAULT_DETECTOR for detection data, unless init is given
    model: str | None = option(
        None,
        help="registry name (see 'vitkit models'); default: a small ViT for 28x28 digits, detr_digits for detection",
    )
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
    # "builtin:NAME", an ImageFolder path or a COCO-format folder; detection data trains a detector
    data: str = option(
        DEFAULT_DATA,
        help="builtin:NAME (mnist5k, digits-detect), a folder of class folders (train/ and val/, or one set), or a "
        "COCO-format detection folder",
    )
    val_fraction: float = option(0.1, help="share of each class held out from a folder without val/")
    epochs: int | None = option(None, help=f"passes over the training data ({recipe_defaults('epochs')})")
    # the global batch is batch_size * processes
    batch_size: int | None = option(None, help=f"images per step and process ({recipe_defaults('batch_size')})")
    lr: float | None = option(None, help=f"peak learning rate, AdamW ({recipe_defaults('lr')})")
    # the backbone's parameter groups are scaled with the others by the schedule
    backbone_lr: float | None = option(
        None, help=f"peak learning rate of a detector's backbone ({recipe_defaults('backbone_lr')})"
    )
    min_lr: float | None = option(
        None, help=f"learning rate at the end of the cosine decay ({recipe_defaults('min_lr')})"
    )
    # fractions allowed, at most the whole run
    warmup_epochs: float | None = option(None, help=f"linear warmup, in epochs ({recipe_defaults('warmup_epochs')})")
    # never on norms, biases, tokens, position tables
    weight_decay: float | None = option(
        None, help=f"decoupled weight decay on weight matrices ({recipe_defaults('weight_decay')})"
    )
    # in [0, 1); classification only
    label_smoothing: float | None = option(
        None, help=f"cross-entropy label smoothing of a classifier ({recipe_defaults('label_smoothing')})"
    )
    # "ce": softmax over the classes and "no object" (DETR); "focal": a sigmoid per class (Deformable DETR)
    detection_loss: str | None = option(
        None,
        help=f"a detector's classification loss (default: small DETRs {SMALL_DETR_RECIPE.detection_loss}; DETR "
        f"{DETR_RECIPE.detection_loss})",
        choices=DETECTION_LOSSES,
    )
    # >= 0; the classifier of RoIAlign-pooled boxes is trained with the detector and not saved with it
    box_cls_loss: float | None = option(
        None,
        help="weight of a detector's auxiliary loss classifying each ground-truth box from its backbone's features "
        f"({recipe_defaults('box_cls_loss')}; 0: off)",
    )
    # the global norm
    clip_grad: float | None = option(
        None, help=f"clip the gradient norm to this value, 0: off ({recipe_defaults('clip_grad')})"
    )
    # in [0, 1); the average is what is validated and saved
    ema_decay: float = option(0.0, help="keep an EMA of the weights with this decay, e.g. 0.999 (0: off)")
    # a detector's digits-detect canvas side, or the shorter side of its COCO images
    img_size: int | None = option(None, help="training image side (default: the model's)")
    # bf16: bfloat16 autocast of the forward pass
    precision: str = option("fp32", help="fp32, or bf16 autocast", choices=PRECISIONS)
    device: str | None = option(None, help="cpu or cuda (default: cuda when available)", choices=("cpu", "cuda"))
    workers: int = option(0, help="data loader worker processes")  # 0 loads in the training process
    seed: int = option(0, help="seed of initialisation, data order, augmentation and splits")
    # the random resized crop keeps min_scale..1 of the area; classification only
    min_scale: float | None = option(None, help="smallest area kept by the random crop (default: the data's)")
    # the data's default: 0 for digits, 0.5 for folders; classification only
    hflip: float | None = option(None, help="horizontal flip probability (default: the data's)")
    randaugment: int = option(0, help="RandAugment magnitude 0..30 (0: off)")
    mixup: float = option(0.0, help="MixUp alpha (0: off)")
    cutmix: float = option(0.0, help="CutMix alpha (0: off)")  # with both on, each batch picks one
    grad_checkpointing: bool = option(False, help="recompute blocks in backward to save memory")
    # receives config.json, metrics.jsonl, checkpoint.pt, best/, final/
    out: str = option(DEFAULT_OUT, help="output folder", metavar="DIR")

    def __post_init__(self) -> None:
        positive = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "backbone_lr": self.backbone_lr,
        }
        for name, value in positive.items():
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        nonnegative = {
            "min_lr": self.min_lr,
            "warmup_epochs": self.warmup_epochs,
            "weight_decay": self.weight_decay,
            "clip_grad": self.clip_grad,
            "box_cls_loss": self.box_cls_loss,
            "workers": self.workers,
            "mixup": self.mixup,
            "cutmix": self.cutmix,
        }
        for name, value in nonnegative.items():
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.label_smoothing is not None and not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0 is off), got {self.ema_decay}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.detection_loss is not None and self.detection_loss not in DETECTION_LOSSES:
            raise ValueError(f"detection_loss must be 'ce' or 'focal', got {self.detection_loss!r}")
        if self.init is not None and self.model is not None:
            raise ValueError(f"give a model name ({self.model!r}) or init ({self.init!r}), not both")
        if self.img_size is not None and self.img_size <= 0:
            raise ValueError(f"img_size must be positive, got {self.img_size}")

    @property
    def task(self) -> str:
        """ "classification" or "detection": what the model and the data train (`vitkit.train.recipe.resolve_task`)."""
        return resolve_task(self.model, self.init, self.data)[0]

    def resolved(self) -> TrainConfig:
        """The same run with every None default filled in from its task and recipe, as written to config.json;
        ValueError for a model that does not fit the data, or an option the task does not have."""
        task, model = resolve_task(self.model, self.init, self.data)
        recipe = recipe_for(task, model if self.init is None else None)
        unused = CLASSIFICATION_ONLY if task != CLASSIFICATION else DETECTION_ONLY
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        given = [name for name in unused if getattr(self, name) != defaults[name]]
        if given:
            raise ValueError(f"option(s) {given} do not apply to {task}; leave them out")
        fill = {k: v for k, v in recipe.to_dict().items() if getattr(self, k) is None}
        if task == CLASSIFICATION:
            augment = augment_defaults(self.data)
            fill.update({k: v for k, v in augment.items() if getattr(self, k) is None})
        return dataclasses.replace(self, model=model, model_args=dict(self.model_args), **fill)

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
