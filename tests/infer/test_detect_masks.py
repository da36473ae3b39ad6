"""A detector that predicts masks gives each detection its mask in pixels of the image as given (RLE in
detections.json), in tiles too, and the pictures fill and outline them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from pycocotools import mask as mask_utils

import vitkit
from vitkit.infer import detect_files, write_detections
from vitkit.infer.detect import detection_input
from vitkit.infer.tiles import detect_tiled
from vitkit.viz import draw_detections
from vitkit.weights import ModelInfo

CLASSES = ("a", "b")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = vitkit.create_model(
        "deformable_detr_small", masks=True, num_classes=2, hidden_dim=32, num_heads=2, dim_feedforward=32,
        enc_layers=1, dec_layers=2, num_queries=5, img_size=64, backbone_width=8,
    )  # fmt: skip
    with torch.no_grad():  # masks that are not all empty or all full: the pixel embeddings moved off their init
        net.mask_head.pixel_linear.bias.normal_(0, 2)
    return net.eval()


INFO = ModelInfo(CLASSES, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), category_ids=(1, 2))


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("images") / "photo.png"
    Image.fromarray(rng.integers(0, 255, (90, 150, 3), dtype=np.uint8)).save(path)
    return path


def test_each_detection_has_its_mask_in_pixels_of_the_image(model, image_path):
    (found,) = detect_files(model, INFO, [image_path], threshold=0.0)
    assert found.size == (90, 150) and found.detections
    image = Image.open(image_path)
    x = detection_input(image, 64, 3, INFO.mean, INFO.std)[None]  # (1, 3, 64, 107): resized as predict does
    with torch.no_grad():
        out = model.predict(x)
    logits = out["pred_masks"][0]  # (Q, 16, 27)
    # written out: the query's logits at 4x, cut to the resized image, resampled to the image as given
    full = F.interpolate(logits[:, None], scale_factor=4, mode="bilinear", align_corners=False)[:, :, :64, :107]
    expected = F.interpolate(full, size=(90, 150), mode="bilinear", align_corners=False)[:, 0] > 0  # (Q, 90, 150)
    probs = out["pred_logits"][0].sigmoid()  # (Q, 2)
    shown = 0
    for d in found.detections:
        mask = d.mask_array()
        assert mask.shape == (90, 150) and d.to_dict()["mask"]["size"] == [90, 150]
        query = next(q for q in range(len(probs)) if abs(probs[q, CLASSES.index(d.label)] - d.score) < 1e-6)
        assert (mask != expected[query].numpy()).mean() < 0.002  # the same up to rounding at a few edge pixels
        shown += mask.any()
    assert shown  # some detection holds pixels: the check saw masks, not empty ones


def test_detections_json_holds_rle_and_the_picture_fills_the_masks(model, image_path, tmp_path):
    (found,) = detect_files(model, INFO, [image_path], threshold=0.0)
    pictures, listing = write_detections([found], tmp_path, CLASSES, 0.0)
    (row,) = json.loads(listing.read_text())
    for written, d in zip(row["detections"], found.detections, strict=True):
        rle = {**written["mask"], "counts": written["mask"]["counts"].encode()}
        np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), d.mask_array())
    # a drawing of one mask: inside it the image's colour moves towards the class colour, its edge takes it whole
    grey = Image.new("RGB", (60, 40), (128, 128, 128))
    mask = np.zeros((40, 60), dtype=bool)
    mask[10:30, 20:50] = True
    drawn = np.asarray(draw_detections(grey, [(18, 8, 52, 32)], ["a"], [0.9], CLASSES, masks=[mask]))
    factor = drawn.shape[0] // 40  # the picture is enlarged by a whole factor
    inside, edge, outside = drawn[20 * factor, 35 * factor], drawn[10 * factor, 35 * factor], drawn[2, 2]
    assert tuple(outside) == (128, 128, 128)
    colour = drawn[8 * factor, 35 * factor]  # the box's outline: the class colour
    assert tuple(edge) == tuple(colour) and tuple(inside) not in ((128, 128, 128), tuple(colour))
    assert pictures[0].exists()
    # three overlapping masks of one class: filled once where they overlap, each edge drawn
    shifted = [np.roll(mask, (dy, dx), axis=(0, 1)) for dy, dx in ((0, 0), (2, 3), (4, 6))]
    boxes = [(18 + dx, 8 + dy, 52 + dx, 32 + dy) for dy, dx in ((0, 0), (2, 3), (4, 6))]
    crowd = np.asarray(draw_detections(grey, boxes, ["a"] * 3, [0.9, 0.8, 0.7], CLASSES, masks=shifted))
    assert tuple(crowd[20 * factor, 35 * factor]) == tuple(inside)  # in all three: as in one
    assert tuple(crowd[12 * factor, 35 * factor]) == tuple(colour)  # the second mask's top edge, inside the first


def test_masks_found_in_tiles_lie_where_their_boxes_do(model, image_path):
    image = Image.open(image_path)
    found = detect_tiled(model, INFO, image, tile=64, threshold=0.0)
    assert found
    for d in found:
        mask = d.mask_array()
        assert mask.shape == (90, 150)
        if mask.any():
            ys, xs = np.nonzero(mask)
            x0, y0, x1, y1 = d.box
            # within the tile that found it: at most a tile's side from its box
            assert xs.min() >= x0 - 64 and xs.max() <= x1 + 64 and ys.min() >= y0 - 64 and ys.max() <= y1 + 64


def test_the_attention_figure_shows_each_objects_mask_beside_where_its_query_looked(model, image_path, tmp_path):
    from vitkit.infer.object_attention import detection_attention_figure
    from vitkit.viz.attention import save_picture

    image = Image.open(image_path)
    figure, detections, _ = detection_attention_figure(model, INFO, image, threshold=0.0)
    (found,) = detect_files(model, INFO, [image_path], threshold=0.0)
    assert detections and all(d.mask is not None for d in detections)
    for d in detections:  # the same masks predict gives its query (each query its best class here)
        same = next(f for f in found.detections if f.box == pytest.approx(d.box) and f.label == d.label)
        np.testing.assert_array_equal(same.mask_array(), d.mask_array())
    assert save_picture(figure, tmp_path / "objects.png").stat().st_size > 0


def test_the_explorer_fills_the_clicked_objects_mask_under_its_points(model, image_path, tmp_path):
    """The page holds each detection's mask as detections.json does (RLE); the page decodes it to pycocotools'
    mask, and with the toggle on, the canvas differs from the view without it inside the mask only."""
    from test_explore import browser_page
    from test_explore_detector import canvas_pixels

    from vitkit.infer.explore import detector_explorer_data
    from vitkit.viz.explorer import explorer_page

    image = Image.open(image_path).convert("RGB")
    data = detector_explorer_data(model, INFO, [("photo.png", image)], threshold=0.0)
    found = data["images"][0]["detections"]
    masks = [mask_utils.decode({**d["mask"], "counts": d["mask"]["counts"].encode()}).astype(bool) for d in found]
    k = next(i for i, m in enumerate(masks) if 0.01 < m.mean() < 0.99)  # a mask with an inside and an outside
    (tmp_path / "page.html").write_text(explorer_page(data), encoding="utf-8")
    with browser_page(tmp_path / "page.html") as (page, errors, _):
        assert page.locator("#mask-box").is_visible() and page.locator("#masks").is_checked()
        page.locator("#detections button").nth(k).click()
        decoded = np.array(page.evaluate(f"window.vitkitExplorer.maskOf({k})"), dtype=bool).reshape(90, 150)
        np.testing.assert_array_equal(decoded, masks[k])
        shown = canvas_pixels(page)
        page.locator("#masks").uncheck()
        bare = canvas_pixels(page)
    assert errors == []
    factor = shown.shape[0] // 90  # the picture enlarged a whole number of times (4)
    inside = np.kron(masks[k], np.ones((factor, factor), dtype=bool))
    changed = (shown != bare).any(axis=-1)
    assert not changed[~inside].any() and changed[inside].mean() > 0.5
