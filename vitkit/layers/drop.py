"""Stochastic depth (DropPath): drop a whole residual branch per sample during training.

From "Deep Networks with Stochastic Depth" (arXiv:1603.09382), as used by DeiT and Swin.
"""

from __future__ import annotations

import torch
from torch import nn


def drop_path(x: torch.Tensor, drop_prob: float, training: bool) -> torch.Tensor:
    """Zero each sample's branch with probability `drop_prob` and scale the kept ones by 1 / (1 - drop_prob)."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # one draw per sample, broadcast over the rest
    mask = x.new_empty(shape).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    """Module form of `drop_path`; the identity in eval mode or when `drop_prob` is 0."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"
