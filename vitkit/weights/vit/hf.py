"""Hugging Face transformers' ViT, DeiT and DINOv2 <-> vitkit's ViT, and the layout class all of transformers' ViT
tables share (CLIP's and SigLIP's too: `vitkit.weights.vit.clip`).

`ViTModel`, `ViTForImageClassification`, `DeiTModel` and `DeiTForImageClassificationWithTeacher` are read as written
by their `save_pretrained` (the names below, under a `vit.` / `deit.` prefix when heads sit beside the encoder) and
as named inside transformers 5 models (`attention.q_proj`, `mlp.fc1`, ...); `Dinov2Model` and
`Dinov2WithRegistersModel` as the backbones people fine-tune. Each reads into the ViT whose `model(x)` is
transformers' `pooler_output` and whose `forward_features(x)` is its `last_hidden_state`.
"""

from __future__ import annotations

from typing import Any

import torch

from vitkit.models.vit import ViTConfig
from vitkit.weights.family import State
from vitkit.weights.hf import act_of, hf_act, labels, num_labels, prefix_encoder, square
from vitkit.weights.rename import Layout, Rename, rename
from vitkit.weights.vit.shared import PLAIN, attention_rules, require, square_size

VITDET_MARKER = "embeddings.projection.weight"  # ViTDet's patch projection (ViT's: embeddings.patch_embeddings...)
_ON_DISK = "encoder.layer.{i}"  # block prefix in files written by save_pretrained (ViT's, DeiT's and DINOv2's)
_IN_MEMORY = "layers.{i}"  # block prefix inside transformers 5 models
_VIT_ATTENTION = attention_rules(
    f"{_ON_DISK}.attention", "attention.query", "attention.key", "attention.value", "output.dense"
)

VIT_BODY = (
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
    *attention_rules(f"{_IN_MEMORY}.attention", "q_proj", "k_proj", "v_proj", "o_proj"),
    rename("blocks.{i}.norm1", f"{_IN_MEMORY}.layernorm_before"),
    rename("blocks.{i}.norm2", f"{_IN_MEMORY}.layernorm_after"),
    rename("blocks.{i}.mlp.fc1", f"{_IN_MEMORY}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_IN_MEMORY}.mlp.fc2"),
    rename("norm", "layernorm"),
)
VIT_HEADS: tuple[Rename, ...] = (
    rename("head", "classifier"),  # ViTForImageClassification: one head on the class token
    rename("head", "cls_classifier"),  # DeiTForImageClassificationWithTeacher: class-token head ...
    rename("head_dist", "distillation_classifier"),  # ... and distillation-token head, logits averaged
)
DINOV2_RULES = (
    rename("cls_token", "embeddings.cls_token"),
    rename("reg_token", "embeddings.register_tokens"),  # (1, R, D) both
    rename("pos_embed", "embeddings.position_embeddings"),  # (1, 1 + N, D): see HfViTLayout for registers
    rename("patch_embed.proj", "embeddings.patch_embeddings.projection"),
    rename("blocks.{i}.norm1", f"{_ON_DISK}.norm1"),
    *_VIT_ATTENTION,  # DINOv2's blocks are named as ViT's
    rename("blocks.{i}.ls1.gamma", f"{_ON_DISK}.layer_scale1.lambda1"),
    rename("blocks.{i}.norm2", f"{_ON_DISK}.norm2"),
    rename("blocks.{i}.mlp.fc1", f"{_ON_DISK}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_ON_DISK}.mlp.fc2"),
    rename("blocks.{i}.ls2.gamma", f"{_ON_DISK}.layer_scale2.lambda1"),
    rename("norm", "layernorm"),
    # inside transformers 5 models
    *attention_rules(f"{_ON_DISK}.attention", "q_proj", "k_proj", "v_proj", "o_proj"),
)


class HfViTLayout(Layout):
    """transformers' ViT layouts, with the two conversions that span tensors:
    - SigLIP's pooling head holds q, k and v in one in_proj (3D, D); vitkit's (timm's) `AttentionPool` holds the
      probe's q (D, D) and the tokens' kv (2D, D): split on import, joined on export.
    - Dinov2WithRegistersModel gives the class token a position row (its table is 1 + N rows; registers have
      none). vitkit's (timm's) DINOv2 with registers has no row for any prefix token (`no_embed_class`): the class
      token's row is added to the class token on import, which is exact at every image size (the row is never
      resampled), and exported as a zero row.
    - ViTDet's table keeps a row for a class token it does not have: dropped on import.
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
        if "pos_embed" in out and any(self.strip(key) == VITDET_MARKER for key in state):
            out["pos_embed"] = out["pos_embed"][:, 1:]  # ViTDet's: (1, 1 + N, D), an unused class row first
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


HF_COMMON = dict(  # what every transformers ViT table shares
    family="vit",
    markers=("embeddings.patch_embeddings.projection.weight", "embeddings.position_embeddings"),
    other_markers=(
        ("embeddings.patch_embedding.weight", "embeddings.position_embedding.weight"),
        (VITDET_MARKER, "embeddings.position_embeddings"),
    ),
    strip_prefixes=("vit.", "deit.", "dinov2.", "vision_model."),
    dropped=(
        "pooler",  # ViTModel / DeiTModel's tanh pooler over the class token: no vitkit counterpart
        "embeddings.mask_token",  # DINOv2's masked-image-modelling token: training only
        "embeddings.position_ids",  # CLIP's index buffer in older files
        # a CLIPModel's / SiglipModel's text tower and the projections into the joint space: vitkit reads the image
        # tower
        "text_model",
        "text_projection",
        "visual_projection",
        "logit_scale",
        "logit_bias",
    ),
)
# Export writes one class's names.
HF_VIT = HfViTLayout(format="hf", rules=VIT_BODY + VIT_HEADS, **HF_COMMON)
HF_DEIT = HfViTLayout(format="hf", rules=VIT_BODY + VIT_HEADS[1:], **HF_COMMON)
HF_DINOV2 = HfViTLayout(format="hf", rules=DINOV2_RULES, **HF_COMMON)


def mlp_ratio_of(hidden: int, intermediate: int, source: str) -> float:
    """The MLP ratio of a transformers config's hidden and intermediate sizes; ValueError when no ratio gives it."""
    mlp_ratio = intermediate / hidden
    if int(hidden * mlp_ratio) != intermediate:
        raise ValueError(f"{source}: intermediate_size {intermediate} is not reachable as hidden_size x mlp_ratio")
    return mlp_ratio


