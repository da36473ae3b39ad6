"""Detection data: the generated digits-detect canvases (determinism, placement rules, disjoint digits) and
COCO-format files (every kind of bad entry skipped and reported, files that are not COCO, layouts, resizing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_convert, box_iou

from vitkit.data import (
    CocoDetection,
    DetectionAugment,
    DigitsDetection,
    Unreadable,
    detection_augment_defaults,
    detection_sampler,
    load_builtin,
    load_coco_folder,
    load_detection,
    load_digits_detect,
    open_image,
    write_coco_folder,
)
from vitkit.data.coco import COCO_AUGMENT
from vitkit.data.digits_detect import DIGITS_MEAN, DIGITS_STD


@pytest.fixture(scope="module")
def digits():
    return load_digits_detect()


def test_digits_detect_is_deterministic_and_fresh_each_training_epoch(digits):
    train, val, info = digits
    assert (len(train), len(val)) == (4000, 500)
    assert info.classes == tuple("0123456789") and info.category_ids == tuple(range(10))
    again, again_val, _ = load_digits_detect()
    other, _, _ = load_digits_detect(seed=1)
    for i in (0, 17, 3999):
        assert np.array_equal(train.canvas(i)[0], again.canvas(i)[0])
        assert not np.array_equal(train.canvas(i)[0], other.canvas(i)[0])
    image, target = train[5]
    image2, target2 = again[5]
    assert torch.equal(image, image2) and all(torch.equal(target[k], target2[k]) for k in target)
    epoch0 = [train.canvas(i)[0] for i in range(3)]
    train.set_epoch(1)
    assert not any(np.array_equal(c, train.canvas(i)[0]) for i, c in enumerate(epoch0))
    train.set_epoch(0)
    assert all(np.array_equal(c, train.canvas(i)[0]) for i, c in enumerate(epoch0))
    val_canvases = [val.canvas(i)[0] for i in (0, 499)]
    val.set_epoch(3)  # validation canvases never change
    assert all(np.array_equal(c, val.canvas(i)[0]) for i, c in zip((0, 499), val_canvases, strict=True))
    assert np.array_equal(val.canvas(7)[0], again_val.canvas(7)[0])


def check_canvas(dataset: DigitsDetection, index: int) -> int:
    canvas, placed = dataset.canvas(index)
    assert canvas.shape == (96, 96) and canvas.dtype == np.uint8
    assert 1 <= len(placed) <= 4
    rebuilt = np.zeros((96, 96), dtype=np.uint8)
    for p in placed:
        assert 20 <= p.side <= 40 and 0 <= p.x <= 96 - p.side and 0 <= p.y <= 96 - p.side
        assert p.label == dataset.labels[p.source]
        glyph = np.asarray(Image.fromarray(dataset.images[p.source]).resize((p.side, p.side), Image.BILINEAR))
        rows, cols = np.nonzero(glyph)  # the box is the tight box of the glyph's nonzero pixels
        assert p.box == (p.x + cols.min(), p.y + rows.min(), p.x + cols.max() + 1, p.y + rows.max() + 1)
        region = rebuilt[p.y : p.y + p.side, p.x : p.x + p.side]
        region[:] = np.maximum(region, glyph)
    assert np.array_equal(canvas, rebuilt)  # the digits, combined by their maximum, and nothing else
    boxes = torch.tensor([p.box for p in placed], dtype=torch.float64)
    iou = box_iou(boxes, boxes)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    cover = inter / torch.minimum(area[:, None], area[None, :])
    off_diagonal = ~torch.eye(len(placed), dtype=torch.bool)
    assert (iou[off_diagonal] < 0.2).all() and (cover[off_diagonal] < 0.3).all()
    _, target = dataset[index]  # the target holds the same boxes, relative, as (cx, cy, w, h)
    torch.testing.assert_close(target["boxes"].double(), box_convert(boxes, "xyxy", "cxcywh") / 96)
    assert target["labels"].tolist() == [p.label for p in placed]
    assert target["area"].tolist() == area.tolist()
    assert target["orig_size"].tolist() == target["size"].tolist() == [96, 96] and target["image_id"] == index
    return len(placed)


def test_every_canvas_of_a_sample_follows_the_placement_rules(digits):
    train, val, _ = digits
    counts = [check_canvas(train, i) for i in range(0, 4000, 20)] + [check_canvas(val, i) for i in range(0, 500, 5)]
    assert np.bincount(counts, minlength=5)[1:].min() > 0  # 1, 2, 3 and 4 digits all occur


def test_training_and_validation_digits_come_from_disjoint_splits(digits):
    train, val, _ = digits
    mnist_train, mnist_test, _ = load_builtin("mnist5k")
    assert np.array_equal(train.images, mnist_train.images) and np.array_equal(val.images, mnist_test.images)
    train_set = {image.tobytes() for image in mnist_train.images}
    assert not any(image.tobytes() in train_set for image in mnist_test.images)
    used = {p.source for i in range(500) for p in val.layout(i)}
    assert max(used) < len(mnist_test.images) and len(used) > 500  # held-out digits, many of them


def test_digits_statistics_and_model_input(digits):
    train, _, _ = digits
    canvases = np.stack([train.canvas(i)[0] for i in range(1000)]) / 255
    assert canvases.mean() == pytest.approx(DIGITS_MEAN[0], abs=2e-3)
    assert canvases.std() == pytest.approx(DIGITS_STD[0], abs=2e-3)
    image, _ = train[3]
    canvas, _ = train.canvas(3)
    assert image.shape == (3, 96, 96) and image.dtype == torch.float32
    expected = (torch.from_numpy(canvas).float() / 255 - DIGITS_MEAN[0]) / DIGITS_STD[0]
    assert all(torch.allclose(image[c], expected) for c in range(3))
    big = DigitsDetection(train.images, train.labels, 10, 0, True, channels=1, img_size=192)
    image, target = big[3]
    assert image.shape == (1, 192, 192) and target["size"].tolist() == [192, 192]
    torch.testing.assert_close(target["boxes"], train[3][1]["boxes"])  # relative boxes do not change
    assert train[(3, 12345)][1]["boxes"].equal(train[3][1]["boxes"])  # (index, seed) keys of EpochSampler


# --- COCO-format files ----------------------------------------------------------------------------------------------


def png(path: Path, size=(40, 30)) -> str:
    """A grey PNG of (width, height) `size`; returns its file name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)
    return path.name


