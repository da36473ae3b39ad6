"""The explorer for models whose attention the model lays on the image (`spatial_attention`): Swin's window attention
(each token's row over its shifted or regular window) and BoTNet's attention over its feature maps. Checked against
a brute-force window partition, the captured weights, and in the browser."""

import numpy as np
import torch
from PIL import Image
from test_explore import browser_page, unpack

import vitkit
from vitkit.infer.explore import dequantise, explorer_data
from vitkit.viz.explorer import explorer_page

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def swin():
    torch.manual_seed(0)
    # 64 px: a 16x16 first map of 4x4 windows, shifted by 2 in odd blocks
    return vitkit.create_model(
        "swin_tiny_patch4_window7_224", img_size=64, window_size=4, depths=(2, 2), num_heads=(2, 4), num_classes=5
    ).eval()


def picture() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))


def brute_force_window(r: int, c: int, size: int, window: int, shift: int) -> set[int]:
    """The tokens in the window of token (r, c) after rolling the map by -shift, as row-major indices."""
    rolled = ((r - shift) % size, (c - shift) % size)
    top, left = rolled[0] // window * window, rolled[1] // window * window
    cells = {((top + i + shift) % size, (left + j + shift) % size) for i in range(window) for j in range(window)}
    return {i * size + j for i, j in cells}


def test_swin_cells_attend_over_their_window():
    model = swin()
    x = vitkit.data.preprocess(picture(), (64, 64), 3, MEAN, STD)[None]
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        model(x)
    spatial = model.spatial_attention(maps, (64, 64))
    assert [a.layer for a in spatial] == [f"layers.{s}.blocks.{b}.attn" for s in range(2) for b in range(2)]
    assert [a.grid for a in spatial] == [(16, 16), (16, 16), (8, 8), (8, 8)]
    for a in spatial:
        size, shifted = a.grid[0], a.layer.endswith("1.attn")
        torch.testing.assert_close(a.weights.sum(-1), torch.ones(a.weights.shape[:-1]))
        for t in (0, 5, size * size - 1, size * 3 + size - 1):
            window = brute_force_window(t // size, t % size, size, 4, 2 if shifted else 0)
            assert set(a.keys[t].tolist()) == window
    # the shifted block's mask: a corner token's window wraps around, and it attends only to its own region
    corner = spatial[1].weights[0, :, 0]  # token (0, 0), every head: (h, 16)
    foreign = [k for k, key in enumerate(spatial[1].keys[0].tolist()) if key // 16 >= 14 or key % 16 >= 14]
    assert foreign and float(corner[:, foreign].max()) < 1e-6


def test_grid_pages_hold_the_weights_and_refuse_nothing():
    model = swin()
    data = explorer_data(model, [("a.png", picture())], MEAN, STD, name="swin")
    assert data["kind"] == "grid" and len(data["layers"]) == 4
    x = vitkit.data.preprocess(picture(), (64, 64), 3, MEAN, STD)[None]
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        model(x)
    for meta, page, a in zip(
        data["layers"], data["images"][0]["layers"], model.spatial_attention(maps, (64, 64)), strict=True
    ):
        keys = unpack(meta["keys"], np.int32).reshape(a.keys.shape)
        np.testing.assert_array_equal(keys, a.keys.numpy())
        h, Q, K = a.weights.shape[1:]
        codes = unpack(page["attention"], np.uint8).reshape(h, Q, K)
        scales = unpack(page["scales"], np.float32).reshape(h, Q)
        np.testing.assert_allclose(dequantise(codes, scales), a.weights[0].double().numpy(), atol=1 / 510 + 1e-6)
    botnet = vitkit.create_model("botnet26t_256", num_classes=3).eval()
    data = explorer_data(botnet, [("a.png", picture())], MEAN, STD)
    assert [m["grid"] for m in data["layers"]] == [[16, 16], [16, 16], [8, 8]]


def test_clicking_a_point_shows_its_window_in_the_browser(tmp_path):
    model = swin()
    (tmp_path / "page.html").write_text(explorer_page(explorer_data(model, [("a.png", picture())], MEAN, STD)))
    x = vitkit.data.preprocess(picture(), (64, 64), 3, MEAN, STD)[None]
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        model(x)
    spatial = model.spatial_attention(maps, (64, 64))
    with browser_page(tmp_path / "page.html") as (page, errors, _):
        page.evaluate("window.vitkitExplorer.setLayer(1)")  # the shifted block of the first stage
        box = page.locator("#image").bounding_box()
        page.mouse.click(box["x"] + box["width"] * (0.5 / 16), box["y"] + box["height"] * (3.5 / 16))  # cell (3, 0)
        assert page.evaluate("window.vitkitExplorer.shown.cell") == 3 * 16
        drawn = np.array(page.evaluate("Array.from(window.vitkitExplorer.shown.values)"))
        a = spatial[1]
        expected = np.zeros(256)
        np.add.at(expected, a.keys[48].numpy(), a.weights[0, :, 48].mean(0).double().numpy())
        np.testing.assert_allclose(drawn, expected, atol=float(a.weights[0, :, 48].max()) / 510 + 1e-6)
        assert "shifted by (2, 2)" in page.locator("#title").inner_text()
    assert errors == []
