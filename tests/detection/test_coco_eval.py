"""COCO mAP through pycocotools: 1 for the ground truth itself, 0 for wrong classes, hand-computed cases, and the
results format."""

import math

import pytest
import torch
from torchvision.ops import box_convert

from vitkit.detection import COCO_METRICS, CocoEvaluator, coco_eval, coco_map, to_coco_results

K = 4  # classes


def scene(seed=0, images=6):
    """Targets with small, medium and large objects (COCO's area split at 32^2 and 96^2 pixels)."""
    g = torch.Generator().manual_seed(seed)
    targets = []
    for i in range(images):
        height, width = 300, 400
        sides = torch.tensor([[20.0, 25.0], [60.0, 50.0], [150.0, 120.0]])[: 1 + i % 3]  # small, medium, large
        corner = torch.rand(len(sides), 2, generator=g) * torch.tensor([width - 160.0, height - 160.0])
        xyxy = torch.cat([corner, corner + sides], dim=1)
        boxes = box_convert(xyxy, "xyxy", "cxcywh") / torch.tensor([width, height, width, height])
        labels = torch.randint(0, K, (len(sides),), generator=g)
        targets.append(
            {"boxes": boxes, "labels": labels, "image_id": torch.tensor(100 + i), "orig_size": torch.tensor([300, 400])}
        )
    return targets


def as_predictions(targets, labels=None):
    """The targets as detections in pixels, as `postprocess` gives them."""
    predictions = []
    for i, t in enumerate(targets):
        height, width = t["orig_size"].tolist()
        boxes = box_convert(t["boxes"], "cxcywh", "xyxy") * torch.tensor([width, height, width, height])
        scores = torch.linspace(0.9, 0.6, len(boxes))
        predictions.append({"boxes": boxes, "scores": scores, "labels": t["labels"] if labels is None else labels[i]})
    return predictions


def test_ground_truth_scores_one_and_wrong_classes_zero():
    targets = scene()
    metrics = coco_map(as_predictions(targets), targets, K)
    assert set(metrics) == set(COCO_METRICS)
    assert all(v == pytest.approx(1.0) for v in metrics.values()), metrics
    wrong = [(t["labels"] + 1) % K for t in targets]  # labels shuffled so that every box has a wrong class
    metrics = coco_map(as_predictions(targets, wrong), targets, K)
    assert all(v == 0.0 for v in metrics.values()), metrics


def one_box_target(box_xyxy, label=0, size=(100, 100), image_id=1):
    height, width = size
    boxes = box_convert(torch.tensor([box_xyxy], dtype=torch.float32), "xyxy", "cxcywh")
    boxes = boxes / torch.tensor([width, height, width, height])
    return {
        "boxes": boxes,
        "labels": torch.tensor([label]),
        "image_id": torch.tensor(image_id),
        "orig_size": torch.tensor(size),
    }


def test_hand_computed_precision_and_iou_thresholds():
    target = one_box_target((10, 10, 50, 50))
    # A false positive scored above the true one: precision 1/2 at every recall up to 1, so AP = 0.5.
    prediction = {
        "boxes": torch.tensor([[55.0, 55.0, 95.0, 95.0], [10.0, 10.0, 50.0, 50.0]]),
        "scores": torch.tensor([0.9, 0.8]),
        "labels": torch.tensor([0, 0]),
    }
    metrics = coco_map([prediction], [target], K)
    assert metrics["ap"] == pytest.approx(0.5) and metrics["ap50"] == pytest.approx(0.5)
    assert (
        metrics["ap_medium"] == pytest.approx(0.5)
        and math.isnan(metrics["ap_small"])
        and math.isnan(metrics["ap_large"])
    )
    # The only detection overlaps with IoU 1240 / 1960 = 0.633: a hit at thresholds 0.50, 0.55, 0.60, three of ten.
    shifted = {
        "boxes": torch.tensor([[10.0, 19.0, 50.0, 59.0]]),
        "scores": torch.tensor([0.7]),
        "labels": torch.tensor([0]),
    }
    metrics = coco_map([shifted], [target], K)
    assert metrics["ap50"] == pytest.approx(1.0) and metrics["ap75"] == 0.0 and metrics["ap"] == pytest.approx(0.3)


