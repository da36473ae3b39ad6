"""The settings of a detector's training loss, named once: the two ways of scoring classes, DETR's weights of its
three losses, and what Deformable DETR's focal loss (arXiv:2010.04159) changes: the matcher's class cost and the
classification loss weighted 2, and the class biases of a fresh model set so that every class starts at
probability `FOCAL_PRIOR`. `vitkit.detection.criterion_for` builds the criterion of each.

A detector's class logits are K + 1, "no object" last (DETR), or the K classes only (Deformable DETR), as it declares
(`vitkit.models.interface.has_no_object_logit`): "focal" reads the first K either way, "ce" needs the "no object"
one (`check_no_object_logit`)."""

from __future__ import annotations

# "ce": DETR's softmax cross-entropy over K + 1 classes, the last "no object"; "focal": Deformable DETR's sigmoid
# focal loss of each of the K real classes (a "no object" logit, if the model has one, unused).
DETECTION_LOSSES = ("ce", "focal")
LOSS_WEIGHTS = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}  # DETR's weights of its three losses
DETECTION_WEIGHTS: dict[str, dict[str, float]] = {"ce": {}, "focal": {"loss_ce": 2.0}}  # changes to LOSS_WEIGHTS
FOCAL_MATCH_COST = 2.0  # the matcher's class cost with the focal loss (`HungarianMatcher.cost_class`; DETR's: 1)
FOCAL_PRIOR = 0.01  # the probability every class of a fresh model starts at under the focal loss


def check_no_object_logit(classification: str, no_object_logit: bool) -> None:
    """ValueError when `classification` "ce" (a softmax over the K classes and "no object") meets a detector
    without a "no object" logit (`vitkit.models.interface.VitkitDetector.no_object_logit`)."""
    if classification == "ce" and not no_object_logit:
        raise ValueError(
            "classification 'ce' is a softmax over K classes and 'no object': it needs a detector with K + 1 class "
            "logits, the last 'no object'; this detector has K sigmoid class logits and no 'no object' logit: use "
            "'focal'"
        )
