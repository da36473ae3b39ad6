"""Training a detector with `fit`: the task follows the model and the data, the outputs, the logged mAP against
pycocotools run on the files, the box-classification aid, what a detection and its attention map are, and
recipes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

import vitkit
from vitkit import from_pretrained
from vitkit.detection import COCO_METRICS, Postprocessing
from vitkit.infer import detect_files, detection_attention, detection_reading, evaluate_detector_dir, inference_info
from vitkit.train import DEFAULT_DETECTOR, TrainConfig, fit, load_checkpoint, recipe_for
from vitkit.weights import read_model_info

# deformable_detr_digits' layout as small as the fixture's DETR (D a multiple of 32, its GroupNorm groups)
TINY_DEFORMABLE_DETR = {
    "backbone_width": 8, "hidden_dim": 32, "num_heads": 2, "dim_feedforward": 32, "num_queries": 6, "enc_layers": 1,
    "dec_layers": 2,
}  # fmt: skip
METRICS = {"epoch", "train_loss", "loss_ce", "loss_bbox", "loss_giou", "loss_box_cls", *COCO_METRICS}
METRICS |= {"lr", "seconds", "images_per_second", "skipped"}
PER_CLASS = {f"ap/{digit}" for digit in range(10)}  # each class's AP, logged for up to 10 classes


def _explicit_outputs(model_dir: Path, path: Path) -> dict[str, torch.Tensor]:
    """The model's last-layer predictions on one image file, preprocessed with PIL and numpy only (the canvases are
    96x96, the model's size already)."""
    model = from_pretrained(model_dir).eval()
    info = read_model_info(model_dir)
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
    x = (torch.from_numpy(pixels) - torch.tensor(info.mean)) / torch.tensor(info.std)  # (H, W, 3)
    with torch.no_grad():
        out = model(x.permute(2, 0, 1)[None])
    return {"logits": out["pred_logits"][0], "boxes": out["pred_boxes"][0]}  # (Q, K + 1), (Q, 4)


def _iou(a: list[float], b: list[float]) -> float:
    """IoU of two (x, y, w, h) boxes."""
    w = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


def _explicit_map(model_dir: Path, coco_root: Path) -> list[float]:
    """pycocotools' six box metrics of the model on the val split, from the instances file and the image files,
    read as the model's saved postprocess settings say: every query a detection of its most probable class (DETR's
    PostProcess), or the top_k most probable (query, class) pairs (Deformable DETR's); then, with nms_iou, each
    detection dropped that overlaps a more probable kept one of its class above that IoU."""
    settings = read_model_info(model_dir).postprocess
    annotations = coco_root / "annotations" / "instances_val.json"
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(annotations))
    results = []
    for image in truth.dataset["images"]:
        out = _explicit_outputs(model_dir, coco_root / "val" / image["file_name"])
        probs = out["logits"].softmax(-1)[:, :-1].tolist()  # (Q, K)
        if settings["top_k"] is None:
            pairs = [(max(p), q, p.index(max(p))) for q, p in enumerate(probs)]
        else:
            pairs = sorted(((p[k], q, k) for q, p in enumerate(probs) for k in range(len(p))), reverse=True)
            pairs = pairs[: settings["top_k"]]
        W, H = image["width"], image["height"]
        found = []
        for score, q, label in sorted(pairs, reverse=True):
            cx, cy, w, h = out["boxes"][q].tolist()
            box = [(cx - w / 2) * W, (cy - h / 2) * H, w * W, h * H]
            iou = settings["nms_iou"]
            if iou is None or all(f[0] != label or _iou(f[1], box) <= iou for f in found):
                found.append((label, box, score))
        results += [{"image_id": image["id"], "category_id": c, "bbox": b, "score": s} for c, b, s in found]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(truth, truth.loadRes(results), iouType="bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return [float(v) if v >= 0 else math.nan for v in evaluation.stats[:6]]  # -1: nothing to score


def test_fit_trains_a_detector_and_logs_what_pycocotools_finds(tmp_path, tiny_detector_config, digits_coco):
    result = fit(tiny_detector_config(tmp_path))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2] and all(set(m) == METRICS | PER_CLASS for m in lines)
    assert result.best_metric == "ap" and result.last == lines[-1]
    best = max(lines, key=lambda m: m["ap"])
    assert result.best_value == best["ap"] and result.best_epoch == best["epoch"]
    with pytest.raises(ValueError, match="a detector has no accuracy"):
        _ = result.best_acc
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["clip_grad"] == 0.1 and saved["label_smoothing"] is None and saved["detection_loss"] == "ce"
    for name in ("best", "final"):
        saved = read_model_info(tmp_path / name)
        assert saved.classes == tuple("0123456789") and saved.category_ids == tuple(range(10))
        settings = detection_reading(from_pretrained(tmp_path / name))  # with the threshold its evaluation chose
        assert dataclasses.replace(settings, threshold=None) == Postprocessing("ce", top_k=100, nms_iou=0.7)
        chosen = evaluate_detector_dir(str(tmp_path / name))[0].threshold  # None where nothing was found
        assert settings.threshold == (None if chosen is None else pytest.approx(chosen))
    final = from_pretrained(tmp_path / "final")
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert all(torch.equal(v, state["model"][k]) for k, v in final.state_dict().items())
    assert set(state["task"]) == {"box_head"}  # the box classifier trains with the run but is not part of the model
    expected = _explicit_map(tmp_path / "final", digits_coco)
    logged = [math.nan if lines[-1][k] is None else lines[-1][k] for k in COCO_METRICS]
    np.testing.assert_allclose(logged, expected, rtol=1e-6, atol=1e-9)


