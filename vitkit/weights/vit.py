"""ViT and DeiT weights: vitkit's (timm's) own names, torchvision's `VisionTransformer` and Hugging Face
transformers' ViT / DeiT <-> vitkit.

vitkit's ViT keeps timm's parameter names, so timm's `vit_*` / `deit_*` state dicts load unchanged. A checkpoint
of another image size has its position table resampled to the model's token grid (bicubic, as timm does).

torchvision's ViT (vit_b_16, ...) is the ViT of the paper with exact GELU and LayerNorm eps 1e-6, so its weights give
equal outputs in the vitkit model of the same size (vit_b_16 -> `vit_base_patch16_224`).

transformers: `ViTModel`, `ViTForImageClassification`, `DeiTModel` and `DeiTForImageClassificationWithTeacher`, as
written by their `save_pretrained` (the names below, under a `vit.` / `deit.` prefix when heads sit beside the
encoder) and as named inside transformers 5 models (`attention.q_proj`, `mlp.fc1`, ...), which import accepts too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vitkit.layers import resample_abs_pos_embed, to_2tuple
from vitkit.models.vit import ViTConfig
from vitkit.weights.family import FamilyWeights, State
from vitkit.weights.hf import check_act, labels, num_labels, prefix_encoder, square
from vitkit.weights.rename import Layout, Rename, rename
from vitkit.weights.shapes import conv_fields, count


def resample_pos_embed(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Fit a ViT checkpoint's position table to the model's token grid (bicubic, as timm does)."""
    old, new = state.get("pos_embed"), model.state_dict().get("pos_embed")
    if old is None or new is None or old.shape == new.shape or old.ndim != 3 or old.shape[-1] != new.shape[-1]:
        return []  # equal, or not a resampling case: the shape check reports the rest
    layout = model.token_grid(to_2tuple(model.config.img_size))  # the model interface: (prefix tokens, grid)
    if layout is None:
        return []
    prefix, grid = layout
    side = round((old.shape[1] - prefix) ** 0.5)
    if old.shape[1] <= prefix or side * side != old.shape[1] - prefix:
        raise ValueError(
            f"position table {tuple(old.shape)} is not {prefix} prefix rows plus a square grid, so it cannot be "
            f"resampled to the model's {grid[0]}x{grid[1]} grid; build the model at the checkpoint's image size"
        )
    state["pos_embed"] = resample_abs_pos_embed(old, grid, (side, side), num_prefix_tokens=prefix)
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


# --- torchvision ------------------------------------------------------------------------------------------------------
_TV_BLOCK = "encoder.layers.encoder_layer_{i}"


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
        rename("blocks.{i}.norm1", f"{_TV_BLOCK}.ln_1"),
        # nn.MultiheadAttention's in_proj is already the fused q, k, v (3D, D), rows q then k then v: no split.
        rename("blocks.{i}.attn.qkv.weight", f"{_TV_BLOCK}.self_attention.in_proj_weight"),
        rename("blocks.{i}.attn.qkv.bias", f"{_TV_BLOCK}.self_attention.in_proj_bias"),
        rename("blocks.{i}.attn.proj", f"{_TV_BLOCK}.self_attention.out_proj"),
        rename("blocks.{i}.norm2", f"{_TV_BLOCK}.ln_2"),
        rename("blocks.{i}.mlp.fc1", f"{_TV_BLOCK}.mlp.0"),  # MLPBlock: 0 Linear, 1 GELU, 2 Dropout, 3 Linear
        rename("blocks.{i}.mlp.fc2", f"{_TV_BLOCK}.mlp.3"),
        rename("blocks.{i}.mlp.fc1", f"{_TV_BLOCK}.mlp.linear_1"),  # older torchvision (MLPBlock version 1)
        rename("blocks.{i}.mlp.fc2", f"{_TV_BLOCK}.mlp.linear_2"),
        rename("norm", "encoder.ln"),
        rename("head", "heads.head"),
    ),
    markers=("conv_proj.weight", "encoder.pos_embedding"),
    check_export=check_torchvision_export,
)


