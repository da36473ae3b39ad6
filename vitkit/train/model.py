"""Models for training: built from the registry or from saved weights (fine-tuning), and gradient checkpointing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.models.interface import require_model
from vitkit.models.registry import build_model, create_model, family_of, replace_config
from vitkit.weights import CheckpointMismatch, LoadReport, load_pretrained, load_weights


def load_for_finetune(
    source: str | os.PathLike, num_classes: int, model: str | None = None, **overrides: Any
) -> nn.Module:
    """A model initialised from saved weights, for `num_classes` classes.

    Args:
        source: a vitkit or Hugging Face model directory, or a checkpoint file in any layout
            `vitkit.load_weights` reads (timm / vitkit, torchvision, Hugging Face, facebookresearch/detr;
            `.safetensors`, `.pth`, `.pt`, `.bin`; training checkpoints are unwrapped).
        num_classes: the classes to train; a classifier for another number is freshly initialised, everything
            else is loaded.
        model: the registry model to build and load `source` into; None for a directory builds the model saved
            there. A checkpoint file holds no architecture, so it needs `model`.
        overrides: config fields to replace; with another `img_size` a ViT's position table is resampled.

    ValueError when the weights do not fit, worded with `vitkit train`'s options (`--model-arg`, `--model`).

    Example: ``load_for_finetune("runs/train/final", num_classes=3, img_size=56)``,
    ``load_for_finetune("vit_tiny.pth", 5, model="vit_tiny_patch16_224")``.
    """
    source = os.fspath(source)
    try:
        if model is not None:
            built = create_model(model, num_classes=num_classes, **overrides)
            load_adapting_head(built, source)
            return built
        if not Path(source).is_dir():
            raise ValueError(
                f"{source} is a checkpoint file, which holds weights but no architecture: name the model it fits "
                "with --model (see 'vitkit models')"
            )
        saved, _ = load_pretrained(source, **overrides)
        if saved.config.num_classes == num_classes:
            return saved
        built = build_model(family_of(saved).name, replace_config(saved.config, num_classes=num_classes))
        load_weights(built, saved.state_dict(), format="vitkit", reset_head=True)
        return built
    except CheckpointMismatch as err:
        raise ValueError(train_message(err)) from err


def load_adapting_head(model: nn.Module, source: str | os.PathLike) -> LoadReport:
    """`vitkit.load_weights(model, source)` (any layout, position table resampled), keeping the model's freshly
    initialised classifier when the checkpoint's is for another number of classes or missing."""
    try:
        return load_weights(model, source)
    except CheckpointMismatch as err:
        if err.reset_head is None:  # the body does not fit: no head choice helps
            raise
        return load_weights(model, source, reset_head=True)


def train_message(err: CheckpointMismatch) -> str:
    """A `CheckpointMismatch` worded with `vitkit train`'s options: `--model-arg FIELD=VALUE` for the config values
    that make the model fit, `--model NAME` for registered models of the checkpoint's size."""
    ways = []
    if err.fields:
        values = (json.dumps(v, separators=(",", ":")) for v in err.fields.values())
        ways.append("pass " + " ".join(f"--model-arg {k}={v}" for k, v in zip(err.fields, values, strict=True)))
    if err.models:
        shown = ", ".join(err.models[:5]) + (", ..." if len(err.models) > 5 else "")
        ways.append(f"pass --model NAME with a registered model of that size: {shown}")
    return err.problem + (": " + ", or ".join(ways) if ways else "")


def enable_grad_checkpointing(model: nn.Module) -> int:
    """Recompute every block of a vitkit model in backward (torch.utils.checkpoint) instead of storing its
    activations: the model's `set_grad_checkpointing` (ViT's encoder blocks, each Swin block, BoTNet's bottleneck
    and BoT blocks). Parameter names and the state dict are unchanged. Returns the number of blocks wrapped.
    """
    return require_model(model, "gradient checkpointing").set_grad_checkpointing(True)
