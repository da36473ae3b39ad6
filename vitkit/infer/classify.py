"""Predicting the classes of images under a classifier: a list of images in one batch, image files, or many files
through a DataLoader that skips the unreadable ones.

Letters: B batch, K classes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch import nn

from vitkit.data import (
    Framing,
    Unreadable,
    center_crop_share,
    eval_transform,
    normalize,
    open_image,
    preprocess,
)
from vitkit.infer.files import image_loader, progress_bar
from vitkit.infer.runtime import autocast
from vitkit.layers import to_2tuple
from vitkit.weights import ModelInfo

# An image of which the model sees less than this share (its centre crop, `eval_transform`: a 2:1 image under a
# square model keeps a half) gets a note (`crop_note`): what it classified may lie outside what it saw
MIN_KEPT = 0.5


@dataclass(frozen=True)
class Prediction:
    image: str  # the image file
    top: list[tuple[str, float]]  # (class name, probability), most probable first
    size: tuple[int, int] | None = None  # the image's (height, width) as read (upright), None when not known

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: image, top (a list of {class, probability})."""
        return {"image": self.image, "top": [{"class": name, "probability": p} for name, p in self.top]}


@dataclass(frozen=True)
class Predictions:
    predictions: list[Prediction]  # the readable images, in the order given
    skipped: list[Unreadable]  # the images that could not be read, with the reason, in the order given

    def to_dicts(self) -> list[dict[str, Any]]:
        """The predictions as plain JSON values (`Prediction.to_dict`), what `vitkit predict --json` writes."""
        return [prediction.to_dict() for prediction in self.predictions]


def _check_classes(model: nn.Module, classes: Sequence[str], top_k: int) -> None:
    if model.config.num_classes <= 0:
        raise ValueError(f"the model has no classifier (num_classes {model.config.num_classes}): nothing to predict")
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
    model: nn.Module, info: ModelInfo, images: list[Image.Image], top_k: int = 5
) -> list[list[tuple[str, float]]]:
    """The `top_k` most probable classes of each image, as (class name, probability), most probable first.

    Images are preprocessed as in evaluation: converted to the model's channels, resized and centre-cropped to
    the model's img_size as `info` frames them (`ModelInfo.framing`), normalised with the statistics saved in
    `info`.
    """
    _check_classes(model, info.classes, top_k)
    config = model.config
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    framing = info.framing()
    batch = torch.stack([preprocess(im, img_size, config.in_chans, info.mean, info.std, framing) for im in images])
    batch = batch.to(device)  # (B, C, H, W)
    probs = model.eval()(batch).float().softmax(dim=-1)  # (B, K)
    return _top(probs, info.classes, top_k)


def predict_files(
    model: nn.Module, info: ModelInfo, paths: Sequence[str | os.PathLike], top_k: int = 5
) -> list[Prediction]:
    """`predict` for image files: each file's `top_k` classes with its name, in the order given. An unreadable
    file raises `vitkit.data.UnreadableImageError`; `predict_paths` skips it instead."""
    images = [open_image(path) for path in paths]
    results = predict(model, info, images, top_k)
    return [
        Prediction(os.fspath(path), top, (image.height, image.width))
        for path, image, top in zip(paths, images, results, strict=True)
    ]


@torch.no_grad()
def predict_paths(
    model: nn.Module,
    info: ModelInfo,
    paths: Sequence[str | os.PathLike],
    top_k: int = 5,
    batch_size: int = 32,
    workers: int = 0,
    progress: bool | None = None,
    on_unreadable: Callable[[Unreadable], None] | None = None,
    precision: str = "fp32",
) -> Predictions:
    """`predict` for many image files, batched through a DataLoader: files that cannot be read are skipped, not
    raised, and returned with the reason in `Predictions.skipped`.

    Args:
        batch_size: images per forward pass.
        workers: DataLoader worker processes decoding the images (0: in this process).
        progress: a progress bar on stderr (a terminal only); None shows one for more than
            `vitkit.infer.files.PROGRESS_MIN_IMAGES`.
        on_unreadable: called with each unreadable file as it is met (e.g. to warn).
        precision: the forward's ("bf16": bfloat16 autocast).
    """
    _check_classes(model, info.classes, top_k)
    config = model.config
    transform = eval_transform(to_2tuple(config.img_size), config.in_chans, info.framing())
    loader = image_loader(paths, transform, batch_size, workers, sizes=True)
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
                with autocast(device, precision):
                    probs = model(images).float().softmax(dim=-1)  # (B, K)
                tops = _top(probs, info.classes, top_k)
                for index, size, top in zip(batch.labels.tolist(), batch.sizes.tolist(), tops, strict=True):
                    predictions.append(Prediction(os.fspath(paths[index]), top, tuple(size)))
            bar.update(len(batch.labels) + len(batch.skipped))
    return Predictions(predictions, skipped)


def crop_note(prediction: Prediction, img_size: tuple[int, int], framing: Framing | None = None) -> str | None:
    """A note for an image of which a classifier of `img_size` (H, W) saw less than `MIN_KEPT` of what it sees of an
    image of its own shape (its centre crop, `eval_transform`; `framing`'s crop_pct aside): the share and the pixels
    it saw, and how to have all of it seen; None for any other image, for one of unknown size, and where the model
    squashes images whole."""
    if prediction.size is None:
        return None
    framing = framing or Framing()
    share = center_crop_share(prediction.size, img_size, framing)
    if framing.crop_mode == "squash" or share / framing.crop_pct**2 >= MIN_KEPT:  # the shape's loss, not the crop's
        return None
    (h, w), (H, W) = prediction.size, img_size
    left, top, right, bottom = framing.crop_box(prediction.size, img_size)
    seen = f"{round(right - left)}x{round(bottom - top)}"  # the crop in the image's pixels, width x height
    shape = "a square" if H == W else f"the model's {W}:{H} (width:height)"
    return (
        f"{prediction.image}: the model saw {share:.1%} of it, the centre {seen} of its {w}x{h} pixels (width x "
        f"height), as it resizes an image to cover {W}x{H} and crops the centre; to classify all of it, crop the part "
        f"that matters or pad the image to {shape}"
    )