def test_evaluation_is_pycocotools_on_the_files(tmp_path, tiny_detector_config, digits_coco):
    """A detector planted to predict one ground-truth box of the first canvas from every query scores what
    pycocotools scores from the instances file and the image files (an untrained model scores 0 either way)."""
    fit(tiny_detector_config(tmp_path / "run", epochs=1))
    model = from_pretrained(tmp_path / "run" / "final")
    truth = json.loads((digits_coco / "annotations" / "instances_val.json").read_text())
    planted = truth["annotations"][0]
    x, y, w, h = (v / 96 for v in planted["bbox"])
    box = torch.tensor([x + w / 2, y + h / 2, w, h])
    with torch.no_grad():
        model.bbox_embed.layers[2].weight.zero_()
        model.bbox_embed.layers[2].bias.copy_(torch.logit(box))  # every query: this box
        model.class_embed.weight.zero_()
        model.class_embed.bias.zero_()
        model.class_embed.bias[planted["category_id"]] = 5.0  # ... of this class
    directory = tmp_path / "planted"
    vitkit.save_pretrained(model, directory, read_model_info(tmp_path / "run" / "final"))
    result, _ = evaluate_detector_dir(str(directory), device="cpu")
    expected = _explicit_map(directory, digits_coco)
    assert expected[1] > 0  # the planted box is found at IoU 0.5
    np.testing.assert_allclose([result.metrics[k] for k in COCO_METRICS], expected, rtol=1e-6, atol=1e-9)


def test_box_classification_trains_only_when_asked(tmp_path, tiny_detector_config):
    plain = fit(tiny_detector_config(tmp_path / "plain", epochs=1, box_cls_loss=0.0))
    assert "loss_box_cls" not in plain.last
    assert load_checkpoint(tmp_path / "plain" / "checkpoint.pt")["task"] == {}
    aided = fit(tiny_detector_config(tmp_path / "aided", epochs=1, box_cls_loss=2.0))
    parts = aided.last
    # train_loss is the set loss (1 * ce + 5 * L1 + 2 * GIoU on the last and the auxiliary layer) plus 2 * box_cls:
    # at least the last layer's weighted parts and the box term, each averaged over the same images.
    assert parts["train_loss"] > parts["loss_ce"] + 5 * parts["loss_bbox"] + 2 * parts["loss_giou"]
    assert parts["train_loss"] > 2 * parts["loss_box_cls"] > 0
    assert not torch.equal(
        from_pretrained(tmp_path / "plain" / "final").backbone.conv1.weight,
        from_pretrained(tmp_path / "aided" / "final").backbone.conv1.weight,
    )


