"""Large images in tiles: the grid of overlapping tiles an image is cut into (`tile_grid`, which tiled detection and
evaluation use, `vitkit.infer.tiles`), and training on tiles drawn from large images (`TiledDetection`).

Training draws, for each sample of an epoch, a tile at a random position of one of the images (each image gives as
many samples as its grid has tiles). A box is clipped to the tile, as the crop augmentation clips it, and kept when
at least MIN_VISIBLE of its area lies inside: a sliver of an object cut by the tile's border teaches nothing, and
half an object is still the object. The tile then goes through the split's augmentation (flip, multi-scale
resize), as a whole image would.

Letters: n boxes of an image.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from vitkit.data.coco import CocoDetection, CocoImage, open_annotated
from vitkit.data.detection import sample_index
from vitkit.data.detection_stats import DetectionStats, image_fields
from vitkit.data.loader import Unreadable

DEFAULT_OVERLAP = 0.25  # of the tile's side: objects up to this size are found whole by one tile
MIN_TILE = 32  # the smallest tile side a run or a command takes: below, a tile holds a few pixels of an object and an
# image thousands of tiles (a 500x375 photo in tiles of 10 px: over 2,000 forward passes)
MIN_VISIBLE = 0.5  # a box is kept in a training tile when this share of its area lies inside


@dataclass(frozen=True)
class Tile:
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1) in pixels of the image
    own: tuple[float, float, float, float]  # the part of the image this tile keeps detections in, same layout


def tile_starts(length: int, tile: int, overlap: float) -> list[int]:
    """Where tiles of side `tile` start along a side of `length` pixels so that neighbours share at least
    `overlap` of a tile and the last ends at the border; one tile when the side is no longer than it."""
    if tile >= length:
        return [0]
    stride = max(1, round(tile * (1 - overlap)))
    starts = list(range(0, length - tile, stride))
    return [*starts, length - tile]


def _owned(starts: list[int], tile: int, length: int) -> list[tuple[float, float]]:
    """Each tile's own interval: from the middle of its overlap with the tile before to that with the tile after."""
    ends = [min(s + tile, length) for s in starts]
    middles = [(starts[i + 1] + ends[i]) / 2 for i in range(len(starts) - 1)]
    return list(zip([0.0, *middles], [*middles, float(length)], strict=True))


def check_tiling(tile: int, overlap: float) -> None:
    """ValueError unless `tile` is a positive side and `overlap` a fraction in [0, 1)."""
    if not isinstance(tile, int) or tile <= 0:
        raise ValueError(f"the tile side must be a positive number of pixels, got {tile!r}")
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"the overlap is a fraction of the tile's side in [0, 1), got {overlap}")


def tile_grid(height: int, width: int, tile: int, overlap: float = DEFAULT_OVERLAP) -> list[Tile]:
    """The tiles of an image of (height, width), row by row: side `tile` (the image's side where it is shorter),
    neighbours sharing `overlap` of it or more (the last tile of a row or column ends at the border)."""
    check_tiling(tile, overlap)
    xs, ys = tile_starts(width, tile, overlap), tile_starts(height, tile, overlap)
    own_x, own_y = _owned(xs, tile, width), _owned(ys, tile, height)
    return [
        Tile((x, y, min(x + tile, width), min(y + tile, height)), (ox0, oy0, ox1, oy1))
        for y, (oy0, oy1) in zip(ys, own_y, strict=True)
        for x, (ox0, ox1) in zip(xs, own_x, strict=True)
    ]


