"""ViT and DeiT weights: vitkit's (timm's) own names, torchvision's `VisionTransformer` and Hugging Face
transformers' ViT / DeiT <-> vitkit.

vitkit's ViT keeps timm's parameter names, so timm's `vit_*` / `deit_*` state dicts load unchanged. A checkpoint
of another image size has its position table resampled to the model's token grid (bicubic, as timm does).

torchvision's ViT (vit_b_16, ...) is the ViT of the paper with exact GELU and LayerNorm eps 1e-6, so its weights give
equal outputs in the vitkit model of the same size (vit_b_16 -> `vit_base_patch16_224`).

transformers: `ViTModel`, `ViTForImageClassification`, `DeiTModel` and `DeiTForImageClassificationWithTeacher`, as
written by their `save_pretrained` (the names below, under a `vit.` / `deit.` prefix when heads sit beside the
encoder) and as named inside transformers 5 models (`attention.q_proj`, `mlp.fc1`, ...), which import accepts too;
and the backbones people fine-tune: `Dinov2Model`, `Dinov2WithRegistersModel`, `CLIPVisionModel` (and a `CLIPModel`'s
vision tower), `SiglipVisionModel` (and a `SiglipModel`'s vision tower, and `SiglipForImageClassification`). Each
reads into the ViT whose `model(x)` is transformers' `pooler_output` and whose `forward_features(x)` is its
`last_hidden_state` (for CLIP, with the final LayerNorm applied to every token, as vitkit's features are).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vitkit.layers import big_vision_sincos_2d, resample_abs_pos_embed, to_2tuple
from vitkit.models.vit import ViTConfig
from vitkit.weights.family import FamilyWeights, State
from vitkit.weights.hf import act_of, hf_act, labels, num_labels, prefix_encoder, square
from vitkit.weights.rename import Layout, Rename, rename
from vitkit.weights.shapes import conv_fields, count


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


def _attention(module: str, q: str, k: str, v: str, out: str) -> tuple[Rename, Rename]:
    """A block's attention from the separate q, k, v Linears (D, D) each of `module`, concatenated along dim 0 into
    the fused qkv (3D, D), rows q, k, v, the order vitkit's reshape (B, N, 3, h, d) reads them in (biases (D,) each
    -> (3D,)); and its output projection `out`."""
    qkv = rename("blocks.{i}.attn.qkv", f"{module}.{q}", f"{module}.{k}", f"{module}.{v}")
    return qkv, rename("blocks.{i}.attn.proj", f"{module}.{out}")


# --- Hugging Face transformers ----------------------------------------------------------------------------------------
_ON_DISK = "encoder.layer.{i}"  # block prefix in files written by save_pretrained
_IN_MEMORY = "layers.{i}"  # block prefix inside transformers 5 models
_VIT_ATTENTION = _attention(
    f"{_ON_DISK}.attention", "attention.query", "attention.key", "attention.value", "output.dense"
)

_HF_BODY = (
    rename("cls_token", "embeddings.cls_token"),  # (1, 1, D) both
    rename("dist_token", "embeddings.distillation_token"),  # DeiT, (1, 1, D) both
    # (1, P + N, D) both, prefix rows first in the same order: class (, distillation), then the patches row-major.
    rename("pos_embed", "embeddings.position_embeddings"),
    rename("patch_embed.proj", "embeddings.patch_embeddings.projection"),  # Conv2d (D, C, p, p) both
    *_VIT_ATTENTION,
    rename("blocks.{i}.norm1", f"{_ON_DISK}.layernorm_before"),
    rename("blocks.{i}.norm2", f"{_ON_DISK}.layernorm_after"),
    rename("blocks.{i}.mlp.fc1", f"{_ON_DISK}.intermediate.dense"),
    rename("blocks.{i}.mlp.fc2", f"{_ON_DISK}.output.dense"),
    # The same tensors under transformers 5's module names
    *_attention(f"{_IN_MEMORY}.attention", "q_proj", "k_proj", "v_proj", "o_proj"),
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
    require(config, "transformers' ViT / DeiT", **{**PLAIN, "act": config.act})  # its hidden_act takes any


# --- transformers' DINOv2, CLIP and SigLIP ----------------------------------------------------------------------------
_DINOV2_BLOCK = _ON_DISK  # "encoder.layer.{i}", as ViT's
_CLIP_BLOCK = "encoder.layers.{i}"  # CLIP's and SigLIP's
_TABLE = (lambda t: t.unsqueeze(0), lambda t: t.squeeze(0))  # their Embedding (T, D) <-> vitkit's table (1, T, D)
_TOKEN = (lambda t: t.reshape(1, 1, -1), lambda t: t.reshape(-1))  # CLIP's class embedding (D,) <-> (1, 1, D)

_DINOV2_RULES = (
    rename("cls_token", "embeddings.cls_token"),
    rename("reg_token", "embeddings.register_tokens"),  # (1, R, D) both
    rename("pos_embed", "embeddings.position_embeddings"),  # (1, 1 + N, D): see HfViTLayout for registers
    rename("patch_embed.proj", "embeddings.patch_embeddings.projection"),
    rename("blocks.{i}.norm1", f"{_DINOV2_BLOCK}.norm1"),
    *_VIT_ATTENTION,  # DINOv2's blocks are named as ViT's
    rename("blocks.{i}.ls1.gamma", f"{_DINOV2_BLOCK}.layer_scale1.lambda1"),
    rename("blocks.{i}.norm2", f"{_DINOV2_BLOCK}.norm2"),
    rename("blocks.{i}.mlp.fc1", f"{_DINOV2_BLOCK}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_DINOV2_BLOCK}.mlp.fc2"),
    rename("blocks.{i}.ls2.gamma", f"{_DINOV2_BLOCK}.layer_scale2.lambda1"),
    rename("norm", "layernorm"),
    # inside transformers 5 models
    *_attention(f"{_DINOV2_BLOCK}.attention", "q_proj", "k_proj", "v_proj", "o_proj"),
)
_CLIP_BLOCKS = (
    rename("blocks.{i}.norm1", f"{_CLIP_BLOCK}.layer_norm1"),
    *_attention(f"{_CLIP_BLOCK}.self_attn", "q_proj", "k_proj", "v_proj", "out_proj"),
    rename("blocks.{i}.norm2", f"{_CLIP_BLOCK}.layer_norm2"),
    rename("blocks.{i}.mlp.fc1", f"{_CLIP_BLOCK}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_CLIP_BLOCK}.mlp.fc2"),
    rename("patch_embed.proj", "embeddings.patch_embedding"),  # Conv2d (D, C, p, p); CLIP's without a bias
    rename("pos_embed", "embeddings.position_embedding.weight", values=_TABLE),  # Embedding (T, D) -> (1, T, D)
    rename("norm", "post_layernorm"),
)
_CLIP_RULES = (
    rename("cls_token", "embeddings.class_embedding", values=_TOKEN),
    rename("norm_pre", "pre_layrnorm"),  # transformers' spelling
    *_CLIP_BLOCKS,
)
_SIGLIP_RULES = (
    *_CLIP_BLOCKS,
    # SiglipMultiheadAttentionPoolingHead: the probe, nn.MultiheadAttention (in_proj rows q, k, v), LayerNorm, MLP;
    # the in_proj goes to attn_pool.qkv, which HfViTLayout splits into the probe's q and the tokens' kv
    rename("attn_pool.latent", "head.probe"),
    rename("attn_pool.qkv.weight", "head.attention.in_proj_weight"),
    rename("attn_pool.qkv.bias", "head.attention.in_proj_bias"),
    rename("attn_pool.proj", "head.attention.out_proj"),
    rename("attn_pool.norm", "head.layernorm"),
    rename("attn_pool.mlp.fc1", "head.mlp.fc1"),
    rename("attn_pool.mlp.fc2", "head.mlp.fc2"),
)


class HfViTLayout(Layout):
    """transformers' ViT layouts, with the two conversions that span tensors:
    - SigLIP's pooling head holds q, k and v in one in_proj (3D, D); vitkit's (timm's) `AttentionPool` holds the
      probe's q (D, D) and the tokens' kv (2D, D): split on import, joined on export.
    - Dinov2WithRegistersModel gives the class token a position row (its table is 1 + N rows; registers have
      none). vitkit's (timm's) DINOv2 with registers has no row for any prefix token (`no_embed_class`): the class
      token's row is added to the class token on import, which is exact at every image size (the row is never
      resampled), and exported as a zero row.
    """

    def to_vitkit(
        self, state: dict[str, torch.Tensor], config: Any = None
    ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
        out, dropped, unmatched = super().to_vitkit(state, config)
        for part in ("weight", "bias"):
            qkv = out.pop(f"attn_pool.qkv.{part}", None)
            if qkv is not None:  # rows q | k | v
                D = qkv.shape[0] // 3
                out[f"attn_pool.q.{part}"], out[f"attn_pool.kv.{part}"] = qkv[:D], qkv[D:]
        if "reg_token" in out and {"cls_token", "pos_embed"} <= set(out):
            pos = out["pos_embed"]
            out["cls_token"] = out["cls_token"] + pos[:, :1]  # (1, 1, D)
            out["pos_embed"] = pos[:, 1:]  # (1, N, D)
        return out, dropped, unmatched

    def from_vitkit(self, state: dict[str, torch.Tensor], config: Any = None) -> dict[str, torch.Tensor]:
        state = dict(state)
        for part in ("weight", "bias"):
            if f"attn_pool.q.{part}" in state:
                q, kv = state.pop(f"attn_pool.q.{part}"), state.pop(f"attn_pool.kv.{part}")
                state[f"attn_pool.qkv.{part}"] = torch.cat([q, kv])  # rows q | k | v
        if "reg_token" in state:
            pos = state["pos_embed"]
            state["pos_embed"] = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)  # (1, 1 + N, D)
        return super().from_vitkit(state, config)


_DROPPED = (
    "pooler",  # ViTModel / DeiTModel's tanh pooler over the class token: no vitkit counterpart
    "embeddings.mask_token",  # DINOv2's masked-image-modelling token: training only
    "embeddings.position_ids",  # CLIP's index buffer in older files
    # a CLIPModel's / SiglipModel's text tower and the projections into the joint space: vitkit reads the image tower
    "text_model",
    "text_projection",
    "visual_projection",
    "logit_scale",
    "logit_bias",
)
_HF_COMMON = dict(
    family="vit",
    markers=("embeddings.patch_embeddings.projection.weight", "embeddings.position_embeddings"),
    other_markers=(("embeddings.patch_embedding.weight", "embeddings.position_embedding.weight"),),
    strip_prefixes=("vit.", "deit.", "dinov2.", "vision_model."),
    dropped=_DROPPED,
)


# Import accepts every name in any table; export writes one class's names.
HF = HfViTLayout(format="hf", rules=_HF_BODY + _HF_HEADS + _DINOV2_RULES + _CLIP_RULES + _SIGLIP_RULES, **_HF_COMMON)
HF_DEIT = HfViTLayout(format="hf", rules=_HF_BODY + _HF_HEADS[1:], **_HF_COMMON)
HF_DINOV2 = HfViTLayout(format="hf", rules=_DINOV2_RULES, **_HF_COMMON)
HF_CLIP = HfViTLayout(format="hf", rules=_CLIP_RULES, **_HF_COMMON)
HF_SIGLIP = HfViTLayout(format="hf", rules=_SIGLIP_RULES, **_HF_COMMON)


def _mlp_ratio(hidden: int, intermediate: int, source: str) -> float:
    mlp_ratio = intermediate / hidden
    if int(hidden * mlp_ratio) != intermediate:
        raise ValueError(f"{source}: intermediate_size {intermediate} is not reachable as hidden_size x mlp_ratio")
    return mlp_ratio


def _patch(hf: dict[str, Any], default: int, source: str) -> int:
    patch = square(hf.get("patch_size", default), "patch_size", source)
    if not isinstance(patch, int):
        raise ValueError(f"{source}: patch_size {hf['patch_size']} is not square; vitkit patches are p x p")
    return patch


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
    hidden = hf.get("hidden_size", 768)
    has_head = bool(stripped & {"classifier.weight", "cls_classifier.weight"})
    return ViTConfig(
        img_size=square(hf.get("image_size", 224), "image_size", source),
        patch_size=_patch(hf, 16, source),
        in_chans=hf.get("num_channels", 3),
        num_classes=num_labels(hf) if has_head else 0,
        embed_dim=hidden,
        depth=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        mlp_ratio=_mlp_ratio(hidden, hf.get("intermediate_size", 3072), source),
        qkv_bias=hf.get("qkv_bias", True),
        distilled=distilled,
        drop_rate=hf.get("hidden_dropout_prob", 0.0),
        attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        act=act_of(hf, source),
    )


def _no_classifier(stripped: set[str], source: str, what: str) -> None:
    if "classifier.weight" in stripped:
        raise ValueError(
            f"{source}: {what}, which vitkit's ViT heads do not compute; load its backbone into a ViT built from "
            "the directory with num_classes=0 (vitkit.load_weights(model, path, strict=False) reports the head "
            "left out), then fine-tune a new head"
        )


def config_from_dinov2(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `Dinov2Model` / `Dinov2WithRegistersModel` (model_type "dinov2" /
    "dinov2_with_registers"): LayerScale, registers after the class token with no position row, any image size
    (the table resampled as transformers does: plain bicubic for Dinov2Model, antialiased with registers)."""
    stripped = {HF.strip(k) for k in keys}
    _no_classifier(stripped, source, "Dinov2ForImageClassification's head reads the class token and the mean patch")
    if hf.get("use_swiglu_ffn", False):
        raise ValueError(f"{source}: use_swiglu_ffn (DINOv2's giant) is not supported; vitkit's MLP is fc1-act-fc2")
    registers = hf.get("num_register_tokens", 4) if hf["model_type"] == "dinov2_with_registers" else 0
    return ViTConfig(
        img_size=square(hf.get("image_size", 224), "image_size", source),
        patch_size=_patch(hf, 16 if registers else 14, source),
        in_chans=hf.get("num_channels", 3),
        num_classes=0,
        embed_dim=hf.get("hidden_size", 768),
        depth=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        mlp_ratio=float(hf.get("mlp_ratio", 4)),
        qkv_bias=hf.get("qkv_bias", True),
        reg_tokens=registers,
        no_embed_class=registers > 0,
        drop_rate=hf.get("hidden_dropout_prob", 0.0),
        attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
        drop_path_rate=hf.get("drop_path_rate", 0.0),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-6),
        init_values=float(hf.get("layerscale_value", 1.0)),
        dynamic_img_size=True,
        act=act_of(hf, source),
        pos_antialias=registers > 0,
    )