@pytest.mark.parametrize(
    ("model", "model_args"),
    [
        ("detr_digits", {}),
        ("deformable_detr_digits", TINY_DEFORMABLE_DETR),
        ("deformable_detr_small", {**TINY_DEFORMABLE_DETR, "dn_queries": 12, "mixed_queries": True}),
    ],
)
def test_every_detection_option_runs(tmp_path, tiny_detector_config, model, model_args):
    """Every option at once, for DETR (K + 1 logits) and Deformable DETR (K logits, no "no object")."""
    chosen = {"model": model, "model_args": model_args} if model_args else {}  # {}: the fixture's tiny DETR
    config = tiny_detector_config(
        tmp_path, epochs=1, precision="bf16", ema_decay=0.9, grad_checkpointing=True, workers=1,
        detection_loss="focal", backbone_lr=1e-5, img_size=64, clip_grad=0.0, **chosen,
    )  # fmt: skip
    result = fit(config)
    assert all(np.isfinite(result.last[k]) for k in ("train_loss", "loss_ce", "ap"))
    if "dn_queries" in model_args:  # the denoising terms, weighted as in the total: part of the training loss
        assert result.last["train_loss"] > result.last["loss_dn"] > 0
    settings = detection_reading(from_pretrained(tmp_path / "final"))
    assert settings.classification == "focal" and settings.no_object_logit == (model == "detr_digits")
    chosen = evaluate_detector_dir(str(tmp_path / "final"), precision="bf16")[0].threshold  # the last evaluation's
    assert settings.threshold == (None if chosen is None else pytest.approx(chosen))  # best F1 (None: none found)
    final = from_pretrained(tmp_path / "final")
    assert final.config.img_size == 64
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert all(torch.equal(v, state["ema"][k]) for k, v in final.state_dict().items())
    groups = state["optimizer"]["param_groups"]
    lr = recipe_for("detection", model or "detr_digits").lr  # the model's recipe; the backbone's as given
    assert [g["initial_lr"] for g in groups] == [lr, lr, 1e-5, 1e-5]  # the rest (box head too), the backbone


def test_the_data_picks_the_default_detector_and_its_recipe(tmp_path, digits_coco):
    recipe = recipe_for("detection", DEFAULT_DETECTOR)
    # digits-detect: 4000 canvases of 96 x 96 a epoch, the budget's 1.8e8 pixels in 5 epochs; the folder: 24
    # canvases, 1.8e8 / (24 * 96 * 96) = 814 epochs, kept to the most (200), batches of 2 (24 // 32 is less)
    for data, epochs, batch in (("builtin:digits-detect", 5, 16), (str(digits_coco), 200, 2)):
        config = TrainConfig(data=data).resolved()
        assert config.task == "detection" and config.model == DEFAULT_DETECTOR == "deformable_detr_small"
        assert (config.lr, config.backbone_lr, config.clip_grad, config.box_cls_loss) == (
            recipe.lr, recipe.backbone_lr, recipe.clip_grad, 0.0
        )  # fmt: skip
        assert (config.img_size, config.epochs, config.batch_size, config.model_args) == (96, epochs, batch, {})
    given = TrainConfig(data="builtin:digits-detect", img_size=128, batch_size=4).resolved()
    assert (given.img_size, given.epochs, given.batch_size) == (128, 3, 4)  # 1.8e8 / (4000 * 128 * 128) = 2.7
    detr = TrainConfig(data="builtin:digits-detect", model="detr_resnet50").resolved()
    assert (detr.lr, detr.backbone_lr, detr.weight_decay, detr.clip_grad) == (1e-4, 1e-5, 1e-4, 0.1)
    assert (detr.detection_loss, detr.box_cls_loss) == ("ce", 0.0)
    classifier = TrainConfig().resolved()
    assert classifier.task == "classification" and classifier.backbone_lr is None
    assert (classifier.lr, classifier.label_smoothing, classifier.epochs) == (2e-3, 0.1, 40)


