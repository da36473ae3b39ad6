"""Out of a detector: its outputs as boxes in pixels.

`postprocess` is DETR's `PostProcess`: class probabilities by softmax (or by sigmoid for a model trained with the
focal loss), the best real class of each query (the last class, "no object", dropped; a model without a "no object"
logit, as Deformable DETR, has the K real classes only), boxes from (cx, cy, w, h) relative to the unpadded image to
(x0, y0, x1, y1) pixels. Two options, off by default, serve detectors trained
briefly: Deformable DETR's `PostProcess` (its `top_k`: the k most probable (query, class) pairs, so that a query
unsure between two classes offers both) and per-class non-maximum suppression (`nms_iou`), which removes the
duplicate boxes that a DETR with few decoder layers still predicts (the DETR paper, section 4.2, measures NMS
helping its early layers).

Letters: B images, Q queries, K classes, k scored (query, class) pairs per image, n detections of one image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
from torchvision.ops import batched_nms, box_convert

from vitkit.detection.losses import DETECTION_LOSSES, check_no_object_logit

PAPER_TOP_K = 100  # the (query, class) pairs Deformable DETR's `PostProcess` scores per image
DEFAULT_THRESHOLD = 0.5  # the class probability detections are shown above when nothing says otherwise


def postprocess(
    outputs: Mapping[str, torch.Tensor],
    image_sizes: torch.Tensor | Sequence[tuple[int, int]],
    threshold: float = 0.5,
    classification: str = "ce",
    top_k: int | None = None,
    nms_iou: float | None = None,
    no_object_logit: bool = True,
) -> list[dict[str, torch.Tensor]]:
    """DETR's predictions as detections in pixels, one dict per image.

    Args:
        outputs: a DETR model's output: `pred_logits` (B, Q, K + 1) ((B, Q, K) without `no_object_logit`) and
            `pred_boxes` (B, Q, 4) (cx, cy, w, h) in [0, 1] of each unpadded image; other entries (`aux_outputs`)
            are ignored.
        image_sizes: each image's (height, width) in pixels before padding (B pairs, or a (B, 2) tensor); boxes
            are scaled to it (to the original image's size when the model saw a resized one).
        threshold: keep the queries whose best real-class probability is above it (0 keeps every query).
        classification: how the model was trained to score classes: "ce", softmax over the K + 1 logits (DETR), or
            "focal", a sigmoid of each of the K real-class logits, the first K (Deformable DETR's focal loss; a "no
            object" logit is unused); either way each query yields its best real class.
        top_k: None, each query's best class (DETR); or the `top_k` most probable (query, class) pairs of each
            image across all queries and classes (Deformable DETR), most probable first.
        nms_iou: None, or drop each box that overlaps a more probable box of the same class with IoU above it
            (per-class non-maximum suppression, `torchvision.ops.batched_nms`), after the threshold.
        no_object_logit: whether `pred_logits` end with a "no object" logit (K + 1, DETR) or hold the K classes only
            (Deformable DETR), as the model declares (`vitkit.models.interface.has_no_object_logit`); "ce" needs it.

    Returns:
        per image, in query order (most probable first with `top_k` or `nms_iou`): `boxes` (n, 4) as (x0, y0, x1,
        y1) pixels, `scores` (n,) the probability of `labels` (n,), the class in [0, K), and `queries` (n,) the
        query each detection comes from (to find its attention map, say).
    """
    logits, boxes, sizes = _checked(outputs, image_sizes, threshold)
    Postprocessing(classification, top_k, nms_iou, no_object_logit)  # checks the options
    probs = _class_probabilities(logits, classification, no_object_logit)  # (B, Q, K)
    height, width = sizes.unbind(1)  # (B,) each
    scale = torch.stack([width, height, width, height], dim=1)  # (B, 4)
    corners = box_convert(boxes, "cxcywh", "xyxy") * scale[:, None, :]  # (B, Q, 4) in pixels
    scores, labels, queries = _scored_pairs(probs, top_k)  # (B, k) each
    corners = corners.gather(1, queries[..., None].expand(-1, -1, 4))  # (B, k, 4): the box of each pair's query
    return [
        _kept(score, label, box, query, threshold, nms_iou)
        for score, label, box, query in zip(scores, labels, corners, queries, strict=True)
    ]


def _checked(
    outputs: Mapping[str, torch.Tensor], image_sizes: torch.Tensor | Sequence[tuple[int, int]], threshold: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`postprocess`'s inputs checked: (pred_logits (B, Q, K + 1 | K), pred_boxes (B, Q, 4), image sizes (B, 2))."""
    for key in ("pred_logits", "pred_boxes"):
        if key not in outputs:
            raise ValueError(
                f"postprocess takes a DETR output dict with 'pred_logits' and 'pred_boxes'; {key!r} is missing"
            )
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    if logits.ndim != 3 or boxes.shape != (*logits.shape[:2], 4):
        raise ValueError(
            f"expected pred_logits (B, Q, K + 1 | K) and pred_boxes (B, Q, 4), got {tuple(logits.shape)} and "
            f"{tuple(boxes.shape)}"
        )
    sizes = torch.as_tensor(image_sizes, dtype=boxes.dtype, device=boxes.device)
    if sizes.shape != (logits.shape[0], 2):
        raise ValueError(
            f"image_sizes must hold one (height, width) per image: ({logits.shape[0]}, 2), got {tuple(sizes.shape)}"
        )
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    return logits, boxes, sizes


def _class_probabilities(logits: torch.Tensor, classification: str, no_object_logit: bool) -> torch.Tensor:
    """Logits (B, Q, K + 1), or (B, Q, K) without `no_object_logit` -> each query's probability of each real class
    (B, Q, K): a softmax over all K + 1 ("ce"), "no object" then dropped, or a sigmoid of each real class
    ("focal")."""
    if classification == "ce":
        return logits.softmax(-1)[..., :-1]
    return (logits[..., :-1] if no_object_logit else logits).sigmoid()


def _scored_pairs(probs: torch.Tensor, top_k: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, labels, queries), each (B, k): each query's best class (k = Q) with `top_k` None, else the `top_k`
    most probable (query, class) pairs of each image over all Q * K, most probable first."""
    if top_k is None:
        scores, labels = probs.max(-1)  # (B, Q)
        queries = torch.arange(probs.shape[1], device=probs.device).expand(probs.shape[0], -1)  # (B, Q)
        return scores, labels, queries
    K = probs.shape[-1]
    scores, pairs = probs.flatten(1).topk(min(top_k, probs[0].numel()), dim=1)  # (B, k): over Q * K pairs
    return scores, pairs % K, pairs // K  # the class and the query of each pair


def _kept(
    score: torch.Tensor,
    label: torch.Tensor,
    box: torch.Tensor,
    query: torch.Tensor,
    threshold: float,
    nms_iou: float | None,
) -> dict[str, torch.Tensor]:
    """One image's pairs (k,) and boxes (k, 4) above `threshold`, then, with `nms_iou`, those per-class
    non-maximum suppression keeps (most probable first): `postprocess`'s dict of one image."""
    keep = score > threshold
    score, label, box, query = score[keep], label[keep], box[keep], query[keep]
    if nms_iou is not None:
        kept = batched_nms(box, score, label, nms_iou)  # indices, most probable first
        score, label, box, query = score[kept], label[kept], box[kept], query[kept]
    return {"boxes": box, "scores": score, "labels": label, "queries": query}


@dataclass(frozen=True)
class Postprocessing:
    """How a detector's outputs become detections: `postprocess`'s options, saved with a trained detector
    (the "postprocess" entry of its config.json). The default is DETR's: softmax, each query's best class, no
    suppression."""

    classification: str = "ce"  # "ce" (softmax with "no object", DETR) or "focal" (a sigmoid per class)
    top_k: int | None = None  # None: each query's best class; k: the k most probable (query, class) pairs
    nms_iou: float | None = None  # None: no suppression; IoU of per-class non-maximum suppression
    no_object_logit: bool = True  # the model's logits end with "no object" (K + 1, DETR) or not (K, Deformable DETR)
    # the class probability above which a detection is shown when no threshold is given (vitkit predict, attention):
    # training chooses it on the validation split (`CocoEvaluator.best_threshold`); None: DEFAULT_THRESHOLD
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.classification not in DETECTION_LOSSES:
            raise ValueError(f"classification must be 'ce' or 'focal', got {self.classification!r}")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1
        ):
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if self.nms_iou is not None and not 0 < self.nms_iou <= 1:
            raise ValueError(f"nms_iou must be in (0, 1] or None, got {self.nms_iou}")
        if not isinstance(self.no_object_logit, bool):
            raise ValueError(f"no_object_logit must be a bool, got {self.no_object_logit!r}")
        if self.threshold is not None and not 0 <= self.threshold < 1:
            raise ValueError(f"threshold must be in [0, 1) or None, got {self.threshold}")
        check_no_object_logit(self.classification, self.no_object_logit)

    def __call__(
        self,
        outputs: Mapping[str, torch.Tensor],
        image_sizes: torch.Tensor | Sequence[tuple[int, int]],
        threshold: float,
    ) -> list[dict[str, torch.Tensor]]:
        """`postprocess` with these options."""
        return postprocess(
            outputs, image_sizes, threshold, self.classification, self.top_k, self.nms_iou, self.no_object_logit
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shown_above(self, threshold: float | None = None) -> float:
        """The threshold detections are shown above: `threshold` when given, else the saved one, else
        DEFAULT_THRESHOLD."""
        if threshold is not None:
            return threshold
        return self.threshold if self.threshold is not None else DEFAULT_THRESHOLD

    def one_per_query(self) -> Postprocessing:
        """The same reading with each query's best class only (`top_k` None): one box per object, as `vitkit
        predict` and `vitkit attention` show them. The k best (query, class) pairs score more COCO AP (a query
        unsure between two classes offers both), but put two labels on one object."""
        return replace(self, top_k=None)

    @classmethod
    def default(cls, no_object_logit: bool = True) -> Postprocessing:
        """How a detector's outputs are read when nothing says otherwise: DETR's `PostProcess` (softmax, each
        query's best class) for a model with a "no object" logit; without one, Deformable DETR's (a sigmoid per
        class, the 100 most probable (query, class) pairs)."""
        if no_object_logit:
            return cls()
        return cls("focal", top_k=PAPER_TOP_K, no_object_logit=False)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], no_object_logit: bool = True) -> Postprocessing:
        """The settings of a saved dict; keys it lacks take DETR's defaults, and `no_object_logit` (the model's
        declaration) when it lacks that key; unknown keys are an error."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown postprocess setting(s) {unknown}; known: {', '.join(known)}")
        return cls(**{"no_object_logit": no_object_logit, **values})
