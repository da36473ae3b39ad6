"""The objects a trained detector finds in images: each image at its own size, resized as the detector was trained,
its outputs read as the model's saved settings say (`vitkit.infer.model_dir`). `info` is the model's classes, category
ids and normalisation (`vitkit.infer.inference_info`).

Letters: B images, C channels, H, W image size (padded), Q object queries, K classes, n detections of one image.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.ops import clip_boxes_to_image

from vitkit.data import Unreadable, image_mode, normalize, open_image
from vitkit.data.coco import rle_json, rle_mask
from vitkit.detection import Postprocessing, pad_images
from vitkit.detection.masks import detection_masks, encode_masks
from vitkit.infer.files import image_loader, progress_bar
from vitkit.infer.runtime import autocast
from vitkit.layers import to_2tuple
from vitkit.models.interface import VitkitDetector, has_no_object_logit
from vitkit.weights import ModelInfo

MAX_SIZE = 1333  # the longer side of a detector's input is at most this (DETR's resize, as CocoDetection's)


def reading(model: VitkitDetector, postprocessing: Postprocessing | None) -> Postprocessing:
    """`postprocessing`, or with None how `model`'s outputs are read by default (`Postprocessing.default` for its
    class logits: DETR's softmax with "no object", or Deformable DETR's sigmoid and top 100 pairs). ValueError when
    `postprocessing` expects the other layout of class logits than the model declares (`no_object_logit`): read
    with it, the last real class would be dropped, or "no object" read as a class."""
    declared = has_no_object_logit(model)
    if postprocessing is None:
        return Postprocessing.default(declared)
    if postprocessing.no_object_logit != declared:
        raise ValueError(
            f"the postprocessing reads class logits {'with' if postprocessing.no_object_logit else 'without'} a "
            f"'no object' logit, but {type(model).__name__} predicts them {'with' if declared else 'without'} one: "
            f"read them with no_object_logit={declared}"
        )
    return postprocessing


@dataclass(frozen=True)
class Detection:
    label: str  # class name
    category_id: int  # the dataset's category id of the class
    score: float  # the class probability
    box: tuple[float, float, float, float]  # (x0, y0, x1, y1) in pixels of the image
    mask: dict | None = None  # a detector that predicts masks: the object's, COCO's compressed RLE of the image
    # ({"size": [height, width], "counts": str}); None otherwise

    def to_dict(self) -> dict[str, Any]:
        found = {"class": self.label, "category_id": self.category_id, "score": self.score, "box": list(self.box)}
        return found | ({"mask": self.mask} if self.mask is not None else {})

    def mask_array(self) -> np.ndarray | None:
        """The mask as (height, width) bool, None without one."""
        return None if self.mask is None else rle_mask(self.mask)


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


def detector_outputs(
    model: VitkitDetector, images: torch.Tensor, pixel_mask: torch.Tensor, precision: str = "fp32"
) -> dict[str, torch.Tensor]:
    """The last decoder layer's predictions (`predict`) under `precision`, in float32: pred_logits (B, Q, K + 1),
    pred_boxes (B, Q, 4), and pred_masks (B, Q, H / 4, W / 4) where the model predicts masks."""
    with autocast(images.device, precision):
        outputs = model.predict(images, pixel_mask)
    return {k: outputs[k].float() for k in ("pred_logits", "pred_boxes", "pred_masks") if k in outputs}


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


def detector_inputs(
    model: VitkitDetector, info: ModelInfo, images: Sequence[Image.Image]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`images` as the detector takes them, padded into one batch on its device: (pixels (B, C, H, W), pixel_mask
    (B, H, W), the images' own sizes (B, 2) as (height, width))."""
    config = model.config
    if config.num_classes != len(info.classes):
        raise ValueError(f"the model has {config.num_classes} classes but {len(info.classes)} class names")
    device = next(model.parameters()).device
    side = min(to_2tuple(config.img_size))
    pixels, mask = pad_images([detection_input(i, side, config.in_chans, info.mean, info.std) for i in images])
    return pixels.to(device), mask.to(device), torch.tensor([(i.height, i.width) for i in images])


def image_detections(result: dict[str, Any], info: ModelInfo) -> list[Detection]:
    """One image's postprocess result as detections, most probable first (with its `masks`, RLE, when given)."""
    order = result["scores"].argsort(descending=True, stable=True).tolist()
    boxes, scores, labels = result["boxes"].tolist(), result["scores"].tolist(), result["labels"].tolist()
    masks = [rle_json(rle) for rle in result["masks"]] if "masks" in result else [None] * len(order)
    return [
        Detection(info.classes[labels[i]], info.category_ids[labels[i]], scores[i], tuple(boxes[i]), masks[i])
        for i in order
    ]


