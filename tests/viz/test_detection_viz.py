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
    MAX_FONT,
    MAX_LABELS,
    MAX_NUMBERED,
    POINT_COLOURS,
    labels_fit,
    object_attention_maps,
    place_labels,
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
    assert (picture[38, 100] == BOX_COLOURS[1]).all()  # b's above its top-right corner: clear of a's, over no box
    assert (picture[41, 21] == BOX_COLOURS[0]).all()  # inside: a's outline alone


def test_a_label_avoids_covering_another_box_where_it_can():
    """Above the top-left corner would lie over the box above; inside the corner covers nothing else."""
    below, above = (20, 60, 120, 140), (10, 10, 80, 55)
    assert tab_place(below, 50, 14, (300, 200), [], [above]) == (20, 60, 70, 74)
    assert tab_place(below, 50, 14, (300, 200), []) == (20, 46, 70, 60)  # without the other box: above


@pytest.mark.parametrize(
    ("box", "expected"),
    [
        ((280, 50, 310, 80), (250, 36, 300, 50)),  # past the right edge: above, moved left onto the picture
        ((270, 190, 320, 230), (250, 176, 300, 190)),  # past the bottom-right corner: the same
        ((-10, -10, 20, 20), (0, 0, 50, 14)),  # past the top-left corner: down and right
        ((290, 0, 300, 200), (250, 0, 300, 14)),  # a sliver along the right edge, as high as the picture
    ],
)
def test_a_label_at_the_edge_is_moved_onto_the_picture(box, expected):
    assert tab_place(box, 50, 14, (300, 200), []) == expected


def test_a_label_at_the_right_edge_is_drawn_whole():
    """The same label drawn for a box across the right edge and for one in the middle: as many columns of white
    text in both (none cut off), all of them on the picture."""
    image = Image.new("RGB", (300, 240))

    def text_columns(box):
        pixels = np.asarray(draw_detections(image, [box], ["square"], [0.52], ["square"]))
        return np.flatnonzero((pixels > 200).all(-1).any(0))  # the columns with white (text) pixels

    edge, middle = text_columns((270, 100, 320, 150)), text_columns((120, 100, 170, 150))
    assert len(edge) == len(middle) > 20 and edge.max() < 300


def test_crowded_labels_are_placed_apart_on_the_picture():
    """Ten boxes nested in each other: each label goes to a place of its own around its box, whole on the
    picture."""
    boxes = [(100 + 3 * k, 60 + 2 * k, 200 - 2 * k, 160 - 3 * k) for k in range(10)]
    sizes = [(50 + k, 14) for k in range(10)]
    tabs = place_labels(boxes, sizes, (300, 200))
    assert [(t[2] - t[0], t[3] - t[1]) for t in tabs] == sizes  # each its label's size
    assert all(0 <= t[0] and 0 <= t[1] and t[2] <= 300 and t[3] <= 200 for t in tabs)
    for n, a in enumerate(tabs):
        for b in tabs[n + 1 :]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    assert labels_fit(tabs, (300, 200))
    assert tabs[0] == (100, 46, 150, 60)  # the first: above its top-left corner
    for tab, (x0, y0, x1, y1) in zip(tabs, boxes, strict=True):  # each touches its box, inside or out
        assert tab[0] <= x1 and x0 <= tab[2] and tab[1] <= y1 and y0 <= tab[3]


def test_labels_fit_only_few_apart_on_the_picture():
    tab = (0.0, 0.0, 10.0, 10.0)
    assert labels_fit([tab, (10, 0, 20, 10)], (100, 100))  # touching is apart
    assert not labels_fit([tab, (9, 0, 19, 10)], (100, 100))  # one covers the other
    assert not labels_fit([(95, 0, 105, 10)], (100, 100))  # past the right edge
    assert not labels_fit([(0, 0, 60, 50)], (100, 100))  # over a quarter of the picture
    many = [(10 * k, 0, 10 * k + 8, 8) for k in range(MAX_LABELS + 1)]
    assert labels_fit(many[:-1], (1000, 1000)) and not labels_fit(many, (1000, 1000))


def _legend_tabs(picture: np.ndarray, width: int, height: int) -> list[tuple[int, ...]]:
    """The colours of the number tabs of the legend beside or under the `width` x `height` picture, in reading order
    (down each column): each tab's top row is a run of its colour under white rows."""
    legend = (picture[:, width:] if picture.shape[1] > width else picture[height:]).astype(int)
    white = (legend == 255).all(-1)
    tops = []
    for colour in BOX_COLOURS:
        top = (legend == colour).all(-1)[3:] & white[2:-1] & white[1:-2] & white[:-3]  # (h - 3, w)
        tops += [(x, y, colour) for y, x in zip(*np.nonzero(top), strict=True) if top[y, x : x + 6].all()]
    firsts = {(x, y) for x, y, _ in tops} - {(x + 1, y) for x, y, _ in tops}  # where each run begins
    return [colour for x, y, colour in sorted(tops) if (x, y) in firsts]


