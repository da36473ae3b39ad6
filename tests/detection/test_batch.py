"""Batching detection samples: images of different sizes padded with their masks, targets, and unreadable samples
reported."""

import pytest
import torch

from vitkit.data import Unreadable
from vitkit.detection import DetectionBatch, collate_detection, pad_images


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


def test_pad_images_keeps_each_image_top_left_and_masks_the_rest():
    a = torch.rand(3, 5, 7)
    b = torch.rand(3, 6, 4)
    images, mask = pad_images([a, b])
    assert images.shape == (2, 3, 6, 7) and mask.shape == (2, 6, 7) and mask.dtype == torch.bool
    assert torch.equal(images[0, :, :5, :7], a) and torch.equal(images[1, :, :6, :4], b)
    assert images[0, :, 5:].eq(0).all() and images[1, :, :, 4:].eq(0).all()
    assert mask[0].sum() == 5 * 7 and mask[0, :5, :7].all()
    assert mask[1].sum() == 6 * 4 and mask[1, :6, :4].all()


def test_pad_images_errors():
    with pytest.raises(ValueError, match="at least one image"):
        pad_images([])
    with pytest.raises(ValueError, match=r"takes images \(C, H, W\); image 1 is \(1, 3, 4, 4\)"):
        pad_images([torch.rand(3, 4, 4), torch.rand(1, 3, 4, 4)])
    with pytest.raises(ValueError, match="image 1 is \\(1 channels"):
        pad_images([torch.rand(3, 4, 4), torch.rand(1, 4, 4)])
    with pytest.raises(ValueError, match="image 0 has no pixels"):
        pad_images([torch.rand(3, 0, 4)])
