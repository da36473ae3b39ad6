"""ViT and DeiT weights: the family's declaration (`WEIGHTS`) and vitkit's (timm's) own names; one module per
other library read and written:

- `torchvision`: torchvision's `VisionTransformer`;
- `hf`: Hugging Face transformers' ViT, DeiT and DINOv2 (and the layout class all its ViT tables share);
- `clip`: transformers' CLIP and SigLIP image towers;
- `vit_pytorch`: lucidrains' vit-pytorch `ViT` and `SimpleViT`;
- `paddlevit`: BR-IDL/PaddleViT's ViT and DeiT;
- `shared`: what several of them share.

vitkit's ViT keeps timm's parameter names, so timm's `vit_*` / `deit_*` state dicts load unchanged. A checkpoint
of another image size has its position table resampled to the model's token grid (bicubic, as timm does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vitkit.layers import resample_abs_pos_embed
from vitkit.models.vit import ViTConfig
from vitkit.weights.family import FamilyWeights, State
from vitkit.weights.shapes import conv_fields, count
from vitkit.weights.vit.clip import (
    CLIP_RULES,
    SIGLIP_RULES,
    clip_to_hf,
    config_from_clip,
    config_from_siglip,
    siglip_to_hf,
)
from vitkit.weights.vit.hf import (
    DINOV2_RULES,
    HF_COMMON,
    VIT_BODY,
    VIT_HEADS,
    HfViTLayout,
    config_from_dinov2,
    config_from_hf,
    dinov2_to_hf,
    vit_to_hf,
)
from vitkit.weights.vit.paddlevit import PADDLEVIT
from vitkit.weights.vit.torchvision import TORCHVISION
from vitkit.weights.vit.vit_pytorch import VITPYTORCH
from vitkit.weights.vit.vitdet import VITDET_RULES, config_from_vitdet, vitdet_to_hf


def resample_pos_embed(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Fit a ViT checkpoint's position table to the model's token grid (bicubic, as timm does)."""
    old, new = state.get("pos_embed"), model.state_dict().get("pos_embed")
    if old is None or new is None or old.shape == new.shape or old.ndim != 3 or old.shape[-1] != new.shape[-1]:
        return []  # equal, or not a resampling case: the shape check reports the rest
    prefix, grid = model.embedded_prefix, model.patch_embed.grid_size  # the rows before the grid, and the grid
    side = round((old.shape[1] - prefix) ** 0.5)
    if old.shape[1] <= prefix or side * side != old.shape[1] - prefix:
        raise ValueError(
            f"position table {tuple(old.shape)} is not {prefix} prefix rows plus a square grid, so it cannot be "
            f"resampled to the model's {grid[0]}x{grid[1]} grid; build the model at the checkpoint's image size"
        )
    state["pos_embed"] = resample_abs_pos_embed(
        old, grid, (side, side), num_prefix_tokens=prefix, antialias=model.config.pos_antialias
    )
    return [f"pos_embed: {side}x{side} -> {grid[0]}x{grid[1]} grid"]


def read_fields(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The config fields a ViT state dict fixes: width, channels, patch size, depth, MLP ratio, tokens, qkv bias."""
    fields = conv_fields(state.get("patch_embed.proj.weight"), "embed_dim")
    if depth := count(state, r"blocks\.(\d+)\."):
        fields["depth"] = depth
    fc1 = state.get("blocks.0.mlp.fc1.weight")
    if fc1 is not None and fc1.ndim == 2:
        fields["mlp_ratio"] = fc1.shape[0] / fc1.shape[1]  # (hidden, D)
    if fields:
        fields["class_token"] = "cls_token" in state
        fields["distilled"] = "dist_token" in state
        fields["qkv_bias"] = "blocks.0.attn.qkv.bias" in state
    return fields


def key_hint(missing: Sequence[str], unexpected: Sequence[str]) -> str:
    """The final norm on the other side of the pooling: a checkpoint that normalises before it (`norm`, class-token
    models) read into one that normalises after it (`fc_norm`, what global_pool="avg" gives by default), or the
    other way round. No shape tells them apart, so the error names the setting."""
    ours, theirs = {k.split(".")[0] for k in missing}, {k.split(".")[0] for k in unexpected}
    if (ours, theirs) == ({"fc_norm"}, {"norm"}):
        return (
            "The checkpoint normalises the tokens before pooling (norm), the model after it (fc_norm, the default "
            "with global_pool='avg'): build the model with fc_norm=False to pool the checkpoint's normalised tokens"
        )
    if (ours, theirs) == ({"norm"}, {"fc_norm"}):
        return (
            "The checkpoint normalises after pooling (fc_norm), the model before it (norm): build the model with "
            "fc_norm=True (and global_pool='avg', as the checkpoint was most likely trained)"
        )
    return ""


# transformers' files: import accepts every name of every class's table; export writes one class's names (`to_hf`).
HF = HfViTLayout(
    format="hf", rules=VIT_BODY + VIT_HEADS + DINOV2_RULES + CLIP_RULES + SIGLIP_RULES + VITDET_RULES, **HF_COMMON
)


def to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit ViT state dict and config as transformers' `save_pretrained` writes them: (state, config.json).

    The class is the one that computes the model: attention pooling -> `SiglipVisionModel` (with a classifier on the
    mean token: `SiglipForImageClassification`); a LayerNorm before the blocks -> `CLIPVisionModel`; LayerScale ->
    `Dinov2Model` (`Dinov2WithRegistersModel` with registers); else a model with a classifier becomes
    `ViTForImageClassification` (`DeiTForImageClassificationWithTeacher` when distilled), one without `ViTModel`
    (`DeiTModel`); one without a final norm -> `VitDetModel` (ViTDet: windows, relative positions). ValueError,
    naming the fields, for a model none of them computes.
    """
    if not config.final_norm:
        return vitdet_to_hf(config, state)
    if config.global_pool == "map" or (not config.class_token and not config.pre_norm and config.init_values is None):
        return siglip_to_hf(config, state)
    if config.pre_norm:
        return clip_to_hf(config, state)
    if config.init_values is not None:
        return dinov2_to_hf(config, state)
    return vit_to_hf(config, state)


WEIGHTS = FamilyWeights(
    input_conv="patch_embed.proj.weight",
    markers=("patch_embed.proj.weight", "pos_embed"),
    head=("head.", "head_dist."),
    adapt=resample_pos_embed,
    layouts=(TORCHVISION, HF, VITPYTORCH, PADDLEVIT),
    read_fields=read_fields,
    unread_fields=("num_heads",),  # qkv is (3D, D) for any head count that divides D
    key_hint=key_hint,
    hf_model_types={
        "vit": config_from_hf,
        "deit": config_from_hf,
        "dinov2": config_from_dinov2,
        "dinov2_with_registers": config_from_dinov2,
        "clip": config_from_clip,
        "clip_vision_model": config_from_clip,
        "siglip": config_from_siglip,
        "siglip_vision_model": config_from_siglip,
        "vitdet": config_from_vitdet,
    },
    hf_export=to_hf,
    hf_image_processor=True,
)
