"""DETR's mask head: a mask logit map per object query (the DETR paper's section 4.4, "DETR for panoptic
segmentation").

For each object query, `ObjectAttentionMap` computes attention logits over the encoder's map, one per head, and
softmaxes them over all heads and positions together (M heads -> M maps of h x w per query). `MaskHead`, a small
FPN-like convolutional head, reads each query's maps beside the projected backbone map, then upsamples by 2 three
times, adding the backbone's layer3, layer2 and layer1 maps (through 1x1 adapters) at each step: one logit map per
query at stride 4.

    memory (B, D, h, w), decoder output (B, Q, D) -> ObjectAttentionMap -> (B, Q, M, h, w)
    [input_proj(layer4) (B, D, h, w) repeated Q times | maps (B Q, M, h, w)] -> (B Q, D + M, h, w)
    -> conv 3x3 + GroupNorm + ReLU: lay1 (D + M), lay2 (D / 2)
    -> nearest x2 + adapter1(layer3) -> lay3 (D / 4) -> x2 + adapter2(layer2) -> lay4 (D / 8)
    -> x2 + adapter3(layer1) -> lay5 (D / 16) -> out_lay (1): (B, Q, H / 4, W / 4)

Names follow facebookresearch/detr's segmentation.py (`bbox_attention.q_linear` / `k_linear`, `mask_head.lay1..5`,
`gn1..5`, `out_lay`, `adapter1..3`), as vitkit's DETR keeps the original names.

Letters: B batch, Q object queries, D model width, M heads, h, w the encoder's map (stride 32), H, W the image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ObjectAttentionMap(nn.Module):
    """Each object query's attention weights over the encoder's map, per head: softmax over heads and positions
    together of (W_q q) . (W_k m) / sqrt(D / M). Only the weights are wanted (no values), and the softmax spans all
    M heads of a query, not each head's row, so this is not `vitkit.layers.Attention`: the paper's code computes
    exactly this (`MHAttentionMap`).

    ``forward(queries, memory, mask)``: queries (B, Q, D), memory (B, N, D) with N = h * w tokens of the map
    `grid` (h, w), mask (B, N) True where a token is real (None: all are) -> (B, Q, M, h, w).
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.scale = (dim / num_heads) ** -0.5
        self.q_linear = nn.Linear(dim, dim)
        self.k_linear = nn.Linear(dim, dim)  # the paper's code applies it as a 1x1 convolution on the map: the same

    def forward(
        self, queries: torch.Tensor, memory: torch.Tensor, grid: tuple[int, int], mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        (B, Q, D), M = queries.shape, self.num_heads
        q = self.q_linear(queries).view(B, Q, M, D // M)  # (B, Q, M, c)
        k = self.k_linear(memory).view(B, -1, M, D // M)  # (B, N, M, c)
        logits = torch.einsum("bqmc,bnmc->bqmn", q * self.scale, k)  # (B, Q, M, N)
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, None, :], torch.finfo(logits.dtype).min)
        weights = logits.flatten(2).softmax(dim=-1)  # over every head's positions together: (B, Q, M N)
        return weights.view(B, Q, M, *grid)


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels), channels)  # the paper's 8 groups; fewer for a narrower test model


def widths(dim: int, num_heads: int) -> tuple[int, ...]:
    """The mask head's widths, lay1 to lay5: D + M, D / 2, D / 4, D / 8, D / 16."""
    return (dim + num_heads, dim // 2, dim // 4, dim // 8, dim // 16)


def check_mask_head(dim: int, num_heads: int) -> None:
    """ValueError unless the mask head of width `dim` with `num_heads` attention maps can be built: every width
    (`widths`) at least 1 and a multiple of its GroupNorm's groups (8, or the width itself below 8)."""
    inner = widths(dim, num_heads)
    if dim % 16 or any(w % min(8, w) for w in inner):
        raise ValueError(
            f"DETR's mask head has widths D + M, D / 2, .., D / 16 = {inner} for hidden_dim {dim} and num_heads "
            f"{num_heads}; each must divide into 8 GroupNorm groups (or be below 8): e.g. hidden_dim 256 with 8 heads"
        )


class MaskHead(nn.Module):
    """The paper's `MaskHeadSmallConv`: each query's attention maps and the projected backbone map, refined and
    upsampled with the backbone's finer maps into one mask logit map per query.

    ``forward(x, maps, fpns)``: x (B, D, h, w) the projected layer4 map, maps (B, Q, M, h, w) from
    `ObjectAttentionMap`, fpns the layer3, layer2 and layer1 maps (coarsest first) -> (B, Q, H', W') at layer1's
    resolution.

    Args:
        dim: the model width D.
        num_heads: the attention map's heads M.
        fpn_channels: channels of the layer3, layer2 and layer1 maps.
    """

    def __init__(self, dim: int, num_heads: int, fpn_channels: tuple[int, int, int]) -> None:
        super().__init__()
        check_mask_head(dim, num_heads)
        inner = widths(dim, num_heads)
        self.lay1, self.gn1 = nn.Conv2d(inner[0], inner[0], 3, padding=1), _group_norm(inner[0])
        self.lay2, self.gn2 = nn.Conv2d(inner[0], inner[1], 3, padding=1), _group_norm(inner[1])
        self.lay3, self.gn3 = nn.Conv2d(inner[1], inner[2], 3, padding=1), _group_norm(inner[2])
        self.lay4, self.gn4 = nn.Conv2d(inner[2], inner[3], 3, padding=1), _group_norm(inner[3])
        self.lay5, self.gn5 = nn.Conv2d(inner[3], inner[4], 3, padding=1), _group_norm(inner[4])
        self.out_lay = nn.Conv2d(inner[4], 1, 3, padding=1)
        self.adapter1 = nn.Conv2d(fpn_channels[0], inner[1], 1)
        self.adapter2 = nn.Conv2d(fpn_channels[1], inner[2], 1)
        self.adapter3 = nn.Conv2d(fpn_channels[2], inner[3], 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's code: convolutions Kaiming-uniform with a = 1, zero biases; GroupNorm's ones and zeros."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_uniform_(module.weight, a=1)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.GroupNorm):
                module.reset_parameters()

    def forward(self, x: torch.Tensor, maps: torch.Tensor, fpns: list[torch.Tensor]) -> torch.Tensor:
        B, Q = maps.shape[:2]

        def per_query(t: torch.Tensor) -> torch.Tensor:  # (B, C, h, w) -> (B Q, C, h, w), each image Q times
            return t.repeat_interleave(Q, dim=0)

        x = torch.cat([per_query(x), maps.flatten(0, 1)], dim=1)  # (B Q, D + M, h, w)
        x = F.relu(self.gn1(self.lay1(x)))
        x = F.relu(self.gn2(self.lay2(x)))
        adapters, convs = (self.adapter1, self.adapter2, self.adapter3), (self.lay3, self.lay4, self.lay5)
        for adapter, conv, norm, fpn in zip(adapters, convs, (self.gn3, self.gn4, self.gn5), fpns, strict=True):
            fine = per_query(adapter(fpn))  # (B Q, C, 2h, 2w)
            x = fine + F.interpolate(x, size=fine.shape[-2:], mode="nearest")
            x = F.relu(norm(conv(x)))
        return self.out_lay(x).view(B, Q, *x.shape[-2:])  # (B, Q, H / 4, W / 4)