def test_the_start_summary_says_what_the_data_chose(tmp_path, tiny_detector_config, caplog):
    """Options left unset that the default detector's recipe sizes from the data are printed with why; those given
    are not."""
    args = {**TINY_DEFORMABLE_DETR, "dn_queries": 12}
    config = tiny_detector_config(tmp_path, model="deformable_detr_small", model_args=args, epochs=1, batch_size=None)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(config)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert "  sized   img size 96: median shorter side 96 px\n" in summary
    assert "          batch size 2: 24 training images: 12 steps an epoch, more and smaller than" in summary
    assert "  augment flip 0.5, crop 0.5, shorter side 72-120 px\n" in summary  # a COCO folder's default
    assert "  epochs " not in summary.split("  sized")[1]  # given
    assert json.loads((tmp_path / "config.json").read_text())["img_size"] == 96


def test_a_run_in_tiles_trains_on_tiles_and_validates_whole_images_in_tiles(tmp_path, tiny_detector_config, caplog):
    """96 px canvases in tiles of 64: four tiles a canvas an epoch; the validation's AP is that of `vitkit eval` on
    the whole images in the model's tiles, which the saved model records."""
    config = tiny_detector_config(tmp_path, tile=64, epochs=1)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(config)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert "96 train tiles of 64 px an epoch, from 24 images / 8 val images (whole, in tiles)" in summary
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert read_model_info(tmp_path / "final").tile == 64
    result, _ = evaluate_detector_dir(str(tmp_path / "final"), device="cpu")
    assert result.count == 8 and result.metrics["ap"] == pytest.approx(row["ap"], abs=1e-9)
    whole, _ = evaluate_detector_dir(str(tmp_path / "final"), device="cpu", tile=0)  # whole images in one pass
    assert whole.count == 8


def test_a_model_that_does_not_fit_the_data_is_a_clear_error(digits_coco, digit_folder):
    with pytest.raises(ValueError, match="vit_digits_patch7_28.* is a classification model but builtin:digits-detect"):
        TrainConfig(data="builtin:digits-detect", model="vit_digits_patch7_28").resolved()
    with pytest.raises(ValueError, match="'detr_digits' is a detection model but builtin:mnist5k is classification"):
        TrainConfig(model="detr_digits").resolved()
    with pytest.raises(ValueError, match="is a detection model but .* is classification data"):
        fit(TrainConfig(data=str(digit_folder), model="detr_digits", out=str(digits_coco / "never")))
    with pytest.raises(ValueError, match=r"option\(s\) \['label_smoothing', 'mixup'\] do not apply to detection"):
        TrainConfig(data=str(digits_coco), label_smoothing=0.1, mixup=0.2).resolved()
    with pytest.raises(ValueError, match=r"option\(s\) \['backbone_lr'\] do not apply to classification"):
        TrainConfig(backbone_lr=1e-5).resolved()
    # the softmax cross-entropy needs a "no object" logit, which Deformable DETR does not have
    deformable = TrainConfig(data="builtin:digits-detect", model="deformable_detr_digits")
    assert deformable.resolved().detection_loss == "focal"
    with pytest.raises(ValueError, match=r"model 'deformable_detr_digits' \(Deformable DETR\) predicts K sigmoid"):
        dataclasses.replace(deformable, detection_loss="ce").resolved()
    with pytest.raises(ValueError, match="without a 'no object' logit: train it with detection_loss 'focal'"):
        fit(dataclasses.replace(deformable, detection_loss="ce", out=str(digits_coco / "never")))
    # a mask head needs masks to learn from: data without segmentations is refused before anything is written
    masks = TrainConfig(
        data=str(digits_coco),
        model="detr_digits",
        model_args={"masks": True, "num_heads": 8},
        out=str(digits_coco / "never"),
    )
    with pytest.raises(ValueError, match=r"'detr_digits' has a mask head \(masks=True\), but the training annotations"):
        fit(masks)
    assert not (digits_coco / "never").exists()


@pytest.fixture(scope="module")
def detector(tmp_path_factory, tiny_detector_config) -> Path:
    out = tmp_path_factory.mktemp("detector")
    fit(tiny_detector_config(out, epochs=1))
    return out / "final"


