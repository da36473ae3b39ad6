"""`vitkit attention`: where a trained model looks in an image, as a figure (the image beside its attention map, a
colour bar, a title with the prediction); for a detector, each detection beside its query's cross-attention (the
DETR paper's figure 6), or for a deformable one the points its query sampled on every level, sized by their
attention weights (the Deformable DETR paper's figure 5). For a model with registers, the attention that goes to the
registers (and the class token) is written under each map and printed as a table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitkit.cli.options import (
    add_memory_option,
    add_threshold_option,
    check_inference_memory,
    note_dim_images,
    note_tiled_model,
)
from vitkit.data import open_image
from vitkit.infer import (
    attention_figure,
    detection_attention_figure,
    detection_reading,
    inference_info,
    is_detector_dir,
    missing_info_note,
    resolve_device,
)
from vitkit.infer.attention import prefix_table
from vitkit.viz.attention import check_keeps_inputs, check_picture_path, picture_formats, save_picture
from vitkit.weights import from_pretrained

HELP = (
    "draw where a trained model looks in an image: the class token's attention of one layer (one head, their mean, "
    "each head), of every layer and head (--grid) or attention rollout, and for a model with registers the "
    "attention that goes to them; for a detector, the last decoder layer's "
    "cross-attention of each detected object (a deformable detector's: the points it sampled, sized by weight)"
)


def _head(text: str) -> int | str:
    if text in ("mean", "all"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a head index, 'mean' or 'all', got {text!r}") from None


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, metavar="DIR", help="a model directory (e.g. runs/train/final)")
    parser.add_argument("image", metavar="IMAGE", help="an image file")
    parser.add_argument(
        "--out",
        required=True,
        metavar="PNG",
        help=f"where to write the figure ({picture_formats(figure=True)}); folders are made",
    )
    parser.add_argument(
        "--layer",
        type=int,
        default=None,
        help="attention layer index, negative from the end; a detector's decoder layer (default: the last)",
    )
    parser.add_argument(
        "--head",
        type=_head,
        default=None,
        metavar="H|mean|all",
        help="one head, the mean of the heads (default) or all: one map per head; a deformable detector's figure "
        "shows every head's points by default",
    )
    parser.add_argument(
        "--rollout", action="store_true", help="attention rollout across all layers (Abnar & Zuidema), heads averaged"
    )
    parser.add_argument("--grid", action="store_true", help="one map per layer (rows) and head (columns)")
    add_threshold_option(parser)
    parser.add_argument("--alpha", type=float, default=0.5, help="weight of the heat map in the blend (default: 0.5)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    add_memory_option(parser)


def _note(note: str | None) -> None:
    if note:
        print(f"vitkit attention: note: {note}", file=sys.stderr)


def _run_detector(args: argparse.Namespace) -> int:
    if args.rollout:
        raise ValueError("--rollout follows a class token through the layers; a detector's figure shows each object")
    if args.grid:
        raise ValueError("--grid draws a classifier's layers and heads; a detector's figure shows each object")
    if args.head == "all":
        raise ValueError("--head all draws a classifier's heads; for a detector pick one head or the mean")
    head = None if args.head in (None, "mean") else args.head
    layer = -1 if args.layer is None else args.layer
    model = from_pretrained(args.model_dir).to(resolve_device(args.device))
    info = inference_info(model)
    postprocessing = detection_reading(model, args.model_dir).one_per_query()  # one box per object, with its best class
    threshold = postprocessing.shown_above(args.threshold)
    check_inference_memory(model, args, capture=True)
    _note(missing_info_note(args.model_dir))
    image = open_image(args.image)
    note_tiled_model("attention", info.tile, [(Path(args.image).name, image)])
    figure, detections, what = detection_attention_figure(
        model, info, image, threshold, postprocessing, layer, head, args.alpha, args.model_dir
    )
    print(what)  # the layer, the heads and the objects, as the figure's title says
    for d in detections:
        print(f"  {d.label}  {d.score:.4f}")
    print(f"figure written to {save_picture(figure, args.out)}")
    return 0


def run(args: argparse.Namespace) -> int:
    check_picture_path(args.out, figure=True)  # before loading and running the model
    check_keeps_inputs(args.out, [args.image, args.model_dir], "--out")
    note_dim_images("attention", [args.image])
    if is_detector_dir(args.model_dir):
        return _run_detector(args)
    if args.threshold is not None:
        raise ValueError(f"--threshold is a detector's smallest class probability; {args.model_dir} holds a classifier")
    model = from_pretrained(args.model_dir).to(resolve_device(args.device))
    info = inference_info(model)
    check_inference_memory(model, args, capture=True)
    _note(missing_info_note(args.model_dir))
    figure, maps = attention_figure(
        model,
        open_image(args.image),
        info.mean,
        info.std,
        args.layer,
        args.head,
        args.rollout,
        args.grid,
        info.classes,
        args.model_dir,
        args.alpha,
    )
    if maps.prediction is not None:
        print(f"predicted {maps.prediction[0]} ({maps.prediction[1]:.4f})")
    for line in prefix_table(maps):
        print(line)
    print(f"{maps.what} -> {save_picture(figure, args.out)}")
    return 0
