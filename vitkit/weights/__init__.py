"""Model weights: vitkit's own directories (and, later, converters from other libraries' formats)."""

from vitkit.weights.io import from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained"]
