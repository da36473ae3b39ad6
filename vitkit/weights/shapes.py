"""What a state dict in vitkit's (timm's) names says about the model it came from: the config fields its tensor
shapes and key counts fix (widths, depths, patch size, heads, ...), per family.

Loading compares these fields between a checkpoint and the model before the key-by-key check, so a checkpoint of
another size is reported as "a ViT with embed_dim 192, the model has 384" with the fields to set and the registered
models of that size, not as dozens of shape mismatches. A field that a state dict does not fix (dropout rates,
LayerNorm eps, the number of heads of a ViT) is not listed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from vitkit.models.registry import list_models, model_entry

State = Mapping[str, torch.Tensor]

# Family name -> how people write it in messages.
DISPLAY_NAMES = {"vit": "ViT", "swin": "Swin", "botnet": "BoTNet", "detr": "DETR"}


def _count(state: State, pattern: str) -> int:
    """1 + the largest index the first group of `pattern` takes among the keys (0 when none matches)."""
    found = [int(m.group(1)) for k in state if (m := re.match(pattern, k))]
    return max(found) + 1 if found else 0


def _per_stage(state: State, stage: str, block: str) -> tuple[int, ...]:
    """Blocks per stage, for keys `{stage}.{s}` + `{block}.{b}.` (e.g. "layers", ".blocks")."""
    return tuple(_count(state, rf"{stage}\.{s}{block}\.(\d+)\.") for s in range(_count(state, rf"{stage}\.(\d+)\.")))


def _conv_fields(weight: torch.Tensor | None, width: str) -> dict[str, Any]:
    """A patch or stem convolution (out, in, k, k): the width it sets, the image channels and the patch side."""
    if weight is None or weight.ndim != 4:
        return {}
    return {width: weight.shape[0], "in_chans": weight.shape[1], "patch_size": weight.shape[-1]}


def vit_fields(state: State) -> dict[str, Any]:
    fields = _conv_fields(state.get("patch_embed.proj.weight"), "embed_dim")
    if depth := _count(state, r"blocks\.(\d+)\."):
        fields["depth"] = depth
    fc1 = state.get("blocks.0.mlp.fc1.weight")
    if fc1 is not None and fc1.ndim == 2:
        fields["mlp_ratio"] = fc1.shape[0] / fc1.shape[1]  # (hidden, D)
    if fields:
        fields["class_token"] = "cls_token" in state
        fields["distilled"] = "dist_token" in state
        fields["qkv_bias"] = "blocks.0.attn.qkv.bias" in state
    return fields


def swin_fields(state: State) -> dict[str, Any]:
    fields = _conv_fields(state.get("patch_embed.proj.weight"), "embed_dim")
    if depths := _per_stage(state, "layers", ".blocks"):
        fields["depths"] = depths
        tables = [state.get(f"layers.{s}.blocks.0.attn.relative_position_bias_table") for s in range(len(depths))]
        if all(t is not None and t.ndim == 2 for t in tables):
            fields["num_heads"] = tuple(t.shape[1] for t in tables)  # ((2M - 1)^2, heads) per stage
            side = math.isqrt(tables[0].shape[0])
            if side * side == tables[0].shape[0]:
                fields["window_size"] = (side + 1) // 2  # stage 0 keeps the configured window
    return fields


def botnet_fields(state: State) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    stem = state.get("stem.conv1.conv.weight")
    if stem is not None and stem.ndim == 4:
        fields["in_chans"] = stem.shape[1]
    if depths := _per_stage(state, "stages", ""):
        fields["depths"] = depths
        fields["bot_depths"] = tuple(
            sum(f"stages.{s}.{b}.self_attn.qkv.weight" in state for b in range(n)) for s, n in enumerate(depths)
        )
        last = [state.get(f"stages.{s}.0.conv3_1x1.conv.weight") for s in range(len(depths))]
        if all(w is not None for w in last):
            fields["widths"] = tuple(w.shape[0] for w in last)
    return fields


def detr_fields(state: State) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    conv1 = state.get("backbone.conv1.weight")
    if conv1 is not None and conv1.ndim == 4:
        fields.update(in_chans=conv1.shape[1], backbone_width=conv1.shape[0])
    if depths := tuple(_count(state, rf"backbone\.layer{s}\.(\d+)\.") for s in range(1, 5)):
        if all(depths):
            fields["backbone_depths"] = depths
            fields["backbone_block"] = "bottleneck" if "backbone.layer1.0.conv3.weight" in state else "basic"
    if (proj := state.get("input_proj.weight")) is not None:
        fields["hidden_dim"] = proj.shape[0]
    if (queries := state.get("query_embed.weight")) is not None:
        fields["num_queries"] = queries.shape[0]
    for name, prefix in (("enc_layers", "encoder"), ("dec_layers", "decoder")):
        if count := _count(state, rf"{prefix}\.layers\.(\d+)\."):
            fields[name] = count
    if (fc1 := state.get("encoder.layers.0.mlp.fc1.weight")) is not None:
        fields["dim_feedforward"] = fc1.shape[0]
    return fields


FIELD_READERS: dict[str, Callable[[State], dict[str, Any]]] = {
    "vit": vit_fields,
    "swin": swin_fields,
    "botnet": botnet_fields,
    "detr": detr_fields,
}


def read_fields(family: str, state: State) -> dict[str, Any]:
    """The config fields of `family` that the tensors of `state` (vitkit's names) fix; {} for an unknown family."""
    reader = FIELD_READERS.get(family)
    return reader(state) if reader else {}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=1e-6)
    return a == b


def differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields both sides fix that differ: name -> (theirs, ours), in `theirs`'s order."""
    return {k: (v, ours[k]) for k, v in theirs.items() if k in ours and not _same(v, ours[k])}


def models_with(family: str, fields: Mapping[str, Any]) -> list[str]:
    """Registered models of `family` whose config has every one of `fields` (the model's num_classes aside)."""
    names = []
    for name in list_models():
        entry = model_entry(name)
        config = entry.config
        if entry.family == family and all(
            k == "num_classes" or (hasattr(config, k) and _same(v, getattr(config, k))) for k, v in fields.items()
        ):
            names.append(name)
    return names


def describe(family: str, fields: Mapping[str, Any]) -> str:
    """The checkpoint in words, e.g. 'a ViT with embed_dim 192' or 'a Swin with embed_dim 96, depths (2, 2, 6, 2)'."""
    listed = ", ".join(f"{k} {show_value(v)}" for k, v in fields.items())
    return f"a {DISPLAY_NAMES.get(family, family)} with {listed}"


def show_value(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, list | tuple) else str(value)


__all__ = ["DISPLAY_NAMES", "FIELD_READERS", "describe", "differences", "models_with", "read_fields", "show_value"]
