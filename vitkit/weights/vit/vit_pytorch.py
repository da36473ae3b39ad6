"""lucidrains' vit-pytorch `ViT` and `SimpleViT` <-> vitkit's ViT.

Their files carry no config: the model is built from the state dict's shapes and the fields the shapes do not say
(the number of heads; for SimpleViT, whose position table is computed, the image size): `config_from_vit_pytorch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vitkit.layers import big_vision_sincos_2d, to_2tuple
from vitkit.models.vit import ViTConfig
from vitkit.weights.errors import FieldsNeeded
from vitkit.weights.rename import Layout, rename
from vitkit.weights.shapes import count
from vitkit.weights.vit.shared import PLAIN, grid_img_size, read_assuming, require

_VP_LAYER = "transformer.layers.{i}"
_VP_COMMON = (
    rename("cls_token", "cls_token", values=(lambda t: t.reshape(1, 1, -1), lambda t: t.reshape(1, -1))),  # (1, D)
    rename("pos_embed", "pos_embedding", values=(lambda t: t.reshape(1, -1, t.shape[-1]), lambda t: t.squeeze(0))),
    # Sequential(Rearrange, LayerNorm(p p C), Linear(p p C, D), LayerNorm(D)): see VitPytorchLayout for the order
    rename("patch_embed.pixel_norm", "to_patch_embedding.1"),
    rename("patch_embed.proj", "to_patch_embedding.2"),
    rename("patch_embed.norm", "to_patch_embedding.3"),
    rename("blocks.{i}.norm1", f"{_VP_LAYER}.0.norm"),  # Attention's own pre-norm
    rename("blocks.{i}.attn.qkv", f"{_VP_LAYER}.0.to_qkv"),  # (3 h d, D), rows q | k | v, each (h d): timm's order
    rename("blocks.{i}.norm2", f"{_VP_LAYER}.1.net.0"),  # FeedForward's own pre-norm
    rename("blocks.{i}.mlp.fc1", f"{_VP_LAYER}.1.net.1"),
    rename("norm", "transformer.norm"),
)
_VP_VIT = (  # ViT: to_out = Sequential(Linear, Dropout); net = LayerNorm, Linear, GELU, Dropout, Linear, Dropout
    rename("blocks.{i}.attn.proj", f"{_VP_LAYER}.0.to_out.0"),
    rename("blocks.{i}.mlp.fc2", f"{_VP_LAYER}.1.net.4"),
    rename("head", "mlp_head"),
)
_VP_SIMPLE = (  # SimpleViT: to_out = Linear without bias; net = LayerNorm, Linear, GELU, Linear
    rename("blocks.{i}.attn.proj", f"{_VP_LAYER}.0.to_out"),
    rename("blocks.{i}.mlp.fc2", f"{_VP_LAYER}.1.net.3"),
    rename("head", "linear_head"),
)


def _patch_shape(config: ViTConfig | None, pixels: int) -> tuple[int, int]:
    """(C, p) of a vit-pytorch patch of `pixels` = p * p * C values: the config's, else 3 channels."""
    channels = config.in_chans if config is not None else 3
    side = round((pixels / channels) ** 0.5)
    if side * side * channels != pixels:
        raise ValueError(f"a patch of {pixels} values is not p x p x {channels} channels; set in_chans")
    return channels, side


