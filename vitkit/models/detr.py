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

The backbone is vitkit's one ResNet (`vitkit.models.resnet`, torchvision's module names, frozen BatchNorm), the
encoder and decoder are `vitkit.models.transformer`'s, the sine encoding `vitkit.layers.pos_embed`'s.

Parameter names follow the original code where it has them (`input_proj`, `query_embed`, `class_embed`,
`bbox_embed.layers.*`, torchvision's ResNet names under `backbone.`); `vitkit.weights.detr` converts transformers'
`DetrForObjectDetection` checkpoints.

Letters: B batch, H, W image size, h, w feature-map size, N = h * w tokens, C5 backbone channels, D model width,
Q object queries, L decoder layers, K classes, F = D / 2 position features per axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers import Attention, check_backend, to_2tuple
from vitkit.layers.pos_embed import SinePositionEmbedding, nearest_mask
from vitkit.models.backbone import ClassifierBackbone, backbone_outputs, check_backbone_choice, pad_to_multiple
from vitkit.models.detr_masks import MaskHead, ObjectAttentionMap, check_mask_head
from vitkit.models.interface import CostFromImages, SpatialAttention, check_detector_input, checkpoint_blocks
from vitkit.models.registry import (
    Fields,
    PublishedWeights,
    as_fields,
    check_field_types,
    check_positive,
    check_rates,
    register_family,
    register_model,
)
from vitkit.models.resnet import (
    BACKBONE_NORMS,
    RESNET50_TV,
    RESNET50_TV2,
    RESNET101_TV,
    RESNET101_TV2,
    BasicBlock,
    Bottleneck,
    ResNet,
    make_stem,
    stage_plan,
)
from vitkit.models.transformer import Decoder, Encoder

DETR_PAPER = "End-to-End Object Detection with Transformers (Carion et al., arXiv:2005.12872)"
BLOCKS = ("basic", "bottleneck")


@dataclass(frozen=True)
class DetrConfig:
    img_size: int | tuple[int, int] = (800, 1216)  # nominal (H, W) (an int for square): what costs and profiles
    # assume; any size runs while dynamic_img_size is True (the paper resizes the short side to 800, long <= 1333)
    in_chans: int = 3  # image channels
    num_classes: int = 91  # object classes K; the class head has K + 1 outputs, the last "no object" (COCO: 91,
    # the largest category id + 1, as DETR)
    backbone: str = "resnet"  # "resnet" (the fields below) or a registered Swin or ViT variant whose last stage or
    # block gives the map (`vitkit.models.backbone.ClassifierBackbone`, with this config's in_chans, no head)
    backbone_args: Fields = ()  # a Swin or ViT backbone's config fields to replace, e.g. {"window_size": 14} (a dict,
    # kept as sorted (name, value) pairs)
    backbone_scales: tuple[float, ...] = ()  # a Swin or ViT backbone's map: () its last output as it is; (s,) that
    # output at ViTDet's scale s (of 4, 2, 1, 0.5; e.g. 0.5: a patch-16 ViT's map at stride 32)
    backbone_block: str = "bottleneck"  # "bottleneck" (1x1-3x3-1x1: ResNet-50/101) or "basic" (3x3-3x3: ResNet-18/34)
    backbone_depths: tuple[int, ...] = (3, 4, 6, 3)  # blocks of layer1..layer4: ResNet-50 (3, 4, 6, 3), ResNet-101
    # (3, 4, 23, 3), ResNet-18 (2, 2, 2, 2), ResNet-34 (3, 4, 6, 3) with basic blocks
    backbone_width: int = 64  # stem channels and layer1's inner width, doubled by each later stage (64: torchvision)
    dilation: bool = False  # DC5: layer4 dilates its 3x3 convolutions instead of striding (feature stride 16, not 32)
    backbone_norm: str = "frozen"  # "frozen" (DETR's frozen BatchNorm) or "batch" (trained: a backbone from scratch)
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
    attn_backend: str = "auto"  # "auto", "sdpa" (fused kernel) or "math" (the reference formula); see layers.attention
    masks: bool = False  # DETR's mask head (`vitkit.models.detr_masks`, the paper's panoptic model): `pred_masks`, a
    # mask logit map per query at stride 4, from the ResNet's four maps

    def __post_init__(self) -> None:
        object.__setattr__(self, "backbone_args", as_fields(self.backbone_args))
        check_field_types(self)
        check_positive(
            self, "in_chans", "num_classes", "backbone_width", "hidden_dim", "num_heads", "enc_layers", "dec_layers"
        )
        check_positive(self, "dim_feedforward", "num_queries")
        check_rates(self, "drop_rate", "attn_drop_rate")
        check_backbone_norm(self.backbone_norm)
        H, W = to_2tuple(self.img_size)
        if H <= 0 or W <= 0:
            raise ValueError(f"img_size must be positive, got {self.img_size!r}")
        if self.backbone_block not in BLOCKS:
            raise ValueError(f"backbone_block must be one of {BLOCKS}, got {self.backbone_block!r}")
        if len(self.backbone_depths) != 4 or min(self.backbone_depths) < 1:
            raise ValueError(
                f"backbone_depths needs 4 stages of >= 1 block (layer1..layer4), got {self.backbone_depths}"
            )
        if len(self.backbone_scales) > 1:
            raise ValueError(f"DETR reads one map: backbone_scales takes one scale or none, got {self.backbone_scales}")
        check_backbone_choice(self, self.outputs)
        if self.masks:
            check_mask_head(self.hidden_dim, self.num_heads)
        if self.masks and self.backbone != "resnet":
            raise ValueError(
                f"DETR's mask head reads a ResNet's layer1..layer3 maps; backbone {self.backbone!r} has none: use "
                "backbone='resnet' with masks=True"
            )
        if self.hidden_dim % self.num_heads != 0:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}")
        if self.hidden_dim % 4 != 0:
            raise ValueError(f"hidden_dim {self.hidden_dim} must be a multiple of 4 (sine and cosine per axis)")
        check_backend(self.attn_backend)

    @property
    def outputs(self) -> tuple[int, ...]:
        """The backbone output that gives the map: a ResNet's layer4, a Swin's last stage or a ViT's last block."""
        if self.backbone == "resnet":
            return (1, 2, 3, 4) if self.masks else (4,)
        return (backbone_outputs(self.backbone, dict(self.backbone_args)),)


