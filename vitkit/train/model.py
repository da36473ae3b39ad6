"""Models for training: built from the registry or from a saved model (fine-tuning), and gradient checkpointing."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitkit.models.interface import require_model
from vitkit.models.registry import build_model, family_of, replace_config
from vitkit.weights import load_pretrained, load_weights


def load_for_finetune(directory: str, num_classes: int, **overrides: Any) -> nn.Module:
    """A model initialised from a vitkit or Hugging Face model directory, for `num_classes` classes.

    Config fields in `overrides` are replaced; with another `img_size` the position table is resampled
    (`vitkit.weights.load_pretrained`). With another class count the classifier is freshly initialised and
    everything else is loaded.

    Example: ``load_for_finetune("runs/train/final", num_classes=3, img_size=56)``.
    """
    source, _ = load_pretrained(directory, **overrides)
    if source.config.num_classes == num_classes:
        return source
    model = build_model(family_of(source).name, replace_config(source.config, num_classes=num_classes))
    load_weights(model, source.state_dict(), format="vitkit", reset_head=True)
    return model


def enable_grad_checkpointing(model: nn.Module) -> int:
    """Recompute every block of a vitkit model in backward (torch.utils.checkpoint) instead of storing its
    activations: the model's `set_grad_checkpointing` (ViT's encoder blocks, each Swin block, BoTNet's bottleneck
    and BoT blocks). Parameter names and the state dict are unchanged. Returns the number of blocks wrapped.
    """
    return require_model(model, "gradient checkpointing").set_grad_checkpointing(True)
