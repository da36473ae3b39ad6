"""BR-IDL/PaddleViT's ViT and DeiT <-> vitkit's ViT.

Their `paddle.save` files (.pdparams, read by `vitkit.weights.pdparams` without Paddle) carry no config: the model
is built from the state dict's shapes and the number of heads (`config_from_paddlevit`). Paddle's Linear weights
are [in, out], torch's (out, in): they are transposed both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vitkit.models.vit import ViTConfig
from vitkit.weights.errors import FieldsNeeded
from vitkit.weights.rename import Layout, Rename, rename
from vitkit.weights.shapes import count
from vitkit.weights.vit.shared import PLAIN, grid_img_size, read_assuming, require, square_size

_PD_LAYER = "encoder.layers.{i}"
_T = (lambda t: t.t(), lambda t: t.t())  # Paddle's Linear weight is [in, out], torch's (out, in)


def _linear(ours: str, theirs: str) -> tuple[Rename, Rename]:
    """A Linear layer's two rules: the weight transposed, the bias as it is."""
    return rename(f"{ours}.weight", f"{theirs}.weight", values=_T), rename(f"{ours}.bias", f"{theirs}.bias")


def check_paddlevit_export(config: ViTConfig) -> None:
    """ValueError for ViT configurations PaddleViT's ViT / DeiT cannot express (its image_size is one side)."""
    library = "PaddleViT's ViT / DeiT"
    wanted = dict(PLAIN, class_token=True, global_pool="token", init_values=None, qkv_bias=True, layer_norm_eps=1e-6)
    require(config, library, **wanted)
    square_size(config, library)


PADDLEVIT = Layout(
    format="paddlevit",
    family="vit",
    rules=(
        # BR-IDL/PaddleViT's ViT (`VisionTransformer`) and DeiT (`Deit`, distilled), as its paddle.save files hold
        # them (.pdparams, read by vitkit.weights.pdparams without Paddle); a non-distilled DeiT is their ViT class
        rename("cls_token", "cls_token"),
        rename("dist_token", "dist_token"),
        rename("pos_embed", "position_embedding"),  # (1, P + N, D), prefix rows first
        rename("patch_embed.proj", "patch_embedding.patch_embedding"),  # Conv2D [D, C, p, p] as torch's
        rename("blocks.{i}.norm1", f"{_PD_LAYER}.attn_norm"),
        *_linear("blocks.{i}.attn.qkv", f"{_PD_LAYER}.attn.qkv"),  # [D, 3D]: columns q | k | v, each (h, d)
        *_linear("blocks.{i}.attn.proj", f"{_PD_LAYER}.attn.out"),
        rename("blocks.{i}.norm2", f"{_PD_LAYER}.mlp_norm"),
        *_linear("blocks.{i}.mlp.fc1", f"{_PD_LAYER}.mlp.fc1"),
        *_linear("blocks.{i}.mlp.fc2", f"{_PD_LAYER}.mlp.fc2"),
        rename("norm", "encoder.encoder_norm"),
        *_linear("head", "classifier"),
        *_linear("head_dist", "classifier_dist"),
    ),
    markers=("patch_embedding.patch_embedding.weight", "encoder.encoder_norm.weight"),
    check_export=check_paddlevit_export,
    read_config=lambda state, fields: read_assuming(config_from_paddlevit, state, fields),
)


def config_from_paddlevit(
    state: Mapping[str, torch.Tensor], assumed: list[str] | None = None, **fields: Any
) -> ViTConfig:
    """The vitkit ViT / DeiT equal to the PaddleViT model whose state dict is `state` (Paddle's names): every size
    but the number of heads, which `fields` gives (`num_heads`), with any other ViTConfig field. The image size is
    the square grid of the position table (PaddleViT's models take square images) unless `fields` gives one; that
    assumption is appended to `assumed`."""
    if "num_heads" not in fields:
        raise FieldsNeeded("a PaddleViT state dict does not say its number of heads", {"num_heads": "H"})
    conv, pos = state["patch_embedding.patch_embedding.weight"], state["position_embedding"]
    D, C, p, _ = conv.shape
    distilled = "dist_token" in state
    grid_img_size(pos.shape[1] - 1 - distilled, p, fields, "PaddleViT", assumed)
    head = state.get("classifier.weight")
    built = dict(
        patch_size=p,
        in_chans=C,
        num_classes=0 if head is None else head.shape[1],  # [D, K]
        embed_dim=D,
        depth=count(state, r"encoder\.layers\.(\d+)\."),
        mlp_ratio=state["encoder.layers.0.mlp.fc1.weight"].shape[1] / D,
        qkv_bias="encoder.layers.0.attn.qkv.bias" in state,
        distilled=distilled,
    )
    return ViTConfig(**{**built, **fields})
