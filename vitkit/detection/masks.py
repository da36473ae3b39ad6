"""Mask losses and matching costs on sampled points, as Mask2Former and Mask DINO compute them: a predicted mask
(logits at a quarter of the padded image) and a ground-truth mask (pixels of its image) are compared at K points
of the padded image, read from both by bilinear sampling, so memory grows with K, not with the image.

- `canvas_masks`: each image's masks (n, h, w) placed on the batch's canvas (the padded image, top-left), zero in
  the padding.
- `point_sample`: maps (N, h, w) read at points (N, K, 2) in [0, 1] of their extent (x, y): (N, K).
- Matching (`mask_costs`): K points drawn uniformly, the same for every query and object of an image; the pairwise
  sigmoid focal cost (the mean over the points of the focal loss of a query's logits towards an object's mask) and
  dice cost (1 - dice).
- Loss (`mask_losses`): for each matched pair, K points, most of them where the prediction is least certain
  (Mask2Former's importance sampling: `uncertain_points`); the sigmoid focal loss (mean over the points) and the
  dice loss, each summed over the pairs and divided by the number of boxes.
- A mask of at most `MASK_POINTS` logits (a small image's: 32x40 at 128x160) is compared at every logit instead,
  the ground truth read at the logits' centres (`at_logits`, the bilinear reading `point_sample` gives there): the
  means the points estimate, exact, without drawing or sampling the logits (on the shapes folder the sampling and
  its backward took a tenth of a training step).
- Reading (`detection_masks`, `encode_masks`): a detection's mask, its query's logits resampled to the image and
  above 0, and as pycocotools' compressed RLE (what evaluation scores and predict writes).

Letters: B images, Q queries, n objects of an image, M matched pairs, K points, h, w a map's size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pycocotools import mask as mask_utils
from torch import Tensor

from vitkit.models.query_masks import MASK_STRIDE

MASK_POINTS = 112 * 112  # points a mask is compared at (Mask2Former's 12,544)
OVERSAMPLE = 3  # the loss draws OVERSAMPLE * K candidate points ...
IMPORTANCE = 0.75  # ... and keeps the IMPORTANCE * K least certain of them, the rest drawn uniformly
# the losses' weights in the total and the matching costs': 1 and 1, as the DETR paper's segmentation training. Mask
# DINO's 5 and 5 let the masks' terms outweigh the boxes' in a small detector trained from scratch: on the shapes
# folder, box AP 0.22 against 0.52 without masks at 10 minutes; 1 and 1 keep the boxes (BENCHMARKS.md)
MASK_WEIGHTS = {"loss_mask": 1.0, "loss_dice": 1.0}
MASK_COSTS = {"mask": 1.0, "dice": 1.0}
FOCAL_ALPHA, FOCAL_GAMMA = 0.25, 2.0
MASK_CHUNK = 16  # detections whose masks are resampled to the image at once (memory: 16 x H x W floats)


def detection_masks(
    logits: Tensor, queries: Tensor, size: tuple[int, int], out_size: tuple[int, int] | None = None
) -> Tensor:
    """The masks of an image's detections: the mask logits `logits` (Q, h, w) of the padded image (a quarter of
    its size) of each detection's query `queries` (n,), resampled bilinearly to the padded image and cut to the
    image's `size` (H, W) there, then (with `out_size`) resampled to the image as stored; inside where the logit is
    above 0 (probability above 0.5): (n, *(out_size or size)) bool."""
    h, w = logits.shape[-2:]
    out = torch.zeros(len(queries), *(out_size or size), dtype=torch.bool, device=logits.device)
    for start in range(0, len(queries), MASK_CHUNK):
        chosen = logits[queries[start : start + MASK_CHUNK]].float()[:, None]  # (c, 1, h, w)
        full = F.interpolate(chosen, size=(h * MASK_STRIDE, w * MASK_STRIDE), mode="bilinear", align_corners=False)
        full = full[:, :, : size[0], : size[1]]
        if out_size is not None and tuple(out_size) != tuple(size):
            full = F.interpolate(full, size=out_size, mode="bilinear", align_corners=False)
        out[start : start + MASK_CHUNK] = full[:, 0] > 0
    return out


def encode_masks(masks: Tensor) -> list[dict]:
    """Masks (n, H, W) bool as pycocotools' compressed RLE, one dict each (`counts` bytes)."""
    if len(masks) == 0:
        return []
    array = np.asfortranarray(masks.permute(1, 2, 0).cpu().numpy().astype(np.uint8))  # (H, W, n)
    return mask_utils.encode(array)


def every_logit(pred: Tensor) -> bool:
    """Whether masks of logits `pred` (..., h, w) are compared at every logit: when they have at most
    MASK_POINTS (a small image's masks hold less to compare than Mask2Former's points)."""
    return pred.shape[-2] * pred.shape[-1] <= MASK_POINTS


def at_logits(target: Tensor, size: tuple[int, int]) -> Tensor:
    """Masks `target` (n, H, W) read at the centres of a grid of `size` (h, w) logits over the same extent, as
    `point_sample` reads them at those points (bilinear): (n, h * w)."""
    return F.interpolate(target[:, None].float(), size=size, mode="bilinear", align_corners=False).flatten(1)


def canvas_masks(targets: Sequence[Mapping[str, Tensor]], size: tuple[int, int]) -> list[Tensor]:
    """Each image's `masks` (n, h, w) on a canvas of `size` (H, W) at its top-left, as `pad_images` lays the
    images out: (n, H, W) float, zero outside the image."""
    placed = []
    for target in targets:
        masks = target["masks"]
        n, h, w = masks.shape
        canvas = masks.new_zeros((n, *size), dtype=torch.float32)
        canvas[:, : min(h, size[0]), : min(w, size[1])] = masks[:, : size[0], : size[1]]
        placed.append(canvas)
    return placed


