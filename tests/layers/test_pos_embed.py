"""Position-embedding resampling against timm; the 2-D sin-cos table and DETR's sine encoding against their
definitions."""

import math

import pytest
import torch
from timm.layers import resample_abs_pos_embed as timm_resample

from vitkit.layers import resample_abs_pos_embed, sincos_2d_pos_embed
from vitkit.layers.pos_embed import SinePositionEmbedding


@pytest.mark.parametrize(
    ("old", "new", "prefix"), [((14, 14), (10, 16), 1), ((7, 7), (7, 7), 1), ((4, 6), (8, 3), 2), ((5, 5), (9, 9), 0)]
)
def test_resample_matches_timm(old, new, prefix):
    torch.manual_seed(0)
    table = torch.randn(1, prefix + old[0] * old[1], 24)
    ours = resample_abs_pos_embed(table, new, old, num_prefix_tokens=prefix)
    theirs = timm_resample(table, list(new), list(old), num_prefix_tokens=prefix)
    assert ours.shape == (1, prefix + new[0] * new[1], 24)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)


def test_resample_square_default_and_bad_grid():
    table = torch.randn(1, 1 + 16, 8)
    assert resample_abs_pos_embed(table, (2, 2)).shape == (1, 5, 8)
    with pytest.raises(ValueError, match="not a 3x3 grid"):
        resample_abs_pos_embed(table, (2, 2), old_size=(3, 3))
    with pytest.raises(ValueError, match="square grid"):
        resample_abs_pos_embed(torch.randn(1, 1 + 15, 8), (2, 2))


def test_sincos_matches_its_definition():
    D, (H, W) = 16, (3, 5)
    table = sincos_2d_pos_embed(D, (H, W), num_prefix_tokens=1)
    assert table.shape == (1, 1 + H * W, D)
    assert torch.all(table[0, 0] == 0)
    for r in range(H):
        for c in range(W):
            row = table[0, 1 + r * W + c]
            for k in range(D // 4):
                w = 10000 ** (-k / (D // 4))
                expected = [math.sin(r * w), math.cos(r * w), math.sin(c * w), math.cos(c * w)]
                got = [row[k], row[D // 4 + k], row[D // 2 + k], row[3 * D // 4 + k]]
                assert got == pytest.approx(expected, abs=1e-6)


def test_sincos_needs_dim_divisible_by_four():
    with pytest.raises(ValueError, match="divisible by 4, got 18"):
        sincos_2d_pos_embed(18, (2, 2))


def test_sine_position_embedding_follows_the_formula():
    F = 8
    mask = torch.zeros(1, 4, 5, dtype=torch.bool)
    mask[0, :3, :4] = True  # a 3 x 4 real image padded to 4 x 5
    pos = SinePositionEmbedding(F)(mask).reshape(4, 5, 2 * F)  # (B, N, 2F) -> (h, w, 2F)

    def expected(i: int, j: int) -> torch.Tensor:
        y, x = (i + 1) / 3 * 2 * math.pi, (j + 1) / 4 * 2 * math.pi  # normalised by the real height and width
        features = []
        for t in (y, x):  # y's F features first
            for k in range(F):
                angle = t / 10000 ** (2 * (k // 2) / F)
                features.append(math.sin(angle) if k % 2 == 0 else math.cos(angle))
        return torch.tensor(features)

    for i, j in ((0, 0), (2, 3), (1, 2)):
        torch.testing.assert_close(pos[i, j], expected(i, j), atol=1e-5, rtol=0)
