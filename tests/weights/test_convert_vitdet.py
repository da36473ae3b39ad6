"""transformers' ViTDet (`VitDetBackbone`) <-> vitkit's ViT with windows: windowed and global blocks, with and without
decomposed relative positions, on grids the windows divide and grids they do not (padding), in float64 with every
weight moved off its initial value (zero relative tables and unit norms would hide a wrong offset order or a swapped
norm)."""

import pytest
import torch
import transformers

import vitkit
from vitkit.models.vit import VisionTransformer, ViTConfig
from vitkit.weights import load_weights

BASE = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, patch_size=8, mlp_ratio=2)


def _vitdet(image_size, pretrain_image_size, window_size, windowed, rel_pos):
    config = transformers.VitDetConfig(
        **BASE,
        image_size=image_size,
        pretrain_image_size=pretrain_image_size,
        window_size=window_size,
        window_block_indices=windowed,
        use_relative_position_embeddings=rel_pos,
        out_features=[f"stage{i}" for i in range(1, 5)],
    )
    model = transformers.VitDetBackbone(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model.double().eval()


def _assert_maps_equal(ours, theirs, x):
    with torch.no_grad():
        maps = theirs(pixel_values=x).feature_maps  # after each block, (B, D, Hp, Wp)
        mine = ours.forward_intermediates(x, norm=False, intermediates_only=True)
    assert len(mine) == len(maps)
    for a, b in zip(mine, maps, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


CASES = {  # image_size, pretrain_image_size, window, windowed blocks, relative positions, input size
    "windows_rel_pos": (64, 64, 3, [0, 2], True, (64, 64)),  # an 8x8 grid, 3x3 windows: padded
    "windows": (64, 64, 4, [0, 1, 3], False, (64, 64)),
    "all_global_rel_pos": (48, 48, 0, [], True, (48, 48)),
    "pretrained_smaller": (64, 32, 4, [1, 2], True, (64, 64)),  # the table resampled on import
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_vitdet_backbone_equals_transformers(case, tmp_path):
    image, pretrain, window, windowed, rel_pos, size = CASES[case]
    theirs = _vitdet(image, pretrain, window, windowed, rel_pos)
    theirs.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path).double().eval()
    c = ours.config
    assert (c.window_size, c.rel_pos, c.final_norm) == (window if windowed else 0, rel_pos, False)
    assert [i for i in range(c.depth) if c.block_window(i)] == (windowed if window else [])
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    _assert_maps_equal(ours, theirs, x)

    # the same weights through load_weights into a model built from vitkit's own config
    built = VisionTransformer(
        ViTConfig(
            img_size=image, patch_size=8, embed_dim=32, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=0,
            class_token=False, global_pool="avg", fc_norm=False, final_norm=False, pos_antialias=False,
            window_size=window, global_blocks=tuple(i for i in range(4) if i not in windowed) if window else (),
            rel_pos=rel_pos, dynamic_img_size=True,
        )
    ).double().eval()  # fmt: skip
    load_weights(built, theirs.state_dict())
    _assert_maps_equal(built, theirs, x)


def test_vitdet_round_trips_through_transformers_layout(tmp_path):
    theirs = _vitdet(64, 64, 3, [0, 2], True)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = vitkit.from_pretrained(tmp_path / "theirs").double()
    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = (
        transformers.VitDetBackbone.from_pretrained(tmp_path / "back", out_features=[f"stage{i}" for i in range(1, 5)])
        .double()
        .eval()
    )
    _assert_maps_equal(ours, back, torch.randn(1, 3, 64, 64, dtype=torch.float64))


def test_windowed_vit_pyramid_has_vitdet_shapes():
    """ViTDet's simple feature pyramid on its windowed ViT-B/16 (window 14, blocks 3, 6, 9, 12 global) at 1024 px
    has the paper's strides 4, 8, 16, 32 (its section 3); a small windowed ViT's pyramid runs at a size the windows
    do not divide."""
    from vitkit.models.backbone import ClassifierBackbone

    vitdet = dict(img_size=1024, window_size=14, global_blocks=(2, 5, 8, 11), rel_pos=True)
    backbone = ClassifierBackbone("vit_base_patch16_224", outs=(12,), scales=(4.0, 2.0, 1.0, 0.5), fields=vitdet)
    assert backbone.feature_sizes((1024, 1024)) == [(256, 256), (128, 128), (64, 64), (32, 32)]
    assert list(backbone.strides) == [4, 8, 16, 32]

    small = dict(vitdet, img_size=96, embed_dim=32, depth=4, num_heads=2, global_blocks=(3,), window_size=4)
    backbone = ClassifierBackbone("vit_base_patch16_224", outs=(4,), scales=(4.0, 2.0, 1.0, 0.5), fields=small)
    maps = backbone(torch.randn(1, 3, 96, 160))  # a 6x10 grid: 4x4 windows pad it
    assert [tuple(m.shape[-2:]) for m in maps] == [(24, 40), (12, 20), (6, 10), (3, 5)]