@torch.no_grad()
def detect(
    model: VitkitDetector,
    info: ModelInfo,
    images: Sequence[Image.Image],
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
    precision: str = "fp32",
) -> list[list[Detection]]:
    """The objects a detector finds in each image: its queries whose class probability is above `threshold`,
    boxes in pixels of the image given, clipped to it (a DETR box may reach past the border; evaluation scores them
    unclipped, as DETR's), most probable first; its outputs read as `postprocessing` says (None: the model's
    default, `reading`); the forward under `precision` ("bf16": bfloat16 autocast)."""
    read = reading(model, postprocessing)  # before any work: a reading for the other class logits is refused
    if not images:
        return []
    pixels, mask, sizes = detector_inputs(model, info, images)
    outputs = detector_outputs(model.eval(), pixels, mask, precision)
    results = read(outputs, sizes, threshold)
    for b, (result, (height, width)) in enumerate(zip(results, sizes.tolist(), strict=True)):
        result["boxes"] = clip_boxes_to_image(result["boxes"], (height, width))
        if "pred_masks" in outputs:
            add_masks(result, outputs["pred_masks"][b], mask[b], (height, width))
    return [image_detections(result, info) for result in results]


def add_masks(result: dict[str, Any], logits: torch.Tensor, pixel_mask: torch.Tensor, size: tuple[int, int]) -> None:
    """Put in a postprocess `result` of one image each detection's mask, its query's mask logits `logits` (Q, h, w)
    read in pixels of the image as given (`size`), as RLE under "masks"; `pixel_mask` (H, W), True on the resized
    image's pixels within the padded input."""
    seen = (int(pixel_mask[:, 0].sum()), int(pixel_mask[0, :].sum()))  # real rows of column 0, columns of row 0
    result["masks"] = encode_masks(detection_masks(logits, result["queries"], seen, size))


def detect_files(
    model: VitkitDetector,
    info: ModelInfo,
    paths: Sequence[str | os.PathLike],
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
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
    model: VitkitDetector,
    info: ModelInfo,
    paths: Sequence[str | os.PathLike],
    threshold: float = 0.5,
    postprocessing: Postprocessing | None = None,
    workers: int = 0,
    progress: bool | None = None,
    on_unreadable: Callable[[Unreadable], None] | None = None,
    tile: int | None = None,
    overlap: float | None = None,
    precision: str = "fp32",
) -> tuple[list[ImageDetections], list[Unreadable]]:
    """`detect_files` for many image files, decoded by a DataLoader (`workers` processes): files that cannot be
    read are skipped, not raised. Each image still runs alone at its own size, so its detections are those of
    `detect_files`, whatever the other images. Returns (detections of the readable images, unreadable files), both
    in the order given.

    Args:
        progress: a progress bar on stderr (a terminal only); None shows one for more than
            `vitkit.infer.files.PROGRESS_MIN_IMAGES` images, or, in tiles, always.
        on_unreadable: called with each unreadable file as it is met (e.g. to warn).
        tile, overlap: an image larger than `tile` on a side is detected in tiles of that side sharing `overlap`
            of it (`vitkit.infer.tiles.detect_tiled`); None: whole images.
        precision: the forward's ("bf16": bfloat16 autocast).
    """
    from vitkit.infer.tiles import DEFAULT_OVERLAP, detect_tiled, tile_grid  # tiles build on this module

    overlap = DEFAULT_OVERLAP if overlap is None else overlap
    found: list[ImageDetections] = []
    skipped: list[Unreadable] = []
    show = True if tile is not None and progress is None else progress
    with progress_bar(len(paths), show, unit="image" if tile is None else "tile") as bar:
        for sample in image_loader(paths, None, batch_size=None, workers=workers):
            if isinstance(sample, Unreadable):
                skipped.append(sample)
                if on_unreadable is not None:
                    on_unreadable(sample)
                bar.update()
                continue
            image, index = sample
            if tile is not None and max(image.width / tile, image.height / tile) > 1:
                bar.total += len(tile_grid(image.height, image.width, tile, overlap)) - 1  # this image's tiles
                bar.refresh()
                detections = detect_tiled(
                    model, info, image, tile, overlap, threshold, postprocessing, precision=precision, bar=bar
                )
            else:
                (detections,) = detect(model, info, [image], threshold, postprocessing, precision)
                bar.update()
            found.append(ImageDetections(os.fspath(paths[index]), (image.height, image.width), detections))
    return found, skipped