def test_detections_are_detrs_postprocess_of_the_model(detector, digits_coco):
    paths = sorted((digits_coco / "val").glob("*.png"))[:3]
    model = from_pretrained(detector)
    info = inference_info(model)
    for found, path in zip(detect_files(model, info, paths, threshold=0.0), paths, strict=True):
        out = _explicit_outputs(detector, path)
        scores, labels = out["logits"].softmax(-1)[:, :-1].max(-1)  # (Q,)
        order = scores.argsort(descending=True)
        cx, cy, w, h = (out["boxes"][order] * 96).unbind(-1)
        boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
        assert found.image == str(path) and found.size == (96, 96) and len(found.detections) == 6
        assert [d.label for d in found.detections] == [str(k) for k in labels[order].tolist()]
        assert [d.category_id for d in found.detections] == labels[order].tolist()
        np.testing.assert_allclose([d.score for d in found.detections], scores[order], rtol=1e-5)
        np.testing.assert_allclose([d.box for d in found.detections], boxes, rtol=1e-4, atol=1e-3)
    kept = detect_files(model, info, paths, threshold=0.2)
    for found, every in zip(kept, detect_files(model, info, paths, threshold=0.0), strict=True):
        assert found.detections == [d for d in every.detections if d.score > 0.2]


def test_each_detection_comes_with_its_querys_cross_attention(detector, digits_coco):
    path = sorted((digits_coco / "val").glob("*.png"))[0]
    model = from_pretrained(detector).eval()
    info = inference_info(model)
    detections, heats = detection_attention(model, info, Image.open(path), threshold=0.0, layer=-1)
    assert len(detections) == 6 and heats.shape == (6, 6, 6)  # every query; 96 px at stride 16
    torch.testing.assert_close(heats.sum((1, 2)), torch.ones(6))
    out = _explicit_outputs(detector, path)
    scores = out["logits"].softmax(-1)[:, :-1].max(-1).values
    order = scores.argsort(descending=True)
    pixels = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255)
    x = ((pixels - torch.tensor(info.mean)) / torch.tensor(info.std)).permute(2, 0, 1)[None]
    with torch.no_grad(), vitkit.capture_attention(model, ["decoder.layers.1.cross_attn"]) as maps:
        model(x)
    expected = maps["decoder.layers.1.cross_attn"][0].mean(0)[order].reshape(6, 6, 6)  # (heads, Q, N) -> (Q, h, w)
    torch.testing.assert_close(heats, expected)
    one, first_head = detection_attention(model, info, Image.open(path), 0.0, layer=0, head=1)
    with torch.no_grad(), vitkit.capture_attention(model, ["decoder.layers.0.cross_attn"]) as maps:
        model(x)
    torch.testing.assert_close(first_head, maps["decoder.layers.0.cross_attn"][0, 1][order].reshape(6, 6, 6))
    with pytest.raises(ValueError, match="layer 2 is out of range for a decoder of 2 layers"):
        detection_attention(model, info, Image.open(path), layer=2)


def test_how_a_run_reads_detections(tmp_path, digits_coco):
    """The small DETRs' recipe scores (query, class) pairs and suppresses duplicates; DETR keeps the paper's
    PostProcess; either can be changed, and neither option exists for a classifier."""
    small = TrainConfig(data=str(digits_coco), model="detr_digits", out=str(tmp_path)).resolved()
    assert (small.model, small.detection_top_k, small.nms_iou) == ("detr_digits", 100, 0.7)
    default = TrainConfig(data=str(digits_coco), out=str(tmp_path)).resolved()  # the top 100 pairs and NMS
    assert (default.model, default.detection_top_k, default.nms_iou) == ("deformable_detr_small", 100, 0.7)
    detr = TrainConfig(data=str(digits_coco), model="detr_resnet50", out=str(tmp_path)).resolved()
    assert (detr.detection_top_k, detr.nms_iou) == (0, 0.0)
    plain = TrainConfig(data=str(digits_coco), nms_iou=0.0, detection_top_k=0, out=str(tmp_path)).resolved()
    assert (plain.detection_top_k, plain.nms_iou) == (0, 0.0)
    with pytest.raises(ValueError, match=r"option\(s\) \['nms_iou'\] do not apply to classification"):
        TrainConfig(data="builtin:mnist5k", nms_iou=0.5, out=str(tmp_path)).resolved()
    with pytest.raises(ValueError, match=r"nms_iou must be in \[0, 1\] \(0 is off\), got 1.5"):
        TrainConfig(data=str(digits_coco), nms_iou=1.5)
    with pytest.raises(ValueError, match="detection_top_k must be >= 0, got -1"):
        TrainConfig(data=str(digits_coco), detection_top_k=-1)


