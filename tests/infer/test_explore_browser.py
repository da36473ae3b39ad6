"""The explorer page in a real browser (headless Chromium, Debian's `chromium`, driven by Playwright with the system
browser; `make test` installs it where it can): it loads from disk with no console error and no network request;
clicking a patch draws the map of that patch's captured attention row (to the 8-bit quantisation); the layer, the
head, a register and rollout change the map to theirs. The page's own inflate reads what zlib writes."""

import base64
import zlib

import numpy as np
import pytest
import torch
from test_explore import AT_LOAD, MEAN, STD, browser_page, picture, registers_model
from test_explore_grid import swin

import vitkit
from vitkit.infer.attention import rollout_matrix
from vitkit.infer.explore import explorer_data
from vitkit.viz.explorer import explorer_page


@pytest.fixture(scope="module")
def explorer(tmp_path_factory):
    model = registers_model()
    image = picture()
    path = tmp_path_factory.mktemp("explorer") / "explorer.html"
    path.write_text(explorer_page(explorer_data(model, [("a.png", image)], MEAN, STD, name="reg")), encoding="utf-8")
    pixels = vitkit.data.preprocess(image, (56, 56), 3, MEAN, STD)[None]
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        model(pixels)
    captured = [m[0].double() for m in maps.values()]  # (h, N, N) per layer
    with browser_page(path, viewport={"width": 1200, "height": 900}) as (page, errors, requests):
        yield page, captured, errors, requests


@pytest.mark.parametrize("kind", ["tokens", "grid"])
def test_the_first_map_is_drawn_by_the_time_the_page_has_loaded(kind, tmp_path):
    """A ViT's page and a Swin's draw their first map before the page's load event: a screenshot then shows it."""
    model, image = (registers_model(), picture()) if kind == "tokens" else (swin(), picture().resize((64, 64)))
    path = tmp_path / "explorer.html"
    path.write_text(explorer_page(explorer_data(model, [("a.png", image)], MEAN, STD)), encoding="utf-8")
    with browser_page(path, ready=False, init_script=AT_LOAD) as (page, errors, _):
        at_load = page.evaluate("window.atLoad")
        assert at_load["width"] >= 224 and at_load["opaque"] == 1.0 and at_load["title"]
        assert page.evaluate("window.vitkitExplorer.data.kind") == kind
    assert errors == []


def fresh(page) -> None:
    """The page as it opens: each test starts from there, whatever ran before it."""
    page.reload()
    page.evaluate("window.vitkitExplorer.ready")


def shown(page) -> np.ndarray:
    return np.array(page.evaluate("Array.from(window.vitkitExplorer.shown.values)"))


def close(drawn: np.ndarray, rows: torch.Tensor) -> None:
    """The drawn map equals the mean of the captured rows (heads, N), or one row (N,), over the patches, within the
    quantisation: each row is quantised on its own scale (its largest weight / 255), so the mean is within the mean
    of the rows' largest / 510."""
    rows = rows if rows.ndim == 2 else rows[None]
    tolerance = float(rows.max(dim=-1).values.mean()) / 510 + 1e-6
    np.testing.assert_allclose(drawn, rows.mean(dim=0)[5:].numpy(), atol=tolerance)


def test_page_loads_with_no_error_and_no_request(explorer):
    page, _, errors, requests = explorer
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:", "blob:"))] == []
    assert page.locator("#prefix button").all_inner_texts() == ["class", *(f"register {i}" for i in range(4))]


def test_clicking_a_patch_draws_its_attention(explorer):
    page, captured, _, _ = explorer
    fresh(page)
    box = page.locator("#image").bounding_box()
    page.mouse.move(box["x"] + 3.5 * box["width"] / 4, box["y"] + 0.5 * box["height"] / 4)  # hovering previews
    assert page.evaluate("window.vitkitExplorer.state.token") == 5 + 3
    close(shown(page), captured[-1][:, 5 + 3])
    row, col = 2, 1  # of the 4 x 4 grid
    page.mouse.click(box["x"] + (col + 0.5) * box["width"] / 4, box["y"] + (row + 0.5) * box["height"] / 4)
    token = 5 + row * 4 + col
    assert page.evaluate("window.vitkitExplorer.state.token") == token
    close(shown(page), captured[-1][:, token])  # the last layer, mean of heads
    assert "patch (2, 1)" in page.locator("#title").inner_text()

    page.evaluate("window.vitkitExplorer.setLayer(0)")
    close(shown(page), captured[0][:, token])
    page.keyboard.press("ArrowDown")  # with the image focused (it was clicked), the arrows move the patch
    token += 4
    assert page.evaluate("window.vitkitExplorer.state.token") == token
    close(shown(page), captured[0][:, token])
    page.locator("#title").click()  # focus leaves the image: now Down steps from the heads' mean to head 0
    page.keyboard.press("ArrowDown")
    close(shown(page), captured[0][0, token])
    assert "head 0" in page.locator("#title").inner_text()


def test_a_register_and_rollout(explorer):
    page, captured, _, _ = explorer
    fresh(page)
    page.get_by_role("button", name="register 2").click()
    layer, head = page.evaluate("[window.vitkitExplorer.state.layer, window.vitkitExplorer.state.head]")
    weights = captured[layer][:, 3] if head < 0 else captured[layer][head, 3]
    close(shown(page), weights)  # (heads, N) averaged, or one head's (N,)
    page.keyboard.press("r")
    close(shown(page), rollout_matrix([c[None] for c in captured[: layer + 1]], None)[0, 3])
    assert page.locator("#rollout").is_checked()


@pytest.mark.parametrize("level", [0, 1, 9])  # stored blocks; fixed and dynamic Huffman codes
def test_the_pages_inflate_reads_what_zlib_writes(explorer, level):
    """The page inflates its data itself, in one call as it loads: every kind of deflate block zlib writes, short
    and long, repetitive and not, comes back byte for byte."""
    page = explorer[0]
    rng = np.random.default_rng(level)
    texts = [
        b"",
        b"abcabcabc",
        rng.integers(0, 256, 70_000, dtype=np.uint8).tobytes(),  # incompressible: stored blocks past 64 KiB
        rng.random(50_000).astype(np.float32).tobytes(),
        (rng.random(300_000) ** 8 * 255).astype(np.uint8).tobytes(),  # like the quantised weights: mostly small
        bytes(100_000) + b"xy" * 40_000,  # long runs: the longest matches
    ]
    for text in texts:
        packed = base64.b64encode(zlib.compress(text, level)).decode("ascii")
        inflated = page.evaluate("b64 => btoa(Array.from(inflate(b64), b => String.fromCharCode(b)).join(''))", packed)
        assert base64.b64decode(inflated) == text