# --- Hugging Face transformers ----------------------------------------------------------------------------------------
_ON_DISK = "encoder.layer.{i}"  # block prefix in files written by save_pretrained
_IN_MEMORY = "layers.{i}"  # block prefix inside transformers 5 models

_HF_BODY = (
    rename("cls_token", "embeddings.cls_token"),  # (1, 1, D) both
    rename("dist_token", "embeddings.distillation_token"),  # DeiT, (1, 1, D) both
    # (1, P + N, D) both, prefix rows first in the same order: class (, distillation), then the patches row-major.
    rename("pos_embed", "embeddings.position_embeddings"),
    rename("patch_embed.proj", "embeddings.patch_embeddings.projection"),  # Conv2d (D, C, p, p) both
    # Separate q, k, v Linears (D, D) each: concatenated along dim 0 into the fused qkv (3D, D), rows q, k, v,
    # which is the order vitkit's reshape (B, N, 3, h, d) reads them in; biases (D,) each -> (3D,).
    rename(
        "blocks.{i}.attn.qkv",
        f"{_ON_DISK}.attention.attention.query",
        f"{_ON_DISK}.attention.attention.key",
        f"{_ON_DISK}.attention.attention.value",
    ),
    rename("blocks.{i}.attn.proj", f"{_ON_DISK}.attention.output.dense"),
    rename("blocks.{i}.norm1", f"{_ON_DISK}.layernorm_before"),
    rename("blocks.{i}.norm2", f"{_ON_DISK}.layernorm_after"),
    rename("blocks.{i}.mlp.fc1", f"{_ON_DISK}.intermediate.dense"),
    rename("blocks.{i}.mlp.fc2", f"{_ON_DISK}.output.dense"),
    # The same tensors under transformers 5's module names: q, k, v concatenated along dim 0 as above.
    rename(
        "blocks.{i}.attn.qkv",
        f"{_IN_MEMORY}.attention.q_proj",
        f"{_IN_MEMORY}.attention.k_proj",
        f"{_IN_MEMORY}.attention.v_proj",
    ),
    rename("blocks.{i}.attn.proj", f"{_IN_MEMORY}.attention.o_proj"),
    rename("blocks.{i}.norm1", f"{_IN_MEMORY}.layernorm_before"),
    rename("blocks.{i}.norm2", f"{_IN_MEMORY}.layernorm_after"),
    rename("blocks.{i}.mlp.fc1", f"{_IN_MEMORY}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_IN_MEMORY}.mlp.fc2"),
    rename("norm", "layernorm"),
)
_HF_HEADS: tuple[Rename, ...] = (
    rename("head", "classifier"),  # ViTForImageClassification: one head on the class token
    rename("head", "cls_classifier"),  # DeiTForImageClassificationWithTeacher: class-token head ...
    rename("head_dist", "distillation_classifier"),  # ... and distillation-token head, logits averaged
)
_HF_COMMON = dict(
    family="vit",
    markers=("embeddings.patch_embeddings.projection.weight", "embeddings.position_embeddings"),
    strip_prefixes=("vit.", "deit."),
    dropped=("pooler",),  # ViTModel / DeiTModel's tanh pooler over the class token: no vitkit counterpart
)


def check_hf_export(config: ViTConfig) -> None:
    """ValueError for ViT configurations transformers' ViT / DeiT cannot express."""
    problems = []
    if not config.class_token or config.global_pool != "token":
        problems.append("a class token read by the head (no mean pooling)")
    if config.init_values is not None:
        problems.append("no LayerScale (init_values=None)")
    if problems:
        raise ValueError("transformers' ViT / DeiT needs " + "; ".join(problems))


