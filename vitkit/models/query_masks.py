"""A mask per object query as the dot product of the query's embedding with a per-pixel embedding: the mask head of
the deformable detectors, in Mask DINO's form (Li et al., "Mask DINO: Towards A Unified Transformer-based
Framework for Object Detection and Segmentation", CVPR 2023), which RF-DETR's segmentation models share.

    the encoder's finest level (B, D, h, w) -> bilinear to stride 4 of the (padded) image -> conv 3x3 + GroupNorm +
    ReLU -> conv 1x1: pixel embeddings (B, D, H / 4, W / 4)
    a decoder layer's output (B, Q, D) -> 3-layer MLP: mask embeddings (B, Q, D)
    mask logits (B, Q, H / 4, W / 4) = einsum("bqc,bchw->bqhw", mask embeddings, pixel embeddings)

The pixel embeddings are computed once an image; every decoder layer's queries (and the denoising queries) read
them with the shared MLP, so the auxiliary losses and denoising supervise masks as they do boxes.

Letters: B batch, Q queries, D model width, h, w the finest level's map, H, W the padded image, L decoder layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MASK_STRIDE = 4  # the masks' resolution: a logit per 4 x 4 pixels of the padded image
MASK_GROUPS = 32  # GroupNorm groups of the pixel embedding's convolution, as the input projections'


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
        self.pixel_conv = nn.Conv2d(dim, dim, 3, padding=1)
        self.pixel_norm = nn.GroupNorm(MASK_GROUPS, dim)
        self.pixel_proj = nn.Conv2d(dim, dim, 1)
        self.mask_embed = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Convolutions Xavier-uniform with zero biases (Mask DINO's pixel decoder, c2_xavier_fill), the MLP
        PyTorch's Linear initialisation."""
        for conv in (self.pixel_conv, self.pixel_proj):
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)
        self.pixel_norm.reset_parameters()
        for layer in self.mask_embed:
            layer.reset_parameters()

    def pixels(self, finest: Tensor, size: tuple[int, int]) -> Tensor:
        x = F.interpolate(finest, size=size, mode="bilinear", align_corners=False)  # (B, D, H / 4, W / 4)
        return self.pixel_proj(F.relu(self.pixel_norm(self.pixel_conv(x))))

    def forward(self, states: Tensor, pixels: Tensor) -> Tensor:
        x = states
        for i, layer in enumerate(self.mask_embed):
            x = layer(x) if i == len(self.mask_embed) - 1 else F.relu(layer(x))
        return torch.einsum("...bqc,bchw->...bqhw", x, pixels)  # (..., B, Q, H / 4, W / 4)
