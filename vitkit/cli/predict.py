"""`vitkit predict`: the most probable classes of images under a trained model."""

from __future__ import annotations

import argparse
import json

from vitkit.data import DataInfo
from vitkit.train import predict_files
from vitkit.train.distributed import resolve_device
from vitkit.weights import from_pretrained

HELP = "classify images with a model written by 'vitkit train' (top-k classes with probabilities)"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, metavar="DIR", help="a model directory (e.g. runs/train/final)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--top-k", type=int, default=5, help="how many classes to show per image (default: 5)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")


def run(args: argparse.Namespace) -> int:
    model = from_pretrained(args.model_dir).to(resolve_device(args.device))
    results = predict_files(model, DataInfo.load(args.model_dir), args.images, args.top_k)
    if args.json:
        print(json.dumps([result.to_dict() for result in results], indent=2))
        return 0
    for result in results:
        print(result.image)
        width = max(len(name) for name, _ in result.top)
        for name, p in result.top:
            print(f"  {name:<{width}}  {p:.4f}")
    return 0
