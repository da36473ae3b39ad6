"""DETR's outputs as pixel boxes (against transformers')."""

import math
import types

import pytest
import torch
import transformers

import vitkit
from vitkit.detection import Postprocessing, postprocess


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
        assert set(mine) == {"boxes", "scores", "labels", "queries"}
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


@pytest.mark.parametrize(("top_k", "threshold"), [(100, 0.0), (7, 0.0), (50, 0.3)])
def test_top_k_equals_deformable_detr(top_k, threshold):
    # Deformable DETR scores the sigmoid of every real class; transformers' processor takes those K logits.
    outputs = random_outputs()
    sizes = [(480, 640), (300, 200), (17, 33)]
    ours = postprocess(outputs, sizes, threshold=threshold, classification="focal", top_k=top_k)
    theirs = transformers.DeformableDetrImageProcessor().post_process_object_detection(
        types.SimpleNamespace(logits=outputs["pred_logits"][..., :-1], pred_boxes=outputs["pred_boxes"]),
        threshold=threshold,
        target_sizes=torch.tensor(sizes),
        top_k=top_k,
    )
    for mine, ref in zip(ours, theirs, strict=True):
        assert len(mine["scores"]) == len(ref["scores"]) <= min(top_k, 20 * 6)
        torch.testing.assert_close(mine["boxes"], ref["boxes"])
        torch.testing.assert_close(mine["scores"], ref["scores"])
        assert torch.equal(mine["labels"], ref["labels"])


def test_top_k_offers_a_second_class_of_an_unsure_query():
    # Query 0 is torn between classes 0 and 1; query 1 is sure of class 2. DETR keeps one class per query.
    logits = torch.tensor([[[2.0, 1.9, -5.0, -5.0], [-5.0, -5.0, 4.0, -5.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1]]])
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    (one,) = postprocess(outputs, [(10, 10)], threshold=0.0)
    assert one["labels"].tolist() == [0, 2]
    (pairs,) = postprocess(outputs, [(10, 10)], threshold=0.0, top_k=3)
    probs = logits.softmax(-1)[0, :, :-1]
    assert pairs["labels"].tolist() == [2, 0, 1]  # most probable first
    torch.testing.assert_close(pairs["scores"], torch.stack([probs[1, 2], probs[0, 0], probs[0, 1]]))
    torch.testing.assert_close(pairs["boxes"][1], pairs["boxes"][2])  # both pairs of query 0 carry its box
    assert one["queries"].tolist() == [0, 1] and pairs["queries"].tolist() == [1, 0, 0]
    torch.testing.assert_close(pairs["boxes"][1], torch.tensor([4.0, 4.0, 6.0, 6.0]))
    # What predict and attention show: the saved reading with one class per query, its other settings kept.
    saved = Postprocessing("ce", top_k=3, nms_iou=0.7, threshold=0.3)
    shown = saved.one_per_query()
    assert shown == Postprocessing("ce", top_k=None, nms_iou=0.7, threshold=0.3)
    (read,) = shown(outputs, [(10, 10)], 0.0)
    assert read["labels"].tolist() == [2, 0] and read["queries"].tolist() == [1, 0]  # most probable first (nms)
    assert saved(outputs, [(10, 10)], 0.0)[0]["queries"].tolist() == [1, 0, 0]


def test_nms_drops_a_less_probable_duplicate_of_the_same_class():
    # Queries 0 and 1 predict the same digit box (IoU 0.81); query 2 the same box as another class; query 3 a box
    # of the same class elsewhere. Only query 1, the less probable duplicate, goes.
    boxes = torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.5, 0.5, 0.36, 0.36], [0.5, 0.5, 0.4, 0.4], [0.1, 0.1, 0.1, 0.1]]])
    logits = torch.full((1, 4, 4), -5.0)
    logits[0, 0, 1], logits[0, 1, 1], logits[0, 2, 0], logits[0, 3, 1] = 5.0, 3.0, 2.0, 1.0
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    (plain,) = postprocess(outputs, [(100, 100)], threshold=0.0)
    assert plain["labels"].tolist() == [1, 1, 0, 1]
    (kept,) = postprocess(outputs, [(100, 100)], threshold=0.0, nms_iou=0.8)
    scores = plain["scores"]
    torch.testing.assert_close(kept["scores"], scores[[0, 2, 3]])
    assert kept["labels"].tolist() == [1, 0, 1] and kept["queries"].tolist() == [0, 2, 3]
    (loose,) = postprocess(outputs, [(100, 100)], threshold=0.0, nms_iou=0.85)  # 0.81 is below: both stay
    assert len(loose["scores"]) == 4


def test_top_k_and_nms_errors():
    outputs = random_outputs(batch=1)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="top_k must be a positive integer or None"):
            postprocess(outputs, [(1, 1)], top_k=bad)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="nms_iou must be in \\(0, 1\\] or None"):
            postprocess(outputs, [(1, 1)], nms_iou=bad)


