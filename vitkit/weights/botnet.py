"""BoTNet weights: vitkit's own names only, which are timm's (`ByobNet`), so timm's BoTNet state dicts load
unchanged. Nothing is fitted to another image size: the relative position tables fix it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vitkit.weights.family import FamilyWeights
from vitkit.weights.shapes import per_stage


def read_fields(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The config fields a BoTNet state dict fixes: channels, blocks and BoT blocks per stage, stage widths."""
    fields: dict[str, Any] = {}
    stem = state.get("stem.conv1.conv.weight")
    if stem is not None and stem.ndim == 4:
        fields["in_chans"] = stem.shape[1]
    if depths := per_stage(state, "stages", ""):
        fields["depths"] = depths
        fields["bot_depths"] = tuple(
            sum(f"stages.{s}.{b}.self_attn.qkv.weight" in state for b in range(n)) for s, n in enumerate(depths)
        )
        last = [state.get(f"stages.{s}.0.conv3_1x1.conv.weight") for s in range(len(depths))]
        if all(w is not None for w in last):
            fields["widths"] = tuple(w.shape[0] for w in last)
    return fields


WEIGHTS = FamilyWeights(
    input_conv="stem.conv1.conv.weight",
    markers=("stem.conv1.conv.weight", "stages.0.0.conv1_1x1.conv.weight"),
    head=("head.fc.",),
    read_fields=read_fields,
)