class VitPytorchLayout(Layout):
    """vit-pytorch's `ViT` and `SimpleViT` (lucidrains/vit-pytorch): their patches are flattened in (p1 p2 c) order,
    vitkit's convolution weight and pixel norm in (c p1 p2) order; the values are permuted between them. Export
    writes SimpleViT's names for a model with its fixed big_vision table, ViT's otherwise."""

    def to_vitkit(
        self, state: dict[str, torch.Tensor], config: Any = None
    ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
        out, dropped, unmatched = super().to_vitkit(state, config)
        weight = out.get("patch_embed.proj.weight")
        if weight is not None and weight.ndim == 2:  # (D, p p C) -> (D, C, p, p)
            C, p = _patch_shape(config, weight.shape[1])
            out["patch_embed.proj.weight"] = weight.reshape(-1, p, p, C).permute(0, 3, 1, 2).contiguous()
            for part in ("weight", "bias"):
                if (t := out.get(f"patch_embed.pixel_norm.{part}")) is not None and t.numel() == p * p * C:
                    out[f"patch_embed.pixel_norm.{part}"] = t.reshape(p, p, C).permute(2, 0, 1).reshape(-1)
        if "cls_token" in out and out["cls_token"].numel() == 0:  # ViT(pool="mean") keeps an empty (0, D) token
            del out["cls_token"]
            dropped.append("cls_token")
        if "pos_embed" not in out and config is not None and config.pos_embed == "sincos_big_vision":
            grid = (
                to_2tuple(config.img_size)[0] // config.patch_size,
                to_2tuple(config.img_size)[1] // config.patch_size,
            )
            out["pos_embed"] = big_vision_sincos_2d(config.embed_dim, grid)  # SimpleViT computes its table
        return out, dropped, unmatched

    def from_vitkit(self, state: dict[str, torch.Tensor], config: Any = None) -> dict[str, torch.Tensor]:
        state = dict(state)
        weight = state["patch_embed.proj.weight"]  # (D, C, p, p) -> (D, p p C)
        D, C, p, _ = weight.shape
        state["patch_embed.proj.weight"] = weight.permute(0, 2, 3, 1).reshape(D, -1)
        for part in ("weight", "bias"):
            state[f"patch_embed.pixel_norm.{part}"] = state[f"patch_embed.pixel_norm.{part}"].reshape(C, p, p)
            state[f"patch_embed.pixel_norm.{part}"] = state[f"patch_embed.pixel_norm.{part}"].permute(1, 2, 0).flatten()
        simple = config is not None and config.pos_embed == "sincos_big_vision"
        layout = VITPYTORCH_SIMPLE if simple else VITPYTORCH_VIT
        out = Layout.from_vitkit(layout, {k: v for k, v in state.items() if k != "pos_embed" or not simple}, config)
        if config is not None and not config.class_token and not simple:
            out["cls_token"] = state["pos_embed"].new_zeros(0, config.embed_dim)  # ViT(pool="mean")'s empty token
        return out


def check_vit_pytorch_export(config: ViTConfig) -> None:
    """ValueError for ViT configurations vit-pytorch's ViT / SimpleViT cannot express."""
    common = dict(PLAIN, patch_norm=True, qkv_bias=False, layer_norm_eps=1e-5, distilled=False, init_values=None)
    common["head_dim"] = config.head_dim  # their dim_head takes any width
    if config.pos_embed == "sincos_big_vision":
        simple = dict(class_token=False, global_pool="avg", fc_norm=False, proj_bias=False, pos_embed=config.pos_embed)
        require(config, "vit-pytorch's SimpleViT", **{**common, **simple})
        if config.num_classes == 0:
            raise ValueError("vit-pytorch's SimpleViT needs a classifier (num_classes > 0)")
        return
    pool = dict(global_pool="token", fc_norm=None) if config.class_token else dict(global_pool="avg", fc_norm=False)
    require(config, "vit-pytorch's ViT", **{**common, **pool})


VITPYTORCH = VitPytorchLayout(
    format="vit-pytorch",
    family="vit",
    rules=_VP_COMMON + _VP_VIT + _VP_SIMPLE,
    markers=("to_patch_embedding.2.weight", "transformer.norm.weight"),
    check_export=check_vit_pytorch_export,
    read_config=lambda state, fields: read_assuming(config_from_vit_pytorch, state, fields),
)
VITPYTORCH_VIT = Layout(format="vit-pytorch", family="vit", rules=_VP_COMMON + _VP_VIT, markers=VITPYTORCH.markers)
VITPYTORCH_SIMPLE = Layout(
    format="vit-pytorch", family="vit", rules=_VP_COMMON + _VP_SIMPLE, markers=VITPYTORCH.markers
)


def config_from_vit_pytorch(
    state: Mapping[str, torch.Tensor], assumed: list[str] | None = None, **fields: Any
) -> ViTConfig:
    """The vitkit ViT equal to the vit-pytorch `ViT` / `SimpleViT` whose state dict is `state`.

    Their state dicts hold every size but the number of heads (pass `num_heads`; the head width follows from the
    qkv rows) and, for SimpleViT, whose table is computed, the image size (pass `img_size`). `fields` may also set
    `in_chans` (3) and any other ViTConfig field. A `ViT`'s image size is read from its position table: a square
    grid unless `fields` gives `img_size` (the table's rows do not say the grid's shape), and that assumption is
    appended to `assumed`; a table of rows that are no square number needs `img_size`.
    """
    if "num_heads" not in fields:
        raise FieldsNeeded("a vit-pytorch state dict does not say its number of heads", {"num_heads": "H"})
    weight, qkv = state["to_patch_embedding.2.weight"], state["transformer.layers.0.0.to_qkv.weight"]
    D, heads = weight.shape[0], fields["num_heads"]
    C, p = _patch_shape(ViTConfig(in_chans=fields.get("in_chans", 3)), weight.shape[1])
    inner = qkv.shape[0] // 3
    if inner % heads:
        raise ValueError(f"the heads' total width {inner} (qkv rows / 3) is not divisible by num_heads {heads}")
    cls = state.get("cls_token")
    class_token = cls is not None and cls.numel() > 0
    pos = state.get("pos_embedding")
    if pos is None and "img_size" not in fields:
        raise FieldsNeeded(
            "a SimpleViT state dict has no position table to read the image size from", {"img_size": "(H, W)"}
        )
    if pos is not None:
        grid_img_size(pos.reshape(-1, D).shape[0] - class_token, p, fields, "vit-pytorch", assumed)
    head = state.get("mlp_head.weight", state.get("linear_head.weight"))
    simple = pos is None
    layer0 = "transformer.layers.0"
    built = dict(
        patch_size=p,
        in_chans=C,
        num_classes=0 if head is None else head.shape[0],
        embed_dim=D,
        depth=count(state, r"transformer\.layers\.(\d+)\."),
        mlp_ratio=state[f"{layer0}.1.net.1.weight"].shape[0] / D,
        qkv_bias=False,
        class_token=class_token,
        global_pool="token" if class_token else "avg",
        fc_norm=None if class_token else False,
        pos_embed="sincos_big_vision" if simple else "learn",
        layer_norm_eps=1e-5,
        patch_norm=True,
        head_dim=None if inner == D else inner // heads,
        proj_bias=f"{layer0}.0.to_out.0.bias" in state or f"{layer0}.0.to_out.bias" in state,
    )
    return ViTConfig(**{**built, **fields})
