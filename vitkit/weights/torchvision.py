"""torchvision's layouts: `VisionTransformer` (vit_b_16, ...) and `SwinTransformer` (swin_t, ...) state dicts
<-> vitkit.

torchvision's ViT is the ViT of the paper with exact GELU and LayerNorm eps 1e-6, and its Swin (v1) the
reference Swin with eps 1e-5, so their weights give equal outputs in the vitkit model of the same size
(vit_b_16 -> `vit_base_patch16_224`, swin_t -> `swin_tiny_patch4_window7_224`). A family adds its table to
`LAYOUTS`.
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.models.swin import SwinConfig
from vitkit.models.vit import ViTConfig
from vitkit.weights.limits import check_swin_windows
from vitkit.weights.rename import Indices, Layout, Rename, rename

_BLOCK = "encoder.layers.encoder_layer_{i}"


def check_vit_export(config: ViTConfig) -> None:
    """ValueError for ViT configurations torchvision's VisionTransformer cannot express."""
    problems = []
    if not config.class_token or config.global_pool != "token" or config.distilled:
        problems.append("a class token read by one head (no mean pooling, no distillation token)")
    if config.init_values is not None:
        problems.append("no LayerScale (init_values=None)")
    if not config.qkv_bias:
        problems.append("a bias on the qkv projection (qkv_bias=True)")
    if config.layer_norm_eps != 1e-6:
        problems.append(f"LayerNorm eps 1e-6 (this model: {config.layer_norm_eps})")
    if config.num_classes == 0:
        problems.append("a classifier (num_classes > 0)")
    if config.in_chans != 3:
        problems.append(f"3 input channels (this model: {config.in_chans})")
    if isinstance(config.img_size, tuple) and config.img_size[0] != config.img_size[1]:
        problems.append(f"square images (this model: {config.img_size[0]}x{config.img_size[1]})")
    if problems:
        raise ValueError("torchvision's VisionTransformer needs " + "; ".join(problems))


VIT = Layout(
    format="torchvision",
    family="vit",
    rules=(
        rename("cls_token", "class_token"),  # (1, 1, D) both
        rename("pos_embed", "encoder.pos_embedding"),  # (1, 1 + N, D) both, class token row first
        rename("patch_embed.proj", "conv_proj"),  # Conv2d (D, C, p, p) both
        rename("blocks.{i}.norm1", f"{_BLOCK}.ln_1"),
        # nn.MultiheadAttention's in_proj is already the fused q, k, v (3D, D), rows q then k then v: no split.
        rename("blocks.{i}.attn.qkv.weight", f"{_BLOCK}.self_attention.in_proj_weight"),
        rename("blocks.{i}.attn.qkv.bias", f"{_BLOCK}.self_attention.in_proj_bias"),
        rename("blocks.{i}.attn.proj", f"{_BLOCK}.self_attention.out_proj"),
        rename("blocks.{i}.norm2", f"{_BLOCK}.ln_2"),
        rename("blocks.{i}.mlp.fc1", f"{_BLOCK}.mlp.0"),  # MLPBlock: 0 Linear, 1 GELU, 2 Dropout, 3 Linear
        rename("blocks.{i}.mlp.fc2", f"{_BLOCK}.mlp.3"),
        rename("blocks.{i}.mlp.fc1", f"{_BLOCK}.mlp.linear_1"),  # older torchvision (MLPBlock version 1)
        rename("blocks.{i}.mlp.fc2", f"{_BLOCK}.mlp.linear_2"),
        rename("norm", "encoder.ln"),
        rename("head", "heads.head"),
    ),
    markers=("conv_proj.weight", "encoder.pos_embedding"),
    check_export=check_vit_export,
)


