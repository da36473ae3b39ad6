"""Attention maps of ViTs with register tokens ("Vision Transformers Need Registers", arXiv:2309.16588): the token
order the maps assume, the map and the shares of the prefix tokens against the weights recomputed here from each
block's input, rollout over every token, the prefix tokens' names, and the figure that writes the shares under each
map. Models without registers are drawn as before (`test_attention_figure.py`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model
from vitkit.data import preprocess
from vitkit.infer import attention_map, attention_maps, cls_attention
from vitkit.infer.attention import attention_figure, prefix_attention, prefix_table, prefix_token_names
from vitkit.viz.attention import share_note

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
REGISTERS = ("class", "register 0", "register 1", "register 2", "register 3")
P, GRID = 5, (4, 4)  # class + 4 registers before a 4x4 grid of 14-px patches of a 56x56 image


def moved_off_init(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """`model` with its learned tokens, position table and q / k projections drawn anew, so that the class token,
    every register and every patch attend differently (at initialisation the registers are all but equal)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for token in (model.cls_token, model.dist_token, model.reg_token, model.pos_embed):
            if token is not None:
                token.copy_(torch.randn(token.shape, generator=g))
        for block in model.blocks:
            block.attn.qkv.weight.copy_(torch.randn(block.attn.qkv.weight.shape, generator=g) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)  # the weights moved_off_init leaves as they were initialised (patch embedding, ...)
    return moved_off_init(create_model("vit_small_patch14_reg4_dinov2", img_size=56, depth=2))


@pytest.fixture(scope="module")
def image():
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 70, 3), dtype=np.uint8))


