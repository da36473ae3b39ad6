"""Evaluating a classifier on a held-out set (loss, top-1, top-5, per-class accuracy, confusion matrix) and
predicting the classes of images, one at a time or many through a DataLoader.

A model directory written by `vitkit train` holds dataset.json (`vitkit.data.DataInfo`: class names, normalisation,
the data it was trained on). One written by `save_pretrained`, `vitkit convert` or `export_weights` has none; it is
used with what its config holds (`vitkit.weights.ModelInfo`): the class names there, else the class indices
("0", "1", ...), and the mean / std there, else ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225), the
statistics of timm's models and of vitkit's folder training. Image size and channels always come from the model's
config. `missing_info_note` says which of these stood in, in one sentence for people.

Letters: B batch, K classes.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from vitkit.data import (
    DataInfo,
    EpochSampler,
    ImageFiles,
    TransformedImages,
    Unreadable,
    check_eval_classes,
    eval_split,
    eval_transform,
    load_eval_split,
    make_loader,
    normalize,
    open_image,
    preprocess,
)
from vitkit.data.detection import IMAGENET_MEAN, IMAGENET_STD
from vitkit.data.sources import IMAGE_EXTENSIONS, INFO_NAME
from vitkit.layers import to_2tuple
from vitkit.train.distributed import DistEnv, all_reduce_sum, resolve_device
from vitkit.weights import from_pretrained, model_info, read_model_info

GLOB_CHARACTERS = "*?["  # an item holding one of these, and naming no existing file, is a glob pattern
PROGRESS_MIN_IMAGES = 40  # more images than this, about a screenful of results, get a progress bar


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy (no label smoothing)
    top1: float  # fraction of images whose most probable class is right
    top5: float  # fraction whose right class is among the five most probable (all classes when K < 5)
    count: int  # images evaluated
    confusion: torch.Tensor  # (K, K) int64 counts: row = true class, column = predicted class
    skipped: tuple[Unreadable, ...]  # images that could not be read, with the reason
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
        """Plain JSON values: images, loss, top1, top5, per_class (name -> accuracy or None), confusion, skipped
        (a list of {image, reason})."""
        return {
            "images": self.count,
            "loss": self.loss,
            "top1": self.top1,
            "top5": self.top5,
            "per_class": self.class_accuracies(),
            "confusion": self.confusion.tolist(),
            "skipped": unreadable_dicts(self.skipped),
        }


def unreadable_dicts(skipped: Sequence[Unreadable]) -> list[dict[str, str]]:
    """Unreadable images as plain JSON values: [{"image": name, "reason": why}, ...]."""
    return [{"image": item.name, "reason": item.error} for item in skipped]


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
    skipped: list[Unreadable] = []
    k = min(5, num_classes)
    for batch in loader:
        skipped += batch.skipped
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


def model_dir_classes(model: nn.Module) -> tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]:
    """(class names, mean, std) from a loaded model's own config (`vitkit.weights.model_info`): its class names or
    the indices "0".."K-1", its mean / std or ImageNet's. What stands in for a missing dataset.json."""
    saved = model_info(model)
    num_classes = getattr(model.config, "num_classes", 0)
    classes = saved.class_names or tuple(str(k) for k in range(num_classes))
    if saved.mean is None or saved.std is None:
        return classes, IMAGENET_MEAN, IMAGENET_STD
    return classes, saved.mean, saved.std


def missing_info_note(directory: str | os.PathLike, names_from: str | None = None) -> str | None:
    """One sentence saying what stands in for the dataset.json a model directory lacks (None when it has one).

    Args:
        names_from: the data evaluated on, whose class names stand in when the model has none saved.
    """
    if (Path(directory) / INFO_NAME).is_file():
        return None
    saved = read_model_info(directory)
    if saved.class_names is not None:
        names = "the class names saved with the model"
    elif names_from is not None:
        names = f"the class names of {names_from} (none saved with the model)"
    else:
        names = "class indices (0, 1, ...) as names (none saved with the model)"
    stats = "the mean / std saved with the model" if saved.mean is not None else "ImageNet's mean / std (none saved)"
    return (
        f"{directory} has no {INFO_NAME} (vitkit train writes one): using {names}, {stats}, and the image size and "
        "channels of the model's config"
    )


