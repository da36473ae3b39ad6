"""Training, evaluation and prediction: `fit(TrainConfig(...))` is what `vitkit train` runs."""

from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from vitkit.train.config import DEFAULT_MODEL, TrainConfig
from vitkit.train.ema import ModelEma
from vitkit.train.evaluate import EvalResult, Prediction, evaluate, evaluate_model_dir, predict, predict_files
from vitkit.train.loop import METRICS_NAME, FitResult, build_training_model, fit, forward_loss
from vitkit.train.model import enable_grad_checkpointing, load_for_finetune
from vitkit.train.optim import create_optimizer, param_groups, warmup_cosine

__all__ = [
    "CHECKPOINT_NAME",
    "DEFAULT_MODEL",
    "METRICS_NAME",
    "EvalResult",
    "FitResult",
    "ModelEma",
    "Prediction",
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
    "predict_files",
    "save_checkpoint",
    "warmup_cosine",
]
