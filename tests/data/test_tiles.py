"""Training tiles (`vitkit.data.tiles`): a box is clipped to its tile and kept when half of it lies inside, checked
against counting its pixels; a tile drawn from an image holds its pixels and those boxes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_convert

from vitkit.data.coco import CocoDetection
from vitkit.data.detection import DetectionAugment
from vitkit.data.tiles import MIN_VISIBLE, TiledDetection, tile_grid, window_boxes


def brute_force(boxes: np.ndarray, window: tuple[int, int, int, int]) -> tuple[list, list]:
    """Each integer box drawn as pixels: kept when at least MIN_VISIBLE of them lie in the window; its box there the
    bounding box of those pixels, in the window's coordinates."""
    x0, y0, x1, y1 = window
    kept, clipped = [], []
    for i, (bx0, by0, bx1, by1) in enumerate(boxes.astype(int)):
        mask = np.zeros((600, 600), bool)
        mask[by0:by1, bx0:bx1] = True
        inside = mask[y0:y1, x0:x1]
        if inside.any() and inside.sum() >= MIN_VISIBLE * mask.sum():
            ys, xs = np.nonzero(inside)
            kept.append(i)
            clipped.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    return kept, clipped


def test_a_tile_keeps_the_boxes_half_inside_it_clipped():
    rng = np.random.default_rng(0)
    corners = rng.integers(0, 500, (300, 2))
    boxes = np.concatenate([corners, corners + rng.integers(1, 90, (300, 2))], 1).astype(np.float32)
    for window in [(100, 120, 356, 376), (0, 0, 128, 128), (300, 250, 600, 600), (77, 0, 141, 64)]:
        clipped, kept = window_boxes(boxes, window)
        expected_kept, expected = brute_force(boxes, window)
        assert kept.tolist() == expected_kept
        np.testing.assert_array_equal(clipped, np.array(expected, np.float32).reshape(-1, 4))
        assert 0 < len(kept) < len(boxes)


@pytest.fixture
def big_image(tmp_path):
    """A 300x420 COCO image of noise with 40 boxes (category ids 5 and 9)."""
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (300, 420, 3), dtype=np.uint8)).save(tmp_path / "big.png")
    corners = rng.integers(0, 360, (40, 2)) * np.array([1, 0.7])
    annotations = [
        {"id": i + 1, "image_id": 1, "category_id": 5 + 4 * (i % 2), "bbox": [float(x), float(y), 30.0, 24.0],
         "area": 720.0, "iscrowd": 0}
        for i, (x, y) in enumerate(corners)
    ]  # fmt: skip
    data = {
        "images": [{"id": 1, "file_name": "big.png", "height": 300, "width": 420}],
        "annotations": annotations,
        "categories": [{"id": 5, "name": "a"}, {"id": 9, "name": "b"}],
    }
    (tmp_path / "big.json").write_text(json.dumps(data))
    return tmp_path


def test_a_training_tile_holds_its_pixels_and_boxes(big_image):
    """Tiles of 128 px at a shorter side of 128 (no resize, no flip): each key's tile is the image's crop at the
    position its seed draws, with the boxes `window_boxes` keeps; an epoch holds as many tiles as the grid."""
    plain = dict(short_side=128, max_size=None, mean=(0.0,) * 3, std=(1.0,) * 3)
    data = CocoDetection(big_image / "big.json", big_image, **plain, augment=DetectionAugment())
    tiles = TiledDetection(data, 128)
    assert len(tiles) == len(tile_grid(300, 420, 128)) == 15  # 5 x 3
    pixels = torch.from_numpy(np.array(Image.open(big_image / "big.png"))).permute(2, 0, 1).float() / 255
    windows = set()
    for key in [(0, 11, 11), (3, 12, 12), (7, 99, 99), 5]:
        image, target = tiles[key]
        x0, y0, x1, y1 = window = tiles.window(key)
        windows.add(window)
        torch.testing.assert_close(image, pixels[:, y0:y1, x0:x1])
        expected, kept = window_boxes(data.samples[0].boxes, window)
        boxes = box_convert(target["boxes"], "cxcywh", "xyxy") * 128
        torch.testing.assert_close(boxes, torch.from_numpy(expected), atol=1e-4, rtol=0)
        assert target["labels"].tolist() == data.samples[0].labels[kept].tolist()
    assert len(windows) == 4  # seeds draw different places
    assert tiles.window(5) == tile_grid(300, 420, 128)[5].box
