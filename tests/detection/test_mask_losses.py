"""Mask costs and losses on sampled points (`vitkit.detection.masks`) against their formulas written out, and at
every logit for masks smaller than the points (the ground truth read at the logits' centres, as the points read
it there); and the set criterion of a detector with a mask head: every layer, denoising queries included, supervises
masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.detection import criterion_for, make_denoising
from vitkit.detection.masks import (
    MASK_POINTS,
    at_logits,
    canvas_masks,
    mask_costs,
    mask_losses,
    mask_pair_losses,
    point_sample,
    uncertain_points,
)
from vitkit.detection.matcher import HungarianMatcher


def test_point_sample_reads_pixel_centres_exactly_and_interpolates_between():
    maps = torch.arange(12.0).view(1, 3, 4)
    centres = torch.tensor([[[(j + 0.5) / 4, (i + 0.5) / 3] for i in range(3) for j in range(4)]])
    torch.testing.assert_close(point_sample(maps, centres), maps.flatten(1))
    between = torch.tensor([[[1.0 / 4, 0.5 / 3]]])  # halfway between pixels (0, 0) and (0, 1)
    torch.testing.assert_close(point_sample(maps, between), torch.tensor([[0.5]]))


def test_canvas_masks_lay_each_image_top_left_as_padding_does():
    a, b = torch.ones(2, 5, 7, dtype=torch.bool), torch.ones(1, 8, 3, dtype=torch.bool)
    placed = canvas_masks([{"masks": a}, {"masks": b}], (8, 8))
    assert [p.shape for p in placed] == [(2, 8, 8), (1, 8, 8)]
    assert placed[0][:, :5, :7].all() and placed[0].sum() == 2 * 35 and placed[1].sum() == 24


def focal(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The sigmoid focal loss, alpha 0.25, gamma 2, not reduced: -alpha_t (1 - p_t)^2 log p_t."""
    p = logits.sigmoid()
    p_t = torch.where(target > 0.5, p, 1 - p)
    alpha_t = torch.where(target > 0.5, 0.25, 0.75)
    return -alpha_t * (1 - p_t) ** 2 * p_t.log()


