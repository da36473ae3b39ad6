"""Which task a run trains (classification or detection) and the training recipe it starts from.

The task follows the model and the data: a model's family declares its task (`vitkit.models.registry.Family.task`);
detection data (`builtin:digits-detect`, a COCO-format folder) needs a detector and classification data
(`builtin:mnist5k`, an ImageFolder tree) a classifier. With no model given, the data picks the default model of its
task.

A recipe holds the defaults of the training options that differ between tasks and models: every `TrainConfig`
field left at None takes its value from the recipe of the run's model (`TrainConfig.resolved`). It is built from
three layers, each over the one before: the task's defaults (`TASK_RECIPES`), the family's declared recipe
(`register_family(recipe=...)`) and the registered variant's own (`register_model(recipe=...)`, for training it from
scratch; a fine-tuned model takes its family's).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vitkit.data import BUILTIN_PREFIX, DIGITS_DETECT
from vitkit.data.coco import other_annotations
from vitkit.data.tiles import DEFAULT_OVERLAP
from vitkit.models.registry import CLASSIFICATION, DETECTION, Family, families, family, list_models, model_entry
from vitkit.util import counted
from vitkit.weights.family import saved_family
from vitkit.weights.hub import is_hub, local_source

DETECTION_BUILTINS = (DIGITS_DETECT,)  # bundled detection datasets (builtin:NAME)

# The default models: a small ViT for the bundled 28x28 digits, 16 tokens of 7x7 patches (models/vit.py), and the
# small Deformable DETR trained from scratch in minutes (models/deformable_detr.py) for detection data.
DEFAULT_MODEL = "vit_digits_patch7_28"
DEFAULT_DETECTOR = "deformable_detr_small"


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
    pixel_budget: float | None = None  # detection only: with it, the run is sized from the data (`data_choices`):
    # epochs so that training sees about this many image pixels, the image side, the batch and the queries

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Each task's defaults, under what a model's family and variant declare. Classification: AdamW with cosine decay as
# DeiT trains ViTs, scaled to the bundled digits (BENCHMARKS.md, "Training"). Detection: none; a detector family
# declares its whole recipe.
TASK_RECIPES: dict[str, dict[str, Any]] = {
    CLASSIFICATION: dict(
        epochs=40, batch_size=64, lr=2e-3, min_lr=1e-5, warmup_epochs=2.0, weight_decay=0.05, clip_grad=1.0,
        label_smoothing=0.1,
    ),
    DETECTION: {},
}  # fmt: skip


# How a recipe with a pixel budget sizes a detection run from its data (`data_choices`).
MIN_BOX_SIDE = 12  # the smallest tenth of the boxes is enlarged to at least this many pixels (1.5 cells of the
# finest, stride-8 level) ...
MAX_UPSCALE = 2.0  # ... by at most this factor of the images' stored size
SIDE_MULTIPLE = 16  # the chosen shorter side is rounded to this
SIDE_RANGE = (64, 800)  # and kept within this (800: the DETR papers' training side)
MIN_EPOCHS, MAX_EPOCHS = 3, 200
STEPS_PER_EPOCH = 128  # the batch is at most the training images over this: a small dataset learns from more
# steps of smaller batches (300 shapes images, 16 epochs: AP 0.17 in batches of 8, 0.30 of 4, more of 2;
# BENCHMARKS.md, "Detection from scratch")
TILE_RANGE = (384, 800)  # a tile the recipe picks: its side, within this and a multiple of SIDE_MULTIPLE, makes
# the tiles' overlap (`vitkit.data.tiles.DEFAULT_OVERLAP`) at least the 90th percentile of the box sizes
QUERIES_PER_OBJECT = 2  # object queries per object of the fullest image, when the model has fewer
SIZED_FROM_DATA = ("epochs", "batch_size")  # the Recipe fields a pixel budget replaces


@dataclass(frozen=True)
class DataChoice:
    """A run option chosen from the data: its `TrainConfig` field (or "num_queries", a model field), the value and
    why (for the start summary)."""

    field: str
    value: Any
    why: str


def data_side(stats: Any) -> tuple[int, str]:
    """The training image side a detection dataset asks for, and why: the median shorter side of its images, enlarged
    so the smallest tenth of the boxes is at least MIN_BOX_SIDE pixels (at most MAX_UPSCALE times), rounded to
    SIDE_MULTIPLE and kept within SIDE_RANGE."""
    short = float(stats.short_side_median)
    scale = 1.0
    if stats.boxes and stats.box_size_p10 < MIN_BOX_SIDE:
        scale = min(MAX_UPSCALE, MIN_BOX_SIDE / max(stats.box_size_p10, 1.0))
    side = int(min(max(round(short * scale / SIDE_MULTIPLE) * SIDE_MULTIPLE, SIDE_RANGE[0]), SIDE_RANGE[1]))
    why = f"median shorter side {short:g} px"
    if scale > 1:
        why += f", enlarged: the smallest tenth of the boxes ({stats.box_size_p10:.0f} px) to >= {MIN_BOX_SIDE} px"
    return side, why


def tile_choice(stats: Any) -> DataChoice | None:
    """Tiles for images too large to train whole: when their median shorter side is above SIDE_RANGE's largest and
    shrinking them to it leaves the smallest tenth of the boxes below MIN_BOX_SIDE, a tile side (within TILE_RANGE)
    whose overlap holds the 90th percentile of the box sizes; else None (the images are trained whole)."""
    short = float(stats.short_side_median)
    if not stats.boxes or short <= SIDE_RANGE[1]:
        return None
    shrunk = stats.box_size_p10 * SIDE_RANGE[1] / short
    if shrunk >= MIN_BOX_SIDE:
        return None
    wanted = stats.box_size_p90 / DEFAULT_OVERLAP if math.isfinite(stats.box_size_p90) else TILE_RANGE[0]
    side = int(min(max(math.ceil(wanted / SIDE_MULTIPLE) * SIDE_MULTIPLE, TILE_RANGE[0]), TILE_RANGE[1]))
    why = (
        f"images of median shorter side {short:g} px, whose smallest tenth of boxes ({stats.box_size_p10:.0f} px) "
        f"would shrink to {shrunk:.0f} px at {SIDE_RANGE[1]} px: trained in tiles at full resolution, overlapping "
        f"by {DEFAULT_OVERLAP:g} of a tile ({side * DEFAULT_OVERLAP:.0f} px, 90% of the boxes are at most "
        f"{stats.box_size_p90:.0f} px)"
    )
    return DataChoice("tile", side, why)


def paper_side_choice(stats: Any, model_side: int) -> list[DataChoice]:
    """For a recipe without a pixel budget (a paper's, for COCO-sized photos): the data's side (`data_side`) when it
    is smaller than the model's `model_side`, which would upscale every image; else nothing (the model's side)."""
    side, why = data_side(stats)
    if side >= model_side:
        return []
    pixels = (model_side / side) ** 2
    return [DataChoice("img_size", side, f"{why}; the model's {model_side} px would train on {pixels:.0f}x the pixels")]


def data_choices(
    stats: Any,
    recipe: Recipe,
    model_config: Any,
    from_scratch: bool,
    img_size: int | None = None,
    samples: str = "training image",
) -> list[DataChoice]:
    """The image side, epochs, batch and (for a model trained from scratch) object queries of a detection run whose
    recipe declares a `pixel_budget`, from a `vitkit.data.DetectionStats` of its training data:

    - img_size: the median shorter side of the images, enlarged so the smallest tenth of the boxes is at least
      MIN_BOX_SIDE pixels (at most MAX_UPSCALE times), rounded to SIDE_MULTIPLE and kept within SIDE_RANGE;
    - epochs: the pixel budget over the pixels of one epoch at that side (within MIN_EPOCHS..MAX_EPOCHS);
    - batch_size: the recipe's, at most the power of two below the training images over STEPS_PER_EPOCH (at
      least 2);
    - num_queries: QUERIES_PER_OBJECT per object of the fullest image, when the model has fewer.

    An empty list when the recipe has no budget. A given `img_size` is kept (not a choice) and sizes the epochs.
    `samples` names one of what `stats` counts as images (a training tile of `vitkit.data.tiles.tiled_stats`).
    """
    if recipe.pixel_budget is None:
        return []
    short = float(stats.short_side_median)
    side, why_side = data_side(stats)
    side = img_size or side
    aspect = float(stats.long_side_median) / max(short, 1.0)
    epoch_pixels = stats.images * side * side * aspect
    epochs = int(min(max(round(recipe.pixel_budget / epoch_pixels), MIN_EPOCHS), MAX_EPOCHS))
    fits = 2 ** int(math.log2(max(stats.images // STEPS_PER_EPOCH, 1)))  # a power of two, as batches usually are
    batch = int(max(2, min(recipe.batch_size, fits)))
    choices = [DataChoice("img_size", side, why_side)] if img_size is None else []
    choices += [
        DataChoice(
            "epochs", epochs, f"{counted(stats.images, samples)} of about {side}x{side * aspect:.0f} px, a budget of "
            f"{recipe.pixel_budget:.2g} pixels",
        ),
        DataChoice("batch_size", batch, f"{counted(stats.images, samples)}: "
                   f"{counted(math.ceil(stats.images / batch), 'step')} an epoch, more and smaller than the recipe's "
                   f"batch of {recipe.batch_size} would give"
                   if batch < recipe.batch_size else "the recipe's"),
    ]  # fmt: skip
    queries = QUERIES_PER_OBJECT * stats.max_objects
    if from_scratch and queries > getattr(model_config, "num_queries", queries):
        choices.append(DataChoice("num_queries", queries, f"up to {stats.max_objects} objects in one image"))
    return choices


def is_detection_data(source: str) -> bool:
    """Whether `source` (a `--data` value) is detection data: a bundled detection set, or a folder of COCO-format
    annotations: .json files in ``annotations/`` or in ``train*/`` folders, or a COCO file at its top
    (`vitkit.data.load_coco_folder` reads its layouts, and names them when the folder is in none). Class folders
    hold images, not .json files."""
    if source.startswith(BUILTIN_PREFIX):
        return source[len(BUILTIN_PREFIX) :] in DETECTION_BUILTINS
    root = Path(source)
    if any((root / "annotations").glob("*.json")):
        return True
    if any(any(folder.glob("*.json")) for folder in root.glob("train*") if folder.is_dir()):
        return True
    # a whole set in one file, or labelme's files: detection data, whose loading names the layouts and the fix
    return any(other_annotations(root))


def model_task(model: str | None = None, init: str | None = None) -> str | None:
    """The task of a registry model name, or of the saved model directory `init` (classification when its family
    is not a registered one); None when neither is given."""
    if model is not None:
        return family(model_entry(model).family).task
    if init is not None:
        found = saved_family(local_source(init))
        return found.task if found is not None else CLASSIFICATION
    return None


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


def recipe_for(task: str, model: str | None, init: str | None = None) -> Recipe:
    """The recipe of a run training `task`: the task's defaults, the family's recipe over them and, for a model
    trained from scratch, the variant's own over that.

    Args:
        task: "classification" or "detection".
        model: the registry name of the model trained; None for the model saved in the directory `init`.
        init: what the run fine-tunes from (a model directory or a checkpoint file), None when it trains from
            scratch: a variant's own recipe is for training from scratch, so a fine-tuned model takes its family's;
            but a classifier's checkpoint that fills only a detector's backbone leaves the rest of the detector to
            train from its initialisation, and the variant keeps its own recipe.
    """
    if model is not None:
        fam: Family | None = family(model_entry(model).family)
    else:
        fam = saved_family(local_source(init)) if init is not None else None
    whole = init is not None and not (model is not None and fills_backbone_only(init, fam))
    variant = model_entry(model).recipe if model is not None and not whole else {}
    return _recipe(task, fam, variant)


def fills_backbone_only(init: str, fam: Family | None) -> bool:
    """Whether the checkpoint `init` holds a model of another family than the detector family `fam` (a classifier,
    which fills the detector's backbone alone): a directory says its family; a file is matched against `fam`'s
    layouts. A Hub repository counts as a whole detector (its files are not fetched to resolve a recipe)."""
    if fam is None or fam.task == CLASSIFICATION or is_hub(init):  # a Hub repository is not fetched for this
        return False
    from vitkit.train.model import _holds_family  # reads the file: only when a detector is fine-tuned

    try:
        return not _holds_family(local_source(init), fam.name)
    except (OSError, ValueError):  # unreadable or unknown: the load reports it; take the fine-tuning recipe
        return False


def _recipe(task: str, fam: Family | None, variant: dict[str, Any]) -> Recipe:
    """`Recipe` of the task's defaults, then `fam`'s declared recipe (None: no family's), then `variant`'s."""
    values = {**TASK_RECIPES[task], **(fam.recipe if fam is not None else {}), **variant}
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(values) - set(fields))
    missing = [name for name, f in fields.items() if f.default is dataclasses.MISSING and name not in values]
    if unknown or missing:
        whose = f"the {fam.name} family's" if fam is not None else f"the {task} task's"
        raise ValueError(
            f"{whose} training recipe ({task}) "
            + (f"has no option(s) {unknown}" if unknown else f"lacks {missing}")
            + ": a family declares Recipe fields in register_family(recipe=...)"
        )
    return Recipe(**values)


def declared_recipes() -> list[tuple[str, Recipe]]:
    """Every recipe the registry's models train with from scratch, each with how `vitkit train --help` names the
    models it serves, in registration order: "" for the classification task's defaults; for each family declaring
    a recipe, the recipes its variants declare ("small <Family>s" when one recipe serves them all, such variants
    being vitkit's small models trained from scratch on a few CPU cores; else each recipe's variants by name), then
    the family (its `display_name`)."""
    found = [("", _recipe(CLASSIFICATION, None, {}))]
    for fam in families():
        if not fam.recipe:
            continue
        own = _recipe(fam.task, fam, {})
        served: dict[Recipe, list[str]] = {}
        for entry in map(model_entry, list_models()):
            if entry.family == fam.name and entry.recipe:
                recipe = _recipe(fam.task, fam, dict(entry.recipe))
                if recipe != own:
                    served.setdefault(recipe, []).append(entry.name)
        for recipe, names in served.items():
            found.append((f"small {fam.display_name}s" if len(served) == 1 else ", ".join(names), recipe))
        found.append((fam.display_name, own))
    return found
