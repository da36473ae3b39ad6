"""Denoising queries: noised copies of the ground truth that teach a DETR's decoder to fix a box (DN-DETR, DINO).

A DETR learns slowly because the Hungarian matching moves each query's target from step to step. DN-DETR (Li et
al., arXiv:2203.01305) adds queries whose answer is known: each ground-truth box, jittered, with its label
sometimes flipped, is fed to the decoder beside the object queries and taught to give back the true box and class,
without matching. DINO (Zhang et al., arXiv:2203.03605) makes it contrastive: each box also gets a negative copy,
moved further, taught "no object", so that the decoder learns to reject a query near but not on an object.

`make_denoising` builds a batch's queries as DINO's `prepare_for_cdn` does: G groups of 2 n slots per image (n the
most boxes of an image in the batch), the n positive copies then the n negatives; an image with fewer boxes pads
its group with slots of label -1. Noise, for a box of width w and height h:

- labels: with probability label_noise / 2 a copy's label is a class drawn uniformly (DINO's ratio);
- boxes: each corner moves by u * (w / 2, h / 2) * box_noise with a random sign, u ~ U[0, 1) for a positive and
  U[1, 2) for a negative; the result is clipped to the image.

The model keeps the object queries from seeing the denoising queries, and each group from seeing the others
(`vitkit.models.interface.DenoisingQueries.attention_allowed`). `SetCriterion` scores the denoising outputs against
the boxes they were made from: positives towards their box and class, negatives and padding towards "no object".

Letters: B images, n the most boxes of an image, G groups, P = G * 2 n slots, K classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torchvision.ops import box_convert

from vitkit.models.interface import DenoisingQueries, DenoisingSettings


def denoising_groups(settings: DenoisingSettings, most_boxes: int) -> int:
    """G: how many groups of 2 n slots fit in `settings.queries` for n = `most_boxes`, at least one."""
    return max(1, settings.queries // max(2 * most_boxes, 1))


def make_denoising(
    targets: Sequence[Mapping[str, torch.Tensor]],
    settings: DenoisingSettings,
    num_classes: int,
    generator: torch.Generator | None = None,
) -> tuple[DenoisingQueries, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A batch's denoising queries, and which slot answers which box.

    Args:
        targets: per image, `labels` (n_i,) in [0, K) and `boxes` (n_i, 4) (cx, cy, w, h) in [0, 1].
        settings: the detector's `DenoisingSettings`.
        num_classes: K, the classes a flipped label is drawn from.
        generator: the random source (None: torch's global one, which training seeds and checkpoints).

    Returns:
        (the `DenoisingQueries`, per image (slot indices, box indices)): the positive slots, G per box, and the box
        each gives back (int64 CPU tensors, as the matcher returns). A batch without boxes gets padding slots only
        (n taken as 1), so that every step trains the same parameters (as DistributedDataParallel needs).
    """
    sizes = [len(t["labels"]) for t in targets]
    n = max(max(sizes, default=0), 1)
    device = targets[0]["boxes"].device if targets else torch.device("cpu")
    B, G = len(targets), denoising_groups(settings, n)
    P = G * 2 * n
    labels = torch.full((B, P), -1, dtype=torch.int64, device=device)
    boxes = torch.full((B, P, 4), 0.5, dtype=torch.float32, device=device)  # padding slots: a centred box
    matched = []
    for i, target in enumerate(targets):
        k = sizes[i]
        if k == 0:
            matched.append((torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)))
            continue
        box = target["boxes"].to(device, torch.float32)  # (k, 4)
        slots = (torch.arange(G, device=device)[:, None] * 2 * n + torch.arange(k, device=device)).flatten()  # (G k,)
        copies = box.repeat(G, 1)  # (G k, 4), group by group
        labels[i, slots] = _noised_labels(target["labels"].to(device).repeat(G), settings, num_classes, generator)
        labels[i, slots + n] = _noised_labels(target["labels"].to(device).repeat(G), settings, num_classes, generator)
        boxes[i, slots] = _noised_boxes(copies, settings.box_noise, False, generator)
        boxes[i, slots + n] = _noised_boxes(copies, settings.box_noise, True, generator)
        matched.append((slots.cpu(), torch.arange(k).repeat(G)))
    return DenoisingQueries(labels, boxes, G), matched


def _uniform(shape: Sequence[int], like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """U[0, 1) of `shape` on `like`'s device: drawn on the generator's device (the CPU for the global one)."""
    return torch.rand(tuple(shape), generator=generator).to(like.device)


def _noised_labels(
    labels: torch.Tensor, settings: DenoisingSettings, num_classes: int, generator: torch.Generator | None
) -> torch.Tensor:
    """`labels` (m,) with each replaced, with probability label_noise / 2, by a class drawn uniformly."""
    flip = _uniform(labels.shape, labels, generator) < settings.label_noise * 0.5  # (m,)
    drawn = (_uniform(labels.shape, labels, generator) * num_classes).long().clamp(max=num_classes - 1)  # (m,)
    return torch.where(flip, drawn, labels)


def _noised_boxes(boxes: torch.Tensor, scale: float, negative: bool, generator: torch.Generator | None) -> torch.Tensor:
    """(m, 4) (cx, cy, w, h) boxes with each corner moved by u * half the box's side * `scale` in a random direction,
    u in [0, 1) (positive) or [1, 2) (`negative`), clipped to [0, 1]; (cx, cy, w, h) again."""
    if scale <= 0:
        return boxes.clone()
    corners = box_convert(boxes, "cxcywh", "xyxy")  # (m, 4)
    half = boxes[:, 2:].repeat(1, 2) / 2  # (m, 4): (w/2, h/2, w/2, h/2)
    sign = _uniform(boxes.shape, boxes, generator).round() * 2 - 1  # (m, 4) in {-1, 1}
    amount = _uniform(boxes.shape, boxes, generator) + float(negative)  # (m, 4)
    moved = (corners + sign * amount * half * scale).clamp(0.0, 1.0)
    x0, y0 = torch.minimum(moved[:, 0], moved[:, 2]), torch.minimum(moved[:, 1], moved[:, 3])
    x1, y1 = torch.maximum(moved[:, 0], moved[:, 2]), torch.maximum(moved[:, 1], moved[:, 3])
    return box_convert(torch.stack([x0, y0, x1, y1], -1), "xyxy", "cxcywh")
