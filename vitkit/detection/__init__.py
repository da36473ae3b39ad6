"""What detection adds to vitkit: batching images of different sizes, reading boxes out of DETR's outputs, Hungarian
matching and DETR's set loss for training, and COCO mAP for evaluation."""

from vitkit.detection.batch import DetectionBatch, collate_detection
from vitkit.detection.coco_eval import COCO_METRICS, CocoEvaluator, coco_map, to_coco_results
from vitkit.detection.criterion import LOSS_WEIGHTS, SetCriterion, average_num_boxes
from vitkit.detection.matcher import HungarianMatcher
from vitkit.detection.postprocess import Postprocessing, pad_images, postprocess

__all__ = [
    "COCO_METRICS",
    "LOSS_WEIGHTS",
    "Postprocessing",
    "CocoEvaluator",
    "DetectionBatch",
    "HungarianMatcher",
    "SetCriterion",
    "average_num_boxes",
    "coco_map",
    "collate_detection",
    "pad_images",
    "postprocess",
    "to_coco_results",
]
