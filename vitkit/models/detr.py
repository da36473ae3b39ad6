"""DETR: the detection transformer.

"End-to-End Object Detection with Transformers", Carion et al., arXiv:2005.12872.

DETR predicts a fixed set of Q boxes per image. A ResNet backbone (frozen BatchNorm) maps the image to a feature
map; a 1x1 convolution projects it to D channels and it is read as h * w tokens. A post-norm transformer encoder
attends over the tokens, with a 2-D sine position encoding added to the queries and keys of every attention (never
to the values); a decoder turns Q learned object queries into Q embeddings by self-attention among them and
cross-attention to the encoder's tokens. A linear head gives each embedding K + 1 class logits (the last: "no
object") and a 3-layer MLP a box (cx, cy, w, h) in [0, 1] of the unpadded image.

Data path: images (B, 3, H, W) + pixel_mask (B, H, W) -> ResNet (B, C5, h, w) -> input_proj (B, D, h, w) -> tokens
(B, N, D) -> encoder x enc_layers -> memory (B, N, D); query_embed (Q, D) -> decoder x dec_layers, each output
through the shared final norm -> (L, B, Q, D) -> class_embed (B, Q, K + 1), bbox_embed (B, Q, 4).

Every attention is vitkit's one `Attention` layer: the encoder's is ``attn(x + pos, mask, value=x)``, the decoder's
self-attention ``attn(tgt + query_pos, value=tgt)`` and its cross-attention ``attn(tgt + query_pos, mask,
key=memory + pos, value=memory)``, so backends, `capture_attention` and costs work as for every model.

Parameter names follow the original code where it has them (`input_proj`, `query_embed`, `class_embed`,
`bbox_embed.layers.*`, torchvision's ResNet names under `backbone.`); `vitkit.weights.hf` converts transformers'
`DetrForObjectDetection` checkpoints.

Letters: B batch, H, W image size, h, w feature-map size, N = h * w tokens, C5 backbone channels, D model width,
Q object queries, L decoder layers, K classes, F = D / 2 position features per axis.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers import Attention, CostContext, Device, Mlp, OpCost, Value, check_backend, to_2tuple
from vitkit.layers.cost import (
    BATCH_NORM_FLOPS,
    RELU_FLOPS,
    copy_op,
    elementwise_op,
    given,
    layer_norm_op,
    linear_op,
    matmul_op,
    new_value,
    numel,
    reduce_op,
    view,
)
from vitkit.models.interface import checkpoint_blocks
from vitkit.models.registry import check_field_types, check_positive, check_rates, register_family, register_model

DETR_PAPER = "End-to-End Object Detection with Transformers (Carion et al., arXiv:2005.12872)"
BLOCKS = ("basic", "bottleneck")
POS_TEMPERATURE = 10000  # the sine encoding's wavelengths grow geometrically up to 2 pi * this
POS_SCALE = 2 * math.pi  # normalised positions run over (0, 2 pi]
POS_EPS = 1e-6  # keeps the normalisation finite in all-padding columns
SIGMOID_FLOPS = 4  # per element: negate, exp, add, divide


@dataclass(frozen=True)
class DetrConfig:
    img_size: int | tuple[int, int] = (800, 1216)  # nominal (H, W) (an int for square): what costs and profiles
    # assume; any size runs while dynamic_img_size is True (the paper resizes the short side to 800, long <= 1333)
    in_chans: int = 3  # image channels
    num_classes: int = 91  # object classes K; the class head has K + 1 outputs, the last "no object" (COCO: 91,
    # the largest category id + 1, as DETR)
    backbone_block: str = "bottleneck"  # "bottleneck" (1x1-3x3-1x1: ResNet-50/101) or "basic" (3x3-3x3: ResNet-18/34)
    backbone_depths: tuple[int, ...] = (3, 4, 6, 3)  # blocks of layer1..layer4: ResNet-50 (3, 4, 6, 3), ResNet-101
    # (3, 4, 23, 3), ResNet-18 (2, 2, 2, 2), ResNet-34 (3, 4, 6, 3) with basic blocks
    backbone_width: int = 64  # stem channels and layer1's inner width, doubled by each later stage (64: torchvision)
    dilation: bool = False  # DC5: layer4 dilates its 3x3 convolutions instead of striding (feature stride 16, not 32)
    train_stem: bool = False  # train conv1 and layer1 too; DETR freezes them (requires_grad False)
    hidden_dim: int = 256  # transformer width D
    num_heads: int = 8  # attention heads of every attention; must divide hidden_dim
    enc_layers: int = 6  # encoder layers
    dec_layers: int = 6  # decoder layers
    dim_feedforward: int = 2048  # hidden width of each layer's ReLU feed-forward block
    drop_rate: float = 0.1  # dropout after each attention and in each feed-forward block
    attn_drop_rate: float = 0.1  # dropout on the attention weights (DETR: 0.1 as well; transformers' DETR: 0.0)
    num_queries: int = 100  # object queries Q: the most objects one image can yield
    aux_loss: bool = True  # also predict from every earlier decoder layer (`aux_outputs`, for the auxiliary losses)
    dynamic_img_size: bool = True  # accept any image size (batches of several sizes are padded); False: img_size only
    attn_backend: str = "auto"  # "auto", "sdpa" (fused kernel) or "math" (explicit reference); see layers.attention

    def __post_init__(self) -> None:
        check_field_types(self)
        check_positive(
            self, "in_chans", "num_classes", "backbone_width", "hidden_dim", "num_heads", "enc_layers", "dec_layers"
        )
        check_positive(self, "dim_feedforward", "num_queries")
        check_rates(self, "drop_rate", "attn_drop_rate")
        H, W = to_2tuple(self.img_size)
        if H <= 0 or W <= 0:
            raise ValueError(f"img_size must be positive, got {self.img_size!r}")
        if self.backbone_block not in BLOCKS:
            raise ValueError(f"backbone_block must be one of {BLOCKS}, got {self.backbone_block!r}")
        if len(self.backbone_depths) != 4 or min(self.backbone_depths) < 1:
            raise ValueError(
                f"backbone_depths needs 4 stages of >= 1 block (layer1..layer4), got {self.backbone_depths}"
            )
        if self.hidden_dim % self.num_heads != 0:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}")
        if self.hidden_dim % 4 != 0:
            raise ValueError(f"hidden_dim {self.hidden_dim} must be a multiple of 4 (sine and cosine per axis)")
        check_backend(self.attn_backend)


# --- backbone: torchvision's ResNet layout with frozen BatchNorm ----------------------------------------------------


def conv_cost(name: str, conv: nn.Conv2d, x: Value, ctx: CostContext) -> OpCost:
    """A Conv2d on x (B, C, H, W): out elements x (C / groups) x kh x kw multiply-adds (+ one add each for a bias)."""
    B, _, H, W = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    out = (B, conv.out_channels, (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1)
    macs = numel(out) * conv.in_channels // conv.groups * kh * kw
    return matmul_op(name, "conv", (x,), out, macs, ctx, bias=conv.bias is not None)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()  # (C,)
        shift = self.bias - self.running_mean * scale  # (C,)
        return torch.addcmul(shift[:, None, None], x, scale[:, None, None])  # one pass: (B, C, H, W)

    def cost(self, name: str, x: Value, ctx: CostContext) -> OpCost:
        """x * scale + shift on x (B, C, H, W); backward needs only the scale, nothing of x."""
        return elementwise_op(name, "frozen_bn", x, BATCH_NORM_FLOPS, ctx)  # 2 per element


class BasicBlock(nn.Module):
    """ResNet-18/34 block: 3x3 (stride) -> 3x3, plus the shortcut (1x1 + norm where the shape changes), then ReLU.

    Dilated (DC5) as timm does: the first conv keeps the previous stage's dilation, the second takes the new one.
    """

    expansion = 1

    def __init__(self, in_chs: int, width: int, stride: int, dilation: int, first_dilation: int) -> None:
        super().__init__()
        out_chs = width * self.expansion
        self.conv1 = nn.Conv2d(in_chs, width, 3, stride, first_dilation, first_dilation, bias=False)
        self.bn1 = FrozenBatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, out_chs, 3, 1, dilation, dilation, bias=False)
        self.bn2 = FrozenBatchNorm2d(out_chs)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = make_downsample(in_chs, out_chs, stride)

    def branch(self) -> list[tuple[nn.Conv2d, FrozenBatchNorm2d, str]]:
        """(conv, norm, child-name suffix) of the residual branch in forward order."""
        return [(self.conv1, self.bn1, "1"), (self.conv2, self.bn2, "2")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual_forward(self, x)

    def cost(self, name: str, x: Value, ctx: CostContext) -> list[OpCost]:
        return residual_cost(self, name, x, ctx)


class Bottleneck(nn.Module):
    """ResNet-50/101 block: 1x1 -> 3x3 (stride, dilation) -> 1x1 (x4 channels), plus the shortcut, then ReLU.

    The stride sits on the 3x3 (torchvision's "ResNet v1.5", DETR's backbone); a dilated stage's first block keeps
    the previous dilation on its 3x3.
    """

    expansion = 4

    def __init__(self, in_chs: int, width: int, stride: int, dilation: int, first_dilation: int) -> None:
        super().__init__()
        out_chs = width * self.expansion
        self.conv1 = nn.Conv2d(in_chs, width, 1, bias=False)
        self.bn1 = FrozenBatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, first_dilation, first_dilation, bias=False)
        self.bn2 = FrozenBatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_chs, 1, bias=False)
        self.bn3 = FrozenBatchNorm2d(out_chs)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = make_downsample(in_chs, out_chs, stride)

    def branch(self) -> list[tuple[nn.Conv2d, FrozenBatchNorm2d, str]]:
        """(conv, norm, child-name suffix) of the residual branch in forward order."""
        return [(self.conv1, self.bn1, "1"), (self.conv2, self.bn2, "2"), (self.conv3, self.bn3, "3")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual_forward(self, x)

    def cost(self, name: str, x: Value, ctx: CostContext) -> list[OpCost]:
        return residual_cost(self, name, x, ctx)


def make_downsample(in_chs: int, out_chs: int, stride: int) -> nn.Sequential | None:
    """torchvision's shortcut: 1x1 conv (stride) + norm where the block changes width or strides, else None."""
    if in_chs == out_chs and stride == 1:
        return None
    return nn.Sequential(nn.Conv2d(in_chs, out_chs, 1, stride, bias=False), FrozenBatchNorm2d(out_chs))


