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

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from vitkit.data.loader import EpochSampler

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DETR normalises COCO images so


@dataclass(frozen=True)
class DetectionInfo:
    """What a detector needs to know about its data (`vitkit train` saves it with the model, in its config.json:
    `vitkit.weights.ModelInfo`)."""

    source: str  # "builtin:digits-detect" or the COCO folder given for training
    classes: tuple[str, ...]  # class names, in class-index order
    category_ids: tuple[int, ...]  # the dataset's category id of each class index
    mean: tuple[float, ...]  # per-channel normalisation mean of images scaled to [0, 1]
    std: tuple[float, ...]  # per-channel normalisation std, same channels as `mean`


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
