"""`vitkit predict`: the most probable classes of images under a trained classifier, or a trained detector's
boxes drawn on each image and listed in JSON."""

from __future__ import annotations

import argparse
import json

from vitkit.data import DataInfo
from vitkit.train import detect_files, image_paths, is_detector_dir, load_detector, predict_files, write_detections
from vitkit.train.distributed import resolve_device
from vitkit.weights import from_pretrained

HELP = "classify images with a model written by 'vitkit train', or find objects with a detector"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, metavar="DIR", help="a model directory (e.g. runs/train/final)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files, or folders of them")
    parser.add_argument("--top-k", type=int, default=5, help="how many classes to show per image (default: 5)")
    parser.add_argument(
        "--threshold", type=float, default=0.5, help="a detector's smallest class probability kept (default: 0.5)"
    )
    parser.add_argument(
        "--out",
        default="runs/predict",
        metavar="DIR",
        help="where a detector writes each image with its boxes (PNG) and detections.json (default: runs/predict)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")


def _run_detector(args: argparse.Namespace) -> int:
    model, info, classification = load_detector(args.model_dir, args.device)
    found = detect_files(model, info, image_paths(args.images), args.threshold, classification)
    pictures, listing = write_detections(found, args.out, info.classes)
    if args.json:
        print(json.dumps([item.to_dict() for item in found], indent=2))
        return 0
    for item, picture in zip(found, pictures, strict=True):
        print(f"{item.image}: {len(item.detections)} objects -> {picture}")
        for d in item.detections:
            x0, y0, x1, y1 = d.box
            print(f"  {d.label}  {d.score:.4f}  box {x0:.1f} {y0:.1f} {x1:.1f} {y1:.1f}")
    print(f"detections written to {listing}")
    return 0


def run(args: argparse.Namespace) -> int:
    if is_detector_dir(args.model_dir):
        return _run_detector(args)
    model = from_pretrained(args.model_dir).to(resolve_device(args.device))
    results = predict_files(model, DataInfo.load(args.model_dir), image_paths(args.images), args.top_k)
    if args.json:
        print(json.dumps([result.to_dict() for result in results], indent=2))
        return 0
    for result in results:
        print(result.image)
        width = max(len(name) for name, _ in result.top)
        for name, p in result.top:
            print(f"  {name:<{width}}  {p:.4f}")
    return 0