def dice(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return 1 - (2 * (p * t).sum() + 1) / (p.sum() + t.sum() + 1)


def pair_focal(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The focal loss of logits towards a target in [0, 1] (a mask read between pixels), as a matching cost: the
    positive term weighted by the target, the negative by its complement, mean over the points."""
    p = logits.sigmoid()
    positive, negative = 0.25 * (1 - p) ** 2 * -p.log(), 0.75 * p**2 * -(1 - p).log()
    return (positive * target + negative * (1 - target)).mean()


def test_the_matching_costs_are_the_focal_and_dice_loss_of_every_pair():
    torch.manual_seed(0)
    pred, target = torch.randn(3, 6, 5) * 3, (torch.rand(2, 24, 20) > 0.5).float()
    torch.manual_seed(1)
    cost_focal, cost_dice = mask_costs(pred, target, count=50)
    torch.manual_seed(1)
    points = torch.rand(1, 50, 2)
    for q in range(3):
        for n in range(2):
            logits, wanted = point_sample(pred[q : q + 1], points)[0], point_sample(target[n : n + 1], points)[0]
            torch.testing.assert_close(cost_focal[q, n], pair_focal(logits, wanted))
            torch.testing.assert_close(cost_dice[q, n], dice(logits.sigmoid(), wanted))


def test_a_small_mask_is_compared_at_every_logit_without_sampling():
    """A mask of fewer logits than MASK_POINTS: the costs and losses are the formulas' means over every logit, the
    ground truth read at each logit's centre (what `point_sample` reads there), the same whatever the random state;
    gradients reach every logit."""
    torch.manual_seed(0)
    pred = (torch.randn(3, 6, 5) * 3).requires_grad_()
    target = (torch.rand(2, 24, 20) > 0.5).float()
    assert 6 * 5 < MASK_POINTS
    centres = torch.tensor([[[(j + 0.5) / 5, (i + 0.5) / 6] for i in range(6) for j in range(5)]])
    read = at_logits(target, (6, 5))  # (2, 30)
    torch.testing.assert_close(read, point_sample(target, centres.expand(2, -1, -1)))
    cost_focal, cost_dice = mask_costs(pred, target)
    for q in range(3):
        for n in range(2):
            logits = pred[q].flatten()
            torch.testing.assert_close(cost_focal[q, n], pair_focal(logits, read[n]))
            torch.testing.assert_close(cost_dice[q, n], dice(logits.sigmoid(), read[n]))
    # the matched objects of the three queries, constant over each logit's 4x4 pixels: read as 0 or 1 at the centres
    pairs = (torch.rand(3, 6, 5) > 0.5).float().repeat_interleave(4, 1).repeat_interleave(4, 2)
    focal_loss, dice_loss = mask_losses(pred, pairs, num_boxes=2.0)
    read = at_logits(pairs, (6, 5))
    assert set(read.unique().tolist()) == {0.0, 1.0}
    logits = pred.flatten(1)
    torch.testing.assert_close(focal_loss, focal(logits, read).mean(1).sum() / 2)
    torch.testing.assert_close(dice_loss, sum(dice(logits[m].sigmoid(), read[m]) for m in range(3)) / 2)
    torch.manual_seed(123)  # no draw: another random state gives the same
    assert torch.equal(mask_losses(pred, pairs, num_boxes=2.0)[0], focal_loss)
    (focal_loss + dice_loss).backward()
    assert (pred.grad != 0).all()


def test_the_loss_is_near_zero_for_the_right_mask_and_large_for_its_complement():
    target = torch.zeros(2, 32, 32)
    target[0, 4:20, 8:24], target[1, 10:30, 2:12] = 1, 1
    right = (F.avg_pool2d(target[:, None], 4)[:, 0] * 2 - 1) * 30  # logits at stride 4: +30 inside, -30 outside
    wrong = -right
    torch.manual_seed(0)
    right_focal, right_dice = mask_losses(right, target, num_boxes=2)
    wrong_focal, wrong_dice = mask_losses(wrong, target, num_boxes=2)
    # what is left of the right one is its blurred edges, where the importance sampling puts most points
    assert right_focal < 0.01 * wrong_focal and right_dice < 0.25 < 0.8 < wrong_dice


def test_importance_sampling_draws_most_points_where_the_prediction_is_unsure():
    logits = torch.full((1, 40, 40), 10.0)
    logits[0, :, :12] = 0.0  # 30% of the map is uncertain: 900 of the 3,000 candidates, more than the 750 kept
    torch.manual_seed(0)
    points = uncertain_points(logits, 1000)
    share = (points[0, :, 0] < 0.29).float().mean()
    assert 0.78 < share < 0.88  # the 750 chosen there, and 30% of the 250 drawn uniformly


def test_a_detector_with_a_mask_head_learns_masks_on_every_layer_and_denoising_query():
    torch.manual_seed(0)
    model = vitkit.create_model(
        "deformable_detr_small", masks=True, num_classes=2, enc_layers=1, dec_layers=2, num_queries=6
    ).train()
    images = torch.randn(2, 3, 64, 80)
    masks = [torch.zeros(2, 64, 80, dtype=torch.bool), torch.zeros(1, 64, 80, dtype=torch.bool)]
    masks[0][0, 4:30, 10:40], masks[0][1, 30:60, 50:78], masks[1][0, 10:50, 20:60] = True, True, True
    targets = []
    for m, labels in zip(masks, ([0, 1], [1]), strict=True):
        ys, xs = (m.any(d) for d in (2, 1))  # (n, H), (n, W)
        boxes = []
        for y, x in zip(ys, xs, strict=True):
            y0, y1 = y.nonzero()[[0, -1]].flatten().tolist()
            x0, x1 = x.nonzero()[[0, -1]].flatten().tolist()
            boxes.append([(x0 + x1 + 1) / 160, (y0 + y1 + 1) / 128, (x1 + 1 - x0) / 80, (y1 + 1 - y0) / 64])
        targets.append({"labels": torch.tensor(labels), "boxes": torch.tensor(boxes), "masks": m})
    settings = model.denoising_settings()
    queries, matched = make_denoising(targets, settings, model.config.num_classes)
    out = model(images, denoising=queries)
    assert out["pred_masks"].shape == (2, 6, 16, 20) and out["dn_outputs"]["pred_masks"].shape[-2:] == (16, 20)
    criterion = criterion_for("focal", 2, aux_loss=True, no_object_logit=False)
    losses = criterion(out, targets, matched)
    for suffix in ("", "_0", "_dn", "_dn_0"):
        assert losses[f"loss_mask{suffix}"] > 0 and losses[f"loss_dice{suffix}"] > 0
    assert "loss_mask_enc" not in losses  # the encoder's proposals have boxes only
    losses["total"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.mask_head.parameters())
    # without masks in the targets the same outputs train boxes only, as before
    plain = criterion(out, [{k: v for k, v in t.items() if k != "masks"} for t in targets], matched)
    assert not any(name.startswith(("loss_mask", "loss_dice")) for name in plain)


def test_the_mask_cost_decides_between_queries_with_the_same_box():
    """Two queries predict the same box and class; only the mask tells the object's own query apart."""
    target = torch.zeros(1, 32, 32)
    target[0, 8:24, 8:16] = 1  # the object fills the left half of its box
    good = (F.avg_pool2d(target[:, None], 4)[:, 0] * 2 - 1) * 8
    bad = good.flip(-1)
    outputs = {
        "pred_logits": torch.zeros(1, 2, 1),
        "pred_boxes": torch.tensor([[[0.375, 0.5, 0.25, 0.5]] * 2]),
        "pred_masks": torch.stack([bad, good], 1),  # (1, 2, 8, 8): query 1 is right
    }
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.375, 0.5, 0.25, 0.5]]), "masks": target}]
    matcher = HungarianMatcher(classification="focal", no_object_logit=False)
    ((query,), _), = matcher(outputs, targets)
    assert query == 1
    no_masks = HungarianMatcher(classification="focal", no_object_logit=False, cost_mask=0, cost_dice=0)
    costs = no_masks.cost_matrix(outputs, targets)
    assert costs[0, 0, 0] == costs[0, 1, 0]  # boxes and classes alone cannot tell them apart


