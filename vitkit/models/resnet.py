"""ResNet: the convolutional trunk that DETR's backbone and BoTNet are built from.

"Deep Residual Learning for Image Recognition", He et al., arXiv:1512.03385 (the stride on the 3x3 convolution, as
torchvision's "ResNet v1.5"; DC5 dilation as in DETR, arXiv:2005.12872).

A stride-4 stem, then four stages of residual blocks, each stage after the first halving the map in its first block
(or dilating instead); `forward` returns the maps of the stages asked for (`out_indices`: strides 4, 8, 16, 32), so
a detector can read one map or a pyramid. Every block is a `ResidualBlock` (branch, shortcut, add, ReLU), whose
forward is written once. Module names follow one of two layouts, so that each family's checkpoints load
unchanged:

- "torchvision": torchvision's (and timm's) ResNet: ``conv1``, ``bn1``, ``maxpool``, ``layer1`` .. ``layer4``;
  blocks ``conv1``, ``bn1``, ..., ``downsample.0`` / ``downsample.1`` (DETR's backbone).
- "timm": timm's ByobNet: ``stem.conv1.conv`` / ``.bn``, ``stem.pool``, ``stages.0`` .. ``stages.3``; blocks
  ``conv1_1x1``, ``conv2_kxk``, ``conv3_1x1`` (conv + bn + act units) and ``shortcut`` (BoTNet).

Letters: B batch, C channels, H, W map size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch
from torch import nn

from vitkit.cost.rows import conv_output_size
from vitkit.layers.norm import FrozenBatchNorm2d, fold_frozen_norms
from vitkit.models.registry import PublishedWeights

LAYOUTS = ("torchvision", "timm")
# A detector backbone's norm: "frozen", DETR's frozen BatchNorm, for a backbone from pretrained weights (its statistics
# and affine terms fixed); "batch", BatchNorm trained with the detector, for a backbone trained from scratch (frozen
# at their initial values, the norms normalise nothing)
BACKBONE_NORMS: dict[str, Callable[[int], nn.Module]] = {"frozen": FrozenBatchNorm2d, "batch": nn.BatchNorm2d}
STEMS = ("7x7", "tiered")


def torchvision_resnet(tag: str, file: str, what: str, size_mb: float) -> PublishedWeights:
    """A torchvision ImageNet-1k ResNet classifier's file as a detector's published backbone weights (the rest of the
    detector keeps its initialisation); `tag` as timm names torchvision's weights ("tv_in1k", "tv2_in1k")."""
    url = f"https://download.pytorch.org/models/{file}"
    return PublishedWeights(
        tag, url, "torchvision", f"ImageNet-1k, the backbone only: {what}", "BSD-3-Clause", {}, None, size_mb
    )


# torchvision's weights (`torchvision.models.ResNet50_Weights` ...): V1, what the DETR papers trained from; V2, newer
# recipe (ImageNet-1k top-1 80.9% for ResNet-50, 76.1% for V1). Sizes: the files', in MB.
RESNET50_TV = torchvision_resnet("tv_in1k", "resnet50-0676ba61.pth", "torchvision's ResNet-50 IMAGENET1K_V1", 102.5)
RESNET50_TV2 = torchvision_resnet("tv2_in1k", "resnet50-11ad3fa6.pth", "torchvision's ResNet-50 IMAGENET1K_V2", 102.5)
RESNET101_TV = torchvision_resnet("tv_in1k", "resnet101-63fe2227.pth", "torchvision's ResNet-101 IMAGENET1K_V1", 178.8)
RESNET101_TV2 = torchvision_resnet(
    "tv2_in1k", "resnet101-cd907fc2.pth", "torchvision's ResNet-101 IMAGENET1K_V2", 178.8
)