# Import accepts every name in either table; export writes ViT's `classifier` or DeiT's two heads.
HF = Layout(format="hf", rules=_HF_BODY + _HF_HEADS, **_HF_COMMON)
HF_DEIT = Layout(format="hf", rules=_HF_BODY + _HF_HEADS[1:], **_HF_COMMON)


def config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT/DeiT config equal to a transformers ViT/DeiT config.

    Args:
        hf: the parsed `config.json` (model_type "vit" or "deit"); absent fields take transformers' defaults.
        keys: the checkpoint's keys, which say which heads the saved class had.
        source: the file named in errors.
    """
    distilled = hf["model_type"] == "deit"
    stripped = {HF.strip(k) for k in keys}
    if distilled and "classifier.weight" in stripped:
        raise ValueError(
            f"{source} is a DeiTForImageClassification: a distillation token but one classifier on the class "
            "token, which vitkit's distilled DeiT (two heads, logits averaged) cannot reproduce; load its encoder "
            "with vitkit.load_weights(model, path, reset_head=True) into a distilled model"
        )
    check_act(hf, source)
    hidden, intermediate = hf.get("hidden_size", 768), hf.get("intermediate_size", 3072)
    mlp_ratio = intermediate / hidden
    if int(hidden * mlp_ratio) != intermediate:
        raise ValueError(f"{source}: intermediate_size {intermediate} is not reachable as hidden_size x mlp_ratio")
    patch = square(hf.get("patch_size", 16), "patch_size", source)
    if not isinstance(patch, int):
        raise ValueError(f"{source}: patch_size {hf['patch_size']} is not square; vitkit patches are p x p")
    has_head = bool(stripped & {"classifier.weight", "cls_classifier.weight"})
    return ViTConfig(
        img_size=square(hf.get("image_size", 224), "image_size", source),
        patch_size=patch,
        in_chans=hf.get("num_channels", 3),
        num_classes=num_labels(hf) if has_head else 0,
        embed_dim=hidden,
        depth=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        mlp_ratio=mlp_ratio,
        qkv_bias=hf.get("qkv_bias", True),
        distilled=distilled,
        drop_rate=hf.get("hidden_dropout_prob", 0.0),
        attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
    )


def to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit ViT/DeiT state dict and config as transformers' `save_pretrained` writes them: (state, config.json).

    A model with a classifier becomes `ViTForImageClassification` (`DeiTForImageClassificationWithTeacher`
    when distilled), one without becomes `ViTModel` (`DeiTModel`).
    """
    check_hf_export(config)
    layout = HF_DEIT if config.distilled else HF
    base, prefix = ("DeiT", "deit.") if config.distilled else ("ViT", "vit.")
    if config.num_classes == 0:
        architecture, prefix = f"{base}Model", ""
    else:
        architecture = base + ("ForImageClassificationWithTeacher" if config.distilled else "ForImageClassification")
    return prefix_encoder(layout.from_vitkit(state), layout, prefix), _hf_config_json(config, architecture)


def _hf_config_json(config: ViTConfig, architecture: str) -> dict[str, Any]:
    img = config.img_size if isinstance(config.img_size, int) else list(config.img_size)
    hf: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "deit" if config.distilled else "vit",
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "initializer_range": 0.02,
        "layer_norm_eps": config.layer_norm_eps,
        "image_size": img,
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "encoder_stride": config.patch_size,
        **labels(config.num_classes),
    }
    return hf


WEIGHTS = FamilyWeights(
    markers=("patch_embed.proj.weight", "pos_embed"),
    head=("head.", "head_dist."),
    adapt=resample_pos_embed,
    layouts=(TORCHVISION, HF),
    read_fields=read_fields,
    fields_added={"bilinear_dim": 2, "reg_tokens": 4, "no_embed_class": 4},
    hf_model_types={"vit": config_from_hf, "deit": config_from_hf},
    hf_export=to_hf,
    hf_image_processor=True,
)