def test_a_matcher_without_mask_costs_does_not_compute_them():
    """Mask costs weighted 0 are not computed: masks that would make them NaN leave the matching to the boxes."""
    outputs = {
        "pred_logits": torch.zeros(1, 2, 1),
        "pred_boxes": torch.tensor([[[0.7, 0.5, 0.2, 0.2], [0.375, 0.5, 0.25, 0.5]]]),
        "pred_masks": torch.full((1, 2, 8, 8), float("nan")),
    }
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.375, 0.5, 0.25, 0.5]])}]
    targets[0]["masks"] = torch.ones(1, 32, 32)
    boxes_only = HungarianMatcher(classification="focal", no_object_logit=False, cost_mask=0, cost_dice=0)
    ((query,), _), = boxes_only(outputs, targets)
    assert query == 1
    wrong = "not finite: NaN or inf values in pred_logits 0, pred_boxes 0, pred_masks 128;"
    with pytest.raises(ValueError, match=wrong):
        HungarianMatcher(classification="focal", no_object_logit=False)(outputs, targets)


def test_pairs_named_by_their_objects_rows_score_as_the_objects_masks_repeated():
    """`rows` names each pair's object among the objects' masks: the losses equal those of the masks repeated per
    pair, at every logit and on sampled points (the same draws)."""
    torch.manual_seed(0)
    objects = (torch.rand(3, 24, 28) > 0.5).float()  # on the canvas
    rows = torch.tensor([2, 0, 2, 1, 2])
    pred = torch.randn(5, 6, 7, dtype=torch.float64)
    for count in (None, 20):
        torch.manual_seed(1)
        want = mask_pair_losses(pred, objects[rows], count)
        torch.manual_seed(1)
        got = mask_pair_losses(pred, objects, count, rows=rows)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
