"""Inference with trained models: predicting classes and detecting objects in images, evaluating on held-out data,
the data of the attention views, and what they read a loaded model with (`inference_info`, `detection_reading`).
`vitkit predict`, `vitkit eval` and `vitkit attention` run these on models that `vitkit.from_pretrained` loads."""

from vitkit.infer.attention import (
    attention_figure,
    attention_map,
    attention_maps,
    attention_overlay,
    attention_rollout,
    cls_attention,
    prefix_attention,
    prefix_token_names,
)
from vitkit.infer.classify import MIN_KEPT, Prediction, Predictions, crop_note, predict, predict_files, predict_paths
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
    detection_reading,
    inference_info,
    is_detector_dir,
    is_detector_name,
    missing_info_note,
    run_config,
)
from vitkit.infer.object_attention import (
    SampledPoints,
    detection_attention,
    detection_attention_figure,
    detection_sampling,
)
from vitkit.infer.output import (
    format_predictions,
    picture_paths,
    write_detections,
    write_json,
    write_predictions_csv,
)
from vitkit.infer.runtime import autocast, resolve_device

__all__ = [
    "MIN_KEPT",
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
    "crop_note",
    "prefix_attention",
    "prefix_token_names",
    "detect",
    "detect_files",
    "detect_paths",
    "detection_reading",
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
    "inference_info",
    "is_detector_dir",
    "is_detector_name",
    "run_config",
    "missing_info_note",
    "picture_paths",
    "predict",
    "predict_files",
    "predict_paths",
    "progress_bar",
    "resolve_device",
    "write_detections",
    "write_json",
    "write_predictions_csv",
]
