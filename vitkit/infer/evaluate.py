"""Evaluating a trained model on held-out data: a classifier's loss, top-1, top-5, per-class accuracy and confusion
matrix; a detector's COCO mAP. Each from a loader (what training validates with, on one process's shard when
`distributed`) or from a model directory (what `vitkit eval` runs; see `vitkit.infer.model_dir` for what a
directory that lacks some of its model's description is evaluated with).

Letters: B batch, K classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from vitkit.data import (
    EpochSampler,
    TransformedImages,
    Unreadable,
    data_gone,
    detection_sampler,
    eval_classes,
    eval_split,
    eval_transform,
    load_data,
    load_detection,
    make_loader,
    normalize,
    summarize_unreadable,
)
from vitkit.data.coco import CocoDetection, crowd_target, open_annotated
from vitkit.data.detection import detection_target
from vitkit.detection import CocoEvaluator, Postprocessing, collate_detection
from vitkit.detection.coco_eval import COCO_MAX_DETECTIONS
from vitkit.detection.masks import detection_masks, encode_masks
from vitkit.errors import OptionError
from vitkit.infer.detect import detector_outputs, reading
from vitkit.infer.files import progress_bar
from vitkit.infer.model_dir import detection_reading, inference_info
from vitkit.infer.runtime import autocast, resolve_device
from vitkit.infer.tiles import DEFAULT_NMS_IOU, DEFAULT_OVERLAP, detect_tiled, tile_grid
from vitkit.layers import to_2tuple
from vitkit.models.interface import VitkitDetector, predicts_masks
from vitkit.weights import ModelInfo, from_pretrained, model_info


def unreadable_dicts(skipped: Sequence[Unreadable]) -> list[dict[str, str]]:
    """Unreadable images as plain JSON values: [{"image": name, "reason": why}, ...]."""
    return [{"image": item.name, "reason": item.error} for item in skipped]


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy (no label smoothing)
    top1: float  # fraction of images whose most probable class is right
    top5: float | None  # fraction whose right class is among the five most probable; None with K <= 5 classes,
    # where the five most probable are every class (top-5 would always be 1)
    count: int  # images evaluated
    confusion: torch.Tensor  # (K, K) int64 counts: row = true class, column = predicted class
    skipped: tuple[Unreadable, ...]  # images that could not be read, with the reason
    classes: tuple[str, ...] = ()  # the K class names, in label order (empty when not known)

    @property
    def per_class(self) -> torch.Tensor:
        """(K,) accuracy of each class (NaN for a class with no images)."""
        return self.confusion.diagonal().double() / self.confusion.sum(dim=1).double()

    def class_accuracies(self) -> dict[str, float | None]:
        """Accuracy by class name (None for a class with no images); classes named by their index when unnamed."""
        names = self.classes or tuple(str(k) for k in range(len(self.confusion)))
        accuracies = self.per_class.tolist()
        return {name: None if math.isnan(acc) else acc for name, acc in zip(names, accuracies, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: images, loss, top1, top5 (only with more than 5 classes), per_class (name -> accuracy
        or None), confusion, skipped (a list of {image, reason})."""
        values = {"images": self.count, "loss": self.loss, "top1": self.top1, "top5": self.top5}
        if self.top5 is None:
            del values["top5"]
        return values | {
            "per_class": self.class_accuracies(),
            "confusion": self.confusion.tolist(),
            "skipped": unreadable_dicts(self.skipped),
        }


