"""What a model directory holds for inference, and the model and data description read from it.

A model directory written by `vitkit train` holds the model (config.json, model.safetensors) and dataset.json (a
`vitkit.data.DataInfo` for a classifier, a `vitkit.data.DetectionInfo` for a detector: class names, normalisation,
the data it was trained on); a detector's also holds postprocess.json, how its outputs become detections
(`vitkit.detection.Postprocessing`): {"classification": "ce" (softmax over the classes and "no object", DETR) or
"focal" (a sigmoid per class, Deformable DETR), "top_k": null or the number of (query, class) pairs scored,
"nms_iou": null or the IoU of per-class non-maximum suppression, "no_object_logit": whether the class logits end
with "no object"}. A directory without postprocess.json is read as its model's class logits say
(`vitkit.detection.Postprocessing.default`): DETR's softmax and each query's best class, or Deformable DETR's sigmoid
and 100 best (query, class) pairs.

One written by `save_pretrained`, `vitkit convert` or `export_weights` has no dataset.json; it is used with what its
config holds (`vitkit.weights.ModelInfo`): the class names there, else the class indices ("0", "1", ...), and the
mean / std there, else ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225), the statistics of timm's models
and of vitkit's folder training; a detector's category ids are then its class indices. Image size and channels
always come from the model's config. `missing_info_note` says which of these stood in, in one sentence for people.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.data import DataInfo, DetectionInfo
from vitkit.data.detection import IMAGENET_MEAN, IMAGENET_STD
from vitkit.data.sources import INFO_NAME
from vitkit.detection import Postprocessing
from vitkit.infer.detect import reading
from vitkit.infer.runtime import resolve_device
from vitkit.models.interface import has_no_object_logit
from vitkit.models.registry import DETECTION, create_model, family, model_entry
from vitkit.weights import from_pretrained, model_info, read_model_info
from vitkit.weights.family import saved_family

SETTINGS_NAME = "postprocess.json"


def is_detector_dir(directory: str | os.PathLike) -> bool:
    """Whether a model directory holds a detector: its dataset.json says task detection, or without one (a
    directory of `save_pretrained`, `vitkit convert`) its model's registered family has task detection
    (`saved_family`)."""
    path = Path(directory) / INFO_NAME
    if not path.is_file():
        found = saved_family(directory)
        return found is not None and found.task == DETECTION
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds a JSON {type(saved).__name__}, expected an object (a vitkit dataset.json)")
    return saved.get("task") == DETECTION


def save_detection_settings(directory: str | os.PathLike, postprocessing: Postprocessing) -> Path:
    """Write postprocess.json: how the detector's outputs become detections (`vitkit.detection.Postprocessing`)."""
    path = Path(directory) / SETTINGS_NAME
    path.write_text(json.dumps(postprocessing.to_dict(), indent=2) + "\n")
    return path


def load_detection_settings(directory: str | os.PathLike, no_object_logit: bool = True) -> Postprocessing:
    """The `Postprocessing` postprocess.json in `directory` describes; without the file, the default reading of a
    detector with (DETR) or without (Deformable DETR) a "no object" logit (`Postprocessing.default`)."""
    path = Path(directory) / SETTINGS_NAME
    if not path.is_file():
        return Postprocessing.default(no_object_logit)
    try:
        values = json.loads(path.read_text())
        if not isinstance(values, dict):
            raise TypeError(f"expected a JSON object, got {type(values).__name__}")
        return Postprocessing.from_dict(values, no_object_logit)
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a vitkit postprocess description: {err}") from err


def model_dir_classes(model: nn.Module) -> tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]:
    """(class names, mean, std) from a loaded model's own config (`vitkit.weights.model_info`): its class names or
    the indices "0".."K-1", its mean / std or ImageNet's. What stands in for a missing dataset.json."""
    saved = model_info(model)
    num_classes = getattr(model.config, "num_classes", 0)
    classes = saved.class_names or tuple(str(k) for k in range(num_classes))
    if saved.mean is None or saved.std is None:
        return classes, IMAGENET_MEAN, IMAGENET_STD
    return classes, saved.mean, saved.std


