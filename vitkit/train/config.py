"""The configuration of a training run: one frozen dataclass, written resolved to OUT/config.json."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitkit.analysis.estimate import STRATEGIES
from vitkit.analysis.precision import AUTO, PRECISIONS, resolve_precision
from vitkit.data import (
    BUILTIN_PREFIX,
    DEFAULT_DATA,
    DEFAULT_VAL_FRACTION,
    DetectionStats,
    augment_defaults,
    detection_augment_defaults,
    detection_stats,
    load_detection,
)
from vitkit.data.sources import own_split
from vitkit.data.tiles import MIN_TILE, tiled_stats
from vitkit.detection import DETECTION_LOSSES
from vitkit.infer.runtime import resolve_device
from vitkit.layers.helpers import to_2tuple
from vitkit.models.interface import has_no_object_logit
from vitkit.models.registry import family, model_entry, replace_config
from vitkit.train.recipe import (
    CLASSIFICATION,
    SIZED_FROM_DATA,
    DataChoice,
    Recipe,
    data_choices,
    declared_recipes,
    paper_side_choice,
    recipe_for,
    resolve_task,
    tile_choice,
)
from vitkit.weights.family import saved_family
from vitkit.weights.hub import is_hub, local_source
from vitkit.weights.io import read_json

CONFIG_NAME = "config.json"
DEFAULT_OUT = "runs/train"
DERIVED = ("warmup_epochs", "min_lr")  # options whose default depends on others given (epochs, lr)
MAX_WARMUP_SHARE = 0.2  # a recipe's warmup is at most this share of a run's epochs (a run of 2 epochs warms up for
# 0.4, not the classifier recipe's 2, which would end it at the peak rate); a warmup given is kept as given
CLASSIFICATION_ONLY = ("label_smoothing", "mixup", "cutmix", "randaugment", "min_scale")
DETECTION_ONLY = (
    "backbone_lr", "detection_loss", "box_cls_loss", "detection_top_k", "nms_iou", "scale_jitter", "crop", "tile"
)  # fmt: skip


def recipe_defaults(name: str) -> str:
    """ "default: 40; small DETRs 24; DETR 50" for a recipe field, for --help: its value in each recipe the
    registry declares (`vitkit.train.recipe.declared_recipes`), those where it does not apply left out."""
    found = [(label, _declared(recipe, name)) for label, recipe in declared_recipes()]
    return "default: " + "; ".join(
        " ".join(filter(None, (label, _shown(value)))) for label, value in found if value is not None
    )


def _declared(recipe: Recipe, name: str) -> Any:
    """A recipe's value of field `name`, or "from the data" for those its pixel budget sizes (`data_choices`)."""
    if recipe.pixel_budget is not None and name in SIZED_FROM_DATA:
        return "from the data"
    return getattr(recipe, name)