def _vision_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The image tower's settings: a CLIPModel's / SiglipModel's `vision_config`, else the config itself."""
    return (hf.get("vision_config") or {}) if "vision_config" in hf else hf


def _tower_fields(v: dict[str, Any], source: str, patch: int, eps: float, act: str) -> dict[str, Any]:
    """The ViT fields of a CLIP / SigLIP image tower's config (`CLIPVisionConfig`, `SiglipVisionConfig`), their
    defaults where a field is absent; a backbone (num_classes 0)."""
    hidden = v.get("hidden_size", 768)
    return dict(
        img_size=square(v.get("image_size", 224), "image_size", source),
        patch_size=_patch(v, patch, source),
        in_chans=v.get("num_channels", 3),
        num_classes=0,
        embed_dim=hidden,
        depth=v.get("num_hidden_layers", 12),
        num_heads=v.get("num_attention_heads", 12),
        mlp_ratio=_mlp_ratio(hidden, v.get("intermediate_size", 3072), source),
        attn_drop_rate=v.get("attention_dropout", 0.0),
        layer_norm_eps=v.get("layer_norm_eps", eps),
        act=act_of(v, source, default=act),
    )


def config_from_clip(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `CLIPVisionModel` (model_type "clip_vision_model"), or a `CLIPModel`'s
    image tower ("clip"): a LayerNorm before the blocks, no patch bias, quick GELU unless the config says
    otherwise; `model(x)` is the post-layernormed class token (`pooler_output`, before `visual_projection`)."""
    stripped = {HF.strip(k) for k in keys}
    _no_classifier(stripped, source, "CLIPForImageClassification's head reads the mean patch token")
    tower = _tower_fields(_vision_config(hf), source, patch=32, eps=1e-5, act="quick_gelu")
    return ViTConfig(**tower, pre_norm=True, patch_bias=False)


def config_from_siglip(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `SiglipVisionModel` (model_type "siglip_vision_model") or a
    `SiglipModel`'s image tower ("siglip"): no class token; attention pooling (`model(x)` is the pooled
    `pooler_output`), or for a tower without the pooling head (`vision_use_head: false`) the mean of the normalised
    tokens."""
    stripped = {HF.strip(k) for k in keys}
    _no_classifier(stripped, source, "SiglipForImageClassification's head reads the mean token")
    v = _vision_config(hf)
    tower = _tower_fields(v, source, patch=16, eps=1e-6, act="gelu_pytorch_tanh")
    pooled = v.get("vision_use_head", True)
    return ViTConfig(
        **tower, class_token=False, global_pool="map" if pooled else "avg", fc_norm=None if pooled else False
    )


def to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit ViT state dict and config as transformers' `save_pretrained` writes them: (state, config.json).

    The class is the one that computes the model: attention pooling -> `SiglipVisionModel` (with a classifier on the
    mean token: `SiglipForImageClassification`); a LayerNorm before the blocks -> `CLIPVisionModel`; LayerScale ->
    `Dinov2Model` (`Dinov2WithRegistersModel` with registers); else a model with a classifier becomes
    `ViTForImageClassification` (`DeiTForImageClassificationWithTeacher` when distilled), one without `ViTModel`
    (`DeiTModel`). ValueError, naming the fields, for a model none of them computes.
    """
    if config.global_pool == "map" or (not config.class_token and not config.pre_norm and config.init_values is None):
        return _to_siglip(config, state)
    if config.pre_norm:
        return _to_clip(config, state)
    if config.init_values is not None:
        return _to_dinov2(config, state)
    check_hf_export(config)
    layout = HF_DEIT if config.distilled else HF
    base, prefix = ("DeiT", "deit.") if config.distilled else ("ViT", "vit.")
    if config.num_classes == 0:
        architecture, prefix = f"{base}Model", ""
    else:
        architecture = base + ("ForImageClassificationWithTeacher" if config.distilled else "ForImageClassification")
    return prefix_encoder(layout.from_vitkit(state), layout, prefix), _hf_config_json(config, architecture)


def _square_size(config: ViTConfig, library: str) -> int:
    if not isinstance(config.img_size, int):
        raise ValueError(f"{library} needs square images (this model: {config.img_size[0]}x{config.img_size[1]})")
    return config.img_size


def _to_dinov2(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    registers = config.reg_tokens > 0
    library = "transformers' " + ("Dinov2WithRegistersModel" if registers else "Dinov2Model")
    fields = {**PLAIN, "act": config.act, "reg_tokens": config.reg_tokens, "no_embed_class": registers}
    require(config, library, **fields, class_token=True, global_pool="token", distilled=False, num_classes=0)
    if config.mlp_ratio != int(config.mlp_ratio):
        raise ValueError(f"{library} needs a whole mlp_ratio (this model: {config.mlp_ratio})")
    hf = {
        "architectures": ["Dinov2WithRegistersModel" if registers else "Dinov2Model"],
        "model_type": "dinov2_with_registers" if registers else "dinov2",
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "mlp_ratio": int(config.mlp_ratio),
        "hidden_act": hf_act(config.act),
        "hidden_dropout_prob": config.drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "drop_path_rate": config.drop_path_rate,
        "layer_norm_eps": config.layer_norm_eps,
        "image_size": _square_size(config, library),
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "layerscale_value": config.init_values,
        "use_swiglu_ffn": False,
        **({"num_register_tokens": config.reg_tokens} if registers else {}),
    }
    return HF_DINOV2.from_vitkit(state, config), hf


def _tower_json(config: ViTConfig, architecture: str, model_type: str, library: str) -> dict[str, Any]:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": config.embed_dim,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "num_channels": config.in_chans,
        "image_size": _square_size(config, library),
        "patch_size": config.patch_size,
        "hidden_act": hf_act(config.act),
        "layer_norm_eps": config.layer_norm_eps,
        "attention_dropout": config.attn_drop_rate,
    }


def _to_clip(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    library = "transformers' CLIPVisionModel"
    fields = {**PLAIN, "act": config.act, "pre_norm": True, "patch_bias": False}
    require(config, library, **fields, class_token=True, global_pool="token", distilled=False, num_classes=0)
    require(config, library, init_values=None, qkv_bias=True)
    renamed = {"vision_model." + k: v for k, v in HF_CLIP.from_vitkit(state, config).items()}
    return renamed, _tower_json(config, "CLIPVisionModel", "clip_vision_model", library)


def _to_siglip(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    library = "transformers' SiglipVisionModel"
    pooled = config.global_pool == "map"  # else the mean of the normalised tokens, a tower without the pooling head
    pool = dict(global_pool="map", fc_norm=None) if pooled else dict(global_pool="avg", fc_norm=False)
    require(config, library, **{**PLAIN, "act": config.act, **pool}, class_token=False, num_classes=0)
    require(config, library, init_values=None, qkv_bias=True)
    renamed = {"vision_model." + k: v for k, v in HF_SIGLIP.from_vitkit(state, config).items()}
    return renamed, {
        **_tower_json(config, "SiglipVisionModel", "siglip_vision_model", library),
        "vision_use_head": pooled,
    }


def _hf_config_json(config: ViTConfig, architecture: str) -> dict[str, Any]:
    img = config.img_size if isinstance(config.img_size, int) else list(config.img_size)
    hf: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "deit" if config.distilled else "vit",
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "hidden_act": hf_act(config.act),
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


# --- lucidrains' vit-pytorch ------------------------------------------------------------------------------------------
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
    read_config=lambda state, fields: _read_assuming(config_from_vit_pytorch, state, fields),
)
VITPYTORCH_VIT = Layout(format="vit-pytorch", family="vit", rules=_VP_COMMON + _VP_VIT, markers=VITPYTORCH.markers)
VITPYTORCH_SIMPLE = Layout(
    format="vit-pytorch", family="vit", rules=_VP_COMMON + _VP_SIMPLE, markers=VITPYTORCH.markers
)


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
        raise ValueError(
            f"the {library} position table has {rows} patch rows of {patch}-pixel patches, not a square grid: give "
            "the image size the model was built for (vitkit convert ... --model-arg img_size=[H,W]; img_size=(H, W) "
            "from Python)"
        )
    fields["img_size"] = side * patch
    if assumed is not None:
        assumed.append(
            f"img_size {side * patch}: a square {side}x{side} grid from the position table's {rows} patch rows (give "
            "img_size for a model built for other images)"
        )


def _read_assuming(read: Any, state: Mapping[str, torch.Tensor], fields: dict[str, Any]) -> tuple[ViTConfig, list[str]]:
    """A `Layout.read_config` result: the config `read` builds, and what it assumed that the shapes did not say."""
    assumed: list[str] = []
    return read(state, assumed=assumed, **fields), assumed


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
        raise ValueError(
            "a vit-pytorch state dict does not say its number of heads: give it (vitkit convert ... --model-arg "
            "num_heads=H; num_heads=H from Python)"
        )
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
        raise ValueError("a SimpleViT state dict has no position table to read the image size from: give img_size")
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


# --- PaddleViT --------------------------------------------------------------------------------------------------------
_PD_LAYER = "encoder.layers.{i}"
_T = (lambda t: t.t(), lambda t: t.t())  # Paddle's Linear weight is [in, out], torch's (out, in)


def _linear(ours: str, theirs: str) -> tuple[Rename, Rename]:
    """A Linear layer's two rules: the weight transposed, the bias as it is."""
    return rename(f"{ours}.weight", f"{theirs}.weight", values=_T), rename(f"{ours}.bias", f"{theirs}.bias")


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
    check_export=lambda config: check_paddlevit_export(config),
    read_config=lambda state, fields: _read_assuming(config_from_paddlevit, state, fields),
)


