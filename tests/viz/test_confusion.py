"""The confusion matrix figure: cells coloured by row share, counts where they fit, accuracy in the title, a size
that grows with the class count, full rotated labels, and indices with a legend for names no font draws."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from vitkit.viz import confusion_image
from vitkit.viz.attention import fonts_for
from vitkit.viz.plots import MAX_MATRIX, confusion_figure


def _confusion(K: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (K, K), generator=g) + torch.diag(torch.randint(5, 30, (K,), generator=g))


def _matrix_axes(figure):
    return next(ax for ax in figure.axes if ax.get_images() and ax.get_xlabel())


def test_cells_counts_and_title_follow_the_matrix():
    confusion = torch.tensor([[3, 1, 0], [0, 4, 0], [2, 0, 0]])
    figure = confusion_figure(confusion, ["cat", "dog", "bird"], title="a model")
    ax = _matrix_axes(figure)
    shares = confusion.double() / confusion.sum(1, keepdim=True).clamp(min=1)
    (image,) = ax.get_images()
    np.testing.assert_allclose(image.get_array(), shares.numpy())
    assert image.get_clim() == (0.0, 1.0)  # every row on the same scale, whatever its largest share
    assert _matrix_axes(confusion_figure(torch.ones(2, 2), ["a", "b"])).get_images()[0].get_clim() == (0.0, 1.0)
    assert image.colorbar.ax.get_ylabel() == "share of the true class's images"
    assert image.colorbar.ax.get_ylim() == (0.0, 1.0)
    counts = [[None] * 3 for _ in range(3)]
    for text in ax.texts:
        x, y = text.get_position()
        counts[round(y)][round(x)] = int(text.get_text())
    assert counts == confusion.tolist()
    assert ax.get_title() == "a model\naccuracy 70.0% (7 of 10 images, 3 classes)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cat", "dog", "bird"]
    assert all(t.get_rotation() == 45 for t in ax.get_xticklabels())
    with pytest.raises(ValueError, match="does not match 2 classes"):
        confusion_figure(confusion, ["a", "b"])


def test_the_figure_grows_with_the_class_count_and_stays_bounded():
    sizes = [confusion_image(_confusion(K), [f"class {k}" for k in range(K)]).size for K in (3, 10, 25, 200)]
    assert sizes[0][0] < sizes[1][0] < sizes[2][0] < sizes[3][0]
    assert sizes[0][1] < sizes[1][1] < sizes[2][1] < sizes[3][1]
    figure = confusion_figure(_confusion(200), [f"class {k}" for k in range(200)])
    ax = _matrix_axes(figure)
    assert not ax.texts  # 200 counts do not fit their cells
    shown = [t.get_text() for t in ax.get_xticklabels()]
    assert 0 < len(shown) < 200 and shown[:2] == ["class 0", f"class {200 // len(shown)}"]  # thinned evenly
    assert len(shown) == 100  # 14-inch matrix: 0.07-inch cells, labels of 6 points need two cells each
    assert all(t.get_rotation() == 90 for t in ax.get_xticklabels())
    assert max(figure.get_size_inches()) < MAX_MATRIX + 6


def test_greek_cyrillic_and_long_names_are_drawn_without_missing_glyphs():
    names = ["αλεπού", "собака", "$x$_y", "a name longer than eight chars", "n" * 41]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)"
        figure = confusion_figure(_confusion(5), names)
        confusion_image(_confusion(5), names)
    assert [t.get_text() for t in _matrix_axes(figure).get_yticklabels()] == [*names[:4], "n" * 39 + "…"]


def test_names_no_font_draws_become_indices_with_a_legend():
    names = ["猫", "犬", "bird"]
    _, missing = fonts_for(names)
    if not missing:
        pytest.skip("an installed font draws these names")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = confusion_figure(_confusion(3), names)
        confusion_image(_confusion(3), names)
    ax = _matrix_axes(figure)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    assert ax.get_xlabel() == "predicted class (index)"
    (legend,) = [a for a in figure.axes if a.texts and not a.get_images()]
    assert [t.get_text() for t in legend.texts] == ["index  class", "0  <U+732B>", "1  <U+72AC>", "2  bird"]


def test_confusion_image_is_the_figure_at_its_size(saved_figures):

    saved = saved_figures
    figure = confusion_figure(_confusion(5), list("abcde"))
    image = confusion_image(_confusion(5), list("abcde"))
    assert image.mode == "RGB" and image.size == tuple(round(v) for v in figure.get_size_inches() * figure.dpi)
    # each cell of the picture has the colour of its row share, beside its count (the drawn figure's layout)
    (drawn,) = saved
    ax = _matrix_axes(drawn)
    cmap = ax.get_images()[0].cmap
    confusion = _confusion(5).double()
    shares = confusion / confusion.sum(1, keepdim=True)
    pixels = np.asarray(image, dtype=int)  # (H, W, 3)
    for i in range(5):
        for j in range(5):
            column, row = ax.transData.transform((j - 0.3, i - 0.3))  # a cell's upper left, clear of its count
            expected = np.array(cmap(shares[i, j].item())[:3]) * 255
            assert np.abs(pixels[round(pixels.shape[0] - row), round(column)] - expected).max() <= 3, (i, j)
