"""Hungarian matching against brute force over every assignment, with costs written out pair by pair."""

import itertools
import math

import pytest
import torch

from vitkit.detection import HungarianMatcher


def corners(box):
    cx, cy, w, h = box
    return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2


def giou(a, b):
    """Generalised IoU of two (cx, cy, w, h) boxes, from the definition (Rezatofighi et al. 2019)."""
    ax0, ay0, ax1, ay1 = corners(a)
    bx0, by0, bx1, by1 = corners(b)
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    hull = (max(ax1, bx1) - min(ax0, bx0)) * (max(ay1, by1) - min(ay0, by0))
    return inter / union - (hull - union) / hull


def pair_cost(logits, box, label, target_box, classification, weights=(1.0, 5.0, 2.0)):
    """The matching cost of one query for one box, written out as DETR and Deformable DETR define it."""
    if classification == "ce":
        exps = [math.exp(v) for v in logits]
        class_cost = -exps[label] / sum(exps)
    else:
        p = 1 / (1 + math.exp(-logits[label]))
        class_cost = 0.25 * (1 - p) ** 2 * -math.log(p + 1e-8) - 0.75 * p**2 * -math.log(1 - p + 1e-8)
    l1 = sum(abs(u - v) for u, v in zip(box, target_box, strict=True))
    return weights[0] * class_cost + weights[1] * l1 - weights[2] * giou(box, target_box)


def random_case(seed, sizes, queries=4, classes=3):
    g = torch.Generator().manual_seed(seed)
    outputs = {
        "pred_logits": 2 * torch.randn(len(sizes), queries, classes + 1, generator=g, dtype=torch.float64),
        "pred_boxes": torch.rand(len(sizes), queries, 4, generator=g, dtype=torch.float64) * 0.4 + 0.1,
    }
    targets = [
        {
            "labels": torch.randint(0, classes, (n,), generator=g),
            "boxes": torch.rand(n, 4, generator=g, dtype=torch.float64) * 0.4 + 0.1,
        }
        for n in sizes
    ]
    return outputs, targets


def brute_force(costs, queries, n):
    """The least total cost over every one-to-one assignment of n boxes to `queries` queries."""
    return min(sum(costs[q][t] for t, q in enumerate(chosen)) for chosen in itertools.permutations(range(queries), n))


@pytest.mark.parametrize("classification", ["ce", "focal"])
@pytest.mark.parametrize("seed", range(4))
def test_matching_is_the_least_cost_assignment(seed, classification):
    sizes = [3, 1, 0, 4, 2]  # boxes per image: none, and as many as queries, included
    outputs, targets = random_case(seed, sizes)
    matcher = HungarianMatcher(classification=classification)
    indices = matcher(outputs, targets)
    assert len(indices) == len(sizes)
    for i, ((queries, boxes), target) in enumerate(zip(indices, targets, strict=True)):
        n = len(target["labels"])
        assert queries.dtype == boxes.dtype == torch.int64 and len(queries) == len(boxes) == n
        assert len(set(queries.tolist())) == n and sorted(boxes.tolist()) == list(range(n))
        costs = [
            [
                pair_cost(
                    outputs["pred_logits"][i, q].tolist(),
                    outputs["pred_boxes"][i, q].tolist(),
                    int(target["labels"][t]),
                    target["boxes"][t].tolist(),
                    classification,
                )
                for t in range(n)
            ]
            for q in range(4)
        ]
        found = sum(costs[q][t] for q, t in zip(queries.tolist(), boxes.tolist(), strict=True))
        assert found == pytest.approx(brute_force(costs, 4, n), abs=1e-9)
        if n:  # the batched cost matrix holds the same costs
            block = matcher.cost_matrix(outputs, targets)[i, :, sum(sizes[:i]) : sum(sizes[: i + 1])]
            torch.testing.assert_close(block, torch.tensor(costs, dtype=block.dtype))