def messy_coco(root: Path) -> Path:
    """A COCO file with good entries and one of each kind of bad one; images are 40 x 30 (width x height)."""
    images = root / "images"
    entries = [
        {"id": 1, "file_name": png(images / "a.png"), "width": 40, "height": 30},
        {"id": 2, "file_name": png(images / "b.png"), "width": 40, "height": 30},
        {"id": 3, "file_name": png(images / "c.png"), "width": 40, "height": 30},  # no annotations
        {"id": 4, "file_name": "gone.png", "width": 40, "height": 30},  # missing file
        {"id": 5, "file_name": "a.png", "width": "40", "height": 30},  # a width that is no integer
        {"id": 6, "file_name": "broken.png", "width": 40, "height": 30},  # not an image
        {"id": 7, "file_name": png(images / "small.png", (20, 10)), "width": 40, "height": 30},  # wrong size
        {"id": 1, "file_name": "b.png", "width": 40, "height": 30},  # repeated id
    ]
    (images / "broken.png").write_bytes(b"not a png at all")
    annotations = [
        {"id": 10, "image_id": 1, "category_id": 7, "bbox": [5, 5, 10, 10], "area": 80.0},
        {"id": 11, "image_id": 1, "category_id": 12, "bbox": [30, 20, 20, 20]},  # partly outside: clipped
        {"id": 12, "image_id": 2, "category_id": 3, "bbox": [1.5, 2.5, 4, 6]},
        {"id": 13, "image_id": 2, "category_id": 3, "bbox": [45, 5, 5, 5]},  # wholly outside
        {"id": 14, "image_id": 2, "category_id": 3, "bbox": [5, 5, 0, 5]},  # zero width
        {"id": 15, "image_id": 2, "category_id": 3, "bbox": [5, 5, 5, -2]},  # negative height
        {"id": 16, "image_id": 2, "category_id": 99, "bbox": [5, 5, 5, 5]},  # unknown category
        {"id": 17, "image_id": 42, "category_id": 3, "bbox": [5, 5, 5, 5]},  # unknown image
        {"id": 18, "image_id": 2, "category_id": 3, "bbox": [5, 5, 5]},  # malformed box
        {"id": 19, "image_id": 2, "category_id": 3, "bbox": [5, 5, 5, 5], "iscrowd": 1},  # crowd
        {"id": 20, "image_id": 4, "category_id": 3, "bbox": [5, 5, 5, 5]},  # on the missing image: goes with it
        {"id": 21, "image_id": 6, "category_id": 12, "bbox": [5, 5, 5, 5]},
    ]
    categories = [{"id": 12, "name": "cat"}, {"id": 3, "name": "ant"}, {"id": 7, "name": "bee"}]
    path = root / "instances.json"
    path.write_text(json.dumps({"images": entries, "annotations": annotations, "categories": categories}))
    return path


