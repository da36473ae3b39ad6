"""The attention figure: its maps against `attention_map` (itself tested against explicit implementations), its
prediction against the model's softmax, the options that do not apply refused, and what the drawn figure holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model
from vitkit.data import preprocess
from vitkit.infer import attention_figure, attention_map, attention_maps
from vitkit.viz.attention import COLORMAP, draw_attention, save_picture

TINY = dict(img_size=28, patch_size=7, embed_dim=16, depth=3, num_heads=4, num_classes=10)
MEAN, STD = (0.25,), (0.5,)
NAMES = tuple("zero one two three four five six seven eight nine".split())


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("vit_tiny_patch16_224", **TINY).eval()


@pytest.fixture(scope="module")
def image():
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8))


@pytest.fixture(scope="module")
def pixels(image):
    return preprocess(image, (28, 28), 3, MEAN, STD)[None]  # (1, 3, 28, 28)


def test_one_map_and_the_prediction(model, image, pixels):
    maps = attention_maps(model, image, MEAN, STD, layer=1, head=2, class_names=NAMES, name="tiny")
    torch.testing.assert_close(maps.heats, attention_map(model, pixels, layer=1, head=2))
    probabilities = model(pixels).softmax(-1)[0]
    k = int(probabilities.argmax())
    assert maps.prediction == (NAMES[k], pytest.approx(probabilities[k].item(), rel=1e-5))
    assert maps.titles == ("head 2 of 4",) and maps.what == "layer 1 (of 0..2), head 2 of 4"
    assert maps.model == "tiny: ViT, 3 layers x 4 heads, a 4x4 grid of 7-px patches"
    assert maps.view.size == (224, 224)
    default = attention_maps(model, image, MEAN, STD)
    torch.testing.assert_close(default.heats, attention_map(model, pixels, layer=-1))
    assert default.what == "layer 2 (of 0..2), mean of 4 heads" and default.prediction[0] == str(k)


def test_every_head_every_layer_and_rollout(model, image, pixels):
    every_head = attention_maps(model, image, MEAN, STD, layer=0, head="all")
    expected = torch.cat([attention_map(model, pixels, layer=0, head=j) for j in range(4)])
    torch.testing.assert_close(every_head.heats, expected)
    assert every_head.titles == ("head 0", "head 1", "head 2", "head 3") and every_head.columns == 4
    grid = attention_maps(model, image, MEAN, STD, grid=True)
    expected = torch.cat([attention_map(model, pixels, layer=i, head=j) for i in range(3) for j in range(4)])
    torch.testing.assert_close(grid.heats, expected)
    assert grid.columns == 4 and grid.titles[5] == "layer 1, head 1"
    rollout = attention_maps(model, image, MEAN, STD, rollout=True, head="mean")
    torch.testing.assert_close(rollout.heats, attention_map(model, pixels, rollout=True))
    assert rollout.what == "attention rollout over 3 layers, mean of 4 heads"


def test_twelve_heads_wrap_into_rows_of_six(image):
    model = create_model("vit_tiny_patch16_224", **{**TINY, "embed_dim": 24, "num_heads": 12, "depth": 1})
    maps = attention_maps(model, image, MEAN, STD, head="all")
    assert len(maps.heats) == 12 and maps.columns == 6


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(rollout=True, layer=1), "layer 1 does not apply to attention rollout"),
        (dict(rollout=True, head=0), "head 0 does not apply to attention rollout"),
        (dict(rollout=True, head="all"), "head all does not apply to attention rollout"),
        (dict(rollout=True, grid=True), "rollout and grid do not combine"),
        (dict(grid=True, layer=0), "layer 0 does not apply to a grid"),
        (dict(grid=True, head="mean"), "head mean does not apply to a grid"),
        (dict(head="every"), "head must be an index, 'mean' or 'all', got 'every'"),
        (dict(layer=3), r"layer 3 is out of range for a model with 3 attention layers \(valid: 0..2, or -3..-1"),
        (dict(layer=-4), "layer -4 is out of range"),
        (dict(head=4), r"head 4 is out of range for 4 heads \(valid: 0..3, or -4..-1 from the end\)"),
        (dict(class_names=("a", "b")), "2 class names for a model with 10 classes"),
    ],
)
def test_options_that_do_not_apply_are_refused(model, image, options, message):
    with pytest.raises(ValueError, match=message):
        attention_maps(model, image, MEAN, STD, **options)


def test_the_figure_holds_the_image_each_map_one_colour_bar_and_the_title(model, image):
    figure, maps = attention_figure(model, image, MEAN, STD, layer=0, head="all", class_names=NAMES, name="tiny")
    *panels, bar = figure.axes
    assert [ax.get_title() for ax in panels] == ["input (as the model sees it)", *maps.titles]
    assert all(len(ax.get_images()) == 1 + (k > 0) for k, ax in enumerate(panels))  # the maps drawn over the view
    low, high = bar.get_ylim()
    assert (low, high) == pytest.approx((maps.heats.min().item(), maps.heats.max().item()))
    assert bar.get_ylabel() == "attention of the class token"
    name, probability = maps.prediction
    assert figure.get_suptitle() == f"{maps.model}\n{maps.what}  ·  predicted {name} ({probability:.1%})"
    grid = draw_attention(attention_maps(model, image, MEAN, STD, grid=True))
    assert len(grid.axes) == 1 + 12 + 1
    assert grid.get_size_inches()[1] > 2 * figure.get_size_inches()[1]  # three rows of maps
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        attention_figure(model, image, MEAN, STD, alpha=1.5)


def test_the_colour_bar_runs_through_the_colour_map(model, image, tmp_path):
    figure, _ = attention_figure(model, image, MEAN, STD)
    path = save_picture(figure, tmp_path / "new" / "folder" / "figure.png")
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3).astype(int)
    for end in (COLORMAP[0], COLORMAP[-1]):  # the overlays are blended at alpha 0.5: only the bar shows the ends
        assert (np.abs(pixels - np.array(end)).max(axis=1) <= 12).any()
