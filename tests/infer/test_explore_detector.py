"""A detector's explorer: each detection's query, in every decoder layer, with what it attended to: DETR's dense
cross-attention (quantised to 8 bits per row) and Deformable DETR's sampling points, equal to what
`capture_attention` records; and in the browser, clicking a detection draws its query's map or points."""

import numpy as np
import pytest
import torch
from PIL import Image
from test_explore import browser_page, unpack

import vitkit
from vitkit.infer.detect import detector_inputs
from vitkit.infer.explore import dequantise, detector_explorer_data
from vitkit.infer.object_attention import sampled_points
from vitkit.layers import capture_attention
from vitkit.viz.explorer import explorer_page
from vitkit.weights import ModelInfo

CLASSES = ("circle", "square", "cross")
INFO = ModelInfo(CLASSES, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), category_ids=(1, 2, 3))


def detector(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model(name, num_classes=len(CLASSES)).eval()


def picture() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8))


def captured(model, image):
    names = model.object_attention_layers()
    pixels, mask, _ = detector_inputs(model, INFO, [image])
    with torch.no_grad(), capture_attention(model, names) as maps:
        model.predict(pixels, mask)
    real = (int(mask[0, :, 0].sum()), int(mask[0, 0, :].sum()))
    return [maps[n] for n in names], (pixels.shape[-2], pixels.shape[-1]), real


def test_detr_pages_hold_each_querys_cross_attention():
    model, image = detector("detr_tiny"), picture()
    data = detector_explorer_data(model, INFO, [("a.png", image)], threshold=0.0, name="detr")
    one = data["images"][0]
    queries = [d["query"] for d in one["detections"]]
    assert len(queries) == model.config.num_queries and one["size"] == [96, 128]
    records, _, _ = captured(model, image)
    assert len(one["layers"]) == len(records)
    for layer, record in zip(one["layers"], records, strict=True):
        n, h, hw = layer["shape"]
        codes = unpack(layer["attention"], np.uint8).reshape(n, h, hw)
        scales = unpack(layer["scales"], np.float32).reshape(n, h)
        expected = record[0][:, queries].transpose(0, 1).double().numpy()  # (n, h, hw)
        np.testing.assert_allclose(dequantise(codes, scales), expected, atol=float(scales.max()) / 510 + 1e-6)
        assert layer["grid"][0] * layer["grid"][1] == hw


def test_deformable_pages_hold_each_querys_sampling_points():
    model, image = detector("deformable_detr_small"), picture()
    data = detector_explorer_data(model, INFO, [("a.png", image)], threshold=0.0)
    one = data["images"][0]
    queries = [d["query"] for d in one["detections"]]
    records, padded, real = captured(model, image)
    for layer, record in zip(one["layers"], records, strict=True):
        samples = sampled_points(record, queries, padded, real, (96, 128))
        points = unpack(layer["points"], np.float32).reshape(*layer["shape"], 2)
        np.testing.assert_allclose(points, samples.points.numpy(), rtol=1e-6, atol=1e-4)
        weights = unpack(layer["weights"], np.float32).reshape(layer["shape"])
        np.testing.assert_allclose(weights, samples.weights.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["detr_tiny", "deformable_detr_small"])