def patch_size_of(hf: dict[str, Any], default: int, source: str) -> int:
    """A transformers config's patch_size (`default` when absent); ValueError for a patch that is not square."""
    patch = square(hf.get("patch_size", default), "patch_size", source)
    if not isinstance(patch, int):
        raise ValueError(f"{source}: patch_size {hf['patch_size']} is not square; vitkit patches are p x p")
    return patch


def no_classifier(keys: set[str], source: str, what: str) -> None:
    """ValueError for a transformers checkpoint with a `classifier` whose reading vitkit's ViT heads do not compute
    (`what`), saying how to use its backbone."""
    if "classifier.weight" in {HF_VIT.strip(k) for k in keys}:
        raise ValueError(
            f"{source}: {what}, which vitkit's ViT heads do not compute; load its backbone into a ViT built from "
            "the directory with num_classes=0 (vitkit.load_weights(model, path, strict=False) reports the head "
            "left out), then fine-tune a new head"
        )


def config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT/DeiT config equal to a transformers ViT/DeiT config.

    Args:
        hf: the parsed `config.json` (model_type "vit" or "deit"); absent fields take transformers' defaults.
        keys: the checkpoint's keys, which say which heads the saved class had.
        source: the file named in errors.
    """
    distilled = hf["model_type"] == "deit"
    stripped = {HF_VIT.strip(k) for k in keys}
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
        patch_size=patch_size_of(hf, 16, source),
        in_chans=hf.get("num_channels", 3),
        num_classes=num_labels(hf) if has_head else 0,
        embed_dim=hidden,
        depth=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        mlp_ratio=mlp_ratio_of(hidden, hf.get("intermediate_size", 3072), source),
        qkv_bias=hf.get("qkv_bias", True),
        distilled=distilled,
        drop_rate=hf.get("hidden_dropout_prob", 0.0),
        attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        act=act_of(hf, source),
    )


def config_from_dinov2(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `Dinov2Model` / `Dinov2WithRegistersModel` (model_type "dinov2" /
    "dinov2_with_registers"): LayerScale, registers after the class token with no position row, any image size
    (the table resampled as transformers does: plain bicubic for Dinov2Model, antialiased with registers)."""
    no_classifier(keys, source, "Dinov2ForImageClassification's head reads the class token and the mean patch")
    if hf.get("use_swiglu_ffn", False):
        raise ValueError(f"{source}: use_swiglu_ffn (DINOv2's giant) is not supported; vitkit's MLP is fc1-act-fc2")
    registers = hf.get("num_register_tokens", 4) if hf["model_type"] == "dinov2_with_registers" else 0
    return ViTConfig(
        img_size=square(hf.get("image_size", 224), "image_size", source),
        patch_size=patch_size_of(hf, 16 if registers else 14, source),
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


def vit_to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A ViT as transformers' `ViTForImageClassification` (`DeiTForImageClassificationWithTeacher` when distilled),
    or without a classifier `ViTModel` (`DeiTModel`): (state, config.json)."""
    check_hf_export(config)
    layout = HF_DEIT if config.distilled else HF_VIT
    base, prefix = ("DeiT", "deit.") if config.distilled else ("ViT", "vit.")
    if config.num_classes == 0:
        architecture, prefix = f"{base}Model", ""
    else:
        architecture = base + ("ForImageClassificationWithTeacher" if config.distilled else "ForImageClassification")
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
    return prefix_encoder(layout.from_vitkit(state), layout, prefix), hf


def dinov2_to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A ViT with LayerScale as transformers' `Dinov2Model` (`Dinov2WithRegistersModel` with registers): (state,
    config.json)."""
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
        "image_size": square_size(config, library),
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "layerscale_value": config.init_values,
        "use_swiglu_ffn": False,
        **({"num_register_tokens": config.reg_tokens} if registers else {}),
    }
    return HF_DINOV2.from_vitkit(state, config), hf