def load_classifier(directory: str | os.PathLike, device: str | None = None) -> tuple[nn.Module, DataInfo]:
    """(model on `device`, data description) of a classifier's model directory.

    The description is its dataset.json, or without one (a directory of `save_pretrained`, `vitkit convert`,
    `export_weights`, a Hugging Face model) what the model's config holds (`model_dir_classes`), with an empty
    `source` (the training data is unknown). ValueError for a model without classifier (num_classes 0).
    """
    model = from_pretrained(directory).to(resolve_device(device))
    num_classes = getattr(model.config, "num_classes", 0)
    if num_classes <= 0:
        raise ValueError(
            f"{directory} holds a model without classifier (num_classes {num_classes}): nothing to predict"
        )
    if (Path(directory) / INFO_NAME).is_file():
        info = DataInfo.load(directory)
    else:
        classes, mean, std = model_dir_classes(model)
        info = DataInfo("", classes, mean, std, val_fraction=0.0, split_seed=0)
    if len(info.classes) != num_classes:
        raise ValueError(f"{directory}: the model has {num_classes} outputs but {len(info.classes)} class names")
    return model, info


def evaluate_model_dir(
    model_dir: str, data: str | None = None, batch_size: int = 256, device: str | None = None, workers: int = 0
) -> tuple[EvalResult, DataInfo]:
    """Evaluate the classifier in `model_dir` on `data` (see `vitkit.data.load_eval_split`; by default the held-out
    part of its training data, which only a directory written by vitkit train knows).

    A directory without dataset.json (see `load_classifier`) needs `data`; when its config names no classes, the
    data's class names are taken, in their sorted order, as the model's (`missing_info_note` words what stood in).
    Returns the result and the data description used.
    """
    model, info = load_classifier(model_dir, device)
    if data is None:
        if not info.source:
            raise ValueError(
                f"{model_dir} has no {INFO_NAME}, so the data it was trained on is unknown: name the data to "
                "evaluate on (vitkit eval --data DIR)"
            )
        held = load_eval_split(None, info)
    else:
        held, found = eval_split(data)
        if not info.source and model_info(model).class_names is None:
            if len(found) != len(info.classes):
                raise ValueError(f"{data} has {len(found)} classes {list(found)}, the model has {len(info.classes)}")
            info = replace(info, classes=found)
        check_eval_classes(data, found, info.classes)
    transform = eval_transform(to_2tuple(model.config.img_size), model.config.in_chans)
    images = TransformedImages(held, transform)
    loader = make_loader(images, EpochSampler(len(images), shuffle=False, pad=False), batch_size, workers)
    return evaluate(model, loader, info), info


def _check_classes(model: nn.Module, classes: Sequence[str], top_k: int) -> None:
    if model.config.num_classes != len(classes):
        raise ValueError(f"the model has {model.config.num_classes} outputs but {len(classes)} class names")
    if top_k <= 0:
        raise ValueError(f"top_k must be positive, got {top_k}")


def _top(probs: torch.Tensor, classes: Sequence[str], top_k: int) -> list[list[tuple[str, float]]]:
    """Each row's `top_k` most probable classes of probabilities (B, K), as (class name, probability)."""
    values, indices = probs.topk(min(top_k, len(classes)), dim=-1)  # (B, k)
    return [
        [(classes[i], p) for i, p in zip(row_i, row_p, strict=True)]
        for row_i, row_p in zip(indices.tolist(), values.tolist(), strict=True)
    ]


