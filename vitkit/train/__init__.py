"""Training, evaluation and prediction: `fit(TrainConfig(...))` is what `vitkit train` runs."""

from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from vitkit.train.config import DEFAULT_MODEL, DEFAULT_MODEL_ARGS, TrainConfig
from vitkit.train.ema import ModelEma
from vitkit.train.evaluate import EvalResult, evaluate, evaluate_model_dir, predict
from vitkit.train.loop import METRICS_NAME, FitResult, build_training_model, fit, forward_loss
from vitkit.train.model import enable_grad_checkpointing, load_for_finetune
from vitkit.train.optim import create_optimizer, param_groups, warmup_cosine

__all__ = [
    "CHECKPOINT_NAME",
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_ARGS",
    "METRICS_NAME",
    "EvalResult",
    "FitResult",
    "ModelEma",
    "TrainConfig",
    "build_training_model",
    "create_optimizer",
    "enable_grad_checkpointing",
    "evaluate",
    "evaluate_model_dir",
    "fit",
    "forward_loss",
    "load_checkpoint",
    "load_for_finetune",
    "param_groups",
    "predict",
    "save_checkpoint",
    "warmup_cosine",
]