def check_backbone_norm(norm: str) -> None:
    """ValueError unless `norm` names a detector backbone's norm (`vitkit.models.resnet.BACKBONE_NORMS`)."""
    if norm not in BACKBONE_NORMS:
        raise ValueError(f"backbone_norm must be one of {tuple(BACKBONE_NORMS)}, got {norm!r}")


def resnet_backbone(config: Any, out_indices: Sequence[int] = (3,)) -> ResNet:
    """torchvision's ResNet with frozen BatchNorm (basic or bottleneck blocks, layer4 dilated for DC5), built from a
    detector config's backbone fields (`in_chans`, `backbone_block`, `backbone_depths`, `backbone_width`,
    `dilation`, `backbone_norm`, as `DetrConfig`'s): images (B, C, H, W) -> the maps of the stages in `out_indices`
    (0: layer1 .. 3: layer4), coarsest last. DETR's default reads layer4 alone: [(B, C5, H / 32, W / 32)] (H / 16,
    W / 16 with `dilation`)."""
    c = config
    norm = BACKBONE_NORMS[c.backbone_norm]
    stem = make_stem(c.in_chans, c.backbone_width, "torchvision", norm=norm)
    stages, in_chs = [], c.backbone_width
    for s, plan in enumerate(stage_plan(c.backbone_depths, dilate_last=c.dilation)):
        width = c.backbone_width * 2**s
        blocks = []
        for stride, dilation, first in plan:
            if c.backbone_block == "bottleneck":
                blocks.append(Bottleneck(in_chs, 4 * width, width, stride, dilation, first, norm=norm))
                in_chs = 4 * width
            else:
                blocks.append(BasicBlock(in_chs, width, stride, dilation, first, norm=norm))
                in_chs = width
        stages.append(blocks)
    return ResNet(stem, stages, "torchvision", out_indices)


