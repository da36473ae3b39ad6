"""`builtin:digits-detect`: canvases of MNIST digits with their boxes, generated on demand and deterministically from
the bundled mnist5k digits (`DigitsDetection`, `load_digits_detect`), and written as a COCO-format folder
(`write_coco_folder`). The canvases are drawn afresh every training epoch and not augmented otherwise (a flipped
digit is another glyph). Samples and targets are as `vitkit.data.detection` describes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from vitkit.data.detection import DetectionAugment, DetectionInfo, detection_target, resized, sample_index
from vitkit.data.sources import BUILTIN_PREFIX, load_builtin
from vitkit.data.transforms import image_mode

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

DIGITS_AUGMENT = DetectionAugment()  # fresh canvases every epoch; a flipped digit is another glyph


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


class DigitsDetection(Dataset):
    """Canvases of MNIST digits with their boxes, generated on demand and deterministically.

    Canvas `i` of epoch `e` is drawn from `numpy.random.default_rng((seed, e, i))` (epoch 0 always when not
    `fresh`): a number of digits from 1 to MAX_DIGITS, each a random glyph of `images`, resized to a random side
    in GLYPH_SIDES and put at a random place where its tight box overlaps every earlier box little enough
    (`overlap_ok`); a digit that finds no such place in PLACEMENT_TRIES tries is left out. Glyphs are
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
        index = sample_index(key)
        canvas, placed = self.canvas(index)
        side = self.img_size or CANVAS
        if side != CANVAS:
            canvas = np.asarray(resized(Image.fromarray(canvas), (side, side)))
        grey = canvas.astype(np.float32)  # (H, W)
        grey = (grey / 255 - self.mean[0]) / self.std[0]
        image = torch.from_numpy(grey)[None].repeat(self.channels, 1, 1)  # (C, H, W): grey in every channel
        boxes = np.array([p.box for p in placed], dtype=np.float32).reshape(-1, 4)
        areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        labels = np.array([p.label for p in placed], dtype=np.int64)
        return image, detection_target(boxes, labels, areas, index, (CANVAS, CANVAS), (side, side))


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
