"""Looking at models: attention maps and rollout, overlays on images, a detector's boxes and the attention of each
detection, evaluation and cost plots."""

from vitkit.viz.attention import (
    attention_map,
    attention_overlay,
    attention_rollout,
    cls_attention,
    colorize,
    model_view,
    overlay,
)
from vitkit.viz.curves import write_curves
from vitkit.viz.detection import draw_detections, enlarge, object_attention_figure
from vitkit.viz.plots import confusion_image, plot_scaling

__all__ = [
    "attention_map",
    "attention_overlay",
    "attention_rollout",
    "cls_attention",
    "colorize",
    "confusion_image",
    "draw_detections",
    "enlarge",
    "model_view",
    "object_attention_figure",
    "overlay",
    "plot_scaling",
    "write_curves",
]
