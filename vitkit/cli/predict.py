"""`vitkit predict`: the most probable classes of images under a trained model."""

from __future__ import annotations

import argparse
import json

from vitkit.data import DataInfo, open_image
from vitkit.train import predict
from vitkit.train.distributed import resolve_device
from vitkit.weights.io import from_pretrained

HELP = "classify images with a model written by 'vitkit train' (top-k classes with probabilities)"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, metavar="DIR", help="a model directory (e.g. runs/train/final)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--top-k", type=int, default=5, help="how many classes to show per image (default: 5)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")


def run(args: argparse.Namespace) -> int:
    model = from_pretrained(args.model_dir).to(resolve_device(args.device))
    info = DataInfo.load(args.model_dir)
    images = [open_image(path) for path in args.images]
    results = predict(model, info, images, args.top_k)
    if args.json:
        rows = [
            {"image": path, "top": [{"class": name, "probability": p} for name, p in top]}
            for path, top in zip(args.images, results, strict=True)
        ]
        print(json.dumps(rows, indent=2))
        return 0
    for path, top in zip(args.images, results, strict=True):
        print(path)
        width = max(len(name) for name, _ in top)
        for name, p in top:
            print(f"  {name:<{width}}  {p:.4f}")
    return 0
