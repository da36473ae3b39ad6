"""Model weights: vitkit's own directories, and converters from and to other libraries' layouts
(timm, torchvision, Hugging Face transformers, facebookresearch/detr, ...).

Each family declares its weights in `vitkit.weights.<family>` (a `FamilyWeights` named `WEIGHTS`): its rename tables
per format, export checks, shape reader and Hugging Face config translations. The other modules are generic: io
(files, vitkit directories and what they hold beside the config: `ModelInfo`), errors (what a caller can fix, with
its facts), rename (the `Layout` tables), shapes (what tensor shapes say about a config), hf (transformers' shared
conventions), convert (load, detect, check, export).

A model is loaded by `from_pretrained` (a directory, or a file whose format builds its model) or built by
`vitkit.create_model` and filled by `load_weights` (any checkpoint file).
"""

from vitkit.weights.convert import (
    LoadReport,
    convert,
    export_weights,
    formats,
    from_pretrained,
    load_report,
    load_weights,
    read_model_info,
    saved_config,
)
from vitkit.weights.errors import CheckpointMismatch, FieldsNeeded, LayoutMismatch, ModelNeeded, ModelNotNeeded
from vitkit.weights.family import FamilyWeights
from vitkit.weights.io import ModelInfo, model_info, save_pretrained

__all__ = [
    "CheckpointMismatch",
    "FamilyWeights",
    "FieldsNeeded",
    "LayoutMismatch",
    "LoadReport",
    "ModelInfo",
    "ModelNeeded",
    "ModelNotNeeded",
    "convert",
    "export_weights",
    "formats",
    "from_pretrained",
    "load_report",
    "load_weights",
    "model_info",
    "read_model_info",
    "save_pretrained",
    "saved_config",
]
