"""Model weights: vitkit's own directories, and converters from and to other libraries' layouts
(timm, torchvision, Hugging Face transformers, facebookresearch/detr)."""

from vitkit.weights.convert import (
    LoadReport,
    convert,
    export_weights,
    from_pretrained,
    load_pretrained,
    load_weights,
    read_model_info,
)
from vitkit.weights.io import CheckpointMismatch, ModelInfo, model_info, save_pretrained

__all__ = [
    "CheckpointMismatch",
    "LoadReport",
    "ModelInfo",
    "convert",
    "export_weights",
    "from_pretrained",
    "load_pretrained",
    "load_weights",
    "model_info",
    "read_model_info",
    "save_pretrained",
]
