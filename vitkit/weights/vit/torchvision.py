"""torchvision's `VisionTransformer` (vit_b_16, ...) <-> vitkit's ViT.

torchvision's ViT is the ViT of the paper with exact GELU and LayerNorm eps 1e-6, so its weights give equal outputs
in the vitkit model of the same size (vit_b_16 -> `vit_base_patch16_224`).
"""

from __future__ import annotations

from vitkit.models.vit import ViTConfig
from vitkit.weights.rename import Layout, rename
from vitkit.weights.vit.shared import PLAIN

_BLOCK = "encoder.layers.encoder_layer_{i}"


def check_torchvision_export(config: ViTConfig) -> None:
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
    problems += [
        f"{name}={value!r} (this model: {getattr(config, name)!r})"
        for name, value in PLAIN.items()
        if getattr(config, name) != value
    ]
    if config.in_chans != 3:
        problems.append(f"3 input channels (this model: {config.in_chans})")
    if isinstance(config.img_size, tuple) and config.img_size[0] != config.img_size[1]:
        problems.append(f"square images (this model: {config.img_size[0]}x{config.img_size[1]})")
    if problems:
        raise ValueError("torchvision's VisionTransformer needs " + "; ".join(problems))


TORCHVISION = Layout(
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
    check_export=check_torchvision_export,
)
