"""A detector's explorer: each detection's query, in every decoder layer, with what it attended to: DETR's dense
cross-attention (quantised to 8 bits per row) and Deformable DETR's sampling points, equal to what
`capture_attention` records; and in the browser, clicking a detection draws its query's map or points. The page is
drawn by the time it has loaded; its points are drawn as `vitkit attention`'s figure draws them (its level colours,
over the image in grey); its costs are those of the size each image ran at."""

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image
from test_explore import AT_LOAD, browser_page, unpack

import vitkit
from vitkit.infer.detect import detector_inputs
from vitkit.infer.explore import dequantise, detector_explorer_data
from vitkit.infer.object_attention import sampled_points
from vitkit.layers import capture_attention
from vitkit.viz.detection import POINT_COLOURS
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


QUADRANTS = ((220, 40, 40), (40, 200, 60), (40, 80, 230), (240, 220, 30))  # top left, top right, then bottom


def quadrants() -> Image.Image:
    """A 96 x 128 picture of four flat colours, so that the colour drawn inside each is known."""
    pixels = np.zeros((96, 128, 3), dtype=np.uint8)
    for k, colour in enumerate(QUADRANTS):
        pixels[48 * (k // 2) : 48 * (k // 2 + 1), 64 * (k % 2) : 64 * (k % 2 + 1)] = colour
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def deformable_page(tmp_path_factory):
    """A Deformable DETR's page of two pictures of different shapes: (model, data, path)."""
    model = detector("deformable_detr_small")
    wide = Image.fromarray(np.random.default_rng(1).integers(0, 255, (48, 160, 3), dtype=np.uint8))
    data = detector_explorer_data(model, INFO, [("a.png", quadrants()), ("b.png", wide)], threshold=0.0)
    path = tmp_path_factory.mktemp("deformable") / "page.html"
    path.write_text(explorer_page(data), encoding="utf-8")
    return model, data, path


def canvas_pixels(page, selector: str = "#image") -> np.ndarray:
    """The canvas's pixels as drawn (H, W, 4), RGBA."""
    url = page.evaluate(f"document.querySelector({selector!r}).toDataURL('image/png')")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as picture:
        return np.asarray(picture.convert("RGBA")).astype(int)


def most_common(pixels: np.ndarray) -> tuple[int, ...]:
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0, return_counts=True)
    return tuple(int(v) for v in colours[counts.argmax()])


@pytest.mark.parametrize("name", ["detr_tiny", "deformable_detr_small"])
def test_the_first_view_is_drawn_by_the_time_the_page_has_loaded(name, tmp_path):
    """A screenshot taken as soon as the page has loaded (as `chromium --headless --screenshot` takes it) shows the
    first detection's view: the canvas is the picture's size and fully drawn at the load event, and the screenshot
    right after it shows what the canvas holds."""
    model = detector(name)
    data = detector_explorer_data(model, INFO, [("a.png", quadrants())], threshold=0.0)
    (tmp_path / "page.html").write_text(explorer_page(data), encoding="utf-8")
    with browser_page(tmp_path / "page.html", ready=False, init_script=AT_LOAD) as (page, errors, _):
        shot = page.locator("#image").screenshot()  # before anything else is waited for
        at_load = page.evaluate("window.atLoad")
        assert (at_load["width"], at_load["height"]) == (4 * 128, 4 * 96)  # the picture, enlarged 4 times
        assert at_load["opaque"] == 1.0  # every pixel drawn: the picture covers the canvas
        assert data["images"][0]["detections"][0]["label"] in at_load["title"]
        with Image.open(io.BytesIO(shot)) as picture:
            shown = np.asarray(picture.convert("RGB")).astype(int)
        drawn = canvas_pixels(page)[..., :3]
        H, W = drawn.shape[:2]  # the element's box may start and end inside a pixel: one more row, column shot
        offsets = [(dy, dx) for dy in range(shown.shape[0] - H + 1) for dx in range(shown.shape[1] - W + 1)]
        assert min(np.abs(shown[dy : dy + H, dx : dx + W] - drawn).mean() for dy, dx in offsets) < 1
        assert shown.std() > 10 and (shown < 250).any(axis=-1).mean() > 0.5  # not blank, not white
        assert page.locator("#grey").is_checked() == (name != "detr_tiny")  # as each one's figure draws it
    assert errors == []


def test_the_points_take_the_level_colours_of_the_figure(deformable_page, tmp_path):
    """The page's data holds `vitkit attention`'s level colours, its legend shows them in order, and the dots are
    drawn in the colours the data holds."""
    _, data, path = deformable_page
    assert data["level_colours"] == list(POINT_COLOURS)
    levels = data["images"][0]["layers"][0]["levels"]
    rgb = [f"rgb({int(c[1:3], 16)}, {int(c[3:5], 16)}, {int(c[5:7], 16)})" for c in POINT_COLOURS[: len(levels)]]
    with browser_page(path) as (page, errors, _):
        legend = page.locator("#levels .dot").evaluate_all("dots => dots.map(d => getComputedStyle(d).backgroundColor)")
        assert legend == rgb
        assert page.locator("#levels").inner_text().count("stride") == len(levels)
    assert errors == []

    green = {**data, "level_colours": ["#00ff00"] * len(POINT_COLOURS)}  # drawn from the data, not from the page
    (tmp_path / "green.html").write_text(explorer_page(green), encoding="utf-8")
    for page_path, expected in ((path, False), (tmp_path / "green.html", True)):
        with browser_page(page_path) as (page, _, _):
            pixels = canvas_pixels(page)
            dots = (pixels[..., 1] > 200) & (pixels[..., 0] < 60) & (pixels[..., 2] < 60)
            assert (dots.sum() > 20) == expected


def test_the_image_is_grey_under_the_points_as_in_the_figure(deformable_page):
    """On by default, as `vitkit attention`'s figure draws the points: the picture in PIL's grey (`convert("L")`)
    at 0.75 over white; the toggle shows it in colour."""
    _, _, path = deformable_page
    with browser_page(path) as (page, errors, _):
        assert page.locator("#grey").is_checked()
        for grey in (True, False):
            pixels = canvas_pixels(page)[..., :3]
            H, W = pixels.shape[:2]
            for k, colour in enumerate(QUADRANTS):
                quadrant = pixels[H // 2 * (k // 2) : H // 2 * (k // 2 + 1), W // 2 * (k % 2) : W // 2 * (k % 2 + 1)]
                luma = Image.new("RGB", (1, 1), colour).convert("L").getpixel((0, 0))
                expected = (0.75 * luma + 0.25 * 255,) * 3 if grey else colour
                np.testing.assert_allclose(most_common(quadrant), expected, atol=1)
            page.locator("#grey").uncheck()
        assert not page.evaluate("window.vitkitExplorer.state.grey")
    assert errors == []


def test_the_costs_are_those_of_the_size_each_image_ran_at(deformable_page):
    """Each image's costs are the model's at the size the image was resized to (not the model's `img_size`, which
    the panel gives besides), as `vitkit.profile` counts them; the panel shows the picture's."""
    model, data, path = deformable_page
    assert data["costs"]["input"] == [96, 96]  # the model's own size
    assert [one["padded"] for one in data["images"]] == [[96, 128], [96, 320]]  # short side 96, as the model resizes
    for one in data["images"]:
        report = vitkit.profile(model, tuple(one["padded"]))
        assert one["costs"]["input"] == one["padded"]
        assert one["costs"]["gflops"] == pytest.approx(report.flops / 1e9)
        assert one["costs"]["activation_mib"] == pytest.approx(report.activation_bytes / 2**20)
        assert one["costs"]["gflops"] > data["costs"]["gflops"]
    with browser_page(path) as (page, errors, _):
        for index in (0, 1, 0):
            page.select_option("#picture", index=index)
            costs, text = data["images"][index]["costs"], page.locator("#totals").inner_text()
            assert f"{costs['input'][0]}x{costs['input'][1]}" in text and f"{costs['gflops']:.2f} GFLOPs" in text
            assert f"own size 96x96: {data['costs']['gflops']:.2f} GFLOPs" in text
    assert errors == []