def point_sample(maps: Tensor, points: Tensor) -> Tensor:
    """Maps (N, h, w) read at points (N, K, 2), (x, y) in [0, 1] of the maps' extent, by bilinear interpolation
    (grid_sample, pixel centres at (i + 0.5) / h): (N, K)."""
    grid = points[:, None] * 2 - 1  # (N, 1, K, 2) in [-1, 1]
    return F.grid_sample(maps[:, None].float(), grid.to(torch.float32), align_corners=False)[:, 0, 0]


def uncertain_points(logits: Tensor, count: int) -> Tensor:
    """Mask2Former's importance sampling for the loss of masks `logits` (M, h, w): OVERSAMPLE * `count` random
    points, the IMPORTANCE * `count` whose logit is nearest 0 (least certain) kept, the rest drawn uniformly:
    (M, count, 2)."""
    M = logits.shape[0]
    candidates = torch.rand(M, OVERSAMPLE * count, 2, device=logits.device)
    with torch.no_grad():
        uncertainty = -point_sample(logits, candidates).abs()  # (M, 3K)
    kept = int(IMPORTANCE * count)
    top = uncertainty.topk(kept, dim=1).indices  # (M, kept)
    chosen = candidates.gather(1, top[..., None].expand(-1, -1, 2))
    return torch.cat([chosen, torch.rand(M, count - kept, 2, device=logits.device)], dim=1)


def _focal(logits: Tensor, targets: Tensor) -> Tensor:
    """The sigmoid focal loss of each logit towards its target (same shapes), not reduced."""
    p = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha = FOCAL_ALPHA * targets + (1 - FOCAL_ALPHA) * (1 - targets)
    return alpha * ce * (1 - p_t) ** FOCAL_GAMMA


def mask_costs(pred: Tensor, target: Tensor, count: int | None = None) -> tuple[Tensor, Tensor]:
    """(focal cost, dice cost), each (Q, n), of an image's predicted masks `pred` (Q, h, w) (logits) against its
    objects' masks `target` (n, H, W) (on the canvas), at `count` uniform points shared by all (None: at every
    logit of a mask that has at most MASK_POINTS, else MASK_POINTS points)."""
    if count is None and every_logit(pred):
        logits, wanted = pred.flatten(1), at_logits(target, pred.shape[-2:])  # (Q, K), (n, K): K = h * w
    else:
        points = torch.rand(1, count or MASK_POINTS, 2, device=pred.device)
        logits = point_sample(pred, points.expand(len(pred), -1, -1))  # (Q, K)
        wanted = point_sample(target, points.expand(len(target), -1, -1))  # (n, K)
    count = logits.shape[1]
    p = logits.sigmoid()
    # the focal loss of each query's logits towards each object's mask, mean over the points: its positive and
    # negative terms weighted by the target at each point, as two products
    positive = FOCAL_ALPHA * (1 - p) ** FOCAL_GAMMA * F.softplus(-logits)  # softplus(-x) = -log p
    negative = (1 - FOCAL_ALPHA) * p**FOCAL_GAMMA * F.softplus(logits)  # softplus(x) = -log(1 - p)
    focal = (positive @ wanted.T + negative @ (1 - wanted).T) / count  # (Q, n)
    dice = 1 - (2 * p @ wanted.T + 1) / (p.sum(-1)[:, None] + wanted.sum(-1)[None, :] + 1)  # (Q, n)
    return focal, dice


def mask_pair_losses(
    pred: Tensor, target: Tensor, count: int | None = None, rows: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(focal loss, dice loss), each (M,), of matched predicted masks `pred` (M, h, w) (logits) against their
    objects' masks `target` (M, H, W) (on the canvas), at `count` points each (`uncertain_points`; None: at every
    logit of a mask that has at most MASK_POINTS, else MASK_POINTS points): the focal loss the mean over a pair's
    points, neither summed nor divided. With `rows` (M,), `target` holds the objects' masks (T, H, W) and pair m is
    compared with object rows[m]: each object is read at the logits once, however many pairs it is in."""
    if count is None and every_logit(pred):
        wanted = at_logits(target, pred.shape[-2:])  # (T | M, h * w)
        logits, wanted = pred.flatten(1), wanted if rows is None else wanted[rows]  # (M, h * w)
    else:
        target = target if rows is None else target[rows]  # (M, H, W)
        points = uncertain_points(pred.detach(), count or MASK_POINTS)  # (M, K, 2)
        logits = point_sample(pred, points)  # (M, K)
        with torch.no_grad():
            wanted = point_sample(target, points)  # (M, K)
    focal = _focal(logits, wanted).mean(1)
    p = logits.sigmoid()
    dice = 1 - (2 * (p * wanted).sum(-1) + 1) / (p.sum(-1) + wanted.sum(-1) + 1)  # (M,)
    return focal, dice


def mask_losses(pred: Tensor, target: Tensor, num_boxes: float, count: int | None = None) -> tuple[Tensor, Tensor]:
    """(focal loss, dice loss) of matched predicted masks `pred` (M, h, w) (logits) against their objects' masks
    `target` (M, H, W) (`mask_pair_losses`), each summed over the pairs and divided by `num_boxes`."""
    if len(pred) == 0:
        zero = pred.sum() * 0
        return zero, zero
    focal, dice = mask_pair_losses(pred, target, count)
    return focal.sum() / num_boxes, dice.sum() / num_boxes