def test_the_default_reading_follows_the_models_class_logits(tmp_path):
    from vitkit.detection import Postprocessing
    from vitkit.infer import detection_reading

    assert Postprocessing.default(True) == Postprocessing()  # DETR's PostProcess
    paper = Postprocessing.default(False)  # Deformable DETR's: sigmoid, the 100 best (query, class) pairs
    assert (paper.classification, paper.top_k, paper.nms_iou, paper.no_object_logit) == ("focal", 100, None, False)
    with pytest.raises(ValueError, match="no 'no object' logit"):
        Postprocessing("ce", no_object_logit=False)
    # a directory without postprocess settings (save_pretrained, convert) is read as its model's logits say
    model = vitkit.create_model(
        "deformable_detr_digits", hidden_dim=32, num_heads=2, dim_feedforward=32, backbone_width=8, num_classes=3
    )
    vitkit.save_pretrained(model, tmp_path)
    assert detection_reading(vitkit.from_pretrained(tmp_path)) == paper
    detr = vitkit.create_model("detr_tiny", backbone_width=8, hidden_dim=32, dim_feedforward=32, num_classes=3)
    vitkit.save_pretrained(detr, tmp_path / "detr")
    assert detection_reading(vitkit.from_pretrained(tmp_path / "detr")) == Postprocessing()


def test_a_reading_for_the_other_class_logits_is_refused(tmp_path):
    import json

    from vitkit.detection import Postprocessing
    from vitkit.infer import detect, detection_reading
    from vitkit.infer.detect import reading
    from vitkit.weights import ModelInfo

    deformable = vitkit.create_model(
        "deformable_detr_digits", hidden_dim=32, num_heads=2, dim_feedforward=32, backbone_width=8, num_classes=3
    )
    detr = vitkit.create_model("detr_tiny", backbone_width=8, hidden_dim=32, dim_feedforward=32, num_classes=3)
    # Deformable DETR's K logits read as K + 1 would lose the last class; DETR's "no object" read as a class
    with pytest.raises(ValueError, match="predicts them without one: read them with no_object_logit=False"):
        reading(deformable, Postprocessing("focal", top_k=100))
    with pytest.raises(ValueError, match="predicts them with one: read them with no_object_logit=True"):
        reading(detr, Postprocessing("focal", no_object_logit=False))
    assert reading(detr, None) == Postprocessing() and reading(deformable, None) == Postprocessing.default(False)
    with pytest.raises(ValueError, match="no_object_logit=False"):
        detect(deformable, None, [object()], postprocessing=Postprocessing("focal"))
    # saved settings without the key take the model's declaration; ones that contradict it name the file
    vitkit.save_pretrained(deformable, tmp_path, ModelInfo(postprocess={"classification": "focal", "top_k": 50}))
    loaded = vitkit.from_pretrained(tmp_path)
    assert detection_reading(loaded, tmp_path) == Postprocessing("focal", top_k=50, no_object_logit=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["postprocess"]["no_object_logit"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: .*: the postprocessing reads class logits with a"):
        detection_reading(vitkit.from_pretrained(tmp_path), tmp_path)


def test_detections_are_clipped_to_their_image():
    """`detect` clips boxes to the image (a DETR box may reach past it; `postprocess`, which evaluation scores,
    keeps them as DETR's does): an untrained detector's boxes are all inside, and some were not before."""
    import numpy as np
    from PIL import Image

    from vitkit.detection import postprocess
    from vitkit.infer import detect
    from vitkit.infer.detect import detector_inputs, detector_outputs
    from vitkit.weights import ModelInfo

    torch.manual_seed(0)
    model = vitkit.create_model("detr_tiny", backbone_width=8, hidden_dim=32, dim_feedforward=32, num_classes=3).eval()
    with torch.no_grad():
        model.bbox_embed.layers[-1].bias.copy_(torch.tensor([0.0, 0.0, 3.0, 3.0]))  # wide boxes about the centre
    info = ModelInfo(("a", "b", "c"), (0.5,) * 3, (0.25,) * 3, category_ids=(1, 2, 3))
    images = [Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 90, 3), dtype=np.uint8)) for i in (0, 1)]
    pixels, mask, sizes = detector_inputs(model, info, images)
    raw = postprocess(detector_outputs(model, pixels, mask), sizes, threshold=0.0)
    assert any((r["boxes"][:, :2] < 0).any() or (r["boxes"][:, 2] > 90).any() for r in raw)
    for found, unclipped in zip(detect(model, info, images, threshold=0.0), raw, strict=True):
        boxes = torch.tensor([d.box for d in found])
        assert len(found) == len(unclipped["boxes"]) and (boxes >= 0).all()
        assert (boxes[:, [0, 2]] <= 90).all() and (boxes[:, [1, 3]] <= 40).all()
