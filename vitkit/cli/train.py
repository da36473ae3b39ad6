"""`vitkit train`: train a vision transformer on bundled data or an ImageFolder tree (also under torchrun)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from vitkit.cli.options import parse_assignment
from vitkit.train import TrainConfig, fit
from vitkit.train.config import CONFIG_NAME

HELP = "train a model (default: a small ViT on the bundled MNIST digits); runs under torchrun for several GPUs/nodes"

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}


def _model_arg(text: str) -> tuple[str, Any]:
    try:
        return parse_assignment(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def add_parser(parser: argparse.ArgumentParser) -> None:
    # Options left out stay out of the namespace (SUPPRESS), so --resume can tell them from defaults.
    def option(flag: str, field: str, help: str, **kwargs: Any) -> None:
        default = _DEFAULTS.get(field)
        shown = "" if default is None or isinstance(default, bool) else f" (default: {default})"
        parser.add_argument(flag, dest=field, default=argparse.SUPPRESS, help=help + shown, **kwargs)

    option("--model", "model", "registry name (see 'vitkit models'); default: a small ViT for 28x28 digits")
    parser.add_argument(
        "--model-arg",
        dest="model_args",
        metavar="KEY=VALUE",
        type=_model_arg,
        action="append",
        default=argparse.SUPPRESS,
        help="replace a model config field, e.g. --model-arg depth=6 (repeatable)",
    )
    option("--init", "init", "fine-tune from this save_pretrained directory (position table and head adapted)")
    option("--data", "data", "builtin:NAME or a folder: train/ and val/ of class folders, or class folders")
    option("--val-fraction", "val_fraction", "share of each class held out from a folder without val/", type=float)
    option("--epochs", "epochs", "passes over the training data", type=int)
    option("--batch-size", "batch_size", "images per step and process", type=int)
    option("--lr", "lr", "peak learning rate (AdamW)", type=float)
    option("--min-lr", "min_lr", "learning rate at the end of the cosine decay", type=float)
    option("--warmup-epochs", "warmup_epochs", "linear warmup, in epochs", type=float)
    option("--weight-decay", "weight_decay", "decoupled weight decay on weight matrices", type=float)
    option("--label-smoothing", "label_smoothing", "cross-entropy label smoothing", type=float)
    option("--clip-grad", "clip_grad", "clip the gradient norm to this value (0: off)", type=float)
    option("--ema-decay", "ema_decay", "keep an EMA of the weights with this decay, e.g. 0.999 (0: off)", type=float)
    option("--img-size", "img_size", "training image side (default: the model's)", type=int)
    option("--precision", "precision", "fp32, or bf16 autocast", choices=("fp32", "bf16"))
    option("--device", "device", "cpu or cuda (default: cuda when available)", choices=("cpu", "cuda"))
    option("--workers", "workers", "data loader worker processes", type=int)
    option("--seed", "seed", "seed of initialisation, data order, augmentation and splits", type=int)
    option("--min-scale", "min_scale", "smallest area kept by the random crop (default: the data's)", type=float)
    option("--hflip", "hflip", "horizontal flip probability (default: the data's)", type=float)
    option("--randaugment", "randaugment", "RandAugment magnitude 0..30 (0: off)", type=int)
    option("--mixup", "mixup", "MixUp alpha (0: off)", type=float)
    option("--cutmix", "cutmix", "CutMix alpha (0: off)", type=float)
    option(
        "--grad-checkpointing",
        "grad_checkpointing",
        "recompute blocks in backward to save memory",
        action="store_const",
        const=True,
    )
    option("--out", "out", "output folder", metavar="DIR")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--force", action="store_true", help="start afresh even if --out holds a run")


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("vitkit")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields}
    if "model_args" in given:
        given["model_args"] = dict(given["model_args"])
    out = Path(given.get("out", _DEFAULTS["out"]))
    if args.resume and (out / CONFIG_NAME).is_file():
        config = dataclasses.replace(TrainConfig.load(out), **given)
    else:
        config = TrainConfig(**given)
    _setup_logging()
    result = fit(config, resume=args.resume, force=args.force)
    return 130 if result.interrupted else 0
