"""DETR's set loss: zero at a planted perfect prediction, each term against its formula written out, the
normalisation by the number of boxes (across processes too), auxiliary layers and the focal option."""

import math

import pytest
import torch

from vitkit.detection import HungarianMatcher, SetCriterion, criterion, criterion_for

K = 5  # classes


def planted(seed=0, sizes=(3, 0, 2), queries=6, classification="ce"):
    """Outputs that predict every box exactly from a known query, and "no object" confidently elsewhere."""
    g = torch.Generator().manual_seed(seed)
    B = len(sizes)
    boxes = torch.rand(B, queries, 4, generator=g) * 0.3 + 0.2
    logits = torch.full((B, queries, K + 1), -30.0 if classification == "focal" else 0.0)
    logits[..., K] = 30.0  # "no object"
    targets, chosen = [], []
    for i, n in enumerate(sizes):
        labels = torch.randint(0, K, (n,), generator=g)
        target_boxes = torch.rand(n, 4, generator=g) * 0.3 + 0.2
        queries_of_boxes = torch.randperm(queries, generator=g)[:n]
        boxes[i, queries_of_boxes] = target_boxes
        logits[i, queries_of_boxes, K] = -30.0 if classification == "focal" else 0.0
        logits[i, queries_of_boxes, labels] = 30.0
        targets.append({"labels": labels, "boxes": target_boxes})
        chosen.append(queries_of_boxes)
    return {"pred_logits": logits, "pred_boxes": boxes}, targets, chosen


@pytest.mark.parametrize("classification", ["ce", "focal"])
def test_planted_perfect_prediction_costs_nothing(classification):
    outputs, targets, chosen = planted(classification=classification)
    outputs["aux_outputs"] = [{k: v.clone() for k, v in outputs.items()} for _ in range(2)]
    indices = HungarianMatcher(classification=classification)(outputs, targets)
    for (queries, boxes), planted_queries in zip(indices, chosen, strict=True):
        assert torch.equal(planted_queries[boxes], queries)  # box t was matched to the query that predicts it
    losses = SetCriterion(K, classification=classification)(outputs, targets)
    assert set(losses) == {f"loss_{n}{s}" for n in ("ce", "bbox", "giou") for s in ("", "_0", "_1")} | {"total"}
    for name, value in losses.items():
        assert value.item() == pytest.approx(0.0, abs=1e-5), name


def giou_loss(a, b):
    """1 - generalised IoU of (cx, cy, w, h) boxes, from the definition."""
    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = (
        (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2) for cx, cy, w, h in (a, b)
    )
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    hull = (max(ax1, bx1) - min(ax0, bx0)) * (max(ay1, by1) - min(ay0, by0))
    return 1 - (inter / union - (hull - union) / hull)


def random_outputs(seed, sizes, queries=6):
    g = torch.Generator().manual_seed(seed)
    outputs = {
        "pred_logits": torch.randn(len(sizes), queries, K + 1, generator=g, dtype=torch.float64),
        "pred_boxes": torch.rand(len(sizes), queries, 4, generator=g, dtype=torch.float64) * 0.4 + 0.1,
    }
    targets = [
        {"labels": torch.randint(0, K, (n,), generator=g), "boxes": torch.rand(n, 4, generator=g) * 0.4 + 0.1}
        for n in sizes
    ]
    return outputs, targets


def reference_losses(outputs, targets, indices, classification="ce", eos_coef=0.1, num_boxes=None):
    """DETR's (and Deformable DETR's) three losses for a given matching, sums written out element by element."""
    logits, boxes = outputs["pred_logits"].tolist(), outputs["pred_boxes"].tolist()
    wanted = [[K] * len(logits[0]) for _ in logits]  # class each query should predict
    l1 = giou = 0.0
    for i, (queries, box_ids) in enumerate(indices):
        for q, t in zip(queries.tolist(), box_ids.tolist(), strict=True):
            wanted[i][q] = int(targets[i]["labels"][t])
            target_box = targets[i]["boxes"][t].tolist()
            l1 += sum(abs(u - v) for u, v in zip(boxes[i][q], target_box, strict=True))
            giou += giou_loss(boxes[i][q], target_box)
    n = num_boxes if num_boxes is not None else max(1, sum(len(t["labels"]) for t in targets))
    if classification == "ce":  # weighted mean of -log softmax, "no object" weighing eos_coef
        total = weight_sum = 0.0
        for row_logits, row_wanted in zip(logits, wanted, strict=True):
            for x, c in zip(row_logits, row_wanted, strict=True):
                weight = eos_coef if c == K else 1.0
                total += weight * -(x[c] - math.log(sum(math.exp(v) for v in x)))
                weight_sum += weight
        ce = total / weight_sum
    else:  # focal loss summed over every query and real class, divided by the number of boxes
        ce = 0.0
        for row_logits, row_wanted in zip(logits, wanted, strict=True):
            for x, c in zip(row_logits, row_wanted, strict=True):
                for k in range(K):
                    p = 1 / (1 + math.exp(-x[k]))
                    if k == c:
                        ce += -0.25 * (1 - p) ** 2 * math.log(p)
                    else:
                        ce += -0.75 * p**2 * math.log(1 - p)
        ce /= n
    return {"loss_ce": ce, "loss_bbox": l1 / n, "loss_giou": giou / n}


