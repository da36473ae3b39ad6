"""Looking at models: attention maps and rollout, overlays on images, evaluation and cost plots."""

from vitkit.viz.attention import (
    attention_map,
    attention_overlay,
    attention_rollout,
    cls_attention,
    colorize,
    model_view,
    overlay,
)
from vitkit.viz.plots import confusion_image, plot_scaling

__all__ = [
    "attention_map",
    "attention_overlay",
    "attention_rollout",
    "cls_attention",
    "colorize",
    "confusion_image",
    "model_view",
    "overlay",
    "plot_scaling",
]