class ConvNormAct(nn.Sequential):
    """Conv (no bias) -> BatchNorm -> ReLU (or no activation); "same" padding for odd kernels (timm's names)."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int, stride: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding=kernel_size // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_chs)
        self.act = nn.ReLU(inplace=True) if act else nn.Identity()


class ResidualBlock(nn.Module):
    """A residual block: the children named in `branch` applied in turn, plus the shortcut (`shortcut_name`; the
    identity where it is nn.Identity), then ReLU (`act`, in place).

    Subclasses build their children and set `branch` (a name may repeat: a shared ReLU), `shortcut_name` and
    `in_place_add` (torchvision adds the shortcut into the branch's output, timm makes a new tensor).
    """

    branch: tuple[str, ...] = ()
    shortcut_name = "shortcut"
    in_place_add = False
    act: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for child in self.branch:
            out = getattr(self, child)(out)
        shortcut = getattr(self, self.shortcut_name)(x)
        return self.act(out.add_(shortcut) if self.in_place_add else out + shortcut)


def make_shortcut(
    in_chs: int, out_chs: int, stride: int, layout: str, norm: Callable[[int], nn.Module] = FrozenBatchNorm2d
) -> nn.Module:
    """1x1 conv (stride) + norm where the block changes width or strides, else the identity."""
    if in_chs == out_chs and stride == 1:
        return nn.Identity()
    if layout == "timm":
        return ConvNormAct(in_chs, out_chs, 1, stride, act=False)
    return nn.Sequential(nn.Conv2d(in_chs, out_chs, 1, stride, bias=False), norm(out_chs))


class Bottleneck(ResidualBlock):
    """1x1 -> 3x3 (stride, dilation) -> 1x1, plus the shortcut, then ReLU (ResNet-50/101).

    Args:
        in_chs, out_chs: input and output channels.
        width: the inner (bottleneck) channels.
        stride: of the 3x3 convolution (and the shortcut).
        dilation: of the 3x3 convolution; `first_dilation` for the first block of a dilated stage, which keeps the
            previous dilation on its 3x3 (torchvision, timm).
        layout: "torchvision" (conv1, bn1, ..., downsample; frozen norms by default) or "timm" (conv1_1x1,
            conv2_kxk, conv3_1x1 units and shortcut, BatchNorm).
        norm: the norm layer of the "torchvision" layout.
    """

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        width: int,
        stride: int = 1,
        dilation: int = 1,
        first_dilation: int | None = None,
        layout: str = "torchvision",
        norm: Callable[[int], nn.Module] = FrozenBatchNorm2d,
    ) -> None:
        super().__init__()
        d0 = first_dilation or dilation
        if layout == "timm":
            self.shortcut = make_shortcut(in_chs, out_chs, stride, layout, norm)
            self.conv1_1x1 = ConvNormAct(in_chs, width, 1)
            self.conv2_kxk = ConvNormAct(width, width, 3, stride)
            self.conv3_1x1 = ConvNormAct(width, out_chs, 1, act=False)
            self.branch = ("conv1_1x1", "conv2_kxk", "conv3_1x1")
        else:
            self.conv1 = nn.Conv2d(in_chs, width, 1, bias=False)
            self.bn1 = norm(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, d0, d0, bias=False)
            self.bn2 = norm(width)
            self.conv3 = nn.Conv2d(width, out_chs, 1, bias=False)
            self.bn3 = norm(out_chs)
            self.branch = ("conv1", "bn1", "act", "conv2", "bn2", "act", "conv3", "bn3")
            self.shortcut_name, self.in_place_add = "downsample", True
        self.act = nn.ReLU(inplace=True)
        if layout != "timm":
            self.downsample = make_shortcut(in_chs, out_chs, stride, layout, norm)


class BasicBlock(ResidualBlock):
    """3x3 (stride) -> 3x3, plus the shortcut, then ReLU (ResNet-18/34), in torchvision's names. Dilated (DC5) as timm
    does: the first conv keeps the previous stage's dilation (`first_dilation`), the second takes the new one."""

    branch = ("conv1", "bn1", "act", "conv2", "bn2")
    shortcut_name = "downsample"
    in_place_add = True

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        stride: int = 1,
        dilation: int = 1,
        first_dilation: int | None = None,
        norm: Callable[[int], nn.Module] = FrozenBatchNorm2d,
    ) -> None:
        super().__init__()
        d0 = first_dilation or dilation
        self.conv1 = nn.Conv2d(in_chs, out_chs, 3, stride, d0, d0, bias=False)
        self.bn1 = norm(out_chs)
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, 1, dilation, dilation, bias=False)
        self.bn2 = norm(out_chs)
        self.act = nn.ReLU(inplace=True)
        self.downsample = make_shortcut(in_chs, out_chs, stride, "torchvision", norm)


