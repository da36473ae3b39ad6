"""Models for training: built from the registry or from a saved model (fine-tuning), and gradient checkpointing."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

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


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The module's own forward, recomputed during backward instead of keeping its activations."""
    forward = type(self).forward
    if self.training and torch.is_grad_enabled():
        return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)
    return forward(self, *args, **kwargs)


def enable_grad_checkpointing(model: nn.Module) -> int:
    """Recompute every block in backward (torch.utils.checkpoint) instead of storing its activations.

    Applies to the children of every module named ``blocks`` (ViT's encoder, each Swin stage, ...); parameter
    names and the state dict are unchanged. Returns the number of blocks wrapped.
    """
    wrapped = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "blocks":
            for block in module.children():
                block.forward = types.MethodType(_checkpointed_forward, block)
                wrapped += 1
    if wrapped == 0:
        raise ValueError(f"{type(model).__name__} has no 'blocks' container to checkpoint")
    return wrapped