def test_each_image_is_matched_as_if_alone_and_costs_weigh_as_given():
    outputs, targets = random_case(7, [2, 3, 1], queries=5)
    together = HungarianMatcher()(outputs, targets)
    for i, target in enumerate(targets):
        alone = HungarianMatcher()({k: v[i : i + 1] for k, v in outputs.items()}, [target])
        assert torch.equal(alone[0][0], together[i][0]) and torch.equal(alone[0][1], together[i][1])
    matcher = HungarianMatcher(cost_class=0.5, cost_bbox=2.0, cost_giou=3.0)
    cost = matcher.cost_matrix(outputs, targets)
    expected = pair_cost(
        outputs["pred_logits"][1, 4].tolist(),
        outputs["pred_boxes"][1, 4].tolist(),
        int(targets[1]["labels"][2]),
        targets[1]["boxes"][2].tolist(),
        "ce",
        weights=(0.5, 2.0, 3.0),
    )
    assert cost[1, 4, 2 + 2].item() == pytest.approx(expected, abs=1e-6)


def test_matcher_takes_no_boxes_and_rejects_bad_input():
    outputs, targets = random_case(0, [0, 0])
    assert all(len(q) == len(t) == 0 for q, t in HungarianMatcher()(outputs, targets))
    outputs, targets = random_case(0, [2, 1])
    with pytest.raises(ValueError, match="one target per image: 2 images, 1 targets"):
        HungarianMatcher()(outputs, targets[:1])
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        HungarianMatcher()(outputs, [targets[0], {"labels": torch.tensor([3]), "boxes": targets[1]["boxes"]}])
    with pytest.raises(ValueError, match=r"expected labels \(n,\) and boxes \(n, 4\)"):
        HungarianMatcher()(outputs, [targets[0], {"labels": torch.tensor([1]), "boxes": torch.rand(1, 3)}])
    outputs["pred_boxes"][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="not finite: NaN or inf values in pred_logits 0, pred_boxes 1;"):
        HungarianMatcher()(outputs, targets)
    with pytest.raises(ValueError, match="not all 0"):
        HungarianMatcher(cost_class=0, cost_bbox=0, cost_giou=0)
    with pytest.raises(ValueError, match="classification must be one of"):
        HungarianMatcher(classification="sigmoid")


@pytest.mark.parametrize("classification", ["ce", "focal"])
def test_matcher_costs_bf16_outputs_in_float32(classification):
    """Under bf16 autocast a model's outputs are bfloat16: the cost matrix is float32 (bf16's 8 bits of mantissa
    tie the costs and flip assignments; its focal costs of confident logits overflow), equal to the cost of the same
    values in float32, and the assignment is the same."""
    outputs, targets = random_case(3, [4, 2, 5], queries=6)
    outputs["pred_logits"] = outputs["pred_logits"] * 40  # confident logits: p near 0 and 1
    low = {k: v.to(torch.bfloat16) for k, v in outputs.items()}
    upcast = {k: v.float() for k, v in low.items()}
    matcher = HungarianMatcher(classification=classification, no_object_logit=classification == "ce")
    cost = matcher.cost_matrix(low, targets)
    assert cost.dtype == torch.float32 and cost.isfinite().all()
    torch.testing.assert_close(cost, matcher.cost_matrix(upcast, targets), rtol=0, atol=0)
    for (q, t), (q32, t32) in zip(matcher(low, targets), matcher(upcast, targets), strict=True):
        assert q.tolist() == q32.tolist() and t.tolist() == t32.tolist()


def test_layers_matched_together_are_matched_as_each_alone():
    """`match_layers` (one copy of all layers' costs to the host; the layers of the same targets and shapes costed
    as one stack) gives each layer what `forward` gives it alone: three decoder layers of the same targets, an image
    without boxes, and a layer with other queries and targets (encoder proposals) after them."""
    matcher = HungarianMatcher()
    layers = []
    for seed, queries in ((0, 4), (1, 4), (3, 4), (2, 7)):
        outputs, targets = random_case(seed, [2, 0, 3], queries=queries)
        layers.append((outputs, targets if seed in (0, 2) else layers[0][1]))  # layers 0-2 share their targets
    calls = []
    cost_matrix = matcher.cost_matrix
    matcher.cost_matrix = lambda outputs, targets: calls.append(len(outputs["pred_logits"])) or cost_matrix(
        outputs, targets
    )
    together = matcher.match_layers(layers)
    assert calls == [3 * 3, 3]  # the three decoder layers' 3 images as one stack, then the proposals
    del matcher.cost_matrix
    for (outputs, targets), indices in zip(layers, together, strict=True):
        for (q, t), (q_alone, t_alone) in zip(indices, matcher(outputs, targets), strict=True):
            assert torch.equal(q, q_alone) and torch.equal(t, t_alone)
    assert [len(q) for q, _ in together[3]] == [2, 0, 3]
