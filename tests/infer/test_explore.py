"""The explorer's data: every selected layer's and head's attention over all tokens, quantised per row to 8 bits,
equals what `capture_attention` gives (to the quantisation); rollout likewise; the page is one self-contained file."""

import base64
import os
import re
import shutil
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.infer.attention import rollout_matrix
from vitkit.infer.explore import dequantise, explorer_data, quantise
from vitkit.viz.explorer import explorer_page

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
CHROMIUM = os.environ.get("VITKIT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

# The main canvas as the page's load event finds it, in window.atLoad (an init script, run before the page's own)
AT_LOAD = """window.addEventListener("load", () => {
  const c = document.getElementById("image"), p = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let opaque = 0;
  for (let k = 3; k < p.length; k += 4) opaque += p[k] === 255;
  window.atLoad = { width: c.width, height: c.height, opaque: opaque / (c.width * c.height),
                    title: document.getElementById("title").textContent };
});"""


@contextmanager
def browser_page(path: Path, ready: bool = True, init_script: str | None = None, **page_options):
    """The explorer page at `path` open in headless Chromium (Debian's browser, driven by Playwright), its first map
    drawn: yields (page, errors, requests), the console and page errors and every URL requested. Skips the test
    where Chromium or Playwright's Python package is missing. Without `ready`, yields as soon as the page's load
    event has fired, not waiting for the first map; `init_script` runs in the page before its own scripts."""
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium, or set VITKIT_CHROMIUM)")
    playwright = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(**page_options)
            errors, requests = [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            if init_script is not None:
                page.add_init_script(init_script)
            page.goto(Path(path).as_uri(), wait_until="load")
            # the first map drawn (the page's own policy forbids eval, which Playwright's wait_for_function needs)
            if ready:
                page.evaluate("window.vitkitExplorer.ready")
            yield page, errors, requests
        finally:
            browser.close()


def unpack(b64: str, dtype) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(b64)), dtype=dtype)


def registers_model():
    """A small ViT with registers, its tokens and position table drawn off their initial values."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_small_patch14_reg4_dinov2", img_size=56, depth=3, num_classes=7).eval()
    with torch.no_grad():
        for p in (model.cls_token, model.reg_token, model.pos_embed):
            p.normal_(0, 1)
        for block in model.blocks:
            block.attn.qkv.weight.mul_(8)  # peaked attention, not near-uniform rows
    return model


def picture(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (64, 80, 3), dtype=np.uint8))


def test_quantisation_is_within_half_a_step_of_each_rows_largest_weight():
    weights = torch.rand(2, 3, 5, 9).softmax(dim=-1)
    codes, scales = quantise(weights)
    assert codes.dtype == np.uint8 and (codes.max(axis=-1) == 255).all()
    error = np.abs(dequantise(codes, scales) - weights.double().numpy())
    assert (error <= scales[..., None] / 510 + 1e-7).all()


@pytest.mark.parametrize(("layers", "heads"), [(None, None), ([0, -1], [1, 4])])
def test_explorer_data_holds_the_captured_attention(layers, heads):
    model = registers_model()
    image = picture()
    data = explorer_data(model, [("a.png", image)], MEAN, STD, [f"c{k}" for k in range(7)], "reg", layers, heads)
    L = [0, 2] if layers else [0, 1, 2]
    H = [1, 4] if heads else list(range(6))
    assert data["layers"] == L and data["heads"] == H and data["grid"] == [4, 4]
    assert data["prefix"] == ["class", "register 0", "register 1", "register 2", "register 3"]
    N = data["tokens"]
    assert N == 5 + 16

    pixels = vitkit.data.preprocess(image, (56, 56), 3, MEAN, STD)[None]
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        logits = model(pixels)
    captured = list(maps.values())  # (1, 6, N, N) each
    one = data["images"][0]
    codes = unpack(one["attention"], np.uint8).reshape(len(L), len(H), N, N)
    scales = unpack(one["scales"], np.float32).reshape(len(L), len(H), N)
    expected = torch.stack([captured[i][0, H] for i in L]).double().numpy()
    np.testing.assert_allclose(dequantise(codes, scales), expected, atol=float(scales.max()) / 510 + 1e-6)

    rollout = unpack(one["rollout"], np.uint8).reshape(len(L), N, N)
    rollout_scales = unpack(one["rollout_scales"], np.float32).reshape(len(L), N)
    through = torch.stack([rollout_matrix(captured[: i + 1], None)[0] for i in L]).double().numpy()
    np.testing.assert_allclose(
        dequantise(rollout, rollout_scales), through, atol=float(rollout_scales.max()) / 510 + 1e-6
    )

    top = logits.softmax(-1)[0].topk(5)
    assert [name for name, _ in one["top"]] == [f"c{k}" for k in top.indices.tolist()]
    assert one["view"].startswith("data:image/png;base64,")


def test_the_page_is_one_file_that_loads_nothing():
    page = explorer_page(explorer_data(registers_model(), [("a.png", picture())], MEAN, STD, layers=[0]))
    assert "__DATA__" not in page
    assert not re.search(r"https?://", page)
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    assert "default-src 'none'" in page  # the page's own policy forbids any load


def test_a_detector_is_sent_to_its_own_page():
    detr = vitkit.create_model("detr_tiny", num_classes=3).eval()
    with pytest.raises(ValueError, match="DETR neither attends over one grid .* a detector's page is"):
        explorer_data(detr, [("a.png", picture())], MEAN, STD)


def test_a_layer_out_of_range_is_named():
    with pytest.raises(ValueError, match=r"layer 5 is out of range: the model has 3 layers \(0..2\)"):
        explorer_data(registers_model(), [("a.png", picture())], MEAN, STD, layers=[5])


def test_explore_cli_writes_the_page(tmp_path, capsys):
    from vitkit.cli import main

    picture().save(tmp_path / "a.png")
    out = tmp_path / "page" / "explorer.html"
    args = ["explore", "--model", "vit_tiny_patch16_224", str(tmp_path / "a.png"), "--layers", "0,-1", "--heads", "1"]
    assert main([*args, "--out", str(out)]) == 0
    assert "explorer of 1 image(s), 2 layer(s) x 1 head(s)" in capsys.readouterr().out
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert main([*args, "--out", str(tmp_path / "page.png")]) == 2
    assert "expected an .html file name" in capsys.readouterr().err


def test_a_large_page_says_how_to_keep_fewer_maps(tmp_path, capsys, monkeypatch):
    from vitkit.cli import explore, main

    picture().save(tmp_path / "a.png")
    monkeypatch.setattr(explore, "LARGE_PAGE", 1000)  # bytes: any page here is larger
    args = ["explore", "--model", "vit_tiny_patch16_224", str(tmp_path / "a.png")]  # 12 layers
    assert main([*args, "--out", str(tmp_path / "all.html")]) == 0
    note = capsys.readouterr().err
    assert "opens slowly; it holds every layer's maps: --layers 11 (or 0,11) and --heads 0,1 keep fewer" in note
    assert main([*args, "--layers", "11", "--out", str(tmp_path / "one.html")]) == 0
    assert "opens slowly" not in capsys.readouterr().err  # chosen already


def test_a_page_that_would_not_fit_in_memory_is_refused_before_it_runs(monkeypatch):
    import vitkit.infer.explore as explore

    monkeypatch.setattr(explore, "available_memory", lambda: 1_000_000)  # 1 MB free
    with pytest.raises(ValueError, match=r"3 layer\(s\) x 6 head\(s\) of 21 x 21 attention would take .* keep fewer"):
        explorer_data(registers_model(), [("a.png", picture())] * 40, MEAN, STD)
