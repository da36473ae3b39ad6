"""Into and out of a detector: batches of images of different sizes, and DETR's outputs as boxes in pixels.

`pad_images` batches images the way DETR does (its `NestedTensor`): each zero-padded at the bottom and right to
the largest height and width, with a mask of the real pixels. `postprocess` is DETR's `PostProcess`: class
probabilities by softmax (or by sigmoid for a model trained with the focal loss), the best real class of each
query (the last class, "no object", dropped), boxes from (cx, cy, w, h) relative to the unpadded image to
(x0, y0, x1, y1) pixels.

Letters: B images, C channels, Q queries, K classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torchvision.ops import box_convert


def pad_images(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch images of different sizes: (images (B, C, Hmax, Wmax), pixel_mask (B, Hmax, Wmax)).

    Each image (C, H_i, W_i) sits at the top left, zero-padded; the mask is True on its H_i x W_i real pixels, as
    DETR's `model(images, pixel_mask)` takes it.
    """
    if len(images) == 0:
        raise ValueError("pad_images needs at least one image")
    first = images[0]
    for i, image in enumerate(images):
        if not isinstance(image, torch.Tensor) or image.ndim != 3:
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(f"pad_images takes images (C, H, W); image {i} is {shape}")
        if image.shape[0] != first.shape[0] or image.dtype != first.dtype or image.device != first.device:
            raise ValueError(
                f"image {i} is ({image.shape[0]} channels, {image.dtype}, {image.device}), image 0 "
                f"({first.shape[0]} channels, {first.dtype}, {first.device}): a batch needs them alike"
            )
        if image.shape[1] == 0 or image.shape[2] == 0:
            raise ValueError(f"image {i} has no pixels: shape {tuple(image.shape)}")
    H = max(image.shape[1] for image in images)
    W = max(image.shape[2] for image in images)
    batch = first.new_zeros(len(images), first.shape[0], H, W)  # (B, C, Hmax, Wmax)
    mask = torch.zeros(len(images), H, W, dtype=torch.bool, device=first.device)  # (B, Hmax, Wmax)
    for i, image in enumerate(images):
        _, h, w = image.shape
        batch[i, :, :h, :w] = image
        mask[i, :h, :w] = True
    return batch, mask


def postprocess(
    outputs: Mapping[str, torch.Tensor],
    image_sizes: torch.Tensor | Sequence[tuple[int, int]],
    threshold: float = 0.5,
    classification: str = "ce",
) -> list[dict[str, torch.Tensor]]:
    """DETR's predictions as detections in pixels, one dict per image.

    Args:
        outputs: a DETR model's output: `pred_logits` (B, Q, K + 1) and `pred_boxes` (B, Q, 4) (cx, cy, w, h) in
            [0, 1] of each unpadded image; other entries (`aux_outputs`) are ignored.
        image_sizes: each image's (height, width) in pixels before padding (B pairs, or a (B, 2) tensor); boxes
            are scaled to it (to the original image's size when the model saw a resized one).
        threshold: keep the queries whose best real-class probability is above it (0 keeps every query).
        classification: how the model was trained to score classes: "ce", softmax over the K + 1 logits (DETR), or
            "focal", a sigmoid of each of the K real-class logits (Deformable DETR's focal loss; the "no object"
            logit is unused); either way each query yields its best real class.

    Returns:
        per image, in query order: `boxes` (n, 4) as (x0, y0, x1, y1) pixels, `scores` (n,) the probability of
        `labels` (n,), each query's most probable class in [0, K).
    """
    for key in ("pred_logits", "pred_boxes"):
        if key not in outputs:
            raise ValueError(
                f"postprocess takes a DETR output dict with 'pred_logits' and 'pred_boxes'; {key!r} is missing"
            )
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    if logits.ndim != 3 or boxes.shape != (*logits.shape[:2], 4):
        raise ValueError(
            f"expected pred_logits (B, Q, K + 1) and pred_boxes (B, Q, 4), got {tuple(logits.shape)} and "
            f"{tuple(boxes.shape)}"
        )
    sizes = torch.as_tensor(image_sizes, dtype=boxes.dtype, device=boxes.device)
    if sizes.shape != (logits.shape[0], 2):
        raise ValueError(
            f"image_sizes must hold one (height, width) per image: ({logits.shape[0]}, 2), got {tuple(sizes.shape)}"
        )
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    if classification == "ce":
        probs = logits.softmax(-1)[..., :-1]  # (B, Q, K): the classes that are objects
    elif classification == "focal":
        probs = logits[..., :-1].sigmoid()  # (B, Q, K)
    else:
        raise ValueError(f"classification must be 'ce' or 'focal', got {classification!r}")
    scores, labels = probs.max(-1)  # (B, Q): each query's best class
    height, width = sizes.unbind(1)  # (B,) each
    scale = torch.stack([width, height, width, height], dim=1)  # (B, 4)
    corners = box_convert(boxes, "cxcywh", "xyxy") * scale[:, None, :]  # (B, Q, 4) in pixels
    results = []
    for score, label, box in zip(scores, labels, corners, strict=True):
        keep = score > threshold
        results.append({"boxes": box[keep], "scores": score[keep], "labels": label[keep]})
    return results
