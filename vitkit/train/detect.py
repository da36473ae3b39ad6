"""A trained detector: COCO mAP on held-out data, detections on image files, and the decoder's cross-attention of
each detection (DETR's figure 6).

A detector's model directory, as `vitkit train` writes it, holds the model (config.json, model.safetensors), the
data description (dataset.json, a `vitkit.data.DetectionInfo`) and postprocess.json, how its outputs become
detections (`vitkit.detection.Postprocessing`): {"classification": "ce" (softmax over the classes and "no object",
DETR) or "focal" (a sigmoid per class, Deformable DETR), "top_k": null or the number of (query, class) pairs scored,
"nms_iou": null or the IoU of per-class non-maximum suppression}. A directory without postprocess.json is read as
DETR's (softmax, each query's best class, no suppression). A directory without dataset.json
(`save_pretrained`, `vitkit convert`) is a detector when its model is one, and is used with what its config holds,
as `vitkit.train.evaluate` describes for classifiers; each class index is then its category id.

Letters: B images, C channels, H, W image size, Q object queries, h, w feature-map size, n detections.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from vitkit.data import DetectionInfo, EpochSampler, Unreadable, image_mode, load_detection, normalize, open_image
from vitkit.data.sources import INFO_NAME
from vitkit.detection import CocoEvaluator, Postprocessing, collate_detection, pad_images
from vitkit.layers import capture_attention, to_2tuple
from vitkit.layers.attention import attention_layers
from vitkit.models.registry import family_of
from vitkit.train.distributed import DistEnv, resolve_device
from vitkit.train.evaluate import (
    autocast,
    image_loader,
    model_dir_classes,
    progress_bar,
    unreadable_dicts,
)
from vitkit.train.recipe import DETECTION, model_task
from vitkit.viz import draw_detections, object_attention_figure
from vitkit.weights import from_pretrained, model_info

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SETTINGS_NAME = "postprocess.json"
DETR_POSTPROCESSING = Postprocessing()  # softmax, each query's best class, no suppression
MAX_SIZE = 1333  # the longer side of a detector's input is at most this (DETR's resize, as CocoDetection's)
# The focal loss as Deformable DETR uses it: the matcher's class cost and the loss weighted 2, the class biases of
# a fresh model set so that every class starts at probability FOCAL_PRIOR.
DETECTION_WEIGHTS: dict[str, dict[str, float]] = {"ce": {}, "focal": {"loss_ce": 2.0}}
FOCAL_MATCH_COST = 2.0
FOCAL_PRIOR = 0.01


@dataclass(frozen=True)
class DetectionResult:
    metrics: dict[str, float]  # ap, ap50, ap75, ap_small, ap_medium, ap_large in [0, 1]; NaN with nothing to score
    count: int  # images evaluated
    skipped: tuple[Unreadable, ...]  # images that could not be read, with the reason

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: images, the six COCO metrics (None where NaN), skipped (a list of {image, reason})."""
        metrics = {k: None if math.isnan(v) else v for k, v in self.metrics.items()}
        return {"images": self.count, **metrics, "skipped": unreadable_dicts(self.skipped)}


@dataclass(frozen=True)
class Detection:
    label: str  # class name
    category_id: int  # the dataset's category id of the class
    score: float  # the class probability
    box: tuple[float, float, float, float]  # (x0, y0, x1, y1) in pixels of the image

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.label, "category_id": self.category_id, "score": self.score, "box": list(self.box)}


@dataclass(frozen=True)
class ImageDetections:
    image: str  # the image file
    size: tuple[int, int]  # its (height, width)
    detections: list[Detection]  # most probable first

    def to_dict(self) -> dict[str, Any]:
        height, width = self.size
        return {
            "image": self.image,
            "height": height,
            "width": width,
            "detections": [d.to_dict() for d in self.detections],
        }


def save_detection_settings(directory: str | os.PathLike, postprocessing: Postprocessing) -> Path:
    """Write postprocess.json: how the detector's outputs become detections (`vitkit.detection.Postprocessing`)."""
    path = Path(directory) / SETTINGS_NAME
    path.write_text(json.dumps(postprocessing.to_dict(), indent=2) + "\n")
    return path


def load_detection_settings(directory: str | os.PathLike) -> Postprocessing:
    """The `Postprocessing` postprocess.json in `directory` describes; DETR's without the file."""
    path = Path(directory) / SETTINGS_NAME
    if not path.is_file():
        return Postprocessing()
    try:
        values = json.loads(path.read_text())
        if not isinstance(values, dict):
            raise TypeError(f"expected a JSON object, got {type(values).__name__}")
        return Postprocessing.from_dict(values)
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a vitkit postprocess description: {err}") from err


