"""Detection data: the bundled `builtin:digits-detect` set and COCO-format datasets (an instances JSON and images).

Both datasets give, per image, a float image (C, H, W) normalised with the dataset's mean and std, and a target
dict as DETR's criterion and vitkit's COCO evaluation take it:

- `labels` (n,) int64 class indices in [0, K); `boxes` (n, 4) float32 (cx, cy, w, h) in [0, 1] of the image;
- `image_id` () int64; `orig_size` (2,) int64 (height, width) of the image as stored, `size` as given to the model;
- `area` (n,) float32 of each object in pixels of the stored image (COCO's small / medium / large split).

`vitkit.detection.collate_detection` batches them (padding to the largest image) and reports images that could
not be read. Class indices are contiguous; `DetectionInfo.category_ids` maps them back to the dataset's category ids
(to write predictions in COCO's results format). `detection_stats` describes a dataset from its annotations alone
(image sides, boxes per class and per image, box sizes), to choose training settings by.

digits-detect draws fresh training canvases every epoch and is not augmented otherwise. COCO images are resized so
the shorter side is `short_side` and the longer at most `max_size` (DETR's evaluation transform, 800 and 1333 by
default); a training split may also be augmented as DETR trains (`DetectionAugment`: flips, random crops and
multi-scale resizing, `vitkit.data.transforms.detection_train_transform`), each sample under its own seed.

Letters: C channels, H, W image size, n objects of an image, K classes.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors

from vitkit.data.loader import EpochSampler, Unreadable
from vitkit.data.sources import (
    BUILTIN_PREFIX,
    UnreadableImageError,
    load_builtin,
    open_image,
)
from vitkit.data.transforms import channel_stats, detection_train_transform, image_mode
from vitkit.util import counted

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DETR normalises COCO images so

# --- builtin:digits-detect ------------------------------------------------------------------------------------------

DIGITS_DETECT = "digits-detect"
CANVAS = 96  # canvas side in pixels
GLYPH_SIDES = (20, 40)  # each 28x28 digit is resized to a square of a side drawn from this range (inclusive)
MAX_DIGITS = 4  # digits drawn per canvas: 1 to this many, uniformly
MAX_IOU = 0.2  # two digits' boxes overlap with IoU below this ...
MAX_COVER = 0.3  # ... and cover less than this fraction of the smaller box
PLACEMENT_TRIES = 50  # random positions tried for a digit before it is left out of its canvas
TRAIN_CANVASES = 4000  # training canvases per epoch, from mnist5k's training digits
VAL_CANVASES = 500  # validation canvases, from mnist5k's held-out test digits, the same in every run
VAL_SEED = 20250  # seed of the validation canvases (fixed, so results compare across runs and versions)
DIGITS_MEAN, DIGITS_STD = (0.0335,), (0.1566,)  # grey-level statistics of training canvases (epoch 0, seed 0)


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
class Placement:
    """One digit on a digits-detect canvas."""

    source: int  # index of the digit in its mnist5k split
    label: int  # the digit, 0-9
    side: int  # side of the square the 28x28 glyph was resized to
    x: int  # column of the square's top-left corner on the canvas
    y: int  # row of the square's top-left corner
    box: tuple[int, int, int, int]  # tight box of the glyph's nonzero pixels: (x0, y0, x1, y1), x1 and y1 exclusive


def overlap_ok(box: Sequence[int], others: Sequence[Sequence[int]]) -> bool:
    """Whether an (x0, y0, x1, y1) box overlaps each of `others` little enough: IoU < MAX_IOU and an intersection
    covering less than MAX_COVER of the smaller box."""
    area = (box[2] - box[0]) * (box[3] - box[1])
    for other in others:
        iw = min(box[2], other[2]) - max(box[0], other[0])
        ih = min(box[3], other[3]) - max(box[1], other[1])
        if iw <= 0 or ih <= 0:
            continue
        inter = iw * ih
        area_other = (other[2] - other[0]) * (other[3] - other[1])
        if inter >= MAX_IOU * (area + area_other - inter) or inter >= MAX_COVER * min(area, area_other):
            return False
    return True


def _resize(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` resized to (width, height) by bilinear interpolation (antialiased when shrinking), as PIL does."""
    return image if image.size == size else image.resize(size, Image.Resampling.BILINEAR)


