"""Attention maps and rollout of a model against explicit implementations written here, and the overlay of an
image's map."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model
from vitkit.infer import attention_map, attention_overlay, attention_rollout, cls_attention


def _random_attention(B: int, h: int, N: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(B, h, N, N, generator=generator).softmax(dim=-1)


def _explicit_rollout(layers: list[np.ndarray], prefix: int, grid: tuple[int, int], head: int | None) -> np.ndarray:
    """Abnar & Zuidema (arXiv:2005.00928), one image at a time, with numpy."""
    B, _, N, _ = layers[0].shape
    out = np.zeros((B, *grid))
    for b in range(B):
        rollout = np.eye(N)
        for attn in layers:
            a = attn[b].mean(axis=0) if head is None else attn[b, head]
            a = 0.5 * a + 0.5 * np.eye(N)
            a = a / a.sum(axis=-1, keepdims=True)
            rollout = a @ rollout
        row = rollout[0] if prefix else rollout.mean(axis=0)
        out[b] = row[prefix:].reshape(grid)
    return out


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("head", [None, 1])
def test_rollout_matches_an_explicit_implementation(prefix, head):
    g = torch.Generator().manual_seed(prefix)
    grid = (3, 4)
    layers = [_random_attention(2, 3, prefix + 12, g) for _ in range(4)]
    ours = attention_rollout(layers, prefix, grid, head)
    expected = _explicit_rollout([a.double().numpy() for a in layers], prefix, grid, head)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-5, atol=1e-7)


def test_class_token_attention_of_one_layer():
    g = torch.Generator().manual_seed(0)
    attn = _random_attention(2, 4, 1 + 6, g)
    torch.testing.assert_close(cls_attention(attn, 1, (2, 3)), attn[:, :, 0, 1:].mean(dim=1).reshape(2, 2, 3))
    torch.testing.assert_close(cls_attention(attn, 1, (2, 3), head=-1), attn[:, 3, 0, 1:].reshape(2, 2, 3))
    with pytest.raises(ValueError, match="head 4 is out of range for 4 heads"):
        cls_attention(attn, 1, (2, 3), head=4)
    with pytest.raises(ValueError, match="does not match 1 prefix tokens and a 3x3 grid"):
        cls_attention(attn, 1, (3, 3))


def _explicit_attention_weights(model: torch.nn.Module, images: torch.Tensor) -> list[np.ndarray]:
    """Each block's softmax(q k^T / sqrt(d)), recomputed from the block's input and its qkv weights."""
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda _, args: inputs.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    weights = []
    for block, x in zip(model.blocks, inputs, strict=True):
        B, N, C = x.shape
        h = block.attn.num_heads
        qkv = (x @ block.attn.qkv.weight.detach().T + block.attn.qkv.bias.detach()).reshape(B, N, 3, h, C // h)
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (B, h, N, d)
        weights.append(((q @ k.transpose(-2, -1)) / (C // h) ** 0.5).softmax(dim=-1).double().numpy())
    return weights


def test_attention_map_of_a_model_uses_its_layers_in_order():
    torch.manual_seed(0)
    model = create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, embed_dim=24, depth=3)
    images = torch.randn(2, 3, 32, 32)
    weights = _explicit_attention_weights(model, images)
    rollout = attention_map(model, images, rollout=True)
    np.testing.assert_allclose(rollout.numpy(), _explicit_rollout(weights, 2, (4, 4), None), rtol=1e-4, atol=1e-6)
    second = attention_map(model, images, layer=1, head=2)
    np.testing.assert_allclose(second.numpy(), weights[1][:, 2, 0, 2:].reshape(2, 4, 4), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="layer 3 is out of range for a model with 3 attention layers"):
        attention_map(model, images, layer=3)


def test_windowed_attention_is_refused_with_a_reason():
    model = create_model("swin_tiny_patch4_window7_224", img_size=56, depths=(1, 1), num_heads=(1, 2), embed_dim=16)
    with pytest.raises(ValueError) as caught:
        attention_map(model, torch.randn(1, 3, 56, 56))
    assert str(caught.value) == (
        "Swin has no one map of the image to draw: its blocks attend within 7x7 windows of each stage's feature map "
        "(shifted every other block). vitkit attention draws models whose every layer attends over one grid of "
        "patches of the whole image (ViT, DeiT) and detectors' objects; vitkit explore draws Swin's attention layer "
        "by layer, each on the map it attends over (vitkit explore --model-dir DIR IMAGE --out page.html)"
    )
    sizes = dict(img_size=32, patch_size=8, embed_dim=16, depth=3, num_heads=2)
    vitdet = create_model("vit_tiny_patch16_224", **sizes, window_size=2, global_blocks=(1,))
    windows = "its blocks but 1 attend within 2x2-patch windows, not over the whole image"
    with pytest.raises(ValueError, match=rf"ViT has no one map of the image to draw: {windows}\..*vitkit explore"):
        attention_map(vitdet, torch.randn(1, 3, 32, 32))


def test_models_without_one_token_grid_are_refused():
    """Each family says why in its own words (BoTNet has no windows), and points to the explorer, which draws it."""
    botnet = create_model("botnet26t_256", img_size=64, stem_chs=16, widths=(32, 64, 128, 256))
    with pytest.raises(ValueError) as caught:
        attention_map(botnet, torch.randn(1, 3, 64, 64))
    message = str(caught.value)
    assert message.startswith(
        "BoTNet has no one map of the image to draw: each BoT block attends over a whole feature map, but the maps "
        "differ from block to block (4x4 then 2x2) and convolutions mix positions before them."
    )
    assert "window" not in message and "vitkit explore draws BoTNet's attention layer by layer" in message
    with pytest.raises(ValueError, match="attention maps needs a vitkit model .* Conv2d lacks config"):
        attention_map(torch.nn.Conv2d(3, 4, 2), torch.randn(1, 3, 4, 4))


def test_attention_overlay_of_an_image():
    model = create_model("vit_tiny_patch16_224", img_size=28, patch_size=7, embed_dim=16, depth=2, num_heads=2)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8))
    picture = attention_overlay(model, image, (0.5,), (0.25,), rollout=True)
    assert picture.size == (224, 224) and picture.mode == "RGB"