def test_clicking_a_detection_in_the_browser(name, tmp_path):
    """Then the second picture, of another shape: its detections, and the colour bar (DETR's maps) or the levels'
    legend (Deformable DETR's points) under it, as under the first."""
    model, image = detector(name), picture()
    wide = Image.fromarray(np.random.default_rng(1).integers(0, 255, (48, 160, 3), dtype=np.uint8))
    data = detector_explorer_data(model, INFO, [("a.png", image), ("b.png", wide)], threshold=0.0)
    (tmp_path / "page.html").write_text(explorer_page(data), encoding="utf-8")
    records, padded, real = captured(model, image)
    one = data["images"][0]
    with browser_page(tmp_path / "page.html") as (page, errors, _):
        assert page.locator("#detections button").count() == len(one["detections"])
        page.locator("#detections button").nth(2).click()
        page.evaluate("window.vitkitExplorer.setLayer(0)")
        query = one["detections"][2]["query"]
        if name == "detr_tiny":
            drawn = np.array(page.evaluate("Array.from(window.vitkitExplorer.shown.values)"))
            expected = records[0][0, :, query].mean(dim=0).double().numpy()  # the heads' mean over the feature map
            np.testing.assert_allclose(drawn, expected, atol=float(records[0][0, :, query].max()) / 510 + 1e-6)
        else:
            drawn = np.array(page.evaluate("window.vitkitExplorer.shown.points"))  # (h L K, 4): x, y, weight, level
            samples = sampled_points(records[0], [query], padded, real, (96, 128))
            h = samples.weights.shape[1]
            np.testing.assert_allclose(drawn[:, :2], samples.points[0].reshape(-1, 2).numpy(), atol=1e-3)
            np.testing.assert_allclose(drawn[:, 2], samples.weights[0].reshape(-1).numpy() / h, atol=1e-6)
        assert one["detections"][2]["label"] in page.locator("#title").inner_text()
        sampled = name != "detr_tiny"
        for picture_index in (1, 0, 1):
            page.select_option("#picture", index=picture_index)
            shown = data["images"][picture_index]
            assert page.locator("#detections button").count() == len(shown["detections"])
            page.locator("#detections button").nth(1).click()
            assert shown["detections"][1]["label"] in page.locator("#title").inner_text()
            assert page.locator("#levels").is_visible() == sampled and page.locator("#bar").is_visible() != sampled
            if sampled:
                assert page.locator("#levels").inner_text().count("level") == len(shown["layers"][0]["levels"])
    assert errors == []


def test_detr_pages_hold_the_encoders_self_attention_at_every_position():
    """DETR's figure 3: each encoder layer's self-attention of every position of the feature map."""
    model, image = detector("detr_tiny"), picture()
    one = detector_explorer_data(model, INFO, [("a.png", image)], threshold=0.5)["images"][0]
    pixels, mask, _ = detector_inputs(model, INFO, [image])
    with torch.no_grad(), capture_attention(model) as maps:
        model.predict(pixels, mask)
    names = [f"encoder.layers.{i}.self_attn" for i in range(len(model.encoder.layers))]
    assert [e["name"] for e in one["encoder"]] == names
    for entry, name in zip(one["encoder"], names, strict=True):
        h, (gh, gw) = entry["heads"], entry["grid"]
        codes = unpack(entry["attention"], np.uint8).reshape(h, gh * gw, gh * gw)
        scales = unpack(entry["scales"], np.float32).reshape(h, gh * gw)
        expected = maps[name][0].double().numpy()
        np.testing.assert_allclose(dequantise(codes, scales), expected, atol=float(scales.max()) / 510 + 1e-6)


def test_picking_a_point_shows_the_encoders_attention_there(tmp_path):
    model, image = detector("detr_tiny"), picture()
    data = detector_explorer_data(model, INFO, [("a.png", image)], threshold=0.5)
    (tmp_path / "page.html").write_text(explorer_page(data), encoding="utf-8")
    pixels, mask, _ = detector_inputs(model, INFO, [image])
    with torch.no_grad(), capture_attention(model) as maps:
        model.predict(pixels, mask)
    one = data["images"][0]
    gh, gw = one["encoder"][0]["grid"]
    with browser_page(tmp_path / "page.html") as (page, errors, _):
        page.get_by_label("a point: the encoder's self-attention there").check()
        # a point in image pixels -> the padded input (the image fills its top-left `real` part) -> the map
        x, y = 100.0, 30.0
        page.evaluate(f"window.vitkitExplorer.pickPoint({x}, {y})")
        ix, iy = x * one["real"][1] / 128, y * one["real"][0] / 96
        cell = int(iy / one["padded"][0] * gh) * gw + int(ix / one["padded"][1] * gw)
        assert page.evaluate("window.vitkitExplorer.shown.cell") == cell
        drawn = np.array(page.evaluate("Array.from(window.vitkitExplorer.shown.values)"))
        last = maps[one["encoder"][-1]["name"]][0, :, cell]  # the last encoder layer, every head: (h, hw)
        np.testing.assert_allclose(drawn, last.mean(0).double().numpy(), atol=float(last.max()) / 510 + 1e-6)
        assert "encoder's self-attention" in page.locator("#title").inner_text()
    assert errors == []


