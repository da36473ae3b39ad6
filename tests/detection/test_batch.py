"""Batching detection samples: padded images, their masks and targets, and unreadable samples reported."""

import torch

from vitkit.data import Unreadable
from vitkit.detection import DetectionBatch, collate_detection


def sample(height, width, boxes):
    target = {"labels": torch.arange(boxes), "boxes": torch.rand(boxes, 4), "image_id": torch.tensor(height)}
    return torch.rand(3, height, width), target


def test_collate_pads_images_and_keeps_targets_in_order():
    samples = [sample(20, 30, 2), Unreadable("image 7 (a.jpg)", "truncated"), sample(25, 10, 0)]
    batch = collate_detection(samples)
    assert isinstance(batch, DetectionBatch)
    assert batch.images.shape == (2, 3, 25, 30) and batch.pixel_mask.shape == (2, 25, 30)
    assert torch.equal(batch.images[0, :, :20, :30], samples[0][0]) and torch.equal(
        batch.images[1, :, :, :10], samples[2][0]
    )
    assert batch.pixel_mask[0].sum() == 20 * 30 and batch.pixel_mask[1].sum() == 25 * 10
    assert [t["image_id"].item() for t in batch.targets] == [20, 25]
    assert batch.skipped == [samples[1]]
    moved = batch.to("cpu")
    assert torch.equal(moved.images, batch.images) and torch.equal(moved.targets[0]["boxes"], batch.targets[0]["boxes"])


def test_collate_of_only_unreadable_samples_is_an_empty_batch():
    batch = collate_detection([Unreadable("x", "gone")])
    assert batch.images.shape[0] == 0 and batch.targets == [] and len(batch.skipped) == 1
