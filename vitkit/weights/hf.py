"""Hugging Face transformers' layouts: ViT, DeiT, Swin and DETR checkpoints and configs <-> vitkit.

Covers `ViTModel`, `ViTForImageClassification`, `DeiTModel`, `DeiTForImageClassificationWithTeacher`,
`SwinModel`, `SwinForImageClassification` and `DetrForObjectDetection`, as written by their `save_pretrained`
(the names below, under a `vit.` / `deit.` / `swin.` / `model.` prefix when heads sit beside the encoder) and as
named inside transformers 5 models (`attention.q_proj`, `mlp.fc1`, ...), which import accepts too. A family adds its
table to `LAYOUTS` and its config translations to `CONFIG_READERS` / `EXPORTERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vitkit.models.detr import DetrConfig
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


def labels(num_classes: int, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """`id2label` and `label2id` for a config.json: the class names, or transformers' default LABEL_i."""
    if num_classes == 0:
        return {}
    names = names if names is not None else tuple(f"LABEL_{i}" for i in range(num_classes))
    return {
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def class_names(hf: dict[str, Any], source: str) -> tuple[str, ...] | None:
    """The class names in a transformers config's `id2label`, in label order; None when it has none or only the
    default LABEL_i names (which say nothing about the classes)."""
    id2label = hf.get("id2label")
    if not id2label:
        return None
    if not isinstance(id2label, dict):
        raise ValueError(f"{source}: id2label must be an object of index -> name, got {type(id2label).__name__}")
    try:
        by_index = {int(k): v for k, v in id2label.items()}
    except ValueError as err:
        raise ValueError(f"{source}: id2label keys must be class indices, got {sorted(id2label)[:5]}") from err
    if sorted(by_index) != list(range(len(by_index))) or not all(isinstance(v, str) for v in by_index.values()):
        raise ValueError(f"{source}: id2label must map the indices 0..{len(by_index) - 1} to names")
    names = tuple(by_index[i] for i in range(len(by_index)))
    return None if names == tuple(f"LABEL_{i}" for i in range(len(names))) else names


PREPROCESSOR_NAME = "preprocessor_config.json"


def image_processor(config: Any, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> dict | None:
    """A `preprocessor_config.json` for transformers' `ViTImageProcessor` (ViT, DeiT and Swin checkpoints use it):
    resize to the model's size, scale by 1/255, normalise with `mean` / `std`. None for other families or an
    unknown normalisation."""
    if mean is None or std is None or not isinstance(config, ViTConfig | SwinConfig):
        return None
    H, W = (config.img_size, config.img_size) if isinstance(config.img_size, int) else config.img_size
    channels = config.in_chans
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": H, "width": W},
        "resample": 2,  # PIL's bilinear, as vitkit's evaluation resize
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _per_channel(mean, channels),
        "image_std": _per_channel(std, channels),
    }


def _per_channel(values: tuple[float, ...], channels: int) -> list[float]:
    """Statistics for `channels`, as vitkit's normalisation adapts them: one value repeated, or colour averaged."""
    if len(values) == channels:
        return list(values)
    return list(values) * channels if len(values) == 1 else [sum(values) / len(values)] * channels


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
        **labels(config.num_classes),
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
        **labels(config.num_classes),
    }
    return _prefix_encoder(SWIN.from_vitkit(state), SWIN, "swin." if config.num_classes else ""), hf


# --- DETR ---------------------------------------------------------------------------------------------------------
# `DetrForObjectDetection`: the model under `model.` (stripped), its heads beside it. transformers 4 (and the files
# transformers 5 writes) name the backbone `backbone.conv_encoder.model`, the attention output `out_proj` and the
# feed-forward `fc1` / `fc2`; inside transformers 5 models they are `backbone.model`, `o_proj`, `mlp.fc1` / `mlp.fc2`.
_DETR_BACKBONES = ("backbone.conv_encoder.model", "backbone.model")  # on disk, in memory