def test_damaged_postprocess_settings_are_named(tmp_path):
    model = vitkit.create_model("detr_digits", num_classes=3)

    def saved(postprocess):
        vitkit.save_pretrained(model, tmp_path)
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "postprocess": postprocess}))
        return from_pretrained(tmp_path)

    with pytest.raises(
        ValueError, match=r"config.json: 'postprocess' is not a vitkit postprocess description: .*\['nms'\]"
    ):
        detection_reading(saved({"classification": "ce", "nms": 0.5}), tmp_path)
    with pytest.raises(ValueError, match=r"config.json: postprocess must be an object of postprocessing settings, got"):
        saved(["ce"])
    reading = detection_reading(saved({"classification": "ce", "top_k": 100}), tmp_path)
    assert reading == Postprocessing("ce", top_k=100)  # the other keys: DETR's
    assert detection_reading(vitkit.create_model("detr_digits")) == Postprocessing()  # nothing saved: the default


def test_a_folder_with_masks_trains_the_mask_head_and_says_so(tmp_path, caplog):
    """The shapes example's segmentations turn the default detector's mask head on: the summary says why, every
    step supervises the masks (their losses logged), and the saved model predicts them."""
    from vitkit.data.shapes import write_shapes_folder

    write_shapes_folder(tmp_path / "shapes", train=8, val=4)
    config = TrainConfig(
        data=str(tmp_path / "shapes"), model="deformable_detr_small", model_args=TINY_DEFORMABLE_DETR,
        out=str(tmp_path / "run"), epochs=1, batch_size=4, device="cpu",
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(config)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert "masks True: every training annotation has a segmentation: the mask head (pred_masks) trains" in summary
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert logged["loss_mask"] > 0 and logged["loss_dice"] > 0
    model = from_pretrained(tmp_path / "run" / "final").eval()
    assert model.config.masks
    with torch.no_grad():
        assert model.predict(torch.randn(1, 3, 64, 64))["pred_masks"].shape == (1, model.config.num_queries, 16, 16)


def test_a_model_whose_mask_head_cannot_be_built_trains_boxes_and_says_why(tmp_path):
    """detr_digits' width (128 with 4 heads) gives DETR's mask head widths GroupNorm cannot divide: on a folder with
    segmentations the run resolves to boxes only, saying why, instead of failing."""
    from vitkit.data.shapes import write_shapes_folder

    write_shapes_folder(tmp_path / "shapes", train=8, val=4)
    config = TrainConfig(data=str(tmp_path / "shapes"), model="detr_digits", out=str(tmp_path / "run"), epochs=1)
    (choice,) = [c for c in config.data_choices() if c.field == "masks"]
    assert choice.value is False and "this model's mask head cannot be built (DETR's mask head has widths" in choice.why
    vitkit.create_model("detr_digits", **config.resolved().model_args)  # builds


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_run_of_the_earlier_mask_head_resumes_with_it(tmp_path, monkeypatch, strategy):
    """A run started with the mask head's earlier pixel path (Mask DINO's, `use_mask_dino_pixels`) resumes with that
    head: the family fits the new model to the checkpoint before the optimizer is built (from its shards' names and
    sizes where the checkpoint is sharded), and the model saved predicts with it."""
    from vitkit.data.shapes import write_shapes_folder
    from vitkit.models.query_masks import QueryMasks

    write_shapes_folder(tmp_path / "shapes", train=8, val=4)
    config = TrainConfig(
        data=str(tmp_path / "shapes"), model="deformable_detr_small", model_args=TINY_DEFORMABLE_DETR,
        out=str(tmp_path / "run"), epochs=1, batch_size=4, device="cpu", strategy=strategy,
    )  # fmt: skip
    built = QueryMasks.__init__

    def earlier(self, dim):
        built(self, dim)
        self.use_mask_dino_pixels()

    with monkeypatch.context() as patch:
        patch.setattr(QueryMasks, "__init__", earlier)
        fit(config)
    if strategy == "ddp":
        assert "mask_head.pixel_conv.weight" in load_checkpoint(tmp_path / "run" / "checkpoint.pt")["model"]
    fit(TrainConfig.for_resume(tmp_path / "run", epochs=2), resume=True)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    model = from_pretrained(tmp_path / "run" / "final")
    assert hasattr(model.mask_head, "pixel_conv")


def test_auto_times_the_models_step_once_per_machine_and_model(tmp_path, tiny_detector_config, monkeypatch, caplog):
    """The model's training step behind `precision="auto"` is cached per machine, as the products' rates: a second
    run of the same model, batch and sizes reads its times and says the same; another batch is timed anew."""
    from vitkit.analysis import precision
    from vitkit.analysis.precision import MatmulRates, StepTimes

    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=650e9))

    def fake(step, rounds=3):  # the times alone: the steps timed are another test's
        fake.ran += [False, True]
        return StepTimes(fp32=0.3, bf16=0.1)

    fake.ran = []
    monkeypatch.setattr(precision, "time_step", fake)
    for name in ("first", "again"):
        with caplog.at_level(logging.INFO, logger="vitkit.train"):
            fit(tiny_detector_config(tmp_path / name, epochs=1, precision="auto", warmup_epochs=0.2))
        assert json.loads((tmp_path / name / "config.json").read_text())["precision"] == "bf16"
    assert fake.ran == [False, True]  # timed by the first run only
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
    why = "this model's training step 100 ms in bf16 against 300 in fp32: bf16"
    assert len(said) == 2 and all(why in line for line in said)
    batch = tiny_detector_config(tmp_path / "first").batch_size - 1  # the step's batch: at most PROBE_BATCH
    fit(tiny_detector_config(tmp_path / "other", epochs=1, precision="auto", warmup_epochs=0.2, batch_size=batch))
    assert fake.ran == [False, True, False, True]


