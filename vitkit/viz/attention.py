"""Where a vision transformer looks: class-token attention of one layer, attention rollout across layers, and the
heat map drawn over the image.

Attention rollout: "Quantifying Attention Flow in Transformers", Abnar & Zuidema, arXiv:2005.00928. Each layer's
attention (heads fused) is mixed with the identity for the residual connection, A' = (A + I) / 2, rows
renormalised, and the layers are multiplied from the last to the first: R = A'_L ... A'_1.

The weights come from `vitkit.capture_attention`, so every attention backend works.
Letters: B batch, h heads, N tokens (P prefix tokens, then the Hp x Wp patch grid).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from vitkit.data import preprocess
from vitkit.layers import capture_attention, to_2tuple
from vitkit.models.interface import require_model

# A perceptually ordered dark-blue -> teal -> yellow colour map (viridis' end points and three inner stops).
COLORMAP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def _fuse_heads(attn: torch.Tensor, head: int | None) -> torch.Tensor:
    """(B, h, N, N) -> (B, N, N): one head, or the mean over heads when `head` is None."""
    if head is None:
        return attn.mean(dim=1)
    if not -attn.shape[1] <= head < attn.shape[1]:
        raise ValueError(f"head {head} is out of range for {attn.shape[1]} heads")
    return attn[:, head]


def _query_row(attn: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
    """(B, N, N) -> (B, Hp, Wp): the class token's row over the patch tokens, or the mean row without prefix tokens."""
    B, N, _ = attn.shape
    Hp, Wp = grid
    if N != num_prefix_tokens + Hp * Wp:
        raise ValueError(
            f"attention over {N} tokens does not match {num_prefix_tokens} prefix tokens and a {Hp}x{Wp} grid "
            "(attention maps need a model whose layers attend over the whole image, such as ViT / DeiT)"
        )
    row = attn[:, 0] if num_prefix_tokens > 0 else attn.mean(dim=1)  # (B, N)
    return row[:, num_prefix_tokens:].reshape(B, Hp, Wp)  # (B, Hp, Wp)


def cls_attention(
    attn: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int], head: int | None = None
) -> torch.Tensor:
    """How much the class token attends to each patch in one layer: (B, h, N, N) -> (B, Hp, Wp).

    Args:
        attn: one layer's attention weights, as captured by `vitkit.capture_attention`.
        num_prefix_tokens: class / distillation tokens before the patch tokens; with none, the mean attention
            each patch receives from all tokens is used.
        grid: the patch grid (Hp, Wp).
        head: one head, or None for the mean over heads.
    """
    return _query_row(_fuse_heads(attn, head), num_prefix_tokens, grid)