def check_swin_export(config: SwinConfig) -> None:
    """ValueError for Swin configurations torchvision's SwinTransformer cannot express."""
    problems = []
    if not config.qkv_bias:
        problems.append("a bias on the qkv projection (qkv_bias=True)")
    if config.layer_norm_eps != 1e-5:
        problems.append(f"LayerNorm eps 1e-5 (this model: {config.layer_norm_eps})")
    if config.num_classes == 0:
        problems.append("a classifier (num_classes > 0)")
    if config.in_chans != 3:
        problems.append(f"3 input channels (this model: {config.in_chans})")
    if problems:
        raise ValueError("torchvision's SwinTransformer needs " + "; ".join(problems))
    check_swin_windows(config, "torchvision's SwinTransformer")


# torchvision's `features` is one Sequential: [0] the patch embedding, then for each stage s its blocks at
# 2s + 1, preceded (s > 0) by the patch merging at 2s.
def _stage_of_blocks(i: Indices) -> Indices | None:
    return {"s": (i["f"] - 1) // 2, "b": i["b"]} if i["f"] % 2 == 1 else None


def _blocks_of_stage(i: Indices) -> Indices:
    return {"f": 2 * i["s"] + 1, "b": i["b"]}


def _stage_of_merging(i: Indices) -> Indices | None:
    return {"s": i["f"] // 2} if i["f"] % 2 == 0 and i["f"] > 0 else None


def _merging_of_stage(i: Indices) -> Indices:
    return {"f": 2 * i["s"]}


def _swin_block(ours: str, theirs: str) -> Rename:
    """A rule inside a block: vitkit `layers.{s}.blocks.{b}.<ours>` <- torchvision `features.{f}.{b}.<theirs>`."""
    return rename(
        f"layers.{{s}}.blocks.{{b}}.{ours}",
        f"features.{{f}}.{{b}}.{theirs}",
        to_ours=_stage_of_blocks,
        to_theirs=_blocks_of_stage,
    )


def _swin_index_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """torchvision stores each block's relative position index, flattened (N*N,); vitkit computes it (N, N)."""
    return {
        # (N, N) -> (N*N,)
        f"features.{2 * s + 1}.{b}.attn.relative_position_index": block.attn.relative_position_index.flatten()
        for s, stage in enumerate(model.layers)
        for b, block in enumerate(stage.blocks)
    }


SWIN = Layout(
    format="torchvision",
    family="swin",
    rules=(
        rename("patch_embed.proj", "features.0.0"),  # Conv2d (D, C, p, p) both; [0][1] is a Permute to NHWC
        rename("patch_embed.norm", "features.0.2"),
        _swin_block("norm1", "norm1"),
        _swin_block("attn.qkv", "attn.qkv"),  # fused (3C, C) both, rows q, k, v
        _swin_block("attn.relative_position_bias_table", "attn.relative_position_bias_table"),  # ((2M-1)^2, h)
        _swin_block("attn.proj", "attn.proj"),
        _swin_block("norm2", "norm2"),
        _swin_block("mlp.fc1", "mlp.0"),  # MLP: 0 Linear, 1 GELU, 2 Dropout, 3 Linear
        _swin_block("mlp.fc2", "mlp.3"),
        # PatchMerging concatenates the 2x2 neighbours in the reference order in both: same (2C, 4C) weights.
        rename(
            "layers.{s}.downsample.norm", "features.{f}.norm", to_ours=_stage_of_merging, to_theirs=_merging_of_stage
        ),
        rename(
            "layers.{s}.downsample.reduction",
            "features.{f}.reduction",
            to_ours=_stage_of_merging,
            to_theirs=_merging_of_stage,
        ),
        rename("norm", "norm"),
        rename("head.fc", "head"),
    ),
    markers=("features.0.0.weight", "features.0.2.weight"),
    dropped=("features.{f}.{b}.attn.relative_position_index",),  # vitkit recomputes it
    check_export=check_swin_export,
    export_buffers=_swin_index_buffers,
)

# vitkit family -> its torchvision layout.
LAYOUTS: dict[str, Layout] = {"vit": VIT, "swin": SWIN}