@pytest.mark.parametrize("faster", ["fp32", "bf16"])
def test_auto_keeps_bf16_only_where_the_models_own_step_measures_faster(
    tmp_path, tiny_detector_config, monkeypatch, caplog, faster, fake_time_step
):
    """The products favour bf16 (the probe's rates), the model's training step decides: timed on the run's own
    forward (faked times, the real steps run), the run trains in the faster precision and says why. Timing it leaves
    the run as it was: an fp32 run chosen so ends with the weights of an fp32 run asked for. Resumed with auto, the
    run keeps the precision it began in."""
    from vitkit.analysis import precision
    from vitkit.analysis.precision import MatmulRates, StepTimes

    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=650e9))
    fake = fake_time_step(StepTimes(fp32=0.1, bf16=0.2) if faster == "fp32" else StepTimes(fp32=0.3, bf16=0.1))
    monkeypatch.setattr(precision, "time_step", fake)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(tiny_detector_config(tmp_path / "auto", epochs=1, precision="auto", warmup_epochs=0.2))
    assert fake.ran == [False, True]
    (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
    why = "this model's training step 200 ms in bf16 against 100 in fp32: fp32" if faster == "fp32" else (
        "this model's training step 100 ms in bf16 against 300 in fp32: bf16"
    )
    assert f"  device  cpu, {faster} (auto: measured on this CPU: bf16 0.65 TFLOP/s, fp32 0.10; {why})" in summary
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["precision"] == faster
    fit(tiny_detector_config(tmp_path / "asked", epochs=1, precision=faster, warmup_epochs=0.2))
    chosen, asked = (from_pretrained(tmp_path / name / "final").state_dict() for name in ("auto", "asked"))
    assert all(torch.equal(chosen[k], asked[k]) for k in asked)  # buffers, random numbers, gradients untouched
    monkeypatch.setattr(precision, "time_step", lambda *args: pytest.fail("a resumed run is not timed again"))
    other = "bf16" if faster == "fp32" else "fp32"  # the products now favour the other one: the run keeps its own
    rates = MatmulRates(fp32=100e9, bf16=650e9 if other == "bf16" else 50e9)
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: rates)
    with pytest.raises(ValueError, match=r"cannot resume the run in .* with different settings \(lr: "):
        fit(tiny_detector_config(tmp_path / "auto", epochs=2, precision="auto", lr=1e-3), resume=True)
    fit(tiny_detector_config(tmp_path / "auto", epochs=2, precision="auto", warmup_epochs=0.2), resume=True)
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["precision"] == faster


