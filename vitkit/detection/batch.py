"""Batches of detection samples: images of different sizes padded together, with their targets.

Letters: B images, C channels, Hmax, Wmax the largest height and width of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitkit.data.loader import Unreadable
from vitkit.detection.postprocess import pad_images


@dataclass
class DetectionBatch:
    images: torch.Tensor  # (B, C, Hmax, Wmax) float, zero-padded at the bottom and right; B may be 0
    pixel_mask: torch.Tensor  # (B, Hmax, Wmax) bool, True on real pixels
    targets: list[dict[str, torch.Tensor]]  # per image, as the datasets give them
    skipped: list[Unreadable]  # samples of this batch whose image could not be read

    def to(self, device: torch.device | str, non_blocking: bool = False) -> DetectionBatch:
        """The batch on `device`, targets included."""
        move = {"device": device, "non_blocking": non_blocking}
        targets = [{k: v.to(**move) for k, v in t.items()} for t in self.targets]
        return DetectionBatch(self.images.to(**move), self.pixel_mask.to(**move), targets, self.skipped)

    def pin_memory(self) -> DetectionBatch:
        """Called by DataLoader(pin_memory=True): page-locked tensors copy to the GPU asynchronously."""
        targets = [{k: v.pin_memory() for k, v in t.items()} for t in self.targets]
        return DetectionBatch(self.images.pin_memory(), self.pixel_mask.pin_memory(), targets, self.skipped)


def collate_detection(samples: list[tuple[torch.Tensor, dict[str, torch.Tensor]] | Unreadable]) -> DetectionBatch:
    """Pad the readable samples into a batch (`pad_images`); report the unreadable ones in `skipped`."""
    good = [s for s in samples if not isinstance(s, Unreadable)]
    skipped = [s for s in samples if isinstance(s, Unreadable)]
    if not good:
        return DetectionBatch(torch.empty(0), torch.empty(0, dtype=torch.bool), [], skipped)
    images, mask = pad_images([image for image, _ in good])  # (B, C, Hmax, Wmax), (B, Hmax, Wmax)
    return DetectionBatch(images, mask, [target for _, target in good], skipped)
