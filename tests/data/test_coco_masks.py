"""Instance masks in a COCO folder: polygons and RLE (compressed and not) read as pycocotools reads them, bad ones
skipped and reported by id, and every mask following its image through flips, crops, resizes and tiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from vitkit.data.coco import CocoDetection, DetectionAugment
from vitkit.data.shapes import draw_shapes_image, write_shapes_folder
from vitkit.data.tiles import TiledDetection

SIZE = (90, 120)  # (height, width) of every image


def polygon(cx: float, cy: float, r: float, sides: int, turn: float) -> list[float]:
    angles = turn + np.arange(sides) * 2 * np.pi / sides
    return np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1).reshape(-1).round(2).tolist()


def write_folder(root: Path, count: int = 6) -> Path:
    """`count` images whose white pixels are exactly their objects (black elsewhere), each object annotated as a
    polygon, compressed RLE or uncompressed RLE in turn; returns the JSON."""
    rng = np.random.default_rng(0)
    images, annotations = [], []
    (root / "images").mkdir(parents=True)
    height, width = SIZE
    for image_id in range(1, count + 1):
        masks = []
        for _ in range(3):
            points = polygon(*rng.uniform(25, 65, 2), rng.uniform(8, 20), int(rng.integers(3, 8)), rng.uniform(0, 6))
            masks.append(mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([points], height, width))))
            kind = len(annotations) % 3
            if kind == 0:
                segmentation = [points]
            else:
                rle = mask_utils.encode(np.asfortranarray(masks[-1]))
                if kind == 1:
                    segmentation = {"size": [height, width], "counts": rle["counts"].decode("ascii")}
                else:  # uncompressed: run lengths column by column, as COCO's crowd annotations
                    flat = masks[-1].flatten(order="F")
                    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
                    segmentation = {"size": [height, width], "counts": np.diff(np.concatenate([[0], changes])).tolist()}
            x0, y0, w, h = mask_utils.toBbox(mask_utils.encode(np.asfortranarray(masks[-1]))).tolist()
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": 1 + len(annotations) % 2,
                 "bbox": [x0, y0, w, h], "area": w * h, "iscrowd": 0, "segmentation": segmentation}
            )  # fmt: skip
        pixels = (np.max(masks, axis=0) * 255).astype(np.uint8)
        Image.fromarray(np.repeat(pixels[..., None], 3, axis=2)).save(root / "images" / f"{image_id}.png")
        images.append({"id": image_id, "file_name": f"{image_id}.png", "height": height, "width": width})
    path = root / "instances.json"
    categories = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("masks"))


def white(image: torch.Tensor) -> torch.Tensor:
    """The pixels of a normalised model input that are more white than black: (h, w) bool."""
    return image[0] > (image[0].max() + image[0].min()) / 2


def test_polygons_and_rle_read_as_pycocotools_reads_them(folder):
    data = CocoDetection(folder, folder.parent / "images", short_side=None, max_size=None)
    assert data.with_masks and data.report.masks == 18
    coco = COCO(str(folder))
    for sample in data.samples:
        expected = np.stack([coco.annToMask(a) for a in coco.loadAnns(coco.getAnnIds(imgIds=sample.image_id))])
        np.testing.assert_array_equal(sample.decoded_masks(), expected)
        _, target = data[data.samples.index(sample)]
        torch.testing.assert_close(target["masks"], torch.from_numpy(expected).bool())  # the stored size


def test_bad_masks_are_skipped_and_reported_by_id(tmp_path):
    path = write_folder(tmp_path, count=1)
    data = json.loads(path.read_text())
    first = data["annotations"][0]
    height, width = SIZE
    bad = {
        101: [[1, 2, 3, 4]],  # two points
        102: [[-50, -50, -40, -50, -45, -30]],  # wholly outside the image
        103: [[10, 10, 20, 10, 30, 10]],  # three points on a line: no pixel
        104: {"size": [height + 1, width], "counts": "abc"},  # another image's size
        105: {"size": [height, width], "counts": 7},
        106: "a string",
    }
    data["annotations"] += [{**first, "id": i, "segmentation": s} for i, s in bad.items()]
    path.write_text(json.dumps(data))
    loaded = CocoDetection(path, tmp_path / "images", short_side=None, max_size=None)
    reasons = {s.id: s.reason for s in loaded.report.skipped}
    assert reasons == {
        101: "bad segmentation", 102: "mask outside image", 103: "empty mask", 104: "bad segmentation",
        105: "bad segmentation", 106: "bad segmentation",
    }  # fmt: skip
    assert loaded.with_masks and loaded.report.annotations == 3
    details = {s.id: s.detail for s in loaded.report.skipped}
    assert details[104] == f"RLE size [{height + 1}, {width}] is not the image's [{height}, {width}]"
    # one object without a segmentation: boxes only, and the report says why
    data["annotations"] = data["annotations"][:3]
    del data["annotations"][1]["segmentation"]
    path.write_text(json.dumps(data))
    partial = CocoDetection(path, tmp_path / "images", short_side=None, max_size=None)
    assert not partial.with_masks and "masks" not in partial[0][1]
    assert "masks not used: 1 of 3 annotations have no segmentation" in str(partial.report)


def test_masks_follow_their_image_through_flips_crops_resizes_and_tiles(folder):
    """The image's white pixels are its objects: after any augmentation the masks lie on white pixels (up to the
    edge pixels a resize blends; a crop or a tile may drop an object and leave its pixels), unaugmented they are
    the white pixels, and every object's mask lies in its box."""
    augment = DetectionAugment(hflip=0.5, scale_jitter=0.3, crop=1.0)
    data = CocoDetection(folder, folder.parent / "images", short_side=70, max_size=None, augment=augment)
    tiled = TiledDetection(CocoDetection(folder, folder.parent / "images", short_side=None, max_size=None), 48)
    keys = [(data, (i, 100 + i, 7 + i)) for i in range(6)] + [(data, i) for i in range(6)]
    keys += [(tiled, (i, 50 + i)) for i in range(0, len(tiled), 3)]
    for dataset, key in keys:
        image, target = dataset[key]
        masks = target["masks"]
        assert masks.shape == (len(target["boxes"]), *image.shape[-2:])
        if len(masks) == 0:
            continue
        union, seen = masks.any(0), white(image)
        assert (union & seen).sum() / union.sum() > 0.97, key
        if not isinstance(key, tuple):
            assert (union & seen).sum() / (union | seen).sum() > 0.98, key
        H, W = image.shape[-2:]
        for mask, (cx, cy, w, h) in zip(masks, target["boxes"].tolist(), strict=True):
            ys, xs = torch.nonzero(mask, as_tuple=True)
            assert len(xs) > 0
            assert xs.min() >= (cx - w / 2) * W - 2 and xs.max() + 1 <= (cx + w / 2) * W + 2, key
            assert ys.min() >= (cy - h / 2) * H - 2 and ys.max() + 1 <= (cy + h / 2) * H + 2, key


def test_the_shapes_example_writes_polygons_and_outlines_as_rle(tmp_path):
    write_shapes_folder(tmp_path, train=4, val=1)
    coco = COCO(str(tmp_path / "annotations" / "instances_train.json"))
    kinds = set()
    for image_id in coco.getImgIds():
        pixels, shapes = draw_shapes_image(image_id - 1, "train")
        anns = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
        assert len(anns) == len(shapes)
        for ann, shape in zip(anns, shapes, strict=True):
            drawn, written = shape.mask(*pixels.shape[:2]), coco.annToMask(ann).astype(bool)
            kinds.add(type(ann["segmentation"]).__name__)
            if shape.filled:  # the polygon: the shape's half-coverage level, rasterised by pycocotools
                assert isinstance(ann["segmentation"], list)
                assert (drawn & written).sum() / (drawn | written).sum() > 0.9
            else:  # an outline's ring, exactly
                np.testing.assert_array_equal(written, drawn)
    assert kinds == {"list", "dict"}