def explicit_weights(model: torch.nn.Module, pixels: torch.Tensor) -> tuple[list[np.ndarray], list[torch.Tensor]]:
    """(each block's softmax(q k^T / sqrt(d)) (B, h, N, N), recomputed from the block's input and its qkv weights;
    each block's input (B, N, C), for the token order)."""
    inputs, normed = [], []
    hooks = [b.register_forward_pre_hook(lambda _, args: inputs.append(args[0])) for b in model.blocks]
    hooks += [b.attn.register_forward_pre_hook(lambda _, args: normed.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model(pixels)
    for hook in hooks:
        hook.remove()
    weights = []
    for block, x in zip(model.blocks, normed, strict=True):
        B, N, _ = x.shape
        h = block.attn.num_heads
        weight, bias = block.attn.qkv.weight.detach().double(), block.attn.qkv.bias.detach().double()
        d = weight.shape[0] // (3 * h)
        qkv = (x.double() @ weight.T + bias).reshape(B, N, 3, h, d)  # in float64: a reference
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (B, h, N, d)
        weights.append(((q @ k.transpose(-2, -1)) / d**0.5).softmax(dim=-1).numpy())
    return weights, inputs


def explicit_rollout(layers: list[np.ndarray]) -> np.ndarray:
    """Abnar & Zuidema's rollout over every token (registers included), heads averaged: (B, N, N)."""
    N = layers[0].shape[-1]
    rollout = np.eye(N)
    for attn in layers:
        a = 0.5 * attn.mean(axis=1) + 0.5 * np.eye(N)
        rollout = (a / a.sum(axis=-1, keepdims=True)) @ rollout
    return rollout


def test_the_tokens_are_class_then_registers_then_patches(model, image):
    """The order the maps assume: token 0 is the class token, tokens 1..4 the registers (neither with a position
    embedding in DINOv2), then the patches."""
    assert prefix_token_names(model) == REGISTERS and model.token_grid((56, 56)) == (P, GRID)
    _, inputs = explicit_weights(model, preprocess(image, (56, 56), 3, MEAN, STD)[None])
    tokens = inputs[0][0]  # (N, C) entering the first block
    assert tokens.shape[0] == P + 16
    torch.testing.assert_close(tokens[0], model.cls_token[0, 0])
    torch.testing.assert_close(tokens[1:P], model.reg_token[0])


def test_maps_and_register_shares_equal_the_weights(model, image):
    pixels = preprocess(image, (56, 56), 3, MEAN, STD)[None]  # (1, 3, 56, 56)
    weights, _ = explicit_weights(model, pixels)
    maps = attention_maps(model, image, MEAN, STD, layer=1, head="all")
    last = weights[1][0]  # (h, N, N)
    h = last.shape[0]
    np.testing.assert_allclose(maps.heats.numpy(), last[:, 0, P:].reshape(h, *GRID), rtol=1e-4, atol=1e-6)
    assert maps.prefix.names == REGISTERS and maps.prefix.query == "class token"
    np.testing.assert_allclose(maps.prefix.shares.numpy(), last[:, 0, :P], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(maps.prefix.from_patches.numpy(), last[:, P:, :P].mean(axis=1), rtol=1e-4, atol=1e-6)
    assert maps.prefix.shares[:, 1:].sum(dim=1).max() > 0.1  # the registers take a share worth showing
    whole = maps.heats.sum(dim=(1, 2)) + maps.prefix.shares.sum(dim=1)  # the map and the shares: the whole row
    torch.testing.assert_close(whole, torch.ones(h))

    mean = attention_maps(model, image, MEAN, STD, layer=0)
    np.testing.assert_allclose(mean.prefix.shares.numpy()[0], weights[0][0, :, 0, :P].mean(axis=0), rtol=1e-4)
    torch.testing.assert_close(mean.heats, attention_map(model, pixels, layer=0))

    rollout = explicit_rollout(weights)[0]  # (N, N)
    rolled = attention_maps(model, image, MEAN, STD, rollout=True)
    np.testing.assert_allclose(rolled.heats.numpy()[0], rollout[0, P:].reshape(GRID), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(rolled.prefix.shares.numpy()[0], rollout[0, :P], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(rolled.prefix.from_patches.numpy()[0], rollout[P:, :P].mean(axis=0), rtol=1e-4)
    torch.testing.assert_close(rolled.heats, attention_map(model, pixels, rollout=True))


def test_prefix_attention_of_one_layer():
    g = torch.Generator().manual_seed(0)
    attn = torch.randn(2, 3, 3 + 6, 3 + 6, generator=g).softmax(dim=-1)  # class, 2 registers, a 2x3 grid
    torch.testing.assert_close(prefix_attention(attn, 3, (2, 3)), attn[:, :, 0, :3].mean(dim=1))
    torch.testing.assert_close(prefix_attention(attn, 3, (2, 3), head=1), attn[:, 1, 0, :3])
    torch.testing.assert_close(prefix_attention(attn, 3, (2, 3), from_patches=True), attn[:, :, 3:, :3].mean((1, 2)))
    torch.testing.assert_close(cls_attention(attn, 3, (2, 3)), attn[:, :, 0, 3:].mean(dim=1).reshape(2, 2, 3))
    # registers without a class token: the mean over all tokens' rows, as for a model without prefix tokens
    no_class = dict(class_token=False)
    torch.testing.assert_close(cls_attention(attn, 3, (2, 3), **no_class), attn.mean((1, 2))[:, 3:].reshape(2, 2, 3))
    torch.testing.assert_close(prefix_attention(attn, 3, (2, 3), **no_class), attn.mean((1, 2))[:, :3])
    with pytest.raises(ValueError, match="does not match 3 prefix tokens and a 3x3 grid"):
        prefix_attention(attn, 3, (3, 3))


TINY = dict(img_size=28, patch_size=7, embed_dim=16, depth=2, num_heads=2, num_classes=10)


@pytest.mark.parametrize(
    "fields, names",
    [
        ({}, ("class",)),
        (dict(distilled=True), ("class", "distillation")),
        (dict(distilled=True, reg_tokens=2), ("class", "distillation", "register 0", "register 1")),
        (dict(class_token=False, global_pool="avg"), ()),
        (dict(class_token=False, global_pool="avg", reg_tokens=2), ("register 0", "register 1")),
    ],
)
def test_prefix_token_names_follow_the_config(fields, names):
    model = create_model("vit_tiny_patch16_224", **TINY, **fields)
    assert prefix_token_names(model) == names and model.token_grid((28, 28))[0] == len(names)


def test_names_a_model_declares_are_taken_and_other_grids_have_none():
    model = create_model("vit_tiny_patch16_224", **TINY, reg_tokens=1)
    model.prefix_token_names = lambda: ("class", "memory")
    assert prefix_token_names(model) == ("class", "memory")
    swin = create_model("swin_tiny_patch4_window7_224", img_size=56, depths=(1, 1), num_heads=(1, 2), embed_dim=16)
    assert prefix_token_names(swin) == ()


def test_registers_without_a_class_token_map_the_mean_attention(image):
    torch.manual_seed(0)
    fields = dict(class_token=False, global_pool="avg", reg_tokens=2)  # token 0 is register 0, not a class token
    model = moved_off_init(create_model("vit_tiny_patch16_224", **TINY, **fields))
    pixels = preprocess(image, (28, 28), 3, MEAN, STD)[None]
    weights, _ = explicit_weights(model, pixels)
    maps = attention_maps(model, image, MEAN, STD)
    mean_row = weights[1][0].mean(axis=(0, 1))  # (N,): the heads' mean, the mean over all query tokens
    np.testing.assert_allclose(maps.heats.numpy()[0], mean_row[2:].reshape(4, 4), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(maps.prefix.shares.numpy()[0], mean_row[:2], rtol=1e-4, atol=1e-6)
    assert maps.values == "mean attention each patch receives" and maps.prefix.query == "all tokens"


def test_an_attention_pool_is_no_layer_of_the_maps(image):
    """SigLIP's MAP pool attends with one probe query over the tokens, (B, h, 1, N): the maps are the blocks' mean
    attention each patch receives, the layers counted and rolled out are the blocks'."""
    torch.manual_seed(0)
    model = create_model("vit_base_patch16_siglip_224", img_size=32, depth=2, embed_dim=32, num_heads=2).eval()
    pixels = preprocess(image, (32, 32), 3, MEAN, STD)[None]
    weights, _ = explicit_weights(model, pixels)
    maps = attention_maps(model, image, MEAN, STD)
    assert maps.what == "layer 1 (of 0..1), mean of 2 heads" and maps.values == "mean attention each patch receives"
    np.testing.assert_allclose(maps.heats.numpy()[0], weights[1][0].mean(axis=(0, 1)).reshape(2, 2), rtol=1e-4)
    rolled = attention_maps(model, image, MEAN, STD, rollout=True)
    np.testing.assert_allclose(
        rolled.heats.numpy()[0], explicit_rollout(weights)[0].mean(axis=0).reshape(2, 2), rtol=1e-4
    )
    assert maps.prefix is None and len(attention_maps(model, image, MEAN, STD, grid=True).heats) == 2 * 2


def test_models_without_registers_show_no_shares(image):
    for fields in ({}, dict(distilled=True), dict(class_token=False, global_pool="avg")):
        model = create_model("vit_tiny_patch16_224", **TINY, **fields)
        figure, maps = attention_figure(model, image, MEAN, STD, head="all")
        assert maps.prefix is None and prefix_table(maps) == []
        assert all(not ax.texts for ax in figure.axes) and "register" not in figure.get_suptitle()


def test_the_figure_writes_the_shares_under_each_map(model, image):
    figure, maps = attention_figure(model, image, MEAN, STD, layer=0, head="all")
    view, *panels, _ = figure.axes
    assert not view.texts and len(panels) == 6
    for ax, shares in zip(panels, maps.prefix.shares, strict=True):
        (text,) = ax.texts
        assert text.get_text().split() == share_note(REGISTERS, shares).split()  # wrapped to the panel's width
    r = maps.prefix.shares[0]
    first, second = share_note(REGISTERS, r).replace("\xa0", " ").split("\n")
    assert first == f"registers {r[1:].sum():.2f} · class {r[0]:.2f}"
    assert second == "  ".join(f"r{i} {f'{r[1 + i]:.2f}'.removeprefix('0')}" for i in range(4))
    caption = "under each map: the attention of the class token to the 4 registers (their sum, then each) and to itself"
    assert caption in figure.get_suptitle().replace("\n", " ")


def test_the_table_of_shares(model, image):
    maps = attention_maps(model, image, MEAN, STD, grid=True)
    lines = prefix_table(maps)
    assert lines[1].split() == " ".join(["map", "from", *REGISTERS, "registers"]).split()
    assert len(lines) == 2 + 2 * 12  # the words, the header, two rows for each of 2 layers x 6 heads
    for k, title in enumerate(maps.titles):
        rows = [("class token", maps.prefix.shares[k]), ("patches (mean)", maps.prefix.from_patches[k])]
        for row, (who, values) in enumerate(rows):
            line = lines[2 + 2 * k + row]
            assert line.startswith(f"  {title}") and who in line
            numbers = [float(v) for v in line.split()[-6:]]
            np.testing.assert_allclose(numbers, [*values.tolist(), values[1:].sum().item()], atol=6e-5)
