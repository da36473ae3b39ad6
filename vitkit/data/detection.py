"""Detection samples as vitkit's detectors take them, whatever the source (`vitkit.data.digits_detect`, the bundled
`builtin:digits-detect`; `vitkit.data.coco`, COCO-format folders; `vitkit.data.detection_sources.load_detection`
picks one by name): the description of a dataset (`DetectionInfo`), how a training split is augmented
(`DetectionAugment`) and the sampler of a split.

Every dataset gives, per image, a float image (C, H, W) normalised with the dataset's mean and std, and a target
dict as DETR's criterion and vitkit's COCO evaluation take it (`detection_target`):

- `labels` (n,) int64 class indices in [0, K); `boxes` (n, 4) float32 (cx, cy, w, h) in [0, 1] of the image;
- `image_id` () int64; `orig_size` (2,) int64 (height, width) of the image as stored, `size` as given to the model;
- `area` (n,) float32 of each object in pixels of the stored image (COCO's small / medium / large split).

`vitkit.detection.collate_detection` batches them (padding to the largest image) and reports images that could
not be read. Class indices are contiguous; `DetectionInfo.category_ids` maps them back to the dataset's category ids
(to write predictions in COCO's results format). `vitkit.data.detection_stats` describes a dataset from its
annotations alone (image sides, boxes per class and per image, box sizes), to choose training settings by.

Letters: C channels, H, W image size, n objects of an image, K classes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from vitkit.data.loader import EpochSampler
from vitkit.data.sources import INFO_NAME, check_normalisation

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DETR normalises COCO images so


@dataclass(frozen=True)
class DetectionInfo:
    """What a detector needs to know about its data; saved next to the model as `dataset.json`."""

    source: str  # "builtin:digits-detect" or the COCO folder given for training
    classes: tuple[str, ...]  # class names, in class-index order
    category_ids: tuple[int, ...]  # the dataset's category id of each class index
    mean: tuple[float, ...]  # per-channel normalisation mean of images scaled to [0, 1]
    std: tuple[float, ...]  # per-channel normalisation std, same channels as `mean`
    task: str = "detection"  # tells a detection dataset description from a classification one

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `dataset.json` into `directory` (created if missing); returns its path."""
        path = Path(directory) / INFO_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> DetectionInfo:
        """Read the `dataset.json` written by `save`."""
        path = Path(directory) / INFO_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: expected a model directory written by vitkit train")
        try:
            fields = json.loads(path.read_text())
            if not isinstance(fields, dict):
                names = [f.name for f in dataclasses.fields(cls)]
                raise TypeError(f"it holds a JSON {type(fields).__name__}, expected an object with keys {names}")
            if fields.get("task") != "detection":
                raise TypeError(f"task is {fields.get('task')!r}, not 'detection'")
            info = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        except (json.JSONDecodeError, TypeError) as err:
            raise ValueError(f"{path} is not a vitkit detection dataset description: {err}") from err
        mean, std = check_normalisation(info.mean, info.std, str(path))
        return dataclasses.replace(info, mean=mean, std=std)


@dataclass(frozen=True)
class DetectionAugment:
    """How a COCO training split is augmented (`vitkit.data.transforms.detection_train_transform`): the
    probability of a horizontal flip, the relative range of the multi-scale shorter side, the probability of a
    random crop. All 0: no augmentation."""

    hflip: float = 0.0
    scale_jitter: float = 0.0
    crop: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.hflip or self.scale_jitter or self.crop)


def resized(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` resized to (width, height) by bilinear interpolation (antialiased when shrinking), as PIL does."""
    return image if image.size == size else image.resize(size, Image.Resampling.BILINEAR)


def detection_target(
    boxes_xyxy: np.ndarray,
    labels: np.ndarray,
    areas: np.ndarray,
    image_id: int,
    orig_size: tuple[int, int],
    size: tuple[int, int],
) -> dict[str, torch.Tensor]:
    """A target dict from (n, 4) pixel boxes (x0, y0, x1, y1) of an image of `orig_size` (height, width)."""
    height, width = orig_size
    xyxy = np.asarray(boxes_xyxy, dtype=np.float32).reshape(-1, 4)
    centres = (xyxy[:, :2] + xyxy[:, 2:]) / 2  # (n, 2)
    sides = xyxy[:, 2:] - xyxy[:, :2]  # (n, 2)
    boxes = np.concatenate([centres, sides], axis=1) / np.array([width, height, width, height], dtype=np.float32)
    return {
        "labels": torch.from_numpy(np.asarray(labels, dtype=np.int64).reshape(-1)),
        "boxes": torch.from_numpy(boxes),  # (n, 4) (cx, cy, w, h) in [0, 1]
        "image_id": torch.tensor(image_id, dtype=torch.int64),
        "orig_size": torch.tensor(orig_size, dtype=torch.int64),
        "size": torch.tensor(size, dtype=torch.int64),
        "area": torch.from_numpy(np.asarray(areas, dtype=np.float32).reshape(-1)),
    }


def sample_index(key: int | tuple[int, int]) -> int:
    """A sample index from an index, or from an (index, seed) pair or (index, seed, batch seed) triple of
    `EpochSampler`."""
    return int(key[0]) if isinstance(key, tuple) else int(key)


def detection_sampler(
    dataset: Dataset, batch_size: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = False, seed: int = 0
) -> EpochSampler:
    """The sampler of a detection split: a COCO split's batches hold images of one orientation (`orientations`), so
    they pad little. Training (`shuffle`) pads the processes' shares to equal length, evaluation does not. Padding
    is not free even under the pixel mask: the backbone's convolutions see it at the right and bottom edges (the
    shapes folder's best model scores AP 0.595 in mixed batches of 25, 0.614 in batches of one orientation)."""
    orientations = getattr(dataset, "orientations", None)
    groups = orientations() if orientations is not None else None
    return EpochSampler(len(dataset), num_replicas, rank, shuffle, seed, shuffle, batch_size, groups)
