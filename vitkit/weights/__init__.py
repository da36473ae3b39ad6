"""Model weights: vitkit's own directories, and converters from and to other libraries' layouts
(timm, torchvision, Hugging Face transformers, facebookresearch/detr).

Each family declares its weights in one file, `vitkit.weights.<family>` (a `FamilyWeights` named `WEIGHTS`): its
rename tables per format, export checks, shape reader and Hugging Face config translations. The other modules are
generic: io (files, vitkit directories), rename (the `Layout` tables), shapes (what tensor shapes say about a
config), hf (transformers' shared conventions), convert (load, detect, check, export).
"""

from vitkit.weights.convert import (
    LoadReport,
    convert,
    export_weights,
    formats,
    from_pretrained,
    load_pretrained,
    load_weights,
    model_from_file,
    read_model_info,
    saved_config,
)
from vitkit.weights.family import FamilyWeights
from vitkit.weights.io import CheckpointMismatch, ModelInfo, model_info, save_pretrained

__all__ = [
    "CheckpointMismatch",
    "FamilyWeights",
    "LoadReport",
    "ModelInfo",
    "convert",
    "export_weights",
    "formats",
    "from_pretrained",
    "load_pretrained",
    "load_weights",
    "model_from_file",
    "model_info",
    "read_model_info",
    "save_pretrained",
    "saved_config",
]
