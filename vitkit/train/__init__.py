"""Training classifiers and detectors: `fit(TrainConfig(...))` is what `vitkit train` runs. Evaluation and
prediction of the trained models are `vitkit.infer`'s."""

from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from vitkit.train.config import TrainConfig
from vitkit.train.ema import ModelEma
from vitkit.train.loop import FitResult, build_training_model, fit
from vitkit.train.model import enable_grad_checkpointing, load_for_finetune
from vitkit.train.optim import create_optimizer, param_groups, warmup_cosine
from vitkit.train.outputs import METRICS_NAME, RunHints
from vitkit.train.recipe import DEFAULT_DETECTOR, DEFAULT_MODEL, Recipe, recipe_for, resolve_task
from vitkit.train.task import ClassificationTask, DetectionTask, Task, create_task, forward_loss

__all__ = [
    "CHECKPOINT_NAME",
    "DEFAULT_DETECTOR",
    "DEFAULT_MODEL",
    "METRICS_NAME",
    "ClassificationTask",
    "DetectionTask",
    "FitResult",
    "ModelEma",
    "Recipe",
    "RunHints",
    "Task",
    "TrainConfig",
    "build_training_model",
    "create_optimizer",
    "create_task",
    "enable_grad_checkpointing",
    "fit",
    "forward_loss",
    "load_checkpoint",
    "load_for_finetune",
    "param_groups",
    "recipe_for",
    "resolve_task",
    "save_checkpoint",
    "warmup_cosine",
]
