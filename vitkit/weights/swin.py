"""Swin weights: vitkit's (timm's) own names, torchvision's `SwinTransformer` and Hugging Face transformers' Swin
<-> vitkit.

vitkit's Swin keeps timm's parameter names, so timm's `swin_*` state dicts load unchanged; nothing is fitted to
another image size (the windows and their bias tables are fixed). Where a stage's map is smaller than the window,
vitkit (as timm) shrinks the window and its bias table to the map, which torchvision's and transformers' Swin do not:
such models are not exported to them (`check_windows`).

torchvision's Swin (v1: swin_t, ...) is the reference Swin with LayerNorm eps 1e-5, so its weights give equal outputs
in the vitkit model of the same size (swin_t -> `swin_tiny_patch4_window7_224`).

transformers: `SwinModel` and `SwinForImageClassification`, as written by their `save_pretrained` (the names below,
under a `swin.` prefix when the classifier sits beside the encoder) and as named inside transformers 5 models
(`attention.q_proj`, `mlp.fc1`, ...), which import accepts too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vitkit.models.swin import SwinConfig
from vitkit.weights.family import FamilyWeights, State
from vitkit.weights.hf import check_act, labels, num_labels, prefix_encoder, square
from vitkit.weights.rename import Indices, Layout, Rename, rename
from vitkit.weights.shapes import conv_fields, per_stage


def _stage_sizes(img_size: int | tuple[int, int], patch_size: int, stages: int) -> list[tuple[int, int]]:
    """A Swin model's map size per stage at its image size."""
    H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
    return [(H // patch_size // 2**s, W // patch_size // 2**s) for s in range(stages)]


def check_windows(config: SwinConfig, target: str) -> None:
    """ValueError when a stage's map is smaller than the window: vitkit then shrinks the window and its bias table
    to the map (as timm does), where `target` keeps the full window."""
    for s, (H, W) in enumerate(_stage_sizes(config.img_size, config.patch_size, len(config.depths))):
        if min(H, W) < config.window_size:
            raise ValueError(
                f"{target} keeps window_size {config.window_size} at every stage, but stage {s} of this model is "
                f"{H}x{W} (its window and bias table shrink to the map); use a larger img_size or window_size <= {H}"
            )


def read_fields(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The config fields a Swin state dict fixes: width, channels, patch size, depths, heads, window size."""
    fields = conv_fields(state.get("patch_embed.proj.weight"), "embed_dim")
    if depths := per_stage(state, "layers", ".blocks"):
        fields["depths"] = depths
        tables = [state.get(f"layers.{s}.blocks.0.attn.relative_position_bias_table") for s in range(len(depths))]
        if all(t is not None and t.ndim == 2 for t in tables):
            fields["num_heads"] = tuple(t.shape[1] for t in tables)  # ((2M - 1)^2, heads) per stage
            side = math.isqrt(tables[0].shape[0])
            if side * side == tables[0].shape[0]:
                fields["window_size"] = (side + 1) // 2  # stage 0 keeps the configured window
    return fields


# --- torchvision ------------------------------------------------------------------------------------------------------
def check_torchvision_export(config: SwinConfig) -> None:
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
    check_windows(config, "torchvision's SwinTransformer")


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


def _tv_block(ours: str, theirs: str) -> Rename:
    """A rule inside a block: vitkit `layers.{s}.blocks.{b}.<ours>` <- torchvision `features.{f}.{b}.<theirs>`."""
    return rename(
        f"layers.{{s}}.blocks.{{b}}.{ours}",
        f"features.{{f}}.{{b}}.{theirs}",
        to_ours=_stage_of_blocks,
        to_theirs=_blocks_of_stage,
    )


def _tv_index_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """torchvision stores each block's relative position index, flattened (N*N,); vitkit computes it (N, N)."""
    return {
        # (N, N) -> (N*N,)
        f"features.{2 * s + 1}.{b}.attn.relative_position_index": block.attn.relative_position_index.flatten()
        for s, stage in enumerate(model.layers)
        for b, block in enumerate(stage.blocks)
    }


TORCHVISION = Layout(
    format="torchvision",
    family="swin",
    rules=(
        rename("patch_embed.proj", "features.0.0"),  # Conv2d (D, C, p, p) both; [0][1] is a Permute to NHWC
        rename("patch_embed.norm", "features.0.2"),
        _tv_block("norm1", "norm1"),
        _tv_block("attn.qkv", "attn.qkv"),  # fused (3C, C) both, rows q, k, v
        _tv_block("attn.relative_position_bias_table", "attn.relative_position_bias_table"),  # ((2M-1)^2, h)
        _tv_block("attn.proj", "attn.proj"),
        _tv_block("norm2", "norm2"),
        _tv_block("mlp.fc1", "mlp.0"),  # MLP: 0 Linear, 1 GELU, 2 Dropout, 3 Linear
        _tv_block("mlp.fc2", "mlp.3"),
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
    check_export=check_torchvision_export,
    export_buffers=_tv_index_buffers,
)


# --- Hugging Face transformers ----------------------------------------------------------------------------------------
_HF_BLOCK = "encoder.layers.{s}.blocks.{b}"
HF = Layout(
    format="hf",
    family="swin",
    rules=(
        rename("patch_embed.proj", "embeddings.patch_embeddings.projection"),  # Conv2d (D, C, p, p) both
        rename("patch_embed.norm", "embeddings.norm"),
        rename("layers.{s}.blocks.{b}.norm1", f"{_HF_BLOCK}.layernorm_before"),
        # Separate q, k, v Linears (C, C) each, concatenated along dim 0 into the fused qkv (3C, C), rows q, k, v.
        rename(
            "layers.{s}.blocks.{b}.attn.qkv",
            f"{_HF_BLOCK}.attention.self.query",
            f"{_HF_BLOCK}.attention.self.key",
            f"{_HF_BLOCK}.attention.self.value",
        ),
        # ((2M - 1)^2, h) both, rows in the reference order (offset y, then x).
        rename(
            "layers.{s}.blocks.{b}.attn.relative_position_bias_table",
            f"{_HF_BLOCK}.attention.self.relative_position_bias_table",
        ),
        rename("layers.{s}.blocks.{b}.attn.proj", f"{_HF_BLOCK}.attention.output.dense"),
        rename("layers.{s}.blocks.{b}.norm2", f"{_HF_BLOCK}.layernorm_after"),
        rename("layers.{s}.blocks.{b}.mlp.fc1", f"{_HF_BLOCK}.intermediate.dense"),
        rename("layers.{s}.blocks.{b}.mlp.fc2", f"{_HF_BLOCK}.output.dense"),
        # transformers 5's module names; q, k, v concatenated along dim 0 as above.
        rename(
            "layers.{s}.blocks.{b}.attn.qkv",
            f"{_HF_BLOCK}.attention.q_proj",
            f"{_HF_BLOCK}.attention.k_proj",
            f"{_HF_BLOCK}.attention.v_proj",
        ),
        rename(
            "layers.{s}.blocks.{b}.attn.relative_position_bias_table",
            f"{_HF_BLOCK}.attention.relative_position_bias.relative_position_bias_table",
        ),
        rename("layers.{s}.blocks.{b}.attn.proj", f"{_HF_BLOCK}.attention.o_proj"),
        rename("layers.{s}.blocks.{b}.mlp.fc1", f"{_HF_BLOCK}.mlp.fc1"),
        rename("layers.{s}.blocks.{b}.mlp.fc2", f"{_HF_BLOCK}.mlp.fc2"),
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
    dropped=(f"{_HF_BLOCK}.attention.self.relative_position_index",),
)


def config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> SwinConfig:
    """The vitkit Swin config equal to a transformers Swin config (arguments: see
    `vitkit.weights.family.ConfigReader`)."""
    check_act(hf, source)
    if hf.get("use_absolute_embeddings", False):
        raise ValueError(
            f"{source}: use_absolute_embeddings=True is not supported; vitkit's Swin has no absolute table"
        )
    patch = square(hf.get("patch_size", 4), "patch_size", source)
    if not isinstance(patch, int):
        raise ValueError(f"{source}: patch_size {hf['patch_size']} is not square; vitkit patches are p x p")
    config = SwinConfig(
        img_size=square(hf.get("image_size", 224), "image_size", source),
        patch_size=patch,
        in_chans=hf.get("num_channels", 3),
        num_classes=num_labels(hf) if "classifier.weight" in {HF.strip(k) for k in keys} else 0,
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
    check_windows(config, f"{source} (transformers' Swin)")
    return config


def to_hf(config: SwinConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit Swin state dict and config as transformers writes them: `SwinForImageClassification`, or
    `SwinModel` without a classifier."""
    check_windows(config, "transformers' Swin")
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
    return prefix_encoder(HF.from_vitkit(state), HF, "swin." if config.num_classes else ""), hf


WEIGHTS = FamilyWeights(
    input_conv="patch_embed.proj.weight",
    markers=("patch_embed.proj.weight", "layers.0.blocks.0.attn.relative_position_bias_table"),
    head=("head.fc.",),
    layouts=(TORCHVISION, HF),
    read_fields=read_fields,
    hf_model_types={"swin": config_from_hf},
    hf_export=to_hf,
    hf_image_processor=True,
    timm_fixed={"global_pool": "avg"},  # vitkit's Swin averages the last stage's tokens
)
