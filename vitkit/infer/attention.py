"""Where a vision transformer looks, as data: class-token attention of one layer, attention rollout across layers,
and one image's maps with the words that title them (`AttentionMaps`, which `vitkit.viz.attention.draw_attention`
draws; `attention_figure` does both).

Attention rollout: "Quantifying Attention Flow in Transformers", Abnar & Zuidema, arXiv:2005.00928. Each layer's
attention (heads fused) is mixed with the identity for the residual connection, A' = (A + I) / 2, rows
renormalised, and the layers are multiplied from the last to the first: R = A'_L ... A'_1.

The weights come from `vitkit.capture_attention`, so every attention backend works.
Letters: B batch, h heads, L layers, N tokens (P prefix tokens, then the Hp x Wp patch grid), K classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image
from torch import nn

from vitkit.data import preprocess
from vitkit.layers import capture_attention, to_2tuple
from vitkit.layers.helpers import counted
from vitkit.models.interface import require_model
from vitkit.models.registry import family_of
from vitkit.viz.attention import AttentionMaps, check_alpha, draw_attention, model_view, overlay

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADS_PER_ROW = 6  # `head="all"` wraps the heads of a layer into rows of at most this many maps


def _fuse_heads(attn: torch.Tensor, head: int | None) -> torch.Tensor:
    """(B, h, N, N) -> (B, N, N): one head, or the mean over heads when `head` is None."""
    if head is None:
        return attn.mean(dim=1)
    return attn[:, _check_index(head, attn.shape[1], "head", f"{attn.shape[1]} heads")]


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


def _check_index(index: int, count: int, name: str, owner: str) -> int:
    """`index` (negative from the end) of one of `count` things (`name` "head" of `owner` "4 heads") as
    0..count-1; ValueError naming the valid range otherwise."""
    if not -count <= index < count:
        valid = f"0..{count - 1}, or -{count}..-1 from the end" if count > 1 else "0 or -1"
        raise ValueError(f"{name} {index} is out of range for {owner} (valid: {valid})")
    return index % count


def _capture(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], int, tuple[int, int]]:
    """One forward pass of `model` on `images` (B, C, H, W) in evaluation mode with its attention recorded:
    (output, each attention layer's weights (B, h, N, N) from first to last, prefix tokens P, grid (Hp, Wp))."""
    tokens = require_model(model, "attention maps").token_grid(tuple(images.shape[-2:]))
    if tokens is None:
        name = family_of(model).display_name
        raise ValueError(
            f"{name} has no one map of the image to draw: its attention layers attend within windows or over feature "
            "maps that change size from layer to layer. vitkit attention draws models whose every layer attends over "
            "one grid of patches of the whole image (ViT, DeiT) and detectors' objects; for "
            f"{name}, read each layer's attention weights from Python with vitkit.capture_attention(model)"
        )
    prefix, grid = tokens
    was_training = model.training
    model.eval()
    with torch.no_grad(), capture_attention(model) as maps:
        output = model(images)
    model.train(was_training)
    return output, list(maps.values()), prefix, grid


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
    _, layers, prefix, grid = _capture(model, images)
    if rollout:
        return attention_rollout(layers, prefix, grid, head)
    _check_index(layer, len(layers), "layer", f"a model with {len(layers)} attention layers")
    return cls_attention(layers[layer], prefix, grid, head)


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
    """`image` as `model` sees it (`vitkit.viz.model_view`) with its attention map (`attention_map`) drawn over it.

    `mean` and `std` are the normalisation statistics of the model's training data (`vitkit.data.DataInfo`).
    """
    img_size = to_2tuple(require_model(model, "attention maps").config.img_size)
    device = next(model.parameters()).device
    pixels = preprocess(image, img_size, model.config.in_chans, mean, std)[None].to(device)  # (1, C, H, W)
    heat = attention_map(model, pixels, layer, head, rollout)[0].cpu()  # (Hp, Wp)
    return overlay(model_view(image, img_size), heat, alpha)


def _check_options(layer: int | None, head: int | str | None, rollout: bool, grid: bool) -> None:
    """Refuse the combinations in which an option would be ignored."""
    if isinstance(head, str) and head not in ("mean", "all"):
        raise ValueError(f"head must be an index, 'mean' or 'all', got {head!r}")
    if rollout and grid:
        raise ValueError(
            "rollout and grid do not combine: rollout is one map through all layers, a grid one map per layer and head"
        )
    if rollout and layer is not None:
        raise ValueError(f"layer {layer} does not apply to attention rollout, which runs through every layer")
    if rollout and head not in (None, "mean"):
        raise ValueError(
            f"head {head} does not apply to attention rollout, which takes the mean of the heads of every layer"
        )
    if grid and layer is not None:
        raise ValueError(f"layer {layer} does not apply to a grid, which draws every layer")
    if grid and head is not None:
        raise ValueError(f"head {head} does not apply to a grid, which draws every head of every layer")


def attention_maps(
    model: nn.Module,
    image: Image.Image,
    mean: Sequence[float],
    std: Sequence[float],
    layer: int | None = None,
    head: int | str | None = None,
    rollout: bool = False,
    grid: bool = False,
    class_names: Sequence[str] | None = None,
    name: str | None = None,
) -> AttentionMaps:
    """The attention maps of `model` on `image` (one forward pass), with the prediction and the words to title them.

    Args:
        model: a vitkit model whose attention layers attend over one token grid of the whole image (ViT / DeiT).
        image: any PIL image; it is preprocessed as in evaluation (`vitkit.data.preprocess`).
        mean, std: the normalisation the model was trained with.
        layer: one attention layer, negative from the end (default: the last); not with `rollout` or `grid`.
        head: one head index, "mean" (the default) or "all" (one map per head of the layer); with `rollout` only
            "mean", with `grid` none.
        rollout: attention rollout across all layers (heads averaged) instead of one layer.
        grid: every layer (rows) x every head (columns).
        class_names: one per class of the classifier, in label order (default: the class index).
        name: the model in the title (default: its family).
    """
    _check_options(layer, head, rollout, grid)
    config = require_model(model, "attention maps").config
    num_classes = getattr(config, "num_classes", 0)
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for a model with {num_classes} classes")
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    pixels = preprocess(image, img_size, config.in_chans, tuple(mean), tuple(std))[None].to(device)  # (1, C, H, W)
    output, layers, prefix, token_grid = _capture(model, pixels)
    layers = [attn.float().cpu() for attn in layers]  # each (1, h, N, N)
    heats, titles, columns, what = _selected_maps(layers, prefix, token_grid, layer, head, rollout, grid)
    L, h = len(layers), layers[0].shape[1]
    patch = model.config.patch_size
    grid = f"a {token_grid[0]}x{token_grid[1]} grid of {patch}-px patches"
    described = f"{family_of(model).display_name}, {counted(L, 'layer')} x {counted(h, 'head')}, {grid}"
    return AttentionMaps(
        view=model_view(image, img_size),
        heats=heats,
        titles=titles,
        columns=columns,
        model=f"{name}: {described}" if name else described,
        what=what,
        values=_values(rollout, prefix),
        prediction=_prediction(output, num_classes, class_names),
    )


def _selected_maps(
    layers: list[torch.Tensor],
    prefix: int,
    token_grid: tuple[int, int],
    layer: int | None,
    head: int | str | None,
    rollout: bool,
    grid: bool,
) -> tuple[torch.Tensor, tuple[str, ...], int, str]:
    """The maps `attention_maps`' options select from one image's layers (each (1, h, N, N)): (maps (n, Hp, Wp),
    a title per map, maps per row, the maps in words)."""
    L, h = len(layers), layers[0].shape[1]
    index = _check_index(-1 if layer is None else layer, L, "layer", f"a model with {L} attention layers")
    of_layers = f"layer {index} (of 0..{L - 1})"
    if rollout:
        heats = attention_rollout(layers, prefix, token_grid)  # (1, Hp, Wp)
        return heats, ("rollout",), 1, f"attention rollout over {L} layers, mean of {h} heads"
    if grid:
        heats = torch.cat([cls_attention(a, prefix, token_grid, j) for a in layers for j in range(h)])  # (L h, Hp, Wp)
        titles = tuple(f"layer {i}, head {j}" for i in range(L) for j in range(h))
        return heats, titles, h, "every layer (rows) and head (columns)"
    if head == "all":
        heats = torch.cat([cls_attention(layers[index], prefix, token_grid, j) for j in range(h)])  # (h, Hp, Wp)
        columns = math.ceil(h / math.ceil(h / HEADS_PER_ROW))  # rows of at most HEADS_PER_ROW, evenly filled
        return heats, tuple(f"head {j}" for j in range(h)), columns, f"{of_layers}, each of {h} heads"
    one = None if head in (None, "mean") else _check_index(int(head), h, "head", f"{h} heads")
    heats = cls_attention(layers[index], prefix, token_grid, one)  # (1, Hp, Wp)
    which = f"mean of {h} heads" if one is None else f"head {one} of {h}"
    return heats, (which,), 1, f"{of_layers}, {which}"


def _values(rollout: bool, prefix: int) -> str:
    """What a map's values are, for the colour bar."""
    if rollout:
        return "rollout: share of the class token's attention" if prefix else "rollout: mean share of each patch"
    return "attention of the class token" if prefix else "mean attention each patch receives"


def _prediction(output: torch.Tensor, num_classes: int, class_names: Sequence[str] | None) -> tuple[str, float] | None:
    """(class, probability) of a classifier's output (1, K); None for a model without classes."""
    if num_classes <= 0:
        return None
    probabilities = output.float().softmax(dim=-1)[0].cpu()  # (K,)
    k = int(probabilities.argmax())
    return class_names[k] if class_names is not None else str(k), float(probabilities[k])


def attention_figure(
    model: nn.Module,
    image: Image.Image,
    mean: Sequence[float],
    std: Sequence[float],
    layer: int | None = None,
    head: int | str | None = None,
    rollout: bool = False,
    grid: bool = False,
    class_names: Sequence[str] | None = None,
    name: str | None = None,
    alpha: float = 0.5,
) -> tuple[Figure, AttentionMaps]:
    """`draw_attention(attention_maps(...), alpha)`: (the figure, the maps it shows). Arguments as for
    `attention_maps`; save the figure with `vitkit.viz.attention.save_picture` (or its `savefig`)."""
    check_alpha(alpha)
    maps = attention_maps(model, image, mean, std, layer, head, rollout, grid, class_names, name)
    return draw_attention(maps, alpha), maps
