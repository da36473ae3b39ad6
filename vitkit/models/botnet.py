"""Bottleneck Transformers (BoTNet).

"Bottleneck Transformers for Visual Recognition", Srinivas et al., arXiv:2101.11605.

A BoT block is a ResNet bottleneck whose 3x3 convolution is replaced by multi-head self-attention over the
feature map with 2-D relative position logits; BatchNorm + ReLU follow the attention, and a block that strides
average-pools 2x2 after it. BoTNet is a ResNet whose last blocks are BoT blocks:

- ``botnet50``: ResNet-50 with its three c5 blocks replaced (4 heads, 224 input), as in the paper (20.8M parameters).
- ``botnet26t_256``: timm's BoTNet on a ResNet-26-T backbone (tiered 3-conv stem; the last block of c4 and both c5
  blocks are BoT blocks; 256 input).

Data path: image (B, C, H, W) -> stem (/4) -> stages of bottleneck / BoT blocks (/32) -> global average pool
(or bilinear pool) -> fc (B, num_classes). Parameter names and shapes follow timm's `ByobNet` (blocks ``bottle``
and ``self_attn``, attention ``BottleneckAttn``), so timm state dicts load unchanged.

The relative position tables are sized for one feature map, so a model takes images of its `img_size` only.

Letters: B batch, C channels, H, W feature-map height and width, N = H * W positions, h heads, d head dim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers import Attention2d, BilinearPool, check_backend, to_2tuple
from vitkit.layers.helpers import fresh_classifier, take_indices
from vitkit.models.interface import CostFromImages, SpatialAttention, checkpoint_blocks
from vitkit.models.registry import TimmTag, check_field_types, check_positive, register_family, register_model
from vitkit.models.resnet import (
    Bottleneck,
    ConvNormAct,
    ResidualBlock,
    ResNet,
    make_shortcut,
    make_stem,
    stage_plan,
)
from vitkit.util import nearest_multiples

BOTNET_PAPER = "Bottleneck Transformers for Visual Recognition (Srinivas et al., arXiv:2101.11605)"
STEM_TYPES = ("7x7", "tiered")
GLOBAL_POOLS = ("avg", "bilinear")
NET_STRIDE = 32  # stem /4, then three stride-2 stages


@dataclass(frozen=True)
class BotNetConfig:
    img_size: int | tuple[int, int] = 224  # the one input size (H, W), an int for square; a multiple of 32
    in_chans: int = 3  # image channels
    num_classes: int = 1000  # classifier outputs; 0 removes the fc (forward returns pooled features)
    stem_type: str = "7x7"  # "7x7": ResNet's 7x7 conv; "tiered": 3x3 convs to 3/8, 1/2, 1 x stem_chs; both + max pool
    stem_chs: int = 64  # stem output channels
    depths: tuple[int, ...] = (3, 4, 6, 3)  # blocks per stage (c2, c3, c4, c5); stage i > 0 strides 2
    bot_depths: tuple[int, ...] = (0, 0, 0, 3)  # BoT blocks at the end of each stage, the others are bottlenecks
    widths: tuple[int, ...] = (256, 512, 1024, 2048)  # output channels per stage
    bottle_ratio: float = 0.25  # inner (bottleneck) width as a fraction of the block's output channels
    num_heads: int = 4  # attention heads of the BoT blocks; must divide their inner width
    attn_backend: str = "auto"  # "auto", "sdpa" (fused kernel) or "math" (the reference formula); see layers.attention
    zero_init_last: bool = False  # init: zero the last BatchNorm scale of each residual branch (timm's default)
    global_pool: str = "avg"  # "avg": mean over the final map; "bilinear": B-CNN bilinear pooling of its H'W' cells
    # (vitkit.layers.BilinearPool), the fc taking its bilinear_dim^2 features
    bilinear_dim: int | None = 64  # global_pool="bilinear": channels each cell is projected to first; None: all

    def __post_init__(self) -> None:
        check_field_types(self)
        check_positive(self, "in_chans", "stem_chs", "bottle_ratio", "num_heads")
        H, W = to_2tuple(self.img_size)
        if H % NET_STRIDE or W % NET_STRIDE:
            sides = [n for n in dict.fromkeys((H, W)) if n % NET_STRIDE]
            bad = " and ".join(f"{nearest_multiples(n, NET_STRIDE)} for {n}" for n in sides)
            raise ValueError(
                f"img_size {H}x{W} is not a multiple of the network stride {NET_STRIDE}: the nearest sides are {bad}"
            )
        if self.stem_type not in STEM_TYPES:
            raise ValueError(f"stem_type must be one of {STEM_TYPES}, got {self.stem_type!r}")
        if not len(self.depths) == len(self.bot_depths) == len(self.widths) == 4:
            raise ValueError(
                f"depths, bot_depths and widths need one entry per stage (4), got {len(self.depths)}, "
                f"{len(self.bot_depths)} and {len(self.widths)}"
            )
        if sum(self.bot_depths) == 0:
            raise ValueError(f"bot_depths {self.bot_depths} has no BoT block; a BoTNet needs at least one")
        for stage, (depth, bot) in enumerate(zip(self.depths, self.bot_depths, strict=True)):
            if not 0 <= bot <= depth:
                raise ValueError(
                    f"stage {stage} has {depth} blocks, so bot_depths[{stage}]={bot} must be in [0, {depth}]"
                )
        for width, bot in zip(self.widths, self.bot_depths, strict=True):
            mid = inner_width(width, self.bottle_ratio)
            if bot and mid % self.num_heads:
                raise ValueError(
                    f"num_heads {self.num_heads} does not divide the BoT inner width {mid} "
                    f"(= {width} x {self.bottle_ratio})"
                )
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {self.num_classes}")
        if self.global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be 'avg' or 'bilinear', got {self.global_pool!r}")
        if self.bilinear_dim is not None and self.bilinear_dim <= 0:
            raise ValueError(f"bilinear_dim must be > 0 or None, got {self.bilinear_dim}")
        check_backend(self.attn_backend)


def inner_width(width: int, ratio: float, divisor: int = 8) -> int:
    """Bottleneck width: width * ratio rounded to a multiple of `divisor`, never below 90% of it (timm's rule)."""
    value = width * ratio
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class BatchNormReLU(nn.BatchNorm2d):
    """BatchNorm followed by ReLU in one module (parameter names of the BatchNorm alone, as in timm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(super().forward(x))


class BottleneckAttn(Attention2d):
    """BoT multi-head self-attention: (B, C, H, W) -> (B, C, H / stride, W / stride).

    `Attention2d` with 2-D relative position logits, in timm's `BottleneckAttn` layout: the fused q, k, v
    projection is a 1x1 convolution without bias (``qkv.weight`` (3C, C, 1, 1), output channels ordered
    (q|k|v, head, d)), there is no output projection, and a strided layer average-pools 2x2 after attending.

    Args:
        dim: channels C; must be divisible by `num_heads`.
        num_heads: heads h; head dim d = C // h.
        feat_size: (H, W) of the input map, which the relative tables are sized for.
        stride: 1, or 2 to halve the map after attention.
        backend: "auto", "sdpa" or "math".
    """

    def __init__(
        self, dim: int, num_heads: int, feat_size: int | tuple[int, int], stride: int = 1, backend: str = "auto"
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias=False, backend=backend, pos="relative", feat_size=feat_size)
        if stride not in (1, 2):
            raise ValueError(f"BottleneckAttn stride must be 1 or 2, got {stride}")
        self.qkv = nn.Conv2d(dim, dim * 3, 1, bias=False)
        self.proj = nn.Identity()
        self.pool = nn.AvgPool2d(2, 2) if stride == 2 else nn.Identity()

    def reset_parameters(self) -> None:
        """timm's initialisation: qkv truncated normal with std fan_in^-0.5, tables with std d^-0.5."""
        nn.init.trunc_normal_(self.qkv.weight, std=self.qkv.weight.shape[1] ** -0.5)
        self.pos_embed.reset_parameters()

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, C, H, W = x.shape
        qkv = self.qkv(x).reshape(B, 3, self.num_heads, self.head_dim, H * W)  # (B, 3C, H, W) -> (B, 3, h, d, N)
        q, k, v = qkv.permute(1, 0, 2, 4, 3).unbind(0)  # (3, B, h, N, d) -> 3 x (B, h, N, d)
        return q, k, v

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.pool(super().forward(x, bias))


class BotBlock(ResidualBlock):
    """Bottleneck transformer block: 1x1 -> BoT attention (then 2x2 avg pool if strided) -> BN + ReLU -> 1x1, plus
    the shortcut, then ReLU: a ResNet bottleneck (timm's layout) whose 3x3 convolution is the attention."""

    branch = ("conv1_1x1", "self_attn", "post_attn", "conv3_1x1")

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        stride: int,
        bottle_ratio: float,
        num_heads: int,
        feat_size: tuple[int, int],
        backend: str,
    ) -> None:
        super().__init__()
        mid = inner_width(out_chs, bottle_ratio)
        self.shortcut = make_shortcut(in_chs, out_chs, stride, "timm")
        self.conv1_1x1 = ConvNormAct(in_chs, mid, 1)
        self.self_attn = BottleneckAttn(mid, num_heads, feat_size, stride, backend)
        self.post_attn = BatchNormReLU(mid)
        self.conv3_1x1 = ConvNormAct(mid, out_chs, 1, act=False)
        self.act = nn.ReLU(inplace=True)


