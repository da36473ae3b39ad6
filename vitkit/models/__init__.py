"""vitkit models: the registry and one module per family. Every module of this package is imported here, and a
family's module registers its family and variants, so a new family needs no line outside its own file."""

import importlib as _importlib
import pkgutil as _pkgutil

for _module in _pkgutil.iter_modules(__path__):
    _importlib.import_module(f"{__name__}.{_module.name}")

from vitkit.models.botnet import BotNet, BotNetConfig  # noqa: E402
from vitkit.models.deformable_detr import DeformableDETR, DeformableDetrConfig  # noqa: E402
from vitkit.models.detr import DETR, DetrConfig  # noqa: E402
from vitkit.models.registry import create_model, list_models, model_entry  # noqa: E402
from vitkit.models.swin import SwinConfig, SwinTransformer  # noqa: E402
from vitkit.models.vit import VisionTransformer, ViTConfig  # noqa: E402

__all__ = [
    "BotNet",
    "BotNetConfig",
    "DETR",
    "DeformableDETR",
    "DeformableDetrConfig",
    "DetrConfig",
    "SwinConfig",
    "SwinTransformer",
    "VisionTransformer",
    "ViTConfig",
    "create_model",
    "list_models",
    "model_entry",
]