def channels_last_convolutions(backbone: nn.Module) -> None:
    """A ResNet backbone's convolution weights channels-last, as the images it reads (`Detr`, `DeformableDetr`):
    oneDNN's and cuDNN's kernels take both so, and a weight in the other order is copied over at every call and its
    gradient back (a step of deformable_detr_small on CPU at batch 2 and 96-160 px: 110 against 119 ms). Called
    after the initialisation, which fills a tensor in its memory order: the same seed gives the same weights."""
    if isinstance(backbone, ResNet):
        backbone.to(memory_format=torch.channels_last)


class Encoded(NamedTuple):
    """What DETR's backbone and encoder give the decoder and the mask head."""

    maps: list[torch.Tensor]  # the backbone's maps, layer4 (B, C5, h, w) last (with masks: layer1..layer4)
    projected: torch.Tensor  # input_proj(layer4): (B, D, h, w)
    memory: torch.Tensor  # the encoder's output (B, N, D)
    pos: torch.Tensor  # the sine position encoding (B, N, D)
    attn_mask: torch.Tensor | None  # (B, 1, 1, N), True: a real token; None: no padding


class DetrDecoding(NamedTuple):
    """What DETR's `forward_features` gives its `forward_head`."""

    states: torch.Tensor  # the decoder's normalised outputs of every layer (L, B, Q, D)
    encoded: Encoded | None = None  # with the mask head: the maps and memory it reads beside the last layer