def _detr_native_backbone(prefix: str) -> tuple[Rename, ...]:
    """transformers' own ResNet (`ResNetBackbone`) under `prefix`: the same convolutions and norms as torchvision's,
    named by stage and position; stages count from 0 (`encoder.stages.t`), torchvision's from 1 (`layer{t + 1}`), and
    a block's convs and norms from 0 (`layer.j`), torchvision's from 1 (`conv{j + 1}`, `bn{j + 1}`)."""
    stage = f"{prefix}.encoder.stages.{{t}}.layers.{{b}}"
    conv_ours = {"to_ours": lambda i: {"s": i["t"] + 1, "b": i["b"], "n": i["j"] + 1}}
    conv_theirs = {"to_theirs": lambda i: {"t": i["s"] - 1, "b": i["b"], "j": i["n"] - 1}}
    shortcut = {
        "to_ours": lambda i: {"s": i["t"] + 1, "b": i["b"]},
        "to_theirs": lambda i: {"t": i["s"] - 1, "b": i["b"]},
    }
    return (
        rename("backbone.conv1", f"{prefix}.embedder.embedder.convolution"),  # (w0, C, 7, 7) both
        rename("backbone.bn1", f"{prefix}.embedder.embedder.normalization"),
        rename("backbone.layer{s}.{b}.conv{n}", f"{stage}.layer.{{j}}.convolution", **conv_ours, **conv_theirs),
        rename("backbone.layer{s}.{b}.bn{n}", f"{stage}.layer.{{j}}.normalization", **conv_ours, **conv_theirs),
        rename("backbone.layer{s}.{b}.downsample.0", f"{stage}.shortcut.convolution", **shortcut),
        rename("backbone.layer{s}.{b}.downsample.1", f"{stage}.shortcut.normalization", **shortcut),
    )


def _detr_timm_backbone(prefix: str) -> tuple[Rename, ...]:
    """timm's ResNet under `prefix`: torchvision's names (conv1, bn1, layer1..4), which vitkit's backbone keeps."""
    return (rename("backbone", prefix),)


def _detr_body(out_proj: str, ffn: str) -> tuple[Rename, ...]:
    """The transformer and heads, with the attention output named `out_proj` and the feed-forward under `ffn`."""
    enc, dec = "encoder.layers.{i}", "decoder.layers.{i}"

    def attention(ours: str, theirs: str) -> tuple[Rename, ...]:
        # Separate q, k, v Linears (D, D) each, concatenated along dim 0 into the fused qkv (3D, D), rows q | k | v
        # (nn.MultiheadAttention's in_proj layout); biases (D,) each -> (3D,).
        qkv = rename(f"{ours}.qkv", f"{theirs}.q_proj", f"{theirs}.k_proj", f"{theirs}.v_proj")
        return qkv, rename(f"{ours}.proj", f"{theirs}.{out_proj}")

    return (
        rename("input_proj", "input_projection"),  # Conv2d (D, C5, 1, 1) both
        rename("query_embed", "query_position_embeddings"),  # Embedding (Q, D) both
        *attention(f"{enc}.self_attn", f"{enc}.self_attn"),
        rename(f"{enc}.norm1", f"{enc}.self_attn_layer_norm"),
        rename(f"{enc}.mlp.fc1", f"{enc}.{ffn}fc1"),
        rename(f"{enc}.mlp.fc2", f"{enc}.{ffn}fc2"),
        rename(f"{enc}.norm2", f"{enc}.final_layer_norm"),
        *attention(f"{dec}.self_attn", f"{dec}.self_attn"),
        rename(f"{dec}.norm1", f"{dec}.self_attn_layer_norm"),
        *attention(f"{dec}.cross_attn", f"{dec}.encoder_attn"),
        rename(f"{dec}.norm2", f"{dec}.encoder_attn_layer_norm"),
        rename(f"{dec}.mlp.fc1", f"{dec}.{ffn}fc1"),
        rename(f"{dec}.mlp.fc2", f"{dec}.{ffn}fc2"),
        rename(f"{dec}.norm3", f"{dec}.final_layer_norm"),
        rename("decoder.norm", "decoder.layernorm"),  # the final norm shared by every decoder layer's output
        rename("class_embed", "class_labels_classifier"),  # (K + 1, D) both, the last row "no object"
        rename("bbox_embed", "bbox_predictor"),  # layers.0..2 both
    )


