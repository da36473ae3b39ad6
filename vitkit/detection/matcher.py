"""Hungarian matching: which query predicts which ground-truth box (DETR's `HungarianMatcher`).

DETR predicts a set of Q boxes and is trained on a one-to-one assignment of queries to the n <= Q ground-truth
boxes of each image, the assignment of least total cost; unmatched queries are taught "no object". The cost of
query q for box t is

    cost_class * class_cost(q, t) + cost_bbox * |b_q - b_t|_1 - cost_giou * GIoU(b_q, b_t)

with boxes as (cx, cy, w, h) in [0, 1]. `class_cost` is -p_q(class_t) with softmax probabilities (DETR), or with
`classification="focal"` the focal loss of a positive minus that of a negative at the target class on sigmoid
probabilities (Deformable DETR, arXiv:2010.04159, whose model has K logits, no "no object" one). The costs of the
whole batch are one (B * Q, T) matrix, T the number of boxes of all images together; each image's (Q, n_i) block goes
to `scipy.optimize.linear_sum_assignment` on the CPU.

Letters: B images, Q queries, K classes, T ground-truth boxes of the whole batch, n_i those of image i.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou

from vitkit.detection.losses import DETECTION_LOSSES, check_no_object_logit
from vitkit.detection.masks import MASK_COSTS, canvas_masks, mask_costs
from vitkit.models.query_masks import MASK_STRIDE

FOCAL_EPS = 1e-8  # keeps the focal cost's logarithms finite at probabilities 0 and 1


def uses_masks(outputs: Mapping[str, Any], targets: Sequence[Mapping[str, torch.Tensor]]) -> bool:
    """Whether masks are matched and supervised: the outputs hold `pred_masks` and every target `masks`."""
    return "pred_masks" in outputs and all("masks" in t for t in targets)


def canvas_size(pred_masks: torch.Tensor) -> tuple[int, int]:
    """The (H, W) of the padded image whose mask logits `pred_masks` (..., h, w) are: MASK_STRIDE times theirs."""
    return pred_masks.shape[-2] * MASK_STRIDE, pred_masks.shape[-1] * MASK_STRIDE


def check_targets(targets: Sequence[Mapping[str, torch.Tensor]], batch: int, num_classes: int) -> None:
    """ValueError unless `targets` holds one {"labels": (n,) int, "boxes": (n, 4)} per image, labels in [0, K)."""
    if len(targets) != batch:
        raise ValueError(f"expected one target per image: {batch} images, {len(targets)} targets")
    for i, target in enumerate(targets):
        if "labels" not in target or "boxes" not in target:
            raise ValueError(f"target {i} needs 'labels' and 'boxes', it has {sorted(target)}")
        labels, boxes = target["labels"], target["boxes"]
        if labels.ndim != 1 or boxes.shape != (len(labels), 4):
            raise ValueError(
                f"target {i}: expected labels (n,) and boxes (n, 4), got {tuple(labels.shape)} and {tuple(boxes.shape)}"
            )
        if labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ValueError(f"target {i}: labels must be integer class indices, got {labels.dtype}")
    # the range of the labels: one comparison over the batch, one wait for the device (not two an image)
    labels = torch.cat([t["labels"] for t in targets]) if targets else torch.empty(0)
    if len(labels) and bool(((labels < 0) | (labels >= num_classes)).any()):
        for i, target in enumerate(targets):
            own = target["labels"]
            low, high = (own.min().item(), own.max().item()) if len(own) else (0, 0)
            if low < 0 or high >= num_classes:
                raise ValueError(f"target {i}: labels must be in [0, {num_classes}), got {low}..{high}")


class HungarianMatcher(nn.Module):
    """One-to-one assignment of queries to ground-truth boxes, per image, at least total cost.

    Args:
        cost_class: weight of the classification cost (DETR: 1; Deformable DETR with focal costs: 2).
        cost_bbox: weight of the L1 distance between (cx, cy, w, h) boxes (DETR: 5).
        cost_giou: weight of the negative generalised IoU (DETR: 2).
        classification: "ce" for softmax probabilities over K + 1 classes, the last "no object" (DETR), or
            "focal" for sigmoid probabilities of the K real classes, the first K logits (Deformable DETR).
        focal_alpha, focal_gamma: the focal cost's alpha and gamma (Deformable DETR: 0.25 and 2).
        no_object_logit: whether the logits are K + 1, the last "no object" (DETR), or K (Deformable DETR), as the
            model declares (`vitkit.models.interface.has_no_object_logit`); "ce" needs it True.
        cost_mask, cost_dice: weights of the mask costs (`vitkit.detection.masks.mask_costs`: sigmoid focal and
            dice on sampled points), added where the outputs hold `pred_masks` and the targets `masks` (1 and 1:
            `vitkit.detection.masks.MASK_COSTS`); both 0: not computed, the masks match on boxes and classes.
    """

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        classification: str = "ce",
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
        no_object_logit: bool = True,
        cost_mask: float = MASK_COSTS["mask"],
        cost_dice: float = MASK_COSTS["dice"],
    ) -> None:
        super().__init__()
        if min(cost_mask, cost_dice) < 0:
            raise ValueError(f"mask costs must be >= 0, got cost_mask {cost_mask} and cost_dice {cost_dice}")
        self.cost_mask, self.cost_dice = cost_mask, cost_dice
        costs = {"cost_class": cost_class, "cost_bbox": cost_bbox, "cost_giou": cost_giou}
        if min(costs.values()) < 0 or max(costs.values()) == 0:
            raise ValueError(f"matching costs must be >= 0 and not all 0, got {costs}")
        if classification not in DETECTION_LOSSES:
            raise ValueError(f"classification must be one of {DETECTION_LOSSES}, got {classification!r}")
        check_no_object_logit(classification, no_object_logit)
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.no_object_logit = no_object_logit
        self.classification = classification
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma

    def class_cost(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B * Q, K + 1 | K) logits, (T,) labels -> (B * Q, T) classification cost of each query for each box."""
        if self.classification == "ce":
            return -logits.softmax(-1)[:, labels]  # 1 - p(class), less the constant 1
        p = logits[:, labels].sigmoid()  # (B * Q, T): each query's probability of each box's class
        alpha, gamma = self.focal_alpha, self.focal_gamma
        positive = alpha * (1 - p) ** gamma * -(p + FOCAL_EPS).log()  # focal loss if the class is there
        negative = (1 - alpha) * p**gamma * -(1 - p + FOCAL_EPS).log()  # focal loss if it is not
        return positive - negative

    def cost_matrix(
        self, outputs: Mapping[str, torch.Tensor], targets: Sequence[Mapping[str, torch.Tensor]]
    ) -> torch.Tensor:
        """The batch's cost matrix (B, Q, T) in float32: every query of every image against every box of all."""
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        B, Q, _ = logits.shape
        labels = torch.cat([t["labels"] for t in targets]).to(logits.device)  # (T,)
        target_boxes = torch.cat([t["boxes"] for t in targets]).to(boxes.device, torch.float32)  # (T, 4)
        logits = logits.flatten(0, 1).float()  # (B * Q, K + 1 | K)
        boxes = boxes.flatten(0, 1).float()  # (B * Q, 4)
        cost_bbox = torch.cdist(boxes, target_boxes, p=1)  # (B * Q, T)
        giou = generalized_box_iou(
            box_convert(boxes, "cxcywh", "xyxy"), box_convert(target_boxes, "cxcywh", "xyxy")
        )  # (B * Q, T)
        cost = self.cost_bbox * cost_bbox - self.cost_giou * giou + self.cost_class * self.class_cost(logits, labels)
        return cost.view(B, Q, -1)  # (B, Q, T)

    @torch.no_grad()
    def forward(
        self,
        outputs: Mapping[str, torch.Tensor],
        targets: Sequence[Mapping[str, torch.Tensor]],
        canvas: list[torch.Tensor] | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Match each image's queries to its boxes.

        Args:
            outputs: `pred_logits` (B, Q, K + 1), or (B, Q, K) without `no_object_logit`, and `pred_boxes`
                (B, Q, 4) (cx, cy, w, h) in [0, 1], as DETR gives.
            targets: per image, `labels` (n_i,) class indices in [0, K) and `boxes` (n_i, 4) (cx, cy, w, h) in
                [0, 1] of the image.
            canvas: with masks, the targets' masks already on the batch's canvas (`canvas_masks`; the criterion
                places them once for all its layers); None: placed here.

        Returns:
            per image, (query indices, box indices): two int64 CPU tensors of min(Q, n_i) entries, query q[j]
            matched to box t[j], sorted by query.
        """
        logits = outputs["pred_logits"]
        check_targets(targets, logits.shape[0], logits.shape[-1] - self.no_object_logit)
        return self.match_layers([(outputs, targets)], canvas)[0]

    @torch.no_grad()
    def match_layers(
        self,
        layers: Sequence[tuple[Mapping[str, torch.Tensor], Sequence[Mapping[str, torch.Tensor]]]],
        canvas: list[torch.Tensor] | None = None,
    ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Match several sets of outputs (one per decoder layer), each to its targets, as `forward` does each.

        Every layer's per-image cost blocks (Q, n_i), the mask costs added on the device, reach the CPU in one copy:
        on a GPU, one wait for the device a step, not one a layer and image. The targets are the caller's to check
        (`check_targets`); `canvas` as in `forward`.

        Returns:
            per layer, what `forward` returns.
        """
        # layers costed as one stack: consecutive ones with the same targets and predictions of one shape
        groups = consecutive_groups(layers, _stackable)
        blocks = []  # per group and image, its (G, Q, n_i) costs flattened
        for group in groups:
            outputs, targets = layers[group[0]]
            sizes = [len(t["labels"]) for t in targets]
            if sum(sizes) == 0:
                continue
            stacked = {key: torch.cat([layers[n][0][key] for n in group]) for key in ("pred_logits", "pred_boxes")}
            Q = outputs["pred_logits"].shape[1]
            cost = self.cost_matrix(stacked, targets).view(len(group), -1, Q, sum(sizes))  # (G, B, Q, T), float32
            # then every layer of the group has them (`_stackable`)
            masks = uses_masks(outputs, targets) and self.cost_mask + self.cost_dice > 0
            if masks and canvas is None:
                canvas = canvas_masks(targets, canvas_size(outputs["pred_masks"]))
            for i, block in enumerate(cost.split(sizes, dim=-1)):  # block i: (G, B, Q, n_i)
                own = block[:, i]  # (G, Q, n_i): image i's queries against its own boxes, in each layer
                if masks and sizes[i]:  # every layer's queries at once: (G Q, h, w) against the n_i masks
                    pred = torch.cat([layers[n][0]["pred_masks"][i] for n in group]).float()
                    focal, dice = mask_costs(pred, canvas[i])
                    own = own + (self.cost_mask * focal + self.cost_dice * dice).view(len(group), Q, -1)
                blocks.append(own.reshape(-1))
        costs = torch.cat(blocks).cpu() if blocks else torch.empty(0)
        if not torch.isfinite(costs).all():
            bad = {
                name: sum(int((~outputs[name].isfinite()).sum()) for outputs, _ in layers if name in outputs)
                for name in ("pred_logits", "pred_boxes", "pred_masks")
            }
            held = ", ".join(f"{name} {count}" for name, count in bad.items() if name != "pred_masks" or count)
            raise ValueError(
                f"the matching cost is not finite: NaN or inf values in {held}; the model has diverged (try a lower "
                "learning rate, gradient clipping, or fp32 instead of bf16)"
            )
        matched: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
        start = 0
        for group in groups:
            outputs, targets = layers[group[0]]
            Q, G = outputs["pred_logits"].shape[1], len(group)
            for target in targets:
                n = len(target["labels"])
                own = costs[start : start + G * Q * n].view(G, Q, n)
                start += G * Q * n
                for layer, layer_costs in zip(group, own, strict=True):
                    queries, boxes = linear_sum_assignment(layer_costs.numpy())
                    matched[layer].append(
                        (torch.as_tensor(queries, dtype=torch.int64), torch.as_tensor(boxes, dtype=torch.int64))
                    )
        return matched


def consecutive_groups(items: Sequence[Any], together: Callable[[Any, Any], bool]) -> list[list[int]]:
    """The indices of `items` in runs of consecutive ones that go `together` with their run's first one."""
    groups: list[list[int]] = []
    for n, item in enumerate(items):
        if groups and together(items[groups[-1][0]], item):
            groups[-1].append(n)
        else:
            groups.append([n])
    return groups


def _stackable(
    first: tuple[Mapping[str, Any], Sequence[Mapping[str, torch.Tensor]]],
    other: tuple[Mapping[str, Any], Sequence[Mapping[str, torch.Tensor]]],
) -> bool:
    """Whether two (outputs, targets) can be costed as one stack: the same targets, predictions of the same shapes
    and dtypes, and masks to match in both (of one shape) or in neither."""
    (a, targets_a), (b, targets_b) = first, other
    if targets_a is not targets_b or uses_masks(a, targets_a) != uses_masks(b, targets_b):
        return False
    keys = ("pred_logits", "pred_boxes", "pred_masks") if uses_masks(a, targets_a) else ("pred_logits", "pred_boxes")
    return all(a[key].shape == b[key].shape and a[key].dtype == b[key].dtype for key in keys)
