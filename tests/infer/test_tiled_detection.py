"""Tiled detection (`vitkit.infer.tiles`): the grid covers the image and its tiles' own parts split it; a model that
sees objects alike wherever they are (constructed here: a box per bright square) finds in tiles exactly what it
finds in one pass over the whole image, every square once, those that cross tile borders too."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from scipy import ndimage
from torch import nn

from vitkit.data.coco import CocoDetection
from vitkit.infer.detect import detect, detect_paths
from vitkit.infer.evaluate import evaluate_detector_tiled
from vitkit.infer.tiles import detect_tiled, merge_tiles, tile_grid
from vitkit.weights import ModelInfo

INFO = ModelInfo(classes=("grey", "white"), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), category_ids=(3, 7))


class Squares(nn.Module):
    """A detector of squares brighter than half the range: a query per connected region of channel 0, class
    "white" where channel 1 is bright too, its score growing with its area; the image's size is its `img_size`."""

    no_object_logit = True

    def __init__(self, side: int, queries: int = 200, masks: bool = False) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_classes=2, img_size=side, in_chans=3, num_queries=queries)
        self.anchor = nn.Parameter(torch.zeros(()))
        self.predicts_masks = masks  # then each square's mask logits too, at a quarter of the padded input's size

    def predict(self, images: torch.Tensor, pixel_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        B, Q = len(images), self.config.num_queries
        logits = torch.full((B, Q, 3), -20.0)
        logits[..., 2] = 20.0  # no object
        boxes = torch.full((B, Q, 4), 0.5)
        inside = torch.zeros(B, Q, *images.shape[-2:])
        for b in range(B):
            h, w = int(pixel_mask[b].any(1).sum()), int(pixel_mask[b].any(0).sum())
            regions, _ = ndimage.label(images[b, 0, :h, :w].numpy() > 0.5)
            for q, (rows, cols) in enumerate(ndimage.find_objects(regions)):
                white = images[b, 1, rows, cols].mean() > 0.5
                area = (rows.stop - rows.start) * (cols.stop - cols.start)
                logits[b, q] = torch.tensor([-20.0, -20.0, 0.0])
                logits[b, q, int(white)] = area / 200  # probability 0.5 .. 0.99: a square above 0
                cx, cy = (cols.start + cols.stop) / 2 / w, (rows.start + rows.stop) / 2 / h
                boxes[b, q] = torch.tensor([cx, cy, (cols.stop - cols.start) / w, (rows.stop - rows.start) / h])
                inside[b, q, rows, cols] = 1
        if not self.predicts_masks:
            return {"pred_logits": logits, "pred_boxes": boxes}
        masks = (F.avg_pool2d(inside, 4, ceil_mode=True) - 0.5) * 20  # above 0 where a cell is mostly inside
        return {"pred_logits": logits, "pred_boxes": boxes, "pred_masks": masks}


def scene(height: int, width: int, tile: int, overlap: float, seed: int = 0) -> tuple[Image.Image, list]:
    """Squares of 6..`overlap * tile` px, apart from each other, many across the tiles' borders; and their boxes."""
    rng = np.random.default_rng(seed)
    pixels = np.zeros((height, width, 3), np.uint8)
    taken = np.zeros((height, width), bool)
    boxes = []
    borders = [t.box[2] for t in tile_grid(height, width, tile, overlap)] + [
        t.box[3] for t in tile_grid(height, width, tile, overlap)
    ]
    largest = int(overlap * tile)
    for i in range(400):
        side = int(rng.integers(6, largest + 1))
        if i % 2:  # across a tile's right or bottom border
            edge = int(rng.choice([b for b in borders if side < b < min(height, width) - side]))
            x, y = (
                (edge - side // 2, int(rng.integers(0, height - side)))
                if i % 4 == 1
                else (int(rng.integers(0, width - side)), edge - side // 2)
            )
        else:
            x, y = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
        if (
            x + side > width
            or y + side > height
            or taken[max(y - 2, 0) : y + side + 2, max(x - 2, 0) : x + side + 2].any()
        ):
            continue
        taken[y : y + side, x : x + side] = True
        white = bool(rng.integers(0, 2))
        pixels[y : y + side, x : x + side] = (255, 255 if white else 0, 255)
        boxes.append(((x, y, x + side, y + side), "white" if white else "grey"))
    return Image.fromarray(pixels), boxes


def rounded(detections: list) -> list:
    """(box, label, category id, score), boxes to 1e-3 px (float32's error on relative boxes), sorted."""
    return sorted((tuple(round(v, 3) for v in d.box), d.label, d.category_id, round(d.score, 6)) for d in detections)


def test_the_grid_covers_the_image_and_its_own_parts_split_it():
    for height, width, tile, overlap in [(700, 1000, 256, 0.25), (300, 255, 256, 0.5), (257, 1024, 128, 0.0)]:
        tiles = tile_grid(height, width, tile, overlap)
        covered = np.zeros((height, width), int)
        owned = np.zeros((height, width), int)
        for t in tiles:
            x0, y0, x1, y1 = t.box
            assert x1 - x0 == min(tile, width) and y1 - y0 == min(tile, height)
            covered[y0:y1, x0:x1] += 1
            ox0, oy0, ox1, oy1 = t.own
            assert x0 <= ox0 < ox1 <= x1 and y0 <= oy0 < oy1 <= y1  # a tile owns only what it sees
            ys, xs = np.mgrid[0:height, 0:width] + 0.5
            owned += (xs >= ox0) & (xs < ox1) & (ys >= oy0) & (ys < oy1)
        assert (covered >= 1).all() and (owned == 1).all()
        starts = sorted({t.box[0] for t in tiles})
        assert all(b - a <= tile * (1 - overlap) + 0.5 for a, b in zip(starts, starts[1:], strict=False))


@pytest.mark.parametrize(("height", "width", "tile"), [(700, 1000, 256), (480, 1300, 320)])
def test_tiled_detection_equals_one_pass_and_finds_each_square_once(height, width, tile):
    overlap = 0.25
    image, truth = scene(height, width, tile, overlap)
    crossing = [
        box
        for box, _ in truth
        if any(
            box[0] < t.box[2] < box[2] or box[1] < t.box[3] < box[3] for t in tile_grid(height, width, tile, overlap)
        )
    ]
    assert len(truth) > 60 and len(crossing) > 20
    model = Squares(min(height, width))  # one pass: the whole image at its own size
    (whole,) = detect(model, INFO, [image], threshold=0.5)
    model.config.img_size = tile  # tiles at their own size
    tiled = detect_tiled(model, INFO, image, tile, overlap, threshold=0.5)
    assert rounded(tiled) == rounded(whole)
    assert sorted((tuple(map(float, box)), label) for box, label in truth) == [d[:2] for d in rounded(tiled)]
    assert [d.score for d in tiled] == sorted((d.score for d in tiled), reverse=True)


def test_without_ownership_the_squares_across_borders_come_twice():
    """What ownership removes: a square across a border is seen by two tiles, one of them seeing a cut copy."""
    image, truth = scene(700, 1000, 256, 0.25, seed=1)
    model = Squares(256)
    tiles = tile_grid(700, 1000, 256, 0.25)
    found = list(zip(tiles, detect(model, INFO, [image.crop(t.box) for t in tiles]), strict=True))
    owned = merge_tiles(found, nms_iou=None)
    unowned = [(type(t)(t.box, (0.0, 0.0, 1e9, 1e9)), d) for t, d in found]
    assert len(merge_tiles(unowned, nms_iou=None)) > len(owned) == len(truth)


def test_tiled_evaluation_scores_the_whole_images(tmp_path):
    """A COCO split of large images, each of more squares than COCO's 100 detections: evaluated in tiles and
    merged, every square is found once with its class, AP 1; a cut copy or a capped count would lower it."""
    images, annotations = [], []
    for i in range(2):
        image, truth = scene(900, 1300, 256, 0.25, seed=10 + i)
        image.save(tmp_path / f"big{i}.png")
        images.append({"id": i + 1, "file_name": f"big{i}.png", "height": 900, "width": 1300})
        for (x0, y0, x1, y1), label in truth:
            bbox = [x0, y0, x1 - x0, y1 - y0]
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "bbox": bbox, "area": bbox[2] * bbox[3],
                                "category_id": 3 if label == "grey" else 7, "iscrowd": 0})  # fmt: skip
        assert len(truth) > 100
    categories = [{"id": 3, "name": "grey"}, {"id": 7, "name": "white"}]
    (tmp_path / "val.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    data = CocoDetection(tmp_path / "val.json", tmp_path, short_side=None, max_size=None)
    result = evaluate_detector_tiled(Squares(256, queries=60), data, INFO, tile=256, overlap=0.25, progress=False)
    assert result.count == 2 and result.metrics["ap"] == pytest.approx(1.0) and result.metrics["ap50"] == 1.0
    assert [row["ap"] for row in result.per_class] == pytest.approx([1.0, 1.0])


def test_tiled_evaluation_scores_the_masks_placed_in_the_whole_image(tmp_path):
    """A model that predicts masks, on a split whose objects have polygons: each tile's masks are placed in the whole
    image and scored against the objects' (segm AP), as pycocotools scores the same detections against the file,
    where a tenth of the squares are crowd regions, whose detections it ignores."""
    image, truth = scene(600, 900, 256, 0.25, seed=12)
    image.save(tmp_path / "big.png")
    annotations = []
    for (x0, y0, x1, y1), label in truth:
        bbox = [x0, y0, x1 - x0, y1 - y0]
        annotations.append({"id": len(annotations) + 1, "image_id": 1, "bbox": bbox, "area": bbox[2] * bbox[3],
                            "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                            "category_id": 3 if label == "grey" else 7,
                            "iscrowd": int(len(annotations) % 10 == 9)})  # fmt: skip
    categories = [{"id": 3, "name": "grey"}, {"id": 7, "name": "white"}]
    listing = {"images": [{"id": 1, "file_name": "big.png", "height": 600, "width": 900}],
               "annotations": annotations, "categories": categories}  # fmt: skip
    (tmp_path / "val.json").write_text(json.dumps(listing))
    data = CocoDetection(tmp_path / "val.json", tmp_path, short_side=None, max_size=None)
    assert data.report.crowd == len(truth) // 10 > 0
    model = Squares(256, queries=60, masks=True)
    result = evaluate_detector_tiled(model, data, INFO, tile=256, overlap=0.25, progress=False)
    assert result.metrics["segm_ap50"] > 0.95  # each square's mask where the square is, found once
    found = detect_tiled(model, INFO, image, 256, 0.25, threshold=0.0)
    coco = COCO(str(tmp_path / "val.json"))
    scored = coco.loadRes([{"image_id": 1, "category_id": d.category_id, "score": d.score, "segmentation": d.mask}
                           for d in found])  # fmt: skip
    reference = COCOeval(coco, scored, "segm")
    reference.params.maxDets = [1, 10, len(tile_grid(600, 900, 256, 0.25)) * 60]  # every tile's queries, as vitkit
    reference.evaluate(), reference.accumulate()
    precision = reference.eval["precision"][:, :, :, 0, -1]  # (IoU, recall, class) at area "all", the most detections
    assert result.metrics["segm_ap"] == pytest.approx(precision[precision > -1].mean(), abs=1e-9)
    assert result.metrics["segm_ap50"] == pytest.approx(precision[0][precision[0] > -1].mean(), abs=1e-9)


def test_detecting_files_in_tiles_tiles_the_large_ones_only(tmp_path):
    image, _ = scene(700, 1000, 256, 0.25, seed=2)
    image.save(tmp_path / "big.png")
    small = image.crop((0, 0, 256, 200))
    small.save(tmp_path / "small.png")
    model = Squares(256)
    found, skipped = detect_paths(model, INFO, [tmp_path / "big.png", tmp_path / "small.png"], tile=256, progress=False)
    assert not skipped and [f.size for f in found] == [(700, 1000), (200, 256)]
    assert found[0].detections == detect_tiled(model, INFO, image, 256)
    assert found[1].detections == detect(model, INFO, [small])[0]  # no larger than a tile: whole
