"""PatchEmbed, Mlp, DropPath and Block against timm's layers with the same weights."""

import pytest
import torch
from timm.layers import Mlp as TimmMlp
from timm.layers import PatchEmbed as TimmPatchEmbed
from timm.models.vision_transformer import Block as TimmBlock

from vitkit.layers import Block, DropPath, Mlp, PatchEmbed


def test_patch_embed_matches_timm():
    torch.manual_seed(0)
    ours = PatchEmbed(32, 8, 3, 16)
    theirs = TimmPatchEmbed(32, 8, 3, 16)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(x), theirs(x))
    assert PatchEmbed(32, 8, 3, 16, flatten=False)(x).shape == (2, 4, 4, 16)


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.randn(3, 32, 32), r"4-D image batch \(B, C, H, W\), got shape \(3, 32, 32\)"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), "floating-point image tensor, got dtype torch.uint8"),
        (torch.randn(1, 1, 32, 32), "expected 3 input channels, got 1"),
        (torch.randn(1, 3, 32, 48), "expected images of size 32x32, got 32x48"),
        ([[1.0]], "expected an image tensor"),
        (torch.randn(1, 3, 32, 32, dtype=torch.float64), "expected images of dtype torch.float32 .the model's., got"),
    ],
)
def test_patch_embed_rejects_bad_input(x, message):
    with pytest.raises(ValueError, match=message):
        PatchEmbed(32, 8, 3, 16)(x)


def test_patch_embed_dynamic_sizes():
    layer = PatchEmbed(32, 8, 3, 16, strict_img_size=False)
    assert layer(torch.randn(1, 3, 16, 40)).shape == (1, 2 * 5, 16)
    with pytest.raises(ValueError, match="image width 20 is not a positive multiple of patch size 8: .* 16 or 24"):
        layer(torch.randn(1, 3, 16, 20))
    with pytest.raises(
        ValueError, match="height 30 is not a multiple of patch size 8: the nearest that are 24 or 32"
    ):
        PatchEmbed(30, 8)
    with pytest.raises(
        ValueError, match="height 32 is not a multiple of patch size 7: the nearest that are 28 or 35"
    ):
        PatchEmbed(32, 7)
    with pytest.raises(ValueError, match="image width 3 is not a multiple of patch size 7: the nearest that are 7$"):
        PatchEmbed((7, 3), 7)


def test_mlp_matches_timm():
    torch.manual_seed(0)
    ours, theirs = Mlp(8, 32), TimmMlp(8, 32)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("init_values", [None, 0.1])
def test_block_matches_timm(init_values):
    torch.manual_seed(0)
    ours = Block(32, 4, mlp_ratio=2.0, init_values=init_values)
    theirs = TimmBlock(32, 4, mlp_ratio=2.0, qkv_bias=True, init_values=init_values)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_drop_path_statistics():
    layer = DropPath(0.25)
    x = torch.ones(20000, 3)
    layer.eval()
    assert torch.equal(layer(x), x)
    layer.train()
    torch.manual_seed(0)
    y = layer(x)
    kept = (y[:, 0] != 0).float()
    assert torch.all(y[:, 0] == y[:, 1])  # one draw per sample
    torch.testing.assert_close(y.unique(), torch.tensor([0.0, 1 / 0.75]))  # kept samples scaled by 1/keep
    assert abs(kept.mean().item() - 0.75) < 0.02
    with pytest.raises(ValueError, match=r"drop_prob must be in \[0, 1\), got 1.5"):
        DropPath(1.5)
