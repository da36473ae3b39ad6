"""The generated `shapes` dataset: the same seed writes the same bytes, boxes are the tight boxes of the drawn pixels
and inside the image, sizes spread from 10 to 60 pixels with about a third small, every class comes in many colours,
and the folder is one `load_coco_folder` reads without a skip."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.data import detection_stats, load_coco_folder, write_shapes_folder
from vitkit.data.digits_detect import overlap_ok
from vitkit.data.shapes import CLASSES, IMAGE_SIZES, MAX_OBJECTS, PALETTE, draw_shapes_image


@pytest.fixture(scope="module")
def drawn():
    """The objects of 120 training images (about 360 objects), with each image's size."""
    return [(image.shape, shapes) for image, shapes in (draw_shapes_image(i) for i in range(120))]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    first = files(write_shapes_folder(tmp_path / "a", train=5, val=3, seed=0))
    assert files(write_shapes_folder(tmp_path / "b", train=5, val=3, seed=0)) == first
    expected = [f"train/{i:06d}.png" for i in range(5)] + [f"val/{i:06d}.png" for i in range(3)]
    assert set(first) == {*expected, "annotations/instances_train.json", "annotations/instances_val.json"}
    other = files(write_shapes_folder(tmp_path / "c", train=5, val=3, seed=1))
    assert all(other[name] != first[name] for name in expected)  # another seed, other images
    train, _ = draw_shapes_image(0, "train")
    val, _ = draw_shapes_image(0, "val")
    assert train.shape != val.shape or not np.array_equal(train, val)  # the splits draw different images
    with pytest.raises(ValueError, match="split must be one of \\['train', 'val'\\], got 'test'"):
        draw_shapes_image(0, "test")
    with pytest.raises(ValueError, match="expected at least 1 train and 1 val image, got train=0 and val=3"):
        write_shapes_folder(tmp_path / "d", train=0, val=3)


def test_boxes_are_the_tight_boxes_of_the_drawn_pixels(drawn):
    for i in range(12):
        image, shapes = draw_shapes_image(i)
        height, width, _ = image.shape
        assert image.dtype == np.uint8 and (width, height) in IMAGE_SIZES
        assert 1 <= len(shapes) <= MAX_OBJECTS
        drawn_pixels = np.zeros((height, width), dtype=np.int64)
        for k, shape in enumerate(shapes):
            x0, y0, x1, y1 = shape.box
            assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
            covered = shape.coverage > 0
            assert covered.shape == (y1 - y0, x1 - x0)
            # tight: a drawn pixel on every side of the box
            assert covered[0].any() and covered[-1].any() and covered[:, 0].any() and covered[:, -1].any()
            drawn_pixels[y0:y1, x0:x1] += covered
            assert overlap_ok(shape.box, [s.box for s in shapes[:k]])
            # the image shows the object there: its fully covered pixels are near its colour (jitter, light, noise)
            inside = image[y0:y1, x0:x1][shape.coverage == 1].astype(np.float64)  # (m, 3)
            assert len(inside) > 0
            assert np.linalg.norm(inside.mean(axis=0) - PALETTE[shape.colour]) < 60
        assert drawn_pixels.max() == 1  # no two objects draw the same pixel
    for (height, width, _), shapes in drawn:
        assert all(0 <= s.box[0] < s.box[2] <= width and 0 <= s.box[1] < s.box[3] <= height for s in shapes)


def test_sizes_spread_from_10_to_60_pixels_a_third_small(drawn):
    sizes = np.array([np.sqrt((s.box[2] - s.box[0]) * (s.box[3] - s.box[1])) for _, shapes in drawn for s in shapes])
    assert len(sizes) > 300
    assert 8 <= sizes.min() and sizes.max() <= 64
    assert 0.25 <= np.mean(sizes < 32) <= 0.42
    assert np.mean(sizes < 16) > 0.05 and np.mean(sizes > 48) > 0.15  # both ends are there
    per_image = Counter(len(shapes) for _, shapes in drawn)
    assert set(per_image) == set(range(1, MAX_OBJECTS + 1))
    assert {tuple(shape[1::-1]) for shape, _ in drawn} == set(IMAGE_SIZES)  # (width, height)


def test_colour_does_not_give_the_class_away(drawn):
    objects = [(s.label, s.colour, s.filled) for _, shapes in drawn for s in shapes]
    counts = Counter(label for label, _, _ in objects)
    assert set(counts) == set(range(len(CLASSES))) and min(counts.values()) > len(objects) / 8
    for label in range(len(CLASSES)):
        colours = {colour for lab, colour, _ in objects if lab == label}
        assert len(colours) >= 8  # each class in most of the palette's 10 colours
        assert {filled for lab, _, filled in objects if lab == label} == {True, False}
    # Guessing the class from the colour (each colour's most frequent class) does little better than chance (1/4).
    by_colour = Counter((colour, label) for label, colour, _ in objects)
    best = sum(max(by_colour[colour, label] for label in range(len(CLASSES))) for colour in PALETTE)
    assert best / len(objects) < 0.4


def test_the_folder_is_a_coco_folder(tmp_path):
    root = write_shapes_folder(tmp_path, train=6, val=4, seed=3)
    train, val, info = load_coco_folder(root, short_side=None, check_images=True)  # decodes every image
    assert info.classes == CLASSES and info.category_ids == (1, 2, 3, 4)
    for split, data, count in (("train", train, 6), ("val", val, 4)):
        assert len(data) == count and data.report.skipped == [] and data.report.clipped == []
        coco = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        for index in range(count):
            image, shapes = draw_shapes_image(index, split, seed=3)
            assert np.array_equal(np.asarray(Image.open(root / split / f"{index:06d}.png")), image)
            found = [a for a in coco["annotations"] if a["image_id"] == index + 1]
            expected = [[s.box[0], s.box[1], s.box[2] - s.box[0], s.box[3] - s.box[1]] for s in shapes]
            assert [a["bbox"] for a in found] == expected
            assert [a["category_id"] for a in found] == [s.label + 1 for s in shapes]
            assert [a["area"] for a in found] == [w * h for _, _, w, h in expected]
            assert all(a["iscrowd"] == 0 for a in found)
    stats = detection_stats(train)
    assert stats.images == 6 and stats.boxes == sum(len(draw_shapes_image(i, seed=3)[1]) for i in range(6))
