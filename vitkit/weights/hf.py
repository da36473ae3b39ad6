"""Hugging Face transformers' layouts: ViT, DeiT and Swin checkpoints and configs <-> vitkit.

Covers `ViTModel`, `ViTForImageClassification`, `DeiTModel`, `DeiTForImageClassificationWithTeacher`,
`SwinModel` and `SwinForImageClassification`, as written by their `save_pretrained` (the names below,
under a `vit.` / `deit.` / `swin.` prefix when a classifier sits beside the encoder) and as named inside
transformers 5 models (`attention.q_proj`, `mlp.fc1`, ...), which import accepts too. A family adds its
table to `LAYOUTS` and its config translations to `CONFIG_READERS` / `EXPORTERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vitkit.models.swin import SwinConfig
from vitkit.models.vit import ViTConfig
from vitkit.weights.limits import check_swin_windows
from vitkit.weights.rename import Layout, Rename, rename

State = dict[str, torch.Tensor]


def _square(value: Any, what: str, source: str) -> int | tuple[int, int]:
    if isinstance(value, int):
        return value
    if isinstance(value, list | tuple) and len(value) == 2:
        return value[0] if value[0] == value[1] else (int(value[0]), int(value[1]))
    raise ValueError(f"{source}: {what} must be an int or a pair, got {value!r}")


def _check_act(hf: dict[str, Any], source: str) -> None:
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"{source}: hidden_act {act!r} is not supported; vitkit's MLP uses exact GELU ('gelu')")


def _num_labels(hf: dict[str, Any]) -> int:
    id2label = hf.get("id2label")
    return len(id2label) if id2label else hf.get("num_labels", 2)


def _labels(num_classes: int) -> dict[str, Any]:
    if num_classes == 0:
        return {}
    return {
        "id2label": {str(i): f"LABEL_{i}" for i in range(num_classes)},
        "label2id": {f"LABEL_{i}": i for i in range(num_classes)},
    }


def _prefix_encoder(renamed: State, layout: Layout, prefix: str) -> State:
    """Inside the *ForImageClassification classes the encoder sits under `vit.` / `deit.` / `swin.`; the heads
    stay top level."""
    heads = {r.theirs[0] for r in layout.rules if r.ours.startswith("head")}
    return {(k if k.split(".")[0] in heads else prefix + k): v for k, v in renamed.items()}


_ON_DISK = "encoder.layer.{i}"  # block prefix in files written by save_pretrained
_IN_MEMORY = "layers.{i}"  # block prefix inside transformers 5 models

_VIT_BODY = (
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
_VIT_HEADS: tuple[Rename, ...] = (
    rename("head", "classifier"),  # ViTForImageClassification: one head on the class token
    rename("head", "cls_classifier"),  # DeiTForImageClassificationWithTeacher: class-token head ...
    rename("head_dist", "distillation_classifier"),  # ... and distillation-token head, logits averaged
)
_COMMON = dict(
    family="vit",
    markers=("embeddings.patch_embeddings.projection.weight", "embeddings.position_embeddings"),
    strip_prefixes=("vit.", "deit."),
    dropped=("pooler",),  # ViTModel / DeiTModel's tanh pooler over the class token: no vitkit counterpart
)


def check_vit_export(config: ViTConfig) -> None:
    """ValueError for ViT configurations transformers' ViT / DeiT cannot express."""
    problems = []
    if not config.class_token or config.global_pool != "token":
        problems.append("a class token read by the head (no mean pooling)")
    if config.init_values is not None:
        problems.append("no LayerScale (init_values=None)")
    if problems:
        raise ValueError("transformers' ViT / DeiT needs " + "; ".join(problems))


# Import accepts every name in either table; export writes ViT's `classifier` or DeiT's two heads.
VIT = Layout(format="hf", rules=_VIT_BODY + _VIT_HEADS, **_COMMON)
DEIT = Layout(format="hf", rules=_VIT_BODY + _VIT_HEADS[1:], **_COMMON)