@pytest.mark.parametrize("classification", ["ce", "focal"])
def test_losses_equal_their_formulas(classification):
    outputs, targets = random_outputs(1, [3, 1, 0, 2])
    loss = SetCriterion(K, classification=classification, aux_loss=False)
    indices = loss.matcher(outputs, targets)
    losses = loss(outputs, targets)
    expected = reference_losses(outputs, targets, indices, classification)
    for name, value in expected.items():
        assert losses[name].item() == pytest.approx(value, rel=1e-5), name
    assert losses["total"].item() == pytest.approx(
        expected["loss_ce"] + 5 * expected["loss_bbox"] + 2 * expected["loss_giou"], rel=1e-5
    )


def test_losses_are_normalised_by_the_number_of_boxes():
    outputs, targets = random_outputs(2, [2, 3])
    loss = SetCriterion(K, aux_loss=False)
    once = loss(outputs, targets)
    twice = loss({k: torch.cat([v, v]) for k, v in outputs.items()}, targets + targets)  # twice the images and boxes
    for name in ("loss_ce", "loss_bbox", "loss_giou"):
        assert twice[name].item() == pytest.approx(once[name].item(), rel=1e-6)
    empty = loss(outputs, [{"labels": torch.zeros(0, dtype=torch.long), "boxes": torch.zeros(0, 4)}] * 2)
    assert empty["loss_bbox"].item() == empty["loss_giou"].item() == 0.0
    no_object = -torch.log_softmax(outputs["pred_logits"], -1)[..., K].mean()  # every query: "no object"
    assert empty["loss_ce"].item() == pytest.approx(no_object.item(), rel=1e-6)