def test_coco_bad_entries_are_skipped_counted_and_reported(tmp_path):
    path = messy_coco(tmp_path)
    data = CocoDetection(path, tmp_path / "images", short_side=None)
    report = data.report
    assert data.category_ids == (3, 7, 12) and data.classes == ("ant", "bee", "cat")  # sorted ids -> 0, 1, 2
    assert report.counts() == {
        "missing file": 1,
        "bad image entry": 2,
        "outside image": 1,
        "empty box": 2,
        "unknown category": 1,
        "unknown image": 1,
        "bad annotation entry": 1,
    }
    skipped = {(s.kind, s.id): s.reason for s in report.skipped}
    assert skipped[("image", 4)] == "missing file" and skipped[("image", 5)] == "bad image entry"
    assert skipped[("image", 1)] == "bad image entry"  # the repeated id; the first entry is kept
    assert skipped[("annotation", 13)] == "outside image" and skipped[("annotation", 17)] == "unknown image"
    assert {i for (kind, i), r in skipped.items() if r == "empty box"} == {14, 15}
    assert report.clipped == [11] and report.crowd == 1
    assert (report.images, report.annotations) == (5, 4) and len(data) == 5
    assert "annotation 16: unknown category (category_id 99)" in str(report)

    samples = {int(t["image_id"]): t for t in (data[i][1] for i in range(len(data)) if data.samples[i].image_id < 6)}
    first = samples[1]
    assert first["labels"].tolist() == [1, 2] and first["orig_size"].tolist() == [30, 40]
    expected = torch.tensor([[5, 5, 15, 15], [30, 20, 40, 30]], dtype=torch.float32)  # the second clipped
    torch.testing.assert_close(first["boxes"], box_convert(expected, "xyxy", "cxcywh") / torch.tensor([40, 30, 40, 30]))
    assert first["area"].tolist() == [80.0, 100.0]  # the file's area when given, else the clipped box's
    torch.testing.assert_close(samples[2]["boxes"], torch.tensor([[3.5 / 40, 5.5 / 30, 4 / 40, 6 / 30]]))
    assert len(samples[3]["labels"]) == 0 and samples[3]["boxes"].shape == (0, 4)
    # Unreadable files show up when read, named by image id, as the loader reports them ...
    broken = [data[i] for i in range(len(data)) if data.samples[i].image_id in (6, 7)]
    assert all(isinstance(b, Unreadable) for b in broken)
    assert broken[0].name.startswith("image 6") and "annotations say 40x30" in broken[1].error
    # ... or at load with check_images.
    checked = CocoDetection(path, tmp_path / "images", short_side=None, check_images=True)
    assert checked.report.counts()["unreadable file"] == 2 and len(checked) == 3


