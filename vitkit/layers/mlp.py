"""The transformer feed-forward block: Linear -> GELU -> Linear, with dropout."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.layers.cost import GELU_FLOPS, OpCost, elementwise_op, linear_op, numel


class Mlp(nn.Module):
    """Two-layer perceptron applied to every token: (..., in) -> (..., hidden) -> (..., out).

    Args:
        in_features: input channels.
        hidden_features: hidden channels (default: `in_features`).
        out_features: output channels (default: `in_features`).
        drop: dropout after the activation and after the second layer.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        drop: float = 0.0,
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()  # exact (erf) GELU, as in the ViT paper and timm
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def cost(self, name: str, shape: tuple[int, ...], held: int = 0, dtype_bytes: int = 4) -> list[OpCost]:
        """Analytic cost of `forward` on input `shape` (..., in), one row per operator (see `Attention.cost`)."""
        hidden = (*shape[:-1], self.fc1.out_features)
        held_in = held + numel(shape) * dtype_bytes  # the input stays referenced until forward returns
        hidden_bytes = numel(hidden) * dtype_bytes
        fc1_bias, fc2_bias = self.fc1.bias is not None, self.fc2.bias is not None
        return [
            linear_op(name, "fc1", shape, self.fc1.out_features, fc1_bias, held, dtype_bytes),  # TCH MACs
            elementwise_op(name, "gelu", hidden, GELU_FLOPS, held_in + hidden_bytes, dtype_bytes),  # 8TH
            linear_op(name, "fc2", hidden, self.fc2.out_features, fc2_bias, held_in, dtype_bytes),  # THC MACs
        ]
