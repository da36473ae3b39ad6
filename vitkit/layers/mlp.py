"""The transformer feed-forward block: Linear -> GELU (or ReLU) -> Linear, with dropout."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.layers.cost import CostContext, OpCost, Value, sequence

ACTIVATIONS = ("gelu", "relu")


class Mlp(nn.Module):
    """Two-layer perceptron applied to every token: (..., in) -> (..., hidden) -> (..., out).

    Args:
        in_features: input channels.
        hidden_features: hidden channels (default: `in_features`).
        out_features: output channels (default: `in_features`).
        drop: dropout after the activation and after the second layer.
        act: "gelu" (exact, erf-based: ViT, Swin) or "relu" (the original transformer's, DETR's).
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        drop: float = 0.0,
        act: str = "gelu",
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"Mlp activation must be one of {ACTIVATIONS}, got {act!r}")
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU()  # GELU exact (erf), as in the ViT paper and timm
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def cost(self, name: str, x: Value, ctx: CostContext) -> list[OpCost]:
        """The operators of `forward` on x (..., in) in forward order: fc1 (T in H MACs for T tokens, H hidden), the
        activation (8TH for GELU, TH for ReLU), fc2 (T H out MACs), the dropouts in training."""
        return sequence(name, x, ctx, self)