def _shown(value: Any) -> str:
    """A recipe value as --help writes it: numbers in the shortest form (0.0001, 1e-05, 24), words as they are."""
    return format(value, "g") if isinstance(value, int | float) else str(value)


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] = dataclasses.MISSING,  # type: ignore[assignment]
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A `TrainConfig` field that `vitkit train` offers as an option (`vitkit.cli.options.add_config_options`).

    The option's type follows the field's annotation: int, float or str; a bool is a switch that sets True; a dict
    takes KEY=VALUE pairs, repeatable.

    Args:
        default, default_factory: as for `dataclasses.field`.
        help: the option's --help text; " (default: X)" is appended unless the default is None, a bool or a factory.
        flag: the option's name when it is not --field-name.
        metavar, choices: as for `argparse.ArgumentParser.add_argument`.
    """
    cli = {"help": help, "flag": flag, "metavar": metavar, "choices": choices}
    metadata = {k: v for k, v in cli.items() if v is not None}
    return field(default=default, default_factory=default_factory, metadata=metadata)


def option_flag(f: dataclasses.Field) -> str:
    """The command-line flag of an `option` field: its `flag`, or --field-name."""
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


@dataclass(frozen=True)
class TrainConfig:
    """A training run. Every field is a `vitkit train` option, with its --help text in `help`; the comments say
    what the help leaves out. Options left at None take the value of the run's recipe (`vitkit.train.recipe`):
    the task's defaults under what the model's family and registry entry declare."""

    # None: DEFAULT_MODEL, or DEFAULT_DETECTOR for detection data, unless init is given
    model: str | None = option(
        None,
        help="registry name (see 'vitkit models'); default: a small ViT for 28x28 digits, deformable_detr_small "
        "for detection",
    )
    # config fields replaced in the model, e.g. {"depth": 6}
    model_args: dict[str, Any] = option(
        default_factory=dict,
        flag="--model-arg",
        metavar="KEY=VALUE",
        help="replace a model config field, e.g. --model-arg depth=6 (repeatable)",
    )
    # a model directory (or Hub repository) alone trains the model saved there; a checkpoint file (no architecture in
    # it), or a directory together with model, loads its weights into the registry model `model` (the default model
    # of the data's task when None)
    init: str | None = option(
        None,
        help="fine-tune from a model directory (vitkit, Hugging Face, timm), a Hugging Face Hub repository "
        "(hf-hub:ORG/REPO[@REVISION], e.g. hf-hub:SenseTime/deformable-detr), or a checkpoint file in any layout "
        "'vitkit convert' reads (timm, torchvision, facebookresearch/detr, Deformable-DETR, .pth / .safetensors) "
        "loaded into --model; the position table and the class heads are adapted to the data; a ResNet classifier's "
        "file fills a detector's backbone",
    )
    # "builtin:NAME", an ImageFolder path or a COCO-format folder; detection data trains a detector
    data: str = option(
        DEFAULT_DATA,
        help="builtin:NAME (mnist5k, digits-detect), a folder of class folders (train/ and val/, or one set), or a "
        "COCO-format detection folder",
    )
    # in (0, 1); None: DEFAULT_VAL_FRACTION where it applies. Data with a split of its own ignores it (with a
    # warning when given) and the resolved config holds None
    val_fraction: float | None = option(
        None, help=f"share of each class held out from a folder without val/ (default: {DEFAULT_VAL_FRACTION})"
    )
    epochs: int | None = option(None, help=f"passes over the training data ({recipe_defaults('epochs')})")
    # the global batch is batch_size * processes
    batch_size: int | None = option(None, help=f"images per step and process ({recipe_defaults('batch_size')})")
    lr: float | None = option(None, help=f"peak learning rate, AdamW ({recipe_defaults('lr')})")
    # the backbone's parameter groups are scaled with the others by the schedule
    backbone_lr: float | None = option(
        None, help=f"peak learning rate of a detector's backbone ({recipe_defaults('backbone_lr')})"
    )
    min_lr: float | None = option(
        None, help=f"learning rate at the end of the cosine decay ({recipe_defaults('min_lr')})"
    )
    # fractions allowed, at most the whole run
    warmup_epochs: float | None = option(
        None,
        help=f"linear warmup, in epochs ({recipe_defaults('warmup_epochs')}; at most a fifth of a shorter run's "
        "epochs)",
    )
    # never on norms, biases, tokens, position tables
    weight_decay: float | None = option(
        None, help=f"decoupled weight decay on weight matrices ({recipe_defaults('weight_decay')})"
    )
    # in [0, 1); classification only
    label_smoothing: float | None = option(
        None, help=f"cross-entropy label smoothing of a classifier ({recipe_defaults('label_smoothing')})"
    )
    # "ce": softmax over the classes and "no object" (DETR); "focal": a sigmoid per class (Deformable DETR)
    detection_loss: str | None = option(
        None,
        help=f"a detector's classification loss ({recipe_defaults('detection_loss')})",
        choices=DETECTION_LOSSES,
    )
    # >= 0; the classifier of RoIAlign-pooled boxes is trained with the detector and not saved with it
    box_cls_loss: float | None = option(
        None,
        help="weight of a detector's auxiliary loss classifying each ground-truth box from its backbone's features "
        f"({recipe_defaults('box_cls_loss')}; 0: off)",
    )
    # >= 0; how validation and the saved detector read detections (`vitkit.detection.Postprocessing`)
    detection_top_k: int | None = option(
        None,
        help="score a detector's k most probable (query, class) pairs per image, as Deformable DETR does "
        f"({recipe_defaults('detection_top_k')}; 0: each query's best class, as DETR does)",
    )
    # in [0, 1]; 0 is off
    nms_iou: float | None = option(
        None,
        help="drop a detection overlapping a more probable one of its class above this IoU "
        f"({recipe_defaults('nms_iou')}; 0: off)",
    )
    # the global norm
    clip_grad: float | None = option(
        None, help=f"clip the gradient norm to this value, 0: off ({recipe_defaults('clip_grad')})"
    )
    # in [0, 1); the average is what is validated and saved
    ema_decay: float = option(0.0, help="keep an EMA of the weights with this decay, e.g. 0.999 (0: off)")
    # a detector's digits-detect canvas side, or the shorter side of its COCO images
    img_size: int | None = option(None, help="training image side (default: the model's)")
    # a detector's: train on tiles of this side drawn from large images, validate on whole images in tiles
    # (`vitkit.data.tiles`); None: whole images, or the tiles the recipe picks (`vitkit.train.recipe.tile_choice`)
    tile: int | None = option(
        None, help="train on tiles of this side (px) drawn from large images, and validate on whole images in tiles "
        "(default: whole images, or tiles the recipe picks for large images of small objects; 0: whole images)"
    )  # fmt: skip
    # bf16: bfloat16 autocast of the forward pass
    precision: str = option(
        "fp32",
        help="fp32, bf16 autocast, or auto: the faster on the device, as matrix products measure and, where they "
        "favour bf16, the model's own training step (said at the start)",
        choices=(*PRECISIONS, AUTO),
    )
    device: str | None = option(None, help="cpu or cuda (default: cuda when available)", choices=("cpu", "cuda"))
    # `vitkit.train.sharding`; a single process trains the whole model either way, but with fsdp writes sharded
    # checkpoints, which resume on any number of processes
    strategy: str = option(
        "ddp",
        help="how torchrun's processes share the run: ddp replicates the model in each, fsdp shards its parameters, "
        "gradients and optimizer state across them (models larger than one device; checkpoints resume on any "
        "number of processes)",
        choices=STRATEGIES,
    )
    workers: int = option(0, help="data loader worker processes")  # 0 loads in the training process
    seed: int = option(0, help="seed of initialisation, data order, augmentation and splits")
    # the random resized crop keeps min_scale..1 of the area; classification only
    min_scale: float | None = option(None, help="smallest area kept by the random crop (default: the data's)")
    # the data's default: 0 for digits and digits-detect, 0.5 for folders
    hflip: float | None = option(None, help="horizontal flip probability (default: the data's)")
    # in [0, 1); a detector's training images get a shorter side drawn from img_size * (1 -+ scale_jitter)
    scale_jitter: float | None = option(
        None, help="multi-scale detection training: shorter side within img_size * (1 -+ this) (default: the data's)"
    )
    # probability of a detection training image's random crop (`vitkit.data.transforms.detection_train_transform`)
    crop: float | None = option(None, help="probability of a random crop of a detection image (default: the data's)")
    randaugment: int = option(0, help="RandAugment magnitude 0..30 (0: off)")
    mixup: float = option(0.0, help="MixUp alpha (0: off)")
    cutmix: float = option(0.0, help="CutMix alpha (0: off)")  # with both on, each batch picks one
    grad_checkpointing: bool = option(False, help="recompute blocks in backward to save memory")
    # receives config.json, metrics.jsonl, checkpoint.pt, best/, final/
    out: str = option(DEFAULT_OUT, help="output folder", metavar="DIR")

    def __post_init__(self) -> None:
        positive = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "backbone_lr": self.backbone_lr,
        }
        for name, value in positive.items():
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        nonnegative = {
            "min_lr": self.min_lr,
            "warmup_epochs": self.warmup_epochs,
            "weight_decay": self.weight_decay,
            "clip_grad": self.clip_grad,
            "box_cls_loss": self.box_cls_loss,
            "detection_top_k": self.detection_top_k,
            "workers": self.workers,
            "mixup": self.mixup,
            "cutmix": self.cutmix,
        }
        for name, value in nonnegative.items():
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0 <= self.seed < 2**32:  # numpy's and torch's seeds
            raise ValueError(f"seed must be in 0 .. 2**32 - 1, got {self.seed}")
        if self.label_smoothing is not None and not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0 is off), got {self.ema_decay}")
        if self.precision not in (*PRECISIONS, AUTO):
            raise ValueError(f"precision must be {', '.join(map(repr, (*PRECISIONS, AUTO)))}, got {self.precision!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be {' or '.join(map(repr, STRATEGIES))}, got {self.strategy!r}")
        if self.strategy == "fsdp" and self.ema_decay > 0:
            raise ValueError(
                f"ema_decay {self.ema_decay} keeps a whole copy of the weights in every process, which strategy "
                "fsdp shards to save that memory: train with one or the other (ema_decay 0, or strategy ddp)"
            )
        if self.detection_loss is not None and self.detection_loss not in DETECTION_LOSSES:
            raise ValueError(f"detection_loss must be 'ce' or 'focal', got {self.detection_loss!r}")
        if self.nms_iou is not None and not 0.0 <= self.nms_iou <= 1.0:
            raise ValueError(f"nms_iou must be in [0, 1] (0 is off), got {self.nms_iou}")
        if self.val_fraction is not None and not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.img_size is not None and self.img_size <= 0:
            raise ValueError(f"img_size must be positive, got {self.img_size}")
        if self.tile is not None and self.tile < 0:
            raise ValueError(f"tile must be a number of pixels (0: whole images), got {self.tile}")
        if self.tile and self.tile < MIN_TILE:
            raise ValueError(
                f"tile {self.tile}: a training tile of under {MIN_TILE} px holds a few pixels of an object; give at "
                f"least {MIN_TILE} (a few times the objects' size), or 0 for whole images"
            )
        if self.tile and str(self.data).startswith(BUILTIN_PREFIX):
            raise ValueError(f"{self.data} is of small images: tiles are for large images, in a COCO-format folder")
        for name in ("hflip", "crop"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
        if self.scale_jitter is not None and not 0.0 <= self.scale_jitter < 1.0:
            raise ValueError(f"scale_jitter must be in [0, 1) (0 is off), got {self.scale_jitter}")

    @property
    def tile_side(self) -> int | None:
        """The side of the training tiles; None: whole images (`tile` None or 0)."""
        return self.tile or None

    @property
    def init_is_file(self) -> bool:
        """Whether `init` is a checkpoint file (weights without architecture) rather than a model directory."""
        return self.init is not None and not is_hub(self.init) and Path(self.init).is_file()

    def _task_and_model(self) -> tuple[str, str | None]:
        """(task, model name): a checkpoint file has no architecture, so it trains the named or the default model."""
        if self.init is not None and not is_hub(self.init) and not Path(self.init).exists():
            raise FileNotFoundError(
                f"init {self.init} not found: expected a model directory, a checkpoint file or a Hugging Face Hub "
                "repository (hf-hub:ORG/REPO)"
            )
        return resolve_task(self.model, None if self.init_is_file else self.init, self.data)

    @property
    def task(self) -> str:
        """ "classification" or "detection": what the model and the data train (`vitkit.train.recipe.resolve_task`)."""
        return self._task_and_model()[0]

    def _own_split(self, task: str) -> str | None:
        """Why `val_fraction` does not apply to this run's data (None when it does)."""
        if task != CLASSIFICATION:
            return f"{self.data} is detection data, with its own train and val splits"
        return own_split(self.data)

    def ignored(self) -> list[str]:
        """Messages for the options given that the run does not use (`fit` logs them as warnings)."""
        if self.val_fraction is None:
            return []
        why = self._own_split(self.task)
        return [f"val_fraction {self.val_fraction} is ignored: {why}"] if why is not None else []

    def resolved(self) -> TrainConfig:
        """The same run with every None default filled in from its task and recipe, as written to config.json;
        ValueError for a model that does not fit the data, or an option the task does not have.

        Paths (`data`, `init`) become absolute, so the saved run and its models work from any folder; a
        `val_fraction` the data does not use (see `ignored`) becomes None."""
        task, model = self._task_and_model()
        recipe = recipe_for(task, model, self.init)
        unused = CLASSIFICATION_ONLY if task != CLASSIFICATION else DETECTION_ONLY
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        given = [name for name in unused if getattr(self, name) != defaults[name]]
        if given:
            raise ValueError(f"option(s) {given} do not apply to {task}; leave them out")
        own = {f.name for f in dataclasses.fields(self)}  # a recipe's pixel_budget sizes the run (data_choices)
        fill = {k: v for k, v in recipe.to_dict().items() if k in own and getattr(self, k) is None}
        model_args = dict(self.model_args)
        for choice in self.data_choices():
            if choice.field in MODEL_CHOICES:
                model_args[choice.field] = choice.value
            else:
                fill[choice.field] = choice.value
        if task == CLASSIFICATION:
            augment = augment_defaults(self.data)
        else:
            augment = asdict(detection_augment_defaults(self.data))
        fill.update({k: v for k, v in augment.items() if getattr(self, k) is None})
        if task != CLASSIFICATION:
            _check_detection_loss(self.detection_loss or fill.get("detection_loss"), model, self.init)
        lr, min_lr = self.lr or fill.get("lr"), self.min_lr if self.min_lr is not None else fill.get("min_lr")
        if lr is not None and min_lr is not None and min_lr > lr:  # the cosine would rise
            if self.min_lr is not None:
                raise ValueError(
                    f"min_lr {min_lr:g} is above lr {lr:g}: the cosine decay would raise the learning rate; give a "
                    "min_lr of at most lr"
                )
            fill["min_lr"] = lr * recipe.min_lr / recipe.lr  # the recipe's end, as a share of the rate given
        epochs = self.epochs or fill.get("epochs")
        if "warmup_epochs" in fill and epochs:  # a recipe's warmup in a short run: a share of it, so the rate decays
            fill["warmup_epochs"] = min(fill["warmup_epochs"], MAX_WARMUP_SHARE * epochs)
        if self.precision == AUTO:  # the faster of the two on the run's device, as measured
            fill["precision"] = resolve_precision(AUTO, resolve_device(self.device))
        if self._own_split(task) is not None:
            fill["val_fraction"] = None
        elif self.val_fraction is None:
            fill["val_fraction"] = DEFAULT_VAL_FRACTION
        return dataclasses.replace(
            self,
            model=model,
            model_args=model_args,
            data=absolute_data(self.data),
            init=self.init if self.init is None or is_hub(self.init) else os.path.abspath(self.init),
            **fill,
        )

    def data_choices(self) -> list[DataChoice]:
        """The options left unset that a detection run's recipe sizes from its data (`vitkit.train.recipe.data_choices`:
        image side, epochs, batch, object queries); for a recipe without a pixel budget (a paper's), the image side
        only, when the data's is smaller than the model's (`paper_side_choice`)."""
        task, model = self._task_and_model()
        if task == CLASSIFICATION:
            return []
        recipe = recipe_for(task, model, self.init)
        model_config = replace_config(model_entry(model).config, **self.model_args) if model is not None else None
        data, version = absolute_data(self.data), _data_version(self.data)
        masks = self._masks_choice(model_config, data, version)
        if recipe.pixel_budget is None:  # a paper's recipe: only a side smaller than the model's, for small images
            if self.img_size is not None or model_config is None:
                return masks
            stats = training_stats(data, version, self.tile_side)
            return paper_side_choice(stats, min(to_2tuple(model_config.img_size))) + masks
        from_scratch = self.init is None
        choices, tile = [], self.tile_side
        if self.tile is None and not data.startswith(BUILTIN_PREFIX):  # 0: whole images, as asked
            picked = tile_choice(training_stats(data, version))
            if picked is not None:
                choices, tile = [picked], picked.value
        stats = training_stats(data, version, tile)
        samples = "training image" if tile is None else "training tile"
        scratch = from_scratch and model_config is not None
        choices += data_choices(stats, recipe, model_config, scratch, self.img_size, samples)
        given = {"epochs": self.epochs, "batch_size": self.batch_size}
        given["num_queries"] = self.model_args.get("num_queries")
        return [c for c in choices + masks if given.get(c.field) is None]

    def _masks_choice(self, model_config: Any, data: str, version: float) -> list[DataChoice]:
        """The mask head, turned on when every training annotation has a segmentation and the model has one to turn
        on (a `masks` field) that neither `model_args` nor a model directory set."""
        if model_config is None or not hasattr(model_config, "masks") or "masks" in self.model_args:
            return []
        if model_config.masks or not training_stats(data, version).masks:
            return []
        try:  # a model whose mask head cannot be built at its size (DETR's needs widths that GroupNorm divides)
            dataclasses.replace(model_config, masks=True)
        except ValueError as err:
            why = f"the annotations have segmentations, but this model's mask head cannot be built ({err}): boxes only"
            return [DataChoice("masks", False, why)]
        why = (
            "every training annotation has a segmentation: the mask head (pred_masks) trains beside the boxes "
            "(boxes only, in shorter steps: --model-arg masks=false)"
        )
        return [DataChoice("masks", True, why)]

    def minimal(self) -> TrainConfig:
        """The same run with the options that resolution would fill in with the same values left unset (a resumed
        run's saved settings hold every resolved value): what `command` of a hint shows."""
        target = self.resolved()
        optional = [f.name for f in dataclasses.fields(self) if f.default is None and f.name != "init"]
        bare = dataclasses.replace(self, **dict.fromkeys(optional))
        try:
            same_model = bare.resolved().model == target.model
        except ValueError:  # the model arguments given fit their model only, not the one the data would choose
            same_model = False
        if not same_model:  # the model first: its recipe fills the rest
            bare = dataclasses.replace(bare, model=self.model)
        filled = bare.resolved()
        keep = {k: getattr(self, k) for k in optional if getattr(filled, k) != getattr(target, k) and k not in DERIVED}
        if any(getattr(filled, k) != getattr(target, k) for k in DERIVED):  # filled from the options kept?
            filled = dataclasses.replace(bare, **keep).resolved()
            keep.update({k: getattr(self, k) for k in DERIVED if getattr(filled, k) != getattr(target, k)})
        if keep.get("device") == resolve_device(None):  # a resumed run's saved device: what this machine picks anyway
            del keep["device"]
        minimal = dataclasses.replace(bare, **keep)
        chosen = {k: v for k, v in self.model_args.items() if k in MODEL_CHOICES}  # masks, queries: the data's?
        if not chosen:
            return minimal
        own = {k: v for k, v in self.model_args.items() if k not in MODEL_CHOICES}
        refilled = dataclasses.replace(minimal, model_args=own).resolved().model_args
        given = {k: v for k, v in chosen.items() if refilled.get(k) != v}  # what the data would not choose
        return dataclasses.replace(minimal, model_args={**own, **given})

    def fresh(self) -> TrainConfig:
        """`minimal()` for a hint that trains this configuration afresh where it continues the run saved in its `out`
        (`for_resume`): on the same data, `minimal()`; on other data, the options that run was given (its own
        `minimal()`: what resolution on its data did not fill in) with the fields set here, so that the choices its
        data made (`data_choices`: image size, batch size, tiles, queries, masks) are made again for the new data.
        When the run's data can no longer be read, those choices are dropped whoever made them."""
        try:
            saved = TrainConfig.load(self.out)
        except (OSError, ValueError):
            return self.minimal()
        if absolute_data(saved.data) == absolute_data(self.data):
            return self.minimal()
        given = getattr(self, "_given", frozenset())  # typed, even where equal to the saved value (`for_resume`)
        changed = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name in given or getattr(self, f.name) != getattr(saved, f.name)
        }
        try:
            base = saved.minimal()
        except (OSError, ValueError):  # its data is gone
            kept = {k: v for k, v in saved.model_args.items() if k not in MODEL_CHOICES}
            base = dataclasses.replace(saved, tile=None, img_size=None, batch_size=None, model_args=kept)
        return dataclasses.replace(base, **changed).minimal()

    def command(self, *extra: str) -> str:
        """The `vitkit train` command line of this configuration (every option that differs from its default),
        followed by `extra` (e.g. "--force"): what hints print, ready to paste into a shell."""
        defaults = TrainConfig()
        words = ["vitkit", "train"]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "out" or value == getattr(defaults, f.name):
                continue
            flag = option_flag(f)
            if isinstance(value, bool):
                words.append(flag)
            elif isinstance(value, dict):
                for key, item in value.items():
                    words += [flag, f"{key}={_assigned_word(item)}"]
            else:
                words += [flag, str(value)]
        words += ["--out", self.out, *extra]
        return shlex.join(words)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def save(self, directory: str | os.PathLike) -> Path:
        """Write config.json into `directory`; returns its path."""
        path = Path(directory) / CONFIG_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> TrainConfig:
        """The configuration an earlier run saved in `directory`/config.json."""
        path = Path(directory) / CONFIG_NAME
        values = read_json(path)
        if is_model_config(values):
            raise ValueError(model_folder_words(Path(directory)))
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{path}: unknown training option(s) {unknown}")
        if "tile" not in values and values.get("detection_loss") is not None:  # a detector's, from before tiles:
            values["tile"] = 0  # it trained on whole images, whatever the recipe would pick now
        return cls(**values)

    @classmethod
    def for_resume(cls, out: str | os.PathLike = DEFAULT_OUT, **changes: Any) -> TrainConfig:
        """The configuration that continues the run in `out`: its config.json with the fields in `changes`
        replaced, or, when `out` holds no config.json yet, a new configuration of `changes`. This is what
        `vitkit train --out OUT --resume [options]` trains: pass it to `fit(config, resume=True)`.

        Args:
            out: the run's output folder.
            changes: fields to set; a resumed run refuses any but `vitkit.train.resume.RESUME_MAY_CHANGE` that
                differ from the checkpoint's.
        """
        if (Path(out) / CONFIG_NAME).is_file():
            config = dataclasses.replace(cls.load(out), out=os.fspath(out), **changes)
        elif (saved := checkpoint_config(Path(out))) is not None:  # config.json lost: the checkpoint's copy
            config = dataclasses.replace(cls(**saved), out=os.fspath(out), **changes)
        else:
            config = cls(out=os.fspath(out), **changes)
        object.__setattr__(config, "_given", frozenset(changes))  # for `fresh`: what was given, not only changed
        return config


