"""Deformable DETR's registered variants and training recipes (the model: `vitkit.models.deformable_detr`)."""

from __future__ import annotations

import dataclasses

from vitkit.models.deformable_detr import DEFORMABLE_DETR_PAPER, DeformableDETR, DeformableDetrConfig
from vitkit.models.detr import SMALL_DETECTOR_WEIGHTS, coco_weights
from vitkit.models.registry import model_entry, register_family, register_model
from vitkit.models.resnet import RESNET50_TV, RESNET50_TV2

# The paper's recipe (Zhu et al., arXiv:2010.04159): AdamW, lr 2e-4 with the backbone at 2e-5 (the paper also trains
# the reference-point and sampling-offset projections at a tenth), weight decay 1e-4, gradient clipping 0.1, the
# sigmoid focal loss, 50 epochs with a tenfold drop at 40 (here the cosine decay ends at the same tenth: min_lr),
# batch 32 over 8 GPUs (4 per GPU, DETR's), detections read as the 100 most probable (query, class) pairs, no NMS.
DEFORMABLE_DETR_RECIPE = dict(
    epochs=50, batch_size=4, lr=2e-4, min_lr=2e-5, warmup_epochs=0.0, weight_decay=1e-4, clip_grad=0.1,
    backbone_lr=2e-5, detection_loss="focal", box_cls_loss=0.0, detection_top_k=100, nms_iou=0.0,
)  # fmt: skip
# The small Deformable DETR trained from scratch on two CPU cores: detr_digits' recipe (the backbone as fast as the
# rest, the backbone classifying the ground-truth boxes) with the focal loss, the top 100 pairs and no NMS.
SMALL_DEFORMABLE_DETR_RECIPE = dict(
    epochs=24, batch_size=16, lr=3e-4, min_lr=3e-6, warmup_epochs=0.5, backbone_lr=3e-4, box_cls_loss=1.0,
    detection_loss="focal", detection_top_k=100, nms_iou=0.0,
)  # fmt: skip
# The default detector's recipe: the small one's without the backbone's box classification, sized from the data:
# epochs so that training sees about 1.8e8 image pixels (5 epochs of digits-detect; `vitkit.train.recipe`), and
# per-class NMS at IoU 0.7, which removes the duplicates a detector trained for minutes still gives (measured on the
# final models of BENCHMARKS.md, "Detection from scratch": AP50 0.904 -> 0.934 on digits-detect, 0.900 -> 0.918 on
# the shapes folder; AP +0.014 and +0.004). Its learning rate is twice the small one's: in runs this short the
# weights travel too little at 3e-4 (BENCHMARKS.md, "The learning rate": after 9 of 11 epochs on the shapes folder,
# AP 0.33 at 3e-4, 0.44 at 6e-4, 0.31 at 1.2e-3; on digits-detect AP 0.70 / AP50 0.95 after 3 epochs at 6e-4
# against 0.65 / 0.91 at 3e-4).
DN_QUERIES_SMALL = 40  # DINO gives COCO's 100; 5 groups of the digits' at most 4 boxes
SMALL_DETECTOR_LR = 6e-4
SMALL_DETECTOR_RECIPE = dict(
    SMALL_DEFORMABLE_DETR_RECIPE, lr=SMALL_DETECTOR_LR, backbone_lr=SMALL_DETECTOR_LR, box_cls_loss=0.0,
    pixel_budget=1.8e8, nms_iou=0.7,
)  # fmt: skip
register_family(
    "deformable_detr",
    DeformableDetrConfig,
    DeformableDETR,
    task="detection",
    display_name="Deformable DETR",
    weights="vitkit.weights.deformable_detr",
    recipe=DEFORMABLE_DETR_RECIPE,
    cost_parts={
        "backbone": "backbone",
        "input_proj": "embedding",
        "position_embedding": "embedding",
        "reference_points": "embedding",  # the object queries' reference points (one-stage)
        "pos_trans": "embedding",  # the proposals' encodings as the object queries (two-stage)
        "pos_trans_norm": "embedding",
        "enc_output": "heads",  # the encoder's proposal head, with class_embed's and bbox_embed's last (two-stage)
        "enc_output_norm": "heads",
        "class_embed": "heads",
        "bbox_embed": "heads",
    },
)

# fundamentalvision/Deformable-DETR's weights in transformers' layout (SenseTime's repositories; Table 1 of the paper)
_R50 = (RESNET50_TV, RESNET50_TV2)
register_model(
    "deformable_detr_resnet50",
    "deformable_detr",
    DeformableDetrConfig(),
    DEFORMABLE_DETR_PAPER,
    pretrained=(coco_weights("SenseTime/deformable-detr"), *_R50),
)
register_model(
    "deformable_detr_resnet50_box_refine",
    "deformable_detr",
    DeformableDetrConfig(box_refine=True),
    DEFORMABLE_DETR_PAPER,
    pretrained=(coco_weights("SenseTime/deformable-detr-with-box-refine"), *_R50),
)
register_model(
    "deformable_detr_resnet50_two_stage",
    "deformable_detr",
    DeformableDetrConfig(box_refine=True, two_stage=True),
    DEFORMABLE_DETR_PAPER,
    pretrained=(coco_weights("SenseTime/deformable-detr-with-box-refine-two-stage"), *_R50),
)
# vitkit's small Deformable DETR, sized for builtin:digits-detect (96x96 canvases of 1-4 digits of 20-40 px) on two
# CPU cores: detr_digits' half-width ResNet-18 (basic blocks 2-2-2-2, 32..256 channels, trained from the stem up)
# feeding three levels (strides 8, 16, 32: 12x12, 6x6 and 3x3 maps at 96x96), D = 128 with 4 heads and 4 points,
# 2 encoder and 4 decoder layers with box refinement, FFN 512, 20 queries, no dropout (runs of minutes).
register_model(
    "deformable_detr_digits",
    "deformable_detr",
    DeformableDetrConfig(
        img_size=(96, 96),
        backbone_block="basic",
        backbone_depths=(2, 2, 2, 2),
        backbone_width=32,
        train_stem=True,
        num_feature_levels=3,
        hidden_dim=128,
        num_heads=4,
        enc_layers=2,
        dec_layers=4,
        dim_feedforward=512,
        drop_rate=0.0,
        attn_drop_rate=0.0,
        num_queries=20,
        box_refine=True,
    ),
    DEFORMABLE_DETR_PAPER,
    recipe=SMALL_DEFORMABLE_DETR_RECIPE,
    unpublished=SMALL_DETECTOR_WEIGHTS,
)
# vitkit's default detector, for a user's own COCO-format folder or the bundled digits-detect, trained from scratch
# on a few CPU cores: deformable_detr_digits with the ideas that make DETRs converge in a few epochs (BENCHMARKS.md,
# "Detection from scratch": each measured): two-stage proposals, box refinement, the focal loss and DINO's
# contrastive denoising queries. Its recipe sizes the run from the data (`vitkit.train.recipe.data_choices`).
register_model(
    "deformable_detr_small",
    "deformable_detr",
    dataclasses.replace(
        model_entry("deformable_detr_digits").config, two_stage=True, dn_queries=DN_QUERIES_SMALL, backbone_norm="batch"
    ),
    DEFORMABLE_DETR_PAPER,
    recipe=SMALL_DETECTOR_RECIPE,
    unpublished=SMALL_DETECTOR_WEIGHTS,
)
