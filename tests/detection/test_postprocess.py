"""Padding a batch of images of different sizes, and DETR's outputs as pixel boxes (against transformers')."""

import math
import types

import pytest
import torch
import transformers

from vitkit.detection import pad_images, postprocess


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


def random_outputs(batch: int = 3, queries: int = 20, classes: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(batch, queries, classes + 1, generator=g)  # spread: some queries clear 0.5
    boxes = torch.rand(batch, queries, 4, generator=g) * 0.5 + 0.25
    return {"pred_logits": logits, "pred_boxes": boxes, "aux_outputs": []}


@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.7])
def test_postprocess_equals_transformers(threshold):
    outputs = random_outputs()
    sizes = [(480, 640), (300, 200), (17, 33)]
    ours = postprocess(outputs, sizes, threshold=threshold)
    theirs = transformers.DetrImageProcessor().post_process_object_detection(
        types.SimpleNamespace(logits=outputs["pred_logits"], pred_boxes=outputs["pred_boxes"]),
        threshold=threshold,
        target_sizes=torch.tensor(sizes),
    )
    assert len(ours) == 3
    for mine, ref in zip(ours, theirs, strict=True):
        assert set(mine) == {"boxes", "scores", "labels"}
        torch.testing.assert_close(mine["boxes"], ref["boxes"])
        torch.testing.assert_close(mine["scores"], ref["scores"])
        assert torch.equal(mine["labels"], ref["labels"])
    kept = sum(len(r["scores"]) for r in ours)
    assert kept == 60 if threshold == 0 else 0 < kept < 60


def test_postprocess_reads_boxes_as_detr_does():
    # One query: centre (0.5, 0.25), size (0.5, 0.5) of a 100 x 200 (H x W) image; class 1 of 2 clearly.
    outputs = {"pred_logits": torch.tensor([[[0.0, 10.0, 0.0]]]), "pred_boxes": torch.tensor([[[0.5, 0.25, 0.5, 0.5]]])}
    (result,) = postprocess(outputs, torch.tensor([[100, 200]]))
    torch.testing.assert_close(result["boxes"], torch.tensor([[50.0, 0.0, 150.0, 50.0]]))
    assert result["labels"].tolist() == [1] and result["scores"].item() > 0.99
    # "no object" never wins a label: its probability is dropped before the max.
    outputs["pred_logits"] = torch.tensor([[[0.0, 1.0, 10.0]]])
    (result,) = postprocess(outputs, [(100, 200)], threshold=0.0)
    assert result["labels"].tolist() == [1] and result["scores"].item() < 0.01


def test_postprocess_errors():
    outputs = random_outputs(batch=2)
    with pytest.raises(ValueError, match="one \\(height, width\\) per image: \\(2, 2\\), got \\(3, 2\\)"):
        postprocess(outputs, [(1, 1)] * 3)
    with pytest.raises(ValueError, match="'pred_boxes' is missing"):
        postprocess({"pred_logits": outputs["pred_logits"]}, [(1, 1)] * 2)
    with pytest.raises(ValueError, match="threshold must be in \\[0, 1\\), got 1.5"):
        postprocess(outputs, [(1, 1)] * 2, threshold=1.5)
    with pytest.raises(ValueError, match="pred_boxes \\(B, Q, 4\\)"):
        postprocess({**outputs, "pred_boxes": outputs["pred_boxes"][:, :3]}, [(1, 1)] * 2)


def test_postprocess_of_a_focal_model_scores_each_class_by_sigmoid():
    outputs = random_outputs()
    sizes = [(480, 640), (300, 200), (17, 33)]
    ours = postprocess(outputs, sizes, threshold=0.0, classification="focal")
    logits = outputs["pred_logits"]
    for i, result in enumerate(ours):
        for q in range(logits.shape[1]):
            real = logits[i, q, :-1].tolist()  # the "no object" logit plays no part
            best = max(range(len(real)), key=real.__getitem__)
            assert result["labels"][q].item() == best
            assert result["scores"][q].item() == pytest.approx(1 / (1 + math.exp(-real[best])), rel=1e-6)
    softmax = postprocess(outputs, sizes, threshold=0.0)
    for mine, ref in zip(ours, softmax, strict=True):
        torch.testing.assert_close(mine["boxes"], ref["boxes"])
    outputs["pred_logits"][..., -1] += 100.0
    again = postprocess(outputs, sizes, threshold=0.0, classification="focal")
    assert all(torch.equal(a["scores"], b["scores"]) for a, b in zip(ours, again, strict=True))
    with pytest.raises(ValueError, match="classification must be 'ce' or 'focal'"):
        postprocess(outputs, sizes, classification="sigmoid")