@dataclass(frozen=True)
class DetectionResult:
    metrics: dict[str, float]  # ap, ap50, ap75, ap_small, ap_medium, ap_large in [0, 1]; NaN with nothing to score
    count: int  # images evaluated
    skipped: tuple[Unreadable, ...]  # images that could not be read, with the reason
    threshold: float | None = None  # the score threshold of the best F1 at IoU 0.5 (`CocoEvaluator.best_threshold`)
    classes: tuple[str, ...] = ()  # the class names, in class-index order
    per_class: tuple[dict[str, float | int], ...] = ()  # per class: boxes, ap, ap50, ap_small (`CocoEvaluator`)
    recall: tuple[float, ...] = ()  # the recall points of the precision-recall curves (COCO's 101, 0..1)
    precision: tuple[tuple[float, ...], ...] = ()  # per class, its precision at each recall point, IoU 0.5 (NaN: none)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: images, the six COCO metrics (None where NaN), the best-F1 threshold, per class its
        boxes, AP, AP50, AP_small and precision-recall curve, skipped (a list of {image, reason})."""

        def plain(v: float | int) -> float | int | None:
            return None if isinstance(v, float) and math.isnan(v) else v

        metrics = {k: plain(v) for k, v in self.metrics.items()}
        per_class = [
            {"class": name, **{k: plain(v) for k, v in row.items()}, "precision": [plain(p) for p in curve]}
            for name, row, curve in zip(self.classes, self.per_class, self.precision, strict=True)
        ]
        return {
            "images": self.count, **metrics, "threshold": self.threshold, "recall": list(self.recall),
            "per_class": per_class, "skipped": unreadable_dicts(self.skipped),
        }  # fmt: skip


def _sum_over_processes(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The sum of `values` over the processes of torch.distributed's group (computed on `device`), on the CPU."""
    values = values.to(device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values.cpu()


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, info: ModelInfo, distributed: bool = False, precision: str = "fp32"
) -> EvalResult:
    """Evaluate `model` on the batches of `loader` (a `vitkit.data.make_loader` loader of uint8 images, normalised
    here with `info`'s statistics).

    Args:
        distributed: each process of torch.distributed's group evaluated its shard: the counts are summed.
        precision: "fp32", or "bf16" for a bfloat16 autocast forward.
    """
    model.eval()
    device = next(model.parameters()).device
    num_classes = len(info.classes)
    totals = torch.zeros(4, dtype=torch.float64)  # loss sum, top-1 hits, top-5 hits, images
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    skipped: list[Unreadable] = []
    k = min(5, num_classes)
    for batch in loader:
        skipped += batch.skipped
        if len(batch.labels) == 0:
            continue
        images = normalize(batch.images.to(device), info.mean, info.std)  # (B, C, H, W)
        labels = batch.labels.to(device)
        with autocast(device, precision):
            logits = model(images)  # (B, K)
        logits = logits.float()
        ranked = logits.topk(k, dim=1).indices  # (B, k)
        totals += torch.tensor(
            [
                F.cross_entropy(logits, labels, reduction="sum").item(),
                (ranked[:, 0] == labels).sum().item(),
                (ranked == labels[:, None]).any(dim=1).sum().item(),
                len(labels),
            ],
            dtype=torch.float64,
        )
        pairs = labels.cpu() * num_classes + ranked[:, 0].cpu()  # (true, predicted) -> one index in [0, K*K)
        confusion += torch.bincount(pairs, minlength=num_classes**2).view(num_classes, num_classes)  # (K*K,) -> (K, K)
    if distributed:
        totals, confusion = _sum_over_processes(totals, device), _sum_over_processes(confusion, device)
    count = int(totals[3])
    if count == 0:
        raise ValueError(_none_readable(skipped))
    loss, top1, top5 = (totals[:3] / count).tolist()
    return EvalResult(
        loss, top1, top5 if k < num_classes else None, count, confusion, tuple(skipped), tuple(info.classes)
    )


def _recorded_data(model_dir: str, data: str) -> str:
    """`data`, the training data `model_dir`'s config.json records, where it can still be read; OptionError naming
    it as the model's (the caller never typed it) where a folder or file it names is gone."""
    if data_gone(data):
        raise OptionError(
            lambda name: (
                f"{model_dir} was trained on {data}, which is gone (moved or deleted): name the data to evaluate on "
                f"({name('data')})"
            )
        )
    return data


