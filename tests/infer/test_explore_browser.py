"""The explorer page in a real browser (headless Chromium, Debian's `chromium`, driven by Playwright with the system
browser; `make test` installs it where it can): it loads from disk with no console error and no network request;
clicking a patch draws the map of that patch's captured attention row (to the 8-bit quantisation); the layer, the
head, a register and rollout change the map to theirs."""

import numpy as np
import pytest
import torch
from test_explore import MEAN, STD, browser_page, picture, registers_model

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
