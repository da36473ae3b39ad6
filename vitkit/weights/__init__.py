"""Model weights: vitkit's own directories, and converters from and to other libraries' layouts
(timm, torchvision, Hugging Face transformers, facebookresearch/detr)."""

from vitkit.weights.convert import LoadReport, convert, export_weights, from_pretrained, load_pretrained, load_weights
from vitkit.weights.io import save_pretrained

__all__ = [
    "LoadReport",
    "convert",
    "export_weights",
    "from_pretrained",
    "load_pretrained",
    "load_weights",
    "save_pretrained",
]