def test_timing_the_step_leaves_buffers_gradients_and_random_numbers_as_they_were(monkeypatch, tmp_path):
    """`Run._time_step` on a module whose training step moves BatchNorm's statistics and draws dropout's random
    numbers: after it, the statistics, the gradients (none) and torch's generator are as before, while the steps it
    timed ran at each of the task's sizes."""
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path))  # timed here, not read from another test's figures
    from types import SimpleNamespace

    from vitkit.train.loop import PROBE_ROUNDS, Run

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5), torch.nn.AdaptiveAvgPool2d(1)
    )
    sizes, seen = [(16, 16 + 4 * i) for i in range(PROBE_ROUNDS + 1)], []

    def forward(model, images):
        seen.append(tuple(images.shape[-2:]))
        return model(images)

    task = SimpleNamespace(
        name="classification", image_shape=(3, 16, 16), probe_sizes=lambda count: sizes[:count], images_forward=forward
    )
    cpu = SimpleNamespace(device=torch.device("cpu"))
    config = SimpleNamespace(batch_size=4, model="a conv, a norm and dropout")
    run = SimpleNamespace(task=task, config=config, env=cpu, model=SimpleNamespace(config=repr(net)))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    state = torch.get_rng_state()
    times = Run._time_step(run, net)
    assert times.fp32 > 0 and times.bf16 > 0
    assert sorted(set(seen)) == sizes and len(seen) == 2 * (PROBE_ROUNDS + 1)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(torch.get_rng_state(), state)
    net.train()
    net(torch.randn(4, 3, 16, 16))  # the step does move them: what was restored
    assert not torch.equal(before["1.running_mean"], net.state_dict()["1.running_mean"])


def test_an_explicit_bf16_slower_for_the_model_runs_as_asked_and_warns_with_both_times(
    tmp_path, tiny_detector_config, monkeypatch, caplog, fake_time_step
):
    """--precision bf16 where the products favour bf16 but the model's step measures slower in it: the run trains
    in bf16 and its summary warns with both times and the ways out; faster in bf16, nothing is said; where the
    products already measure bf16 slower, their warning says it and the step is not timed."""
    from vitkit.analysis import precision
    from vitkit.analysis.precision import MatmulRates, StepTimes

    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=650e9))
    for times, warned in ((StepTimes(fp32=0.1, bf16=0.2), True), (StepTimes(fp32=0.2, bf16=0.1), False)):
        monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / f"cache_{warned}"))  # another machine: its own step times
        monkeypatch.setattr(precision, "time_step", fake_time_step(times))
        caplog.clear()
        out = tmp_path / f"bf16_{warned}"
        with caplog.at_level(logging.INFO, logger="vitkit.train"):
            fit(tiny_detector_config(out, epochs=1, precision="bf16"))
        (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
        assert "  device  cpu, bf16, " in summary
        assert json.loads((out / "config.json").read_text())["precision"] == "bf16"
        warning = (
            "  warning bf16 is slower than fp32 for this model on this CPU: its training step takes 200 ms in bf16 "
            "against 100 in fp32 (its many small operators gain nothing from faster products); use fp32 "
            "(precision='fp32') or the faster of the two (precision='auto')"
        )
        assert (warning in summary) is warned
    slow = MatmulRates(fp32=100e9, bf16=50e9)
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: slow)
    monkeypatch.setattr(precision, "time_step", lambda *args: pytest.fail("the products' warning says it"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(tiny_detector_config(tmp_path / "bf16_slow_products", epochs=1, precision="bf16"))
    (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
    assert "bf16 is slower than fp32 on this CPU" in summary and "for this model" not in summary