def vit_config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT/DeiT config equal to a transformers ViT/DeiT config.

    Args:
        hf: the parsed `config.json` (model_type "vit" or "deit"); absent fields take transformers' defaults.
        keys: the checkpoint's keys, which say which heads the saved class had.
        source: the file named in errors.
    """
    distilled = hf["model_type"] == "deit"
    stripped = {VIT.strip(k) for k in keys}
    if distilled and "classifier.weight" in stripped:
        raise ValueError(
            f"{source} is a DeiTForImageClassification: a distillation token but one classifier on the class "
            "token, which vitkit's distilled DeiT (two heads, logits averaged) cannot reproduce; load its encoder "
            "with vitkit.load_weights(model, path, reset_head=True) into a distilled model"
        )
    _check_act(hf, source)
    hidden, intermediate = hf.get("hidden_size", 768), hf.get("intermediate_size", 3072)
    mlp_ratio = intermediate / hidden
    if int(hidden * mlp_ratio) != intermediate:
        raise ValueError(f"{source}: intermediate_size {intermediate} is not reachable as hidden_size x mlp_ratio")
    patch = _square(hf.get("patch_size", 16), "patch_size", source)
    if not isinstance(patch, int):
        raise ValueError(f"{source}: patch_size {hf['patch_size']} is not square; vitkit patches are p x p")
    has_head = bool(stripped & {"classifier.weight", "cls_classifier.weight"})
    return ViTConfig(
        img_size=_square(hf.get("image_size", 224), "image_size", source),
        patch_size=patch,
        in_chans=hf.get("num_channels", 3),
        num_classes=_num_labels(hf) if has_head else 0,
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


def vit_to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit ViT/DeiT state dict and config as transformers' `save_pretrained` writes them: (state, config.json).

    A model with a classifier becomes `ViTForImageClassification` (`DeiTForImageClassificationWithTeacher`
    when distilled), one without becomes `ViTModel` (`DeiTModel`).
    """
    check_vit_export(config)
    layout = DEIT if config.distilled else VIT
    base, prefix = ("DeiT", "deit.") if config.distilled else ("ViT", "vit.")
    if config.num_classes == 0:
        architecture, prefix = f"{base}Model", ""
    else:
        architecture = base + ("ForImageClassificationWithTeacher" if config.distilled else "ForImageClassification")
    return _prefix_encoder(layout.from_vitkit(state), layout, prefix), _vit_config_json(config, architecture)


def _vit_config_json(config: ViTConfig, architecture: str) -> dict[str, Any]:
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
        **_labels(config.num_classes),
    }
    return hf


_SWIN_BLOCK = "encoder.layers.{s}.blocks.{b}"
SWIN = Layout(
    format="hf",
    family="swin",
    rules=(
        rename("patch_embed.proj", "embeddings.patch_embeddings.projection"),  # Conv2d (D, C, p, p) both
        rename("patch_embed.norm", "embeddings.norm"),
        rename("layers.{s}.blocks.{b}.norm1", f"{_SWIN_BLOCK}.layernorm_before"),
        # Separate q, k, v Linears (C, C) each, concatenated along dim 0 into the fused qkv (3C, C), rows q, k, v.
        rename(
            "layers.{s}.blocks.{b}.attn.qkv",
            f"{_SWIN_BLOCK}.attention.self.query",
            f"{_SWIN_BLOCK}.attention.self.key",
            f"{_SWIN_BLOCK}.attention.self.value",
        ),
        # ((2M - 1)^2, h) both, rows in the reference order (offset y, then x).
        rename(
            "layers.{s}.blocks.{b}.attn.relative_position_bias_table",
            f"{_SWIN_BLOCK}.attention.self.relative_position_bias_table",
        ),
        rename("layers.{s}.blocks.{b}.attn.proj", f"{_SWIN_BLOCK}.attention.output.dense"),
        rename("layers.{s}.blocks.{b}.norm2", f"{_SWIN_BLOCK}.layernorm_after"),
        rename("layers.{s}.blocks.{b}.mlp.fc1", f"{_SWIN_BLOCK}.intermediate.dense"),
        rename("layers.{s}.blocks.{b}.mlp.fc2", f"{_SWIN_BLOCK}.output.dense"),
        # transformers 5's module names; q, k, v concatenated along dim 0 as above.
        rename(
            "layers.{s}.blocks.{b}.attn.qkv",
            f"{_SWIN_BLOCK}.attention.q_proj",
            f"{_SWIN_BLOCK}.attention.k_proj",
            f"{_SWIN_BLOCK}.attention.v_proj",
        ),
        rename(
            "layers.{s}.blocks.{b}.attn.relative_position_bias_table",
            f"{_SWIN_BLOCK}.attention.relative_position_bias.relative_position_bias_table",
        ),
        rename("layers.{s}.blocks.{b}.attn.proj", f"{_SWIN_BLOCK}.attention.o_proj"),
        rename("layers.{s}.blocks.{b}.mlp.fc1", f"{_SWIN_BLOCK}.mlp.fc1"),
        rename("layers.{s}.blocks.{b}.mlp.fc2", f"{_SWIN_BLOCK}.mlp.fc2"),
        # transformers merges patches at the end of stage t, vitkit (and timm) at the start of stage t + 1.
        rename(
            "layers.{s}.downsample",
            "encoder.layers.{t}.downsample",
            to_ours=lambda i: {"s": i["t"] + 1},
            to_theirs=lambda i: {"t": i["s"] - 1},
        ),
        rename("norm", "layernorm"),
        rename("head.fc", "classifier"),
    ),
    markers=("embeddings.patch_embeddings.projection.weight", "embeddings.norm.weight"),
    strip_prefixes=("swin.",),
    # Index buffers older transformers saved; vitkit computes the same table.
    dropped=(f"{_SWIN_BLOCK}.attention.self.relative_position_index",),
)


