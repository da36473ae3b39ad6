"""What detection adds to vitkit: batching images of different sizes, reading boxes out of DETR's outputs, Hungarian
matching and DETR's set loss with its settings for training, and COCO mAP for evaluation."""

from vitkit.detection.batch import DetectionBatch, collate_detection, pad_images
from vitkit.detection.box_classification import BoxClassification
from vitkit.detection.coco_eval import COCO_METRICS, CocoEvaluator, coco_map, to_coco_results
from vitkit.detection.criterion import SetCriterion, average_num_boxes, criterion_for
from vitkit.detection.denoising import make_denoising
from vitkit.detection.losses import DETECTION_LOSSES, DETECTION_WEIGHTS, FOCAL_MATCH_COST, FOCAL_PRIOR, LOSS_WEIGHTS
from vitkit.detection.matcher import HungarianMatcher
from vitkit.detection.postprocess import Postprocessing, postprocess

__all__ = [
    "COCO_METRICS",
    "DETECTION_LOSSES",
    "DETECTION_WEIGHTS",
    "FOCAL_MATCH_COST",
    "FOCAL_PRIOR",
    "LOSS_WEIGHTS",
    "BoxClassification",
    "CocoEvaluator",
    "DetectionBatch",
    "HungarianMatcher",
    "Postprocessing",
    "SetCriterion",
    "average_num_boxes",
    "coco_map",
    "collate_detection",
    "criterion_for",
    "make_denoising",
    "pad_images",
    "postprocess",
    "to_coco_results",
]
