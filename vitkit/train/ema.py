"""Exponential moving average of a model's weights (Polyak averaging), kept as a second model for evaluation."""

from __future__ import annotations

import copy

import torch
from torch import nn


class ModelEma:
    """After each optimizer step, ema = decay * ema + (1 - decay) * weights for every floating-point entry of the
    state dict; integer buffers are copied. `module` is an evaluation-mode copy of the model.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        current = model.state_dict()
        for name, average in self.module.state_dict().items():
            value = current[name].detach()
            if average.is_floating_point():
                average.lerp_(value, 1.0 - self.decay)
            else:
                average.copy_(value)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)