def evaluate_model_dir(
    model_dir: str,
    data: str | None = None,
    batch_size: int = 256,
    device: str | None = None,
    workers: int = 0,
    precision: str = "fp32",
) -> tuple[EvalResult, ModelInfo]:
    """Evaluate the classifier in `model_dir` on `data` (see `vitkit.data.eval_split`; by default the held-out
    part of its training data, split as in training, which only a directory written by vitkit train knows), in
    `precision` ("bf16": under bfloat16 autocast, as a bf16 run validates).

    A directory whose config.json names no training data needs `data`; when it names no classes either, the
    data's class names are taken, in their sorted order, as the model's (`missing_info_note` words what stood in).
    Returns the result and what the model was read with (`vitkit.infer.inference_info`).
    """
    model = from_pretrained(model_dir).to(resolve_device(device))
    num_classes = getattr(model.config, "num_classes", 0)
    if num_classes <= 0:
        raise ValueError(
            f"{model_dir} holds a model without classifier (num_classes {num_classes}): nothing to evaluate"
        )
    saved, info = model_info(model), inference_info(model)
    if data is None:
        if saved.data is None:
            raise OptionError(
                lambda name: (
                    f"{model_dir} does not say the data its model was trained on (config.json has no 'data'): name "
                    f"the data to evaluate on ({name('data')})"
                )
            )
        # A fixed split is saved as fraction 0, which means "none given" here.
        _recorded_data(model_dir, saved.data)
        _, held, found = load_data(saved.data, saved.val_fraction or None, saved.split_seed or 0)
        held = eval_classes(saved.data, held, found.classes, info.classes)
    else:
        held, found = eval_split(data)
        if saved.data is None and saved.classes is None:
            if len(found) != len(info.classes):
                raise ValueError(f"{data} has {len(found)} classes {list(found)}, the model has {len(info.classes)}")
            info = replace(info, classes=found)
        held = eval_classes(data, held, found, info.classes)
    transform = eval_transform(to_2tuple(model.config.img_size), model.config.in_chans, info.framing())
    images = TransformedImages(held, transform)
    loader = make_loader(images, EpochSampler(len(images), shuffle=False, pad=False), batch_size, workers)
    return evaluate(model, loader, info, precision=precision), info


@torch.no_grad()
def evaluate_detector(
    model: VitkitDetector,
    loader: DataLoader,
    info: ModelInfo,
    postprocessing: Postprocessing | None = None,
    distributed: bool = False,
    precision: str = "fp32",
) -> DetectionResult:
    """COCO mAP of `model` on the batches of `loader` (`vitkit.detection.collate_detection` batches of a detection
    dataset). Every query is scored (threshold 0), at most 100 per image as COCO counts them. A model that predicts
    masks, on data with masks, is scored on them too (`segm_ap`, ...): each detection's mask against the objects'
    at the size the model saw the image (the boxes are scored in the stored image's pixels).

    Args:
        distributed: each process of torch.distributed's group evaluated its shard: the detections are gathered
            before scoring.
        precision: "fp32", or "bf16" for a bfloat16 autocast forward.
    """
    model.eval()
    device = next(model.parameters()).device
    read = reading(model, postprocessing)
    evaluator = CocoEvaluator(len(info.classes))
    skipped: list[Unreadable] = []
    for batch in loader:
        skipped += batch.skipped
        if not batch.targets:
            continue
        batch = batch.to(device)
        outputs = detector_outputs(model, batch.images, batch.pixel_mask, precision)
        sizes = torch.stack([t["orig_size"] for t in batch.targets])  # (B, 2): boxes in pixels of the stored image
        predictions = read(outputs, sizes, 0.0)
        targets = batch.targets
        if "pred_masks" in outputs and all("masks" in t for t in targets):  # scored at the model's input size
            for prediction, target, logits in zip(predictions, targets, outputs["pred_masks"], strict=True):
                shown = tuple(target["masks"].shape[-2:])
                prediction["masks"] = encode_masks(detection_masks(logits, prediction["queries"], shown))
        else:
            targets = [{k: v for k, v in t.items() if k not in ("masks", "crowd_masks")} for t in targets]  # boxes
        evaluator.update(predictions, targets)
    if distributed:
        evaluator.gather()
    return _detection_result(evaluator, skipped, info)