def test_files_that_are_not_coco_are_clear_errors(tmp_path):
    cases = {
        "list.json": "[1, 2]",
        "text.json": "images: none",
        "keys.json": json.dumps({"images": [], "annotations": []}),
        "categories.json": json.dumps({"images": [], "annotations": [], "categories": [{"name": "x"}]}),
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match="not a COCO instances file: expected an object with lists"):
        CocoDetection(tmp_path / "list.json", tmp_path)
    with pytest.raises(ValueError, match="not a COCO instances file: not JSON"):
        CocoDetection(tmp_path / "text.json", tmp_path)
    with pytest.raises(ValueError, match=r"found \['annotations', 'images'\]"):
        CocoDetection(tmp_path / "keys.json", tmp_path)
    with pytest.raises(ValueError, match="category #0 needs an integer 'id'"):
        CocoDetection(tmp_path / "categories.json", tmp_path)
    with pytest.raises(OSError, match="cannot read COCO annotations"):
        CocoDetection(tmp_path / "absent.json", tmp_path)


def test_coco_images_are_resized_as_detr_does(tmp_path):
    file_name = png(tmp_path / "wide.png", (40, 20))
    data = {
        "images": [{"id": 1, "file_name": file_name, "width": 40, "height": 20}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 2, 8, 6]}],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "a.json").write_text(json.dumps(data))
    image, target = CocoDetection(tmp_path / "a.json", tmp_path, short_side=50, max_size=1000)[0]
    assert image.shape == (3, 50, 100) and target["size"].tolist() == [50, 100]
    image, target = CocoDetection(tmp_path / "a.json", tmp_path, short_side=50, max_size=60)[0]
    assert image.shape == (3, 30, 60)  # the longer side capped at 60, the shorter follows
    assert target["orig_size"].tolist() == [20, 40]
    torch.testing.assert_close(target["boxes"], torch.tensor([[8 / 40, 5 / 20, 8 / 40, 6 / 20]]))
    grey = (90 * 0.299 + 120 * 0.587 + 150 * 0.114) / 255  # PIL's RGB -> L
    one, _ = CocoDetection(tmp_path / "a.json", tmp_path, short_side=None, channels=1, mean=(0.5,), std=(0.25,))[0]
    assert one.shape == (1, 20, 40) and one.mean().item() == pytest.approx((grey - 0.5) / 0.25, abs=0.01)


