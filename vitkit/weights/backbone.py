"""A classifier's weights as a detector's transformer backbone: any checkpoint vitkit reads for a Swin or a ViT
(timm's files and repositories, transformers' DINOv2 / CLIP / SigLIP / ViT / Swin directories, vit-pytorch's and
PaddleViT's files, a vitkit classifier) fills `backbone.body` of a detector built on that classifier
(`vitkit.models.backbone.ClassifierBackbone`); the rest of the detector keeps its initialisation.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from vitkit.weights.convert import LoadReport, from_pretrained, load_report, load_weights
from vitkit.weights.hub import hub_snapshot, is_hub, local_source

BODY = "backbone.body."  # where a detector keeps its classifier backbone's own (timm's) names


def classifier_backbone(model: nn.Module) -> nn.Module | None:
    """The classifier a detector's backbone is built on (`backbone.body`); None for another backbone (a ResNet)."""
    body = getattr(getattr(model, "backbone", None), "body", None)
    return body if isinstance(body, nn.Module) else None


def load_backbone(model: nn.Module, source: str | os.PathLike) -> LoadReport:
    """Load a classifier's weights into the backbone of the detector `model`, the rest left as initialised.

    Args:
        model: a detector whose backbone is a classifier (`classifier_backbone`).
        source: a file or a model directory of that classifier's family in any layout vitkit reads, or a Hub
            repository ("hf-hub:ORG/REPO[@REVISION]"). Its head, if any, is dropped; a ViT's position table is
            resampled to the detector's image size.

    Returns:
        a `LoadReport` in the detector's names: the backbone's tensors loaded, every other tensor `uncovered`.
    """
    body = classifier_backbone(model)
    if body is None:
        raise ValueError(
            f"{type(model).__name__}'s backbone is no classifier (a ResNet's weights load with load_weights); a "
            "classifier's weights fill a detector built on a Swin or ViT backbone"
        )
    local = local_source(os.fspath(source))
    if Path(local).is_dir():  # any directory vitkit reads: the classifier it holds, then its weights in vitkit's names
        saved = from_pretrained(local)
        report = load_weights(body, saved.state_dict(), format="vitkit", reset_head=True)
        report.format = load_report(saved).format  # the directory's layout: vitkit, timm's or transformers'
        report.dropped = load_report(saved).dropped
    else:
        report = load_weights(body, local, reset_head=True)
    report.loaded_keys = [BODY + k for k in report.loaded_keys]
    report.resampled = [BODY + k for k in report.resampled]
    report.reset, report.head_reset, report.checkpoint_classes = [], False, None
    report.uncovered = [k for k in model.state_dict() if not k.startswith(BODY)]
    report.source = hub_snapshot(source).source if is_hub(source) else os.fspath(source)
    return report
