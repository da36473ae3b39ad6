"""COCO-format folders: a split without a usable box is refused with what its file holds, the report names the
clipped annotations, and `detection_stats` describes a hand-written file with known numbers (and digits-detect the
same whether read from its canvases or from their COCO folder)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image

from vitkit.data import (
    CocoDetection,
    DetectionStats,
    DigitsDetection,
    detection_stats,
    load_builtin,
    load_coco_folder,
    load_detection,
    write_coco_folder,
)


def write_split(root: Path, split: str, images: list[tuple[int, int, int]], annotations: list[dict]) -> Path:
    """root/<split>/<id>.png for each (id, width, height) of `images`, and root/annotations/instances_<split>.json
    with `annotations` and the categories 1 "a" and 2 "b"."""
    (root / split).mkdir(parents=True, exist_ok=True)
    entries = []
    for image_id, width, height in images:
        Image.new("RGB", (width, height), (100, 110, 120)).save(root / split / f"{image_id}.png")
        entries.append({"id": image_id, "file_name": f"{image_id}.png", "width": width, "height": height})
    path = root / "annotations" / f"instances_{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    categories = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    path.write_text(json.dumps({"images": entries, "annotations": annotations, "categories": categories}))
    return path


def box(ann_id: int, image_id: int, bbox: list[float], category_id: int = 1, **extra) -> dict:
    return {"id": ann_id, "image_id": image_id, "category_id": category_id, "bbox": bbox, **extra}


GOOD = [box(1, 1, [2, 2, 10, 10])]


def test_a_train_split_without_a_usable_box_is_refused(tmp_path):
    images = [(1, 40, 30), (2, 40, 30)]
    annotations = [
        box(1, 1, [2, 2, 10, 10], category_id=9),  # unknown category
        box(2, 1, [2, 2, 0, 10]),  # empty box
        box(3, 1, [2, 2, 10, 10], iscrowd=1),  # crowd
        box(4, 2, [2, 2, 10, 10]),  # on image 2, whose file is missing
    ]
    path = write_split(tmp_path, "train", images, annotations)
    (tmp_path / "train" / "2.png").unlink()
    write_split(tmp_path, "val", [(1, 40, 30)], GOOD)
    expected = (
        f"{path}: no boxes to train on: the file lists 2 images and 4 annotations; kept 1 image and 0 annotations; "
        "skipped 1 image (missing file: 1); skipped 2 annotations (unknown category: 1, empty box: 1); "
        "left out 1 crowd annotation; left out 1 annotation of skipped images; for example image 2: missing file "
        f"({tmp_path / 'train' / '2.png'}); annotation 1: unknown category (category_id 9); annotation 2: empty box "
        "(bbox [2, 2, 0, 10])"
    )
    with pytest.raises(ValueError) as err:
        load_coco_folder(tmp_path)
    assert str(err.value) == expected
    with pytest.raises(ValueError) as err:  # as `vitkit train --data` loads it
        load_detection(str(tmp_path))
    assert str(err.value) == expected
    # One usable box is enough; evaluation reads only val.
    _, val, _ = load_coco_folder(tmp_path, val_only=True)
    assert val.report.annotations == 1


def test_a_val_split_without_a_box_is_refused_for_training_and_evaluation(tmp_path):
    write_split(tmp_path, "train", [(1, 40, 30)], GOOD)
    path = write_split(tmp_path, "val", [(1, 40, 30), (2, 40, 30), (3, 20, 20)], [])
    expected = (
        f"{path}: no boxes to evaluate on (COCO mAP is undefined without ground-truth boxes): the file lists 3 images "
        "and 0 annotations; kept 3 images and 0 annotations"
    )
    for val_only in (False, True):
        with pytest.raises(ValueError) as err:
            load_coco_folder(tmp_path, val_only=val_only)
        assert str(err.value) == expected
    # A box wholly outside its image is no box either; an image entry without a size is skipped.
    path = write_split(tmp_path, "val", [(1, 40, 30)], [box(1, 1, [50, 5, 5, 5]), box(2, 7, [1, 1, 5, 5])])
    with pytest.raises(ValueError) as err:
        load_coco_folder(tmp_path, val_only=True)
    assert str(err.value) == (
        f"{path}: no boxes to evaluate on (COCO mAP is undefined without ground-truth boxes): the file lists 1 image "
        "and 2 annotations; kept 1 image and 0 annotations; "
        "skipped 2 annotations (outside image: 1, unknown image: 1); "
        "for example annotation 1: outside image (bbox [50, 5, 5, 5] in a 40x30 image); annotation 2: unknown image "
        "(image_id 7)"
    )


def test_the_report_names_the_clipped_annotations(tmp_path):
    annotations = [box(5, 1, [30, 20, 20, 20]), box(6, 1, [2, 2, 5, 5]), box(7, 1, [-3, 4, 10, 5])]
    path = write_split(tmp_path, "few", [(1, 40, 30)], annotations)
    report = CocoDetection(path, tmp_path / "few", short_side=None).report
    assert report.clipped == [5, 7]
    assert str(report).splitlines() == [
        f"{path}: 1 image, 3 annotations",
        "  clipped 2 boxes to their images: annotations 5, 7",
    ]
    many = [box(100 + i, 1, [35, 2, 10, 5]) for i in range(13)]
    path = write_split(tmp_path, "many", [(1, 40, 30)], many)
    report = CocoDetection(path, tmp_path / "many", short_side=None).report
    assert report.clipped == list(range(100, 113))
    ids = ", ".join(str(i) for i in range(100, 110))
    one = write_split(tmp_path, "one", [(1, 40, 30)], [box(9, 1, [35, 2, 10, 5])])
    assert "  clipped 1 box to its image: annotation 9" in str(
        CocoDetection(one, tmp_path / "one", short_side=None).report
    )
    assert f"  clipped 13 boxes to their images: annotations {ids}, ... 3 more" in str(report).splitlines()


def test_detection_stats_of_a_hand_written_file(tmp_path):
    images = [(1, 40, 30), (2, 20, 50), (3, 64, 64), (4, 100, 80)]  # (id, width, height)
    annotations = [
        box(1, 1, [0, 0, 10, 10]),  # size 10
        box(2, 1, [0, 0, 40, 30], category_id=2),  # size sqrt(1200)
        box(3, 2, [5, 5, 4, 9], area=1000.0),  # size 6: the box's, not the file's area
        box(4, 3, [50, 50, 20, 20], category_id=2),  # clipped to 14 x 14: size 14
        box(5, 3, [0, 0, 60, 60], iscrowd=1),  # left out
    ]  # image 4 has no box
    path = write_split(tmp_path, "train", images, annotations)
    stats = detection_stats(CocoDetection(path, tmp_path / "train"))
    assert stats == DetectionStats(
        images=4,
        boxes=4,
        classes=("a", "b"),
        boxes_per_class=(2, 2),
        max_objects=2,
        median_objects=1.0,  # of 2, 1, 1, 0
        short_side_median=47.0,  # of 30, 20, 64, 80
        short_side_min=20,
        short_side_max=80,
        long_side_median=57.0,  # of 40, 50, 64, 100
        long_side_min=40,
        long_side_max=100,
        box_size_median=12.0,  # of 6, 10, 14, 34.6
        box_size_p10=pytest.approx(7.2),  # 6 + 0.3 * (10 - 6)
        small_share=0.75,
        box_size_p90=pytest.approx(28.45, abs=0.01),  # 14 + 0.7 * (34.64 - 14)
    )
    assert stats.summary().splitlines() == [
        "4 images (shorter side 20-80 px, longer 40-100 px)",
        "4 boxes: a: 2, b: 2",
        "objects per image: median 1, at most 2; box size: median 12 px, 10th percentile 7 px, 75% small (< 32 px)",
    ]
    empty = write_split(tmp_path, "empty", [(1, 40, 30)], [])
    bare = detection_stats(CocoDetection(empty, tmp_path / "empty"))
    assert (bare.images, bare.boxes, bare.boxes_per_class, bare.max_objects) == (1, 0, (0, 0), 0)
    assert math.isnan(bare.box_size_median) and math.isnan(bare.small_share)
    with pytest.raises(TypeError, match="expected a CocoDetection or a DigitsDetection, got list"):
        detection_stats([])


def test_detection_stats_of_digits_canvases_and_of_their_coco_folder_agree(tmp_path):
    digits, _, _ = load_builtin("mnist5k")
    canvases = DigitsDetection(digits.images, digits.labels, 30, seed=0, fresh=False)
    stats = detection_stats(canvases)
    write_coco_folder(canvases, tmp_path, "val")
    assert detection_stats(CocoDetection(tmp_path / "annotations" / "instances_val.json", tmp_path / "val")) == stats
    layouts = [canvases.layout(i) for i in range(30)]
    assert stats.images == 30 and stats.boxes == sum(len(placed) for placed in layouts)
    assert stats.classes == tuple("0123456789") and sum(stats.boxes_per_class) == stats.boxes
    assert (stats.short_side_min, stats.long_side_max, stats.max_objects) == (96, 96, 4)
    assert stats.small_share == 1.0  # glyphs of at most 40 pixels, tight boxes smaller still


def test_bad_entries_say_what_is_wrong(tmp_path):
    """An image entry of a float width and an annotation of a string category are skipped saying which field is
    wrong and what it holds; the annotations of a skipped image entry are not called annotations of an unknown one."""
    path = write_split(tmp_path, "val", [(1, 40, 30)], [box(1, 1, [2, 2, 5, 5], category_id="1")])
    data = json.loads(path.read_text())
    data["images"][0]["width"] = 40.0
    data["annotations"].append(box(2, 1, [2, 2, 5, 5]))
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        load_coco_folder(tmp_path, val_only=True)
    assert str(err.value).endswith(
        "skipped 1 image (bad image entry: 1); skipped 1 annotation (bad annotation entry: 1); "
        "left out 1 annotation of skipped images; "
        "for example image 1: bad image entry (width must be a positive integer, got 40.0); "
        "annotation 1: bad annotation entry (category_id must be an integer, got '1')"
    )


def test_a_windows_path_in_file_name_is_read_in_its_parts(tmp_path):
    """`sub\\1.png`, as a tool on Windows writes it, is the file sub/1.png; a name that is missing either way is
    still skipped as missing."""
    path = write_split(tmp_path, "train", [(1, 40, 30), (2, 40, 30)], [*GOOD, box(2, 2, [2, 2, 10, 10])])
    (tmp_path / "train" / "sub").mkdir()
    (tmp_path / "train" / "1.png").rename(tmp_path / "train" / "sub" / "1.png")
    data = json.loads(path.read_text())
    data["images"][0]["file_name"] = "sub\\1.png"
    data["images"][1]["file_name"] = "sub\\nowhere.png"
    path.write_text(json.dumps(data))
    split = CocoDetection(path, tmp_path / "train", short_side=None)
    assert [s.path for s in split.samples] == [tmp_path / "train" / "sub" / "1.png"]
    assert [(s.kind, s.id, s.reason) for s in split.report.skipped if s.kind == "image"] == [
        ("image", 2, "missing file")
    ]


def test_a_folder_with_a_train_split_only_is_told_how_to_make_one_to_score_on(tmp_path):
    write_split(tmp_path, "train", [(1, 40, 30)], GOOD)
    with pytest.raises(ValueError, match="no COCO-format val split") as err:
        load_coco_folder(tmp_path)
    assert "a detection folder needs a split to score on: move about a tenth of the training images to" in str(
        err.value
    )
    write_split(tmp_path, "val", [(1, 40, 30)], GOOD)
    assert len(load_coco_folder(tmp_path, short_side=None)[1]) == 1