def test_digits_round_trip_through_a_coco_folder(tmp_path, digits):
    train, val, _ = digits
    write_coco_folder(train, tmp_path, "train2017", limit=6)
    write_coco_folder(val, tmp_path, "val2017", limit=4)
    coco_train, coco_val, info = load_coco_folder(tmp_path, short_side=None, channels=1, mean=(0.0,), std=(1.0,))
    assert info.category_ids == tuple(range(10)) and (len(coco_train), len(coco_val)) == (6, 4)
    assert coco_val.report.skipped == [] and coco_val.report.clipped == []
    for i in range(4):
        image, target = coco_val[i]
        canvas, _ = val.canvas(i)
        assert torch.equal((image[0] * 255).round().to(torch.uint8), torch.from_numpy(canvas))
        _, expected = val[i]
        for key in ("labels", "boxes", "image_id", "orig_size", "area"):
            torch.testing.assert_close(target[key], expected[key])
    # The other layout: a train/ and a val/ folder, each with its images and one JSON.
    other = tmp_path / "flat"
    for split in ("train", "val"):
        (other / split).mkdir(parents=True)
        for p in (tmp_path / f"{split}2017").iterdir():
            (other / split / p.name).write_bytes(p.read_bytes())
        annotations = (tmp_path / "annotations" / f"instances_{split}2017.json").read_text()
        (other / split / "_annotations.coco.json").write_text(annotations)
    flat_train, flat_val, _ = load_coco_folder(other, short_side=None)
    assert (len(flat_train), len(flat_val)) == (6, 4)
    leftover = other / "train" / "_annotations.old.json"  # a copy kept beside the file: which one is meant?
    leftover.write_text(annotations)
    with pytest.raises(ValueError, match="no COCO-format train split") as err:
        load_coco_folder(other)
    assert str(err.value).endswith(
        "train/ holds 2 such files (_annotations.coco.json and _annotations.old.json), and vitkit does not guess which "
        "describes the train images: keep that one there and move the others out"
    )
    leftover.unlink()
    # annotations/train.json and val.json beside train/ and val/
    named = tmp_path / "named"
    (named / "annotations").mkdir(parents=True)
    for split in ("train", "val"):
        (named / split).mkdir()
        for p in (other / split).glob("*.png"):
            (named / split / p.name).write_bytes(p.read_bytes())
        (named / "annotations" / f"{split}.json").write_text((other / split / "_annotations.coco.json").read_text())
    named_train, named_val, _ = load_coco_folder(named, short_side=None)
    assert (len(named_train), len(named_val)) == (6, 4)
    # an export of one split (as CVAT's): the message lists the layouts and the .json files it found
    (named / "annotations" / "train.json").rename(named / "annotations" / "instances_default.json")
    with pytest.raises(ValueError, match="expected one annotations/instances_train") as err:
        load_coco_folder(named)
    assert "found the .json files ['annotations/instances_default.json', 'annotations/val.json']" in str(err.value)
    with pytest.raises(ValueError, match="no COCO-format train split: expected one annotations/instances_train"):
        load_coco_folder(tmp_path / "annotations")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_coco_folder(tmp_path / "nowhere")
    from vitkit.train.recipe import is_detection_data  # the layouts a run trains a detector on

    assert all(is_detection_data(str(folder)) for folder in (tmp_path, other, named))
    # the whole set in one file at the top, its images in a folder beside it (labelme2coco's export): detection
    # data, refused naming the file and the split it needs; a class folder's other .json files are not COCO
    whole = tmp_path / "whole"
    (whole / "JPEGImages").mkdir(parents=True)
    (whole / "annotations.json").write_text((other / "train" / "_annotations.coco.json").read_text())
    (whole / "notes.json").write_text('{"images": "not a list", "author": "a"}')
    with pytest.raises(ValueError, match="no COCO-format train split") as err:
        load_coco_folder(whole)
    assert "found annotations.json at its top, a COCO file of the whole set without a train / val split" in str(
        err.value
    )
    assert f"put the images to train on in {whole / 'train'}/ with their .json" in str(err.value)
    assert is_detection_data(str(whole))
    labelme = tmp_path / "labelme"  # labelme's own files, one per image, at the top or in train/
    (labelme / "train").mkdir(parents=True)
    for name in ("a", "b"):
        one = {"version": "5", "shapes": [{"label": "cat", "points": [[1, 2], [3, 4]]}], "imagePath": f"{name}.jpg"}
        (labelme / "train" / f"{name}.json").write_text(json.dumps(one))
    with pytest.raises(ValueError, match="found labelme's annotation files, one .json per image") as err:
        load_coco_folder(labelme)
    assert "(train/a.json and train/b.json), not COCO files: convert each split's into one COCO file" in str(err.value)
    (labelme / "train").rename(labelme / "annotated")
    assert is_detection_data(str(labelme)) and is_detection_data(str(labelme / "annotated"))
    classes = tmp_path / "classes"
    (classes / "cat").mkdir(parents=True)
    (classes / "dataset.json").write_text('{"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}')
    (classes / "broken.json").write_text("{not json")
    assert not is_detection_data(str(classes))


def test_load_detection_sources(tmp_path):
    train, val, info = load_detection("builtin:digits-detect", img_size=128)
    assert isinstance(train, DigitsDetection) and train[0][0].shape == (3, 128, 128)
    assert info.source == "builtin:digits-detect"
    with pytest.raises(ValueError, match="unknown builtin detection dataset 'mnist5k'"):
        load_detection("builtin:mnist5k")


def test_evaluation_reads_only_the_val_annotations(tmp_path, digits):
    """A folder whose training annotations are damaged (or absent) still loads its val split with `val_only`,
    as `vitkit eval` loads it; training on it names the damaged file."""
    _, val, _ = digits
    write_coco_folder(val, tmp_path, "val2017", limit=3)
    (tmp_path / "annotations" / "instances_train2017.json").write_text("not json")
    train, coco_val, info = load_detection(str(tmp_path), channels=1, val_only=True)
    assert train is None and len(coco_val) == 3 and info.category_ids == tuple(range(10))
    assert info.source == str(tmp_path)
    with pytest.raises(ValueError, match="instances_train2017.json"):
        load_detection(str(tmp_path), channels=1)


# --- Augmentation of a COCO training split ----------------------------------------------------------------------------

COLOURS = ((230, 30, 30), (30, 230, 30), (30, 30, 230))  # the colour of class i's rectangle


