"""COCO mAP of a detector, computed by pycocotools from predictions and ground truth held in memory.

`CocoEvaluator` collects, batch by batch, the detections `postprocess` gives (boxes in pixels of the original
image) and the targets the detection datasets give (boxes (cx, cy, w, h) in [0, 1], `orig_size`, `image_id`);
`compute` builds pycocotools' ground-truth and result objects from dicts (no files) and runs its box evaluation:
AP averaged over IoU 0.50:0.95 and the classes with ground truth, at IoU 0.50 and 0.75, and over small (area
< 32^2 pixels), medium and large (> 96^2) objects, all with up to 100 detections per image. A metric with no
ground truth to score (no large objects, say) is NaN, where pycocotools writes -1.

Crowd regions (COCO's `iscrowd` 1 annotations, which the datasets leave out of the objects, as DETR's training
does) come with a target as `crowd_boxes` and `crowd_labels` (and `crowd_masks`): they are handed to pycocotools
as crowd ground truth, so a detection that covers one (at least the IoU threshold of the detection's own area) is
ignored rather than counted as a false positive, as COCO's evaluation does; they are no objects to find.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchvision.ops import box_convert, box_iou

from vitkit.detection.masks import encode_masks

COCO_METRICS = ("ap", "ap50", "ap75", "ap_small", "ap_medium", "ap_large")  # pycocotools' first six stats


def _xywh(boxes_xyxy: torch.Tensor) -> np.ndarray:
    """(n, 4) (x0, y0, x1, y1) -> (n, 4) float64 (x, y, w, h), COCO's box format."""
    return box_convert(boxes_xyxy.detach().double().cpu(), "xyxy", "xywh").numpy().reshape(-1, 4)


def _annotation(
    number: int, image_id: int, label: int, box: np.ndarray, area: float, crowd: int, segmentation: dict | None
) -> dict:
    """A COCO annotation (ground truth or detection) as pycocotools reads it: `box` (x, y, w, h) pixels, its
    `segmentation` (compressed RLE) where not None."""
    return {
        "id": number,
        "image_id": image_id,
        "category_id": int(label),
        "bbox": box.tolist(),
        "area": float(area),
        "iscrowd": crowd,
        **({"segmentation": segmentation} if segmentation is not None else {}),
    }


def _crowd_cover(record: Mapping, iou: float) -> np.ndarray:
    """(detections,) bool: each detection of an image `record` (`CocoEvaluator.images`) covers a crowd region of
    its class, at least `iou` of the detection's area inside the region's box (pycocotools' IoU with a crowd)."""
    detections, regions = record["boxes"], record.get("crowd_boxes")
    if regions is None or not len(regions) or not len(detections):
        return np.zeros(len(detections), dtype=bool)
    cover = mask_utils.iou(detections.tolist(), regions.tolist(), [1] * len(regions))  # (detections, regions)
    same = record["labels"][:, None] == record["crowd_labels"][None, :]
    return ((np.asarray(cover) >= iou) & same).any(axis=1)


def to_coco_results(
    predictions: Sequence[Mapping[str, torch.Tensor]],
    image_ids: Sequence[int],
    category_ids: Sequence[int] | None = None,
) -> list[dict]:
    """Detections in COCO's results format: one {"image_id", "category_id", "bbox": [x, y, w, h], "score"} each.

    Args:
        predictions: per image, `postprocess`'s dict: `boxes` (n, 4) (x0, y0, x1, y1) pixels, `scores`, `labels`.
        image_ids: the COCO image id of each image.
        category_ids: the COCO category id of each class index (a dataset's `category_ids`); by default the
            class index itself.
    """
    if len(predictions) != len(image_ids):
        raise ValueError(f"expected one image id per prediction: {len(predictions)} predictions, {len(image_ids)} ids")
    results = []
    for prediction, image_id in zip(predictions, image_ids, strict=True):
        labels = prediction["labels"].tolist()
        if category_ids is not None and labels and max(labels) >= len(category_ids):
            raise ValueError(f"label {max(labels)} has no category id: {len(category_ids)} categories given")
        for box, score, label in zip(_xywh(prediction["boxes"]), prediction["scores"].tolist(), labels, strict=True):
            category = category_ids[label] if category_ids is not None else label
            results.append(
                {"image_id": int(image_id), "category_id": int(category), "bbox": box.tolist(), "score": score}
            )
    return results


COCO_MAX_DETECTIONS = 100  # COCO scores an image's 100 most probable detections
SEGM_PREFIX = "segm_"  # the masks' COCO metrics: segm_ap, segm_ap50, ... beside the boxes' ap, ap50, ...