def window_boxes(
    boxes: np.ndarray, window: tuple[int, int, int, int], min_visible: float = MIN_VISIBLE
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (n, 4) (x0, y0, x1, y1) of an image as seen in `window` (x0, y0, x1, y1) of it: (the kept boxes clipped
    to the window, in its pixels; the indices of the kept boxes), a box kept when at least `min_visible` of its
    area lies inside."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = window
    clipped = np.stack(
        [boxes[:, 0].clip(x0, x1), boxes[:, 1].clip(y0, y1), boxes[:, 2].clip(x0, x1), boxes[:, 3].clip(y0, y1)], 1
    )
    inside = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept = np.flatnonzero((inside > 0) & (inside >= min_visible * area))
    return (clipped[kept] - np.array([x0, y0, x0, y0])).astype(np.float32), kept


class TiledDetection(Dataset):
    """Training tiles of side `tile` drawn from the images of a COCO split (`data`, whose resize and augmentation
    each tile goes through): an (index, seed[, batch seed]) key of `vitkit.data.EpochSampler` gives a tile of the
    index's image at a position drawn from its seed; a plain index, the tile of that image's grid (`tile_grid`).
    Each image gives as many samples as its grid has tiles."""

    def __init__(self, data: CocoDetection, tile: int, overlap: float = DEFAULT_OVERLAP) -> None:
        check_tiling(tile, overlap)
        self.data, self.tile, self.overlap = data, tile, overlap
        counts = [len(tile_grid(*s.size, tile, overlap)) for s in data.samples]
        self.image_of = np.repeat(np.arange(len(counts)), counts)  # sample -> image
        self.first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # image -> its first sample
        self.report, self.short_side, self.transform = data.report, data.short_side, data.transform
        self.classes, self.category_ids, self.with_masks = data.classes, data.category_ids, data.with_masks

    def __len__(self) -> int:
        return len(self.image_of)

    def describe(self, index: int) -> str:
        return self.data.describe(int(self.image_of[index]))

    def orientations(self) -> list[int]:
        """The tiles' orientation groups (`vitkit.data.EpochSampler`): square tiles, one group, where an image is
        at least a tile on both sides."""
        return [
            int(min(self.tile, h) > min(self.tile, w)) for h, w in (self.data.samples[i].size for i in self.image_of)
        ]

    def window(self, key: int | tuple[int, ...]) -> tuple[int, int, int, int]:
        """The tile `key` gives, (x0, y0, x1, y1) in pixels of its image."""
        index = sample_index(key)
        height, width = self.data.samples[int(self.image_of[index])].size
        if isinstance(key, tuple):
            rng = np.random.default_rng(int(key[1]))
            x = int(rng.integers(0, max(width - self.tile, 0) + 1))
            y = int(rng.integers(0, max(height - self.tile, 0) + 1))
            return x, y, min(x + self.tile, width), min(y + self.tile, height)
        number = index - int(self.first[self.image_of[index]])
        return tile_grid(height, width, self.tile, self.overlap)[number].box

    def __getitem__(self, key: int | tuple[int, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | Unreadable:
        index = sample_index(key)
        sample = self.data.samples[int(self.image_of[index])]
        try:
            image = open_annotated(sample.path, *sample.size)
        except OSError as err:
            return Unreadable(self.describe(index), str(err))
        window = self.window(key)
        boxes, kept = window_boxes(sample.boxes, window)
        size = (window[3] - window[1], window[2] - window[0])
        masks = sample.window_masks(kept, window)  # each kept object's mask, cut as its box is
        # no crowd regions: tiles are for training, which leaves them out; evaluation in tiles reads whole images
        part = CocoImage(sample.image_id, sample.path, size, boxes, sample.labels[kept], sample.areas[kept], masks)
        return self.data.transformed(image.crop(window), part, key)


def tiled_stats(
    stats: DetectionStats, data: CocoDetection, tile: int, overlap: float = DEFAULT_OVERLAP
) -> DetectionStats:
    """`stats` of a split as its training tiles see it: tiles for images (as many as the grids have), sides of at
    most `tile`, objects per tile (counted in the grids' tiles)."""
    counts, sides = [], []
    for sample in data.samples:
        for t in tile_grid(*sample.size, tile, overlap):
            counts.append(len(window_boxes(sample.boxes, t.box)[1]))
            sides.append((t.box[3] - t.box[1], t.box[2] - t.box[0]))
    return dataclasses.replace(stats, **image_fields(np.array(sides), counts))
