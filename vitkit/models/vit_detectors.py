"""Deformable DETR on Swin and ViT backbones (`vitkit.models.backbone`): its registered variants, in a module of their
own that imports after the Swin and ViT variants they name (the package imports its modules in name order; the
imports below say so explicitly).
"""

from __future__ import annotations

import vitkit.models.swin  # noqa: F401  (the backbones' variants, registered before these name them)
import vitkit.models.vit  # noqa: F401
from vitkit.models.deformable_detr import DEFORMABLE_DETR_PAPER, DeformableDetrConfig
from vitkit.models.deformable_detr_variants import SMALL_DETECTOR_RECIPE
from vitkit.models.registry import model_entry, register_model

# Transformer backbones (`vitkit.models.backbone`): no detector weights are published for them; `--init` with the
# classifier's own weights (any file or directory vitkit reads for it) fills the backbone, the rest trains.
VITDET_PAPER = (
    f"{DEFORMABLE_DETR_PAPER}; the backbone's feature pyramid: Exploring Plain Vision Transformer Backbones for "
    "Object Detection (ViTDet, Li et al., arXiv:2203.16527)"
)
SIMPLE_PYRAMID = (2.0, 1.0, 0.5)  # ViTDet's scales from the last block: strides 8, 16, 32 for a patch of 16


def _backbone_weights(backbone: str) -> str:
    return (
        f"no detector weights are published with this backbone; `vitkit train --init` with {backbone}'s own "
        f"weights (e.g. hf-hub:timm/{backbone}.{model_entry(backbone).pretrained[0].tag}) fills the backbone"
    )


# Deformable DETR on Swin-T's stages 2..4 (strides 8, 16, 32, and a fourth level from stride 64), as DINO and
# Deformable DETR are run on Swin; two-stage with box refinement.
register_model(
    "deformable_detr_swin_tiny",
    "deformable_detr",
    DeformableDetrConfig(backbone="swin_tiny_patch4_window7_224", box_refine=True, two_stage=True),
    f"{DEFORMABLE_DETR_PAPER}; the backbone: Swin Transformer (Liu et al., arXiv:2103.14030)",
    unpublished=_backbone_weights("swin_tiny_patch4_window7_224"),
)
# Deformable DETR on a DINOv2 ViT (with registers) through ViTDet's simple feature pyramid from its last block
# (strides 7, 14, 28 at patch 14, and a fourth level), at 644 px (a multiple of 28: the pyramid's pooled level). The
# ViT attends as ViTDet's: within 14x14 windows of patches, except four blocks evenly spaced that attend over the
# whole image (RF-DETR's windowed DINOv2 is this idea too); its prefix tokens join every window.
VITDET_WINDOWS = {"window_size": 14, "global_blocks": (2, 5, 8, 11)}
for size, vit in (("small", "vit_small_patch14_reg4_dinov2"), ("base", "vit_base_patch14_reg4_dinov2")):
    register_model(
        f"deformable_detr_vit_{size}_dinov2",
        "deformable_detr",
        DeformableDetrConfig(
            img_size=(644, 644),
            backbone=vit,
            backbone_args=VITDET_WINDOWS,
            backbone_scales=SIMPLE_PYRAMID,
            box_refine=True,
            two_stage=True,
        ),
        VITDET_PAPER,
        unpublished=_backbone_weights(vit),
    )
# The small one for a few CPU cores: the default detector (deformable_detr_small) on ViT-Ti/16 (5.5M parameters,
# 12 blocks of width 192) through the simple feature pyramid, three levels (strides 8, 16, 32), trained with the
# default detector's data-sized recipe.
_SMALL = model_entry("deformable_detr_small").config
register_model(
    "deformable_detr_vit_tiny",
    "deformable_detr",
    DeformableDetrConfig(
        img_size=(224, 224),
        backbone="vit_tiny_patch16_224",
        backbone_scales=SIMPLE_PYRAMID,
        **{
            f: getattr(_SMALL, f)
            for f in (
                "num_feature_levels", "hidden_dim", "num_heads", "enc_layers", "dec_layers", "dim_feedforward",
                "drop_rate", "attn_drop_rate", "num_queries", "box_refine", "two_stage", "dn_queries",
            )
        },  # fmt: skip
    ),
    VITDET_PAPER,
    recipe=SMALL_DETECTOR_RECIPE,
    unpublished=_backbone_weights("vit_tiny_patch16_224"),
)