def residual_forward(block: BasicBlock | Bottleneck, x: torch.Tensor) -> torch.Tensor:
    """conv -> norm -> ReLU for each step of the branch (no ReLU after the last), + shortcut, ReLU (in place)."""
    out = x
    branch = block.branch()
    for i, (conv, norm, _) in enumerate(branch):
        out = norm(conv(out))
        if i < len(branch) - 1:
            out = block.relu(out)
    out += x if block.downsample is None else block.downsample(x)
    return block.relu(out)


def residual_cost(block: BasicBlock | Bottleneck, name: str, x: Value, ctx: CostContext) -> list[OpCost]:
    """The operators of `residual_forward` on x (B, C, H, W), in forward order."""
    ops: list[OpCost] = []
    branch = block.branch()
    for i, (conv, norm, n) in enumerate(branch):
        ops.append(conv_cost(f"{name}.conv{n}", conv, ops[-1].output if ops else x, ctx))
        ops.append(norm.cost(f"{name}.bn{n}", ops[-1].output, ctx))
        if i < len(branch) - 1:  # in place: nothing new stored
            ops.append(elementwise_op(name, "relu", ops[-1].output, RELU_FLOPS, ctx, True, saves_output=True))
    out = ops[-1].output
    shortcut = x
    if block.downsample is not None:
        ops.append(conv_cost(f"{name}.downsample.0", block.downsample[0], x, ctx))
        ops.append(block.downsample[1].cost(f"{name}.downsample.1", ops[-1].output, ctx))
        shortcut = ops[-1].output
    ops.append(elementwise_op(name, "residual_add", (out, shortcut), 1, ctx, in_place=True))  # out += shortcut
    ops.append(elementwise_op(name, "relu", ops[-1].output, RELU_FLOPS, ctx, True, saves_output=True))  # in place
    return ops


