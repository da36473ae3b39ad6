"""`vitkit export --model-dir DIR --format onnx|torchscript --out FILE`: a saved model as one file for inference (a
DETR's file takes images and pixel_mask and returns pred_logits and pred_boxes; see `vitkit.perf.export`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitkit.cli.options import add_out_option, out_path, parse_size
from vitkit.perf.export import FORMATS, export_model
from vitkit.viz.attention import check_writable
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
        "--atol",
        type=float,
        default=1e-4,
        help="largest output difference from PyTorch allowed: absolute for outputs up to 1, relative to the largest "
        "value above (default 1e-4)",
    )
    add_out_option(parser, "FILE", "the file to write, e.g. model.onnx or model.pt")


SUFFIXES = {"onnx": (".onnx",), "torchscript": (".pt", ".pth", ".ts", ".torchscript")}  # each format's file names
FORMAT_NAMES = {"onnx": "an ONNX", "torchscript": "a TorchScript"}  # as a message says them


def check_out(out: str, format: str) -> Path:
    """The --out file, checked before any work: a suffix of its format (an ONNX file named .pt would be read as
    TorchScript), in a folder that can be written."""
    path = Path(out)
    suffixes, named = SUFFIXES[format], FORMAT_NAMES[format]
    if path.is_dir():
        example = path / f"model{suffixes[0]}"
        raise ValueError(f"--out {out} is a folder; --format {format} writes one file: name it, e.g. {example}")
    if path.suffix.lower() not in suffixes:
        other = next((f for f, s in SUFFIXES.items() if path.suffix.lower() in s), None)
        said = f"{FORMAT_NAMES[other]} file's suffix" if other else f"not {named} suffix"
        said = said if path.suffix else "no suffix"
        raise ValueError(
            f"--out {out} ends in {path.suffix or 'nothing'} ({said}); --format {format} writes {named} file: "
            f"name it {path.with_suffix(suffixes[0])}"
        )
    return check_writable(path)


def run(args: argparse.Namespace) -> int:
    out = check_out(out_path(args), args.format)
    existed = out.is_file()
    model = from_pretrained(args.model_dir)
    report = export_model(model, out, args.format, img_size=args.img_size, atol=args.atol)
    print(report.summary())
    if existed:
        print(f"vitkit export: note: replaced the file that was at {out}", file=sys.stderr)
    return 0
