"""What a model family declares about its weights: one `FamilyWeights`, the `WEIGHTS` of its weights file
`vitkit.weights.<family>` (the module its registration names as `Family.weights`).

Loading, format detection, the shape and key checks, vitkit directories and Hugging Face directories read a family's
checkpoints through this declaration only: which keys identify vitkit's (timm's) own layout, where the classifier and
the other tensors sized by the number of classes are, what is fitted to the model's size, one rename table per source
format, the config fields a state dict's shapes fix, and the translations to and from transformers' config.json. A
family registered without a weights module reads and writes vitkit's own names only, its classifier under `head.`.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitkit.models.registry import Family, families, family, list_models, model_entry
from vitkit.weights.rename import Layout

State = dict[str, torch.Tensor]
# (transformers config.json, the checkpoint's keys, the file named in errors) -> the equal vitkit config
ConfigReader = Callable[[dict[str, Any], set[str], str], Any]
# (vitkit config, vitkit state dict) -> (state dict in transformers' names, transformers config.json)
HfExporter = Callable[[Any, State], tuple[State, dict[str, Any]]]


def unchanged(model: nn.Module, state: State) -> list[str]:
    """For families whose tensors do not depend on the image size: nothing to fit."""
    return []


def no_hint(missing: Sequence[str], unexpected: Sequence[str]) -> str:
    """For families whose key mismatches need no words beyond the keys."""
    return ""


def no_fields(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """For families without a shape reader: the key-by-key check reports a checkpoint of another size."""
    return {}


@dataclass(frozen=True)
class FamilyWeights:
    markers: tuple[str, ...] = ()  # vitkit keys whose presence, all of them, identifies vitkit's (timm's) own layout;
    # (): whatever none of `layouts` matches is read as vitkit's names
    head: tuple[str, ...] = ("head.",)  # vitkit key prefixes of the classifier(s), skipped with reset_head=True
    class_sized: tuple[str, ...] = ()  # vitkit key prefixes of the other tensors sized by the number of classes
    # (e.g. denoising queries' label embeddings): skipped with the classifier, and left as the model initialises them
    # where the checkpoint lacks them (one of a model without them); the checkpoint's are dropped where the model has
    # none
    adapt: Callable[[nn.Module, State], list[str]] = unchanged  # fits size-dependent tensors to the model, in place,
    # before the shape check; returns a line per tensor changed; ValueError when one cannot be fitted
    input_conv: str | None = None  # vitkit key of the convolution that reads the images: an RGB checkpoint's is fitted
    # to a model of other channels as timm fits it (`vitkit.weights.shapes.adapt_input_channels`)
    extra_outputs: int = 0  # classifier rows beyond num_classes (DETR's "no object")
    layouts: tuple[Layout, ...] = ()  # one rename table per source format (`Layout.format`), in the order the
    # family lists its formats
    read_fields: Callable[[Mapping[str, torch.Tensor]], dict[str, Any]] = no_fields  # the config fields that a state
    # dict's shapes and key counts fix (vitkit's names; see vitkit.weights.shapes)
    unread_fields: tuple[str, ...] = ()  # architecture fields that neither the shapes nor the key-by-key check fix
    # (a ViT's num_heads: any count that divides the width loads): a model named for a checkpoint whose other fields
    # were set to fit it keeps these from its registered config, and the load report says so
    hf_model_types: Mapping[str, ConfigReader] = field(default_factory=dict)  # transformers model_type -> the
    # reader of its config.json
    hf_export: HfExporter | None = None  # writes a model as transformers' save_pretrained does; None: no such class
    hf_image_processor: bool = False  # whether an exported Hugging Face directory gets a `preprocessor_config.json`
    # (`vitkit.weights.hf.image_processor`: resize and crop, rescale, normalise) when the normalisation is known
    in_timm: bool = True  # timm has models of the family, with vitkit's names: its "timm" format is vitkit's;
    # False (the DETRs): no timm model reads them, and writing "timm" weights is refused
    timm_fixed: Mapping[str, Any] = field(default_factory=dict)  # timm model arguments that are no config field, with
    # the value the family's models have (a timm directory's "model_args" naming another value are refused)
    key_hint: Callable[[Sequence[str], Sequence[str]], str] = no_hint  # (keys the checkpoint lacks, keys the model
    # lacks) -> the setting that would make them fit, in words, where the shapes cannot tell it (a ViT's fc_norm)

    def __post_init__(self) -> None:
        listed = [layout.format for layout in self.layouts]
        repeated = sorted({f for f in listed if listed.count(f) > 1})
        if repeated:
            raise ValueError(f"one layout per format: {repeated} listed more than once")

    def layout(self, format: str) -> Layout | None:
        """The family's rename table for `format`, or None when it has none."""
        return next((layout for layout in self.layouts if layout.format == format), None)


OWN_NAMES_ONLY = FamilyWeights()  # a family registered without a weights module


def family_weights(name: str) -> FamilyWeights:
    """The weights declaration of the registered family `name` (its weights module's `WEIGHTS`)."""
    module = family(name).weights
    if module is None:
        return OWN_NAMES_ONLY
    weights = getattr(importlib.import_module(module), "WEIGHTS", None)
    if not isinstance(weights, FamilyWeights):
        raise TypeError(f"{module} must define WEIGHTS, a vitkit.weights.FamilyWeights, for the {name} family")
    return weights


def registered_weights() -> dict[str, FamilyWeights]:
    """Every registered family's weights declaration, by family name, in registration order."""
    return {fam.name: family_weights(fam.name) for fam in families()}


def hf_model_types() -> dict[str, tuple[str, ConfigReader]]:
    """transformers `model_type` -> (the registered family that reads it, its config reader), over every family."""
    return {t: (name, read) for name, w in registered_weights().items() for t, read in w.hf_model_types.items()}


def saved_family(directory: str | os.PathLike) -> Family | None:
    """The registered family of the model saved in `directory`: the "family" of its config.json (vitkit's
    directories), that of its "architecture" (timm's), or the family that reads its "model_type" (transformers');
    None when none names one."""
    path = Path(directory) / "config.json"
    try:
        saved = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return None
    if not isinstance(saved, dict):
        return None
    if saved.get("family") in {fam.name for fam in families()}:
        return family(saved["family"])
    if saved.get("architecture") in list_models():  # timm's: its model name
        return family(model_entry(saved["architecture"]).family)
    found = hf_model_types().get(saved.get("model_type")) if isinstance(saved.get("model_type"), str) else None
    return family(found[0]) if found is not None else None


def source_formats() -> tuple[str, ...]:
    """The formats the registered families have rename tables for, each family's order kept (a format a family
    lists after another comes after it), else in the order first seen."""
    return merge_orders([[layout.format for layout in w.layouts] for w in registered_weights().values()])


def merge_orders(orders: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The union of `orders`, each name after every name some order lists before it (where the orders disagree,
    the one seen first goes first)."""
    seen: list[str] = []
    before: dict[str, set[str]] = {}
    for order in orders:
        for i, name in enumerate(order):
            if name not in before:
                seen.append(name)
            before.setdefault(name, set()).update(order[:i])
    merged: list[str] = []
    while len(merged) < len(seen):
        left = [name for name in seen if name not in merged]
        merged.append(next((name for name in left if before[name] <= set(merged)), left[0]))
    return tuple(merged)


__all__ = [
    "ConfigReader",
    "FamilyWeights",
    "HfExporter",
    "family_weights",
    "hf_model_types",
    "no_fields",
    "registered_weights",
    "saved_family",
    "source_formats",
    "unchanged",
]
