"""Colour maps, overlays of a heat map on an image, and the image as a model sees it."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from vitkit.viz import colorize, model_view, overlay
from vitkit.viz.attention import COLORMAP


def test_colour_map_ends_and_middle():
    colours = colorize(torch.tensor([0.0, 0.5, 1.0]) * 7 + 3)
    assert colours.tolist() == [list(COLORMAP[0]), list(COLORMAP[2]), list(COLORMAP[-1])]
    assert colorize(torch.tensor([2.0, 2.0])).tolist() == [list(COLORMAP[0])] * 2
    assert colorize(torch.tensor([0.25]), 0.0, 1.0).tolist() == [list(COLORMAP[1])]


def test_overlay_blends_the_upsampled_map():
    image = Image.fromarray(np.full((40, 60, 3), 200, dtype=np.uint8))
    heat = torch.zeros(2, 3)
    heat[1, 2] = 1.0  # hot in the bottom-right cell
    assert np.array_equal(np.asarray(overlay(image, heat, alpha=0.0)), np.asarray(image))
    full = np.asarray(overlay(image, heat, alpha=1.0))
    assert full.shape == (40, 60, 3)
    assert full[-1, -1].tolist() == list(COLORMAP[-1]) and full[0, 0].tolist() == list(COLORMAP[0])
    half = np.asarray(overlay(image, heat, alpha=0.5)).astype(int)
    np.testing.assert_allclose(half[0, 0], (200 + np.array(COLORMAP[0])) / 2, atol=1)


def test_model_view_is_the_centre_crop_enlarged():
    wide = Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 56), dtype=np.uint8))
    view = model_view(wide, (28, 28))
    assert view.size == (224, 224) and view.mode == "RGB"
    expected = wide.convert("RGB").resize((448, 224), Image.Resampling.BICUBIC).crop((112, 0, 336, 224))
    assert np.array_equal(np.asarray(view), np.asarray(expected))


def test_model_view_shows_the_models_channels_and_crop():
    """Transparency on white and a 1-channel model's grey, as `eval_transform` gives the model; a (H, W) model's
    crop covers the image's centre without bars."""
    rgba = np.zeros((40, 40, 4), dtype=np.uint8)
    rgba[:, 20:] = (255, 0, 0, 255)  # the left half transparent (stored black)
    view = np.asarray(model_view(Image.fromarray(rgba), (40, 40), min_side=40))
    assert view[:, :18].min() == 255 and view[:, 22:].tolist() == [[[255, 0, 0]] * 18] * 40
    grey = np.asarray(model_view(Image.fromarray(rgba), (40, 40), min_side=40, channels=1))
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    photo = Image.fromarray(np.full((48, 64, 3), 90, dtype=np.uint8))  # 4:3, for a 2:3 (H, W) model
    assert np.asarray(model_view(photo, (16, 24), min_side=16)).min() == 90