_DETR_COMMON = dict(
    format="hf",
    family="detr",
    markers=("input_projection.weight", "query_position_embeddings.weight"),
    strip_prefixes=("model.",),
)
_DETR_HEADS = ("class_labels_classifier", "bbox_predictor")  # beside `model.` in DetrForObjectDetection
# Import: either backbone, either naming (the native backbone's rules first: the timm rule takes any name under the
# prefix). Export: the files' names, with the backbone the config can express.
DETR = Layout(
    rules=(
        *(r for prefix in _DETR_BACKBONES for r in _detr_native_backbone(prefix)),
        *(r for prefix in _DETR_BACKBONES for r in _detr_timm_backbone(prefix)),
        *_detr_body("out_proj", ""),
        *_detr_body("o_proj", "mlp."),
    ),
    **_DETR_COMMON,
)
DETR_TIMM = Layout(rules=_detr_timm_backbone(_DETR_BACKBONES[0]) + _detr_body("out_proj", ""), **_DETR_COMMON)
DETR_NATIVE = Layout(rules=_detr_native_backbone(_DETR_BACKBONES[0]) + _detr_body("out_proj", ""), **_DETR_COMMON)

# timm's ResNets that transformers' DETR names as `backbone`: (block, blocks per stage), all 64 wide; torchvision's
# ResNets of the same names (facebookresearch/detr's `--backbone`) have the same layout.
TIMM_RESNETS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}


