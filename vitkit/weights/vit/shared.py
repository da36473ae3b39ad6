"""What several of the ViT's source formats share: the fields of the ViT of the ViT paper (`PLAIN`) and the check
that a config has them (`require`), the fused qkv built from separate q, k, v Linears (`attention_rules`), and the
reading of an image size from a position table for formats whose files carry no config (`grid_img_size`,
`read_assuming`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from vitkit.layers import to_2tuple
from vitkit.models.vit import ViTConfig
from vitkit.weights.errors import FieldsNeeded
from vitkit.weights.rename import Rename, rename

# The fields of the ViT of the ViT paper, which torchvision's and transformers' ViT / DeiT classes build.
PLAIN = dict(
    pre_norm=False,
    patch_bias=True,
    patch_norm=False,
    act="gelu",
    head_dim=None,
    proj_bias=True,
    reg_tokens=0,
    no_embed_class=False,
    pos_embed="learn",
    fc_norm=None,
    final_norm=True,
    window_size=0,
    global_blocks=(),
    rel_pos=False,
)


def require(config: ViTConfig, library: str, **wanted: Any) -> None:
    """ValueError, naming every field that differs, unless `config` has the `wanted` field values: what `library`'s
    model can express."""
    problems = [
        f"{name}={value!r} (this model: {getattr(config, name)!r})"
        for name, value in wanted.items()
        if getattr(config, name) != value
    ]
    if problems:
        raise ValueError(f"{library} needs " + ", ".join(problems))


def square_size(config: ViTConfig, library: str) -> int:
    """The side of the model's square images; ValueError for `library`, which takes square images only."""
    if not isinstance(config.img_size, int):
        raise ValueError(f"{library} needs square images (this model: {config.img_size[0]}x{config.img_size[1]})")
    return config.img_size


def attention_rules(module: str, q: str, k: str, v: str, out: str) -> tuple[Rename, Rename]:
    """A block's attention from the separate q, k, v Linears (D, D) each of `module`, concatenated along dim 0 into
    the fused qkv (3D, D), rows q, k, v, the order vitkit's reshape (B, N, 3, h, d) reads them in (biases (D,) each
    -> (3D,)); and its output projection `out`."""
    qkv = rename("blocks.{i}.attn.qkv", f"{module}.{q}", f"{module}.{k}", f"{module}.{v}")
    return qkv, rename("blocks.{i}.attn.proj", f"{module}.{out}")


def grid_img_size(rows: int, patch: int, fields: dict[str, Any], library: str, assumed: list[str] | None) -> None:
    """Set `fields["img_size"]` for a position table of `rows` patch rows (the prefix rows left out) of `patch`-pixel
    patches. An image size the caller gave is checked against the rows; else the grid must be square, and what that
    assumes is appended to `assumed` (the table does not say whether 16 rows are a 4x4 grid or a 2x8 one)."""
    if "img_size" in fields:
        h, w = to_2tuple(fields["img_size"])
        if h % patch or w % patch or (h // patch) * (w // patch) != rows:
            raise ValueError(
                f"img_size {h}x{w} is a {h / patch:g}x{w / patch:g} grid of {patch}-pixel patches, but the {library} "
                f"position table has {rows} patch rows"
            )
        return
    side = math.isqrt(rows)
    if side * side != rows:
        raise FieldsNeeded(
            f"the {library} position table has {rows} patch rows of {patch}-pixel patches, not a square grid, so "
            "it does not say the image size the model was built for",
            {"img_size": "(H, W)"},
        )
    fields["img_size"] = side * patch
    if assumed is not None:
        assumed.append(
            f"img_size {side * patch}: a square {side}x{side} grid from the position table's {rows} patch rows (give "
            "img_size for a model built for other images)"
        )


def read_assuming(
    read: Callable[..., ViTConfig], state: Mapping[str, torch.Tensor], fields: dict[str, Any]
) -> tuple[ViTConfig, list[str]]:
    """A `Layout.read_config` result: the config `read` builds, and what it assumed that the shapes did not say."""
    assumed: list[str] = []
    return read(state, assumed=assumed, **fields), assumed
