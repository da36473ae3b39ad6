"""`vitkit export --model-dir DIR --format onnx|torchscript --out FILE`: a saved model as one file for inference (a
DETR's file takes images and pixel_mask and returns pred_logits and pred_boxes; see `vitkit.perf.export`)."""

from __future__ import annotations

import argparse

from vitkit.cli.options import add_out_option, out_path, parse_size
from vitkit.perf.export import FORMATS, export_model
from vitkit.weights import from_pretrained

HELP = (
    "export a saved model to ONNX or TorchScript (dynamic batch; for a DETR, dynamic image size too), checked "
    "against PyTorch before it is written"
)


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, help="a model directory written by vitkit.save_pretrained")
    parser.add_argument("--format", required=True, choices=FORMATS, help="onnx (ONNX Runtime) or torchscript")
    parser.add_argument(
        "--img-size",
        type=parse_size,
        default=None,
        help="224 or HxW (default: the model's size; for a DETR of any size, the size it is exported at)",
    )
    parser.add_argument(
        "--atol", type=float, default=1e-4, help="largest output difference from PyTorch allowed (default 1e-4)"
    )
    add_out_option(parser, "FILE", "the file to write, e.g. model.onnx or model.pt")


def run(args: argparse.Namespace) -> int:
    out = out_path(args)
    model = from_pretrained(args.model_dir)
    report = export_model(model, out, args.format, img_size=args.img_size, atol=args.atol)
    print(report.summary())
    return 0
