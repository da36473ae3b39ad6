"""Training, evaluation and prediction of classifiers and detectors: `fit(TrainConfig(...))` is what `vitkit train`
runs."""

from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from vitkit.train.config import TrainConfig
from vitkit.train.detect import (
    Detection,
    DetectionResult,
    ImageDetections,
    detect,
    detect_files,
    detection_attention,
    detection_attention_figure,
    evaluate_detector,
    evaluate_detector_dir,
    is_detector_dir,
    load_detector,
    write_detections,
)
from vitkit.train.ema import ModelEma
from vitkit.train.evaluate import (
    EvalResult,
    Prediction,
    evaluate,
    evaluate_model_dir,
    image_paths,
    predict,
    predict_files,
)
from vitkit.train.loop import METRICS_NAME, FitResult, build_training_model, fit
from vitkit.train.model import enable_grad_checkpointing, load_for_finetune
from vitkit.train.optim import create_optimizer, param_groups, warmup_cosine
from vitkit.train.recipe import DEFAULT_DETECTOR, DEFAULT_MODEL, Recipe, recipe_for, resolve_task
from vitkit.train.task import ClassificationTask, DetectionTask, Task, create_task, forward_loss

__all__ = [
    "CHECKPOINT_NAME",
    "DEFAULT_DETECTOR",
    "DEFAULT_MODEL",
    "METRICS_NAME",
    "ClassificationTask",
    "Detection",
    "DetectionResult",
    "DetectionTask",
    "EvalResult",
    "FitResult",
    "ImageDetections",
    "ModelEma",
    "Prediction",
    "Recipe",
    "Task",
    "TrainConfig",
    "build_training_model",
    "create_optimizer",
    "create_task",
    "detect",
    "detect_files",
    "detection_attention",
    "detection_attention_figure",
    "enable_grad_checkpointing",
    "evaluate",
    "evaluate_detector",
    "evaluate_detector_dir",
    "evaluate_model_dir",
    "fit",
    "forward_loss",
    "image_paths",
    "is_detector_dir",
    "load_checkpoint",
    "load_detector",
    "load_for_finetune",
    "param_groups",
    "predict",
    "predict_files",
    "recipe_for",
    "resolve_task",
    "save_checkpoint",
    "warmup_cosine",
    "write_detections",
]