@torch.no_grad()
def predict(
    model: nn.Module, info: DataInfo, images: list[Image.Image], top_k: int = 5
) -> list[list[tuple[str, float]]]:
    """The `top_k` most probable classes of each image, as (class name, probability), most probable first.

    Images are preprocessed as in evaluation: converted to the model's channels, resized and centre-cropped to
    the model's img_size, normalised with the training data's statistics saved in `info`.
    """
    _check_classes(model, info.classes, top_k)
    config = model.config
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    batch = torch.stack([preprocess(image, img_size, config.in_chans, info.mean, info.std) for image in images])
    batch = batch.to(device)  # (B, C, H, W)
    probs = model.eval()(batch).float().softmax(dim=-1)  # (B, K)
    return _top(probs, info.classes, top_k)


def predict_files(
    model: nn.Module, info: DataInfo, paths: Sequence[str | os.PathLike], top_k: int = 5
) -> list[Prediction]:
    """`predict` for image files: each file's `top_k` classes with its name, in the order given. An unreadable
    file raises `vitkit.data.UnreadableImageError`; `predict_paths` skips it instead."""
    results = predict(model, info, [open_image(path) for path in paths], top_k)
    return [Prediction(os.fspath(path), top) for path, top in zip(paths, results, strict=True)]


@dataclass(frozen=True)
class Predictions:
    predictions: list[Prediction]  # the readable images, in the order given
    skipped: list[Unreadable]  # the images that could not be read, with the reason, in the order given

    def to_dicts(self) -> list[dict[str, Any]]:
        """The predictions as plain JSON values (`Prediction.to_dict`), what `vitkit predict --json` writes."""
        return [prediction.to_dict() for prediction in self.predictions]


@contextmanager
def progress_bar(total: int, progress: bool | None, unit: str = "image") -> Iterator[tqdm]:
    """A tqdm bar on stderr, shown on a terminal only. `progress` None: shown for more than
    `PROGRESS_MIN_IMAGES` items."""
    show = total > PROGRESS_MIN_IMAGES if progress is None else progress
    bar = tqdm(total=total, unit=unit, leave=False, disable=None if show else True)  # None: a terminal only
    try:
        yield bar
    finally:
        bar.close()


def image_loader(
    paths: Sequence[str | os.PathLike],
    transform: Callable[[Image.Image], Any] | None,
    batch_size: int | None,
    workers: int = 0,
) -> DataLoader:
    """A DataLoader over image files in the order given, each sample (transform(image), its index in `paths`) or,
    for a file that cannot be read, a `vitkit.data.Unreadable` (file and reason), which does not stop the rest.

    Batches are `vitkit.data.Batch`es (the indices as labels, the unreadable files in `skipped`); `batch_size`
    None gives the samples one by one, unbatched (with `transform` None, the PIL images themselves).
    """
    if not paths:
        raise ValueError("no image files given")
    images = TransformedImages(ImageFiles([Path(p) for p in paths], list(range(len(paths)))), transform or _as_is)
    sampler = EpochSampler(len(paths), shuffle=False, pad=False)
    if batch_size is not None:
        return make_loader(images, sampler, batch_size, workers)
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    return DataLoader(images, batch_size=None, sampler=sampler, num_workers=workers, collate_fn=_as_is)


def _as_is(sample: Any) -> Any:
    return sample