def swin_config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> SwinConfig:
    """The vitkit Swin config equal to a transformers Swin config (arguments as for `vit_config_from_hf`)."""
    _check_act(hf, source)
    if hf.get("use_absolute_embeddings", False):
        raise ValueError(
            f"{source}: use_absolute_embeddings=True is not supported; vitkit's Swin has no absolute table"
        )
    patch = _square(hf.get("patch_size", 4), "patch_size", source)
    if not isinstance(patch, int):
        raise ValueError(f"{source}: patch_size {hf['patch_size']} is not square; vitkit patches are p x p")
    config = SwinConfig(
        img_size=_square(hf.get("image_size", 224), "image_size", source),
        patch_size=patch,
        in_chans=hf.get("num_channels", 3),
        num_classes=_num_labels(hf) if "classifier.weight" in {SWIN.strip(k) for k in keys} else 0,
        embed_dim=hf.get("embed_dim", 96),
        depths=tuple(hf.get("depths", (2, 2, 6, 2))),
        num_heads=tuple(hf.get("num_heads", (3, 6, 12, 24))),
        window_size=hf.get("window_size", 7),
        mlp_ratio=hf.get("mlp_ratio", 4.0),
        qkv_bias=hf.get("qkv_bias", True),
        drop_rate=hf.get("hidden_dropout_prob", 0.0),
        attn_drop_rate=hf.get("attention_probs_dropout_prob", 0.0),
        drop_path_rate=hf.get("drop_path_rate", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
    )
    check_swin_windows(config, f"{source} (transformers' Swin)")
    return config


def swin_to_hf(config: SwinConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit Swin state dict and config as transformers writes them: `SwinForImageClassification`, or
    `SwinModel` without a classifier."""
    check_swin_windows(config, "transformers' Swin")
    img = config.img_size if isinstance(config.img_size, int) else list(config.img_size)
    hf = {
        "architectures": ["SwinForImageClassification" if config.num_classes else "SwinModel"],
        "model_type": "swin",
        "image_size": img,
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "embed_dim": config.embed_dim,
        "depths": list(config.depths),
        "num_heads": list(config.num_heads),
        "window_size": config.window_size,
        "mlp_ratio": config.mlp_ratio,
        "qkv_bias": config.qkv_bias,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "drop_path_rate": config.drop_path_rate,
        "use_absolute_embeddings": False,
        "layer_norm_eps": config.layer_norm_eps,
        "hidden_size": config.embed_dim * 2 ** (len(config.depths) - 1),
        "num_layers": len(config.depths),
        "encoder_stride": config.patch_size * 2 ** (len(config.depths) - 1),
        **_labels(config.num_classes),
    }
    return _prefix_encoder(SWIN.from_vitkit(state), SWIN, "swin." if config.num_classes else ""), hf


# vitkit family -> its Hugging Face layout (import).
LAYOUTS: dict[str, Layout] = {"vit": VIT, "swin": SWIN}
# transformers model_type -> (vitkit family, config reader); vitkit config class -> exporter.
CONFIG_READERS: dict[str, tuple[str, Callable[[dict[str, Any], set[str], str], Any]]] = {
    "vit": ("vit", vit_config_from_hf),
    "deit": ("vit", vit_config_from_hf),
    "swin": ("swin", swin_config_from_hf),
}
EXPORTERS: dict[type, Callable[[Any, State], tuple[State, dict[str, Any]]]] = {
    ViTConfig: vit_to_hf,
    SwinConfig: swin_to_hf,
}
