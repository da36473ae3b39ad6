"""Deformable DETR: DETR whose attention over the image samples a few points per head on a feature pyramid.

"Deformable DETR: Deformable Transformers for End-to-End Object Detection", Zhu et al., arXiv:2010.04159.

A ResNet backbone (frozen BatchNorm) gives the maps of layer2..layer4 (strides 8, 16, 32); each is projected to D
channels (1x1 conv + GroupNorm) and a stride-2 3x3 conv on the last map adds a fourth, coarser level. The L levels'
pixels, flattened finest first, are the encoder's tokens; each carries DETR's sine encoding of its position (offset
to the pixel centres) plus a learned embedding of its level. Every attention over the tokens is multi-scale
deformable attention (`vitkit.layers.MultiScaleDeformableAttention`): a query attends to K points per head on each
level around its reference point. The encoder's reference points are the tokens' own centres; the decoder's come from
its Q object queries (a learned embedding split into a position and a content half, the reference a linear map of the
position). Decoder layers are DETR's post-norm layers with the cross-attention deformable. Each decoder layer's
output gives K class logits (sigmoid and focal loss: no "no object" logit) and a box, the box head's output added to
the reference's inverse sigmoid.

Two options of the paper:
- iterative box refinement (`box_refine`): each decoder layer has its own heads, and the box each layer predicts is
  the next layer's reference (a box now, around whose centre the offsets scale with its size), without gradient;
- two-stage (`two_stage`, with box refinement): every encoder token proposes a box (a fixed-size anchor at its
  pixel, 0.05 * 2^l wide on level l, refined by an extra box head; an extra class head scores it) and the Q best
  proposals become the decoder's reference boxes, their sine encodings its queries.

Beyond the paper, for training from scratch in minutes (`deformable_detr_small`): denoising queries (`dn_queries`,
DN-DETR and DINO's contrastive groups: noised ground-truth boxes and labels placed before the object queries in
training, masked from them in the decoder's self-attention; `vitkit.detection.denoising`), DINO's mixed query
selection (`mixed_queries`) and a backbone whose BatchNorm trains (`backbone_norm="batch"`).

Data path: images (B, 3, H, W) + pixel_mask (B, H, W) -> ResNet maps -> input_proj L x (B, D, H_l, W_l) -> tokens
(B, N, D) + positions (B, N, D) -> encoder x enc_layers -> memory (B, N, D); queries (B, Q, D) + reference points
(B, Q, 2 | 4) -> decoder x dec_layers -> states (L_d, B, Q, D) -> class_embed (B, Q, K), bbox_embed (B, Q, 4).

Parameter names: vitkit's DETR layout (`backbone.*` in torchvision's names, `input_proj`, `query_embed`, `encoder`,
`decoder`, `class_embed`, `bbox_embed.layers.*`), with the paper's names for what DETR lacks (`level_embed`,
`reference_points`, `enc_output`, `pos_trans`; the attention's `sampling_offsets`, `attention_weights`, `value_proj`,
`output_proj`). `vitkit.weights.deformable_detr` converts transformers' `DeformableDetrForObjectDetection`.

The encoder and decoder are `vitkit.models.deformable_transformer`'s; the registered variants and their recipes are
`vitkit.models.deformable_detr_variants`'.

Letters: B batch, H, W image size, L levels, (H_l, W_l) level l's map, N = sum H_l W_l tokens, D width, Q queries,
K classes, L_d decoder layers, F = D / 2 position features per axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from vitkit.cost.rows import conv_output_size
from vitkit.layers import (
    DEFORMABLE_BACKENDS,
    Attention,
    MultiScaleDeformableAttention,
    check_backend,
    to_2tuple,
)
from vitkit.layers.pos_embed import SinePositionEmbedding, nearest_mask
from vitkit.models.backbone import (
    ClassifierBackbone,
    backbone_outputs,
    check_backbone_choice,
    pad_to_multiple,
)
from vitkit.models.deformable_transformer import (
    BoxDelta,
    DeformableDecoder,
    DeformableEncoder,
    box_from_reference,
    encoder_reference_points,
    inverse_sigmoid,
    proposal_encoding,
    valid_ratios,
)
from vitkit.models.detr import BLOCKS, channels_last_convolutions, check_backbone_norm, resnet_backbone
from vitkit.models.interface import (
    CostFromImages,
    DenoisingQueries,
    DenoisingSettings,
    check_detector_input,
    checkpoint_blocks,
)
from vitkit.models.query_masks import QueryMasks, mask_size
from vitkit.models.registry import Fields, as_fields, check_field_types, check_positive, check_rates, model_entry

DEFORMABLE_DETR_PAPER = (
    "Deformable DETR: Deformable Transformers for End-to-End Object Detection (Zhu et al., arXiv:2010.04159)"
)
GROUPS = 32  # GroupNorm groups of every input projection (both codes fix 32)
PRIOR = 0.01  # the probability every class of a fresh class head starts at (the focal loss's initialisation)
PROPOSAL_SIZE = 0.05  # the two-stage anchors' width and height on the finest level, doubled on each coarser one
PROPOSAL_MARGIN = 0.01  # anchors with a coordinate within this of 0 or 1 propose nothing


@dataclass(frozen=True)
class DeformableDetrConfig:
    img_size: int | tuple[int, int] = (800, 1216)  # nominal (H, W) (an int for square): what costs and profiles
    # assume; any size runs while dynamic_img_size is True (the paper resizes the short side to 800, long <= 1333)
    in_chans: int = 3  # image channels
    num_classes: int = 91  # object classes K: the class head's K sigmoid logits, no "no object" (COCO: 91, the
    # largest category id + 1, as DETR)
    backbone: str = "resnet"  # "resnet" (the fields below) or a registered Swin or ViT variant whose stages or blocks
    # give the maps (`vitkit.models.backbone.ClassifierBackbone`, at this config's img_size and in_chans, no head)
    backbone_args: Fields = ()  # a Swin or ViT backbone's config fields to replace, e.g. {"drop_path_rate": 0.1}
    # (a dict, kept as sorted (name, value) pairs)
    backbone_scales: tuple[float, ...] = ()  # a Swin or ViT backbone's pyramid: () its outputs' maps as they are;
    # else ViTDet's simple feature pyramid scales (of 4, 2, 1, 0.5, decreasing), all from one output or one per output
    backbone_block: str = "bottleneck"  # "bottleneck" (1x1-3x3-1x1: ResNet-50/101) or "basic" (3x3-3x3: ResNet-18/34)
    backbone_depths: tuple[int, ...] = (3, 4, 6, 3)  # blocks of layer1..layer4: ResNet-50 (3, 4, 6, 3), ResNet-101
    # (3, 4, 23, 3), ResNet-18 (2, 2, 2, 2), ResNet-34 (3, 4, 6, 3) with basic blocks
    backbone_width: int = 64  # stem channels and layer1's inner width, doubled by each later stage (64: torchvision)
    backbone_stages: tuple[int, ...] | None = None  # the ResNet stages (1..4: layer1..layer4, strides 4..32) whose
    # maps are the first levels, in increasing order; None: the last min(num_feature_levels, 3) of layer2..layer4
    # ((2, 3, 4) for 4 levels as the paper; (4,) for one level). A Swin backbone's stages (1..4) likewise; a ViT's
    # blocks (1..depth; None: the last, for backbone_scales)
    dilation: bool = False  # DC5: layer4 dilates its 3x3 convolutions instead of striding (stride 16, not 32)
    backbone_norm: str = "frozen"  # "frozen" (the paper's frozen BatchNorm) or "batch" (trained: a backbone from
    # scratch, whose frozen norms would normalise nothing)
    train_stem: bool = False  # train conv1 and layer1 too; the paper freezes them (requires_grad False)
    num_feature_levels: int = 4  # levels L: the backbone stages' maps, then stride-2 3x3 convolutions for the rest
    hidden_dim: int = 256  # transformer width D; a multiple of 32 (the input projections' GroupNorm groups)
    num_heads: int = 8  # heads of every attention; must divide hidden_dim
    enc_layers: int = 6  # encoder layers
    dec_layers: int = 6  # decoder layers
    enc_points: int = 4  # sampling points per head and level of the encoder's deformable attention
    dec_points: int = 4  # sampling points per head and level of the decoder's deformable cross-attention
    dim_feedforward: int = 1024  # hidden width of each layer's ReLU feed-forward block
    drop_rate: float = 0.1  # dropout after each attention and in each feed-forward block
    attn_drop_rate: float = 0.1  # dropout on the decoder self-attention's weights (the paper's nn.MultiheadAttention;
    # transformers' attention_dropout: 0.0)
    num_queries: int = 300  # object queries Q: the most objects one image can yield (two-stage: the proposals kept)
    aux_loss: bool = True  # also predict from every earlier decoder layer (`aux_outputs`, for the auxiliary losses)
    box_refine: bool = False  # iterative box refinement: heads per decoder layer, each layer's box the next
    # layer's reference
    two_stage: bool = False  # the encoder proposes the decoder's reference boxes; needs box_refine (as transformers)
    mixed_queries: bool = False  # two-stage: the proposals give the queries' positions, a learned table their
    # contents (DINO's mixed query selection, arXiv:2203.03605); False: both from the proposals (the paper's)
    dn_queries: int = 0  # denoising queries per image in training (DN-DETR / DINO; `vitkit.detection.denoising`):
    # noised ground-truth boxes and labels beside the object queries, in groups of a positive and a negative copy of
    # every box; 0: off. Needs two_stage (the decoder's references are boxes); adds `label_embed`
    dn_label_noise: float = 0.5  # share of denoising copies whose label is redrawn (DINO: 0.5, half of it at random)
    dn_box_noise: float = 1.0  # scale of the denoising boxes' noise, in half box sides (DINO: 1.0)
    masks: bool = False  # a mask per query (`vitkit.models.query_masks`, Mask DINO's form): `pred_masks` at a quarter
    # of the image's size, on every decoder layer and on the denoising queries
    dynamic_img_size: bool = True  # accept any image size (batches of several sizes are padded); False: img_size only
    attn_backend: str = "auto"  # the decoder self-attention's (and a Swin or ViT backbone's, unless backbone_args
    # give its own): "auto", "sdpa" or "math" (the reference formula)
    deformable_backend: str = "auto"  # the deformable attentions': "auto", "gather", "levelwise" or "math" (the
    # reference); see vitkit.kernels.policy

    def __post_init__(self) -> None:
        object.__setattr__(self, "backbone_args", as_fields(self.backbone_args))
        check_field_types(self)
        check_positive(self, "in_chans", "num_classes", "backbone_width", "num_feature_levels", "hidden_dim")
        check_positive(self, "num_heads", "enc_layers", "dec_layers", "enc_points", "dec_points", "dim_feedforward")
        check_positive(self, "num_queries")
        check_rates(self, "drop_rate", "attn_drop_rate", "dn_label_noise")
        check_backbone_norm(self.backbone_norm)
        if self.dn_queries < 0 or self.dn_box_noise < 0:
            raise ValueError(f"dn_queries and dn_box_noise must be >= 0, got {self.dn_queries} and {self.dn_box_noise}")
        if (self.dn_queries or self.mixed_queries) and not self.two_stage:
            what = "dn_queries" if self.dn_queries else "mixed_queries"
            raise ValueError(f"{what} needs two_stage=True (and box_refine): the decoder's references must be boxes")
        H, W = to_2tuple(self.img_size)
        if H <= 0 or W <= 0:
            raise ValueError(f"img_size must be positive, got {self.img_size!r}")
        if self.backbone_block not in BLOCKS:
            raise ValueError(f"backbone_block must be one of {BLOCKS}, got {self.backbone_block!r}")
        if len(self.backbone_depths) != 4 or min(self.backbone_depths) < 1:
            raise ValueError(
                f"backbone_depths needs 4 stages of >= 1 block (layer1..layer4), got {self.backbone_depths}"
            )
        if self.backbone != "resnet":
            try:
                model_entry(self.backbone)
            except ValueError as err:
                raise ValueError(f"backbone must be 'resnet' or a registered Swin or ViT variant: {err}") from None
        stages = self.stages
        check_backbone_choice(self, stages)
        if self.backbone == "resnet" and (
            not stages or list(stages) != sorted(set(stages)) or not all(1 <= s <= 4 for s in stages)
        ):
            raise ValueError(f"backbone_stages must be increasing stages among 1..4 (layer1..layer4), got {stages}")
        maps = len(self.backbone_scales) or len(stages)
        if maps > self.num_feature_levels:
            what = f"backbone_scales {self.backbone_scales}" if self.backbone_scales else f"backbone_stages {stages}"
            raise ValueError(f"{what} give {maps} levels, more than num_feature_levels {self.num_feature_levels}")
        if self.hidden_dim % self.num_heads != 0:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}")
        if self.hidden_dim % GROUPS != 0:
            raise ValueError(
                f"hidden_dim {self.hidden_dim} must be a multiple of {GROUPS} (the input projections' GroupNorm groups)"
            )
        if self.two_stage and not self.box_refine:
            raise ValueError("two_stage needs box_refine=True (the decoder refines the proposed boxes)")
        check_backend(self.attn_backend)
        check_backend(self.deformable_backend, DEFORMABLE_BACKENDS)

    @property
    def stages(self) -> tuple[int, ...]:
        """The backbone's outputs whose maps make the first levels: `backbone_stages`, or its default (the last
        min(num_feature_levels, 3) of a ResNet's layer2..layer4 or of a Swin's stages; a ViT's last block)."""
        if self.backbone_stages is not None:
            return self.backbone_stages
        if self.backbone == "resnet":
            return (2, 3, 4)[-min(self.num_feature_levels, 3) :]
        count = backbone_outputs(self.backbone, dict(self.backbone_args))
        if self.backbone_scales:
            return (count,)
        return tuple(range(count + 1 - min(self.num_feature_levels, 3, count), count + 1))