class ClassifierHead(nn.Module):
    """Global pool -> fc; `pre_logits` returns the pooled features: (B, C) for the average, (B, pool.num_features)
    for the bilinear pool, whose features are the map's H * W cells."""

    def __init__(
        self, in_features: int, num_classes: int, global_pool: str = "avg", bilinear_dim: int | None = None
    ) -> None:
        super().__init__()
        self.pool = BilinearPool(in_features, reduce_dim=bilinear_dim) if global_pool == "bilinear" else None
        self.num_features = self.pool.num_features if self.pool is not None else in_features  # what fc reads
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.pool is not None:
            x = self.pool(x.flatten(2).transpose(1, 2))  # (B, C, H, W) -> (B, C, N) -> (B, N, C) -> (B, r * r)
        else:
            x = x.mean(dim=(2, 3))  # (B, C, H, W) -> (B, C)
        return x if pre_logits else self.fc(x)


class BotNet(CostFromImages, ResNet):
    """BoTNet built from a `BotNetConfig`: images (B, in_chans, H, W) of size `img_size` -> logits. A `ResNet` in
    timm's layout whose last blocks are `BotBlock`s, with a classifier head."""

    def __init__(self, config: BotNetConfig) -> None:
        c = config
        stem = make_stem(c.in_chans, c.stem_chs, "timm", c.stem_type)
        H, W = to_2tuple(c.img_size)
        feat = (H // 4, W // 4)  # after the stem
        attn_feat_size = None  # the feature map at the first BoT block
        stages, in_chs = [], c.stem_chs
        for plan, bot, width in zip(stage_plan(c.depths), c.bot_depths, c.widths, strict=True):
            blocks = []
            for i, (stride, _, _) in enumerate(plan):
                if i >= len(plan) - bot:  # the attention runs before the block's pooling, on the map entering it
                    attn_feat_size = attn_feat_size or feat
                    block = BotBlock(in_chs, width, stride, c.bottle_ratio, c.num_heads, feat, c.attn_backend)
                else:
                    block = Bottleneck(in_chs, width, inner_width(width, c.bottle_ratio), stride, layout="timm")
                blocks.append(block)
                feat, in_chs = (feat[0] // stride, feat[1] // stride), width
            stages.append(blocks)
        super().__init__(stem, stages, layout="timm")
        self.config = c
        self.attn_feat_size: tuple[int, int] = attn_feat_size
        self.head = ClassifierHead(in_chs, c.num_classes, c.global_pool, c.bilinear_dim)
        self.init_weights()

    @property
    def num_features(self) -> int:
        return self.config.widths[-1]

    def init_weights(self) -> None:
        """timm's ByobNet initialisation: convs normal with std sqrt(2 / fan_out), BatchNorm 1 and 0, fc normal
        with std 0.01, BoT attention as `BottleneckAttn`; with `zero_init_last` the last BatchNorm of each residual
        branch starts at zero (every block starts as its shortcut, and the branch's other parameters get no
        gradient until that scale moves)."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
                nn.init.normal_(module.weight, std=math.sqrt(2.0 / fan_out))
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.01)
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, (Bottleneck, BotBlock)) and self.config.zero_init_last:
                nn.init.zeros_(module.conv3_1x1.bn.weight)
            elif isinstance(module, BottleneckAttn):
                module.reset_parameters()

    def spatial_attention(self, maps: Mapping[str, torch.Tensor], img_size: tuple[int, int]) -> list[SpatialAttention]:
        """Each captured BoT block's attention (B, h, HW, HW) laid on the feature map it attends over (the map
        entering the block, before a strided block pools): every position's row over all positions
        (`vitkit.models.interface.SpatialAttention`)."""
        out = []
        for name, module in self.named_modules():
            if isinstance(module, BottleneckAttn) and name in maps:
                H, W = module.feat_size
                keys = torch.arange(H * W).expand(H * W, H * W)  # every position attends to every position
                out.append(SpatialAttention(name, (H, W), keys, maps[name], f"all {H}x{W} positions of the map"))
        return out

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError unless x is a float image batch (B, in_chans, H, W) of the configured size."""
        c = self.config
        if x.ndim != 4:
            raise ValueError(f"BotNet expects images (B, C, H, W), got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"BotNet expects floating-point images, got dtype {x.dtype}")
        if x.shape[1] != c.in_chans:
            raise ValueError(f"BotNet was built for {c.in_chans} input channels, got {x.shape[1]}")
        H, W = to_2tuple(c.img_size)
        if tuple(x.shape[-2:]) != (H, W):
            fh, fw = self.attn_feat_size
            raise ValueError(
                f"BotNet takes {H}x{W} images only: its relative position tables are sized for the "
                f"{fh}x{fw} feature map those give at the first BoT block; got {x.shape[-2]}x{x.shape[-1]} images "
                f"(build the model with img_size=({x.shape[-2]}, {x.shape[-1]}) to train at that size)"
            )

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> feature map (B, num_features, H / 32, W / 32)."""
        self.check_input(x)
        return self.forward_stages(x)[-1]

    # timm's default outputs of a features model (`create_model(..., features_only=True)`): the stem's and every stage's
    default_feature_outputs: int | None = None

    def feature_info(self) -> list[tuple[int, int]]:
        """(channels, stride) of each output as `forward_intermediates` gives it: the stem's before its max pool
        (stride 2, timm's first), then each stage's."""
        c = self.config
        info, stride = [(c.stem_chs, 2)], 4
        for plan, width in zip(stage_plan(c.depths), c.widths, strict=True):
            stride *= plan[0][0]
            info.append((width, stride))
        return info

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        output_fmt: str = "NCHW",
        norm: bool = False,
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Outputs of the stem (before its max pool) and of the stages, as timm's ByobNet numbers them: 0 the stem's,
        1..4 the stages'.

        Args:
            x: images (B, C, H, W) of the model's size.
            indices: None for every output, an int n for the last n, or a list of indices (negative ones count from
                the end).
            output_fmt: "NCHW" only (timm's ByobNet gives no other).
            norm: timm's argument; BoTNet has no final norm, so it changes nothing.
            intermediates_only: False (timm's default): (`forward_features(x)`, the outputs), every stage runs;
                True: the outputs alone, what follows the last output skipped.
        """
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW' (BoTNet's maps), got {output_fmt!r}")
        self.check_input(x)
        stages = [stage for _, stage in self.stage_list()]
        take = take_indices(1 + len(stages), indices, unit="output")
        *convs, (_, pool) = self.stem_modules()
        for _, module in convs:
            x = module(x)  # (B, stem_chs, H / 2, W / 2)
        outputs = [x] if 0 in take else []
        x = pool(x)
        for s, stage in enumerate(stages[: len(stages) if not intermediates_only else max(take)], start=1):
            x = stage(x)
            if s in take:
                outputs.append(x)
        return outputs if intermediates_only else (x, outputs)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] | None = None, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop what `forward_intermediates(x, indices)` does not use, as timm's: the stages after the last output,
        the pooling and classifier (`prune_head`). `prune_norm` is timm's argument (BoTNet has no final norm).
        Returns the outputs' indices, the stem's 0. The pruned model serves `forward_intermediates` (a features
        model); its config still describes the model it was cut from."""
        take = take_indices(1 + len(self.stage_list()), indices, unit="output")
        self.stages = self.stages[: max(take)]
        if prune_head:
            self.head.pool, self.head.num_features = None, self.config.widths[-1]
            self.reset_classifier(0)
        return take

    def get_classifier(self) -> nn.Module:
        """The classifier (timm's name): a Linear, Identity without classes."""
        return self.head.fc

    def reset_classifier(self, num_classes: int) -> None:
        """A fresh classifier for `num_classes` classes (0: none, `forward` returns the pooled features), as timm's;
        the config follows. The pool (a bilinear pool's projection too) is kept."""
        self.head.fc = fresh_classifier(self, self.head.num_features, num_classes)
        self.config = replace(self.config, num_classes=num_classes)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Feature map (B, C, H', W') -> logits (B, num_classes), or pooled features (B, C) with `pre_logits`."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def shard_units(self) -> list[nn.Module]:
        """Each bottleneck and BoT block of every stage, the stem staying with the root
        (`vitkit.models.interface.VitkitModel`)."""
        return list(self.blocks())

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each bottleneck and BoT block of every stage in backward (`vitkit.models.interface.VitkitModel`;
        the stem is not checkpointed; BatchNorm statistics move once per step); the blocks now checkpointed."""
        return checkpoint_blocks(self.shard_units(), enable)

    def token_grid(self, img_size: tuple[int, int]) -> None:
        """None: a BoT block attends over its whole feature map, but the map shrinks between BoT blocks (and the
        convolutional blocks mix positions), so no one token grid serves every attention layer."""
        return None

    def attention_layout(self) -> str:
        """Why `token_grid` is None, in words (`vitkit.models.interface.VitkitModel`)."""
        sizes = dict.fromkeys(m.feat_size for m in self.modules() if isinstance(m, BottleneckAttn))
        maps = " then ".join(f"{H}x{W}" for H, W in sizes)
        return (
            f"each BoT block attends over a whole feature map, but the maps differ from block to block ({maps}) "
            "and convolutions mix positions before them"
        )

    def no_weight_decay(self) -> set[str]:
        """None besides the parameters of ndim <= 1: the relative position tables decay, as in timm."""
        return set()


register_family(
    "botnet",
    BotNetConfig,
    BotNet,
    display_name="BoTNet",
    weights="vitkit.weights.botnet",
    cost_parts={"stem": "embedding"},
)

register_model(
    "botnet50",
    "botnet",
    BotNetConfig(),
    BOTNET_PAPER,
    unpublished="the BoTNet paper's authors published none, nor does timm (which has botnet26t_256's)",
)
register_model(
    "botnet26t_256",
    "botnet",
    BotNetConfig(img_size=256, stem_type="tiered", depths=(2, 2, 2, 2), bot_depths=(0, 0, 1, 2)),
    BOTNET_PAPER,
    pretrained=(TimmTag("c1_in1k", "ImageNet-1k (timm's training)"),),
)
