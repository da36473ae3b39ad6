"""The transformer feed-forward block: Linear -> GELU (or ReLU) -> Linear, with dropout."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.layers.cost import (
    GELU_FLOPS,
    RELU_FLOPS,
    CostContext,
    OpCost,
    Value,
    dropout_ops,
    elementwise_op,
    linear_op,
)

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
        """The operators of `forward` on x (..., in) in forward order; T tokens, H hidden, C channels."""
        fc1 = linear_op(name, "fc1", x, self.fc1.out_features, self.fc1.bias is not None, ctx)  # TCH MACs
        if isinstance(self.act, nn.GELU):
            act = elementwise_op(name, "gelu", fc1.output, GELU_FLOPS, ctx, saves=(fc1.output,))  # 8TH
        else:
            act = elementwise_op(name, "relu", fc1.output, RELU_FLOPS, ctx, saves_output=True)  # TH
        ops = [fc1, act, *dropout_ops(f"{name}.drop1", act.output, self.drop1.p, self.drop1.training, ctx)]
        fc2 = linear_op(name, "fc2", ops[-1].output, self.fc2.out_features, self.fc2.bias is not None, ctx)  # THC MACs
        return [*ops, fc2, *dropout_ops(f"{name}.drop2", fc2.output, self.drop2.p, self.drop2.training, ctx)]