def stage_plan(depths: Sequence[int], dilate_last: bool = False) -> list[list[tuple[int, int, int]]]:
    """(stride, dilation, first_dilation) of each block of each stage: stages after the first halve the map in their
    first block; with `dilate_last` (DC5) the last stage dilates its 3x3 convolutions by 2 instead of striding, its
    first block keeping the previous dilation."""
    plan, dilation = [], 1
    for stage, depth in enumerate(depths):
        stride, first_dilation = (1 if stage == 0 else 2), dilation
        if dilate_last and stage == len(depths) - 1:
            stride, dilation = 1, 2
        plan.append([(stride, dilation, first_dilation)] + [(1, dilation, dilation)] * (depth - 1))
    return plan


def make_stem(
    in_chans: int,
    out_chs: int,
    layout: str,
    stem_type: str = "7x7",
    norm: Callable[[int], nn.Module] = FrozenBatchNorm2d,
) -> OrderedDict[str, nn.Module]:
    """The stride-4 stem's modules in forward order: a 7x7 stride-2 conv (or, "tiered", three 3x3 convs to 3/8, 1/2
    and 1 x out_chs, the first striding), norm (`norm` in the "torchvision" layout) and ReLU, then a 3x3 stride-2
    max pool."""
    pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    if layout == "torchvision":
        conv = nn.Conv2d(in_chans, out_chs, 7, 2, 3, bias=False)
        return OrderedDict(conv1=conv, bn1=norm(out_chs), act=nn.ReLU(inplace=True), maxpool=pool)
    if stem_type == "7x7":
        convs = [ConvNormAct(in_chans, out_chs, 7, stride=2)]
    else:
        chs = (3 * out_chs // 8, out_chs // 2, out_chs)  # 24, 32, 64 for 64 channels
        convs = [ConvNormAct(in_chans, chs[0], 3, 2), ConvNormAct(chs[0], chs[1], 3), ConvNormAct(chs[1], chs[2], 3)]
    return OrderedDict([*((f"conv{i + 1}", conv) for i, conv in enumerate(convs)), ("pool", pool)])


def _through(module: nn.Module, size: tuple[int, int]) -> tuple[int, int]:
    """The (h, w) a map of `size` has after the convolutions and pools in `module`, taken in registration order."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
            k, st, p = pair(m.kernel_size), pair(m.stride), pair(m.padding)
            d = pair(getattr(m, "dilation", 1))
            size = tuple(conv_output_size(size[i], k[i], st[i], p[i], d[i]) for i in range(2))
    return size


class ResNet(nn.Module):
    """The stem and four stages of residual blocks -> the maps of the stages in `out_indices` (coarsest last).

    Args:
        stem: the stem's modules in forward order (`make_stem`).
        stages: the blocks of each stage (`stage_plan` gives their strides and dilations).
        layout: "torchvision" (the stem's modules and `layer1` .. `layer4` are children of the ResNet) or "timm"
            (`stem` and `stages`, both nn.Sequential).
        out_indices: the stages whose output maps `forward` returns (0: stride 4, ..., 3: stride 32).
    """

    def __init__(
        self,
        stem: OrderedDict[str, nn.Module],
        stages: Sequence[Sequence[nn.Module]],
        layout: str = "torchvision",
        out_indices: Sequence[int] = (3,),
    ) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if not out_indices or not all(0 <= i < len(stages) for i in out_indices):
            raise ValueError(f"out_indices {tuple(out_indices)} must name stages 0..{len(stages) - 1}")
        self.layout = layout
        self.out_indices = tuple(out_indices)
        self.stem_names = tuple(stem)
        first = next(iter(stem.values()))
        self.in_chans = (first.conv if isinstance(first, ConvNormAct) else first).in_channels
        if layout == "timm":
            self.stem = nn.Sequential(stem)
            self.stages = nn.Sequential(*(nn.Sequential(*blocks) for blocks in stages))
        else:
            for child, module in stem.items():
                self.add_module(child, module)
            for s, blocks in enumerate(stages):
                self.add_module(f"layer{s + 1}", nn.Sequential(*blocks))
        # the channels of each map `forward` returns: the last convolution's of its stage (the shortcut's agree)
        convs = [[m for m in stage.modules() if isinstance(m, nn.Conv2d)] for _, stage in self.stage_list()]
        self.out_channels = [convs[i][-1].out_channels for i in self.out_indices]

    def stem_modules(self) -> list[tuple[str, nn.Module]]:
        """(name, module) of the stem in forward order."""
        prefix = "stem." if self.layout == "timm" else ""
        parent = self.stem if self.layout == "timm" else self
        return [(prefix + n, getattr(parent, n)) for n in self.stem_names]

    def stage_list(self) -> list[tuple[str, nn.Sequential]]:
        """(name, stage) of the four stages in order."""
        if self.layout == "timm":
            return [(f"stages.{s}", stage) for s, stage in enumerate(self.stages)]
        return [(f"layer{s + 1}", getattr(self, f"layer{s + 1}")) for s in range(4)]

    size_multiple = 1  # any image size runs (`vitkit.models.backbone`: what a detector pads images to)

    def early_layers(self) -> list[nn.Module]:
        """The first convolution and the first stage: what DETR and Deformable DETR keep frozen unless told to train
        them (`train_stem`)."""
        first = self.stem_modules()[0][1]
        return [first, self.stage_list()[0][1]]

    def reset_parameters(self) -> None:
        """Every convolution Kaiming-normal (fan out), as torchvision's ResNet."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def blocks(self) -> list[nn.Module]:
        """Every residual block of every stage, in order (what gradient checkpointing wraps)."""
        return [block for _, stage in self.stage_list() for block in stage]

    def fold_norms(self) -> int:
        """Fold every frozen norm into the convolution before it, for inference (`fold_frozen_norms`); the number
        folded."""
        return fold_frozen_norms(self)

    def forward_stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images (B, C, H, W) -> the maps of the stages in `out_indices` (B, C_s, H / 2^(s+2), W / 2^(s+2))."""
        for _, module in self.stem_modules():
            x = module(x)  # (B, C0, H / 4, W / 4)
        maps = []
        for s, (_, stage) in enumerate(self.stage_list()[: max(self.out_indices) + 1]):
            x = stage(x)
            if s in self.out_indices:
                maps.append(x)
        return maps

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.forward_stages(x)

    def feature_sizes(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The (h, w) of each map `forward` returns for images of `img_size` (H, W): the image taken through the
        convolutions and pools of the stem and of each block's branch, in forward order."""
        size = tuple(img_size)
        for _, module in self.stem_modules():
            size = _through(module, size)
        sizes = []
        for s, (_, stage) in enumerate(self.stage_list()[: max(self.out_indices) + 1]):
            for block in stage:
                for child in block.branch:
                    size = _through(getattr(block, child), size)
            if s in self.out_indices:
                sizes.append(size)
        return sizes
