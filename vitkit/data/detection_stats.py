"""What a detection dataset holds, read from its annotations alone (no image is decoded): image sides, boxes per
class and per image, box sizes (`detection_stats`), to choose training settings by."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitkit.data.coco import CocoDetection
from vitkit.data.digits_detect import CANVAS, DigitsDetection

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
    box_size_p90: float = float("nan")  # 90th percentile of box sizes
    masks: bool = False  # every box has its object's mask (a segmentation)

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
                f"{self.boxes} boxes{' with masks' if self.masks else ''}: {per_class}",
                f"objects per image: median {self.median_objects:g}, at most {self.max_objects}; box size: median "
                f"{self.box_size_median:.0f} px, 10th percentile {self.box_size_p10:.0f} px, "
                f"{self.small_share:.0%} small (< {SMALL_OBJECT} px)",
            ]
        )


def image_fields(sides: np.ndarray, counts: list[int]) -> dict[str, int | float]:
    """The `DetectionStats` fields of the images: their count, objects per image and sides, from each image's
    (height, width) `sides` (N, 2) and its number of boxes `counts` (N,)."""
    counts_a, sides = np.asarray(counts), np.asarray(sides).reshape(-1, 2)
    short, long = sides.min(axis=1), sides.max(axis=1)
    return {
        "images": len(sides),
        "max_objects": int(counts_a.max()),
        "median_objects": float(np.median(counts_a)),
        "short_side_median": float(np.median(short)),
        "short_side_min": int(short.min()),
        "short_side_max": int(short.max()),
        "long_side_median": float(np.median(long)),
        "long_side_min": int(long.min()),
        "long_side_max": int(long.max()),
    }


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
    counts = [len(b) for b in boxes]  # boxes per image
    per_class = np.bincount(np.concatenate(labels).astype(np.int64), minlength=len(classes))
    nan = float("nan")
    return DetectionStats(
        boxes=len(all_boxes),
        classes=tuple(classes),
        boxes_per_class=tuple(int(n) for n in per_class),
        **image_fields(sides, counts),
        box_size_median=float(np.median(sizes)) if len(sizes) else nan,
        box_size_p10=float(np.percentile(sizes, 10)) if len(sizes) else nan,
        small_share=float(np.mean(sizes < SMALL_OBJECT)) if len(sizes) else nan,
        box_size_p90=float(np.percentile(sizes, 90)) if len(sizes) else nan,
        masks=bool(getattr(dataset, "with_masks", False)),
    )
