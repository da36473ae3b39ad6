"""Registered models with their published weights, by name: `vitkit.create_model(name, pretrained=True)`.

Each family declares the weights published for its variants beside them (`register_model(..., pretrained=...)`,
`vitkit.models.registry.PublishedWeights`): the default first, then the other tags, as timm names them
("vit_base_patch16_224.augreg2_in21k_ft_in1k"). A tag says where the weights live (a Hub repository or a
torchvision URL, `vitkit.weights.hub` downloads them), their layout (a timm repository, a transformers model
directory, a torchvision ResNet classifier's file: a detector's backbone), what they were trained on, their licence
and the label names of their head. The model built is the registered variant with the tag's fields; the weights are
checked against it as `vitkit.load_weights` checks any checkpoint (every key, every shape).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vitkit.models import registry
from vitkit.models.registry import ModelEntry, PublishedWeights, published_weights, replace_config
from vitkit.weights.convert import (
    REPORT_ATTRIBUTE,
    LoadReport,
    check_features_args,
    features_model,
    load_weights,
    read_model_info,
    with_info,
)
from vitkit.weights.hub import hub_snapshot, label_names, torch_hub_file
from vitkit.weights.io import CONFIG_NAME, ModelInfo, read_json
from vitkit.weights.timm_repo import timm_info


def create_model(
    name: str,
    pretrained: bool | str = False,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    **overrides: Any,
) -> nn.Module:
    """The registered model `name`, with config fields replaced by `overrides`, loaded with published weights when
    `pretrained` is True (the model's default weights) or a tag ("augreg_in21k", see `vitkit.list_pretrained`).

    `name` may carry the tag as timm writes it, "vit_base_patch16_224.augreg2_in21k_ft_in1k": with
    `pretrained=False` it builds the architecture those weights need (e.g. a head of their classes) without them.
    Another `num_classes` than the weights' keeps the model's fresh classifier (and whatever else is sized by the
    classes) and loads the rest, as timm does; another `img_size` resamples a ViT's position table.

    The model carries what it was loaded from (`vitkit.weights.load_report(model)`) and what it needs beside its
    weights (`vitkit.weights.model_info(model)`: label names, normalisation, where the weights came from, at which
    revision), which `save_pretrained(model, path, model_info(model))` writes. Weights are downloaded once, into
    huggingface_hub's or torch.hub's cache (`vitkit.weights.hub`: offline use, errors).

    `features_only=True` gives timm's features model (`vitkit.models.backbone.FeatureMaps`): images -> a list of
    (B, C_i, H_i, W_i) maps, the outputs `out_indices` of a ViT's blocks or a Swin's stages (timm's defaults: a
    ViT's last three blocks, every Swin stage), with `feature_info.channels()` and `.reduction()`; the model is
    pruned of what those maps do not use, as timm prunes it.

    Example: ``create_model("vit_base_patch16_224", pretrained=True)``,
    ``create_model("deformable_detr_resnet50", pretrained="coco")``,
    ``create_model("swin_tiny_patch4_window7_224.ms_in22k_ft_in1k", pretrained=True, num_classes=5)``,
    ``create_model("swin_tiny_patch4_window7_224", pretrained=True, features_only=True, out_indices=(1, 2, 3))``.
    """
    check_features_args(features_only, out_indices)
    model = _create(name, pretrained, **overrides)
    return features_model(model, out_indices) if features_only else model


def _create(name: str, pretrained: bool | str = False, **overrides: Any) -> nn.Module:
    """`create_model` without features_only."""
    if not pretrained and "." not in name:
        return registry.create_model(name, **overrides)
    entry, weights = published_weights(name, pretrained if isinstance(pretrained, str) else True)
    model = registry.create_model(entry.name, **{**weights.fields, **overrides})
    if not pretrained:
        return model
    published = replace_config(entry.config, **weights.fields)
    reset = getattr(model.config, "num_classes", None) != getattr(published, "num_classes", None)
    report, info = _load(model, entry, weights, reset)
    with_info(model, info, reset)
    setattr(model, REPORT_ATTRIBUTE, report)
    return model


def _load(model: nn.Module, entry: ModelEntry, weights: PublishedWeights, reset: bool) -> tuple[LoadReport, ModelInfo]:
    """Load `weights` into `model` (the variant `entry` built with their fields): what loading did, and the model's
    `ModelInfo` (label names, normalisation, the weights' source at its revision)."""
    if weights.layout == "torchvision":
        path = torch_hub_file(weights.source)
        report = load_weights(model, path, format="torchvision", reset_head=reset)
        report.source = weights.source
        return report, ModelInfo(weights=weights.source)
    snapshot = hub_snapshot(weights.source)
    directory = snapshot.directory
    if weights.layout == "timm":
        saved = read_json(directory / CONFIG_NAME)
        if saved.get("architecture") != entry.name:
            raise ValueError(
                f"{weights.source} holds a {saved.get('architecture')!r}, not the {entry.name} its table names"
            )
        report = load_weights(model, directory, format="vitkit", reset_head=reset)
        names = None if weights.labels is None else label_names(weights.labels)
        info = timm_info(saved, directory, names)
    else:
        report = load_weights(model, directory, format="hf", reset_head=reset)
        info = read_model_info(directory)
    report.source = snapshot.source
    return report, dataclasses.replace(info, weights=snapshot.source)


def download_mb(name: str, tag: bool | str = True) -> float:
    """The size of the download of a model's published weights in MB: the size the table gives (a backbone's
    file), else the variant's own tensors in float32, as its publishers store them (counted on the meta device,
    nothing allocated)."""
    entry, weights = published_weights(name, tag)
    if weights.size_mb is not None:
        return weights.size_mb
    with torch.device("meta"):
        model = registry.create_model(entry.name, **weights.fields)
    return sum(v.numel() * 4 for v in model.state_dict().values() if v.is_floating_point()) / 1e6