def test_evaluator_accumulates_batches_and_rejects_repeats(capsys):
    targets = scene(images=5)
    evaluator = CocoEvaluator(K)
    evaluator.update(as_predictions(targets[:2]), targets[:2])
    evaluator.update(as_predictions(targets[2:]), targets[2:])
    assert len(evaluator) == 5
    assert evaluator.compute()["ap"] == pytest.approx(1.0)
    assert capsys.readouterr().out == ""  # pycocotools' prints are kept quiet ...
    evaluator.compute(verbose=True)
    assert "Average Precision" in capsys.readouterr().out  # ... unless asked for
    with pytest.raises(ValueError, match="image id 100 was already added"):
        evaluator.update(as_predictions(targets[:1]), targets[:1])
    with pytest.raises(ValueError, match="no images to evaluate"):
        CocoEvaluator(K).compute()
    bad = as_predictions(targets[:1], [torch.full((1,), K)])
    with pytest.raises(ValueError, match=r"predicted labels must be in \[0, 4\)"):
        CocoEvaluator(K).update(bad, targets[:1])


def test_gather_keeps_each_image_once(monkeypatch):
    targets = scene(images=4)
    mine, theirs = CocoEvaluator(K), CocoEvaluator(K)
    mine.update(as_predictions(targets[:3]), targets[:3])
    theirs.update(as_predictions(targets[2:]), targets[2:])  # image 102 on both, as a padded sampler repeats it

    def all_gather_object(out, obj):
        out[0], out[1] = mine.images, theirs.images

    monkeypatch.setattr(coco_eval.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(coco_eval.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(coco_eval.dist, "all_gather_object", all_gather_object)
    mine.gather()
    assert sorted(mine.images) == [100, 101, 102, 103]


def test_results_in_coco_format_with_category_ids():
    prediction = {
        "boxes": torch.tensor([[10.0, 20.0, 50.0, 80.0], [0.0, 0.0, 5.0, 5.0]]),
        "scores": torch.tensor([0.75, 0.5]),
        "labels": torch.tensor([1, 0]),
    }
    results = to_coco_results([prediction], [42], category_ids=[3, 7])
    assert results == [
        {"image_id": 42, "category_id": 7, "bbox": [10.0, 20.0, 40.0, 60.0], "score": 0.75},
        {"image_id": 42, "category_id": 3, "bbox": [0.0, 0.0, 5.0, 5.0], "score": 0.5},
    ]
    assert to_coco_results([prediction], [42])[0]["category_id"] == 1
    with pytest.raises(ValueError, match="label 1 has no category id"):
        to_coco_results([prediction], [42], category_ids=[3])
    with pytest.raises(ValueError, match="one image id per prediction"):
        to_coco_results([prediction], [1, 2])


def test_best_threshold_keeps_the_detections_of_the_best_f1():
    """Two objects of class 0; detections: the first exactly (0.9), its duplicate (0.8), the second exactly (0.6),
    a wrong class on the second (0.5) and a box on nothing (0.3). F1 after each: 0.67, 0.5, 0.8, 0.67, 0.57: the best
    keeps the top three, so the threshold lies between 0.6 and 0.5."""
    evaluator = CocoEvaluator(num_classes=2)
    target = {
        "image_id": torch.tensor(1), "orig_size": torch.tensor([100, 100]), "labels": torch.tensor([0, 0]),
        "boxes": torch.tensor([[0.2, 0.2, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]]),
    }  # fmt: skip
    first, second, nothing = [10.0, 10.0, 30.0, 30.0], [60.0, 60.0, 80.0, 80.0], [40.0, 0.0, 50.0, 10.0]
    prediction = {
        "boxes": torch.tensor([first, first, second, second, nothing]),
        "scores": torch.tensor([0.9, 0.8, 0.6, 0.5, 0.3]),
        "labels": torch.tensor([0, 0, 0, 1, 0]),
    }
    evaluator.update([prediction], [target])
    assert evaluator.best_threshold() == pytest.approx(0.55)
    # at IoU 0.99 a box 1 px off no longer counts: only exact boxes are found
    shifted = {**prediction, "boxes": prediction["boxes"] + torch.tensor([1.0, 0.0, 1.0, 0.0])}
    off = CocoEvaluator(num_classes=2)
    off.update([shifted], [target])
    assert off.best_threshold(iou=0.5) == pytest.approx(0.55)
    assert off.best_threshold(iou=0.99) is None  # nothing found: every cut's F1 is 0, none is best
    empty = CocoEvaluator(num_classes=2)
    empty.update([{k: v[:0] for k, v in prediction.items()}], [target])
    assert empty.best_threshold() is None


def _noisy(targets, seed=1):
    """Detections near the targets, some shifted off, some with a wrong class, scores spread: a real ranking."""
    g = torch.Generator().manual_seed(seed)
    predictions = as_predictions(targets)
    for p in predictions:
        n = len(p["boxes"])
        p["boxes"] = p["boxes"] + torch.randn(n, 4, generator=g) * 12
        p["scores"] = torch.rand(n, generator=g)
        flip = torch.rand(n, generator=g) < 0.3
        p["labels"] = torch.where(flip, (p["labels"] + 1) % K, p["labels"])
    return predictions


def test_per_class_ap_is_the_ap_of_that_class_alone():
    """Each class's AP, AP50 and AP_small equal COCO's metrics over a copy of the data holding that class only; its
    box count is its ground-truth boxes; the precision-recall curve at IoU 0.5 averages to its AP50."""
    targets = scene(images=12)
    predictions = _noisy(targets)
    evaluator = CocoEvaluator(K)
    evaluator.update(predictions, targets)
    evaluator.compute()
    rows = evaluator.per_class()
    recall, precision = evaluator.pr_curves()
    assert recall.shape == (101,) and precision.shape == (K, 101)
    for k, row in enumerate(rows):
        keep_t = [dict(t, boxes=t["boxes"][t["labels"] == k], labels=t["labels"][t["labels"] == k]) for t in targets]
        keep_p = [{name: v[p["labels"] == k] for name, v in p.items()} for p in predictions]
        alone = coco_map(keep_p, keep_t, K)
        assert row["boxes"] == sum(int((t["labels"] == k).sum()) for t in targets)
        for name in ("ap", "ap50", "ap_small"):
            assert row[name] == pytest.approx(alone[name], nan_ok=True), (k, name)
        assert float(torch.tensor(precision[k]).mean()) == pytest.approx(row["ap50"])


def test_an_image_with_more_objects_than_coco_scores_needs_more_detections():
    """COCO scores 100 detections of a class an image: an image of 150 objects of one class found perfectly scores
    AP 1 only when the evaluator scores more (a large image in tiles); every metric, AP included, at that number."""
    height, width = 1000, 1500
    corners = torch.stack(torch.meshgrid(torch.arange(10) * 100.0, torch.arange(15) * 100.0, indexing="ij"), -1)
    xyxy = torch.cat([corners.flip(-1).reshape(-1, 2), corners.flip(-1).reshape(-1, 2) + 40], dim=1)  # (150, 4)
    target = {
        "boxes": box_convert(xyxy, "xyxy", "cxcywh") / torch.tensor([width, height, width, height]),
        "labels": torch.zeros(150, dtype=torch.int64),
        "image_id": torch.tensor(1),
        "orig_size": torch.tensor([height, width]),
    }
    prediction = {"boxes": xyxy, "scores": torch.linspace(0.99, 0.5, 150), "labels": target["labels"]}
    capped, full = CocoEvaluator(K), CocoEvaluator(K, max_detections=300)
    for evaluator in (capped, full):
        evaluator.update([prediction], [target])
    capped, full = capped.compute(), full.compute()
    assert capped["ap"] < 0.8 and capped["ap50"] < 0.8
    assert full["ap"] == pytest.approx(1.0) and full["ap50"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least COCO's 100"):
        CocoEvaluator(K, max_detections=50)