class BoxMLP(nn.Module):
    """The box head: Linear -> ReLU -> Linear -> ReLU -> Linear -> sigmoid: (..., D) -> (cx, cy, w, h) in [0, 1]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x.sigmoid()


class DETR(CostFromImages, nn.Module):
    """DETR built from a `DetrConfig`.

    ``model(images, pixel_mask=None)``: images (B, C, H, W) and pixel_mask (B, H, W), 1 / True where a pixel is
    real and 0 / False where it pads the image (default: all real; `vitkit.detection.pad_images` batches images of
    different sizes) -> a dict, always with the same keys:

    - ``pred_logits`` (B, Q, K + 1): class logits, the last "no object";
    - ``pred_boxes`` (B, Q, 4): boxes (cx, cy, w, h) relative to each image's unpadded size;
    - ``aux_outputs``: a list of such dicts (without `aux_outputs`), one per earlier decoder layer, for the
      auxiliary losses; empty when `config.aux_loss` is False.

    - with the mask head (`config.masks`), ``pred_masks`` (B, Q, H / 4, W / 4): each query's mask logits over the
      padded image (`vitkit.models.detr_masks`), from the last decoder layer.

    The model interface (`vitkit.models.interface`) for a detector: `forward_features` returns a `DetrDecoding`
    (the decoder's normalised outputs of every layer (L, B, Q, D), and what the mask head reads), `forward_head`
    turns it into the dict above (with `pre_logits`, the last layer's object embeddings (B, Q, D)), and
    `token_grid` is None: the decoder's attention runs over object queries, not over a token grid of the image.
    """

    no_object_logit = True  # K class logits and "no object" last (`vitkit.models.interface.VitkitDetector`)

    def __init__(self, config: DetrConfig) -> None:
        super().__init__()
        self.config = c = config
        if c.backbone == "resnet":
            self.backbone = resnet_backbone(c, [stage - 1 for stage in c.outputs])
        else:
            fields = {"attn_backend": c.attn_backend, **dict(c.backbone_args)}  # the backbone's attention too
            self.backbone = ClassifierBackbone(c.backbone, c.outputs, c.backbone_scales, fields, c.in_chans)
        self.input_proj = nn.Conv2d(self.backbone.out_channels[-1], c.hidden_dim, 1)
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
        if c.masks:  # layer4 feeds the transformer, layer3..layer1 the mask head's upsampling
            self.bbox_attention = ObjectAttentionMap(c.hidden_dim, c.num_heads)
            self.mask_head = MaskHead(c.hidden_dim, c.num_heads, self.backbone.out_channels[-2::-1])
        self.init_weights()
        channels_last_convolutions(self.backbone)
        if not c.train_stem:  # DETR trains layer2..layer4 of a ResNet only
            for module in self.backbone.early_layers():
                module.requires_grad_(False)

    def init_weights(self) -> None:
        """DETR's initialisation: backbone convolutions as torchvision's ResNet (normal, fan out; a Swin or ViT its
        own), the transformer's matrices Xavier-uniform with zero attention biases (nn.MultiheadAttention's), the
        rest PyTorch's defaults."""
        self.backbone.reset_parameters()
        for part in (self.encoder, self.decoder):
            for p in part.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
            for module in part.modules():
                if isinstance(module, Attention):
                    nn.init.zeros_(module.qkv.bias)
                    nn.init.zeros_(module.proj.bias)

    def check_input(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """ValueError unless images are (B, in_chans, H, W) floats (of `img_size` without `dynamic_img_size`) and
        pixel_mask is None or (B, H, W); the mask as booleans."""
        return check_detector_input(self.config, images, pixel_mask, "DETR")

    def _encode(self, images: torch.Tensor, pixel_mask: torch.Tensor | None) -> Encoded:
        pixel_mask = self.check_input(images, pixel_mask)
        images, pixel_mask = pad_to_multiple(images, pixel_mask, self.backbone.size_multiple)
        # oneDNN's convolutions run fastest channels-last
        maps = self.backbone(images.contiguous(memory_format=torch.channels_last))  # layer4 (B, C5, h, w) last
        B, _, h, w = maps[-1].shape
        if pixel_mask is None:
            mask = torch.ones(B, h, w, dtype=torch.bool, device=images.device)
        else:
            mask = nearest_mask(pixel_mask, (h, w))  # (B, h, w)
        pos = self.position_embedding(mask).to(maps[-1].dtype)  # (B, N, D)
        projected = self.input_proj(maps[-1])  # (B, D, h, w)
        x = projected.flatten(2).transpose(1, 2)  # (B, D, N) -> (B, N, D)
        attn_mask = None if pixel_mask is None else mask.flatten(1)[:, None, None, :]  # (B, 1, 1, N), True: attend
        memory = self.encoder(x, pos, attn_mask)  # (B, N, D)
        return Encoded(maps, projected, memory, pos, attn_mask)

    def _decode(self, encoded: Encoded) -> torch.Tensor:
        return self.decoder(self.query_embed.weight, encoded.memory, encoded.pos, encoded.attn_mask)  # (L, B, Q, D)

    def _masks(self, encoded: Encoded, objects: torch.Tensor) -> torch.Tensor:
        """Each query's mask logits (B, Q, H / 4, W / 4) from the last decoder layer's outputs (B, Q, D)."""
        token_mask = None if encoded.attn_mask is None else encoded.attn_mask[:, 0, 0]  # (B, N)
        grid = tuple(encoded.projected.shape[-2:])
        maps = self.bbox_attention(objects, encoded.memory, grid, token_mask)  # (B, Q, M, h, w)
        return self.mask_head(encoded.projected, maps, encoded.maps[-2::-1])  # layer3, layer2, layer1

    def forward_features(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> DetrDecoding:
        """Images (B, C, H, W) and pixel_mask (B, H, W) or None -> the decoder's normalised outputs (L, B, Q, D), with
        what the mask head reads where the model has one (`DetrDecoding`)."""
        encoded = self._encode(images, pixel_mask)
        return DetrDecoding(self._decode(encoded), encoded if self.config.masks else None)

    def forward_head(self, x: DetrDecoding, pre_logits: bool = False) -> dict[str, Any] | torch.Tensor:
        """A `DetrDecoding` -> the predictions dict (see the class), or with `pre_logits` the last layer's object
        embeddings (B, Q, D)."""
        states = x.states  # (L, B, Q, D)
        if pre_logits:
            return states[-1]
        layers = states if self.config.aux_loss else states[-1:]  # (L, B, Q, D), or only the last layer
        logits = self.class_embed(layers)  # (L, B, Q, K + 1)
        boxes = self.bbox_embed(layers)  # (L, B, Q, 4)
        aux = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1], strict=True)]
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1], "aux_outputs": aux}
        if x.encoded is not None:  # the mask head, on the last layer's outputs
            out["pred_masks"] = self._masks(x.encoded, states[-1])
        return out

    def forward(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, Any]:
        return self.forward_head(self.forward_features(images, pixel_mask))

    @property
    def predicts_masks(self) -> bool:
        """Whether the outputs hold `pred_masks` (`vitkit.models.interface.VitkitDetector`)."""
        return self.config.masks

    def shard_units(self) -> list[nn.Module]:
        """Each backbone block and each encoder and decoder layer (`vitkit.models.interface.VitkitModel`)."""
        return [*self.backbone.blocks(), *self.encoder.layers, *self.decoder.layers]

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each backbone block and each encoder and decoder layer in backward
        (`vitkit.models.interface.VitkitModel`); the blocks now checkpointed."""
        return checkpoint_blocks(self.shard_units(), enable)

    def token_grid(self, img_size: tuple[int, int]) -> None:
        """None: the encoder attends over the feature map's tokens, but the decoder over object queries, so no one
        token grid serves every attention layer."""
        return None

    def no_weight_decay(self) -> set[str]:
        """None besides the parameters of ndim <= 1."""
        return set()

    def predict(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The last decoder layer's ``pred_logits`` (B, Q, K + 1) and ``pred_boxes`` (B, Q, 4), no auxiliary
        outputs (`vitkit.models.interface.VitkitDetector`)."""
        decoding = self.forward_features(images, pixel_mask)
        out = self.forward_head(decoding._replace(states=decoding.states[-1:]))  # heads on the last layer only
        return {k: v for k, v in out.items() if k != "aux_outputs"}

    def reset_classifier(self, num_classes: int, prior: float | None = None) -> None:
        """A fresh `class_embed` for `num_classes` classes and "no object" (PyTorch's Linear initialisation, as
        DETR's); with `prior`, biases of -log((1 - prior) / prior), so that every class starts at probability
        `prior` under a sigmoid (Deformable DETR's focal-loss initialisation)."""
        if num_classes <= 0:
            raise ValueError(f"num_classes must be > 0, got {num_classes}")
        if prior is not None and not 0 < prior < 1:
            raise ValueError(f"prior must be a probability in (0, 1), got {prior}")
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        weight = self.class_embed.weight
        self.class_embed = nn.Linear(self.config.hidden_dim, num_classes + 1).to(weight.device, weight.dtype)
        if prior is not None:
            with torch.no_grad():
                self.class_embed.bias.fill_(-math.log((1 - prior) / prior))

    def object_attention_layers(self) -> list[str]:
        """Each decoder layer's cross-attention, first to last: (B, heads, Q, h * w) over the encoder's tokens."""
        return [f"decoder.layers.{i}.cross_attn" for i in range(len(self.decoder.layers))]

    def feature_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The backbone's (h, w) for images of `img_size`: the map the encoder and the cross-attention read."""
        return self.backbone.feature_sizes(img_size)[-1]

    def spatial_attention(self, maps: Mapping[str, torch.Tensor], img_size: tuple[int, int]) -> list[SpatialAttention]:
        """Each captured encoder layer's self-attention (B, h, hw, hw) laid on the feature map of (padded) images of
        `img_size`: every position's row over all positions, the DETR paper's figure 3
        (`vitkit.models.interface.SpatialAttention`)."""
        h, w = self.feature_grid(img_size)
        keys = torch.arange(h * w).expand(h * w, h * w)  # every position attends to every position
        names = [f"encoder.layers.{i}.self_attn" for i in range(len(self.encoder.layers))]
        note = f"all {h}x{w} positions of the feature map"
        return [SpatialAttention(name, (h, w), keys, maps[name], note) for name in names if name in maps]


