"""Inference optimisation: weights cast to bf16 once, fp32 where precision needs it, the fused attention path."""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitkit.layers import attention_layers

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


class OptimizedModel(nn.Module):
    """A model prepared for inference: takes the same fp32 images as the original and returns fp32 logits.

    With bf16, linear and convolution weights (and the activations between them) are bf16, cast once when the
    model is built rather than on every call as `torch.autocast` does; LayerNorm keeps fp32 weights and normalises
    in fp32 (torch's CPU and CUDA kernels accept bf16 inputs with fp32 parameters); attention runs the fused kernel,
    whose softmax accumulates in fp32.
    """

    def __init__(self, model: nn.Module, precision: str) -> None:
        super().__init__()
        self.model = model
        self.precision = precision
        self.dtype = PRECISIONS[precision]
        self.config = getattr(model, "config", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"expected a floating-point image tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        return self.model(x.to(self.dtype)).float()


def optimize(model: nn.Module, precision: str = "bf16", compile: bool = False) -> OptimizedModel:
    """An inference copy of `model` (the original is left as it is).

    Args:
        model: a vitkit model (any module whose attention is vitkit's `Attention`).
        precision: "bf16" (weights cast once; norms in fp32) or "fp32".
        compile: wrap the forward in `torch.compile` with weight freezing (the first call compiles, about half a
            minute for ViT-S on 2 cores; needs a C++ compiler on CPU).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    model = copy.deepcopy(model).eval()
    for _, layer in attention_layers(model):
        layer.backend = "sdpa"
    if precision != "fp32":
        dtype = PRECISIONS[precision]
        for module in model.modules():
            if isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
                continue  # normalisation statistics and affine parameters stay fp32
            for param in module.parameters(recurse=False):
                param.data = param.data.to(dtype)
            for name, buf in module.named_buffers(recurse=False):
                if buf.is_floating_point():
                    setattr(module, name, buf.to(dtype))
    for param in model.parameters():
        param.requires_grad_(False)
    optimized = OptimizedModel(model, precision)
    if compile:
        # Freezing lets inductor treat the weights as constants: prepacked oneDNN GEMMs with fused bias and
        # activation on CPU. Safe here since the weights of an inference copy never change.
        optimized.model = torch.compile(model, options={"freezing": True})
    return optimized