def _none_readable(skipped: list[Unreadable]) -> str:
    """Why there is nothing to evaluate: the images met, each with why it could not be read."""
    said = summarize_unreadable(skipped)
    return "no readable images to evaluate" + (f"; {said}" if said else "")


def _detection_result(evaluator: CocoEvaluator, skipped: list[Unreadable], info: ModelInfo) -> DetectionResult:
    if len(evaluator) == 0:
        raise ValueError(_none_readable(skipped))
    metrics = evaluator.compute()
    recall, precision = evaluator.pr_curves()
    return DetectionResult(
        metrics, len(evaluator), tuple(skipped), evaluator.best_threshold(), tuple(info.classes),
        tuple(evaluator.per_class()), tuple(recall.tolist()), tuple(tuple(row.tolist()) for row in precision),
    )  # fmt: skip


@torch.no_grad()
def evaluate_detector_tiled(
    model: VitkitDetector,
    data: CocoDetection,
    info: ModelInfo,
    tile: int,
    overlap: float = DEFAULT_OVERLAP,
    postprocessing: Postprocessing | None = None,
    nms_iou: float | None = DEFAULT_NMS_IOU,
    progress: bool | None = None,
    precision: str = "fp32",
) -> DetectionResult:
    """COCO mAP of `model` on the whole images of `data` (a COCO split at its stored size), each detected in tiles
    and merged (`vitkit.infer.tiles.detect_tiled`, every query scored, the forward under `precision`) and scored
    against all its boxes. An image is scored on as many detections as its tiles give (COCO's 100 would cap an
    image of many objects). A model that predicts masks, on data with masks, is scored on them too (`segm_ap`, ...),
    each detection's mask placed in the whole image as `vitkit predict --tile` places it."""
    model.eval()
    if data.short_side is not None:
        raise ValueError("tiled evaluation reads the images at their stored size: load the data with short_side=None")
    tiles = max(len(tile_grid(*s.size, tile, overlap)) for s in data.samples)
    per_tile = max(model.config.num_queries, reading(model, postprocessing).top_k or 0)  # top-k pairs may be more
    evaluator = CocoEvaluator(len(info.classes), max(COCO_MAX_DETECTIONS, tiles * per_tile))
    index = {name: k for k, name in enumerate(info.classes)}
    masks = predicts_masks(model) and data.with_masks
    skipped: list[Unreadable] = []
    total = sum(len(tile_grid(*s.size, tile, overlap)) for s in data.samples)
    with progress_bar(total, progress, unit="tile") as bar:
        for i, sample in enumerate(data.samples):
            try:
                image = open_annotated(sample.path, *sample.size)
            except OSError as err:
                skipped.append(Unreadable(data.describe(i), str(err)))
                bar.update(len(tile_grid(*sample.size, tile, overlap)))
                continue
            found = detect_tiled(
                model, info, image, tile, overlap, 0.0, postprocessing, nms_iou, bar=bar, precision=precision
            )
            prediction = {
                "boxes": torch.tensor([d.box for d in found], dtype=torch.float64).reshape(-1, 4),
                "scores": torch.tensor([d.score for d in found], dtype=torch.float64),
                "labels": torch.tensor([index[d.label] for d in found], dtype=torch.int64),
            }
            size = sample.size
            target = detection_target(sample.boxes, sample.labels, sample.areas, sample.image_id, size, size)
            if len(sample.crowd_labels):  # regions whose detections are ignored
                target |= crowd_target(sample)
            if masks:  # both as compressed RLE of the whole image (pycocotools reads JSON's string counts too)
                prediction["masks"] = [d.mask for d in found]
                target["masks"] = list(sample.masks)
                target["crowd_masks"] = list(sample.crowd_masks)
            evaluator.update([prediction], [target])
    return _detection_result(evaluator, skipped, info)


