"""What a state dict in vitkit's (timm's) names says about the model it came from: the config fields its tensor
shapes and key counts fix (widths, depths, patch size, heads, ...). Each family reads its own
(`FamilyWeights.read_fields`, in `vitkit.weights.<family>`) with the helpers here.

Loading compares these fields between a checkpoint and the model before the key-by-key check, so a checkpoint of
another size is reported as "a ViT with embed_dim 192, the model has 384" with the fields to set and the registered
models of that size, not as dozens of shape mismatches. A field that a state dict does not fix (dropout rates,
LayerNorm eps, the number of heads of a ViT) is not listed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from vitkit.models.registry import family, list_models, model_entry

State = Mapping[str, torch.Tensor]


def count(state: State, pattern: str) -> int:
    """1 + the largest index the first group of `pattern` takes among the keys (0 when none matches)."""
    found = [int(m.group(1)) for k in state if (m := re.match(pattern, k))]
    return max(found) + 1 if found else 0


def per_stage(state: State, stage: str, block: str) -> tuple[int, ...]:
    """Blocks per stage, for keys `{stage}.{s}` + `{block}.{b}.` (e.g. "layers", ".blocks")."""
    return tuple(count(state, rf"{stage}\.{s}{block}\.(\d+)\.") for s in range(count(state, rf"{stage}\.(\d+)\.")))


def conv_fields(weight: torch.Tensor | None, width: str) -> dict[str, Any]:
    """A patch or stem convolution (out, in, k, k): the width it sets, the image channels and the patch side."""
    if weight is None or weight.ndim != 4:
        return {}
    return {width: weight.shape[0], "in_chans": weight.shape[1], "patch_size": weight.shape[-1]}


def same(a: Any, b: Any) -> bool:
    """Whether two field values are equal (floats within a relative 1e-6)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=1e-6)
    return a == b


def differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields both sides fix that differ: name -> (theirs, ours), in `theirs`'s order."""
    return {k: (v, ours[k]) for k, v in theirs.items() if k in ours and not same(v, ours[k])}


def models_with(family_name: str, fields: Mapping[str, Any]) -> list[str]:
    """Registered models of `family_name` whose config has every one of `fields` (the model's num_classes aside)."""
    names = []
    for name in list_models():
        entry = model_entry(name)
        config = entry.config
        if entry.family == family_name and all(
            k == "num_classes" or (hasattr(config, k) and same(v, getattr(config, k))) for k, v in fields.items()
        ):
            names.append(name)
    return names


def describe(family_name: str, fields: Mapping[str, Any]) -> str:
    """The checkpoint in words, e.g. 'a ViT with embed_dim 192' or 'a Swin with embed_dim 96, depths (2, 2, 6, 2)'."""
    listed = ", ".join(f"{k} {show_value(v)}" for k, v in fields.items())
    return f"a {family(family_name).display_name} with {listed}"


def show_value(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, list | tuple) else str(value)


__all__ = ["conv_fields", "count", "describe", "differences", "models_with", "per_stage", "same", "show_value"]


def adapt_input_channels(weight: torch.Tensor, channels: int) -> torch.Tensor | None:
    """An RGB checkpoint's input convolution (O, 3, kh, kw) for a model of `channels` input channels, as timm's
    `adapt_input_conv` fits it: summed over R, G and B for one channel (a grey image repeated in R, G and B gives
    what it gave), else repeated and scaled by 3 / channels. None when it is not a 3-channel convolution or the model
    has 3 channels."""
    if weight.ndim != 4 or weight.shape[1] != 3 or channels == 3 or channels < 1:
        return None
    if channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeats = -(-channels // 3)
    return weight.repeat(1, repeats, 1, 1)[:, :channels] * (3 / channels)
