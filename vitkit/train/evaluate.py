"""Evaluating a classifier on a held-out set (loss, top-1, top-5, per-class accuracy, confusion matrix) and
predicting the classes of single images.

Letters: B batch, K classes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from vitkit.data import (
    DataInfo,
    EpochSampler,
    TransformedImages,
    eval_transform,
    load_eval_split,
    make_loader,
    normalize,
    open_image,
    preprocess,
)
from vitkit.data.sources import IMAGE_EXTENSIONS
from vitkit.layers import to_2tuple
from vitkit.train.distributed import DistEnv, all_reduce_sum, resolve_device
from vitkit.weights import from_pretrained


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy (no label smoothing)
    top1: float  # fraction of images whose most probable class is right
    top5: float  # fraction whose right class is among the five most probable (all classes when K < 5)
    count: int  # images evaluated
    confusion: torch.Tensor  # (K, K) int64 counts: row = true class, column = predicted class
    skipped: tuple[str, ...]  # images that could not be read
    classes: tuple[str, ...] = ()  # the K class names, in label order (empty when not known)

    @property
    def per_class(self) -> torch.Tensor:
        """(K,) accuracy of each class (NaN for a class with no images)."""
        return self.confusion.diagonal().double() / self.confusion.sum(dim=1).double()

    def class_accuracies(self) -> dict[str, float | None]:
        """Accuracy by class name (None for a class with no images); classes named by their index when unnamed."""
        names = self.classes or tuple(str(k) for k in range(len(self.confusion)))
        accuracies = self.per_class.tolist()
        return {name: None if math.isnan(acc) else acc for name, acc in zip(names, accuracies, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: images, loss, top1, top5, per_class (name -> accuracy or None), confusion, skipped."""
        return {
            "images": self.count,
            "loss": self.loss,
            "top1": self.top1,
            "top5": self.top5,
            "per_class": self.class_accuracies(),
            "confusion": self.confusion.tolist(),
            "skipped": list(self.skipped),
        }


@dataclass(frozen=True)
class Prediction:
    image: str  # the image file
    top: list[tuple[str, float]]  # (class name, probability), most probable first

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: image, top (a list of {class, probability})."""
        return {"image": self.image, "top": [{"class": name, "probability": p} for name, p in self.top]}


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """bfloat16 autocast for precision "bf16", a disabled context for "fp32"."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, info: DataInfo, env: DistEnv | None = None, precision: str = "fp32"
) -> EvalResult:
    """Evaluate `model` on the batches of `loader` (a `vitkit.data.make_loader` loader of uint8 images, normalised
    here with `info`'s statistics). With `env`, each process evaluates its shard and the counts are summed."""
    model.eval()
    device = next(model.parameters()).device
    num_classes = len(info.classes)
    totals = torch.zeros(4, dtype=torch.float64)  # loss sum, top-1 hits, top-5 hits, images
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    skipped: list[str] = []
    k = min(5, num_classes)
    for batch in loader:
        skipped += [s.name for s in batch.skipped]
        if len(batch.labels) == 0:
            continue
        images = normalize(batch.images.to(device), info.mean, info.std)  # (B, C, H, W)
        labels = batch.labels.to(device)
        with autocast(device, precision):
            logits = model(images)  # (B, K)
        logits = logits.float()
        ranked = logits.topk(k, dim=1).indices  # (B, k)
        totals += torch.tensor(
            [
                F.cross_entropy(logits, labels, reduction="sum").item(),
                (ranked[:, 0] == labels).sum().item(),
                (ranked == labels[:, None]).any(dim=1).sum().item(),
                len(labels),
            ],
            dtype=torch.float64,
        )
        pairs = labels.cpu() * num_classes + ranked[:, 0].cpu()  # (true, predicted) -> one index in [0, K*K)
        confusion += torch.bincount(pairs, minlength=num_classes**2).view(num_classes, num_classes)  # (K*K,) -> (K, K)
    if env is not None:
        totals = all_reduce_sum(totals.to(device), env).cpu()
        confusion = all_reduce_sum(confusion.to(device), env).cpu()
    count = int(totals[3])
    if count == 0:
        raise ValueError("no readable images to evaluate")
    loss, top1, top5 = (totals[:3] / count).tolist()
    return EvalResult(loss, top1, top5, count, confusion, tuple(skipped), tuple(info.classes))


def evaluate_model_dir(
    model_dir: str, data: str | None = None, batch_size: int = 256, device: str | None = None, workers: int = 0
) -> tuple[EvalResult, DataInfo]:
    """Evaluate the model vitkit train wrote to `model_dir` on `data` (see `vitkit.data.load_eval_split`; by
    default the held-out part of its training data). Returns the result and the data description saved with it."""
    model = from_pretrained(model_dir).to(resolve_device(device))
    info = DataInfo.load(model_dir)
    transform = eval_transform(to_2tuple(model.config.img_size), model.config.in_chans)
    images = TransformedImages(load_eval_split(data, info), transform)
    loader = make_loader(images, EpochSampler(len(images), shuffle=False, pad=False), batch_size, workers)
    return evaluate(model, loader, info), info


@torch.no_grad()
def predict(
    model: nn.Module, info: DataInfo, images: list[Image.Image], top_k: int = 5
) -> list[list[tuple[str, float]]]:
    """The `top_k` most probable classes of each image, as (class name, probability), most probable first.

    Images are preprocessed as in evaluation: converted to the model's channels, resized and centre-cropped to
    the model's img_size, normalised with the training data's statistics saved in `info`.
    """
    config = model.config
    if config.num_classes != len(info.classes):
        raise ValueError(f"the model has {config.num_classes} outputs but {len(info.classes)} class names")
    if top_k <= 0:
        raise ValueError(f"top_k must be positive, got {top_k}")
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    batch = torch.stack([preprocess(image, img_size, config.in_chans, info.mean, info.std) for image in images])
    batch = batch.to(device)  # (B, C, H, W)
    probs = model.eval()(batch).float().softmax(dim=-1)  # (B, K)
    values, indices = probs.topk(min(top_k, len(info.classes)), dim=-1)
    return [
        [(info.classes[i], p) for i, p in zip(row_i.tolist(), row_p.tolist(), strict=True)]
        for row_i, row_p in zip(indices, values, strict=True)
    ]


def predict_files(
    model: nn.Module, info: DataInfo, paths: Sequence[str | os.PathLike], top_k: int = 5
) -> list[Prediction]:
    """`predict` for image files: each file's `top_k` classes with its name, in the order given."""
    results = predict(model, info, [open_image(path) for path in paths], top_k)
    return [Prediction(os.fspath(path), top) for path, top in zip(paths, results, strict=True)]


def image_paths(items: Sequence[str | os.PathLike]) -> list[Path]:
    """Image files named by `items`: a file as it is, a folder as the image files below it (any depth, by a known
    image extension, sorted); OSError for an item that does not exist or a folder without images."""
    paths: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
            if not found:
                raise FileNotFoundError(f"{item} holds no images (files ending in {', '.join(IMAGE_EXTENSIONS)})")
            paths += found
        elif item.exists():
            paths.append(item)
        else:
            raise FileNotFoundError(f"{item} does not exist: expected an image file or a folder of images")
    return paths