def evaluate_detector_dir(
    model_dir: str,
    data: str | None = None,
    batch_size: int = 64,
    device: str | None = None,
    workers: int = 0,
    precision: str = "fp32",
    tile: int | None = None,
    overlap: float = DEFAULT_OVERLAP,
    progress: bool | None = None,
) -> tuple[DetectionResult, ModelInfo]:
    """COCO mAP of the detector in `model_dir` on the validation split of `data` (builtin:digits-detect or a
    COCO-format folder; by default the data it was trained on, which only a directory written by vitkit train
    knows), in `precision` ("bf16": under bfloat16 autocast, as a bf16 run validates). With `tile`, each image of
    a COCO folder at its stored size, in tiles of that side sharing `overlap` (`evaluate_detector_tiled`); None: in
    the tiles the model was trained on (`ModelInfo.tile`), if any; 0: whole images.

    A directory whose config.json names no training data needs `data`; when it names no classes either, the data's
    classes and category ids are taken, in class-index order, as the model's (`vitkit.infer.missing_info_note`
    words what stood in). Returns the result and what the model was read with (`vitkit.infer.inference_info`).
    """
    model = from_pretrained(model_dir).to(resolve_device(device))
    saved, info, postprocessing = model_info(model), inference_info(model), detection_reading(model, model_dir)
    if saved.data is None and data is None:
        raise OptionError(
            lambda name: (
                f"{model_dir} does not say the data its model was trained on (config.json has no 'data'): name the "
                f"data to evaluate on ({name('data')})"
            )
        )
    side = min(to_2tuple(model.config.img_size))
    source = data or _recorded_data(model_dir, saved.data)
    tile = (saved.tile if tile is None else tile) or None
    if tile is not None and source.startswith("builtin:"):
        raise OptionError(
            lambda name: (
                f"{source} is of small canvases: tiles are for large images, in a COCO-format folder; evaluate the "
                f"whole canvases with {name('tile', 0)}"
            )
        )
    options = {"short_side": None, "max_size": None} if tile is not None else {"img_size": side}
    _, val, found = load_detection(source, channels=model.config.in_chans, val_only=True, **options)
    if saved.data is None and saved.classes is None:
        if len(found.classes) != len(info.classes):
            raise ValueError(f"{data} has {len(found.classes)} classes, the model has {len(info.classes)}")
        info = replace(info, classes=found.classes, category_ids=found.category_ids)
    if found.classes != info.classes:
        numbered = info.category_ids is not None and found.category_ids is not None
        if sorted(found.classes) == sorted(info.classes) and numbered:
            theirs = dict(zip(found.category_ids, found.classes, strict=True))
            ours = dict(zip(info.category_ids, info.classes, strict=True))
            which = "names" if tuple(found.category_ids) == tuple(info.category_ids) else "numbers"
            raise ValueError(
                f"{source} {which} the model's classes otherwise: {theirs}, the model {ours}; give the annotations "
                "the model's ids and names (category_id of each annotation, id and name of each category)"
            )
        raise ValueError(f"{source} has classes {list(found.classes)}, the model knows {list(info.classes)}")
    if tile is not None:
        result = evaluate_detector_tiled(
            model, val, info, tile, overlap, postprocessing, progress=progress, precision=precision
        )
        return result, info
    sampler = detection_sampler(val, batch_size)  # batches of one orientation
    loader = DataLoader(val, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_detection)
    return evaluate_detector(model, loader, info, postprocessing, precision=precision), info