# DETR's recipe (Carion et al., arXiv:2005.12872): AdamW, lr 1e-4 with the backbone at 1e-5, weight decay 1e-4,
# gradient clipping 0.1, the softmax cross-entropy loss. DETR trains 500 epochs with a tenfold drop at 400; here the
# cosine decay ends at the same tenth (min_lr).
DETR_RECIPE = dict(
    epochs=50, batch_size=4, lr=1e-4, min_lr=1e-5, warmup_epochs=0.0, weight_decay=1e-4, clip_grad=0.1,
    backbone_lr=1e-5, detection_loss="ce", box_cls_loss=0.0, detection_top_k=0, nms_iou=0.0,
)  # fmt: skip
# The small DETRs trained from scratch on two CPU cores (BENCHMARKS.md, "Detection"): the backbone learns as fast as
# the rest, it also classifies the ground-truth boxes (`box_cls_loss`), and detections are read as the 100 most
# probable (query, class) pairs with per-class NMS at IoU 0.7.
SMALL_DETR_RECIPE = dict(
    epochs=24, batch_size=16, lr=3e-4, min_lr=3e-6, warmup_epochs=0.5, backbone_lr=3e-4, box_cls_loss=1.0,
    detection_top_k=100, nms_iou=0.7,
)  # fmt: skip
register_family(
    "detr",
    DetrConfig,
    DETR,
    task="detection",
    display_name="DETR",
    weights="vitkit.weights.detr",
    recipe=DETR_RECIPE,
    cost_parts={
        "backbone": "backbone",
        "position_embedding": "embedding",
        "input_proj": "embedding",
        "class_embed": "heads",
        "bbox_embed": "heads",
    },
)