def test_many_boxes_are_numbered_with_a_legend():
    """Sixty boxes: a number on each, and beside or under the picture a legend of the numbers in order of score,
    each on a tab in its class colour."""
    image = Image.new("RGB", (300, 240), (90, 90, 90))
    g = np.random.default_rng(0)
    corners = g.uniform((0, 0), (260, 200), size=(60, 2))
    boxes = np.concatenate([corners, corners + g.uniform(10, 120, size=(60, 2))], 1).tolist()
    labels = [("a", "b", "c")[k % 3] for k in range(60)]
    scores = g.uniform(0.05, 0.4, size=60).tolist()
    picture = np.asarray(draw_detections(image, boxes, labels, scores, ["a", "b", "c"]))
    assert picture.shape[0] > 240 or picture.shape[1] > 300  # the legend makes it larger
    assert (picture[:240, :300] != 90).any(-1).mean() < 0.5  # thin outlines and small numbers leave most of it
    by_score = sorted(range(60), key=lambda i: -scores[i])
    colours = _legend_tabs(picture, 300, 240)
    assert len(colours) > 5
    assert colours == [BOX_COLOURS["abc".index(labels[i])] for i in by_score[: len(colours)]]
    truth = np.asarray(draw_detections(image, boxes, labels, None, ["a", "b", "c"]))  # ground truth: numbered too
    assert _legend_tabs(truth, 300, 240) == [BOX_COLOURS[k % 3] for k in range(len(colours))]


def test_hundreds_of_boxes_are_outlined_with_a_key_of_the_classes():
    """A large image in tiles: more boxes than MAX_NUMBERED get no numbers, and the legend is a key of the classes
    (a swatch each, in the order they first come by score), with their counts; the image keeps most of its pixels."""
    image = Image.new("RGB", (1600, 1200), (90, 90, 90))
    g = np.random.default_rng(1)
    n = MAX_NUMBERED + 140
    corners = g.uniform((0, 0), (1560, 1160), size=(n, 2))
    boxes = np.concatenate([corners, corners + g.uniform(10, 40, size=(n, 2))], 1).tolist()
    labels = [("a", "b", "c")[k % 3] for k in range(n)]
    scores = g.uniform(0.05, 0.9, size=n).tolist()
    picture = np.asarray(draw_detections(image, boxes, labels, scores, ["a", "b", "c"]))
    assert picture.shape[0] > 1200 or picture.shape[1] > 1600  # the key beside or under the picture
    first = sorted(range(n), key=lambda i: -scores[i])
    order = list(dict.fromkeys(labels[i] for i in first))
    assert _legend_tabs(picture, 1600, 1200) == [BOX_COLOURS["abc".index(name)] for name in order]
    assert (picture[:1200, :1600] != 90).any(-1).mean() < 0.25  # outlines only


def test_a_large_images_labels_keep_a_readable_size():
    """The labels' font grows with a small image, and stops at MAX_FONT on a large one."""
    tall = []
    for side in (300, 4000):
        image = Image.new("RGB", (side, side), (90, 90, 90))
        picture = np.asarray(draw_detections(image, [[10, 40, 60, 90]], ["a"], [0.9], ["a"]))
        rows = np.flatnonzero((picture[:, :, :] == BOX_COLOURS[0]).all(-1).sum(1) > 30)  # the tab's filled rows
        tall.append(len(rows))
    assert tall[0] < tall[1] <= MAX_FONT + 8


def test_labels_that_cannot_be_placed_apart_are_numbered():
    """Boxes over the whole picture leave room for four labels inside its corners: a fifth box is numbered, all
    of them with it, in a legend."""
    image = Image.new("RGB", (300, 240))
    boxes, labels = [(0, 0, 300, 240)] * 5, ["a", "b", "c", "d", "e"]
    four = draw_detections(image, boxes[:4], labels[:4], [0.9, 0.8, 0.7, 0.6])
    assert four.size == (300, 240)
    five = draw_detections(image, boxes, labels, [0.9, 0.8, 0.7, 0.6, 0.5])
    assert five.size != (300, 240)
    assert _legend_tabs(np.asarray(five), 300, 240) == list(BOX_COLOURS[:5])
