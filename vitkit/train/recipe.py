"""Which task a run trains (classification or detection) and the training recipe it starts from.

The task follows the model and the data: a DETR model trains a detector, any other model a classifier; detection
data (`builtin:digits-detect`, a COCO-format folder) needs a detector and classification data (`builtin:mnist5k`,
an ImageFolder tree) a classifier. With no model given, the data picks the default model of its task.

A recipe holds the defaults of the training options that differ between tasks and models: every `TrainConfig`
field left at None takes its value from the recipe of the run's model (`TrainConfig.resolved`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vitkit.data import BUILTIN_PREFIX, DIGITS_DETECT
from vitkit.models.registry import model_entry

CLASSIFICATION, DETECTION = "classification", "detection"
DETECTOR_FAMILIES = ("detr",)  # model families whose models are detectors
DETECTION_BUILTINS = (DIGITS_DETECT,)  # bundled detection datasets (builtin:NAME)

# The default models: a small ViT for the bundled 28x28 digits, 16 tokens of 7x7 patches (models/vit.py), and the
# small DETR sized for the bundled digits-detect canvases (models/detr.py) for detection data.
DEFAULT_MODEL = "vit_digits_patch7_28"
DEFAULT_DETECTOR = "detr_digits"


@dataclass(frozen=True)
class Recipe:
    """Defaults of the training options that depend on the task and the model (see the `TrainConfig` fields)."""

    epochs: int
    batch_size: int
    lr: float  # peak learning rate
    min_lr: float  # at the end of the cosine decay
    warmup_epochs: float
    weight_decay: float
    clip_grad: float  # gradient-norm clipping (0: off)
    label_smoothing: float | None = None  # classification only
    backbone_lr: float | None = None  # detection only: peak learning rate of the backbone
    detection_loss: str | None = None  # detection only: "ce" (DETR) or "focal" (Deformable DETR)
    box_cls_loss: float | None = None  # detection only: weight of the backbone's box classification (0: off)
    detection_top_k: int | None = None  # detection only: (query, class) pairs scored per image (0: each query's best)
    nms_iou: float | None = None  # detection only: IoU of per-class non-maximum suppression of detections (0: off)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Classification: AdamW with cosine decay as DeiT trains ViTs, scaled to the bundled digits.
CLASSIFIER_RECIPE = Recipe(
    epochs=40, batch_size=64, lr=2e-3, min_lr=1e-5, warmup_epochs=2.0, weight_decay=0.05, clip_grad=1.0,
    label_smoothing=0.1,
)  # fmt: skip
# DETR's recipe (Carion et al., arXiv:2005.12872): AdamW, lr 1e-4 with the backbone at 1e-5, weight decay 1e-4,
# gradient clipping 0.1, the softmax cross-entropy loss. DETR trains 500 epochs with a tenfold drop at 400; here the
# cosine decay ends at the same tenth (min_lr).
DETR_RECIPE = Recipe(
    epochs=50, batch_size=4, lr=1e-4, min_lr=1e-5, warmup_epochs=0.0, weight_decay=1e-4, clip_grad=0.1,
    backbone_lr=1e-5, detection_loss="ce", box_cls_loss=0.0, detection_top_k=0, nms_iou=0.0,
)  # fmt: skip
# The small DETRs (detr_digits, detr_tiny), tuned on builtin:digits-detect for two CPU cores: trained from scratch,
# so the backbone learns as fast as the rest (3e-4, cosine to 1% over 24 epochs, about 17 minutes for detr_digits),
# and from the first step on it also classifies the ground-truth boxes (`box_cls_loss`, see
# `vitkit.train.task.BoxClassification`): a backbone trained on digit classification, the aid that turned minutes
# of no progress into a detector (BENCHMARKS.md). Their detections are read as Deformable DETR reads its own (the
# 100 most probable (query, class) pairs, arXiv:2010.04159) with per-class NMS at IoU 0.7, which removes the
# duplicates that a DETR trained for minutes still predicts (the DETR paper, section 4.2, finds NMS helping its
# early decoder layers).
SMALL_DETR_RECIPE = Recipe(
    epochs=24, batch_size=16, lr=3e-4, min_lr=3e-6, warmup_epochs=0.5, weight_decay=1e-4, clip_grad=0.1,
    backbone_lr=3e-4, detection_loss="ce", box_cls_loss=1.0, detection_top_k=100, nms_iou=0.7,
)  # fmt: skip
RECIPES = {"detr_digits": SMALL_DETR_RECIPE, "detr_tiny": SMALL_DETR_RECIPE}  # models with a recipe of their own


def is_detection_data(source: str) -> bool:
    """Whether `source` (a `--data` value) is detection data: a bundled detection set, or a folder in a COCO layout
    (``annotations/instances_train*.json``, or a ``train*/`` folder holding one .json file)."""
    if source.startswith(BUILTIN_PREFIX):
        return source[len(BUILTIN_PREFIX) :] in DETECTION_BUILTINS
    root = Path(source)
    if any((root / "annotations").glob("instances_train*.json")):
        return True
    return any(len(list(folder.glob("*.json"))) == 1 for folder in root.glob("train*") if folder.is_dir())


def model_task(model: str | None = None, init: str | None = None) -> str | None:
    """The task of a registry model name, or of the saved model directory `init`; None when neither is given."""
    if model is not None:
        family = model_entry(model).family
    elif init is not None:
        saved = json.loads((Path(init) / "config.json").read_text()) if (Path(init) / "config.json").is_file() else {}
        family = saved.get("family") or saved.get("model_type")  # vitkit's directories, or transformers'
    else:
        return None
    return DETECTION if family in DETECTOR_FAMILIES else CLASSIFICATION


def resolve_task(model: str | None, init: str | None, data: str) -> tuple[str, str | None]:
    """(task, model name) of a run: the task of the model, checked against the data, and the model name with the
    data's default model filled in when neither `model` nor `init` is given."""
    data_task = DETECTION if is_detection_data(data) else CLASSIFICATION
    task = model_task(model, init)
    if task is None:
        return data_task, DEFAULT_DETECTOR if data_task == DETECTION else DEFAULT_MODEL
    if task != data_task:
        what = f"model {model!r}" if model is not None else f"the model in {init}"
        needs = (
            f"a detector (e.g. {DEFAULT_DETECTOR})"
            if data_task == DETECTION
            else f"a classifier (e.g. {DEFAULT_MODEL})"
        )
        raise ValueError(f"{what} is a {task} model but {data} is {data_task} data: train it with {needs}")
    return task, model


def recipe_for(task: str, model: str | None) -> Recipe:
    """The recipe of `model` (a registry name, or None for a fine-tuned directory) training for `task`."""
    if task == CLASSIFICATION:
        return CLASSIFIER_RECIPE
    return RECIPES.get(model, DETR_RECIPE) if model is not None else DETR_RECIPE