def missing_info_note(directory: str | os.PathLike, names_from: str | None = None) -> str | None:
    """One sentence saying what stands in for the dataset.json a model directory lacks (None when it has one).

    Args:
        names_from: the data evaluated on, whose class names stand in when the model has none saved.
    """
    if (Path(directory) / INFO_NAME).is_file():
        return None
    saved = read_model_info(directory)
    if saved.class_names is not None:
        names = "the class names saved with the model"
    elif names_from is not None:
        names = f"the class names of {names_from} (none saved with the model)"
    else:
        names = "class indices (0, 1, ...) as names (none saved with the model)"
    stats = "the mean / std saved with the model" if saved.mean is not None else "ImageNet's mean / std (none saved)"
    return (
        f"{directory} has no {INFO_NAME} (vitkit train writes one): using {names}, {stats}, and the image size and "
        "channels of the model's config"
    )


def load_classifier(directory: str | os.PathLike, device: str | None = None) -> tuple[nn.Module, DataInfo]:
    """(model on `device`, data description) of a classifier's model directory.

    The description is its dataset.json, or without one (a directory of `save_pretrained`, `vitkit convert`,
    `export_weights`, a Hugging Face model) what the model's config holds (`model_dir_classes`), with an empty
    `source` (the training data is unknown). ValueError for a model without classifier (num_classes 0).
    """
    model = from_pretrained(directory).to(resolve_device(device))
    num_classes = getattr(model.config, "num_classes", 0)
    if num_classes <= 0:
        raise ValueError(
            f"{directory} holds a model without classifier (num_classes {num_classes}): nothing to predict"
        )
    if (Path(directory) / INFO_NAME).is_file():
        info = DataInfo.load(directory)
    else:
        classes, mean, std = model_dir_classes(model)
        info = DataInfo("", classes, mean, std, val_fraction=0.0, split_seed=0)
    if len(info.classes) != num_classes:
        raise ValueError(f"{directory}: the model has {num_classes} outputs but {len(info.classes)} class names")
    return model, info


def run_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The options of the `vitkit train` run a model directory was written by (its best/ or final/: the run's
    config.json one folder up), e.g. the batch size and precision it validated the model at; {} for a directory
    of no run."""
    path = Path(directory).resolve().parent / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(saved, dict) or not {"batch_size", "epochs", "data", "out"} <= saved.keys():
        return {}  # not a run's config
    return saved


def registered_detector(name: str, device: str | None = None) -> tuple[nn.Module, DetectionInfo, Postprocessing]:
    """(untrained model on `device`, data description, postprocessing) of a registered detector, as `load_detector`
    gives them for a directory without dataset.json or postprocess.json: class indices as names, ImageNet's
    normalisation, the default reading of its class logits."""
    model = create_model(name).eval().to(resolve_device(device))
    classes, mean, std = model_dir_classes(model)
    info = DetectionInfo("", classes, tuple(range(len(classes))), mean, std)
    return model, info, Postprocessing.default(has_no_object_logit(model))


def is_detector_name(name: str) -> bool:
    """Whether the registered model `name` is a detector (its family's task)."""
    return family(model_entry(name).family).task == DETECTION


def load_detector(
    directory: str | os.PathLike, device: str | None = None
) -> tuple[nn.Module, DetectionInfo, Postprocessing]:
    """(model on `device`, data description, postprocessing) of a detector's model directory.

    The description is its dataset.json, or without one what the model's config holds (`model_dir_classes`;
    category id = class index) with an empty `source`.
    """
    model = from_pretrained(directory).to(resolve_device(device))
    if (Path(directory) / INFO_NAME).is_file():
        info = DetectionInfo.load(directory)
    else:
        classes, mean, std = model_dir_classes(model)
        info = DetectionInfo("", classes, tuple(range(len(classes))), mean, std)
    settings = load_detection_settings(directory, has_no_object_logit(model))
    try:
        reading(model, settings)
    except ValueError as err:
        raise ValueError(f"{Path(directory) / SETTINGS_NAME}: {err}") from err
    return model, info, settings
