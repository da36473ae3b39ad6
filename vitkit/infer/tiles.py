"""Detection on images larger than a detector sees at once (aerial, satellite, microscope and document images, with
objects of a few dozen pixels): the image cut into overlapping tiles, each tile detected at its own resolution, every
box mapped back to the image, and the tiles' detections merged into one list (`detect_tiled`).

Merging, in two steps:
- ownership: each tile owns the part of the image nearer its centre than any other tile's (its side of the middle
  of each overlap), and keeps the detections whose box centre lies there. An object no larger than the overlap and
  centred in a tile's own part lies wholly inside that tile, so it is found once, by a tile that saw all of it; the
  cut copy a neighbouring tile may see of it has its centre in the overlap's other half, and is dropped. A tiled
  detection of such objects equals one pass over the whole image, for a model that sees them alike.
- per-class non-maximum suppression (`torchvision.ops.batched_nms`, IoU `nms_iou`): what ownership leaves twice, as
  objects larger than the overlap that two tiles each saw part of. NMS keeps the most probable box as it is; weighted
  box fusion would average it with the cut copies, which are not other views of the object but wrong boxes.

The tile is the side the detector takes (`detection_input`): a tile of the detector's training side runs at full
resolution; a larger one is shrunk, as a whole image would be.

Letters: n detections, H, W image size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from torchvision.ops import batched_nms

from vitkit.data.coco import rle_json
from vitkit.data.tiles import DEFAULT_OVERLAP, Tile, tile_grid
from vitkit.detection import Postprocessing
from vitkit.infer.detect import Detection, detect
from vitkit.models.interface import VitkitDetector
from vitkit.weights import ModelInfo

DEFAULT_NMS_IOU = 0.5
TILE_BATCH = 4  # tiles run together


def merge_tiles(
    found: Sequence[tuple[Tile, list[Detection]]],
    nms_iou: float | None = DEFAULT_NMS_IOU,
    image_size: tuple[int, int] | None = None,
) -> list[Detection]:
    """The detections of every tile (boxes in pixels of the tile) as one list for the image, most probable first:
    boxes moved into the image, kept where their centre lies in their tile's own part, then per-class NMS at
    `nms_iou` (None: none). A detection's mask moves into the image of `image_size` (height, width) with its box
    (without `image_size`, masks are dropped)."""
    kept: list[Detection] = []
    for tile, detections in found:
        x0, y0 = tile.box[:2]
        ox0, oy0, ox1, oy1 = tile.own
        for d in detections:
            box = (d.box[0] + x0, d.box[1] + y0, d.box[2] + x0, d.box[3] + y0)
            cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
            if ox0 <= cx < ox1 and oy0 <= cy < oy1:
                mask = _placed(d, (x0, y0), image_size) if d.mask is not None and image_size is not None else None
                kept.append(Detection(d.label, d.category_id, d.score, box, mask))
    if nms_iou is not None and kept:
        boxes = torch.tensor([d.box for d in kept], dtype=torch.float64)
        scores = torch.tensor([d.score for d in kept], dtype=torch.float64)
        labels = torch.tensor([d.category_id for d in kept])
        kept = [kept[i] for i in batched_nms(boxes, scores, labels, nms_iou).tolist()]
    return sorted(kept, key=lambda d: -d.score)


def _placed(detection: Detection, corner: tuple[int, int], image_size: tuple[int, int]) -> dict:
    """A tile's detection's mask moved to its place in the image: RLE of the image's size."""
    part = detection.mask_array()  # (h, w) of the tile
    whole = np.zeros(image_size, dtype=np.uint8)
    x0, y0 = corner
    whole[y0 : y0 + part.shape[0], x0 : x0 + part.shape[1]] = part
    return rle_json(mask_utils.encode(np.asfortranarray(whole)))


@torch.no_grad()
def detect_tiled(
    model: VitkitDetector,
    info: ModelInfo,
    image: Image.Image,
    tile: int,
    overlap: float = DEFAULT_OVERLAP,
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
    nms_iou: float | None = DEFAULT_NMS_IOU,
    batch_size: int = TILE_BATCH,
    bar: object | None = None,
    precision: str = "fp32",
) -> list[Detection]:
    """The objects a detector finds in `image`, tile by tile (`tile_grid`), `batch_size` tiles at a time, merged
    (`merge_tiles`): boxes in pixels of the image, most probable first. `bar`, a tqdm bar, advances by a tile;
    `precision`: the forward's (`detect`)."""
    tiles = tile_grid(image.height, image.width, tile, overlap)
    found: list[tuple[Tile, list[Detection]]] = []
    for start in range(0, len(tiles), batch_size):
        chunk = tiles[start : start + batch_size]
        crops = [image.crop(t.box) for t in chunk]
        found += zip(chunk, detect(model, info, crops, threshold, postprocessing, precision), strict=True)
        if bar is not None:
            bar.update(len(chunk))
    return merge_tiles(found, nms_iou, (image.height, image.width))