def is_model_config(values: dict[str, Any]) -> bool:
    """Whether a config.json's `values` are a saved model's (`vitkit.save_pretrained`: its family and config), not a
    training run's."""
    return "family" in values and "config" in values


def model_folder_words(out: Path, init: str = "the run's init") -> str:
    """Why `out`, a saved model's folder (a run's best/ or final/), is no run's output folder, and where to go
    (`init`: how the message names the option that starts a run from its weights)."""
    run = out.parent
    above = f" The run that wrote it is {run}." if (run / CONFIG_NAME).is_file() else ""
    return (
        f"{out} holds a saved model (its config.json names the model's family), not a training run: a run there "
        f"would write its own config.json over the model's.{above} Train into a folder of its own; to start from "
        f"this model's weights, pass it as {init}"
    )


def checkpoint_config(out: Path) -> dict[str, Any] | None:
    """The settings the run in `out` saved with its checkpoint (checkpoint.pt, or a sharded checkpoint's trainer
    state): what resumes it where its config.json was lost; None where there is none, or it cannot be read."""
    from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint
    from vitkit.train.sharding import load_trainer_state, sharded_checkpoint

    try:
        if (folder := sharded_checkpoint(out)) is not None:
            return json.loads(load_trainer_state(folder)["config"])
        if (out / CHECKPOINT_NAME).is_file():
            return json.loads(load_checkpoint(out / CHECKPOINT_NAME)["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


MODEL_CHOICES = ("num_queries", "masks")  # data choices that are model fields (`model_args`), not run options


def _check_detection_loss(loss: str | None, model: str | None, init: str | None) -> None:
    """ValueError when the softmax cross-entropy ("ce", which needs a "no object" logit) is asked of a detector
    without one (`vitkit.models.interface.has_no_object_logit`): the registry model `model`, or the one saved in the
    directory `init`."""
    if loss != "ce":
        return
    fam = family(model_entry(model).family) if model is not None else saved_family(local_source(init)) if init else None
    if fam is None or has_no_object_logit(fam.model_cls):
        return
    what = f"model {model!r}" if model is not None else f"the model in {init}"
    raise ValueError(
        f"detection_loss 'ce' is a softmax over the classes and 'no object', but {what} ({fam.display_name}) "
        "predicts K sigmoid class logits without a 'no object' logit: train it with detection_loss 'focal'"
    )


def _assigned_word(value: Any) -> str:
    """A value as `--model-arg KEY=VALUE` reads it back (`vitkit.cli.options.parse_assignment`): JSON without
    spaces (tuples as lists), a string bare unless it would read as JSON or as True / False / None."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value if value not in ("True", "False", "None") else json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


@functools.lru_cache(maxsize=4)
def training_stats(data: str, version: float, tile: int | None = None) -> DetectionStats:
    """The `vitkit.data.DetectionStats` of the training split of detection data `data` (read once per `version`,
    the annotations' modification time), as its training tiles see it with `tile` (`vitkit.data.tiles.tiled_stats`)."""
    train, _, _ = load_detection(data)
    stats = detection_stats(train)
    return stats if tile is None else tiled_stats(stats, train, tile)


def _data_version(data: str) -> float:
    """The newest modification time of a COCO folder's annotation files (0 for builtin data)."""
    if data.startswith(BUILTIN_PREFIX):
        return 0.0
    times = [p.stat().st_mtime for p in Path(data).glob("*/*.json")]  # annotations/*.json, or train*/ and val*/
    return max(times, default=0.0)


def absolute_data(data: str) -> str:
    """A `data` value with a folder path made absolute (builtin:NAME unchanged)."""
    return data if data.startswith(BUILTIN_PREFIX) else os.path.abspath(data)