def test_deformable_pages_hold_the_encoders_sampling_points_and_draw_them(tmp_path):
    """A deformable encoder's point view: each position of the finest level with the points its query sampled, in
    image pixels; picking a point in the browser draws its position's points."""
    model, image = detector("deformable_detr_small"), picture()
    data = detector_explorer_data(model, INFO, [("a.png", image)], threshold=0.5)
    one = data["images"][0]
    pixels, mask, _ = detector_inputs(model, INFO, [image])
    with torch.no_grad(), capture_attention(model) as maps:
        model.predict(pixels, mask)
    padded, real = (pixels.shape[-2], pixels.shape[-1]), (int(mask[0, :, 0].sum()), int(mask[0, 0, :].sum()))
    decoder = set(model.object_attention_layers())
    names = [n for n, r in maps.items() if n not in decoder and not isinstance(r, torch.Tensor)]
    assert [e["name"] for e in one["encoder"]] == names and names
    h0, w0 = one["encoder"][0]["grid"]
    for entry, name in zip(one["encoder"], names, strict=True):
        samples = sampled_points(maps[name], list(range(h0 * w0)), padded, real, (96, 128))
        points = unpack(entry["points"], np.float32).reshape(*entry["shape"], 2)
        np.testing.assert_allclose(points, samples.points.numpy(), rtol=1e-6, atol=1e-4)
    (tmp_path / "page.html").write_text(explorer_page(data), encoding="utf-8")
    with browser_page(tmp_path / "page.html") as (page, errors, _):
        page.evaluate("window.vitkitExplorer.pickPoint(70, 20)")  # switches to the point view
        ix, iy = 70 * real[1] / 128, 20 * real[0] / 96
        cell = int(iy / padded[0] * h0) * w0 + int(ix / padded[1] * w0)
        assert page.evaluate("window.vitkitExplorer.shown.cell") == cell
        drawn = np.array(page.evaluate("window.vitkitExplorer.shown.points"))  # (h L K, 4): x, y, weight, level
        last = sampled_points(maps[names[-1]], [cell], padded, real, (96, 128))
        np.testing.assert_allclose(drawn[:, :2], last.points[0].reshape(-1, 2).numpy(), atol=1e-3)
        heads = last.weights.shape[1]
        np.testing.assert_allclose(drawn[:, 2], last.weights[0].reshape(-1).numpy() / heads, atol=1e-6)
        assert "encoder's sampling points there" in page.locator("#title").inner_text()
    assert errors == []


def test_explore_takes_a_registered_detector(tmp_path, capsys):
    """`vitkit explore --model NAME` writes a detector's page for a registered detector, as for a directory, with
    --threshold; for a classifier --threshold stays an error."""
    from vitkit.cli import main

    picture().save(tmp_path / "a.png")
    out = tmp_path / "page.html"
    args = ["explore", "--model", "detr_tiny", str(tmp_path / "a.png"), "--out", str(out), "--threshold", "0"]
    assert main(args) == 0
    assert "detection(s) above 0.00" in capsys.readouterr().out and out.stat().st_size > 0
    args = ["explore", "--model", "vit_tiny_patch16_224", str(tmp_path / "a.png"), "--out", str(out)]
    assert main([*args, "--threshold", "0.5"]) == 2
    assert "this is a classifier" in capsys.readouterr().err