def test_number_of_boxes_is_averaged_across_processes(monkeypatch):
    outputs, targets = random_outputs(3, [2, 1])
    loss = SetCriterion(K, aux_loss=False)
    local = loss(outputs, targets)
    other_rank = 7.0  # boxes in the other process's batch

    def all_reduce(tensor):
        tensor += other_rank

    monkeypatch.setattr(criterion.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(criterion.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(criterion.dist, "get_world_size", lambda: 2)
    assert criterion.average_num_boxes(targets, torch.device("cpu")) == (3 + other_rank) / 2
    shared = loss(outputs, targets)
    for name in ("loss_bbox", "loss_giou"):  # divided by 5 boxes per process instead of this process's 3
        assert shared[name].item() == pytest.approx(local[name].item() * 3 / 5, rel=1e-6)
    assert shared["loss_ce"].item() == pytest.approx(local["loss_ce"].item(), rel=1e-6)


def test_auxiliary_layers_are_matched_and_weighed_like_the_last():
    outputs, targets = random_outputs(4, [2, 3])
    aux = [random_outputs(5 + i, [2, 3])[0] for i in range(2)]
    weights = {"loss_ce": 2.0, "loss_giou": 0.5}
    loss = SetCriterion(K, weights=weights)
    losses = loss({**outputs, "aux_outputs": aux}, targets)
    alone = SetCriterion(K, aux_loss=False)
    for i, layer in enumerate(aux):
        for name, value in alone(layer, targets).items():
            if name != "total":
                assert losses[f"{name}_{i}"].item() == pytest.approx(value.item(), rel=1e-6)
    used = {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 0.5}
    expected = sum(
        used[name.removesuffix("_0").removesuffix("_1")] * v for name, v in losses.items() if name != "total"
    )
    assert losses["total"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert set(SetCriterion(K, aux_loss=False)({**outputs, "aux_outputs": aux}, targets)) == {
        "loss_ce",
        "loss_bbox",
        "loss_giou",
        "total",
    }


def test_gradients_reach_logits_and_boxes():
    outputs, targets = random_outputs(6, [2, 2])
    leaves = {k: v.float().requires_grad_() for k, v in outputs.items()}
    SetCriterion(K)(leaves, targets)["total"].backward()
    assert all(v.grad is not None and v.grad.abs().sum() > 0 and v.grad.isfinite().all() for v in leaves.values())


def test_criterion_errors():
    outputs, targets = random_outputs(0, [1, 1])
    with pytest.raises(ValueError, match=r"expected pred_logits \(B, Q, 4\) for 3 classes"):
        SetCriterion(3)(outputs, targets)
    with pytest.raises(ValueError, match="unknown loss weights"):
        SetCriterion(K, weights={"loss_class": 1.0})
    with pytest.raises(ValueError, match="use the same for both"):
        SetCriterion(K, matcher=HungarianMatcher(), classification="focal")
    with pytest.raises(ValueError, match="classification must be one of"):
        SetCriterion(K, classification="bce")


def test_a_model_without_a_no_object_logit_is_read_by_its_k_logits():
    """Deformable DETR's K sigmoid logits: the focal loss and its matching read all K (the last class a real one),
    the same as the first K of a model with a "no object" logit; the softmax cross-entropy refuses them."""
    outputs, targets = random_outputs(3, [2, 3])
    targets[0]["labels"][0] = K - 1  # the last class is a class
    k_only = {**outputs, "pred_logits": outputs["pred_logits"][..., :K]}  # (B, Q, K)
    loss = criterion_for("focal", K, aux_loss=False, no_object_logit=False)
    assert loss.matcher.no_object_logit is False
    losses = loss(k_only, targets)
    expected = reference_losses(k_only, targets, loss.matcher(k_only, targets), "focal")
    for name, value in expected.items():
        assert losses[name].item() == pytest.approx(value, rel=1e-5), name
    with_no_object = criterion_for("focal", K, aux_loss=False)(outputs, targets)
    torch.testing.assert_close(with_no_object, losses)  # the "no object" logit plays no part in "focal"
    with pytest.raises(ValueError, match=r"expected pred_logits \(B, Q, 5\) for 5 classes, no 'no object' logit"):
        loss(outputs, targets)
    with pytest.raises(ValueError, match="has K sigmoid class logits and no 'no object' logit: use 'focal'"):
        criterion_for("ce", K, no_object_logit=False)
    with pytest.raises(ValueError, match="has K sigmoid class logits and no 'no object' logit: use 'focal'"):
        SetCriterion(K, no_object_logit=False)
    with pytest.raises(ValueError, match="no_object_logit=True and the loss with no_object_logit=False"):
        SetCriterion(K, HungarianMatcher(classification="focal"), classification="focal", no_object_logit=False)


def with_proposals(seed=4, sizes=(2, 3), tokens=10):
    """K-logit outputs (no "no object") with an auxiliary layer and the encoder's proposals over `tokens` tokens."""
    outputs, targets = random_outputs(seed, list(sizes))
    g = torch.Generator().manual_seed(seed + 100)
    outputs["pred_logits"] = outputs["pred_logits"][..., :K]
    outputs["aux_outputs"] = [{k: v + 0.1 for k, v in outputs.items()}]
    outputs["enc_outputs"] = {
        "pred_logits": torch.randn(len(sizes), tokens, K, generator=g, dtype=torch.float64),
        "pred_boxes": torch.rand(len(sizes), tokens, 4, generator=g, dtype=torch.float64) * 0.4 + 0.1,
    }
    return outputs, targets


def test_encoder_proposals_are_matched_class_agnostically_and_weighed_like_the_rest():
    outputs, targets = with_proposals()
    loss = criterion_for("focal", K, aux_loss=True, no_object_logit=False)
    losses = loss(outputs, targets)
    assert set(losses) == {f"loss_{n}{s}" for n in ("ce", "bbox", "giou") for s in ("", "_0", "_enc")} | {"total"}
    # every box taken as class 0, as the paper's code does (fundamentalvision/Deformable-DETR's SetCriterion)
    agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
    enc = outputs["enc_outputs"]
    indices = loss.matcher(enc, agnostic)
    expected = reference_losses(enc, agnostic, indices, "focal")
    for name, value in expected.items():
        assert losses[name + "_enc"].item() == pytest.approx(value, rel=1e-5), name
    real = loss.matcher(enc, targets)  # the real labels would match otherwise
    assert any(not torch.equal(a, b) for (a, _), (b, _) in zip(indices, real, strict=True))
    weights = {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0}  # the focal loss's
    total = sum(weights[name.rsplit("_", 1)[0] if name.count("_") > 1 else name] * v for name, v in losses.items()
                if name != "total")  # fmt: skip
    assert losses["total"].item() == pytest.approx(total.item(), rel=1e-6)
    # without the auxiliary losses, neither the earlier layers nor the proposals are supervised (as the paper's code)
    assert set(criterion_for("focal", K, aux_loss=False, no_object_logit=False)(outputs, targets)) == {
        "loss_ce", "loss_bbox", "loss_giou", "total"
    }  # fmt: skip


def test_proposals_that_find_every_box_on_class_0_cost_nothing():
    outputs, targets = with_proposals(sizes=(3, 0, 2))
    enc = outputs["enc_outputs"]
    enc["pred_logits"].fill_(-30.0)
    for i, target in enumerate(targets):
        tokens = torch.arange(len(target["labels"])) * 2 + 1
        enc["pred_boxes"][i, tokens] = target["boxes"].double()
        enc["pred_logits"][i, tokens, 0] = 30.0  # class 0, whatever the box's class
    losses = criterion_for("focal", K, no_object_logit=False)(outputs, targets)
    for name in ("loss_ce_enc", "loss_bbox_enc", "loss_giou_enc"):
        assert losses[name].item() == pytest.approx(0.0, abs=1e-5), name
    assert losses["loss_ce"] > 0.1  # the decoder's random predictions do cost
    with pytest.raises(ValueError, match=r"expected enc_outputs' pred_logits \(B, Q, 5\)"):
        criterion_for("focal", K, no_object_logit=False)(
            {**outputs, "enc_outputs": {**enc, "pred_logits": enc["pred_logits"][..., :2]}}, targets
        )


def test_paired_giou_loss_is_torchvisions_in_value_and_gradient():
    """The criterion's GIoU loss (clamped intersection, no boolean indexing) against torchvision's
    `generalized_box_iou_loss` in float64: overlapping, nested, touching and disjoint pairs, values and gradients."""
    from torchvision.ops import generalized_box_iou_loss

    g = torch.Generator().manual_seed(3)
    corner = torch.rand(64, 2, generator=g, dtype=torch.float64) * 0.7
    first = torch.cat([corner, corner + 0.05 + torch.rand(64, 2, generator=g, dtype=torch.float64) * 0.3], 1)
    second = first[torch.randperm(64, generator=g)]  # random pairs: most disjoint, some overlapping
    special = torch.tensor(
        [
            [[0.1, 0.1, 0.5, 0.5], [0.2, 0.2, 0.3, 0.3]],  # nested
            [[0.1, 0.1, 0.3, 0.3], [0.3, 0.1, 0.5, 0.3]],  # touching along an edge
            [[0.1, 0.1, 0.2, 0.2], [0.6, 0.7, 0.9, 0.8]],  # disjoint on both axes
            [[0.1, 0.1, 0.4, 0.2], [0.2, 0.5, 0.3, 0.9]],  # overlapping on x only
        ],
        dtype=torch.float64,
    )
    a = torch.cat([first, special[:, 0]]).requires_grad_()
    b = torch.cat([second, special[:, 1]]).requires_grad_()
    ours = criterion.paired_giou_loss(a, b)
    theirs = generalized_box_iou_loss(a, b, reduction="none")
    assert (ours > 1).any() and (ours < 1).any()  # both disjoint and overlapping pairs are there
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    weights = torch.rand(len(a), generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((ours * weights).sum(), (a, b))
    expected = torch.autograd.grad((theirs * weights).sum(), (a, b))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def waits(fn):
    """The host-side reads of tensor values (`.item()`, `bool(tensor)`: `_local_scalar_dense`) and `nonzero` calls
    (each a wait for a GPU) that `fn` makes, its backward included: {op: count}."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {"_local_scalar_dense": 0, "nonzero": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in counts:
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return counts


@pytest.mark.parametrize("classification", ["ce", "focal"])
def test_the_host_waits_for_the_device_as_often_whatever_the_images_and_layers(classification):
    """On a GPU each read of a value on the host waits for the device: the criterion reads two (the labels' range
    check, the matching costs' finiteness on their one copy to the host), not one or more an image and layer, and
    computes no `nonzero` (torchvision's GIoU loss and boolean indexing do, forward and backward)."""
    seen = []
    for sizes, layers in (((2, 1), 1), ((3, 0, 2, 4, 1, 2), 6)):
        outputs, targets = random_outputs(5, sizes, queries=8)
        outputs = {k: v.requires_grad_() for k, v in outputs.items()}
        outputs["aux_outputs"] = [{k: v * (1 + i / 10) for k, v in outputs.items()} for i in range(layers - 1)]
        loss = SetCriterion(K, classification=classification)

        def step(outputs=outputs, targets=targets, loss=loss):
            loss(outputs, targets)["total"].backward()

        seen.append(waits(step))
    assert seen[0] == seen[1] == {"_local_scalar_dense": 2, "nonzero": 0}
