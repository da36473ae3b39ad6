"""Pictures of detections: boxes where the coordinates say, in their class colour; the attention panels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.viz import draw_detections, enlarge, object_attention_figure
from vitkit.viz.attention import COLORMAP
from vitkit.viz.detection import BOX_COLOURS


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


def test_attention_panels_show_each_map_over_the_image():
    image = Image.new("L", (96, 96))
    heats = torch.zeros(2, 6, 6)
    heats[0, 1, 4] = 1.0  # first object's query looks at row 1, column 4 of the 6x6 map
    heats[1, 5, 0] = 1.0
    figure = object_attention_figure(image, [(0, 0, 10, 10), (50, 50, 90, 90)], ["1", "2"], [0.9, 0.8], heats)
    assert figure.size == (3 * 288 + 2 * 8, 288)
    pixels = np.asarray(figure).astype(int)
    top = np.array(COLORMAP[-1]) * 0.6  # the map's maximum, blended over black with alpha 0.6
    cell = 288 // 6
    first = pixels[:, 288 + 8 : 2 * 288 + 8]
    np.testing.assert_allclose(first[1 * cell + cell // 2, 4 * cell + cell // 2], top, atol=6)
    assert first[5 * cell + cell // 2, 0 * cell + cell // 2].sum() < top.sum() / 2  # the other object's cell
    second = pixels[:, 2 * (288 + 8) :]
    np.testing.assert_allclose(second[5 * cell + cell // 2, 0 * cell + cell // 2], top, atol=6)
    with pytest.raises(ValueError, match="one \\(h, w\\) map per box"):
        object_attention_figure(image, [(0, 0, 1, 1)], ["1"], [0.5], heats)
