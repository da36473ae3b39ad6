"""Batches of detection samples: images of different sizes padded together, with their targets.

`pad_images` batches images the way DETR does (its `NestedTensor`): each zero-padded at the bottom and right to
the largest height and width, with a mask of the real pixels.

Letters: B images, C channels, H_i, W_i the size of image i, Hmax, Wmax the largest height and width of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitkit.data.loader import Unreadable


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