def check_paddlevit_export(config: ViTConfig) -> None:
    """ValueError for ViT configurations PaddleViT's ViT / DeiT cannot express (its image_size is one side)."""
    library = "PaddleViT's ViT / DeiT"
    wanted = dict(PLAIN, class_token=True, global_pool="token", init_values=None, qkv_bias=True, layer_norm_eps=1e-6)
    require(config, library, **wanted)
    _square_size(config, library)


def config_from_paddlevit(
    state: Mapping[str, torch.Tensor], assumed: list[str] | None = None, **fields: Any
) -> ViTConfig:
    """The vitkit ViT / DeiT equal to the PaddleViT model whose state dict is `state` (Paddle's names): every size
    but the number of heads, which `fields` gives (`num_heads`), with any other ViTConfig field. The image size is
    the square grid of the position table (PaddleViT's models take square images) unless `fields` gives one; that
    assumption is appended to `assumed`."""
    if "num_heads" not in fields:
        raise ValueError(
            "a PaddleViT state dict does not say its number of heads: give it (vitkit convert ... --model-arg "
            "num_heads=H; num_heads=H from Python)"
        )
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


WEIGHTS = FamilyWeights(
    markers=("patch_embed.proj.weight", "pos_embed"),
    head=("head.", "head_dist."),
    adapt=resample_pos_embed,
    layouts=(TORCHVISION, HF, VITPYTORCH, PADDLEVIT),
    read_fields=read_fields,
    fields_added={
        "bilinear_dim": 2,
        "reg_tokens": 4,
        "no_embed_class": 4,
        **dict.fromkeys(
            ("pre_norm", "patch_bias", "patch_norm", "act", "head_dim", "proj_bias", "fc_norm", "pos_antialias"), 5
        ),
    },
    hf_model_types={
        "vit": config_from_hf,
        "deit": config_from_hf,
        "dinov2": config_from_dinov2,
        "dinov2_with_registers": config_from_dinov2,
        "clip": config_from_clip,
        "clip_vision_model": config_from_clip,
        "siglip": config_from_siglip,
        "siglip_vision_model": config_from_siglip,
    },
    hf_export=to_hf,
    hf_image_processor=True,
)
