"""`vitkit attention`: where a trained model looks in an image, as a heat map over it; for a detector, each
detection beside its query's cross-attention (the DETR paper's figure 6)."""

from __future__ import annotations

import argparse

from vitkit.data import DataInfo, open_image
from vitkit.train import detection_attention_figure, is_detector_dir, load_detector
from vitkit.train.distributed import resolve_device
from vitkit.viz import attention_overlay
from vitkit.weights import from_pretrained

HELP = (
    "draw the class token's attention (or attention rollout) of a trained model over an image; for a detector, "
    "the last decoder layer's cross-attention of each detected object"
)


def _head(text: str) -> int | None:
    if text == "mean":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a head index or 'mean', got {text!r}") from None


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, metavar="DIR", help="a model directory (e.g. runs/train/final)")
    parser.add_argument("image", metavar="IMAGE", help="an image file")
    parser.add_argument("--out", required=True, metavar="PNG", help="where to write the overlay")
    parser.add_argument(
        "--layer",
        type=int,
        default=-1,
        help="attention layer index, negative from the end; a detector's decoder layer (default: -1)",
    )
    parser.add_argument("--head", type=_head, default=None, metavar="H|mean", help="one head, or mean (default)")
    parser.add_argument("--rollout", action="store_true", help="attention rollout across all layers (Abnar & Zuidema)")
    parser.add_argument(
        "--threshold", type=float, default=0.5, help="a detector's smallest class probability shown (default: 0.5)"
    )
    parser.add_argument("--alpha", type=float, default=0.5, help="weight of the heat map in the blend (default: 0.5)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")


def _run_detector(args: argparse.Namespace) -> int:
    if args.rollout:
        raise ValueError("--rollout follows a class token through the layers; a detector's figure shows each object")
    model, info, classification = load_detector(args.model_dir, args.device)
    figure, detections = detection_attention_figure(
        model, info, open_image(args.image), args.threshold, classification, args.layer, args.head, args.alpha
    )
    figure.save(args.out)
    head = "mean of heads" if args.head is None else f"head {args.head}"
    print(
        f"{len(detections)} objects and their decoder layer {args.layer} cross-attention ({head}) written to {args.out}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if is_detector_dir(args.model_dir):
        return _run_detector(args)
    model = from_pretrained(args.model_dir).to(resolve_device(args.device))
    info = DataInfo.load(args.model_dir)
    picture = attention_overlay(
        model, open_image(args.image), info.mean, info.std, args.layer, args.head, args.rollout, args.alpha
    )
    picture.save(args.out)
    what = "attention rollout" if args.rollout else f"layer {args.layer} attention"
    print(f"{what} ({'mean of heads' if args.head is None else f'head {args.head}'}) written to {args.out}")
    return 0