def is_detector_dir(directory: str | os.PathLike) -> bool:
    """Whether a model directory holds a detector: its dataset.json says task detection, or without one (a
    directory of `save_pretrained`, `vitkit convert`) its config.json names a detector family (DETR)."""
    path = Path(directory) / INFO_NAME
    if not path.is_file():
        return model_task(init=os.fspath(directory)) == DETECTION
    try:
        return json.loads(path.read_text()).get("task") == "detection"
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{path} is not a vitkit dataset description: {err}") from err


def load_detector(
    directory: str | os.PathLike, device: str | None = None
) -> tuple[nn.Module, DetectionInfo, Postprocessing]:
    """(model on `device`, data description, postprocessing) of a detector's model directory.

    The description is its dataset.json, or without one what the model's config holds
    (`vitkit.train.evaluate.model_dir_classes`; category id = class index) with an empty `source`.
    """
    model = from_pretrained(directory).to(resolve_device(device))
    if (Path(directory) / INFO_NAME).is_file():
        info = DetectionInfo.load(directory)
    else:
        classes, mean, std = model_dir_classes(model)
        info = DetectionInfo("", classes, tuple(range(len(classes))), mean, std)
    return model, info, load_detection_settings(directory)


def _outputs(model: nn.Module, images: torch.Tensor, mask: torch.Tensor, precision: str) -> dict[str, torch.Tensor]:
    """The last decoder layer's predictions in float32: pred_logits (B, Q, K + 1), pred_boxes (B, Q, 4)."""
    with autocast(images.device, precision):
        outputs = model(images, mask)
    return {"pred_logits": outputs["pred_logits"].float(), "pred_boxes": outputs["pred_boxes"].float()}


@torch.no_grad()
def evaluate_detector(
    model: nn.Module,
    loader: DataLoader,
    info: DetectionInfo,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
    env: DistEnv | None = None,
    precision: str = "fp32",
) -> DetectionResult:
    """COCO mAP of `model` on the batches of `loader` (`vitkit.detection.collate_detection` batches of a detection
    dataset). Every query is scored (threshold 0), at most 100 per image as COCO counts them. With `env` of
    several processes, each evaluates its shard and the detections are gathered before scoring."""
    model.eval()
    device = next(model.parameters()).device
    evaluator = CocoEvaluator(len(info.classes))
    skipped: list[Unreadable] = []
    for batch in loader:
        skipped += batch.skipped
        if not batch.targets:
            continue
        batch = batch.to(device)
        outputs = _outputs(model, batch.images, batch.pixel_mask, precision)
        sizes = torch.stack([t["orig_size"] for t in batch.targets])  # (B, 2): boxes in pixels of the stored image
        evaluator.update(postprocessing(outputs, sizes, 0.0), batch.targets)
    if env is not None and env.world_size > 1:
        evaluator.gather()
    if len(evaluator) == 0:
        raise ValueError("no readable images to evaluate")
    return DetectionResult(evaluator.compute(), len(evaluator), tuple(skipped))


def evaluate_detector_dir(
    model_dir: str, data: str | None = None, batch_size: int = 64, device: str | None = None, workers: int = 0
) -> tuple[DetectionResult, DetectionInfo]:
    """COCO mAP of the detector in `model_dir` on the validation split of `data` (builtin:digits-detect or a
    COCO-format folder; by default the data it was trained on, which only a directory written by vitkit train
    knows).

    A directory without dataset.json needs `data`; when its config names no classes, the data's classes and
    category ids are taken, in class-index order, as the model's (`vitkit.train.evaluate.missing_info_note` words
    what stood in). Returns the result and the data description used.
    """
    model, info, postprocessing = load_detector(model_dir, device)
    if not info.source and data is None:
        raise ValueError(
            f"{model_dir} has no {INFO_NAME}, so the data it was trained on is unknown: name the data to evaluate "
            "on (vitkit eval --data DIR)"
        )
    side = min(to_2tuple(model.config.img_size))
    _, val, found = load_detection(data or info.source, channels=model.config.in_chans, img_size=side, val_only=True)
    if not info.source and model_info(model).class_names is None:
        if len(found.classes) != len(info.classes):
            raise ValueError(f"{data} has {len(found.classes)} classes, the model has {len(info.classes)}")
        info = replace(info, classes=found.classes, category_ids=found.category_ids)
    if found.classes != info.classes:
        raise ValueError(f"{data} has classes {list(found.classes)}, the model knows {list(info.classes)}")
    sampler = EpochSampler(len(val), shuffle=False, pad=False)
    loader = DataLoader(val, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_detection)
    return evaluate_detector(model, loader, info, postprocessing), info


