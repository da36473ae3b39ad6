"""The object attention of a deformable detector: the points each detection's query sampled, mapped from the levels'
padded maps to pixels of the image, and drawn one dot per point (Deformable DETR's figure 5); checked against the
layer's own `capture_attention` record."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba
from PIL import Image

from vitkit import create_model
from vitkit.detection import Postprocessing
from vitkit.infer import detection_attention, detection_attention_figure, detection_sampling
from vitkit.infer.detect import detector_inputs, detector_outputs
from vitkit.infer.object_attention import sampled_points
from vitkit.layers import capture_attention
from vitkit.layers.deformable import SampledAttention
from vitkit.viz.attention import EMPTY_FIGURE_WIDTH
from vitkit.viz.detection import DOT_AREA, POINT_COLOURS
from vitkit.weights import ModelInfo

CLASSES = tuple(str(k) for k in range(5))
INFO = ModelInfo(CLASSES, (0.5,) * 3, (0.25,) * 3, category_ids=tuple(range(5)))
FOCAL = Postprocessing(classification="focal", no_object_logit=False)  # K sigmoid logits, each query's best class


@pytest.fixture(scope="module")
def model():
    """A small Deformable DETR whose cross-attention offsets and weights are moved off their initial values."""
    torch.manual_seed(0)
    layout = dict(hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=5, num_classes=5, backbone_width=8)
    model = create_model("deformable_detr_digits", **layout, enc_layers=1, dec_layers=2).eval()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.cross_attn.sampling_offsets.weight.normal_(0, 0.05)
            layer.cross_attn.attention_weights.weight.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    return Image.fromarray(g.integers(0, 255, (60, 80, 3), dtype=np.uint8))  # 80 wide, 60 high: resized to 96x128


def captured(model, image, layer: int) -> tuple[SampledAttention, list[int]]:
    """The layer's record and each detection's query (most probable first), computed here step by step."""
    pixels, mask, sizes = detector_inputs(model, INFO, [image])
    assert tuple(pixels.shape[-2:]) == (96, 128) and bool(mask.all())  # one image: no padding
    with capture_attention(model, [model.object_attention_layers()[layer]]) as maps:
        outputs = detector_outputs(model, pixels, mask)
    (result,) = FOCAL(outputs, sizes, 0.0)
    order = result["scores"].argsort(descending=True, stable=True)
    (record,) = maps.values()
    return record, result["queries"][order].tolist()


def test_locations_map_to_pixels_of_the_image_through_the_padded_input():
    """(x, y) on a level's padded map is (x W_pad, y H_pad) in the padded input; the image's real part, its top-left
    H x W, is the image resized: a point at the real part's corner lands on the image's corner."""
    locations = torch.tensor([[0.4, 0.4], [0.8, 0.8], [0.0, 0.25], [1.0, 1.0]]).view(1, 1, 1, 1, 4, 2)
    record = SampledAttention(locations, torch.full((1, 1, 1, 1, 4), 0.25), ((15, 20),))
    samples = sampled_points(record, [0], padded=(120, 160), real=(96, 128), image_size=(48, 64))
    expected = torch.tensor([[32.0, 24.0], [64.0, 48.0], [0.0, 15.0], [80.0, 60.0]], dtype=torch.float64)
    torch.testing.assert_close(samples.points.view(4, 2), expected)  # (0.8 * 160) * 64 / 128 = 64, ...
    assert samples.spatial_shapes == ((15, 20),) and samples.input_size == (120, 160)
    torch.testing.assert_close(samples.weights.view(4), torch.full((4,), 0.25, dtype=torch.float64))


@pytest.mark.parametrize("layer, head", [(-1, None), (0, 1)])
def test_each_panel_draws_its_querys_points_at_their_pixels(model, image, layer, head):
    record, queries = captured(model, image, layer)
    figure, detections, _ = detection_attention_figure(model, INFO, image, 0.0, FOCAL, layer, head)
    assert len(detections) == len(queries) == 5
    view, *panels = figure.axes
    assert view.get_title() == "5 detections" and len(panels) == 5
    which = "all 2 heads" if head is None else "head 1 of 2"
    assert figure.get_suptitle().splitlines() == [
        "Deformable DETR, 2 decoder layers x 2 heads x 3 levels x 4 points",
        f"decoder layer {layer % 2} (of 0..1) sampling points of each object's query, {which}  ·  5 objects above 0.00",
    ]
    factor = 4  # the 80x60 image is drawn enlarged 4 times (its shorter side to at least 224)
    area = DOT_AREA * (figure.get_figwidth() / 5 * 72) ** 2  # points^2 of weight 1: 4 panels a row and the view
    heads = [0, 1] if head is None else [head]
    for ax, query, d in zip(panels, queries, detections, strict=True):
        assert ax.get_title() == f"{d.label} {d.score:.2f}"
        locations = record.locations[0, query, heads].double()  # (h', L, K, 2), normalised over each level
        weights = record.weights[0, query, heads].double() / len(heads)  # (h', L, K): a panel's sum to one
        levels = torch.arange(3)[None, :, None].expand_as(weights)
        xy = locations * torch.tensor([80.0, 60.0], dtype=torch.float64)  # over the 128x96 input, the whole image
        order = weights.flatten().argsort(descending=True)
        (dots,) = ax.collections
        np.testing.assert_allclose(dots.get_offsets(), (xy.view(-1, 2)[order] * factor - 0.5).numpy(), atol=1e-3)
        np.testing.assert_allclose(dots.get_sizes(), (weights.flatten()[order] * area).numpy(), rtol=1e-5)
        colours = np.array([to_rgba(POINT_COLOURS[level]) for level in levels.flatten()[order].tolist()])
        np.testing.assert_allclose(dots.get_facecolors()[:, :3], colours[:, :3])
        assert sum(dots.get_sizes()) == pytest.approx(area)  # every weight drawn
    names = [t.get_text() for t in figure.legends[0].get_texts()]
    assert names == ["level 0: 12x16 (stride 8)", "level 1: 6x8 (stride 16)", "level 2: 3x4 (stride 32)"]


def test_sampled_and_dense_attention_are_told_apart(model, image):
    detections, samples = detection_sampling(model, INFO, image, 0.0, FOCAL)
    record, queries = captured(model, image, -1)
    assert samples.points.shape == (5, 2, 3, 4, 2) and len(detections) == 5
    torch.testing.assert_close(samples.weights, record.weights[0, queries].double())
    with pytest.raises(ValueError, match="samples points on several maps, not one dense map: use detection_sampling"):
        detection_attention(model, INFO, image, 0.0, FOCAL)
    figure, found, _ = detection_attention_figure(model, INFO, image, 0.999, FOCAL)  # nothing so probable
    assert found == [] and len(figure.axes) == 1 and figure.axes[0].get_title() == "no detections above 1.00"
    width, _ = figure.get_size_inches()  # the picture alone, and the title wrapped to its width
    assert width == pytest.approx(EMPTY_FIGURE_WIDTH)
    lines = figure.get_suptitle().splitlines()
    assert len(lines) > 2 and max(map(len, lines)) <= EMPTY_FIGURE_WIDTH * 72 / (0.6 * 10)
    with pytest.raises(ValueError, match="head 2 is out of range for 2 heads"):
        detection_attention_figure(model, INFO, image, 0.0, FOCAL, head=2)
    torch.manual_seed(0)
    detr = create_model(
        "detr_digits", backbone_width=8, hidden_dim=16, num_heads=2, dim_feedforward=32, num_queries=4, num_classes=5
    ).eval()
    with pytest.raises(ValueError, match="cross-attention is dense, not sampled points: use detection_attention"):
        detection_sampling(detr, INFO, image, 0.0)