def attention_rollout(
    attns: list[torch.Tensor], num_prefix_tokens: int, grid: tuple[int, int], head: int | None = None
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema) of layers `attns` (first to last, each (B, h, N, N)) -> (B, Hp, Wp).

    `head` picks one head in every layer instead of the mean over heads.
    """
    if not attns:
        raise ValueError("attention rollout needs at least one layer")
    rollout = None
    for attn in attns:
        fused = _fuse_heads(attn.float(), head)  # (B, N, N)
        eye = torch.eye(fused.shape[-1], device=fused.device)
        mixed = (fused + eye) / 2  # the residual path carries the token itself
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout  # (B, N, N)
    return _query_row(rollout, num_prefix_tokens, grid)


def attention_map(
    model: nn.Module, images: torch.Tensor, layer: int = -1, head: int | None = None, rollout: bool = False
) -> torch.Tensor:
    """Run `model` on `images` (B, C, H, W) and return its attention over the patch grid (B, Hp, Wp).

    Args:
        model: a vitkit model whose attention layers all attend over one token grid of the whole image
            (`token_grid` is not None: ViT / DeiT; Swin's windows and BoTNet's shrinking maps are refused).
        layer: the attention layer (an index into the model's attention layers, negative from the end), ignored
            with `rollout`.
        head: one head, or None for the mean over heads.
        rollout: attention rollout across all layers instead of one layer's class-token attention.
    """
    tokens = require_model(model, "attention maps").token_grid(tuple(images.shape[-2:]))
    if tokens is None:
        raise ValueError(
            f"{type(model).__name__} has no token grid for attention maps: its attention layers do not all attend "
            "over the whole image on one grid (attention maps need a model such as ViT / DeiT)"
        )
    prefix, grid = tokens
    was_training = model.training
    model.eval()
    with torch.no_grad(), capture_attention(model) as maps:
        model(images)
    model.train(was_training)
    layers = list(maps.values())
    if rollout:
        return attention_rollout(layers, prefix, grid, head)
    if not -len(layers) <= layer < len(layers):
        raise ValueError(f"layer {layer} is out of range for a model with {len(layers)} attention layers")
    return cls_attention(layers[layer], prefix, grid, head)


def colorize(values: torch.Tensor, low: float | None = None, high: float | None = None) -> torch.Tensor:
    """Values (...) -> uint8 RGB (..., 3) through `COLORMAP`, `low` and `high` (default: min and max) at the ends."""
    low = values.min().item() if low is None else low
    high = values.max().item() if high is None else high
    scaled = ((values - low) / (high - low)).clamp(0, 1) if high > low else torch.zeros_like(values)
    stops = torch.tensor(COLORMAP, dtype=torch.float32)  # (S, 3)
    position = scaled.float() * (len(COLORMAP) - 1)
    lower = position.floor().long().clamp(max=len(COLORMAP) - 2)
    weight = (position - lower).unsqueeze(-1)  # (..., 1)
    rgb = stops[lower] * (1 - weight) + stops[lower + 1] * weight  # (..., 3)
    return rgb.round().to(torch.uint8)


def overlay(image: Image.Image, heat: torch.Tensor, alpha: float = 0.5) -> Image.Image:
    """`image` with the heat map (Hp, Wp) upsampled (bilinear) to its size, coloured and blended with weight `alpha`."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    W, H = image.size
    upsampled = F.interpolate(heat[None, None].float(), size=(H, W), mode="bilinear", align_corners=False)[0, 0]
    colours = Image.fromarray(colorize(upsampled).numpy())  # (H, W, 3) uint8: RGB
    return Image.blend(image.convert("RGB"), colours, alpha)


def model_view(image: Image.Image, img_size: tuple[int, int], min_side: int = 224) -> Image.Image:
    """The part of `image` a model of `img_size` sees in evaluation (shorter side resized, centre crop), drawn at
    a whole multiple of `img_size` at least `min_side` pixels high so that small inputs stay visible."""
    scale = max(1, math.ceil(min_side / min(img_size)))
    H, W = img_size[0] * scale, img_size[1] * scale
    factor = max(H / image.height, W / image.width)
    resized = image.convert("RGB").resize(
        (max(W, round(image.width * factor)), max(H, round(image.height * factor))), Image.Resampling.BICUBIC
    )
    left, top = (resized.width - W) // 2, (resized.height - H) // 2
    return resized.crop((left, top, left + W, top + H))


def attention_overlay(
    model: nn.Module,
    image: Image.Image,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    layer: int = -1,
    head: int | None = None,
    rollout: bool = False,
    alpha: float = 0.5,
) -> Image.Image:
    """`image` as `model` sees it (`model_view`) with its attention map (`attention_map`) drawn over it.

    `mean` and `std` are the normalisation statistics of the model's training data (`vitkit.data.DataInfo`).
    """
    img_size = to_2tuple(require_model(model, "attention maps").config.img_size)
    device = next(model.parameters()).device
    pixels = preprocess(image, img_size, model.config.in_chans, mean, std)[None].to(device)  # (1, C, H, W)
    heat = attention_map(model, pixels, layer, head, rollout)[0].cpu()  # (Hp, Wp)
    return overlay(model_view(image, img_size), heat, alpha)
