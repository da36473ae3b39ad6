"""Denoising queries (DN-DETR, DINO): how they are made, what the decoder lets them see, and their losses."""

import pytest
import torch
from torchvision.ops import box_convert, sigmoid_focal_loss

from vitkit.detection import criterion_for, make_denoising
from vitkit.detection.denoising import denoising_groups
from vitkit.models.interface import DenoisingQueries, DenoisingSettings


def targets_of(sizes, seed=0, classes=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        centre = torch.rand(n, 2, generator=g) * 0.5 + 0.25
        size = torch.rand(n, 2, generator=g) * 0.3 + 0.1
        out.append({"labels": torch.randint(0, classes, (n,), generator=g), "boxes": torch.cat([centre, size], 1)})
    return out


def dino_attention_mask(pad_size: int, num_queries: int, groups: int) -> torch.Tensor:
    """DINO's `prepare_for_cdn` mask, written as its loops (True: may NOT attend), for comparison."""
    single_pad = pad_size // groups
    mask = torch.zeros(pad_size + num_queries, pad_size + num_queries, dtype=torch.bool)
    mask[pad_size:, :pad_size] = True  # the matching queries cannot see the denoising part
    for i in range(groups):
        rows = slice(single_pad * i, single_pad * (i + 1))
        if i == 0:
            mask[rows, single_pad * (i + 1) : pad_size] = True
        if i == groups - 1:
            mask[rows, : single_pad * i] = True
        else:
            mask[rows, single_pad * (i + 1) : pad_size] = True
            mask[rows, : single_pad * i] = True
    return mask


@pytest.mark.parametrize(("pad_size", "groups", "queries"), [(18, 3, 7), (8, 1, 4), (40, 5, 20)])
def test_attention_mask_is_dinos(pad_size, groups, queries):
    dn = DenoisingQueries(torch.zeros(2, pad_size, dtype=torch.int64), torch.zeros(2, pad_size, 4), groups)
    allowed = dn.attention_allowed(queries)
    assert torch.equal(allowed, ~dino_attention_mask(pad_size, queries, groups))


def test_groups_slots_and_pairs():
    settings = DenoisingSettings(queries=20, label_noise=0.0, box_noise=0.4)
    targets = targets_of([3, 1, 0])
    dn, pairs = make_denoising(targets, settings, num_classes=5)
    assert dn.groups == denoising_groups(settings, 3) == 3  # 20 // (2 * 3)
    assert dn.labels.shape == (3, 18) and dn.boxes.shape == (3, 18, 4)
    # image 0: slots 0-2 positives and 3-5 negatives of group 0, 6-8 and 9-11 of group 1, ...
    assert pairs[0][0].tolist() == [0, 1, 2, 6, 7, 8, 12, 13, 14] and pairs[0][1].tolist() == [0, 1, 2] * 3
    assert pairs[1][0].tolist() == [0, 6, 12] and pairs[1][1].tolist() == [0, 0, 0]
    assert pairs[2][0].numel() == 0
    for i, target in enumerate(targets):
        n = len(target["labels"])
        for g in range(3):
            start = 6 * g
            # without label noise, positives and negatives carry the true labels; the rest of the group is padding
            assert dn.labels[i, start : start + n].tolist() == target["labels"].tolist()
            assert dn.labels[i, start + 3 : start + 3 + n].tolist() == target["labels"].tolist()
            padding = torch.cat([dn.labels[i, start + n : start + 3], dn.labels[i, start + 3 + n : start + 6]])
            assert (padding == -1).all()
    assert (dn.labels[2] == -1).all()


def test_box_noise_bounds_positives_and_negatives():
    """Each corner of a positive copy moves by less than box_noise * half the side; a negative's by between one and
    two times that (before clipping to the image)."""
    torch.manual_seed(0)
    settings = DenoisingSettings(queries=400, label_noise=0.0, box_noise=0.4)
    targets = [{"labels": torch.zeros(1, dtype=torch.int64), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3]])}]
    dn, _ = make_denoising(targets, settings, num_classes=3)
    assert dn.groups == 200
    corners = box_convert(dn.boxes[0], "cxcywh", "xyxy").view(200, 2, 4)  # (groups, positive | negative, 4)
    true = box_convert(targets[0]["boxes"], "cxcywh", "xyxy")[0]
    half = torch.tensor([0.1, 0.15, 0.1, 0.15]) * settings.box_noise
    moved = (corners - true).abs() / half  # in units of box_noise * half side
    assert moved[:, 0].max() < 1 + 1e-5 and moved[:, 1].min() > 1 - 1e-5 and moved[:, 1].max() < 2 + 1e-5
    assert moved[:, 0].mean() == pytest.approx(0.5, abs=0.05) and moved[:, 1].mean() == pytest.approx(1.5, abs=0.05)


