"""A training aid for detectors: the backbone classifies the features pooled in each ground-truth box.

The cross-entropy of these classifications teaches the backbone the classes at their places from the first step on,
what the set loss teaches it only slowly (a backbone first trained on digit classification, trained alongside). The
classifier is a training-only part: it is saved in the training checkpoint, not with the model.

Letters: B images, H, W input size, C5 backbone channels, h, w feature-map size, T boxes of the batch, K classes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.ops import roi_align

from vitkit.models.interface import VitkitDetector


class BoxClassification(nn.Module):
    """A detector with, for training only, a classifier of its backbone's features pooled in each ground-truth box.

    ``forward(images, pixel_mask, boxes)`` runs the detector and, from the coarsest of the backbone's feature maps
    (B, C5, h, w) it computed, pools a 2x2 RoIAlign (Mask R-CNN, He et al. arXiv:1703.06870) of each box (xyxy pixels
    of the input, one (n_i, 4) tensor per image), averages it and classifies it: (detector outputs, logits (T, K)).

    Args:
        detector: a vitkit detector (`vitkit.models.interface.VitkitDetector`): its `backbone` is read.
        num_classes: K, the classes of the boxes.
    """

    def __init__(self, detector: VitkitDetector, num_classes: int) -> None:
        super().__init__()
        self.detector = detector
        self.head = nn.Linear(detector.backbone.out_channels[-1], num_classes)

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None, boxes: list[torch.Tensor], **detector: Any
    ) -> tuple[dict[str, Any], torch.Tensor]:
        features: list[torch.Tensor] = []
        hook = self.detector.backbone.register_forward_hook(lambda module, args, out: features.append(out[-1]))
        try:
            outputs = self.detector(images, pixel_mask, **detector)  # `detector`: e.g. denoising queries
        finally:
            hook.remove()
        feature_map = features[-1].float()  # (B, C5, h, w)
        scale = feature_map.shape[-1] / images.shape[-1]  # feature-map columns per input pixel
        pooled = roi_align(feature_map, boxes, output_size=2, spatial_scale=scale, aligned=True)  # (T, C5, 2, 2)
        return outputs, self.head(pooled.mean((2, 3)))  # (T, K)
