"""Model weights: vitkit's own directories, and converters from and to other libraries' layouts
(timm, torchvision, Hugging Face transformers, facebookresearch/detr, ...).

Each family declares its weights in `vitkit.weights.<family>` (a `FamilyWeights` named `WEIGHTS`): its rename tables
per format, export checks, shape reader and Hugging Face config translations. The other modules are generic: io
(files, vitkit directories and what they hold beside the config: `ModelInfo`), errors (what a caller can fix, with
its facts), rename (the `Layout` tables), shapes (what tensor shapes say about a config), hf (transformers' shared
conventions), timm_repo (timm's model directories), convert (load, detect, check, export), hub (downloads from the
Hugging Face Hub and torch.hub, their caches and failures), pretrained (registered models with their published
weights).

A model is loaded by `from_pretrained` (a directory, a Hub repository "hf-hub:ORG/REPO", or a file whose format
builds its model), built with its published weights by `vitkit.create_model(name, pretrained=True)`, or built by
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
from vitkit.weights.hub import DamagedDownload, HubRepositoryError, NotCached
from vitkit.weights.io import ModelInfo, model_info, save_pretrained
from vitkit.weights.pretrained import download_mb

__all__ = [
    "CheckpointMismatch",
    "DamagedDownload",
    "FamilyWeights",
    "FieldsNeeded",
    "HubRepositoryError",
    "LayoutMismatch",
    "LoadReport",
    "ModelInfo",
    "ModelNeeded",
    "ModelNotNeeded",
    "NotCached",
    "convert",
    "download_mb",
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
