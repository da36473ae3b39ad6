"""Crowd regions (`iscrowd` 1): a COCO file read by `CocoDetection` and scored by `CocoEvaluator` gives the box and
mask AP pycocotools gives on the file itself, where a detection that covers a crowd region is ignored; the best-F1
threshold ignores it too; a file whose every annotation is marked crowd (CVAT's masks) is read as objects."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitkit.data.coco import CocoDetection
from vitkit.detection import COCO_METRICS, CocoEvaluator
from vitkit.detection.masks import encode_masks

CATEGORIES = [{"id": 3, "name": "a"}, {"id": 7, "name": "b"}]  # class indices 0 and 1


def rectangle(size: tuple[int, int], x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    mask[y0:y1, x0:x1] = True
    return mask


def runs(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE counts of a mask (column by column, starting with a run of 0), as crowd
    annotations store them."""
    flat = mask.T.reshape(-1).astype(np.uint8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    return np.diff(np.concatenate([[0], edges])).tolist()


def rle_json(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode()}


def box_xywh(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())]


def crowd_folder(tmp_path, every_crowd: bool = False):
    """A COCO file of three images, each with objects, a crowd region, and detections on them (some on the crowd
    region, some false): (the file, the images' folder, the detections as COCO results with masks)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    folder.mkdir()
    images, annotations, results = [], [], []
    for image_id, size in ((1, (40, 50)), (2, (48, 40)), (3, (40, 50))):
        H, W = size
        Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(folder / f"{image_id}.png")
        images.append({"id": image_id, "file_name": f"{image_id}.png", "height": H, "width": W})
        for k in range(3):
            x0, y0 = int(rng.integers(0, W - 14)), int(rng.integers(0, 12))
            mask = rectangle(size, x0, y0, x0 + int(rng.integers(6, 14)), y0 + int(rng.integers(6, 12)))
            category = CATEGORIES[k % 2]["id"]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                                "bbox": box_xywh(mask), "area": float(mask.sum()), "iscrowd": int(every_crowd),
                                "segmentation": rle_json(mask)})  # fmt: skip
            guess = np.roll(mask, int(rng.integers(-3, 4)), axis=int(rng.integers(0, 2)))
            results.append((image_id, category, float(rng.random()), guess))
        crowd = rectangle(size, 4, H - 20, 30, H - 2)  # a region of many objects, at the bottom
        annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 3,
                            "bbox": box_xywh(crowd), "area": float(crowd.sum()), "iscrowd": 1,
                            "segmentation": {"size": [H, W], "counts": runs(crowd)}})  # fmt: skip
        for x0 in (6, 16):  # two detections inside the region, of its class, more probable than most
            results.append((image_id, 3, 0.6 + 0.3 * float(rng.random()), rectangle(size, x0, H - 16, x0 + 8, H - 6)))
        results.append((image_id, 7, 0.95, rectangle(size, 6, H - 16, 14, H - 6)))  # on it, of the other class
        results.append((image_id, 7, float(rng.random()), rectangle(size, W - 10, 2, W - 2, 9)))  # a false one
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": CATEGORIES}))
    return path, folder, results


def detected_box(mask: np.ndarray) -> list[float]:
    """A detection's box: its mask's, a fraction of a pixel off (the targets' float32 boxes are a rounding off the
    file's, which an IoU of integer boxes at a threshold's exact value would tell)."""
    x, y, w, h = box_xywh(mask)
    return [x + 0.3, y + 0.2, w, h]


def pycocotools_stats(path, results, iou_type: str) -> list[float]:
    listed = [{"image_id": i, "category_id": c, "score": s, "bbox": detected_box(m), "segmentation": rle_json(m)}
              for i, c, s, m in results]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(path))
        evaluation = COCOeval(truth, truth.loadRes(listed), iouType=iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats[: len(COCO_METRICS)].tolist()


def vitkit_evaluator(data: CocoDetection, results, crowd: bool = True) -> CocoEvaluator:
    evaluator = CocoEvaluator(2)
    index = {c: k for k, c in enumerate(data.category_ids)}
    for i, sample in enumerate(data.samples):
        _, target = data[i]
        if not crowd:
            target = {k: v for k, v in target.items() if not k.startswith("crowd_")}
        mine = [(c, s, m) for image_id, c, s, m in results if image_id == sample.image_id]
        boxes = torch.tensor([detected_box(m) for _, _, m in mine], dtype=torch.float64)
        prediction = {
            "boxes": torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1),
            "scores": torch.tensor([s for _, s, _ in mine], dtype=torch.float64),
            "labels": torch.tensor([index[c] for c, _, _ in mine]),
            "masks": encode_masks(torch.from_numpy(np.stack([m for *_, m in mine]))),
        }
        evaluator.update([prediction], [target])
    return evaluator


def test_crowd_regions_are_ignored_as_pycocotools_ignores_them_on_the_file(tmp_path):
    path, folder, results = crowd_folder(tmp_path)
    data = CocoDetection(path, folder, short_side=None, max_size=None)
    assert data.report.crowd == 3 and data.report.annotations == 9 and data.with_masks
    _, target = data[0]
    assert target["crowd_labels"].tolist() == [0] and target["crowd_masks"].shape == (1, 40, 50)
    assert target["crowd_masks"].sum() == 26 * 18 and len(target["labels"]) == 3  # the region is no object
    metrics = vitkit_evaluator(data, results).compute()
    for iou_type, prefix in (("bbox", ""), ("segm", "segm_")):
        expected = pycocotools_stats(path, results, iou_type)
        for name, value in zip(COCO_METRICS, expected, strict=True):
            assert metrics[prefix + name] == pytest.approx(value if value >= 0 else np.nan, abs=1e-9, nan_ok=True)
    blind = vitkit_evaluator(data, results, crowd=False).compute()  # the regions' detections as false ones
    assert blind["ap"] < metrics["ap"] - 0.02 and blind["segm_ap"] < metrics["segm_ap"] - 0.02


def test_the_best_threshold_ignores_detections_on_crowd_regions():
    image = {"image_id": torch.tensor(1), "orig_size": torch.tensor([100, 100]), "labels": torch.tensor([0, 0]),
             "boxes": torch.tensor([[0.15, 0.15, 0.1, 0.1], [0.55, 0.15, 0.1, 0.1]]),
             "crowd_boxes": torch.tensor([[0.5, 0.8, 0.6, 0.3]]), "crowd_labels": torch.tensor([0])}  # fmt: skip
    prediction = {  # found 0.8, false 0.7, on the crowd 0.6, found 0.5
        "boxes": torch.tensor([[10.0, 10, 20, 20], [80, 40, 90, 50], [30, 70, 40, 80], [50, 10, 60, 20]]),
        "scores": torch.tensor([0.8, 0.7, 0.6, 0.5]),
        "labels": torch.tensor([0, 0, 0, 0]),
    }
    evaluator = CocoEvaluator(1)
    evaluator.update([prediction], [image])
    assert evaluator.best_threshold() == pytest.approx(0.25)  # all three counted: F1 0.8
    blind = CocoEvaluator(1)
    blind.update([prediction], [{k: v for k, v in image.items() if not k.startswith("crowd_")}])
    assert blind.best_threshold() == pytest.approx(0.75)  # the crowd's detection a false one: the first alone
    other = dict(image, crowd_labels=torch.tensor([1]))  # a region of another class covers nothing of class 0
    evaluator = CocoEvaluator(2)
    evaluator.update([prediction], [other])
    assert evaluator.best_threshold() == pytest.approx(0.75)


def test_a_file_of_crowd_annotations_alone_is_read_as_objects(tmp_path):
    path, folder, _ = crowd_folder(tmp_path, every_crowd=True)
    data = CocoDetection(path, folder, short_side=None, max_size=None)
    assert data.report.crowd == 0 and data.report.crowd_as_objects == 12 and data.report.annotations == 12
    assert all(len(s.crowd_labels) == 0 for s in data.samples) and data.with_masks
    assert "read 12 crowd annotations as objects" in str(data.report) and "CVAT" in str(data.report)
    _, target = data[0]
    assert len(target["labels"]) == 4 and "crowd_boxes" not in target


def test_a_crowd_region_whose_segmentation_cannot_be_read_is_its_box(tmp_path):
    path, folder, _ = crowd_folder(tmp_path)
    data = json.loads(path.read_text())
    crowd = next(a for a in data["annotations"] if a["iscrowd"])
    crowd["segmentation"] = {"size": [1, 1], "counts": "0"}  # another size than the image's
    path.write_text(json.dumps(data))
    loaded = CocoDetection(path, folder, short_side=None, max_size=None)
    assert loaded.report.crowd == 3 and not loaded.report.skipped
    sample = next(s for s in loaded.samples if s.image_id == crowd["image_id"])
    x, y, w, h = crowd["bbox"]
    assert sample.decoded_crowd_masks()[0].sum() == w * h  # the box, filled
