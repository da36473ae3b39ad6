"""Mask AP: `CocoEvaluator` with masks scores them as pycocotools' own evaluation of the same masks written as a
COCO results file does, beside the boxes; `detection_masks` cuts each detection's mask from the padded image."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitkit.detection import COCO_METRICS, CocoEvaluator
from vitkit.detection.masks import detection_masks, encode_masks

SIZE = (40, 50)


def blob(rng: np.random.Generator) -> np.ndarray:
    mask = np.zeros(SIZE, dtype=bool)
    y, x = rng.integers(2, 25), rng.integers(2, 30)
    mask[y : y + rng.integers(6, 14), x : x + rng.integers(6, 18)] = True
    return mask


def box_of(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def test_mask_ap_is_pycocotools_on_the_same_masks(tmp_path):
    rng = np.random.default_rng(0)
    evaluator = CocoEvaluator(2)
    gts, dts, images = [], [], []
    for image_id in (1, 2, 3):
        truth = [blob(rng) for _ in range(3)]
        labels = rng.integers(0, 2, 3)
        guesses = [np.roll(m, int(rng.integers(-3, 4)), axis=int(rng.integers(0, 2))) for m in truth]
        guesses.append(blob(rng))  # a false one
        scores, guessed = rng.random(4), np.append(labels, 1)
        H, W = SIZE
        boxes = torch.tensor([box_of(m) for m in truth])  # (3, 4) x0 y0 x1 y1
        target = {
            "image_id": torch.tensor(image_id), "orig_size": torch.tensor(SIZE), "labels": torch.tensor(labels),
            "boxes": torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2 / W, (boxes[:, 1] + boxes[:, 3]) / 2 / H,
                                  (boxes[:, 2] - boxes[:, 0]) / W, (boxes[:, 3] - boxes[:, 1]) / H], 1),
            "masks": torch.from_numpy(np.stack(truth)),
        }  # fmt: skip
        prediction = {
            "boxes": torch.tensor([box_of(m) for m in guesses]), "scores": torch.tensor(scores),
            "labels": torch.tensor(guessed), "masks": encode_masks(torch.from_numpy(np.stack(guesses))),
        }  # fmt: skip
        evaluator.update([prediction], [target])
        images.append({"id": image_id, "height": H, "width": W})
        for m, label in zip(truth, labels, strict=True):
            rle = mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))
            x0, y0, x1, y1 = box_of(m)
            gts.append({"id": len(gts) + 1, "image_id": image_id, "category_id": int(label), "iscrowd": 0,
                        "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()},
                        "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float((x1 - x0) * (y1 - y0))})  # fmt: skip
        for m, label, score in zip(guesses, guessed, scores, strict=True):
            rle = mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))
            dts.append({"image_id": image_id, "category_id": int(label), "score": float(score),
                        "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()}})  # fmt: skip
    categories = [{"id": 0, "name": "a"}, {"id": 1, "name": "b"}]
    (tmp_path / "gt.json").write_text(json.dumps({"images": images, "annotations": gts, "categories": categories}))
    (tmp_path / "dt.json").write_text(json.dumps(dts))
    with contextlib.redirect_stdout(io.StringIO()):
        truth_file = COCO(str(tmp_path / "gt.json"))
        reference = COCOeval(truth_file, truth_file.loadRes(str(tmp_path / "dt.json")), iouType="segm")
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
    metrics = evaluator.compute()
    expected = dict(zip(COCO_METRICS, reference.stats[: len(COCO_METRICS)].tolist(), strict=True))
    for name, value in expected.items():
        assert metrics[f"segm_{name}"] == pytest.approx(value) if value >= 0 else np.isnan(metrics[f"segm_{name}"])
    assert 0 < metrics["segm_ap"] < 1 and 0 < metrics["ap"] < 1  # the boxes scored beside the masks


def test_detection_masks_cut_each_querys_mask_from_the_padded_image():
    logits = torch.full((3, 10, 12), -5.0)  # a padded image of 40 x 48, the image itself 30 x 41
    logits[1, 2:5, 3:8] = 5.0
    masks = detection_masks(logits, torch.tensor([1, 1, 0]), (30, 41))
    assert masks.shape == (3, 30, 41) and not masks[2].any()
    ys, xs = torch.nonzero(masks[0], as_tuple=True)
    assert (ys.min(), ys.max(), xs.min(), xs.max()) == (8, 19, 12, 31)  # logit cells 2..4 and 3..7, 4 px each
