"""Frozen batch normalisation: BatchNorm with fixed statistics and affine terms, as detection backbones use it."""

from __future__ import annotations

import torch
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine terms (buffers): y = (x - mean) * weight / sqrt(var + eps) + bias.

    DETR's backbone norm: eps sits inside the rsqrt, as in DETR's code (torchvision's early FrozenBatchNorm2d left it
    out). Buffer names are BatchNorm2d's, without `num_batches_tracked`.
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-channel (C,) scale weight / sqrt(var + eps) and shift bias - mean * scale it applies."""
        scale = self.weight * (self.running_var + self.eps).rsqrt()  # (C,)
        return scale, self.bias - self.running_mean * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self.scale_shift()
        return torch.addcmul(shift[:, None, None], x, scale[:, None, None])  # one pass: (B, C, H, W)


def fold_frozen_norms(module: nn.Module) -> int:
    """Fold each `FrozenBatchNorm2d` under `module` that directly follows a convolution (the next child registered
    beside it) into that convolution, for inference: conv weight * scale, bias = shift, the norm replaced by
    nn.Identity (one pass over the activations less per convolution, and the affine map applied in the
    convolution's precision). Returns the number of norms folded."""
    folded = 0
    for parent in list(module.modules()):
        children = list(parent.named_children())
        for (_, conv), (norm_name, norm) in zip(children, children[1:], strict=False):
            if not (isinstance(conv, nn.Conv2d) and isinstance(norm, FrozenBatchNorm2d)):
                continue
            with torch.no_grad():
                scale, shift = norm.scale_shift()
                conv.weight.mul_(scale[:, None, None, None])  # (C, C_in, kh, kw) scaled per output channel
                bias = shift if conv.bias is None else conv.bias * scale + shift
                conv.bias = nn.Parameter(bias, requires_grad=False)
            setattr(parent, norm_name, nn.Identity())
            folded += 1
    return folded
