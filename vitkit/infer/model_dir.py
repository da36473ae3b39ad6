"""What inference reads a loaded model with, from what the model carries (`vitkit.weights.ModelInfo`, which
`vitkit.from_pretrained` sets on the model from its directory's config.json).

A model directory written by `vitkit train` holds everything: the class names, the normalisation, the data it was
trained on and, for a detector, its data's category ids and how its outputs become detections (the "postprocess"
entry, `vitkit.detection.Postprocessing`'s settings: {"classification": "ce" (softmax over the classes and "no
object", DETR) or "focal" (a sigmoid per class, Deformable DETR), "top_k": null or the number of (query, class)
pairs scored, "nms_iou": null or the IoU of per-class non-maximum suppression, "no_object_logit": whether the class
logits end with "no object", "threshold": null or the class probability detections are shown above}).

One written by `save_pretrained`, `vitkit convert` or `export_weights`, a Hugging Face directory, or a registered
model built untrained, may lack some of it; inference then takes (`inference_info`) the class indices ("0", "1", ...)
as names, ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225) as mean / std (the statistics of timm's models
and of vitkit's folder training), a detector's class indices as its category ids, and the default reading of its
class logits (`vitkit.detection.Postprocessing.default`: DETR's softmax and each query's best class, or Deformable
DETR's sigmoid and 100 best (query, class) pairs). Image size and channels always come from the model's config.
`missing_info_note` says what stood in for a directory without its training data's description, in one sentence
for people.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.data.detection import IMAGENET_MEAN, IMAGENET_STD
from vitkit.detection import Postprocessing
from vitkit.infer.detect import reading
from vitkit.models.interface import has_no_object_logit
from vitkit.models.registry import DETECTION, family, family_of, model_entry
from vitkit.weights import ModelInfo, model_info, read_model_info
from vitkit.weights.family import saved_family
from vitkit.weights.hub import hub_config, is_hub
from vitkit.weights.io import CONFIG_NAME


def is_detector_dir(directory: str | os.PathLike) -> bool:
    """Whether a model directory (or Hub repository, "hf-hub:ORG/REPO") holds a detector: its model's registered
    family has task detection (`saved_family`)."""
    found = saved_family(hub_config(directory).parent if is_hub(directory) else directory)  # the config alone
    return found is not None and found.task == DETECTION


def is_detector_name(name: str) -> bool:
    """Whether the registered model `name` is a detector (its family's task)."""
    return family(model_entry(name).family).task == DETECTION


def inference_info(model: nn.Module) -> ModelInfo:
    """What `model`'s images and outputs are read with: the `ModelInfo` it carries (`vitkit.weights.model_info`),
    what that lacks filled in: the class indices "0".."K-1" as names (and, for a detector, as category ids),
    ImageNet's mean / std."""
    saved = model_info(model)
    num_classes = getattr(model.config, "num_classes", 0)
    if saved.classes is not None and len(saved.classes) != num_classes:  # a classifier reset since it was loaded
        saved = saved.without_classes()
    classes = saved.classes if saved.classes is not None else tuple(str(k) for k in range(num_classes))
    mean, std = (saved.mean, saved.std) if saved.mean is not None else (IMAGENET_MEAN, IMAGENET_STD)
    category_ids = saved.category_ids
    if category_ids is None and family_of(model).task == DETECTION:
        category_ids = tuple(range(num_classes))
    return dataclasses.replace(saved, classes=classes, mean=mean, std=std, category_ids=category_ids)


def detection_reading(model: nn.Module, directory: str | os.PathLike | None = None) -> Postprocessing:
    """How a detector's outputs become detections: the "postprocess" settings it carries (`vitkit train` saves
    those it validated with), else the default reading of its class logits (`Postprocessing.default`). ValueError
    naming `directory`'s config.json when the settings are not ones vitkit reads or do not fit the model's class
    logits."""
    values = model_info(model).postprocess
    where = f"{Path(directory) / CONFIG_NAME}: " if directory is not None else ""
    if values is None:
        return Postprocessing.default(has_no_object_logit(model))
    try:
        return reading(model, Postprocessing.from_dict(values, has_no_object_logit(model)))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}'postprocess' is not a vitkit postprocess description: {err}") from err


def missing_info_note(directory: str | os.PathLike, names_from: str | None = None) -> str | None:
    """One sentence saying what stands in for the description of its training data that a model directory's
    config.json lacks (None when it holds one: a directory `vitkit train` wrote).

    Args:
        names_from: the data evaluated on, whose class names stand in when the model has none saved.
    """
    saved = read_model_info(directory)
    if saved.data is not None:
        return None
    if saved.weights is not None and saved.classes is not None and saved.mean is not None:
        return None  # published weights with their label names and normalisation: nothing stands in
    if saved.classes is not None:
        names = "the class names saved with the model"
    elif names_from is not None:
        names = f"the class names of {names_from} (none saved with the model)"
    else:
        names = "class indices (0, 1, ...) as names (none saved with the model)"
    stats = "the mean / std saved with the model" if saved.mean is not None else "ImageNet's mean / std (none saved)"
    return (
        f"{directory} holds no description of the data its model was trained on (vitkit train saves one in its "
        f"{CONFIG_NAME}): using {names}, {stats}, and the image size and channels of the model's config"
    )


def run_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The options of the `vitkit train` run a model directory was written by (its best/ or final/: the run's
    config.json one folder up), e.g. the batch size and precision it validated the model at; {} for a directory
    of no run (a Hub repository's)."""
    if is_hub(directory):
        return {}
    path = Path(directory).resolve().parent / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(saved, dict) or not {"batch_size", "epochs", "data", "out"} <= saved.keys():
        return {}  # not a run's config
    return saved
