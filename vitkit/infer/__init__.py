"""Inference with trained models: predicting classes and detecting objects in images, evaluating on held-out data,
the data of the attention views, and the model directories they read. `vitkit predict`, `vitkit eval` and
`vitkit attention` run these."""

from vitkit.infer.attention import (
    attention_figure,
    attention_map,
    attention_maps,
    attention_overlay,
    attention_rollout,
    cls_attention,
    load_attention_model,
    prefix_attention,
    prefix_token_names,
)
from vitkit.infer.classify import Prediction, Predictions, predict, predict_files, predict_paths
from vitkit.infer.detect import Detection, ImageDetections, detect, detect_files, detect_paths, detection_input
from vitkit.infer.evaluate import (
    DetectionResult,
    EvalResult,
    evaluate,
    evaluate_detector,
    evaluate_detector_dir,
    evaluate_model_dir,
)
from vitkit.infer.files import image_loader, image_paths, progress_bar
from vitkit.infer.model_dir import (
    is_detector_dir,
    is_detector_name,
    load_classifier,
    load_detection_settings,
    load_detector,
    missing_info_note,
    registered_detector,
    run_config,
    save_detection_settings,
)
from vitkit.infer.object_attention import (
    SampledPoints,
    detection_attention,
    detection_attention_figure,
    detection_sampling,
)
from vitkit.infer.output import format_predictions, write_detections, write_json, write_predictions_csv
from vitkit.infer.runtime import autocast, resolve_device

__all__ = [
    "Detection",
    "DetectionResult",
    "EvalResult",
    "ImageDetections",
    "Prediction",
    "Predictions",
    "SampledPoints",
    "attention_figure",
    "attention_map",
    "attention_maps",
    "attention_overlay",
    "attention_rollout",
    "autocast",
    "cls_attention",
    "load_attention_model",
    "prefix_attention",
    "prefix_token_names",
    "detect",
    "detect_files",
    "detect_paths",
    "detection_attention",
    "detection_attention_figure",
    "detection_input",
    "detection_sampling",
    "evaluate",
    "evaluate_detector",
    "evaluate_detector_dir",
    "evaluate_model_dir",
    "format_predictions",
    "image_loader",
    "image_paths",
    "is_detector_dir",
    "is_detector_name",
    "load_classifier",
    "load_detection_settings",
    "load_detector",
    "registered_detector",
    "run_config",
    "missing_info_note",
    "predict",
    "predict_files",
    "predict_paths",
    "progress_bar",
    "resolve_device",
    "save_detection_settings",
    "write_detections",
    "write_json",
    "write_predictions_csv",
]
