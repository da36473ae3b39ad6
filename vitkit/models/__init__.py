"""vitkit models: the registry and one module per family (importing a family registers its variants)."""

from vitkit.models import botnet, detr, swin, vit
from vitkit.models.botnet import BotNet, BotNetConfig
from vitkit.models.detr import DETR, DetrConfig
from vitkit.models.registry import create_model, list_models, model_entry
from vitkit.models.swin import SwinConfig, SwinTransformer
from vitkit.models.vit import VisionTransformer, ViTConfig

__all__ = [
    "BotNet",
    "BotNetConfig",
    "DETR",
    "DetrConfig",
    "SwinConfig",
    "SwinTransformer",
    "VisionTransformer",
    "ViTConfig",
    "create_model",
    "list_models",
    "model_entry",
    "botnet",
    "detr",
    "swin",
    "vit",
]