@dataclass(frozen=True)
class DeformableDecoding:
    """What `DeformableDETR.forward_features` returns and `forward_head` reads: the decoder's states, and what turns
    them into boxes.

    Attributes:
        states: (L_d, B, Q, D) every decoder layer's output.
        reference: (B, Q, 2) the queries' reference points (one-stage), or (B, Q, 4) the proposed boxes (two-stage):
            what the first decoder layer reads, and every layer without box refinement.
        boxes: (L_d, B, Q, 4) with box refinement, the box each decoder layer predicts (the next layer's reference);
            None without.
        enc_outputs: two-stage only, the encoder's proposals for the loss: `pred_logits` (B, N, K) and `pred_boxes`
            (B, N, 4); None otherwise.
        denoised: P, the denoising queries placed before the Q object queries (training only; 0 without).
        pixels: with `masks`, the pixel embeddings (B, D, H / 4, W / 4) the queries' masks read; None without.
    """

    states: Tensor
    reference: Tensor
    boxes: Tensor | None = None
    enc_outputs: dict[str, Tensor] | None = None
    denoised: int = 0
    pixels: Tensor | None = None


class DeformableDETR(CostFromImages, nn.Module):
    """Deformable DETR built from a `DeformableDetrConfig`.

    ``model(images, pixel_mask=None)``: images (B, C, H, W) and pixel_mask (B, H, W), 1 / True where a pixel is
    real and 0 / False where it pads the image (default: all real; `vitkit.detection.pad_images` batches images of
    different sizes) -> a dict, always with the same keys:

    - ``pred_logits`` (B, Q, K): class logits, each read through a sigmoid (no "no object" logit);
    - ``pred_boxes`` (B, Q, 4): boxes (cx, cy, w, h) relative to each image's unpadded size;
    - ``aux_outputs``: a list of such dicts (without `aux_outputs`), one per earlier decoder layer, for the
      auxiliary losses; empty when `config.aux_loss` is False;
    - two-stage only, ``enc_outputs``: the encoder's proposals for their loss, ``pred_logits`` (B, N, K) and
      ``pred_boxes`` (B, N, 4), one per token of all levels (the loss matches them class-agnostically).
    - with `masks`, ``pred_masks`` (B, Q, H / 4, W / 4) in every layer's dict (and the denoising queries'): each
      query's mask logits over the padded image (`vitkit.models.query_masks`).

    The model interface (`vitkit.models.interface`) for a detector: `forward_features` returns a
    `DeformableDecoding` (the decoder's outputs of every layer (L_d, B, Q, D) and what makes them boxes),
    `forward_head` turns it into the dict above (with `pre_logits`, the last layer's object embeddings (B, Q, D)),
    and `token_grid` is None.
    """

    no_object_logit = False  # K sigmoid class logits, no "no object" (`vitkit.models.interface.VitkitDetector`)

    def __init__(self, config: DeformableDetrConfig) -> None:
        super().__init__()
        self.config = c = config
        D, L = c.hidden_dim, c.num_feature_levels
        if c.backbone == "resnet":
            self.backbone = resnet_backbone(c, [s - 1 for s in c.stages])
        else:
            fields = {"attn_backend": c.attn_backend, **dict(c.backbone_args)}  # the backbone's attention too
            self.backbone = ClassifierBackbone(c.backbone, c.stages, c.backbone_scales, fields, c.in_chans)
        channels = list(self.backbone.out_channels)
        projections = [nn.Sequential(nn.Conv2d(ch, D, 1), nn.GroupNorm(GROUPS, D)) for ch in channels]
        for level in range(len(channels), L):  # stride-2 3x3 convolutions: from the last map, then each new level
            in_chs = channels[-1] if level == len(channels) else D
            projections.append(nn.Sequential(nn.Conv2d(in_chs, D, 3, 2, 1), nn.GroupNorm(GROUPS, D)))
        self.input_proj = nn.ModuleList(projections)
        self.position_embedding = SinePositionEmbedding(D // 2, offset=0.5)
        self.level_embed = nn.Parameter(torch.empty(L, D))
        levels = dict(
            dim=D, num_heads=c.num_heads, num_levels=L, dim_feedforward=c.dim_feedforward, drop=c.drop_rate,
            deformable_backend=c.deformable_backend,
        )  # fmt: skip
        self.encoder = DeformableEncoder(c.enc_layers, num_points=c.enc_points, **levels)
        self.decoder = DeformableDecoder(
            c.dec_layers, num_points=c.dec_points, attn_drop=c.attn_drop_rate, backend=c.attn_backend, **levels
        )
        if c.two_stage:
            self.enc_output = nn.Linear(D, D)
            self.enc_output_norm = nn.LayerNorm(D)
            self.pos_trans = nn.Linear(2 * D, 2 * D)
            self.pos_trans_norm = nn.LayerNorm(2 * D)
            if c.mixed_queries:
                self.tgt_embed = nn.Embedding(c.num_queries, D)  # the object queries' contents
            if c.dn_queries:
                self.label_embed = nn.Embedding(c.num_classes, D)  # a denoising query's content: its noised class
        else:
            self.query_embed = nn.Embedding(c.num_queries, 2 * D)  # [position | content] of each query
            self.reference_points = nn.Linear(D, 2)
        # heads: one pair shared by every decoder layer, or (box refinement) a pair per layer, plus (two-stage) the
        # encoder's proposal pair last
        heads = c.dec_layers + c.two_stage
        if c.box_refine:
            self.class_embed = nn.ModuleList([nn.Linear(D, c.num_classes) for _ in range(heads)])
            self.bbox_embed = nn.ModuleList([BoxDelta(D) for _ in range(heads)])
        else:
            self.class_embed = nn.Linear(D, c.num_classes)
            self.bbox_embed = BoxDelta(D)
        if c.masks:
            self.mask_head = QueryMasks(D)
        self.init_weights()
        channels_last_convolutions(self.backbone)
        if not c.train_stem:  # the paper trains layer2..layer4 of a ResNet only
            for module in self.backbone.early_layers():
                module.requires_grad_(False)

    def class_heads(self) -> list[nn.Linear]:
        return list(self.class_embed) if isinstance(self.class_embed, nn.ModuleList) else [self.class_embed]

    def box_heads(self) -> list[BoxDelta]:
        return list(self.bbox_embed) if isinstance(self.bbox_embed, nn.ModuleList) else [self.bbox_embed]

    def init_weights(self) -> None:
        """The paper's initialisation: backbone convolutions as torchvision's ResNet; the transformer's matrices
        Xavier-uniform (the decoder self-attention's biases zero), then each deformable attention's own
        (`MultiScaleDeformableAttention.reset_parameters`); the level embedding normal; the input projections
        Xavier-uniform with zero bias; class heads at the prior probability 0.01; box heads' last layer zero, with
        the first head's size logits at -2 (boxes start 0.12 wide; two-stage: 0, the proposals' sizes)."""
        self.backbone.reset_parameters()
        transformer = [self.encoder, self.decoder]
        transformer += [self.enc_output, self.pos_trans] if self.config.two_stage else [self.reference_points]
        for part in transformer:
            for p in part.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        for module in self.modules():
            if isinstance(module, Attention):
                nn.init.zeros_(module.qkv.bias)
                nn.init.zeros_(module.proj.bias)
            elif isinstance(module, MultiScaleDeformableAttention):
                module.reset_parameters()
        if not self.config.two_stage:
            nn.init.zeros_(self.reference_points.bias)
            nn.init.normal_(self.query_embed.weight)
        for table in ("tgt_embed", "label_embed"):  # mixed query selection and denoising (DINO's init)
            if hasattr(self, table):
                nn.init.normal_(getattr(self, table).weight)
        nn.init.normal_(self.level_embed)
        for projection in self.input_proj:
            nn.init.xavier_uniform_(projection[0].weight)
            nn.init.zeros_(projection[0].bias)
        with torch.no_grad():
            for head in self.class_heads():
                head.bias.fill_(-math.log((1 - PRIOR) / PRIOR))
            for i, head in enumerate(self.box_heads()):
                nn.init.zeros_(head.layers[-1].weight)
                nn.init.zeros_(head.layers[-1].bias)
                if i == 0 and not self.config.two_stage:
                    head.layers[-1].bias[2:] = -2.0

    # --- inputs and the feature pyramid ---------------------------------------------------------------------------

    def level_sizes(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The (H_l, W_l) of every level for images (padded) of `img_size` (H, W), finest first."""
        sizes = list(self.backbone.feature_sizes(img_size))
        for _ in range(len(sizes), self.config.num_feature_levels):
            h, w = sizes[-1]
            sizes.append((conv_output_size(h, 3, 2, 1), conv_output_size(w, 3, 2, 1)))
        return sizes

    def check_input(self, images: Tensor, pixel_mask: Tensor | None = None) -> Tensor | None:
        """ValueError unless images are (B, in_chans, H, W) floats (of `img_size` without `dynamic_img_size`, and
        with at least Q tokens for two-stage's top Q) and pixel_mask is None or (B, H, W); the mask as booleans."""
        c = self.config
        mask = check_detector_input(c, images, pixel_mask, "Deformable DETR")
        H, W = images.shape[-2:]
        if c.two_stage:
            tokens = sum(h * w for h, w in self.level_sizes((H, W)))
            if tokens < c.num_queries:
                raise ValueError(
                    f"two-stage Deformable DETR keeps the best {c.num_queries} of the encoder's tokens as proposals, "
                    f"but {H}x{W} images give {tokens} tokens; use larger images or fewer num_queries"
                )
        return mask

    def feature_levels(self, images: Tensor) -> list[Tensor]:
        """Images (B, C, H, W) -> the L levels' maps (B, D, H_l, W_l), finest first."""
        # oneDNN's convolutions run fastest channels-last
        maps = self.backbone(images.contiguous(memory_format=torch.channels_last))  # (B, C_l, H_l, W_l) each
        levels = [projection(m) for projection, m in zip(self.input_proj, maps, strict=False)]
        for level in range(len(maps), self.config.num_feature_levels):  # the first from the last raw map
            levels.append(self.input_proj[level](maps[-1] if level == len(maps) else levels[-1]))
        return levels

    def positions(self, masks: list[Tensor], dtype: torch.dtype, out_dtype: torch.dtype) -> Tensor:
        """Each level's sine encoding (computed in `dtype`) plus its level embedding, flattened: (B, N, D)."""
        pos = [
            self.position_embedding(mask, dtype).to(out_dtype) + self.level_embed[level]  # (B, H_l W_l, D)
            for level, mask in enumerate(masks)
        ]
        return torch.cat(pos, 1)

    # --- the two stages ---------------------------------------------------------------------------------------------

    def encoder_proposals(
        self, memory: Tensor, padding_mask: Tensor | None, shapes: Sequence[tuple[int, int]]
    ) -> tuple[Tensor, Tensor]:
        """Two-stage: (each token's proposal query (B, N, D), its anchor box's inverse sigmoid (1 | B, N, 4)).

        Token (i, j) of level l proposes the box centred on its pixel, relative to its image's real part, PROPOSAL_SIZE
        * 2^l wide and high. Anchors near the border (a coordinate outside (0.01, 0.99)) and on padding propose
        nothing: their logits are +inf (a box of 1) and their queries start from zeros.
        """
        B, _, _ = memory.shape
        dtype, device = memory.dtype, memory.device
        anchors, start = [], 0
        for level, (H, W) in enumerate(shapes):
            y = torch.arange(H, dtype=dtype, device=device)  # (H,) pixel rows
            x = torch.arange(W, dtype=dtype, device=device)  # (W,)
            if padding_mask is None:
                cx, cy = ((x + 0.5) / W)[None, None, :], ((y + 0.5) / H)[None, :, None]  # (1, 1, W), (1, H, 1)
            else:
                pad = padding_mask[:, start : start + H * W].view(B, H, W)
                real_h = (~pad[:, :, 0]).sum(1)[:, None, None]  # (B, 1, 1): real rows, counted in the first column
                real_w = (~pad[:, 0, :]).sum(1)[:, None, None]  # real columns, counted in the first row
                cx = (x[None, None, :].expand(B, H, W) + 0.5) / real_w  # (B, H, W)
                cy = (y[None, :, None].expand(B, H, W) + 0.5) / real_h
            centre = torch.stack(torch.broadcast_tensors(cx, cy), -1)  # (., H, W, 2) (x, y)
            size = torch.full_like(centre, PROPOSAL_SIZE * 2.0**level)  # (., H, W, 2) (w, h)
            anchors.append(torch.cat([centre, size], -1).flatten(1, 2))  # (., H W, 4)
            start += H * W
        anchors = torch.cat(anchors, 1)  # (1 | B, N, 4)
        inside = ((anchors > PROPOSAL_MARGIN) & (anchors < 1 - PROPOSAL_MARGIN)).all(-1, keepdim=True)  # (., N, 1)
        anchors = torch.log(anchors / (1 - anchors))  # the inverse sigmoid, unclamped
        unused = ~inside if padding_mask is None else ~inside | padding_mask[..., None]  # (., N, 1)
        anchors = anchors.masked_fill(unused, float("inf"))
        query = self.enc_output_norm(self.enc_output(memory.masked_fill(unused, 0.0)))  # (B, N, D)
        return query, anchors

    def two_stage_queries(
        self, memory: Tensor, padding_mask: Tensor | None, shapes: Sequence[tuple[int, int]]
    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """Two-stage: (query_pos, tgt (B, Q, D), reference boxes (B, Q, 4), the proposals for the loss): the Q
        proposals the encoder's class head scores highest on its first class, their boxes (without gradient) as the
        references, and the sine encoding of those boxes through `pos_trans` as the queries' positions and contents
        (with `mixed_queries`, the contents are the learned `tgt_embed` instead, as DINO).
        """
        n = self.config.dec_layers
        query, anchors = self.encoder_proposals(memory, padding_mask, shapes)
        logits = self.class_embed[n](query)  # (B, N, K)
        coords = self.bbox_embed[n](query) + anchors  # (B, N, 4), inverse sigmoids (+inf where unused)
        best = logits[..., 0].topk(self.config.num_queries, dim=1).indices  # (B, Q)
        chosen = coords.gather(1, best[..., None].expand(-1, -1, 4)).detach()  # (B, Q, 4)
        reference = chosen.sigmoid()
        query_pos, tgt = self.box_queries(reference)  # (B, Q, D) each
        if self.config.mixed_queries:
            tgt = self.tgt_embed.weight.to(tgt.dtype).expand(tgt.shape[0], -1, -1)  # (B, Q, D)
        return query_pos, tgt, reference, {"pred_logits": logits, "pred_boxes": coords.sigmoid()}

    def box_queries(self, boxes: Tensor) -> tuple[Tensor, Tensor]:
        """Boxes (B, Q, 4) in [0, 1] -> (query_pos, tgt) (B, Q, D) each: the two halves of their sine encoding
        through `pos_trans` and its norm (two-stage)."""
        D = self.config.hidden_dim
        embedded = self.pos_trans_norm(self.pos_trans(proposal_encoding(boxes, D // 2)))  # (B, Q, 2D)
        query_pos, tgt = embedded.split(D, dim=-1)
        return query_pos, tgt

    def denoising_settings(self) -> DenoisingSettings | None:
        """How the model trains with denoising queries (`vitkit.models.interface.DenoisingSettings`); None with
        `dn_queries` 0."""
        c = self.config
        return DenoisingSettings(c.dn_queries, c.dn_label_noise, c.dn_box_noise) if c.dn_queries else None

    def denoising_queries(self, denoising: DenoisingQueries, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(query_pos, tgt (B, P, D), reference boxes (B, P, 4)) of the denoising queries: positions from their
        noised boxes as a proposal's, contents the embeddings of their noised labels (zero for padding slots)."""
        c = self.config
        if not c.dn_queries:
            raise ValueError("this Deformable DETR has no denoising queries (dn_queries 0): pass denoising=None")
        labels, boxes = denoising.labels, denoising.boxes
        if labels.ndim != 2 or boxes.shape != (*labels.shape, 4):
            raise ValueError(
                f"expected denoising labels (B, P) and boxes (B, P, 4), got {tuple(labels.shape)} and "
                f"{tuple(boxes.shape)}"
            )
        if labels.numel() and labels.max() >= c.num_classes:
            raise ValueError(f"denoising labels must be in [-1, {c.num_classes}), got {labels.max().item()}")
        reference = boxes.to(dtype)
        query_pos, _ = self.box_queries(reference)
        real = (labels >= 0)[..., None]  # (B, P, 1)
        tgt = self.label_embed(labels.clamp(min=0)).to(query_pos.dtype) * real  # (B, P, D)
        return query_pos, tgt, reference

    # --- the model interface ----------------------------------------------------------------------------------------

    def forward_features(
        self, images: Tensor, pixel_mask: Tensor | None = None, denoising: DenoisingQueries | None = None
    ) -> DeformableDecoding:
        """Images (B, C, H, W) and pixel_mask (B, H, W) or None -> the decoder's states and what makes them boxes;
        with `denoising` (training with `dn_queries`), its P queries come first in every layer's states."""
        c = self.config
        pixel_mask = self.check_input(images, pixel_mask)
        images, pixel_mask = pad_to_multiple(images, pixel_mask, self.backbone.size_multiple)
        levels = self.feature_levels(images)  # L x (B, D, H_l, W_l)
        B, D = images.shape[0], c.hidden_dim
        shapes = tuple((level.shape[-2], level.shape[-1]) for level in levels)
        coord = torch.promote_types(levels[0].dtype, torch.float32)  # reference points: bfloat16 misplaces them
        if pixel_mask is None:
            masks = [torch.ones(B, h, w, dtype=torch.bool, device=images.device) for h, w in shapes]
            padding, ratios = None, None
        else:
            masks = [nearest_mask(pixel_mask, hw) for hw in shapes]  # L x (B, H_l, W_l), True where real
            padding = ~torch.cat([mask.flatten(1) for mask in masks], 1)  # (B, N), True at padding
            ratios = valid_ratios(masks, coord)  # (B, L, 2)
        x = torch.cat([level.flatten(2).transpose(1, 2) for level in levels], 1)  # L x (B, H_l W_l, D) -> (B, N, D)
        pos = self.positions(masks, images.dtype, x.dtype)  # (B, N, D)
        del levels, masks
        points = encoder_reference_points(shapes, ratios, B, coord, x.device)  # (B, N, L, 2)
        memory = self.encoder(x, pos, points, shapes, padding)  # (B, N, D)
        pixels = None
        if c.masks:  # the pixel embeddings, from the finest level's tokens (the first of memory)
            finest = memory[:, : shapes[0][0] * shapes[0][1]].transpose(1, 2).unflatten(2, shapes[0])  # (B, D, h, w)
            pixels = self.mask_head.pixels(finest, mask_size(*images.shape[-2:]))  # (B, D, H / 4, W / 4)
        enc_outputs = None
        if c.two_stage:
            query_pos, tgt, reference, enc_outputs = self.two_stage_queries(memory, padding, shapes)
        else:
            table = self.query_embed.weight  # (Q, 2D)
            if not torch.is_grad_enabled():  # views of a parameter made without grad claim requires_grad and have
                table = table.detach()  # no grad_fn: torch's module tracker (FlopCounterMode) fails on them
            query_pos, tgt = table.split(D, dim=1)  # (Q, D) each
            reference = self.reference_points(query_pos).sigmoid().expand(B, -1, -1)  # (Q, 2) -> (B, Q, 2)
            query_pos, tgt = query_pos.expand(B, -1, -1), tgt.expand(B, -1, -1)  # (B, Q, D)
        allowed, denoised = None, 0
        if denoising is not None:
            dn_pos, dn_tgt, dn_reference = self.denoising_queries(denoising, reference.dtype)
            denoised = dn_tgt.shape[1]
            allowed = denoising.attention_allowed(c.num_queries).to(images.device)  # (P + Q, P + Q)
            query_pos, tgt = torch.cat([dn_pos, query_pos], 1), torch.cat([dn_tgt, tgt], 1)  # (B, P + Q, D)
            reference = torch.cat([dn_reference, reference], 1)  # (B, P + Q, 4)
        box_heads = self.box_heads()[: c.dec_layers] if c.box_refine else None
        states, boxes = self.decoder(tgt, query_pos, reference, memory, shapes, padding, ratios, box_heads, allowed)
        return DeformableDecoding(states, reference, boxes, enc_outputs, denoised, pixels)

    def forward_head(self, x: DeformableDecoding, pre_logits: bool = False) -> dict[str, Any] | Tensor:
        """`forward_features`' decoding -> the predictions dict (see the class), or with `pre_logits` the last
        layer's object embeddings (B, Q, D)."""
        P = x.denoised
        if pre_logits:
            return x.states[-1][:, P:]
        first = 0 if self.config.aux_loss else len(x.states) - 1
        logits, boxes = self.predictions(x, first)
        masks = None if x.pixels is None else self.mask_head(x.states[first:], x.pixels)  # (L', B, P + Q, h, w)
        out = _layer_outputs(
            [a[:, P:] for a in logits], [b[:, P:] for b in boxes], None if masks is None else [m[:, P:] for m in masks]
        )
        if x.enc_outputs is not None:
            out["enc_outputs"] = x.enc_outputs
        if P:
            dn_masks = None if masks is None else [m[:, :P] for m in masks]
            out["dn_outputs"] = _layer_outputs([a[:, :P] for a in logits], [b[:, :P] for b in boxes], dn_masks)
        return out

    def predictions(self, x: DeformableDecoding, first: int) -> tuple[Sequence[Tensor], Sequence[Tensor]]:
        """The class logits (B, Q, K) and boxes (B, Q, 4) of the decoder layers `first`.. (stacked or in lists)."""
        states = x.states[first:]  # (L', B, Q, D)
        if self.config.box_refine:
            logits = [self.class_embed[first + i](s) for i, s in enumerate(states)]
            return logits, x.boxes[first:]
        logits = self.class_embed(states)  # (L', B, Q, K)
        return logits, box_from_reference(self.bbox_embed(states), inverse_sigmoid(x.reference))  # (L', B, Q, 4)

    def forward(
        self, images: Tensor, pixel_mask: Tensor | None = None, denoising: DenoisingQueries | None = None
    ) -> dict[str, Any]:
        return self.forward_head(self.forward_features(images, pixel_mask, denoising))

    def shard_units(self) -> list[nn.Module]:
        """Each backbone block and each encoder and decoder layer (`vitkit.models.interface.VitkitModel`)."""
        return [*self.backbone.blocks(), *self.encoder.layers, *self.decoder.layers]

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each backbone block and each encoder and decoder layer in backward
        (`vitkit.models.interface.VitkitModel`); the blocks now checkpointed."""
        return checkpoint_blocks(self.shard_units(), enable)

    def token_grid(self, img_size: tuple[int, int]) -> None:
        """None: the encoder's tokens lie on several maps, and the decoder attends over object queries."""
        return None

    def no_weight_decay(self) -> set[str]:
        """None besides the parameters of ndim <= 1 (the paper decays the level and query embeddings too)."""
        return set()

    def predict(self, images: Tensor, pixel_mask: Tensor | None = None) -> dict[str, Tensor]:
        """The last decoder layer's ``pred_logits`` (B, Q, K) and ``pred_boxes`` (B, Q, 4), no auxiliary outputs
        (`vitkit.models.interface.VitkitDetector`)."""
        decoding = self.forward_features(images, pixel_mask)
        logits, boxes = self.predictions(decoding, len(decoding.states) - 1)  # the heads on the last layer only
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if decoding.pixels is not None:
            out["pred_masks"] = self.mask_head(decoding.states[-1], decoding.pixels)  # (B, Q, H / 4, W / 4)
        return out

    @property
    def predicts_masks(self) -> bool:
        """Whether the outputs hold `pred_masks` (`vitkit.models.interface.VitkitDetector`)."""
        return self.config.masks

    def reset_classifier(self, num_classes: int, prior: float | None = None) -> None:
        """Fresh class heads (every decoder layer's and two-stage's proposal head) for `num_classes` classes: PyTorch's
        Linear weights, biases of -log((1 - prior) / prior) so that every class starts at probability `prior` under
        the sigmoid (default 0.01, the paper's initialisation); with `dn_queries`, a fresh label embedding too."""
        if num_classes <= 0:
            raise ValueError(f"num_classes must be > 0, got {num_classes}")
        prior = PRIOR if prior is None else prior
        if not 0 < prior < 1:
            raise ValueError(f"prior must be a probability in (0, 1), got {prior}")
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        weight = self.class_heads()[0].weight
        D = self.config.hidden_dim
        heads = [nn.Linear(D, num_classes).to(weight.device, weight.dtype) for _ in self.class_heads()]
        with torch.no_grad():
            for head in heads:
                head.bias.fill_(-math.log((1 - prior) / prior))
        self.class_embed = nn.ModuleList(heads) if isinstance(self.class_embed, nn.ModuleList) else heads[0]
        if self.config.dn_queries:  # the denoising queries' label embeddings are one per class too
            self.label_embed = nn.Embedding(num_classes, D).to(weight.device, weight.dtype)
            nn.init.normal_(self.label_embed.weight)

    def object_attention_layers(self) -> list[str]:
        """Each decoder layer's deformable cross-attention, first to last: `capture_attention` records a
        `vitkit.layers.SampledAttention` (where each query sampled on every level, with what weight)."""
        return [f"decoder.layers.{i}.cross_attn" for i in range(len(self.decoder.layers))]

    def feature_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The finest level's (H_0, W_0) for images of `img_size` (the captured records carry every level's)."""
        return self.level_sizes(img_size)[0]


def _layer_outputs(
    logits: Sequence[Tensor], boxes: Sequence[Tensor], masks: Sequence[Tensor] | None = None
) -> dict[str, Any]:
    """The predictions dict of decoder layers' logits, boxes (and mask logits), the last layer's first, the others'
    in `aux_outputs`."""
    layers = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits, boxes, strict=True)]
    for layer, m in zip(layers, masks or (), strict=masks is not None):
        layer["pred_masks"] = m
    return {**layers[-1], "aux_outputs": layers[:-1]}