def coloured_boxes(root: Path) -> Path:
    """One 90 x 64 (width x height) black image holding three filled rectangles, class i in COLOURS[i]: the
    image shows where each box is, so an augmented sample can be checked against its own pixels."""
    boxes = [(4, 6, 22, 30), (40, 20, 70, 52), (75, 2, 88, 14)]  # (x0, y0, x1, y1), x1 and y1 exclusive
    array = np.zeros((64, 90, 3), dtype=np.uint8)
    for (x0, y0, x1, y1), colour in zip(boxes, COLOURS, strict=True):
        array[y0:y1, x0:x1] = colour
    Image.fromarray(array).save(root / "boxes.png")
    data = {
        "images": [{"id": 7, "file_name": "boxes.png", "width": 90, "height": 64}],
        "annotations": [
            {"id": i + 1, "image_id": 7, "category_id": i + 1, "bbox": [x0, y0, x1 - x0, y1 - y0]}
            for i, (x0, y0, x1, y1) in enumerate(boxes)
        ],
        "categories": [{"id": i + 1, "name": name} for i, name in enumerate(("red", "green", "blue"))],
    }
    (root / "boxes.json").write_text(json.dumps(data))
    return root / "boxes.json"


def pixel_box(mask: torch.Tensor) -> list[float]:
    """The tight (x0, y0, x1, y1) of a (H, W) boolean mask, x1 and y1 exclusive."""
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]


def test_augmented_boxes_follow_the_pixels_and_the_labels_their_boxes(tmp_path):
    augment = DetectionAugment(hflip=0.5, scale_jitter=0.3, crop=0.7)
    options = dict(short_side=64, max_size=None, mean=(0.0,) * 3, std=(1.0,) * 3)
    data = CocoDetection(coloured_boxes(tmp_path), tmp_path, augment=augment, **options)
    plain = CocoDetection(tmp_path / "boxes.json", tmp_path, **options)
    torch.testing.assert_close(data[0][0], plain[0][0])  # a plain index (evaluation) is not augmented
    sizes, flipped, dropped = set(), 0, 0
    for seed in range(40):
        image, target = data[(0, seed)]
        again, target_again = data[(0, seed)]  # the same seed, the same sample
        assert torch.equal(image, again) and torch.equal(target["boxes"], target_again["boxes"])
        height, width = image.shape[1:]
        assert target["size"].tolist() == target["orig_size"].tolist() == [height, width]
        sizes.add(min(height, width))
        assert 64 * 0.7 - 1 <= min(height, width) <= 64 * 1.3 + 1
        scale = torch.tensor([width, height, width, height])
        xyxy = box_convert(target["boxes"], "cxcywh", "xyxy") * scale  # (n, 4) pixels of the augmented image
        assert len(target["labels"]) == len(target["area"]) and len(target["labels"]) >= 1
        dropped += 3 - len(target["labels"])
        for box, label, area in zip(xyxy, target["labels"].tolist(), target["area"].tolist(), strict=True):
            colour = torch.tensor(COLOURS[label], dtype=torch.float32)[:, None, None] / 255
            mask = (image - colour).abs().amax(0) < 0.25  # (H, W) pixels of this class's colour
            # the drawn rectangle, resized with antialiasing: its tight box is the target's within a pixel
            torch.testing.assert_close(torch.tensor(pixel_box(mask), dtype=torch.float32), box, atol=1.2, rtol=0)
            stored = [(4, 6, 22, 30), (40, 20, 70, 52), (75, 2, 88, 14)][label]
            assert area == (stored[2] - stored[0]) * (stored[3] - stored[1])  # the stored object's area
        red = target["labels"] == 0
        if red.any() and xyxy[red][0, 0] > width / 2:  # the red box starts on the left of the stored image
            flipped += 1
    assert len(sizes) > 5 and 5 < flipped < 35 and dropped > 0  # every augmentation drew both ways