def test_label_noise_redraws_a_share_of_labels():
    torch.manual_seed(0)
    settings = DenoisingSettings(queries=4000, label_noise=0.5, box_noise=0.0)
    targets = [{"labels": torch.full((2,), 3), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.1]])}]
    dn, _ = make_denoising(targets, settings, num_classes=10)
    labels = dn.labels[0]
    # a quarter of the copies draw a class uniformly, which is 3 again one time in ten
    assert (labels != 3).float().mean().item() == pytest.approx(0.25 * 0.9, abs=0.02)
    assert labels.min() >= 0 and labels.max() < 10
    assert torch.equal(dn.boxes[0].view(-1, 2, 2, 4)[:, 0], targets[0]["boxes"].expand(1000, 2, 4))  # no box noise


def test_settings_are_checked():
    with pytest.raises(ValueError, match="denoising queries must be positive, got 0"):
        DenoisingSettings(0, 0.5, 1.0)
    with pytest.raises(ValueError, match=r"label_noise in \[0, 1\] and box_noise >= 0, got 1.5 and 1.0"):
        DenoisingSettings(10, 1.5, 1.0)


def test_criterion_scores_denoising_outputs_against_their_boxes():
    """The denoising terms pair each positive slot with the box it was made from (no matching): a prediction that
    gives back every box exactly has zero box losses, and the classification loss counts the negatives and padding
    as "no object"; the terms are divided by the boxes times the groups."""
    settings = DenoisingSettings(queries=12, label_noise=0.0, box_noise=0.5)
    targets = targets_of([2, 1], classes=4)
    dn, pairs = make_denoising(targets, settings, num_classes=4)
    B, P = dn.labels.shape
    boxes = torch.rand(B, P, 4) * 0.2 + 0.3
    for i, (slots, box) in enumerate(pairs):
        boxes[i, slots] = targets[i]["boxes"][box]
    logits = torch.randn(B, P, 4)
    outputs = {"pred_logits": torch.randn(B, 6, 4), "pred_boxes": torch.rand(B, 6, 4) * 0.3 + 0.2, "aux_outputs": []}
    outputs["dn_outputs"] = {"pred_logits": logits, "pred_boxes": boxes, "aux_outputs": []}
    criterion = criterion_for("focal", 4, aux_loss=True, no_object_logit=False)
    losses = criterion(outputs, targets, pairs)
    assert losses["loss_bbox_dn"].item() == 0 and losses["loss_giou_dn"].item() == pytest.approx(0, abs=1e-5)
    one_hot = torch.zeros(B, P, 4)
    for i, (slots, box) in enumerate(pairs):
        one_hot[i, slots, targets[i]["labels"][box]] = 1
    expected = sigmoid_focal_loss(logits, one_hot, alpha=0.25, gamma=2.0, reduction="sum") / (3 * dn.groups)
    assert losses["loss_ce_dn"].item() == pytest.approx(expected.item(), rel=1e-6)
    without = criterion({k: v for k, v in outputs.items() if k != "dn_outputs"}, targets)
    dn_total = sum(criterion.weights[n] * losses[f"{n}_dn"] for n in ("loss_ce", "loss_bbox", "loss_giou"))
    assert losses["total"].item() == pytest.approx((without["total"] + dn_total).item(), rel=1e-6)
    with pytest.raises(ValueError, match="pass the denoising queries' boxes"):
        criterion(outputs, targets)
