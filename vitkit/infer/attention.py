"""Where a vision transformer looks, as data: class-token attention of one layer, attention rollout across layers,
the attention the maps leave out (to the tokens before the patches: class, distillation, registers), and one image's
maps with the words that title them (`AttentionMaps`, which `vitkit.viz.attention.draw_attention` draws;
`attention_figure` does both).

Attention rollout: "Quantifying Attention Flow in Transformers", Abnar & Zuidema, arXiv:2005.00928. Each layer's
attention (heads fused) is mixed with the identity for the residual connection, A' = (A + I) / 2, rows
renormalised, and the layers are multiplied from the last to the first: R = A'_L ... A'_1. It runs over every
token, registers included; the map is then read from R as from one layer.

Registers: "Vision Transformers Need Registers", Darcet et al., arXiv:2309.16588. Without them, a few high-norm
"artifact" patches soak up the class token's attention; with them, the registers take it. The maps cover the patches
only; for a model with registers, what goes to each prefix token is given beside them (`prefix_attention`).

The weights come from `vitkit.capture_attention`, so every attention backend works.
Letters: B batch, h heads, L layers, N tokens (P prefix tokens, then the Hp x Wp patch grid), K classes, n maps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from PIL import Image
from torch import nn

from vitkit.data import Framing, preprocess
from vitkit.layers import capture_attention, to_2tuple
from vitkit.models.interface import require_model
from vitkit.models.registry import family_of
from vitkit.util import counted
from vitkit.viz.attention import AttentionMaps, PrefixShares, check_alpha, draw_attention, model_view, overlay
from vitkit.weights import model_info

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADS_PER_ROW = 6  # `head="all"` wraps the heads of a layer into rows of at most this many maps


def framing_of(model: nn.Module) -> Framing:
    """How `model` frames an image (`vitkit.data.Framing`): as its weights' publishers evaluated them, where it was
    loaded with what they said (`model_info`), else vitkit's default."""
    return model_info(model).framing()


def _fuse_heads(attn: torch.Tensor, head: int | None) -> torch.Tensor:
    """(B, h, N, N) -> (B, N, N): one head, or the mean over heads when `head` is None."""
    if head is None:
        return attn.mean(dim=1)
    return attn[:, _check_index(head, attn.shape[1], "head", f"{attn.shape[1]} heads")]


def _query_row(attn: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int], class_token: bool) -> torch.Tensor:
    """(B, N, N) -> (B, N): the row the maps read, the class token's (token 0), or without one the mean row (the mean
    attention each token receives from all tokens)."""
    N = attn.shape[-1]
    Hp, Wp = grid
    if N != num_prefix_tokens + Hp * Wp:
        raise ValueError(
            f"attention over {N} tokens does not match {num_prefix_tokens} prefix tokens and a {Hp}x{Wp} grid "
            "(attention maps need a model whose layers attend over the whole image, such as ViT / DeiT)"
        )
    return attn[:, 0] if class_token and num_prefix_tokens > 0 else attn.mean(dim=1)


