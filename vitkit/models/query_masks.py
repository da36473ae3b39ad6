"""A mask per object query as the dot product of the query's embedding with a per-pixel embedding: the mask head of
the deformable detectors, in Mask DINO's form (Li et al., "Mask DINO: Towards A Unified Transformer-based
Framework for Object Detection and Segmentation", CVPR 2023), its pixel embeddings made as RF-DETR's segmentation
models make them (a ConvNeXt block without its MLP: a depthwise convolution, so the quarter-resolution map costs
little beside the detector).

    the encoder's finest level (B, D, h, w) -> bilinear to stride 4 of the (padded) image: x
    pixel embeddings (B, D, H / 4, W / 4) = x + GELU(Linear(LayerNorm(depthwise conv 3x3 (x)))), the norm and the
        linear layer over each pixel's D channels
    a decoder layer's output (B, Q, D) -> 3-layer MLP: mask embeddings (B, Q, D)
    mask logits (B, Q, H / 4, W / 4) = einsum("bqc,bchw->bqhw", mask embeddings, pixel embeddings)

The pixel embeddings are computed once an image; every decoder layer's queries (and the denoising queries) read
them with the shared MLP, so the auxiliary losses and denoising supervise masks as they do boxes. Mask DINO's own
pixel path (a full 3x3 convolution, GroupNorm, ReLU and a 1x1 convolution at stride 4) costs ten times the FLOPs
(20 against 2 GFLOP at 800x1216 and width 128; BENCHMARKS.md, instance masks); the models of earlier vitkit versions
had it, and a checkpoint that holds it loads into it (`QueryMasks.use_mask_dino_pixels`).

Letters: B batch, Q queries, D model width, h, w the finest level's map, H, W the padded image, L decoder layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MASK_STRIDE = 4  # the masks' resolution: a logit per 4 x 4 pixels of the padded image


def mask_size(height: int, width: int) -> tuple[int, int]:
    """The (h, w) of the mask logits of a padded image of (height, width): a quarter, rounded up (integer
    arithmetic, which an export keeps symbolic)."""
    return (height + MASK_STRIDE - 1) // MASK_STRIDE, (width + MASK_STRIDE - 1) // MASK_STRIDE


class QueryMasks(nn.Module):
    """Mask DINO's mask head: pixel embeddings from the encoder's finest level, a mask embedding per query, their
    dot product the query's mask logits.

    ``pixels(finest, size)``: the finest level (B, D, h, w) -> pixel embeddings (B, D, *size);
    ``forward(states, pixels)``: queries (..., B, Q, D) (every decoder layer's, stacked) -> mask logits
    (..., B, Q, *size).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.pixel_dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.pixel_ln = nn.LayerNorm(dim, eps=1e-6)
        self.pixel_linear = nn.Linear(dim, dim)
        self.mask_embed = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's initialisation of each layer, as RF-DETR's head and Mask DINO's MLP keep; Mask DINO's pixel
        convolutions Xavier-uniform with zero biases (its pixel decoder's c2_xavier_fill)."""
        for layer in self.children():
            if isinstance(layer, nn.Conv2d) and hasattr(self, "pixel_conv"):
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)
            elif isinstance(layer, nn.ModuleList):
                for linear in layer:
                    linear.reset_parameters()
            else:
                layer.reset_parameters()

    def use_mask_dino_pixels(self) -> None:
        """Make the pixel embeddings as Mask DINO's pixel decoder and earlier vitkit versions made them: conv 3x3 +
        GroupNorm (32 groups) + ReLU, then conv 1x1, at stride 4 (`pixel_conv`, `pixel_norm`, `pixel_proj`, freshly
        initialised): what a checkpoint of such a model loads into."""
        dim, like = self.pixel_linear.in_features, self.pixel_linear.weight
        del self.pixel_dwconv, self.pixel_ln, self.pixel_linear
        self.pixel_conv = nn.Conv2d(dim, dim, 3, padding=1, device=like.device, dtype=like.dtype)
        self.pixel_norm = nn.GroupNorm(32, dim, device=like.device, dtype=like.dtype)
        self.pixel_proj = nn.Conv2d(dim, dim, 1, device=like.device, dtype=like.dtype)
        self.reset_parameters()

    def pixels(self, finest: Tensor, size: tuple[int, int]) -> Tensor:
        x = F.interpolate(finest, size=size, mode="bilinear", align_corners=False)  # (B, D, H / 4, W / 4)
        if hasattr(self, "pixel_conv"):  # Mask DINO's (`use_mask_dino_pixels`)
            return self.pixel_proj(F.relu(self.pixel_norm(self.pixel_conv(x))))
        y = self.pixel_ln(self.pixel_dwconv(x).permute(0, 2, 3, 1))  # (B, H / 4, W / 4, D)
        return x + F.gelu(self.pixel_linear(y)).permute(0, 3, 1, 2)

    def forward(self, states: Tensor, pixels: Tensor) -> Tensor:
        x = states
        for i, layer in enumerate(self.mask_embed):
            x = layer(x) if i == len(self.mask_embed) - 1 else F.relu(layer(x))
        return torch.einsum("...bqc,bchw->...bqhw", x, pixels)  # (..., B, Q, H / 4, W / 4)