def _detr_backbone_from_hf(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """The vitkit backbone fields for a transformers DETR config's backbone: timm's (`use_timm_backbone`, or a
    `timm_backbone` sub-config, as transformers 5 writes) or transformers' own ResNet (`backbone_config` "resnet")."""
    sub = hf.get("backbone_config")
    if sub is None and not hf.get("use_timm_backbone", True):
        sub = {"model_type": "resnet"}  # transformers' default: its ResNet-50
    if sub is None or sub.get("model_type") == "timm_backbone":
        name = (hf.get("backbone") if sub is None else sub.get("backbone")) or "resnet50"
        if name.split(".")[0] not in TIMM_RESNETS:
            raise ValueError(f"{source}: timm backbone {name!r} is not supported; vitkit reads {sorted(TIMM_RESNETS)}")
        block, depths = TIMM_RESNETS[name.split(".")[0]]
        dilation = bool(hf.get("dilation")) or (sub is not None and sub.get("output_stride") == 16)
        return dict(backbone_block=block, backbone_depths=depths, backbone_width=64, dilation=dilation)
    if sub.get("model_type") != "resnet":
        raise ValueError(f"{source}: backbone {sub.get('model_type')!r} is not supported; vitkit reads ResNets")
    if hf.get("dilation"):
        raise ValueError(f"{source}: dilation with transformers' own ResNet is not supported (transformers neither)")
    block = sub.get("layer_type", "bottleneck")
    depths = tuple(sub.get("depths", (3, 4, 6, 3)))
    width = sub.get("embedding_size", 64)
    expansion = 4 if block == "bottleneck" else 1
    hidden = list(sub.get("hidden_sizes", (256, 512, 1024, 2048)))
    expected = [width * 2**s * expansion for s in range(4)]
    if hidden != expected or sub.get("downsample_in_first_stage") or sub.get("downsample_in_bottleneck"):
        raise ValueError(
            f"{source}: vitkit's backbone is torchvision's ResNet: with embedding_size {width} and {block} blocks its "
            f"hidden_sizes are {expected} (got {hidden}), striding on the 3x3 and not in the first stage"
        )
    if sub.get("hidden_act", "relu") != "relu":
        raise ValueError(f"{source}: backbone hidden_act {sub['hidden_act']!r} is not supported; ResNets use 'relu'")
    return dict(backbone_block=block, backbone_depths=depths, backbone_width=width, dilation=False)


def detr_config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> DetrConfig:
    """The vitkit DETR config equal to a transformers `DetrConfig` (arguments as for `vit_config_from_hf`).

    `auxiliary_loss` becomes `aux_loss`. With it transformers' decoder feeds each layer's normalised output to the
    next layer, which DETR's code does not: vitkit computes DETR's, so such a model's outputs differ from
    transformers' (its released checkpoints have it off).
    """
    for field, allowed in (("position_embedding_type", "sine"), ("activation_function", "relu")):
        if hf.get(field, allowed) != allowed:
            raise ValueError(f"{source}: {field} {hf[field]!r} is not supported; vitkit's DETR uses {allowed!r}")
    pairs = (("encoder_attention_heads", "decoder_attention_heads", 8), ("encoder_ffn_dim", "decoder_ffn_dim", 2048))
    for enc, dec, default in pairs:
        if hf.get(enc, default) != hf.get(dec, default):
            raise ValueError(
                f"{source}: {enc} {hf.get(enc, default)} != {dec} {hf.get(dec, default)}; vitkit's DETR uses one"
            )
    return DetrConfig(
        in_chans=hf.get("num_channels", 3),
        num_classes=_num_labels(hf),
        **_detr_backbone_from_hf(hf, source),
        hidden_dim=hf.get("d_model", 256),
        num_heads=hf.get("encoder_attention_heads", 8),
        enc_layers=hf.get("encoder_layers", 6),
        dec_layers=hf.get("decoder_layers", 6),
        dim_feedforward=hf.get("encoder_ffn_dim", 2048),
        drop_rate=float(hf.get("dropout", 0.1)),
        attn_drop_rate=float(hf.get("attention_dropout", 0.0)),
        num_queries=hf.get("num_queries", 100),
        aux_loss=bool(hf.get("auxiliary_loss", False)),
    )


def resnet_name(config: DetrConfig) -> str | None:
    """timm's (and torchvision's) name for the config's backbone, or None when it is no standard ResNet."""
    if config.backbone_width != 64:
        return None
    layout = (config.backbone_block, tuple(config.backbone_depths))
    return next((name for name, known in TIMM_RESNETS.items() if known == layout), None)


def detr_to_hf(config: DetrConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit DETR state dict and config as transformers writes a `DetrForObjectDetection`.

    A standard ResNet (18 / 34 / 50 / 101 / 152, 64 wide) is written as timm's backbone, as transformers' DETR
    checkpoints are; any other width or depth as transformers' own ResNet, which cannot dilate (no DC5).
    `auxiliary_loss` is written False (see `detr_config_from_hf`), so transformers computes the same outputs.
    """
    timm_name = resnet_name(config)
    if timm_name is None and config.dilation:
        raise ValueError(
            "transformers' DETR dilates (DC5) timm's ResNets only (18, 34, 50, 101, 152 at width 64); this backbone is "
            f"{config.backbone_block} {config.backbone_depths} at width {config.backbone_width}"
        )
    layout = DETR_TIMM if timm_name else DETR_NATIVE
    renamed = {(k if k.split(".")[0] in _DETR_HEADS else "model." + k): v for k, v in layout.from_vitkit(state).items()}
    hf: dict[str, Any] = {
        "architectures": ["DetrForObjectDetection"],
        "model_type": "detr",
        "num_channels": config.in_chans,
        "d_model": config.hidden_dim,
        "encoder_layers": config.enc_layers,
        "decoder_layers": config.dec_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.dim_feedforward,
        "decoder_ffn_dim": config.dim_feedforward,
        "activation_function": "relu",
        "dropout": config.drop_rate,
        "attention_dropout": config.attn_drop_rate,
        "activation_dropout": config.drop_rate,
        "num_queries": config.num_queries,
        "position_embedding_type": "sine",
        "auxiliary_loss": False,
        "dilation": config.dilation,
        "use_pretrained_backbone": False,
        **labels(config.num_classes),
    }
    if timm_name:
        hf.update(use_timm_backbone=True, backbone=timm_name, backbone_config=None)
    else:
        w, expansion = config.backbone_width, 4 if config.backbone_block == "bottleneck" else 1
        hf.update(
            use_timm_backbone=False,
            backbone_config={
                "model_type": "resnet",
                "num_channels": config.in_chans,
                "embedding_size": w,
                "hidden_sizes": [w * 2**s * expansion for s in range(4)],
                "depths": list(config.backbone_depths),
                "layer_type": config.backbone_block,
                "hidden_act": "relu",
                "downsample_in_first_stage": False,
                "downsample_in_bottleneck": False,
                "out_features": ["stage4"],
            },
        )
    return renamed, hf


# vitkit family -> its Hugging Face layout (import).
LAYOUTS: dict[str, Layout] = {"vit": VIT, "swin": SWIN, "detr": DETR}
# transformers model_type -> (vitkit family, config reader); vitkit config class -> exporter.
CONFIG_READERS: dict[str, tuple[str, Callable[[dict[str, Any], set[str], str], Any]]] = {
    "vit": ("vit", vit_config_from_hf),
    "deit": ("vit", vit_config_from_hf),
    "swin": ("swin", swin_config_from_hf),
    "detr": ("detr", detr_config_from_hf),
}
EXPORTERS: dict[type, Callable[[Any, State], tuple[State, dict[str, Any]]]] = {
    ViTConfig: vit_to_hf,
    SwinConfig: swin_to_hf,
    DetrConfig: detr_to_hf,
}