def detection_input(
    image: Image.Image, short_side: int, channels: int, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """An image as a detector trained at `short_side` takes it: the model's channels, resized (bilinear) so that
    the shorter side is `short_side` and the longer at most MAX_SIZE, normalised -> float32 (C, H', W')."""
    width, height = image.size
    scale = min(short_side / min(width, height), MAX_SIZE / max(width, height))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    resized = image.convert(image_mode(channels))
    if resized.size != size:
        resized = resized.resize(size, Image.Resampling.BILINEAR)
    pixels = torch.from_numpy(np.asarray(resized).copy()).reshape(size[1], size[0], -1).permute(2, 0, 1)  # (C, H', W')
    return normalize(pixels, tuple(mean), tuple(std))


def _run(
    model: nn.Module, info: DetectionInfo, images: Sequence[Image.Image]
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The model's predictions on `images`, padded into one batch, and their sizes (B, 2) as (height, width)."""
    config = model.config
    if config.num_classes != len(info.classes):
        raise ValueError(f"the model has {config.num_classes} classes but {len(info.classes)} class names")
    device = next(model.parameters()).device
    side = min(to_2tuple(config.img_size))
    pixels, mask = pad_images([detection_input(i, side, config.in_chans, info.mean, info.std) for i in images])
    outputs = _outputs(model.eval(), pixels.to(device), mask.to(device), "fp32")
    return outputs, torch.tensor([(i.height, i.width) for i in images])


def _detections(result: dict[str, torch.Tensor], info: DetectionInfo) -> list[Detection]:
    """One image's postprocess result as detections, most probable first."""
    order = result["scores"].argsort(descending=True, stable=True).tolist()
    boxes, scores, labels = result["boxes"].tolist(), result["scores"].tolist(), result["labels"].tolist()
    return [Detection(info.classes[labels[i]], info.category_ids[labels[i]], scores[i], tuple(boxes[i])) for i in order]


@torch.no_grad()
def detect(
    model: nn.Module,
    info: DetectionInfo,
    images: Sequence[Image.Image],
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
) -> list[list[Detection]]:
    """The objects a detector finds in each image: its queries whose class probability is above `threshold`,
    boxes in pixels of the image given, most probable first."""
    if not images:
        return []
    outputs, sizes = _run(model, info, images)
    results = postprocessing(outputs, sizes, threshold)
    return [_detections(result, info) for result in results]


def detect_files(
    model: nn.Module,
    info: DetectionInfo,
    paths: Sequence[str | os.PathLike],
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
) -> list[ImageDetections]:
    """`detect` for image files, one at a time (each at its own size), in the order given. An unreadable file raises
    `vitkit.data.UnreadableImageError`; `detect_paths` skips it instead."""
    found = []
    for path in paths:
        image = open_image(path)
        (detections,) = detect(model, info, [image], threshold, postprocessing)
        found.append(ImageDetections(os.fspath(path), (image.height, image.width), detections))
    return found


@torch.no_grad()
def detect_paths(
    model: nn.Module,
    info: DetectionInfo,
    paths: Sequence[str | os.PathLike],
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
    workers: int = 0,
    progress: bool | None = None,
    on_unreadable: Callable[[Unreadable], None] | None = None,
) -> tuple[list[ImageDetections], list[Unreadable]]:
    """`detect_files` for many image files, decoded by a DataLoader (`workers` processes): files that cannot be
    read are skipped, not raised. Each image still runs alone at its own size, so its detections are those of
    `detect_files`, whatever the other images. Returns (detections of the readable images, unreadable files), both
    in the order given.

    Args:
        progress: a progress bar on stderr (a terminal only); None shows one for more than
            `vitkit.train.evaluate.PROGRESS_MIN_IMAGES` images.
        on_unreadable: called with each unreadable file as it is met (e.g. to warn).
    """
    found: list[ImageDetections] = []
    skipped: list[Unreadable] = []
    with progress_bar(len(paths), progress) as bar:
        for sample in image_loader(paths, None, batch_size=None, workers=workers):
            if isinstance(sample, Unreadable):
                skipped.append(sample)
                if on_unreadable is not None:
                    on_unreadable(sample)
            else:
                image, index = sample
                (detections,) = detect(model, info, [image], threshold, postprocessing)
                found.append(ImageDetections(os.fspath(paths[index]), (image.height, image.width), detections))
            bar.update()
    return found, skipped


@torch.no_grad()
def detection_attention(
    model: nn.Module,
    info: DetectionInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
    layer: int = -1,
    head: int | None = None,
) -> tuple[list[Detection], torch.Tensor]:
    """Each detection of `image` with the decoder cross-attention of its query over the feature map (DETR's
    figure 6): (detections most probable first, maps (n, h, w) in the same order, each summing to one). Each map
    belongs to one query, so each query gives its best class (`postprocessing.top_k` does not apply); duplicates are
    suppressed as `postprocessing.nms_iou` says.

    Args:
        layer: the decoder layer (an index into its cross-attention layers, negative from the end).
        head: one head, or None for the mean over heads.
    """
    names = [name for name, _ in attention_layers(model) if name.endswith("cross_attn")]
    if not names:
        raise ValueError(f"{type(model).__name__} has no cross-attention layers (a DETR detector has)")
    if not -len(names) <= layer < len(names):
        raise ValueError(f"layer {layer} is out of range for a decoder of {len(names)} layers")
    grid: list[tuple[int, int]] = []
    hook = model.backbone.register_forward_hook(lambda module, args, out: grid.append(tuple(out.shape[-2:])))
    try:
        with capture_attention(model, [names[layer]]) as maps:
            outputs, sizes = _run(model, info, [image])
    finally:
        hook.remove()
    attn = maps[names[layer]][0].float()  # (heads, Q, h * w)
    if head is not None and not -attn.shape[0] <= head < attn.shape[0]:
        raise ValueError(f"head {head} is out of range for {attn.shape[0]} heads")
    attn = attn.mean(0) if head is None else attn[head]  # (Q, h * w)
    # each query its best class, so that each detection has its own query's map; NMS as the model's settings say
    one_per_query = replace(postprocessing, top_k=None)
    (result,) = one_per_query(outputs, sizes, threshold)
    order = result["scores"].argsort(descending=True, stable=True)  # as `_detections` orders them
    queries = result["queries"][order].tolist()
    detections = _detections(result, info)
    h, w = grid[-1]
    heat = attn[queries].reshape(len(queries), h, w) if queries else attn.new_zeros(0, h, w)  # (n, h, w)
    return detections, heat


def write_detections(
    found: Sequence[ImageDetections], out: str | os.PathLike, classes: Sequence[str] | None = None
) -> tuple[list[Path], Path]:
    """Draw each image's detections (`vitkit.viz.draw_detections`) to OUT/<image name>.png and write them all to
    OUT/detections.json (a list of `ImageDetections.to_dict`, each with its "picture"); returns (pictures, json).

    Images of the same name from different folders get a numbered suffix (name_1.png, ...)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pictures: list[Path] = []
    rows = []
    for item in found:
        stem, k = Path(item.image).stem, 0
        while (picture := out / (f"{stem}_{k}.png" if k else f"{stem}.png")) in pictures:
            k += 1
        detections = item.detections
        drawn = draw_detections(
            open_image(item.image),
            [d.box for d in detections],
            [d.label for d in detections],
            [d.score for d in detections],
            classes,
        )
        drawn.save(picture)
        pictures.append(picture)
        rows.append({**item.to_dict(), "picture": str(picture)})
    path = out / "detections.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return pictures, path


def detection_attention_figure(
    model: nn.Module,
    info: DetectionInfo,
    image: Image.Image,
    threshold: float = 0.5,
    postprocessing: Postprocessing = DETR_POSTPROCESSING,
    layer: int = -1,
    head: int | None = None,
    alpha: float = 0.6,
    name: str | None = None,
) -> tuple[Figure, list[Detection]]:
    """DETR's figure 6 for `image`: the detections, then each beside its query's cross-attention over the image
    (`detection_attention`, `vitkit.viz.object_attention_figure`: one colour bar, a title naming the model, the
    layer and the heads); `name` is the model in the title (default: its family). Returns (figure, detections)."""
    detections, heats = detection_attention(model, info, image, threshold, postprocessing, layer, head)
    cross = [m for n, m in attention_layers(model) if n.endswith("cross_attn")]
    L, h = len(cross), cross[0].num_heads
    which = f"mean of {h} heads" if head is None else f"head {head % h} of {h}"
    described = f"{family_of(model).name}, {L} decoder layers x {h} heads"
    above = f"{len(detections)} object{'' if len(detections) == 1 else 's'} above {threshold:.2f}"
    figure = object_attention_figure(
        image,
        [d.box for d in detections],
        [d.label for d in detections],
        [d.score for d in detections],
        heats,
        info.classes,
        alpha,
        model=f"{name}: {described}" if name else described,
        what=f"decoder layer {layer % L} (of 0..{L - 1}) cross-attention of each object's query, {which}  ·  {above}",
    )
    return figure, detections