class CocoEvaluator:
    """Collects detections and ground truth image by image, then computes COCO mAP with pycocotools.

    Usage: ``update(postprocess(outputs, orig_sizes, threshold=0), targets)`` per batch, `gather()` under
    torch.distributed, then `compute()`.
    """

    def __init__(self, num_classes: int, max_detections: int = COCO_MAX_DETECTIONS) -> None:
        """`max_detections`: the most detections of an image scored, most probable first (COCO's 100; an image with
        more objects, a large image in tiles, needs more)."""
        if num_classes <= 0:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        if max_detections < COCO_MAX_DETECTIONS:
            raise ValueError(f"max_detections must be at least COCO's {COCO_MAX_DETECTIONS}, got {max_detections}")
        self.num_classes, self.max_detections = num_classes, max_detections
        self.images: dict[int, dict[str, np.ndarray | tuple[int, int]]] = {}  # image id -> its boxes
        self.with_masks = False  # the images came with masks: `compute` scores them too (segm_ap, ...)

    def __len__(self) -> int:
        return len(self.images)

    def update(
        self, predictions: Sequence[Mapping[str, torch.Tensor]], targets: Sequence[Mapping[str, torch.Tensor]]
    ) -> None:
        """Add a batch.

        Args:
            predictions: per image, `postprocess`'s dict (`boxes` (x0, y0, x1, y1) in pixels of the original image,
                `scores`, `labels`); call postprocess with the targets' `orig_size` and threshold 0. With masks,
                `masks`: each detection's mask as compressed RLE (`vitkit.detection.masks.encode_masks`).
            targets: per image, `image_id`, `orig_size` (height, width), `labels` (n,) and `boxes` (n, 4)
                (cx, cy, w, h) in [0, 1]; `area` (n,) in original pixels if given, else the boxes' area. With
                masks, `masks` (n, h, w) bool at the size the predictions' masks have (the model's input), or the
                objects' masks as compressed RLE of that size: the masks are scored there, the boxes in original
                pixels. Crowd regions, if any: `crowd_boxes` (c, 4) as `boxes`, `crowd_labels` (c,) and, with
                masks, `crowd_masks` as `masks`.
        """
        if len(predictions) != len(targets):
            raise ValueError(f"expected one target per prediction: {len(predictions)} and {len(targets)}")
        for prediction, target in zip(predictions, targets, strict=True):
            image_id = int(target["image_id"])
            if image_id in self.images:
                raise ValueError(f"image id {image_id} was already added: every image needs its own id")
            height, width = (int(v) for v in target["orig_size"])
            scale = torch.tensor([width, height, width, height], dtype=torch.float64)
            gt_xyxy = box_convert(target["boxes"].detach().double().cpu(), "cxcywh", "xyxy") * scale
            gt_boxes = _xywh(gt_xyxy)
            area = target.get("area")
            labels = prediction["labels"].cpu().numpy()
            if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise ValueError(
                    f"predicted labels must be in [0, {self.num_classes}), got {labels.min()}..{labels.max()}"
                )
            if ("masks" in prediction) != ("masks" in target):
                raise ValueError("masks are scored when both the predictions and the targets hold them: one has none")
            self.images[image_id] = {
                "size": (height, width),
                "gt_boxes": gt_boxes,
                "gt_labels": target["labels"].cpu().numpy(),
                "gt_area": area.double().cpu().numpy() if area is not None else gt_boxes[:, 2] * gt_boxes[:, 3],
                "boxes": _xywh(prediction["boxes"]),
                "scores": prediction["scores"].detach().double().cpu().numpy(),
                "labels": labels,
            }
            if "masks" in prediction:
                gt = target["masks"]
                gt = encode_masks(gt) if isinstance(gt, torch.Tensor) else list(gt)
                if len(gt) != len(gt_boxes):
                    raise ValueError(f"expected one mask per object: {len(gt_boxes)} boxes, {len(gt)} masks")
                self.images[image_id] |= {"masks": list(prediction["masks"]), "gt_masks": gt}
                self.with_masks = True
            crowd = target.get("crowd_boxes")
            if crowd is not None and len(crowd):
                crowd_xyxy = box_convert(crowd.detach().double().cpu(), "cxcywh", "xyxy") * scale
                region = {"crowd_boxes": _xywh(crowd_xyxy), "crowd_labels": target["crowd_labels"].cpu().numpy()}
                if len(region["crowd_labels"]) != len(crowd):
                    raise ValueError(f"expected a label per crowd region: {len(crowd)} regions")
                if "masks" in prediction:
                    if "crowd_masks" not in target:
                        raise ValueError("masks are scored: the crowd regions need theirs (crowd_masks)")
                    given = target["crowd_masks"]
                    region["crowd_masks"] = encode_masks(given) if isinstance(given, torch.Tensor) else list(given)
                    if len(region["crowd_masks"]) != len(crowd):
                        found = len(region["crowd_masks"])
                        raise ValueError(f"expected one mask per crowd region: {len(crowd)} regions, {found} masks")
                self.images[image_id] |= region

    def gather(self) -> None:
        """Under torch.distributed, collect every process's images into each (call on all processes before
        `compute`); an image added by several processes (a padded sampler repeats some) is kept once."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        everyone: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, self.images)
        merged: dict[int, dict] = {}
        for images in everyone:
            for image_id, record in (images or {}).items():
                merged.setdefault(image_id, record)
        self.images = merged

    def coco_objects(self) -> tuple[COCO, COCO]:
        """pycocotools' ground truth and results for the images added so far, built from dicts."""
        images, gts, dts = [], [], []  # annotation ids start at 1: pycocotools reads id 0 as "unmatched"
        for image_id, record in self.images.items():
            height, width = record["size"]
            images.append({"id": image_id, "height": height, "width": width})
            gt_masks, masks, crowd_masks = record.get("gt_masks"), record.get("masks"), record.get("crowd_masks")
            objects = zip(record["gt_boxes"], record["gt_labels"], record["gt_area"], strict=True)
            for i, (box, label, area) in enumerate(objects):
                gts.append(_annotation(len(gts) + 1, image_id, label, box, area, 0, gt_masks and gt_masks[i]))
            regions = zip(record.get("crowd_boxes", ()), record.get("crowd_labels", ()), strict=True)
            for i, (box, label) in enumerate(regions):  # pycocotools ignores them, and the detections they match
                gts.append(
                    _annotation(len(gts) + 1, image_id, label, box, box[2] * box[3], 1, crowd_masks and crowd_masks[i])
                )
            found = zip(record["boxes"], record["scores"], record["labels"], strict=True)
            for i, (box, score, label) in enumerate(found):
                dts.append(
                    _annotation(len(dts) + 1, image_id, label, box, box[2] * box[3], 0, masks and masks[i])
                    | {"score": float(score)}
                )
        categories = [{"id": k, "name": str(k)} for k in range(self.num_classes)]
        with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints
            ground_truth, results = COCO(), COCO()
            ground_truth.dataset = {"images": images, "annotations": gts, "categories": categories}
            results.dataset = {"images": images, "annotations": dts, "categories": categories}
            ground_truth.createIndex()
            results.createIndex()
        return ground_truth, results

    def best_threshold(self, iou: float = 0.5) -> float | None:
        """The score threshold whose detections (scores above it) best match the ground truth: the largest F1 of
        precision and recall, a detection counting as found when it has a ground-truth box of its class at IoU >=
        `iou` not already taken by a more probable detection (COCO's greedy matching at one IoU), and not at all
        when it found none but covers a crowd region of its class. None when no detection found an object (or
        there is none, or no ground truth): every cut then has an F1 of 0, and predict keeps its default threshold.
        The threshold lies halfway between the last detection kept and the next.
        """
        found, total = [], 0  # (score, matched) of every detection; ground-truth boxes
        for record in self.images.values():
            total += len(record["gt_labels"])
            if not len(record["scores"]):
                continue
            order = np.argsort(-record["scores"], kind="stable")
            truth = torch.as_tensor(record["gt_boxes"], dtype=torch.float64)
            ious = box_iou(
                box_convert(torch.as_tensor(record["boxes"], dtype=torch.float64), "xywh", "xyxy"),
                box_convert(truth, "xywh", "xyxy"),
            ).numpy()  # (detections, ground truth)
            taken = np.zeros(len(truth), dtype=bool)
            crowd = _crowd_cover(record, iou)  # (detections,): covers a crowd region of its class
            for d in order:
                same = (record["gt_labels"] == record["labels"][d]) & ~taken & (ious[d] >= iou)
                hit = int(np.argmax(np.where(same, ious[d], -1.0))) if same.any() else -1
                if hit >= 0:
                    taken[hit] = True
                elif crowd[d]:  # on a crowd region: neither found nor wrong, as COCO ignores it
                    continue
                found.append((float(record["scores"][d]), hit >= 0))
        if not any(hit for _, hit in found) or total == 0:  # no detection found an object: no cut is better
            return None
        found.sort(key=lambda pair: -pair[0])
        scores = np.array([s for s, _ in found])
        hits = np.cumsum([m for _, m in found])  # true positives among the top 1, 2, ...
        precision, recall = hits / np.arange(1, len(found) + 1), hits / total
        f1 = np.where(hits > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0.0)
        last = np.flatnonzero(scores > scores[np.argmax(f1)] - 1e-12)[-1]  # ties with the best cut are kept together
        below = scores[last + 1] if last + 1 < len(scores) else 0.0
        return float((scores[last] + below) / 2)

    def compute(self, verbose: bool = False) -> dict[str, float]:
        """COCO box mAP as {"ap", "ap50", "ap75", "ap_small", "ap_medium", "ap_large"}, fractions in [0, 1] (NaN
        where there is no ground truth to score), and with masks the same of the masks (iouType "segm") as
        "segm_ap", ...; `verbose` prints pycocotools' summary tables."""
        if not self.images:
            raise ValueError("no images to evaluate: call update() with predictions and targets first")
        ground_truth, results = self.coco_objects()
        metrics: dict[str, float] = {}
        for iou_type, prefix in (("bbox", ""), *((("segm", SEGM_PREFIX),) if self.with_masks else ())):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                evaluation = COCOeval(ground_truth, results, iouType=iou_type)
                evaluation.params.maxDets = [1, 10, self.max_detections]  # the AP and AR summaries read the last
                evaluation.evaluate()
                evaluation.accumulate()
                evaluation.summarize()
            if verbose:
                print(out.getvalue(), end="")
            if iou_type == "bbox":
                self.evaluation = evaluation  # per_class and pr_curves read its accumulated precision (boxes)
            stats = list(evaluation.stats[: len(COCO_METRICS)])
            if self.max_detections != COCO_MAX_DETECTIONS:  # pycocotools' summary reads AP at 100 detections
                precision = evaluation.eval["precision"][:, :, :, 0, -1]  # (T, R, K) at every area, the most
                stats[0] = float(precision[precision > -1].mean()) if (precision > -1).any() else -1.0
            metrics |= {prefix + k: float(v) if v >= 0 else math.nan for k, v in zip(COCO_METRICS, stats, strict=True)}
        return metrics

    def _precision(self) -> np.ndarray:
        """pycocotools' accumulated precision (IoU thresholds T, recall points R, classes K, areas A, max dets M),
        -1 where undefined; `compute` first."""
        evaluation = getattr(self, "evaluation", None)
        if evaluation is None:
            raise ValueError("call compute() before per_class() or pr_curves()")
        return evaluation.eval["precision"]

    def per_class(self) -> list[dict[str, float | int]]:
        """Per class, in class-index order: its ground-truth boxes (`boxes`) and COCO's AP, AP50 and AP_small
        computed as `compute`'s over that class alone (NaN where it has no ground-truth box to score; AP_small
        where it has no small one)."""
        precision = self._precision()  # (T, R, K, A, M): areas all, small, medium, large; max dets 1, 10, N
        counts = np.zeros(self.num_classes, dtype=np.int64)
        for record in self.images.values():
            counts += np.bincount(record["gt_labels"].astype(np.int64), minlength=self.num_classes)[: self.num_classes]

        def mean(p: np.ndarray) -> float:
            p = p[p > -1]
            return float(p.mean()) if p.size else math.nan

        return [
            {
                "boxes": int(counts[k]),
                "ap": mean(precision[:, :, k, 0, -1]),
                "ap50": mean(precision[0, :, k, 0, -1]),
                "ap_small": mean(precision[:, :, k, 1, -1]),
            }
            for k in range(self.num_classes)
        ]

    def pr_curves(self) -> tuple[np.ndarray, np.ndarray]:
        """The precision-recall curve of each class at IoU 0.5, as COCO interpolates it: (recall (R,) from 0 to 1,
        precision (K, R), NaN for a class without ground truth)."""
        precision = self._precision()[0, :, :, 0, -1].T  # (K, R)
        return np.asarray(self.evaluation.params.recThrs), np.where(precision > -1, precision, np.nan)


def coco_map(
    predictions: Sequence[Mapping[str, torch.Tensor]],
    targets: Sequence[Mapping[str, torch.Tensor]],
    num_classes: int,
    verbose: bool = False,
) -> dict[str, float]:
    """COCO mAP of `predictions` (`postprocess` output) against `targets` in one call; see `CocoEvaluator`."""
    evaluator = CocoEvaluator(num_classes)
    evaluator.update(predictions, targets)
    return evaluator.compute(verbose=verbose)