def _patches(row: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
    """A row (B, N) over the patch tokens, as the grid (B, Hp, Wp): the prefix tokens left out."""
    return row[:, num_prefix_tokens:].reshape(row.shape[0], *grid)  # (B, Hp, Wp)


def cls_attention(
    attn: torch.Tensor,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    head: int | None = None,
    class_token: bool = True,
) -> torch.Tensor:
    """How much the class token attends to each patch in one layer: (B, h, N, N) -> (B, Hp, Wp).

    Args:
        attn: one layer's attention weights, as captured by `vitkit.capture_attention`.
        num_prefix_tokens: the tokens before the patch tokens (class, distillation, registers); their columns are
            left out of the map (`prefix_attention` gives them).
        grid: the patch grid (Hp, Wp).
        head: one head, or None for the mean over heads.
        class_token: whether the first prefix token is a class token; without one (or without prefix tokens), the
            mean attention each patch receives from all tokens is used.
    """
    row = _query_row(_fuse_heads(attn, head), num_prefix_tokens, grid, class_token)  # (B, N)
    return _patches(row, num_prefix_tokens, grid)


def prefix_attention(
    attn: torch.Tensor,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    head: int | None = None,
    class_token: bool = True,
    from_patches: bool = False,
) -> torch.Tensor:
    """The attention to each prefix token (class, distillation, registers), which the maps leave out, in one layer:
    (B, h, N, N) -> (B, P).

    By default that of `cls_attention`'s query (the class token, or without one the mean over all tokens), so that
    this and the map together hold its whole attention (they sum to 1). With `from_patches`, the mean over the patch
    tokens' queries instead: how much the patches read from each register ("Vision Transformers Need Registers").
    Arguments as for `cls_attention`.
    """
    fused = _fuse_heads(attn, head)  # (B, N, N)
    row = _query_row(fused, num_prefix_tokens, grid, class_token)  # (B, N); checks N against the grid
    if from_patches:
        return fused[:, num_prefix_tokens:, :num_prefix_tokens].mean(dim=1)  # (B, P)
    return row[:, :num_prefix_tokens]  # (B, P)


def rollouts(attns: list[torch.Tensor], head: int | None) -> Iterator[torch.Tensor]:
    """Attention rollout of layers `attns` (first to last, each (B, h, N, N)) over every token through each layer in
    turn: the first layer's, the first two's, ..., each (B, N, N)."""
    rollout = None
    for attn in attns:
        fused = _fuse_heads(attn.float(), head)  # (B, N, N)
        eye = torch.eye(fused.shape[-1], device=fused.device)
        mixed = (fused + eye) / 2  # the residual path carries the token itself
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout  # (B, N, N)
        yield rollout


def rollout_matrix(attns: list[torch.Tensor], head: int | None) -> torch.Tensor:
    """Attention rollout of layers `attns` (first to last, each (B, h, N, N)) over every token: (B, N, N)."""
    if not attns:
        raise ValueError("attention rollout needs at least one layer")
    *_, rollout = rollouts(attns, head)
    return rollout


def attention_rollout(
    attns: list[torch.Tensor],
    num_prefix_tokens: int,
    grid: tuple[int, int],
    head: int | None = None,
    class_token: bool = True,
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema) of layers `attns` (first to last, each (B, h, N, N)) -> (B, Hp, Wp).

    The rollout runs over every token (registers included); the map is then its class token's row over the patches
    (without a class token, the mean row). `head` picks one head in every layer instead of the mean over heads.
    """
    row = _query_row(rollout_matrix(attns, head), num_prefix_tokens, grid, class_token)  # (B, N)
    return _patches(row, num_prefix_tokens, grid)


def prefix_token_names(model: nn.Module) -> tuple[str, ...]:
    """What each token before the patch grid of `model` is, in token order: "class", "distillation", "register 0",
    ..., "register R-1" (a ViT's order); empty for a model without one token grid (Swin, BoTNet, detectors).

    A model declares them (`prefix_token_names()`, as the ViT family does); one that does not gets them named by
    position ("prefix 0", ...), none taken for a class token.
    """
    config = require_model(model, "attention maps").config
    tokens = model.token_grid(to_2tuple(config.img_size))
    if tokens is None:
        return ()
    count = tokens[0]
    declared = getattr(model, "prefix_token_names", None)
    if callable(declared):
        names = tuple(declared())
        assert len(names) == count, f"{len(names)} prefix token names {names} for {count} prefix tokens"
        return names
    return tuple(f"prefix {i}" for i in range(count))


def _check_index(index: int, count: int, name: str, owner: str) -> int:
    """`index` (negative from the end) of one of `count` things (`name` "head" of `owner` "4 heads") as
    0..count-1; ValueError naming the valid range otherwise."""
    if not -count <= index < count:
        valid = f"0..{count - 1}, or -{count}..-1 from the end" if count > 1 else "0 or -1"
        raise ValueError(f"{name} {index} is out of range for {owner} (valid: {valid})")
    return index % count


def no_token_grid_message(model: nn.Module) -> str:
    """Why `model`'s attention is no one map over the image (`token_grid` None), in the words its family gives
    (`attention_layout()`), and what draws it instead: `vitkit explore`, for a model that lays its attention on the
    image (`spatial_attention`), else `vitkit.capture_attention`."""
    name = family_of(model).display_name
    layout = getattr(model, "attention_layout", None)
    why = layout() if callable(layout) else "its attention layers do not all attend over one grid of the image"
    if callable(getattr(model, "spatial_attention", None)):
        instead = (
            f"vitkit explore draws {name}'s attention layer by layer, each on the map it attends over (vitkit explore "
            "--model-dir DIR IMAGE --out page.html)"
        )
    else:
        instead = f"for {name}, read each layer's attention weights from Python with vitkit.capture_attention(model)"
    return (
        f"{name} has no one map of the image to draw: {why}. vitkit attention draws models whose every layer attends "
        f"over one grid of patches of the whole image (ViT, DeiT) and detectors' objects; {instead}"
    )


def capture_layers(
    model: nn.Module, images: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor], tuple[str, ...], tuple[int, int]]:
    """One forward pass of `model` on `images` (B, C, H, W) in evaluation mode with its attention recorded:
    (output, each self-attention layer's weights (B, h, N, N) from first to last, the names of the P prefix tokens
    (`prefix_token_names`), grid (Hp, Wp)). An attention pool's weights (SigLIP's MAP: one probe query over the
    tokens, (B, h, 1, N)) are no layer of the maps and are left out."""
    tokens = require_model(model, "attention maps").token_grid(tuple(images.shape[-2:]))
    if tokens is None:
        raise ValueError(no_token_grid_message(model))
    _, grid = tokens
    names = prefix_token_names(model)
    was_training = model.training
    model.eval()
    with torch.no_grad(), capture_attention(model) as maps:
        output = model(images)
    model.train(was_training)
    layers = [w for w in maps.values() if w.shape[-2] == w.shape[-1]]  # every token's row: self-attention
    return output, layers, names, grid


def _has_class_token(names: tuple[str, ...]) -> bool:
    """Whether the prefix tokens `names` start with a class token, whose row the maps read."""
    return names[:1] == ("class",)


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

    The map is the class token's attention to the patches (without a class token, the mean attention each patch
    receives); the prefix tokens (class, distillation, registers) are left out of it.
    """
    _, layers, names, grid = capture_layers(model, images)
    class_token = _has_class_token(names)
    if rollout:
        return attention_rollout(layers, len(names), grid, head, class_token)
    _check_index(layer, len(layers), "layer", f"a model with {len(layers)} attention layers")
    return cls_attention(layers[layer], len(names), grid, head, class_token)


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

    `mean` and `std` are the normalisation statistics of the model's training data (`vitkit.infer.inference_info`).
    """
    img_size = to_2tuple(require_model(model, "attention maps").config.img_size)
    device = next(model.parameters()).device
    framing, channels = framing_of(model), model.config.in_chans
    pixels = preprocess(image, img_size, channels, mean, std, framing)[None].to(device)  # (1, C, H, W)
    heat = attention_map(model, pixels, layer, head, rollout)[0].cpu()  # (Hp, Wp)
    return overlay(model_view(image, img_size, channels=channels, framing=framing), heat, alpha)


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
    For a model with registers, `prefix` holds each map's attention to the tokens before the patches (the class
    token's to itself and to each register, and the patches' mean), which the maps leave out.

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
    framing = framing_of(model)
    pixels = preprocess(image, img_size, config.in_chans, tuple(mean), tuple(std), framing)[None].to(device)
    output, layers, names, token_grid = capture_layers(model, pixels)
    layers = [attn.float().cpu() for attn in layers]  # each (1, h, N, N)
    fused, titles, columns, what = _selected_maps(layers, layer, head, rollout, grid)
    P, class_token = len(names), _has_class_token(names)
    rows = torch.cat([_query_row(m, P, token_grid, class_token) for m in fused])  # (n, N)
    L, h = len(layers), layers[0].shape[1]
    patch = model.config.patch_size
    grid = f"a {token_grid[0]}x{token_grid[1]} grid of {patch}-px patches"
    described = f"{family_of(model).display_name}, {counted(L, 'layer')} x {counted(h, 'head')}, {grid}"
    return AttentionMaps(
        view=model_view(image, img_size, channels=config.in_chans, framing=framing),
        heats=_patches(rows, P, token_grid),  # (n, Hp, Wp)
        titles=titles,
        columns=columns,
        model=f"{name}: {described}" if name else described,
        what=what,
        values=_values(rollout, class_token),
        prediction=_prediction(output, num_classes, class_names),
        prefix=_prefix_shares(names, rows, fused, class_token),
    )


def _selected_maps(
    layers: list[torch.Tensor], layer: int | None, head: int | str | None, rollout: bool, grid: bool
) -> tuple[list[torch.Tensor], tuple[str, ...], int, str]:
    """The maps `attention_maps`' options select from one image's layers (each (1, h, N, N)), each as the attention
    over all tokens it is read from (1, N, N) (one head, the heads' mean or the rollout): (those, a title per map,
    maps per row, the maps in words)."""
    L, h = len(layers), layers[0].shape[1]
    index = _check_index(-1 if layer is None else layer, L, "layer", f"a model with {L} attention layers")
    of_layers = f"layer {index} (of 0..{L - 1})"
    if rollout:
        return [rollout_matrix(layers, None)], ("rollout",), 1, f"attention rollout over {L} layers, mean of {h} heads"
    if grid:
        fused = [_fuse_heads(a, j) for a in layers for j in range(h)]  # L h of (1, N, N)
        titles = tuple(f"layer {i}, head {j}" for i in range(L) for j in range(h))
        return fused, titles, h, "every layer (rows) and head (columns)"
    if head == "all":
        fused = [_fuse_heads(layers[index], j) for j in range(h)]  # h of (1, N, N)
        columns = math.ceil(h / math.ceil(h / HEADS_PER_ROW))  # rows of at most HEADS_PER_ROW, evenly filled
        return fused, tuple(f"head {j}" for j in range(h)), columns, f"{of_layers}, each of {h} heads"
    one = None if head in (None, "mean") else _check_index(int(head), h, "head", f"{h} heads")
    which = f"mean of {h} heads" if one is None else f"head {one} of {h}"
    return [_fuse_heads(layers[index], one)], (which,), 1, f"{of_layers}, {which}"


def _prefix_shares(
    names: tuple[str, ...], rows: torch.Tensor, fused: list[torch.Tensor], class_token: bool
) -> PrefixShares | None:
    """What the maps leave out, for a model with registers: each map's row `rows` (n, N) over the P prefix tokens
    `names`, and the patches' mean attention to them in each map's attention `fused` (each (1, N, N)); None for a
    model without registers, whose figure shows the maps alone."""
    registers = sum(n.startswith("register ") for n in names)
    if not registers:
        return None
    P = len(names)
    from_patches = torch.cat([m[:, P:, :P].mean(dim=1) for m in fused])  # (n, P)
    others = [n for n in names if not n.startswith("register ")]
    itself = ["itself" if n == "class" and class_token else f"the {n} token" for n in others]
    query = "class token" if class_token else "all tokens"
    whose = "the class token" if class_token else "all tokens (mean)"
    caption = (
        f"under each map: the attention of {whose} to the {counted(registers, 'register')} (their sum, then each)"
        + (f" and to {' and '.join(itself)}" if itself else "")
        + "; the map holds the rest"
    )
    return PrefixShares(names, query, rows[:, :P], from_patches, caption)


def _values(rollout: bool, class_token: bool) -> str:
    """What a map's values are, for the colour bar."""
    if rollout:
        return "rollout: share of the class token's attention" if class_token else "rollout: mean share of each patch"
    return "attention of the class token" if class_token else "mean attention each patch receives"


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


def prefix_table(maps: AttentionMaps) -> list[str]:
    """`maps.prefix` as the lines of a table, two rows per map: the attention of the maps' query (the class token,
    or the mean over all tokens) to each prefix token and to all registers together (the map holds the rest), and
    the mean over the patch tokens of theirs; no lines when `maps.prefix` is None."""
    if maps.prefix is None:
        return []
    names = maps.prefix.names
    registers = [k for k, n in enumerate(names) if n.startswith("register ")]
    header = ["map", "from", *names, "registers"]
    rows = []
    for title, shares, from_patches in zip(maps.titles, maps.prefix.shares, maps.prefix.from_patches, strict=True):
        for who, values in ((maps.prefix.query, shares), ("patches (mean)", from_patches)):
            numbers = [*values.tolist(), float(values[registers].sum())]
            rows.append([title, who, *(f"{v:.4f}" for v in numbers)])
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    query = "the class token" if maps.prefix.query == "class token" else "all tokens (mean)"
    lines = [
        f"attention to the tokens before the patches, per map: from {query}, whose attention to the patches the map "
        "shows, and from the patches (mean over them)"
    ]
    for row in [header, *rows]:
        cells = [
            f"{text:<{w}}" if c < 2 else f"{text:>{w}}" for c, (text, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines
