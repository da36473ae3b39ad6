"""Pictures of detections: boxes where the coordinates say, in their class colour; the attention figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.viz import draw_detections, enlarge, object_attention_figure
from vitkit.viz.attention import COLORMAP, EMPTY_FIGURE_WIDTH, figure_image
from vitkit.viz.detection import (
    BOX_COLOURS,
    DOT_AREA,
    POINT_COLOURS,
    object_attention_maps,
    sampled_attention_figure,
    tab_place,
)


def test_enlarge_by_whole_factors_keeps_pixels():
    small = Image.fromarray(np.arange(96 * 80, dtype=np.uint8).reshape(80, 96))
    big, factor = enlarge(small)
    assert factor == 3 and big.size == (288, 240)
    assert np.array_equal(np.asarray(big)[::3, ::3, 0], np.asarray(small))
    large = Image.new("RGB", (640, 480))
    assert enlarge(large)[1] == 1 and enlarge(large)[0].size == (640, 480)


def test_boxes_are_drawn_at_their_coordinates_in_their_class_colour():
    image = Image.new("L", (100, 100))  # black, drawn 3 times larger
    picture = draw_detections(image, [(20, 40, 60, 80)], ["7"], [0.9], classes=[str(k) for k in range(10)])
    pixels = np.asarray(picture)
    assert picture.size == (300, 300)
    assert tuple(pixels[200, 60]) == BOX_COLOURS[7]  # left edge, halfway down: x = 20 * 3, y in 120..240
    assert tuple(pixels[200, 180]) == BOX_COLOURS[7]  # right edge, x = 60 * 3
    assert tuple(pixels[200, 120]) == (0, 0, 0)  # inside the box: untouched
    assert tuple(pixels[20, 280]) == (0, 0, 0)  # far from it
    with pytest.raises(ValueError, match="one label and score per box"):
        draw_detections(image, [(0, 0, 1, 1)], ["1", "2"], [0.5])


def test_attention_panels_show_each_map_under_its_box():
    image = Image.new("L", (96, 96))  # black, drawn 3 times larger
    heats = torch.zeros(2, 6, 6)
    heats[0, 1, 4] = 0.5  # first object's query looks at row 1, column 4 of the 6x6 map
    heats[1, 5, 0] = 1.0
    boxes, labels, scores = [(0, 0, 10, 10), (50, 50, 90, 90)], ["1", "2"], [0.9, 0.8]
    maps = object_attention_maps(image, boxes, labels, scores, heats, model="detr", what="layer 5")
    torch.testing.assert_close(maps.heats, heats)
    assert maps.titles == ("1 0.90", "2 0.80") and maps.view_title == "2 detections"
    assert np.array_equal(np.asarray(maps.view), np.asarray(draw_detections(image, boxes, labels, scores)))
    assert all(np.asarray(panel).max() == 0 and panel.size == (288, 288) for panel in maps.panels)  # the plain image
    second = np.asarray(maps.marks[1])  # RGBA: its box only, at 3x its coordinates, in its class's colour
    assert tuple(second[200, 150]) == (*BOX_COLOURS[1], 255)  # left edge, x = 50 * 3
    assert second[200, 200, 3] == 0 and second[20, 20, 3] == 0  # inside the box, the other box: transparent
    figure = object_attention_figure(image, boxes, labels, scores, heats, model="detr", what="layer 5")
    *panels, bar = figure.axes
    assert [ax.get_title() for ax in panels] == ["2 detections", "1 0.90", "2 0.80"]
    assert [len(ax.get_images()) for ax in panels] == [1, 3, 3]  # image, map, box
    assert bar.get_ylim() == pytest.approx((0.0, 1.0)) and bar.get_ylabel() == "attention of the object's query"
    assert figure.get_suptitle() == "detr\nlayer 5"
    pixels = np.asarray(figure_image(figure).convert("RGB")).reshape(-1, 3).astype(int)
    top = np.array(COLORMAP[-1]) * 0.6  # the largest value, blended over black with alpha 0.6
    assert (np.abs(pixels - top).max(axis=1) <= 6).any()
    nothing = object_attention_figure(image, [], [], [], torch.zeros(0, 6, 6), empty="no detections above 0.50")
    assert len(nothing.axes) == 1 and nothing.axes[0].get_title() == "no detections above 0.50"  # no colour bar
    assert nothing.get_size_inches()[0] == pytest.approx(EMPTY_FIGURE_WIDTH)  # the picture alone, not two columns
    with pytest.raises(ValueError, match="one \\(h, w\\) map per box"):
        object_attention_figure(image, [(0, 0, 1, 1)], ["1"], [0.5], heats)


def test_sampled_points_are_dots_at_their_pixels_sized_by_weight():
    """Deformable DETR's figure 5: each detection's panel has one dot per point, at the point's pixel in the enlarged
    image (f x - 0.5: data coordinates are pixel indices), its area its weight times DOT_AREA of the panel, coloured
    by its group; the legend names the groups."""
    from matplotlib.colors import to_rgba

    image = Image.new("L", (96, 80))  # drawn 3 times larger
    g = torch.Generator().manual_seed(0)
    points = torch.rand(2, 6, 2, generator=g) * torch.tensor([96.0, 80.0])  # (n, P, 2) in pixels of the image
    weights = torch.rand(2, 6, generator=g).softmax(-1)  # (n, P)
    groups = torch.tensor([[0, 1, 2, 0, 1, 2], [2, 2, 2, 1, 1, 0]])
    names = ["level 0", "level 1", "level 2"]
    boxes, labels, scores = [(10, 10, 40, 40), (50, 20, 90, 70)], ["1", "2"], [0.9, 0.8]
    figure = sampled_attention_figure(image, boxes, labels, scores, points, weights, groups, names, model="m", what="w")
    view, *panels = figure.axes
    assert view.get_title() == "2 detections" and [ax.get_title() for ax in panels] == ["1 0.90", "2 0.80"]
    assert figure.get_suptitle() == "m\nw"
    cell = figure.get_figwidth() / 3  # the view and two panels a row
    for k, ax in enumerate(panels):
        (dots,) = ax.collections
        order = weights[k].argsort(descending=True)  # drawn heaviest first, so that light dots stay on top
        expected = points[k][order] * 3 - 0.5  # the enlarged picture's pixel indices
        np.testing.assert_allclose(dots.get_offsets(), expected.numpy(), rtol=0, atol=1e-4)
        area = DOT_AREA * (cell * 72) ** 2  # points^2 of weight 1
        np.testing.assert_allclose(dots.get_sizes(), (weights[k][order] * area).numpy(), rtol=1e-5)
        colours = [to_rgba(POINT_COLOURS[group]) for group in groups[k][order].tolist()]
        np.testing.assert_allclose(dots.get_facecolors()[:, :3], np.array(colours)[:, :3])
        assert ax.get_xlim() == (-0.5, 287.5) and ax.get_ylim() == (239.5, -0.5)  # the whole enlarged image
        assert len(ax.get_images()) == 2  # the image, the box
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == names
    assert legend.get_title().get_text() == "dot area: attention weight"
    nothing = sampled_attention_figure(image, [], [], [], torch.zeros(0, 6, 2), torch.zeros(0, 6), groups[:0], names)
    assert len(nothing.axes) == 1 and not nothing.legends
    with pytest.raises(ValueError, match="expected weights and groups"):
        sampled_attention_figure(image, boxes, labels, scores, points, weights[:, :3], groups, names)
    with pytest.raises(ValueError, match="groups must index the 2 group names"):
        sampled_attention_figure(image, boxes, labels, scores, points, weights, groups, names[:2])


def test_a_picture_without_boxes_says_so():
    image = Image.new("RGB", (300, 240), (200, 200, 200))
    picture = np.asarray(draw_detections(image, [], [], [], empty="no detections above 0.40"))
    assert picture.shape == (240, 300, 3)
    assert (picture[0] == 32).all() and (picture[-1] == 200).all()  # a dark band across the top, the image below
    assert (picture[:30] == 255).any()  # with white text on it


def test_labels_are_placed_clear_of_each_other():
    """Two boxes with the same top-left corner: the more probable label goes above its box, the other to the next
    free place; outlines are drawn before any label, so none crosses one."""
    first = tab_place((20, 40, 120, 140), 50, 14, (300, 200), [])
    assert first == (20, 26, 70, 40)  # above the top-left corner
    second = tab_place((20, 40, 110, 130), 50, 14, (300, 200), [first])
    assert second == (20, 40, 70, 54)  # inside it, clear of the first
    third = tab_place((20, 40, 110, 130), 50, 14, (300, 200), [first, second])
    assert third == (20, 130, 70, 144)  # below the bottom-left corner
    at_the_top = tab_place((5, 0, 100, 50), 50, 14, (300, 200), [])
    assert at_the_top == (5, 0, 55, 14)  # no room above: inside
    image = Image.new("RGB", (300, 240), (255, 255, 255))  # not enlarged
    boxes = [(20, 40, 120, 140), (20, 40, 110, 130)]
    picture = np.asarray(draw_detections(image, boxes, ["a", "b"], [0.9, 0.8], ["a", "b"])).astype(int)
    assert (picture[38, 21] == BOX_COLOURS[0]).all()  # a's tab above the box
    assert (picture[41, 21] == BOX_COLOURS[1]).all()  # b's tab inside it, over a's outline (not crossed by it)