def coco_weights(repo: str) -> PublishedWeights:
    """A COCO detector's weights in a transformers repository (its config.json holds its 91 COCO ids' label names)."""
    return PublishedWeights("coco", f"hf-hub:{repo}", "hf", COCO_DATA, "Apache-2.0")


COCO_DATA = "COCO 2017 train (118k images; 80 classes in 91 ids)"
COCO_PANOPTIC = "COCO 2017 panoptic train (118k images; 133 things and stuff in 250 ids)"
# facebookresearch/detr's weights in transformers' layout (the published DETR models, Table 1 of the paper), and
# torchvision's ResNet backbones for a detector trained on one's own classes (`vitkit.models.resnet`)
_R50 = (RESNET50_TV, RESNET50_TV2)
_R101 = (RESNET101_TV, RESNET101_TV2)
register_model(
    "detr_resnet50", "detr", DetrConfig(), DETR_PAPER, pretrained=(coco_weights("facebook/detr-resnet-50"), *_R50)
)
register_model(
    "detr_resnet50_dc5",
    "detr",
    DetrConfig(dilation=True),
    DETR_PAPER,
    pretrained=(coco_weights("facebook/detr-resnet-50-dc5"), *_R50),
)
# the paper's panoptic model (section 4.4): DETR-R50 with the mask head, trained on COCO panoptic's 250 ids
register_model(
    "detr_resnet50_panoptic",
    "detr",
    DetrConfig(num_classes=250, masks=True),
    DETR_PAPER,
    pretrained=(
        PublishedWeights("coco-panoptic", "hf-hub:facebook/detr-resnet-50-panoptic", "hf", COCO_PANOPTIC, "Apache-2.0"),
        *_R50,
    ),
)
register_model(
    "detr_resnet101",
    "detr",
    DetrConfig(backbone_depths=(3, 4, 23, 3)),
    DETR_PAPER,
    pretrained=(coco_weights("facebook/detr-resnet-101"), *_R101),
)
register_model(
    "detr_resnet101_dc5",
    "detr",
    DetrConfig(backbone_depths=(3, 4, 23, 3), dilation=True),
    DETR_PAPER,
    pretrained=(coco_weights("facebook/detr-resnet-101-dc5"), *_R101),
)
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
# no published weights fit vitkit's small detectors: their half-width ResNet-18 (torchvision's is twice as wide) and
# transformer are sizes of vitkit's own, trained from scratch
SMALL_DETECTOR_WEIGHTS = (
    "vitkit's own size, which `vitkit train` trains from scratch on a folder in minutes (its half-width ResNet-18 "
    "takes no published backbone: torchvision's is twice as wide)"
)
register_model("detr_tiny", "detr", DETR_TINY, DETR_PAPER, recipe=SMALL_DETR_RECIPE, unpublished=SMALL_DETECTOR_WEIGHTS)
# detr_tiny sized for builtin:digits-detect (96x96 canvases of 1-4 digits of 20-40 px):
# the last stage dilated (DC5) so that a 96x96 image gives a 6x6 map of 16-pixel cells, about one per digit side;
# 12 queries (three times the most digits of a canvas); 4 decoder layers; no dropout (runs of minutes).
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
    recipe=SMALL_DETR_RECIPE,
    unpublished=SMALL_DETECTOR_WEIGHTS,
)