@torch.no_grad()
def predict_paths(
    model: nn.Module,
    info: DataInfo,
    paths: Sequence[str | os.PathLike],
    top_k: int = 5,
    batch_size: int = 32,
    workers: int = 0,
    progress: bool | None = None,
    on_unreadable: Callable[[Unreadable], None] | None = None,
) -> Predictions:
    """`predict` for many image files, batched through a DataLoader: files that cannot be read are skipped, not
    raised, and returned with the reason in `Predictions.skipped`.

    Args:
        batch_size: images per forward pass.
        workers: DataLoader worker processes decoding the images (0: in this process).
        progress: a progress bar on stderr (a terminal only); None shows one for more than `PROGRESS_MIN_IMAGES`.
        on_unreadable: called with each unreadable file as it is met (e.g. to warn).
    """
    _check_classes(model, info.classes, top_k)
    config = model.config
    transform = eval_transform(to_2tuple(config.img_size), config.in_chans)
    loader = image_loader(paths, transform, batch_size, workers)
    device = next(model.parameters()).device
    model.eval()
    predictions: list[Prediction] = []
    skipped: list[Unreadable] = []
    with progress_bar(len(paths), progress) as bar:
        for batch in loader:
            for item in batch.skipped:
                skipped.append(item)
                if on_unreadable is not None:
                    on_unreadable(item)
            if len(batch.labels) > 0:
                images = normalize(batch.images.to(device), info.mean, info.std)  # (B, C, H, W)
                probs = model(images).float().softmax(dim=-1)  # (B, K)
                for index, top in zip(batch.labels.tolist(), _top(probs, info.classes, top_k), strict=True):
                    predictions.append(Prediction(os.fspath(paths[index]), top))
            bar.update(len(batch.labels) + len(batch.skipped))
    return Predictions(predictions, skipped)


def _folder_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())


def image_paths(items: Sequence[str | os.PathLike]) -> list[Path]:
    """Image files named by `items`, each once, in the order named:

    - a file as it is (whatever its name; a file that is no image is reported when read);
    - a folder as the image files below it, at any depth, by a known image extension (sorted);
    - a glob pattern (``*``, ``?``, ``[...]``; ``**`` for any depth, e.g. ``"imgs/**/*.png"``) as the image files
      it matches and the images of the folders it matches (sorted). An item naming an existing file is that file
      even when its name holds these characters.

    FileNotFoundError naming an item that does not exist, a folder without images, or a pattern matching none.
    """
    paths: list[Path] = []
    known = ", ".join(IMAGE_EXTENSIONS)
    for item in map(os.fspath, items):
        path = Path(item)
        if path.is_dir():
            found = _folder_images(path)
            if not found:
                raise FileNotFoundError(f"{item} holds no images (files ending in {known})")
        elif path.exists():
            found = [path]
        elif any(c in item for c in GLOB_CHARACTERS):
            found = []
            for match in map(Path, sorted(glob.glob(item, recursive=True))):
                if match.is_dir():
                    found += _folder_images(match)
                elif match.suffix.lower() in IMAGE_EXTENSIONS and match.is_file():
                    found.append(match)
            if not found:
                raise FileNotFoundError(f"the pattern {item!r} matches no image files (files ending in {known})")
        else:
            raise FileNotFoundError(f"{item} does not exist: expected an image file, a folder or a glob pattern")
        paths += found
    return list(dict.fromkeys(paths))


def _output_file(path: str | os.PathLike) -> Path:
    """`path` with its folder created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def prediction_table(predictions: Sequence[Prediction]) -> list[list[str]]:
    """Rows of strings, a header first: image, label_1, prob_1, ..., label_k, prob_k (k the most classes any image
    has; probabilities as Python prints floats). The rows `write_predictions_csv` writes."""
    k = max((len(p.top) for p in predictions), default=0)
    header = ["image"] + [f"{what}_{rank}" for rank in range(1, k + 1) for what in ("label", "prob")]
    rows = [[p.image] + [str(v) for name, prob in p.top for v in (name, prob)] for p in predictions]
    return [header, *rows]


def format_predictions(predictions: Sequence[Prediction]) -> str:
    """The predictions as a text table with aligned columns: one line per image, a header first; probabilities
    with four decimals."""
    header = prediction_table(predictions)[0]
    cells = [header] + [[p.image] + [v for name, prob in p.top for v in (name, f"{prob:.4f}")] for p in predictions]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in cells)


def write_predictions_csv(predictions: Sequence[Prediction], path: str | os.PathLike) -> Path:
    """Write `prediction_table` as CSV to `path` (its folder created); returns the path."""
    path = _output_file(path)
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(prediction_table(predictions))
    return path


def write_json(rows: Any, path: str | os.PathLike) -> Path:
    """Write plain JSON values to `path` (its folder created), indented; returns the path."""
    path = _output_file(path)
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return path
