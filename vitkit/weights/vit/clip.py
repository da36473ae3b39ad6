"""Hugging Face transformers' CLIP and SigLIP image towers <-> vitkit's ViT.

`CLIPVisionModel` (and a `CLIPModel`'s vision tower) and `SiglipVisionModel` (and a `SiglipModel`'s vision tower, and
`SiglipForImageClassification`'s backbone) share their block names. Each reads into the ViT whose `model(x)` is
transformers' `pooler_output` and whose `forward_features(x)` is its `last_hidden_state` (for CLIP, with the final
LayerNorm applied to every token, as vitkit's features are).
"""

from __future__ import annotations

from typing import Any

from vitkit.models.vit import ViTConfig
from vitkit.weights.family import State
from vitkit.weights.hf import act_of, hf_act, square
from vitkit.weights.rename import rename
from vitkit.weights.vit.hf import HF_COMMON, HfViTLayout, mlp_ratio_of, no_classifier, patch_size_of
from vitkit.weights.vit.shared import PLAIN, attention_rules, require, square_size

_BLOCK = "encoder.layers.{i}"  # CLIP's and SigLIP's
_TABLE = (lambda t: t.unsqueeze(0), lambda t: t.squeeze(0))  # their Embedding (T, D) <-> vitkit's table (1, T, D)
_TOKEN = (lambda t: t.reshape(1, 1, -1), lambda t: t.reshape(-1))  # CLIP's class embedding (D,) <-> (1, 1, D)

_BLOCKS = (
    rename("blocks.{i}.norm1", f"{_BLOCK}.layer_norm1"),
    *attention_rules(f"{_BLOCK}.self_attn", "q_proj", "k_proj", "v_proj", "out_proj"),
    rename("blocks.{i}.norm2", f"{_BLOCK}.layer_norm2"),
    rename("blocks.{i}.mlp.fc1", f"{_BLOCK}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_BLOCK}.mlp.fc2"),
    rename("patch_embed.proj", "embeddings.patch_embedding"),  # Conv2d (D, C, p, p); CLIP's without a bias
    rename("pos_embed", "embeddings.position_embedding.weight", values=_TABLE),  # Embedding (T, D) -> (1, T, D)
    rename("norm", "post_layernorm"),
)
CLIP_RULES = (
    rename("cls_token", "embeddings.class_embedding", values=_TOKEN),
    rename("norm_pre", "pre_layrnorm"),  # transformers' spelling
    *_BLOCKS,
)
SIGLIP_RULES = (
    *_BLOCKS,
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
HF_CLIP = HfViTLayout(format="hf", rules=CLIP_RULES, **HF_COMMON)
HF_SIGLIP = HfViTLayout(format="hf", rules=SIGLIP_RULES, **HF_COMMON)


def _vision_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The image tower's settings: a CLIPModel's / SiglipModel's `vision_config`, else the config itself."""
    return (hf.get("vision_config") or {}) if "vision_config" in hf else hf


def _tower_fields(v: dict[str, Any], source: str, patch: int, eps: float, act: str) -> dict[str, Any]:
    """The ViT fields of a CLIP / SigLIP image tower's config (`CLIPVisionConfig`, `SiglipVisionConfig`), their
    defaults where a field is absent; a backbone (num_classes 0)."""
    hidden = v.get("hidden_size", 768)
    return dict(
        img_size=square(v.get("image_size", 224), "image_size", source),
        patch_size=patch_size_of(v, patch, source),
        in_chans=v.get("num_channels", 3),
        num_classes=0,
        embed_dim=hidden,
        depth=v.get("num_hidden_layers", 12),
        num_heads=v.get("num_attention_heads", 12),
        mlp_ratio=mlp_ratio_of(hidden, v.get("intermediate_size", 3072), source),
        attn_drop_rate=v.get("attention_dropout", 0.0),
        layer_norm_eps=v.get("layer_norm_eps", eps),
        act=act_of(v, source, default=act),
    )


def config_from_clip(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `CLIPVisionModel` (model_type "clip_vision_model"), or a `CLIPModel`'s
    image tower ("clip"): a LayerNorm before the blocks, no patch bias, quick GELU unless the config says
    otherwise; `model(x)` is the post-layernormed class token (`pooler_output`, before `visual_projection`)."""
    no_classifier(keys, source, "CLIPForImageClassification's head reads the mean patch token")
    tower = _tower_fields(_vision_config(hf), source, patch=32, eps=1e-5, act="quick_gelu")
    return ViTConfig(**tower, pre_norm=True, patch_bias=False)


def config_from_siglip(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `SiglipVisionModel` (model_type "siglip_vision_model") or a
    `SiglipModel`'s image tower ("siglip"): no class token; attention pooling (`model(x)` is the pooled
    `pooler_output`), or for a tower without the pooling head (`vision_use_head: false`) the mean of the normalised
    tokens."""
    no_classifier(keys, source, "SiglipForImageClassification's head reads the mean token")
    v = _vision_config(hf)
    tower = _tower_fields(v, source, patch=16, eps=1e-6, act="gelu_pytorch_tanh")
    pooled = v.get("vision_use_head", True)
    return ViTConfig(
        **tower, class_token=False, global_pool="map" if pooled else "avg", fc_norm=None if pooled else False
    )


def _tower_json(config: ViTConfig, architecture: str, model_type: str, library: str) -> dict[str, Any]:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": config.embed_dim,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "num_channels": config.in_chans,
        "image_size": square_size(config, library),
        "patch_size": config.patch_size,
        "hidden_act": hf_act(config.act),
        "layer_norm_eps": config.layer_norm_eps,
        "attention_dropout": config.attn_drop_rate,
    }


def clip_to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A ViT with a LayerNorm before the blocks as transformers' `CLIPVisionModel`: (state, config.json)."""
    library = "transformers' CLIPVisionModel"
    fields = {**PLAIN, "act": config.act, "pre_norm": True, "patch_bias": False}
    require(config, library, **fields, class_token=True, global_pool="token", distilled=False, num_classes=0)
    require(config, library, init_values=None, qkv_bias=True)
    renamed = {"vision_model." + k: v for k, v in HF_CLIP.from_vitkit(state, config).items()}
    return renamed, _tower_json(config, "CLIPVisionModel", "clip_vision_model", library)


def siglip_to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A ViT without a class token as transformers' `SiglipVisionModel`: (state, config.json)."""
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
