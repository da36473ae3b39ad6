"""vitkit models: the registry and one module per family (importing a family registers its variants)."""

from vitkit.models import vit
from vitkit.models.registry import create_model, list_models, model_entry
from vitkit.models.vit import VisionTransformer, ViTConfig

__all__ = ["VisionTransformer", "ViTConfig", "create_model", "list_models", "model_entry", "vit"]