class ResNetBackbone(nn.Module):
    """torchvision's ResNet up to layer4, with frozen BatchNorm: images (B, C, H, W) -> (B, C5, H / 32, W / 32)
    (H / 16, W / 16 with `dilation`).

    Stem: 7x7 stride-2 conv, norm, ReLU, 3x3 stride-2 max pool; then layer1..layer4 of residual blocks, layer2..4
    striding 2 in their first block (layer4 dilating instead with `dilation`).
    """

    def __init__(self, config: DetrConfig) -> None:
        super().__init__()
        c = config
        block = Bottleneck if c.backbone_block == "bottleneck" else BasicBlock
        self.conv1 = nn.Conv2d(c.in_chans, c.backbone_width, 7, 2, 3, bias=False)
        self.bn1 = FrozenBatchNorm2d(c.backbone_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_chs, dilation = c.backbone_width, 1
        for stage, depth in enumerate(c.backbone_depths):
            width = c.backbone_width * 2**stage
            stride = 1 if stage == 0 else 2
            first_dilation = dilation
            if stage == 3 and c.dilation:  # DC5: keep the resolution, widen the receptive field instead
                dilation, stride = 2, 1
            blocks = []
            for i in range(depth):
                blocks.append(
                    block(in_chs, width, stride if i == 0 else 1, dilation, first_dilation if i == 0 else dilation)
                )
                in_chs = width * block.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.out_channels = in_chs

    def stages(self) -> list[nn.Sequential]:
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)  # oneDNN's convolutions run fastest channels-last
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, w0, H / 4, W / 4)
        for stage in self.stages():
            x = stage(x)
        return x  # (B, C5, h, w), channels-last

    def conv_norm_pairs(self) -> list[tuple[nn.Module, str, str]]:
        """(parent, conv child name, norm child name) of every convolution followed by its frozen norm."""
        pairs: list[tuple[nn.Module, str, str]] = [(self, "conv1", "bn1")]
        for stage in self.stages():
            for block in stage:
                pairs += [(block, f"conv{n}", f"bn{n}") for _, _, n in block.branch()]
                if block.downsample is not None:
                    pairs.append((block.downsample, "0", "1"))
        return pairs

    def fold_norms(self) -> int:
        """Fold each frozen norm into the convolution before it, for inference: conv weight * scale, bias = shift,
        the norm replaced by nn.Identity (one pass over the activations less per convolution, and the affine map
        applied in the convolution's precision). Returns the norms folded; `cost()` no longer applies after."""
        folded = 0
        for parent, conv_name, norm_name in self.conv_norm_pairs():
            conv, norm = getattr(parent, conv_name), getattr(parent, norm_name)
            if not isinstance(norm, FrozenBatchNorm2d):
                continue  # folded before
            with torch.no_grad():
                scale = norm.weight * (norm.running_var + norm.eps).rsqrt()  # (C,)
                shift = norm.bias - norm.running_mean * scale  # (C,)
                conv.weight.mul_(scale[:, None, None, None])  # (C, C_in, kh, kw) scaled per output channel
                bias = shift if conv.bias is None else conv.bias * scale + shift
                conv.bias = nn.Parameter(bias, requires_grad=False)
            setattr(parent, norm_name, nn.Identity())
            folded += 1
        return folded

    def cost(self, name: str, x: Value, ctx: CostContext) -> list[OpCost]:
        """The operators of `forward` on images x (B, C, H, W), in forward order."""
        ops = [conv_cost(f"{name}.conv1", self.conv1, x, ctx)]
        ops.append(self.bn1.cost(f"{name}.bn1", ops[-1].output, ctx))
        ops.append(elementwise_op(name, "relu", ops[-1].output, RELU_FLOPS, ctx, True, saves_output=True))
        B, C, H, W = ops[-1].out_shape
        pooled = (B, C, (H - 1) // 2 + 1, (W - 1) // 2 + 1)  # kernel 3, stride 2, padding 1
        ops.append(reduce_op(f"{name}.maxpool", "max_pool", ops[-1].output, pooled, 8 * numel(pooled), ctx))  # 8 cmp
        for s, stage in enumerate(self.stages()):
            for i, block in enumerate(stage):
                ops += block.cost(f"{name}.layer{s + 1}.{i}", ops[-1].output, ctx)
        return ops


# --- position encoding, transformer, heads --------------------------------------------------------------------------


def nearest_indices(n_in: int, n_out: int, device: torch.device) -> torch.Tensor:
    """The input positions nearest-neighbour resampling reads for n_out outputs from n_in inputs: floor(i * n_in /
    n_out) with the ratio and the product rounded to float32, as `F.interpolate(mode="nearest")` computes them."""
    i = torch.arange(n_out, dtype=torch.float32, device=device)
    return (i * (n_in / n_out)).floor().long().clamp(max=n_in - 1)  # (n_out,)


def nearest_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A pixel mask (B, H, W) at the feature map's size (B, h, w), nearest-neighbour as DETR's
    `F.interpolate(mask[None].float(), size)`, written as index arithmetic: the same pixels in PyTorch and in an
    ONNX export (ONNX's Resize divides by h / H instead of multiplying by H / h, and at some sizes reads the row or
    column next to PyTorch's, moving the padding edge)."""
    _, H, W = mask.shape
    h, w = size
    rows = nearest_indices(H, h, mask.device)  # (h,)
    cols = nearest_indices(W, w, mask.device)  # (w,)
    return mask.index_select(1, rows).index_select(2, cols)  # (B, H, W) -> (B, h, W) -> (B, h, w)


class SinePositionEmbedding(nn.Module):
    """DETR's 2-D sine position encoding of the real pixels of a padded feature map (no parameters).

    A position's row y and column x count the real positions up to it, normalised by the image's real height and
    width to (0, 2 pi]; each gives F = D / 2 features sin(y / t_0), cos(y / t_0), sin(y / t_1), ... with wavelengths
    t_i = 10000^(2 floor(i / 2) / F); the y features come first.
    """

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features  # F

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """mask (B, h, w), True where the map is real -> encoding (B, h * w, 2F), float32."""
        y = mask.cumsum(1, dtype=torch.float32)  # (B, h, w): real rows up to here, 1-based
        x = mask.cumsum(2, dtype=torch.float32)  # (B, h, w): real columns up to here
        y = y / (y[:, -1:, :] + POS_EPS) * POS_SCALE  # the last row holds each column's real height
        x = x / (x[:, :, -1:] + POS_EPS) * POS_SCALE
        i = torch.arange(self.num_features, device=mask.device)
        wavelengths = POS_TEMPERATURE ** (2 * (i // 2) / self.num_features)  # (F,), pairs share a wavelength
        pos_y = y[..., None] / wavelengths  # (B, h, w, F)
        pos_x = x[..., None] / wavelengths
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)  # (B, h, w, F/2, 2) ->
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)  # (B, h, w, F)
        return torch.cat((pos_y, pos_x), dim=3).flatten(1, 2)  # (B, h, w, 2F) -> (B, N, 2F)

    def cost(self, name: str, mask: Value, ctx: CostContext) -> OpCost:
        """The encoding of a mask (B, h, w): a divide and a sine or cosine per output element (the cumulative
        sums and normalisation, per position, are left out)."""
        B, h, w = mask.shape
        out = new_value((B, h * w, 2 * self.num_features), ctx)
        return OpCost(name, "sine", (mask,), out, 0, 2 * numel(out.shape))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer on tokens (B, N, D): x = norm1(x + attn(q = k = x + pos, v = x)); x = norm2(x + ffn(x)).

    Args:
        dim: width D.
        num_heads: attention heads.
        dim_feedforward: hidden width of the ReLU feed-forward block.
        drop: dropout after the attention and in the feed-forward block.
        attn_drop: dropout on the attention weights.
        backend: attention backend.
    """

    def __init__(
        self, dim: int, num_heads: int, dim_feedforward: int, drop: float, attn_drop: float, backend: str
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim_feedforward, drop=drop, act="relu")
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x, pos (B, N, D); mask (B, 1, 1, N) True at real positions, or None."""
        q = x + pos  # queries and keys carry the positions, values do not
        x = self.norm1(x + self.self_attn(q, mask, value=x))
        return self.norm2(x + self.mlp(x))

    def cost(self, name: str, x: Value, pos: Value, mask: Value | None, ctx: CostContext) -> list[OpCost]:
        """The operators of `forward` on tokens x (B, N, D), in forward order."""
        ops = [elementwise_op(name, "+pos", (x, pos), 1, ctx)]  # BND
        ops += self.self_attn.cost(f"{name}.self_attn", ops[-1].output, ctx, mask, value=x)
        ops.append(elementwise_op(name, "residual_add", (x, ops[-1].output), 1, ctx))  # BND
        ops.append(layer_norm_op(f"{name}.norm1", ops[-1].output, ctx))  # 8BND
        x = ops[-1].output
        ops += self.mlp.cost(f"{name}.mlp", x, ctx)
        ops.append(elementwise_op(name, "residual_add", (x, ops[-1].output), 1, ctx))  # BND
        ops.append(layer_norm_op(f"{name}.norm2", ops[-1].output, ctx))  # 8BND
        return ops


class DecoderLayer(nn.Module):
    """Post-norm decoder layer on the query slots tgt (B, Q, D):
    tgt = norm1(tgt + self_attn(q = k = tgt + query_pos, v = tgt));
    tgt = norm2(tgt + cross_attn(q = tgt + query_pos, k = memory + pos, v = memory));
    tgt = norm3(tgt + ffn(tgt)). Arguments as for `EncoderLayer`.
    """

    def __init__(
        self, dim: int, num_heads: int, dim_feedforward: int, drop: float, attn_drop: float, backend: str
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim_feedforward, drop=drop, act="relu")
        self.norm3 = nn.LayerNorm(dim)

    def forward(
        self,
        tgt: torch.Tensor,
        query_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_key: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """tgt (B, Q, D), query_pos (Q, D), memory and memory_key = memory + pos (B, N, D), mask (B, 1, 1, N) / None."""
        q = tgt + query_pos
        tgt = self.norm1(tgt + self.self_attn(q, value=tgt))
        tgt = self.norm2(tgt + self.cross_attn(tgt + query_pos, mask, key=memory_key, value=memory))
        return self.norm3(tgt + self.mlp(tgt))

    def cost(
        self,
        name: str,
        tgt: Value,
        query_pos: Value,
        memory: Value,
        memory_key: Value,
        mask: Value | None,
        ctx: CostContext,
    ) -> list[OpCost]:
        """The operators of `forward` on the query slots tgt (B, Q, D), in forward order."""
        ops = [elementwise_op(name, "+query_pos", (tgt, query_pos), 1, ctx)]  # BQD
        ops += self.self_attn.cost(f"{name}.self_attn", ops[-1].output, ctx, value=tgt)
        ops.append(elementwise_op(name, "residual_add", (tgt, ops[-1].output), 1, ctx))  # BQD
        ops.append(layer_norm_op(f"{name}.norm1", ops[-1].output, ctx))  # 8BQD
        tgt = ops[-1].output
        ops.append(elementwise_op(name, "+query_pos", (tgt, query_pos), 1, ctx))  # BQD
        ops += self.cross_attn.cost(f"{name}.cross_attn", ops[-1].output, ctx, mask, key=memory_key, value=memory)
        ops.append(elementwise_op(name, "residual_add", (tgt, ops[-1].output), 1, ctx))  # BQD
        ops.append(layer_norm_op(f"{name}.norm2", ops[-1].output, ctx))  # 8BQD
        tgt = ops[-1].output
        ops += self.mlp.cost(f"{name}.mlp", tgt, ctx)
        ops.append(elementwise_op(name, "residual_add", (tgt, ops[-1].output), 1, ctx))  # BQD
        ops.append(layer_norm_op(f"{name}.norm3", ops[-1].output, ctx))  # 8BQD
        return ops


class Encoder(nn.Module):
    """`EncoderLayer` x depth over the image tokens (B, N, D); no final norm (post-norm layers end normalised)."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(**layer) for _ in range(depth)])

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, mask)
        return x  # (B, N, D)

    def cost(self, name: str, x: Value, pos: Value, mask: Value | None, ctx: CostContext) -> list[OpCost]:
        ops: list[OpCost] = []
        for i, layer in enumerate(self.layers):
            ops += layer.cost(f"{name}.layers.{i}", ops[-1].output if ops else x, pos, mask, ctx)
        return ops


class Decoder(nn.Module):
    """`DecoderLayer` x depth from empty query slots; every layer's output through the one final `norm`."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        dim = layer["dim"]
        self.layers = nn.ModuleList([DecoderLayer(**layer) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)

    def forward(
        self, query_pos: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """query_pos (Q, D), memory and pos (B, N, D), mask (B, 1, 1, N) or None -> (L, B, Q, D).

        The slots start at zero; the normalised outputs are read out, while each layer takes the previous one's
        output as it was (DETR's `return_intermediate`). The query positions broadcast over the batch.
        """
        tgt = memory.new_zeros(memory.shape[0], *query_pos.shape)  # (B, Q, D)
        memory_key = memory + pos  # the keys of every cross-attention
        outputs = []
        for layer in self.layers:
            tgt = layer(tgt, query_pos, memory, memory_key, mask)
            outputs.append(self.norm(tgt))
        return torch.stack(outputs)  # (L, B, Q, D)

    def cost(
        self, name: str, query_pos: Value, memory: Value, pos: Value, mask: Value | None, ctx: CostContext
    ) -> list[OpCost]:
        B, Q, D = memory.shape[0], *query_pos.shape
        ops = [copy_op(name, "zeros", query_pos, (B, Q, D), ctx)]  # the empty slots (B, Q, D)
        tgt = ops[-1].output
        ops.append(elementwise_op(name, "+pos", (memory, pos), 1, ctx))  # BND
        memory_key = ops[-1].output
        outputs = []
        for i, layer in enumerate(self.layers):
            ops += layer.cost(f"{name}.layers.{i}", tgt, query_pos, memory, memory_key, mask, ctx)
            tgt = ops[-1].output
            ops.append(layer_norm_op(f"{name}.norm", tgt, ctx))  # 8BQD
            outputs.append(ops[-1].output)
        ops.append(OpCost(name, "stack", tuple(outputs), new_value((len(outputs), B, Q, D), ctx), 0, 0))
        return ops


class BoxMLP(nn.Module):
    """The box head: Linear -> ReLU -> Linear -> ReLU -> Linear -> sigmoid: (..., D) -> (cx, cy, w, h) in [0, 1]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x.sigmoid()

    def cost(self, name: str, x: Value, ctx: CostContext) -> list[OpCost]:
        ops: list[OpCost] = []
        for i, layer in enumerate(self.layers):
            ops.append(
                linear_op(f"{name}.layers.{i}", "linear", ops[-1].output if ops else x, layer.out_features, True, ctx)
            )
            if i < len(self.layers) - 1:
                ops.append(elementwise_op(name, "relu", ops[-1].output, RELU_FLOPS, ctx, saves_output=True))
        ops.append(elementwise_op(name, "sigmoid", ops[-1].output, SIGMOID_FLOPS, ctx, saves_output=True))
        return ops


class DETR(nn.Module):
    """DETR built from a `DetrConfig`.

    ``model(images, pixel_mask=None)``: images (B, C, H, W) and pixel_mask (B, H, W), 1 / True where a pixel is
    real and 0 / False where it pads the image (default: all real; `vitkit.detection.pad_images` batches images of
    different sizes) -> a dict, always with the same keys:

    - ``pred_logits`` (B, Q, K + 1): class logits, the last "no object";
    - ``pred_boxes`` (B, Q, 4): boxes (cx, cy, w, h) relative to each image's unpadded size;
    - ``aux_outputs``: a list of such dicts (without `aux_outputs`), one per earlier decoder layer, for the
      auxiliary losses; empty when `config.aux_loss` is False.

    The model interface (`vitkit.models.interface`) for a detector: `forward_features` returns the decoder's
    normalised outputs of every layer (L, B, Q, D), `forward_head` turns them into the dict above (with `pre_logits`,
    the last layer's object embeddings (B, Q, D)), and `token_grid` is None: the decoder's attention runs over
    object queries, not over a token grid of the image.
    """

    def __init__(self, config: DetrConfig) -> None:
        super().__init__()
        self.config = c = config
        self.backbone = ResNetBackbone(c)
        self.input_proj = nn.Conv2d(self.backbone.out_channels, c.hidden_dim, 1)
        self.position_embedding = SinePositionEmbedding(c.hidden_dim // 2)
        self.query_embed = nn.Embedding(c.num_queries, c.hidden_dim)
        layer = dict(
            dim=c.hidden_dim,
            num_heads=c.num_heads,
            dim_feedforward=c.dim_feedforward,
            drop=c.drop_rate,
            attn_drop=c.attn_drop_rate,
            backend=c.attn_backend,
        )
        self.encoder = Encoder(c.enc_layers, **layer)
        self.decoder = Decoder(c.dec_layers, **layer)
        self.class_embed = nn.Linear(c.hidden_dim, c.num_classes + 1)
        self.bbox_embed = BoxMLP(c.hidden_dim)
        self.init_weights()
        if not c.train_stem:  # DETR trains layer2..layer4 of the backbone only
            for module in (self.backbone.conv1, self.backbone.layer1):
                module.requires_grad_(False)

    def init_weights(self) -> None:
        """DETR's initialisation: backbone convolutions as torchvision's ResNet (normal, fan out), the transformer's
        matrices Xavier-uniform with zero attention biases (nn.MultiheadAttention's), the rest PyTorch's defaults."""
        for module in self.backbone.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        for part in (self.encoder, self.decoder):
            for p in part.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
            for module in part.modules():
                if isinstance(module, Attention):
                    nn.init.zeros_(module.qkv.bias)
                    nn.init.zeros_(module.proj.bias)

    def check_input(self, images: torch.Tensor, pixel_mask: torch.Tensor | None) -> torch.Tensor | None:
        """ValueError unless images are (B, in_chans, H, W) floats (of `img_size` without `dynamic_img_size`) and
        pixel_mask is None or (B, H, W); the mask as booleans."""
        c = self.config
        if images.ndim != 4 or images.shape[1] != c.in_chans:
            raise ValueError(f"DETR expects images (B, {c.in_chans}, H, W), got shape {tuple(images.shape)}")
        if not images.is_floating_point():
            raise ValueError(f"DETR expects floating-point images, got dtype {images.dtype}")
        B, _, H, W = images.shape
        if not c.dynamic_img_size and (H, W) != to_2tuple(c.img_size):
            h, w = to_2tuple(c.img_size)
            raise ValueError(
                f"expected images of size {h}x{w}, got {H}x{W}; build the model with dynamic_img_size=True to "
                "accept other sizes"
            )
        if pixel_mask is None:
            return None
        if tuple(pixel_mask.shape) != (B, H, W):
            raise ValueError(
                f"pixel_mask must be (B, H, W) = {(B, H, W)} like the images, got shape {tuple(pixel_mask.shape)}"
            )
        return pixel_mask if pixel_mask.dtype == torch.bool else pixel_mask != 0

    def forward_features(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Images (B, C, H, W) and pixel_mask (B, H, W) or None -> the decoder's normalised outputs (L, B, Q, D)."""
        pixel_mask = self.check_input(images, pixel_mask)
        features = self.backbone(images)  # (B, C5, h, w)
        B, _, h, w = features.shape
        if pixel_mask is None:
            mask = torch.ones(B, h, w, dtype=torch.bool, device=images.device)
        else:
            mask = nearest_mask(pixel_mask, (h, w))  # (B, h, w)
        pos = self.position_embedding(mask).to(features.dtype)  # (B, N, D)
        x = self.input_proj(features).flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, D, N) -> (B, N, D)
        attn_mask = None if pixel_mask is None else mask.flatten(1)[:, None, None, :]  # (B, 1, 1, N), True: attend
        memory = self.encoder(x, pos, attn_mask)  # (B, N, D)
        return self.decoder(self.query_embed.weight, memory, pos, attn_mask)  # (Q, D) -> (L, B, Q, D)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> dict[str, Any] | torch.Tensor:
        """Decoder outputs (L, B, Q, D) -> the predictions dict (see the class), or with `pre_logits` the last
        layer's object embeddings (B, Q, D)."""
        if pre_logits:
            return x[-1]
        x = x if self.config.aux_loss else x[-1:]  # (L, B, Q, D), or only the last layer (1, B, Q, D)
        logits = self.class_embed(x)  # (L, B, Q, K + 1)
        boxes = self.bbox_embed(x)  # (L, B, Q, 4)
        aux = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1], strict=True)]
        return {"pred_logits": logits[-1], "pred_boxes": boxes[-1], "aux_outputs": aux}

    def forward(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, Any]:
        return self.forward_head(self.forward_features(images, pixel_mask))

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each backbone block and each encoder and decoder layer in backward
        (`vitkit.models.interface.VitkitModel`); the blocks now checkpointed."""
        blocks = [*(b for stage in self.backbone.stages() for b in stage), *self.encoder.layers, *self.decoder.layers]
        return checkpoint_blocks(blocks, enable)

    def token_grid(self, img_size: tuple[int, int]) -> None:
        """None: the encoder attends over the feature map's tokens, but the decoder over object queries, so no one
        token grid serves every attention layer."""
        return None

    def cost(
        self, img_size: tuple[int, int], batch: int = 1, dtype: torch.dtype = torch.float32, device: Device = "cpu"
    ) -> list[OpCost]:
        """The operators of `forward` on a (batch, C, H, W) input without pixel mask, in forward order."""
        c, ctx = self.config, CostContext(dtype, device)
        self.check_input(torch.empty(batch, c.in_chans, *img_size, device="meta"), None)
        ops = self.backbone.cost("backbone", given((batch, c.in_chans, *img_size)), ctx)  # the input image
        features = ops[-1].output  # (B, C5, h, w)
        B, _, h, w = features.shape
        N, D, Q = h * w, c.hidden_dim, c.num_queries
        ops.append(copy_op("position_embedding", "ones", features, (B, h, w), ctx))  # the all-real mask
        ops.append(self.position_embedding.cost("position_embedding", ops[-1].output, ctx))  # (B, N, D)
        pos = ops[-1].output
        ops.append(conv_cost("input_proj", self.input_proj, features, ctx))  # (B, D, h, w)
        tokens = view(ops[-1].output, (B, N, D))  # flatten + transpose: a view
        ops += self.encoder.cost("encoder", tokens, pos, None, ctx)
        memory = ops[-1].output
        ops += self.decoder.cost("decoder", given((Q, D)), memory, pos, None, ctx)  # query_pos: the table (Q, D)
        L = c.dec_layers if c.aux_loss else 1
        states = view(ops[-1].output, (L, B, Q, D))  # all layers, or the last one: views
        ops.append(linear_op("class_embed", "linear", states, c.num_classes + 1, True, ctx))  # LBQD(K+1)
        ops += self.bbox_embed.cost("bbox_embed", states, ctx)
        return ops


register_family("detr", DetrConfig, DETR)

register_model("detr_resnet50", "detr", DetrConfig(), DETR_PAPER)
register_model("detr_resnet50_dc5", "detr", DetrConfig(dilation=True), DETR_PAPER)
register_model("detr_resnet101", "detr", DetrConfig(backbone_depths=(3, 4, 23, 3)), DETR_PAPER)
register_model("detr_resnet101_dc5", "detr", DetrConfig(backbone_depths=(3, 4, 23, 3), dilation=True), DETR_PAPER)
# vitkit's small DETR for training on a few CPU cores (the paper's recipe at a fraction of the cost): a ResNet-18
# layout at half width (basic blocks 2-2-2-2, 32..256 channels, trained from the stem up since no pretrained
# backbone is loaded), D = 128 with 4 heads, 2 encoder and 2 decoder layers, FFN 512, 25 queries, 256x256 images.
DETR_TINY = DetrConfig(
    img_size=(256, 256),
    backbone_block="basic",
    backbone_depths=(2, 2, 2, 2),
    backbone_width=32,
    train_stem=True,
    hidden_dim=128,
    num_heads=4,
    enc_layers=2,
    dec_layers=2,
    dim_feedforward=512,
    num_queries=25,
)
register_model("detr_tiny", "detr", DETR_TINY, DETR_PAPER)
# detr_tiny sized for builtin:digits-detect (96x96 canvases of 1-4 digits of 20-40 px), vitkit's default detector:
# the last stage dilated (DC5) so that a 96x96 image gives a 6x6 map of 16-pixel cells, about one per digit side,
# where stride 32 would leave 3x3; 12 queries (three times the most digits of a canvas); 4 decoder layers (2 left
# more duplicate and looser boxes: AP 0.45 against 0.50 after the same 20 epochs, BENCHMARKS.md); no dropout (runs
# of minutes).
register_model(
    "detr_digits",
    "detr",
    dataclasses.replace(
        DETR_TINY,
        img_size=(96, 96),
        dilation=True,
        dec_layers=4,
        drop_rate=0.0,
        attn_drop_rate=0.0,
        num_queries=12,
    ),
    DETR_PAPER,
)