def _to_model_input(image: Image.Image, channels: int, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """PIL image -> float32 (C, H, W) in the model's channels, (x / 255 - mean) / std per channel (as `normalize`,
    in numpy: cheaper for one small image)."""
    array = np.asarray(image.convert(image_mode(channels)), dtype=np.float32)  # (H, W) or (H, W, 3)
    array = array.reshape(array.shape[0], array.shape[1], -1).transpose(2, 0, 1)  # (C, H, W)
    mean_a = np.asarray(channel_stats(mean, channels), dtype=np.float32)[:, None, None]  # (C, 1, 1)
    std_a = np.asarray(channel_stats(std, channels), dtype=np.float32)[:, None, None]  # (C, 1, 1)
    return torch.from_numpy(np.ascontiguousarray((array / 255 - mean_a) / std_a))


def _target(
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


def _index(key: int | tuple[int, int]) -> int:
    """A sample index from an index, or from an (index, seed) pair or (index, seed, batch seed) triple of
    `EpochSampler`."""
    return int(key[0]) if isinstance(key, tuple) else int(key)


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


DIGITS_AUGMENT = DetectionAugment()  # fresh canvases every epoch; a flipped digit is another glyph
COCO_AUGMENT = DetectionAugment(hflip=0.5, scale_jitter=0.25, crop=0.5)  # a COCO folder's training split


def detection_augment_defaults(source: str) -> DetectionAugment:
    """The default augmentation of a detection source's training split (a `--data` value)."""
    return DIGITS_AUGMENT if source.startswith(BUILTIN_PREFIX) else COCO_AUGMENT


class DigitsDetection(Dataset):
    """Canvases of MNIST digits with their boxes, generated on demand and deterministically.

    Canvas `i` of epoch `e` is drawn from `numpy.random.default_rng((seed, e, i))` (epoch 0 always when not
    `fresh`): a number of digits from 1 to MAX_DIGITS, each a random glyph of `images`, resized to a random side
    in GLYPH_SIDES and put at a random place where its tight box overlaps every earlier box little enough
    (`box_overlap_ok`); a digit that finds no such place in PLACEMENT_TRIES tries is left out. Glyphs are
    combined by their maximum (white digits on black). Any worker and any order produce the same canvases.

    Args:
        images: (N, 28, 28) uint8 digits; labels: (N,) their digits.
        count: canvases per epoch.
        seed: the seed of all canvases.
        fresh: new canvases every epoch (`set_epoch`) or the same ones.
        channels: image channels given to the model (1, or 3: the grey canvas repeated).
        img_size: side the canvas is resized to for the model (None: CANVAS); boxes are relative, so unchanged.
        name: how samples are named in messages.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: Sequence[int],
        count: int,
        seed: int,
        fresh: bool,
        channels: int = 3,
        img_size: int | None = None,
        name: str = DIGITS_DETECT,
    ) -> None:
        if images.dtype != np.uint8 or images.ndim != 3 or len(images) != len(labels) or len(images) == 0:
            raise ValueError(
                f"expected uint8 glyphs (N, H, W) and N labels, got {images.dtype} {images.shape}, {len(labels)} labels"
            )
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        if img_size is not None and img_size <= 0:
            raise ValueError(f"img_size must be positive, got {img_size}")
        image_mode(channels)  # ValueError for channels other than 1 and 3
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64)
        self.count, self.seed, self.fresh = count, seed, fresh
        self.channels, self.img_size, self.name = channels, img_size, name
        self.epoch = 0
        self.mean, self.std = DIGITS_MEAN, DIGITS_STD
        self._pil: dict[int, Image.Image] = {}  # glyphs as PIL images, made when first drawn

    def __len__(self) -> int:
        return self.count

    def set_epoch(self, epoch: int) -> None:
        """Select the canvases of `epoch` (no effect unless `fresh`); call before iterating, as for the sampler."""
        self.epoch = epoch

    def glyph(self, source: int, side: int) -> np.ndarray:
        """Digit `source` resized to (side, side) uint8."""
        if source not in self._pil:
            self._pil[source] = Image.fromarray(self.images[source])
        return np.asarray(self._pil[source].resize((side, side), Image.Resampling.BILINEAR))

    def _draw(self, index: int) -> tuple[list[Placement], list[np.ndarray]]:
        """The digits of canvas `index` of the current epoch, in drawing order, with their resized glyphs."""
        if not 0 <= index < self.count:
            raise IndexError(f"canvas {index} is outside 0..{self.count - 1}")
        rng = np.random.default_rng((self.seed, self.epoch if self.fresh else 0, index))
        n = int(rng.integers(1, MAX_DIGITS + 1))
        sources = rng.integers(0, len(self.images), n)
        sides = rng.integers(GLYPH_SIDES[0], GLYPH_SIDES[1] + 1, n)
        placed: list[Placement] = []
        glyphs: list[np.ndarray] = []
        for source, side in zip(sources.tolist(), sides.tolist(), strict=True):
            glyph = self.glyph(source, side)
            rows, cols = np.nonzero(glyph)
            tight = [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]  # in the glyph
            corners = rng.integers(0, CANVAS - side + 1, (PLACEMENT_TRIES, 2)).tolist()  # candidate (x, y)
            boxes = [p.box for p in placed]
            for x, y in corners:
                box = (x + tight[0], y + tight[1], x + tight[2], y + tight[3])
                if overlap_ok(box, boxes):
                    placed.append(Placement(source, int(self.labels[source]), side, x, y, box))
                    glyphs.append(glyph)
                    break  # placed; a digit that fits nowhere is left out
        return placed, glyphs

    def layout(self, index: int) -> list[Placement]:
        """The digits of canvas `index` of the current epoch, in drawing order."""
        return self._draw(index)[0]

    def canvas(self, index: int) -> tuple[np.ndarray, list[Placement]]:
        """Canvas `index` of the current epoch as (CANVAS, CANVAS) uint8, with its digits."""
        placed, glyphs = self._draw(index)
        canvas = np.zeros((CANVAS, CANVAS), dtype=np.uint8)
        for p, glyph in zip(placed, glyphs, strict=True):
            region = canvas[p.y : p.y + p.side, p.x : p.x + p.side]
            np.maximum(region, glyph, out=region)
        return canvas, placed

    def describe(self, index: int) -> str:
        return f"{self.name}[{index}]"

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        index = _index(key)
        canvas, placed = self.canvas(index)
        side = self.img_size or CANVAS
        if side != CANVAS:
            canvas = np.asarray(_resize(Image.fromarray(canvas), (side, side)))
        grey = canvas.astype(np.float32)  # (H, W)
        grey = (grey / 255 - self.mean[0]) / self.std[0]
        image = torch.from_numpy(grey)[None].repeat(self.channels, 1, 1)  # (C, H, W): grey in every channel
        boxes = np.array([p.box for p in placed], dtype=np.float32).reshape(-1, 4)
        areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        labels = np.array([p.label for p in placed], dtype=np.int64)
        return image, _target(boxes, labels, areas, index, (CANVAS, CANVAS), (side, side))


def load_digits_detect(
    seed: int = 0, channels: int = 3, img_size: int | None = None
) -> tuple[DigitsDetection, DigitsDetection, DetectionInfo]:
    """`builtin:digits-detect` as (train, val, info).

    Training canvases (TRAIN_CANVASES a epoch, fresh each epoch, drawn with `seed`) use only mnist5k's training
    digits; validation canvases (VAL_CANVASES, always the same) only its held-out test digits. Class = category
    id = the digit.
    """
    train_digits, test_digits, _ = load_builtin("mnist5k")
    common = {"channels": channels, "img_size": img_size}
    train = DigitsDetection(
        train_digits.images, train_digits.labels, TRAIN_CANVASES, seed, True, name=f"{DIGITS_DETECT}/train", **common
    )
    val = DigitsDetection(
        test_digits.images, test_digits.labels, VAL_CANVASES, VAL_SEED, False, name=f"{DIGITS_DETECT}/val", **common
    )
    classes = tuple(str(d) for d in range(10))
    info = DetectionInfo(BUILTIN_PREFIX + DIGITS_DETECT, classes, tuple(range(10)), DIGITS_MEAN, DIGITS_STD)
    return train, val, info


def write_coco_folder(
    dataset: DigitsDetection, root: str | os.PathLike, split: str = "val", limit: int | None = None
) -> Path:
    """Write digits-detect canvases as a COCO-format dataset: root/<split>/<id>.png and
    root/annotations/instances_<split>.json, the layout `load_coco_folder` reads. A way to see what a COCO folder
    of your own should hold. Returns the JSON's path."""
    root = Path(root)
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(min(len(dataset), limit) if limit is not None else len(dataset)):
        canvas, placed = dataset.canvas(index)
        file_name = f"{index:06d}.png"
        Image.fromarray(canvas).save(root / split / file_name)
        images.append({"id": index, "file_name": file_name, "width": CANVAS, "height": CANVAS})
        for p in placed:
            x0, y0, x1, y1 = p.box
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": index,
                    "category_id": p.label,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    categories = [{"id": d, "name": str(d)} for d in range(10)]
    path = root / "annotations" / f"instances_{split}.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


# --- COCO-format datasets -------------------------------------------------------------------------------------------

SKIP_REASONS = (
    "bad image entry",  # an image without an integer id, a file name, a positive width and height; or a repeated id
    "missing file",  # the image file does not exist
    "unreadable file",  # the image file cannot be decoded (found at load with check_images, else when read)
    "bad annotation entry",  # no image_id, category_id or 4-number bbox, or non-finite numbers
    "unknown image",  # image_id names no image of the file
    "unknown category",  # category_id names no category of the file
    "empty box",  # zero or negative width or height
    "outside image",  # no part of the box lies inside the image
)


CLIPPED_SHOWN = 10  # ids of clipped annotations a report lists before "... N more"


@dataclass(frozen=True)
class Skipped:
    """An image or annotation of a COCO file left out, and why."""

    kind: str  # "image" or "annotation"
    id: Any  # its id in the file (the list position as "#i" when it has none)
    reason: str  # one of SKIP_REASONS
    detail: str = ""  # what was found


@dataclass
class CocoReport:
    """What loading a COCO file kept and left out."""

    path: str  # the instances JSON
    images: int = 0  # images kept
    annotations: int = 0  # annotations kept
    listed_images: int = 0  # image entries the file lists, kept or not
    listed_annotations: int = 0  # annotation entries the file lists, kept or not
    skipped: list[Skipped] = field(default_factory=list)  # images and annotations left out
    clipped: list[Any] = field(default_factory=list)  # ids of annotations whose box was clipped to the image
    crowd: int = 0  # crowd annotations (iscrowd 1), left out of the targets as DETR's training does

    def counts(self) -> dict[str, int]:
        """Number of skipped entries per reason."""
        return dict(Counter(s.reason for s in self.skipped))

    def __str__(self) -> str:
        lines = [f"{self.path}: {counted(self.images, 'image')}, {counted(self.annotations, 'annotation')}"]
        lines += [f"  skipped {n} ({reason})" for reason, n in self.counts().items()]
        if self.clipped:
            shown = ", ".join(str(i) for i in self.clipped[:CLIPPED_SHOWN])
            more = f", ... {len(self.clipped) - CLIPPED_SHOWN} more" if len(self.clipped) > CLIPPED_SHOWN else ""
            if len(self.clipped) == 1:
                lines.append(f"  clipped 1 box to its image: annotation {shown}")
            else:
                lines.append(f"  clipped {len(self.clipped)} boxes to their images: annotations {shown}{more}")
        if self.crowd:
            lines.append(f"  left out {counted(self.crowd, 'crowd annotation')}")
        lines += [f"  {s.kind} {s.id}: {s.reason}" + (f" ({s.detail})" if s.detail else "") for s in self.skipped]
        return "\n".join(lines)


@dataclass(frozen=True)
class CocoImage:
    image_id: int
    path: Path
    size: tuple[int, int]  # (height, width) the file says
    boxes: np.ndarray  # (n, 4) float32 (x0, y0, x1, y1) pixels, clipped to the image
    labels: np.ndarray  # (n,) int64 class indices
    areas: np.ndarray  # (n,) float32 object areas in pixels


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _image_entry_problem(entry: Any) -> str:
    """What is wrong with an `images` entry of a COCO file, in words ("" when nothing)."""
    if not isinstance(entry, dict):
        return f"an image entry must be an object, got {type(entry).__name__}"
    wrong = []
    if not _is_int(entry.get("id")):
        wrong.append(f"id must be an integer, got {entry.get('id')!r}")
    if not isinstance(entry.get("file_name"), str):
        wrong.append(f"file_name must be a string, got {entry.get('file_name')!r}")
    for key in ("width", "height"):
        if not (_is_int(entry.get(key)) and entry[key] > 0):
            wrong.append(f"{key} must be a positive integer, got {entry.get(key)!r}")
    return "; ".join(wrong)


def _annotation_problem(ann: Any) -> str:
    """What is wrong with an `annotations` entry of a COCO file, in words."""
    if not isinstance(ann, dict):
        return f"an annotation must be an object, got {type(ann).__name__}"
    wrong = [
        f"{key} must be an integer, got {ann.get(key)!r}"
        for key in ("image_id", "category_id")
        if not _is_int(ann.get(key))
    ]
    bbox = ann.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
        wrong.append(f"bbox must be [x, y, width, height] numbers, got {bbox!r}")
    return "; ".join(wrong)


def read_coco_json(path: str | os.PathLike) -> dict:
    """The instances JSON at `path`: OSError if it cannot be read, ValueError if it is not COCO's format."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise OSError(f"cannot read COCO annotations {path}: {err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a COCO instances file: not JSON ({err})") from err
    expected = ("images", "annotations", "categories")
    if not isinstance(data, dict) or not all(isinstance(data.get(key), list) for key in expected):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"{path} is not a COCO instances file: expected an object with lists {list(expected)}, found {found}"
        )
    return data


def _categories(data: dict, path: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(category ids sorted, their names): class index i is category_ids[i]. The categories define the model's
    classes, so a malformed one is an error, not a skip."""
    names: dict[int, str] = {}
    for i, category in enumerate(data["categories"]):
        if not isinstance(category, dict) or not _is_int(category.get("id")):
            raise ValueError(f"{path}: category #{i} needs an integer 'id', got {category!r}")
        if category["id"] in names:
            raise ValueError(f"{path}: category id {category['id']} appears twice")
        names[category["id"]] = str(category.get("name", category["id"]))
    if not names:
        raise ValueError(f"{path}: the file lists no categories")
    ids = tuple(sorted(names))
    return ids, tuple(names[i] for i in ids)


def open_annotated(path: str | os.PathLike, height: int, width: int) -> Image.Image:
    """The image file at `path` as its annotations of `width` x `height` saw it: upright by its EXIF orientation
    (as labelling tools show a photo), or as stored when only the stored pixels have that size (annotations of the
    raw pixels of a rotated photo). UnreadableImageError when it cannot be read or neither has the size."""
    image = open_image(path)
    if image.size == (width, height):
        return image
    stored = open_image(path, upright=False)
    if stored.size == (width, height):
        return stored
    turned = f" ({image.size[0]}x{image.size[1]} upright by its EXIF orientation)" if stored.size != image.size else ""
    raise UnreadableImageError(
        path, f"the file is {stored.size[0]}x{stored.size[1]}{turned}, the annotations say {width}x{height}"
    )


class CocoDetection(Dataset):
    """A COCO-format detection dataset: the images of an instances JSON, with their boxes.

    Entries that cannot be used are skipped and listed in `report` (a `CocoReport`) with their id: see
    SKIP_REASONS. A box partly outside its image is clipped to it (as DETR does), one wholly outside skipped.
    Images without annotations are kept (they teach "no object"). An image file that cannot be decoded when read
    gives a `vitkit.data.Unreadable` in place of the sample, which `vitkit.detection.collate_detection` reports;
    `check_images` decodes every file at load instead, to skip them up front (slower).

    Args:
        annotations: the instances JSON.
        images: the folder the JSON's `file_name`s are relative to.
        short_side, max_size: resize so the shorter side is `short_side` and the longer at most `max_size`
            (DETR: 800 and 1333); None keeps the stored size.
        channels: image channels given to the model (1 or 3).
        mean, std: per-channel normalisation statistics (ImageNet's, as DETR).
        check_images: decode every image at load and skip those that fail.
        augment: augment each sample indexed by an (index, seed) pair or (index, seed, batch seed) triple of
            `vitkit.data.EpochSampler` (`DetectionAugment`; needs `short_side`): its size drawn under the batch
            seed, the rest under its own; a plain index gives the sample unaugmented.
    """

    def __init__(
        self,
        annotations: str | os.PathLike,
        images: str | os.PathLike,
        short_side: int | None = 800,
        max_size: int | None = 1333,
        channels: int = 3,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        check_images: bool = False,
        augment: DetectionAugment | None = None,
    ) -> None:
        if short_side is not None and short_side <= 0 or max_size is not None and max_size <= 0:
            raise ValueError(f"short_side and max_size must be positive or None, got {short_side} and {max_size}")
        image_mode(channels)
        self.transform = None
        if augment:
            if short_side is None:
                raise ValueError("augmentation resizes to a random shorter side around short_side: give short_side")
            self.transform = detection_train_transform(short_side, max_size, **asdict(augment))  # (image, batch)
        path = Path(annotations)
        data = read_coco_json(path)
        self.category_ids, self.classes = _categories(data, path)
        self.short_side, self.max_size, self.channels = short_side, max_size, channels
        self.mean, self.std = mean, std
        self.report = CocoReport(str(path))
        self.samples = self._read(data, Path(images), check_images)

    def _read_images(self, entries: list, folder: Path, check: bool) -> tuple[dict[int, tuple[Path, int, int]], set]:
        """Usable image entries: id -> (path, height, width); and the ids of all entries, usable or not."""
        kept: dict[int, tuple[Path, int, int]] = {}
        listed: set = set()
        for i, entry in enumerate(entries):
            image_id = entry.get("id", f"#{i}") if isinstance(entry, dict) else f"#{i}"
            problem = _image_entry_problem(entry)
            if problem:
                if isinstance(entry, dict) and _is_int(entry.get("id")):
                    listed.add(image_id)  # its annotations are of a skipped image, not of an unknown one
                self._skip("image", image_id, "bad image entry", problem)
                continue
            if image_id in listed:
                self._skip("image", image_id, "bad image entry", "the id appears twice")
                continue
            listed.add(image_id)
            file = folder / entry["file_name"]
            if not file.is_file():
                self._skip("image", image_id, "missing file", str(file))
                continue
            if check:
                try:
                    open_annotated(file, entry["height"], entry["width"]).close()
                except OSError as err:
                    self._skip("image", image_id, "unreadable file", str(err))
                    continue
            kept[image_id] = (file, entry["height"], entry["width"])
        return kept, listed

    def _read(self, data: dict, folder: Path, check: bool) -> list[CocoImage]:
        images, listed = self._read_images(data["images"], folder, check)
        class_of = {category: index for index, category in enumerate(self.category_ids)}
        objects: dict[int, list[tuple[list[float], int, float]]] = {image_id: [] for image_id in images}
        for i, ann in enumerate(data["annotations"]):
            ann_id = ann.get("id", f"#{i}") if isinstance(ann, dict) else f"#{i}"
            bbox = ann.get("bbox") if isinstance(ann, dict) else None
            if not (
                isinstance(ann, dict)
                and _is_int(ann.get("image_id"))
                and _is_int(ann.get("category_id"))
                and isinstance(bbox, list)
                and len(bbox) == 4
                and all(_is_number(v) for v in bbox)
            ):
                self._skip("annotation", ann_id, "bad annotation entry", _annotation_problem(ann))
                continue
            if ann["image_id"] not in listed:
                self._skip("annotation", ann_id, "unknown image", f"image_id {ann['image_id']}")
                continue
            if ann["image_id"] not in images:
                continue  # its image was skipped, and reported
            if ann["category_id"] not in class_of:
                self._skip("annotation", ann_id, "unknown category", f"category_id {ann['category_id']}")
                continue
            if ann.get("iscrowd", 0):
                self.report.crowd += 1
                continue
            x, y, w, h = bbox
            if w <= 0 or h <= 0:
                self._skip("annotation", ann_id, "empty box", f"bbox {bbox}")
                continue
            _, height, width = images[ann["image_id"]]
            box = [min(max(x, 0), width), min(max(y, 0), height), min(max(x + w, 0), width), min(max(y + h, 0), height)]
            if box[2] <= box[0] or box[3] <= box[1]:
                self._skip("annotation", ann_id, "outside image", f"bbox {bbox} in a {width}x{height} image")
                continue
            if box != [x, y, x + w, y + h]:
                self.report.clipped.append(ann_id)
            area = ann.get("area")
            area = area if _is_number(area) and area > 0 else (box[2] - box[0]) * (box[3] - box[1])
            objects[ann["image_id"]].append((box, class_of[ann["category_id"]], area))
        samples = []
        for image_id, (file, height, width) in images.items():
            found = objects[image_id]
            samples.append(
                CocoImage(
                    image_id,
                    file,
                    (height, width),
                    np.array([box for box, _, _ in found], dtype=np.float32).reshape(-1, 4),
                    np.array([label for _, label, _ in found], dtype=np.int64),
                    np.array([area for _, _, area in found], dtype=np.float32),
                )
            )
        self.report.images, self.report.annotations = len(samples), sum(len(s.labels) for s in samples)
        self.report.listed_images, self.report.listed_annotations = len(data["images"]), len(data["annotations"])
        return samples

    def _skip(self, kind: str, item_id: Any, reason: str, detail: str = "") -> None:
        self.report.skipped.append(Skipped(kind, item_id, reason, detail))

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, index: int) -> str:
        sample = self.samples[index]
        return f"image {sample.image_id} ({sample.path})"

    def model_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of this size is resized to: shorter side `short_side`, longer at most
        `max_size` (the shorter side shrinks to fit)."""
        if self.short_side is None:
            return height, width
        short, long = min(height, width), max(height, width)
        target = self.short_side
        if self.max_size is not None and long * target / short > self.max_size:
            target = self.max_size * short / long
        scale = target / short
        return max(1, round(height * scale)), max(1, round(width * scale))

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | Unreadable:
        index = _index(key)
        sample = self.samples[index]
        height, width = sample.size
        try:
            image = open_annotated(sample.path, height, width)
        except OSError as err:
            return Unreadable(self.describe(index), str(err))
        if self.transform is not None and isinstance(key, tuple):
            return self._augmented(image, sample, int(key[1]), int(key[-1]))
        size = self.model_size(height, width)
        tensor = _to_model_input(_resize(image, (size[1], size[0])), self.channels, self.mean, self.std)
        return tensor, _target(sample.boxes, sample.labels, sample.areas, sample.image_id, sample.size, size)

    def orientations(self) -> list[int]:
        """1 for each image taller than wide, else 0: the groups that batch with little padding
        (`vitkit.data.EpochSampler`'s `groups`)."""
        return [int(sample.size[0] > sample.size[1]) for sample in self.samples]

    def _augmented(
        self, image: Image.Image, sample: CocoImage, seed: int, batch_seed: int
    ) -> tuple[torch.Tensor, dict]:
        """A sample through the training transform: its flip and crop drawn under `seed`, its size under
        `batch_seed` (the same for a batch, or `seed`). Its boxes follow the image, and the augmented image stands
        for the stored one (`orig_size` = `size`); `area` stays each kept object's stored area."""
        boxes = tv_tensors.BoundingBoxes(
            torch.from_numpy(np.asarray(sample.boxes, dtype=np.float32).reshape(-1, 4)),  # (n, 4) pixels
            format="XYXY",
            canvas_size=sample.size,
        )
        index = torch.arange(len(sample.labels))
        per_image, per_batch = self.transform
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)  # the CPU generator only, as `TransformedImages`
            target = {"boxes": boxes, "labels": torch.from_numpy(sample.labels), "index": index}
            image, found = per_image(image, target)
            torch.default_generator.manual_seed(batch_seed)
            image, found = per_batch(image, found)
        kept = found["index"].numpy()
        size = (image.size[1], image.size[0])
        tensor = _to_model_input(image, self.channels, self.mean, self.std)
        xyxy = found["boxes"].as_subclass(torch.Tensor).numpy()  # (n', 4) pixels of the augmented image
        return tensor, _target(xyxy, sample.labels[kept], sample.areas[kept], sample.image_id, size, size)


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


def _require_boxes(data: CocoDetection, split: str) -> None:
    """ValueError unless `data`, the `split` ("train" or "val") of a folder, kept a box: saying what its file lists,
    what was kept and why the rest was left out."""
    report = data.report
    if report.annotations:
        return
    purpose = "train on" if split == "train" else "evaluate on (COCO mAP is undefined without ground-truth boxes)"
    parts = [
        f"the file lists {counted(report.listed_images, 'image')} and "
        f"{counted(report.listed_annotations, 'annotation')}",
        f"kept {counted(report.images, 'image')} and 0 annotations",
    ]
    for kind in ("image", "annotation"):
        reasons = Counter(s.reason for s in report.skipped if s.kind == kind)
        if reasons:
            detail = ", ".join(f"{n} {reason}" for reason, n in reasons.items())
            parts.append(f"skipped {counted(sum(reasons.values()), kind)} ({detail})")
    if report.crowd:
        parts.append(f"left out {counted(report.crowd, 'crowd annotation')}")
    skipped = sum(s.kind == "annotation" for s in report.skipped)
    with_skipped_images = report.listed_annotations - skipped - report.crowd  # none was kept
    if with_skipped_images:
        parts.append(f"left out {counted(with_skipped_images, 'annotation')} of skipped images")
    first = {}  # the first entry skipped for each reason, with what was found
    for s in report.skipped:
        first.setdefault((s.kind, s.reason), s)
    if first:
        shown = [f"{s.kind} {s.id}: {s.reason}" + (f" ({s.detail})" if s.detail else "") for s in first.values()]
        parts.append("for example " + "; ".join(shown[:4]))
    raise ValueError(f"{report.path}: no boxes to {purpose}: {'; '.join(parts)}")


def _find_split(root: Path, split: str) -> tuple[Path, Path]:
    """(instances JSON, image folder) of `split` ("train" or "val") under `root`; see `load_coco_folder`."""
    annotations = root / "annotations"
    found = sorted(annotations.glob(f"instances_{split}*.json"))
    if len(found) == 1:
        return found[0], root / found[0].stem[len("instances_") :]
    if not found:
        named = sorted(annotations.glob(f"{split}*.json"))  # annotations/train.json beside train/
        if len(named) == 1 and (root / named[0].stem).is_dir():
            return named[0], root / named[0].stem
        folders = sorted(p for p in root.glob(f"{split}*") if p.is_dir())
        jsons = [j for folder in folders for j in sorted(folder.glob("*.json"))]
        if len(folders) == 1 and len(jsons) == 1:
            return jsons[0], folders[0]
    seen = sorted({str(p.relative_to(root)) for p in root.glob("*/*.json")})  # annotations/ and split folders
    seen_text = f"found the .json files {seen[:8]}{' ...' if len(seen) > 8 else ''}" if seen else "found no .json file"
    raise ValueError(
        f"{root}: no COCO-format {split} split: expected one annotations/instances_{split}*.json with its images in "
        f"{split}*/ (COCO's layout), one annotations/{split}*.json with its images in the folder of the same name, "
        f"or one {split}*/ folder holding the images and one .json; {seen_text}"
    )


def load_coco_folder(
    root: str | os.PathLike, val_only: bool = False, augment: DetectionAugment | None = None, **options: Any
) -> tuple[CocoDetection | None, CocoDetection, DetectionInfo]:
    """A COCO-format dataset folder as (train, val, info); `options` go to `CocoDetection`, `augment` to its
    training split only.

    Layouts: COCO's, ``root/annotations/instances_train2017.json`` with images in ``root/train2017/`` and the same
    for val (any suffix after ``instances_train`` / ``instances_val``, the folder named as the JSON without
    ``instances_``); ``root/annotations/train.json`` with images in ``root/train/`` (any name starting with the
    split, the folder named as the JSON); or a ``root/train*/`` folder with the images and a single JSON, and the
    same for val (as several annotation tools export). Both splits must list the same categories. With `val_only`
    the training annotations are not read (train is None; evaluation needs only val).

    A split that keeps no box (after the skips `CocoDetection` reports) is a ValueError naming its file, with what
    it lists and why nothing was kept: training would learn nothing, and COCO mAP is undefined without boxes.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: expected a COCO-format dataset folder")
    train = None
    if not val_only:
        train = CocoDetection(*_find_split(root, "train"), augment=augment, **options)
        _require_boxes(train, "train")
    val = CocoDetection(*_find_split(root, "val"), **options)
    _require_boxes(val, "val")
    if train is None:
        return None, val, DetectionInfo(str(root), val.classes, val.category_ids, tuple(val.mean), tuple(val.std))
    if (train.category_ids, train.classes) != (val.category_ids, val.classes):
        raise ValueError(
            f"{root}: the train and val annotations list different categories: "
            f"{dict(zip(train.category_ids, train.classes, strict=True))} and "
            f"{dict(zip(val.category_ids, val.classes, strict=True))}"
        )
    info = DetectionInfo(str(root), train.classes, train.category_ids, tuple(train.mean), tuple(train.std))
    return train, val, info


def load_detection(
    source: str,
    seed: int = 0,
    channels: int = 3,
    img_size: int | None = None,
    val_only: bool = False,
    augment: DetectionAugment | None = None,
    **options: Any,
) -> tuple[DigitsDetection | CocoDetection | None, DigitsDetection | CocoDetection, DetectionInfo]:
    """(train, val, info) of ``"builtin:digits-detect"`` or a COCO-format folder (`load_coco_folder`).

    `img_size` is the canvas side for digits-detect and the shorter side (`short_side`) for COCO images; `seed`
    draws the digits-detect training canvases; `val_only` leaves a COCO folder's training annotations unread
    (train None); `augment` augments a COCO folder's training split (digits-detect takes none: its canvases are
    drawn afresh every epoch); `options` go to `CocoDetection`.
    """
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name != DIGITS_DETECT:
            raise ValueError(f"unknown builtin detection dataset {name!r}; the bundled one is {DIGITS_DETECT!r}")
        if augment:
            given = ", ".join(f"{k} {v:g}" for k, v in asdict(augment).items() if v)
            raise ValueError(
                f"{source} draws fresh training canvases every epoch and is not augmented (a flipped digit is "
                f"another glyph): leave out hflip, scale_jitter and crop (--hflip, --scale-jitter, --crop) or set "
                f"them to 0; got {given}"
            )
        return load_digits_detect(seed, channels, img_size)
    if img_size is not None:
        options["short_side"] = img_size
    return load_coco_folder(source, val_only=val_only, channels=channels, augment=augment, **options)


# --- What a dataset holds -------------------------------------------------------------------------------------------

SMALL_OBJECT = 32  # COCO's small objects: area below 32 * 32 pixels, so a size sqrt(w * h) below 32


@dataclass(frozen=True)
class DetectionStats:
    """What a detection dataset holds, read from its annotations alone (no image is decoded).

    Sides and box sizes are in pixels of the images as stored; a box's size is sqrt(w * h), so COCO's small
    objects (area below 32 * 32) are those of size below SMALL_OBJECT. Without boxes, the box figures are nan.
    """

    images: int  # images
    boxes: int  # boxes of all images
    classes: tuple[str, ...]  # class names, in class-index order
    boxes_per_class: tuple[int, ...]  # boxes of each class, in the same order
    max_objects: int  # most boxes in one image
    median_objects: float  # median boxes per image (images without boxes count)
    short_side_median: float  # the images' shorter side: median, smallest, largest
    short_side_min: int
    short_side_max: int
    long_side_median: float  # the images' longer side: median, smallest, largest
    long_side_min: int
    long_side_max: int
    box_size_median: float  # median box size sqrt(w * h)
    box_size_p10: float  # 10th percentile of box sizes (linear interpolation, numpy's default)
    small_share: float  # share of boxes of size below SMALL_OBJECT

    def summary(self) -> str:
        """Three lines: images and their sides; boxes per class; objects per image and box sizes."""
        short, long = (self.short_side_min, self.short_side_max), (self.long_side_min, self.long_side_max)
        if short[0] == short[1] == long[0] == long[1]:
            sides = f"{short[0]}x{short[0]} px"
        elif short[0] == short[1] and long[0] == long[1]:
            sides = f"sides {short[0]} and {long[0]} px"
        else:
            sides = f"shorter side {short[0]}-{short[1]} px, longer {long[0]}-{long[1]} px"
        per_class = ", ".join(f"{name}: {n}" for name, n in zip(self.classes, self.boxes_per_class, strict=True))
        return "\n".join(
            [
                f"{self.images} images ({sides})",
                f"{self.boxes} boxes: {per_class}",
                f"objects per image: median {self.median_objects:g}, at most {self.max_objects}; box size: median "
                f"{self.box_size_median:.0f} px, 10th percentile {self.box_size_p10:.0f} px, "
                f"{self.small_share:.0%} small (< {SMALL_OBJECT} px)",
            ]
        )


def detection_stats(dataset: CocoDetection | DigitsDetection) -> DetectionStats:
    """A `DetectionStats` of a COCO-format split (its kept images and boxes, clipped to their image) or of the
    digits-detect canvases of the dataset's current epoch (each canvas's layout is drawn; no canvas is painted)."""
    if isinstance(dataset, CocoDetection):
        sides = np.array([s.size for s in dataset.samples], dtype=np.int64).reshape(-1, 2)  # (N, 2) height, width
        boxes = [s.boxes for s in dataset.samples]  # (n, 4) x0, y0, x1, y1 each
        labels = [s.labels for s in dataset.samples]
        classes = dataset.classes
    elif isinstance(dataset, DigitsDetection):
        layouts = [dataset.layout(i) for i in range(len(dataset))]
        sides = np.full((len(layouts), 2), CANVAS, dtype=np.int64)
        boxes = [np.array([p.box for p in placed], dtype=np.float64).reshape(-1, 4) for placed in layouts]
        labels = [np.array([p.label for p in placed], dtype=np.int64) for placed in layouts]
        classes = tuple(str(d) for d in range(10))
    else:
        raise TypeError(f"expected a CocoDetection or a DigitsDetection, got {type(dataset).__name__}")
    if len(sides) == 0:
        raise ValueError("the dataset has no images: there is nothing to describe")
    all_boxes = np.concatenate(boxes).astype(np.float64).reshape(-1, 4)  # (B, 4)
    sizes = np.sqrt((all_boxes[:, 2] - all_boxes[:, 0]) * (all_boxes[:, 3] - all_boxes[:, 1]))  # (B,)
    counts = np.array([len(b) for b in boxes])  # (N,) boxes per image
    short, long = sides.min(axis=1), sides.max(axis=1)
    per_class = np.bincount(np.concatenate(labels).astype(np.int64), minlength=len(classes))
    nan = float("nan")
    return DetectionStats(
        images=len(sides),
        boxes=len(all_boxes),
        classes=tuple(classes),
        boxes_per_class=tuple(int(n) for n in per_class),
        max_objects=int(counts.max()),
        median_objects=float(np.median(counts)),
        short_side_median=float(np.median(short)),
        short_side_min=int(short.min()),
        short_side_max=int(short.max()),
        long_side_median=float(np.median(long)),
        long_side_min=int(long.min()),
        long_side_max=int(long.max()),
        box_size_median=float(np.median(sizes)) if len(sizes) else nan,
        box_size_p10=float(np.percentile(sizes, 10)) if len(sizes) else nan,
        small_share=float(np.mean(sizes < SMALL_OBJECT)) if len(sizes) else nan,
    )
