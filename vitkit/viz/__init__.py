"""Looking at models: heat maps over images and the attention figure, a detector's boxes and the attention of each
detection, evaluation and cost plots. The attention data these draw comes from `vitkit.infer`."""

from vitkit.viz.attention import colorize, draw_attention, model_view, overlay
from vitkit.viz.curves import write_curves
from vitkit.viz.detection import draw_detections, enlarge, object_attention_figure
from vitkit.viz.plots import confusion_image, plot_scaling, pr_curves_image

__all__ = [
    "colorize",
    "confusion_image",
    "pr_curves_image",
    "draw_attention",
    "draw_detections",
    "enlarge",
    "model_view",
    "object_attention_figure",
    "overlay",
    "plot_scaling",
    "write_curves",
]
