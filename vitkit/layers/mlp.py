"""The transformer feed-forward block: Linear -> activation (GELU, its tanh form, quick GELU, ReLU) -> Linear, with
dropout."""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "relu")
"""`gelu`: exact, erf-based (ViT, Swin, DINOv2); `gelu_tanh`: its tanh approximation (SigLIP, transformers'
"gelu_pytorch_tanh"); `quick_gelu`: x * sigmoid(1.702 x) (OpenAI's CLIP); `relu`: the original transformer's (DETR)."""


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(act: str) -> nn.Module:
    """The module computing `act` (one of ACTIVATIONS); ValueError for another name."""
    if act not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {act!r}")
    if act == "quick_gelu":
        return QuickGELU()
    return nn.ReLU() if act == "relu" else nn.GELU(approximate="tanh" if act == "gelu_tanh" else "none")


class Mlp(nn.Module):
    """Two-layer perceptron applied to every token: (..., in) -> (..., hidden) -> (..., out).

    Args:
        in_features: input channels.
        hidden_features: hidden channels (default: `in_features`).
        out_features: output channels (default: `in_features`).
        drop: dropout after the activation and after the second layer.
        act: one of ACTIVATIONS: "gelu" (exact, erf-based: ViT, Swin), "gelu_tanh", "quick_gelu" or "relu".
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
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = activation(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

