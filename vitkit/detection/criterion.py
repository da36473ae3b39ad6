"""DETR's set loss (`SetCriterion`): match queries to boxes, then supervise each matched pair and every unmatched query.

After the Hungarian matching (`vitkit.detection.HungarianMatcher`) of the last decoder layer's predictions:

- `loss_ce`, classification over all B * Q queries. "ce" (DETR): cross-entropy over K + 1 classes, the matched
  queries towards their box's class, the others towards "no object", whose weight is `eos_coef` (0.1), averaged
  with those weights; it needs a model with a "no object" logit. "focal" (Deformable DETR, arXiv:2010.04159):
  sigmoid focal loss (alpha 0.25, gamma 2) of the K real classes (the first K logits: a "no object" logit, when the
  model has one, is unused), one-hot at the matched class and all zero for unmatched queries, summed and divided
  by the number of boxes.
- `loss_bbox`, the L1 distance between matched (cx, cy, w, h) boxes, and `loss_giou`, 1 - generalised IoU; both
  summed over the matched pairs and divided by the number of ground-truth boxes (at least 1), averaged over
  processes under torch.distributed, so every box weighs the same whatever the batch it falls in.
- With `aux_loss`, the same three for each earlier decoder layer in `outputs["aux_outputs"]`, each matched anew,
  as `loss_ce_0`, `loss_bbox_0`, `loss_giou_0`, `loss_ce_1`, ...
- With `aux_loss` and `outputs["enc_outputs"]` (two-stage Deformable DETR: the encoder's N proposals,
  `pred_logits` (B, N, K) and `pred_boxes` (B, N, 4)), the same three for the proposals, matched to the boxes with
  every label taken as class 0 (class-agnostic: a proposal is scored on its first class only), as `loss_ce_enc`,
  `loss_bbox_enc`, `loss_giou_enc`, as the paper's code does (fundamentalvision/Deformable-DETR's `SetCriterion`,
  which weighs them, like the auxiliary terms, only with aux_loss).
- With masks (the outputs hold `pred_masks` (B, Q, H / 4, W / 4) and every target `masks`), the matcher adds the
  mask costs and every layer (denoising queries included) adds `loss_mask`, the sigmoid focal loss, and
  `loss_dice`, on sampled points of the matched pairs (`vitkit.detection.masks`: Mask2Former's and Mask DINO's
  point sampling), each summed over the pairs and divided by the number of boxes.
- `total`: the weighted sum of all of them (weights 1, 5, 2 as DETR, the masks' 1 and 1 as DETR's segmentation;
  the auxiliary and encoder terms weigh as the final ones).

Layers of the same targets and shapes (the decoder's, the denoising queries') are matched and scored as one stack,
and the host reads two values a step, whatever the layers and images (the labels' range, the matching costs'
finiteness); on a GPU each read waits for the device.

The model's class logits are K + 1, "no object" last, or K without it, as the model declares
(`vitkit.models.interface.has_no_object_logit`, passed as `no_object_logit`).

Letters: B images, Q queries, K classes, M matched pairs of the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, sigmoid_focal_loss

from vitkit.detection.losses import (
    DETECTION_LOSSES,
    DETECTION_WEIGHTS,
    FOCAL_MATCH_COST,
    LOSS_WEIGHTS,
    check_no_object_logit,
)
from vitkit.detection.masks import MASK_WEIGHTS, canvas_masks, mask_pair_losses
from vitkit.detection.matcher import (
    HungarianMatcher,
    canvas_size,
    check_targets,
    consecutive_groups,
    uses_masks,
)


def average_num_boxes(targets: Sequence[Mapping[str, torch.Tensor]], device: torch.device) -> float:
    """The number of ground-truth boxes per process: this batch's, averaged over processes when torch.distributed
    is initialised, and at least 1 (DETR's normaliser of the box losses). Counted on the host: only the average
    over processes goes through the device."""
    count = float(sum(len(t["labels"]) for t in targets))
    if dist.is_available() and dist.is_initialized():
        shared = torch.tensor([count], device=device)
        dist.all_reduce(shared)
        count = (shared / dist.get_world_size()).item()
    return max(count, 1.0)


def paired_giou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """1 - generalised IoU of each (x1, y1, x2, y2) box of `boxes1` (M, 4) with the box in the same row of `boxes2`:
    (M,). torchvision's `generalized_box_iou_loss` (its eps included) with the intersection clamped at zero, as
    DETR's `generalized_box_iou` does, instead of indexed by a boolean mask, whose `nonzero` makes the host wait for
    a GPU in every call and its backward."""
    eps = 1e-7  # torchvision's
    inside = (torch.min(boxes1[:, 2:], boxes2[:, 2:]) - torch.max(boxes1[:, :2], boxes2[:, :2])).clamp(min=0)
    intersection = inside.prod(-1)  # (M,)
    union = (boxes1[:, 2:] - boxes1[:, :2]).prod(-1) + (boxes2[:, 2:] - boxes2[:, :2]).prod(-1) - intersection
    enclosing = (torch.max(boxes1[:, 2:], boxes2[:, 2:]) - torch.min(boxes1[:, :2], boxes2[:, :2])).prod(-1)
    iou = intersection / (union + eps)
    return 1 - (iou - (enclosing - union) / (enclosing + eps))


class SetCriterion(nn.Module):
    """DETR's training loss: Hungarian matching, then classification and box losses; see the module docstring.

    Args:
        num_classes: object classes K (the model predicts K + 1 logits, the last "no object", or K: see
            `no_object_logit`).
        matcher: the matcher; by default `HungarianMatcher(classification=classification)` with DETR's costs.
        eos_coef: weight of the "no object" class in the cross-entropy (DETR: 0.1); unused with "focal".
        weights: weights of `loss_ce`, `loss_bbox` and `loss_giou` in `total` (defaults 1, 5, 2; Deformable DETR
            weighs its focal `loss_ce` 2); entries given replace the defaults.
        aux_loss: also supervise every entry of `outputs["aux_outputs"]` (DETR's auxiliary decoding losses).
        classification: "ce" (softmax cross-entropy, DETR) or "focal" (sigmoid focal loss, Deformable DETR).
        focal_alpha, focal_gamma: the focal loss's alpha and gamma (0.25 and 2).
        no_object_logit: whether the model's logits end with a "no object" logit (K + 1, DETR) or not (K,
            Deformable DETR), as it declares (`vitkit.models.interface.has_no_object_logit`); "ce" needs it.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher | None = None,
        eos_coef: float = 0.1,
        weights: Mapping[str, float] | None = None,
        aux_loss: bool = True,
        classification: str = "ce",
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
        no_object_logit: bool = True,
    ) -> None:
        super().__init__()
        if num_classes <= 0:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        if classification not in DETECTION_LOSSES:
            raise ValueError(f"classification must be one of {DETECTION_LOSSES}, got {classification!r}")
        if not 0 <= eos_coef <= 1:
            raise ValueError(f"eos_coef must be in [0, 1], got {eos_coef}")
        check_no_object_logit(classification, no_object_logit)
        unknown = set(weights or {}) - set(LOSS_WEIGHTS) - set(MASK_WEIGHTS)
        if unknown:
            known = [*LOSS_WEIGHTS, *MASK_WEIGHTS]
            raise ValueError(f"unknown loss weights {sorted(unknown)}; the losses are {known}")
        if matcher is None:
            matcher = HungarianMatcher(classification=classification, no_object_logit=no_object_logit)
        if matcher.classification != classification:
            raise ValueError(
                f"the matcher scores classes by {matcher.classification!r} and the loss by {classification!r}: "
                "use the same for both"
            )
        if matcher.no_object_logit != no_object_logit:
            raise ValueError(
                f"the matcher reads logits with no_object_logit={matcher.no_object_logit} and the loss with "
                f"no_object_logit={no_object_logit}: use the same for both"
            )
        self.num_classes = num_classes
        self.matcher = matcher
        self.eos_coef = eos_coef
        self.weights = {**LOSS_WEIGHTS, **MASK_WEIGHTS, **(weights or {})}
        self.aux_loss = aux_loss
        self.classification = classification
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma
        self.no_object_logit = no_object_logit
        class_weight = torch.ones(num_classes + 1)
        class_weight[-1] = eos_coef
        self.register_buffer("class_weight", class_weight, persistent=False)  # (K + 1,)

    def loss_classes(
        self, logits: torch.Tensor, labels: torch.Tensor, matched: tuple[torch.Tensor, ...], num_boxes: float
    ) -> torch.Tensor:
        """Classification loss of L layers' queries (logits (L, B, Q, K + 1 | K)), one per layer (L,): the
        `matched` (layer, image, query) triples towards their boxes' `labels` (M,), the rest "no object"."""
        L, B, Q, _ = logits.shape
        K = self.num_classes
        if self.classification == "ce":
            target_classes = torch.full((L, B, Q), K, dtype=torch.int64, device=logits.device)  # "no object"
            target_classes[matched] = labels
            weight = self.class_weight.to(logits.device)  # (K + 1,)
            scores, wanted = logits.flatten(0, 1).float().transpose(1, 2), target_classes.flatten(0, 1)  # (L B, ., Q)
            losses = F.cross_entropy(scores, wanted, weight=weight, reduction="none")  # (L B, Q), times the weights
            return losses.view(L, -1).sum(1) / weight[target_classes].view(L, -1).sum(1)  # each layer's weighted mean
        one_hot = logits.new_zeros((L, B, Q, K), dtype=torch.float32)  # all zero for "no object"
        one_hot[(*matched, labels)] = 1  # (F.one_hot would read the classes' range on the host)
        loss = sigmoid_focal_loss(
            logits[..., :K].float(), one_hot, alpha=self.focal_alpha, gamma=self.focal_gamma, reduction="none"
        )
        return loss.flatten(1).sum(1) / num_boxes

    def loss_boxes(
        self, boxes: torch.Tensor, wanted: torch.Tensor, matched: tuple[torch.Tensor, ...], num_boxes: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(L1, 1 - GIoU) of the `matched` (layer, image, query) triples' boxes (boxes: (L, B, Q, 4)) against the
        `wanted` ones (M, 4), each summed over a layer's pairs and divided by `num_boxes`: two (L,)."""
        layer = matched[0]
        predicted = boxes[matched].float()  # (M, 4)
        wanted = wanted.to(predicted)
        l1 = (predicted - wanted).abs().sum(-1)  # (M,)
        giou = paired_giou_loss(box_convert(predicted, "cxcywh", "xyxy"), box_convert(wanted, "cxcywh", "xyxy"))
        per_layer = predicted.new_zeros((2, len(boxes))).index_add(1, layer, torch.stack([l1, giou]))  # (2, L)
        return per_layer[0] / num_boxes, per_layer[1] / num_boxes

    def check_logits(self, logits: torch.Tensor, what: str) -> None:
        """ValueError unless `logits` are (B, Q, K + 1) (with `no_object_logit`) or (B, Q, K) (without)."""
        K = self.num_classes
        expected = K + self.no_object_logit
        if logits.ndim != 3 or logits.shape[-1] != expected:
            layout = f"{K} classes and 'no object'" if self.no_object_logit else f"{K} classes, no 'no object' logit"
            raise ValueError(f"expected {what} (B, Q, {expected}) for {layout}, got {tuple(logits.shape)}")

    def stacked_losses(
        self,
        layers: Sequence[Mapping[str, torch.Tensor]],
        wanted: Mapping[str, torch.Tensor],
        pairs: Sequence[torch.Tensor],
        num_boxes: float,
    ) -> dict[str, torch.Tensor]:
        """L decoder layers' `loss_ce`, `loss_bbox`, `loss_giou` (and with masks, `loss_mask`, `loss_dice`), each (L,):
        their predictions of one shape stacked and scored at once, a few operators for all layers instead of as many
        for each.

        Args:
            layers: the layers' predictions, each `pred_logits` (B, Q, K + 1 | K) and `pred_boxes` (B, Q, 4) of the
                same shape and dtype.
            wanted: the batch's targets concatenated on the device: `labels` (T,), `boxes` (T, 4) and, with masks,
                `masks` (T, H, W) on the batch's canvas.
            pairs: per layer, (4, M_l) on the device: image, query, box (its row in `wanted`) and the layer's
                position in `layers` of each matched pair.
            num_boxes: what the sums are divided by.
        """
        logits = torch.stack([layer["pred_logits"] for layer in layers])  # (L, B, Q, K + 1 | K)
        boxes = torch.stack([layer["pred_boxes"] for layer in layers])  # (L, B, Q, 4)
        image, query, box, layer = torch.cat(list(pairs), 1)  # (M,) each, all layers' pairs
        matched = (layer, image, query)
        loss_bbox, loss_giou = self.loss_boxes(boxes, wanted["boxes"][box], matched, num_boxes)
        loss_ce = self.loss_classes(logits, wanted["labels"][box], matched, num_boxes)
        losses = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        if "masks" in wanted and all("pred_masks" in layer for layer in layers):
            masks = torch.stack([layer_outputs["pred_masks"] for layer_outputs in layers])  # (L, B, Q, H / 4, W / 4)
            per_pair = torch.stack(mask_pair_losses(masks[matched], wanted["masks"], rows=box))  # (2, M)
            sums = per_pair.new_zeros(2, len(layers)).index_add(1, layer, per_pair)  # (2, L)
            losses["loss_mask"], losses["loss_dice"] = (sums + masks.sum() * 0) / num_boxes  # in the graph if M is 0
        return losses

    def forward(
        self,
        outputs: Mapping[str, torch.Tensor | list],
        targets: Sequence[Mapping[str, torch.Tensor]],
        denoised: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The losses of a DETR output against the targets.

        Args:
            outputs: the model's output: `pred_logits` (B, Q, K + 1) (or (B, Q, K) without `no_object_logit`),
                `pred_boxes` (B, Q, 4) and, used with `aux_loss`, `aux_outputs`: a list of such dicts, one per
                earlier decoder layer, and `enc_outputs` when the model gives it: such a dict of the encoder's
                proposals (B, N, ...); with denoising queries, `dn_outputs`: such a dict of their predictions (B, P,
                ...) with its own `aux_outputs`.
            targets: per image, `labels` (n,) int64 in [0, K) and `boxes` (n, 4) (cx, cy, w, h) in [0, 1].
            denoised: with `dn_outputs`, per image (slot indices, box indices) of the positive denoising queries
                (`vitkit.detection.make_denoising`); their losses are divided by the boxes times the groups.

        Returns:
            `loss_ce`, `loss_bbox`, `loss_giou` of the last layer, the same suffixed `_0`, `_1`, ... per
            auxiliary layer, `_enc` for the encoder's proposals and `_dn`, `_dn_0`, ... for the denoising queries,
            and `total`, their weighted sum (what to call backward on).
        """
        logits = outputs["pred_logits"]
        self.check_logits(logits, "pred_logits")
        check_targets(targets, logits.shape[0], self.num_classes)
        num_boxes = average_num_boxes(targets, logits.device)
        canvas = canvas_masks(targets, canvas_size(outputs["pred_masks"])) if uses_masks(outputs, targets) else None
        wanted = {
            "labels": torch.cat([t["labels"] for t in targets]).to(logits.device, torch.int64),  # (T,)
            "boxes": torch.cat([t["boxes"] for t in targets]).to(logits.device),  # (T, 4)
        }
        if canvas is not None:
            wanted["masks"] = torch.cat(canvas).to(logits.device)  # (T, H, W)
        # (suffix, predictions, targets the matcher reads, targets the losses read): the last layer first, then
        # aux_outputs in order, then the proposals
        layers = [("", outputs, targets, wanted)]
        if self.aux_loss:
            layers += [(f"_{i}", layer, targets, wanted) for i, layer in enumerate(outputs.get("aux_outputs", []))]
            if "enc_outputs" in outputs:
                self.check_logits(outputs["enc_outputs"]["pred_logits"], "enc_outputs' pred_logits")
                agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]  # every box class 0
                as_one_class = {**wanted, "labels": torch.zeros_like(wanted["labels"])}
                layers.append(("_enc", outputs["enc_outputs"], agnostic, as_one_class))
        matched = self.matcher.match_layers([(layer, seen) for _, layer, seen, _ in layers], canvas)
        # (suffix, predictions, targets, matched pairs, divisor) of every term
        terms = [
            (suffix, layer, kept, indices, num_boxes)
            for (suffix, layer, _, kept), indices in zip(layers, matched, strict=True)
        ]
        if "dn_outputs" in outputs:
            if denoised is None:
                raise ValueError("the outputs hold dn_outputs: pass the denoising queries' boxes (denoised)")
            dn = outputs["dn_outputs"]
            self.check_logits(dn["pred_logits"], "dn_outputs' pred_logits")
            # each box has G positive copies: their losses are divided by G times the boxes
            copies = max(sum(len(q) for q, _ in denoised) / max(sum(len(t["labels"]) for t in targets), 1), 1.0)
            dn_layers = [("_dn", dn)]
            if self.aux_loss:
                dn_layers += [(f"_dn_{i}", layer) for i, layer in enumerate(dn.get("aux_outputs", []))]
            terms += [(suffix, layer, wanted, list(denoised), num_boxes * copies) for suffix, layer in dn_layers]
        # terms scored together: consecutive ones with the same targets, divisor and predictions' shapes and dtypes
        groups = consecutive_groups(terms, _stackable)
        slots = [group.index(t) for group in groups for t in group]
        sizes = [len(t["labels"]) for t in targets]
        pairs = matched_pairs([indices for *_, indices, _ in terms], sizes, logits.device, slots)
        losses, total = {}, logits.new_zeros((), dtype=torch.float32)
        for group in groups:
            _, _, kept, _, divisor = terms[group[0]]
            stacked = self.stacked_losses([terms[t][1] for t in group], kept, [pairs[t] for t in group], divisor)
            for name, values in stacked.items():
                for t, value in zip(group, values.unbind(), strict=True):
                    losses[name + terms[t][0]] = value
                total = total + self.weights[name] * values.sum()
        losses["total"] = total
        return losses


def _stackable(first: tuple, other: tuple) -> bool:
    """Whether two criterion terms (suffix, predictions, targets, matches, divisor) can be scored as one stack: the
    same targets and divisor, and predictions of the same shapes and dtypes, with masks or without alike."""
    (_, a, kept_a, _, divisor_a), (_, b, kept_b, _, divisor_b) = first, other
    same = kept_a is kept_b and divisor_a == divisor_b and ("pred_masks" in a) == ("pred_masks" in b)
    return same and all(
        a[key].shape == b[key].shape and a[key].dtype == b[key].dtype for key in ("pred_logits", "pred_boxes")
    )


def matched_pairs(
    matched: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]],
    sizes: Sequence[int],
    device: torch.device,
    slots: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Each layer's matches (per image, (query indices, box indices), as the matcher gives them) as one (4, M) int64
    tensor on `device`: the image, the query, the box's row among all the batch's boxes (`sizes`: the boxes of each
    image) and the layer's `slots` entry (its place in the stack it is scored in; default 0) of every pair. All
    layers reach the device in one copy."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    host = []
    for indices, slot in zip(matched, slots or [0] * len(matched), strict=True):
        image = [torch.full((len(q),), i, dtype=torch.int64) for i, (q, _) in enumerate(indices)]
        query = [q.cpu().long() for q, _ in indices]
        box = [j.cpu().long() + start for (_, j), start in zip(indices, starts, strict=True)]
        if indices:
            rows = [torch.cat(image), torch.cat(query), torch.cat(box)]
            host.append(torch.stack([*rows, torch.full_like(rows[0], slot)]))
        else:
            host.append(torch.empty(4, 0, dtype=torch.int64))
    counts = [part.shape[1] for part in host]
    return list(torch.cat(host, 1).to(device, non_blocking=True).split(counts, 1)) if host else []


def criterion_for(loss: str, num_classes: int, aux_loss: bool = True, no_object_logit: bool = True) -> SetCriterion:
    """The set criterion a detector trains with under `loss` ("ce" or "focal", `DETECTION_LOSSES`): DETR's costs
    and weights, with the focal loss's class cost (`FOCAL_MATCH_COST`) and weights (`DETECTION_WEIGHTS`), for a
    detector with or without a "no object" logit (`no_object_logit`, as `vitkit.models.interface.has_no_object_logit`
    reads its declaration; "ce" needs one)."""
    if loss not in DETECTION_LOSSES:
        raise ValueError(f"classification must be one of {DETECTION_LOSSES}, got {loss!r}")
    check_no_object_logit(loss, no_object_logit)
    cost_class = FOCAL_MATCH_COST if loss == "focal" else 1.0
    matcher = HungarianMatcher(cost_class=cost_class, classification=loss, no_object_logit=no_object_logit)
    return SetCriterion(
        num_classes,
        matcher,
        weights=DETECTION_WEIGHTS[loss],
        aux_loss=aux_loss,
        classification=loss,
        no_object_logit=no_object_logit,
    )