def test_augmentation_settings_are_checked_and_the_bundled_canvases_take_none(tmp_path):
    coloured_boxes(tmp_path)
    with pytest.raises(ValueError, match="augmentation resizes to a random shorter side around short_side"):
        CocoDetection(tmp_path / "boxes.json", tmp_path, short_side=None, augment=DetectionAugment(hflip=0.5))
    with pytest.raises(ValueError, match="scale_jitter must be in"):
        CocoDetection(tmp_path / "boxes.json", tmp_path, augment=DetectionAugment(scale_jitter=1.0))
    with pytest.raises(ValueError, match="digits-detect draws fresh training canvases every epoch .* got crop 0.5$"):
        load_detection("builtin:digits-detect", augment=DetectionAugment(crop=0.5))
    assert load_detection("builtin:digits-detect", augment=DetectionAugment())[0] is not None
    assert not detection_augment_defaults("builtin:digits-detect")
    assert detection_augment_defaults(str(tmp_path)) == COCO_AUGMENT


def test_detection_batches_hold_one_orientation(tmp_path):
    sizes = [(40, 30), (30, 40)] * 4 + [(40, 30)]  # (width, height): 5 landscape, 4 portrait, alternating
    data = {
        "images": [
            {"id": i, "file_name": png(tmp_path / f"{i}.png", size), "width": size[0], "height": size[1]}
            for i, size in enumerate(sizes)
        ],
        "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [2, 2, 8, 8]} for i in range(len(sizes))],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "a.json").write_text(json.dumps(data))
    split = CocoDetection(tmp_path / "a.json", tmp_path, short_side=None)
    assert split.orientations() == [i % 2 for i in range(len(sizes))]
    for shuffle in (False, True):
        keys = list(detection_sampler(split, 2, shuffle=shuffle))
        assert sorted(k[0] for k in keys) == list(range(len(sizes)))  # each image once
        batches = [keys[i : i + 2] for i in range(0, len(keys), 2)]
        mixed = [b for b in batches if len({split.orientations()[k[0]] for k in b}) > 1]
        assert len(mixed) <= 1  # only the leftovers of the two orientations share a batch
        shapes = [{split[k[0]][0].shape for k in b} for b in batches]
        assert sum(len(s) > 1 for s in shapes) == len(mixed)
    plain = list(detection_sampler(load_digits_detect()[1], 4))  # no orientations: the stored order
    assert [k[0] for k in plain] == list(range(len(plain)))


def _sideways_photo(path: Path) -> np.ndarray:
    """A JPEG stored 60 wide and 40 high with EXIF orientation 6 (a portrait photo as phones store it: viewers
    turn it 90 degrees clockwise, to 40 wide and 60 high). Returns the upright pixels viewers show."""
    stored = np.zeros((40, 60, 3), dtype=np.uint8)
    stored[:, :20] = (255, 0, 0)  # the stored left third: the top of the upright photo
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(path, exif=exif, quality=95)
    return np.rot90(stored, k=-1)


def test_photos_are_read_upright_by_their_exif_orientation(tmp_path):
    upright = _sideways_photo(tmp_path / "phone.jpg")
    image = open_image(tmp_path / "phone.jpg")
    assert image.size == (40, 60) and np.asarray(image)[:15, :, 0].min() > 200  # red on top
    assert open_image(tmp_path / "phone.jpg", upright=False).size == (60, 40)
    assert upright.shape == (60, 40, 3)

    def dataset(width, height):
        coco = {
            "images": [{"id": 1, "file_name": "phone.jpg", "width": width, "height": height}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10]}],
            "categories": [{"id": 1, "name": "thing"}],
        }
        (tmp_path / "a.json").write_text(json.dumps(coco))
        return CocoDetection(tmp_path / "a.json", tmp_path, short_side=None, check_images=True)

    # labelling tools show the photo upright, and say so in width and height: read upright
    data = dataset(40, 60)
    tensor, _ = data[0]
    assert len(data) == 1 and tensor.shape[-2:] == (60, 40) and tensor[0, :15].min() > tensor[0, -15:].max()
    # annotations of the stored pixels (their size says so): read as stored
    tensor, _ = dataset(60, 40)[0]
    assert tensor.shape[-2:] == (40, 60)
    # neither: skipped, saying both sizes
    report = dataset(50, 50).report
    assert "is 60x40 (40x60 upright by its EXIF orientation), the annotations say 50x50" in str(report)
