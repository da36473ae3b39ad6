"""`vitkit eval`: a trained classifier's accuracy and loss on held-out data (per class, with a confusion matrix), or
a trained detector's COCO mAP (per class, with a precision-recall curve per class, and the score threshold of the
best F1)."""

from __future__ import annotations

import argparse
import json
import sys

from vitkit.cli.options import add_precision_option, add_tile_options, run_precision, set_max_pixels, tiling
from vitkit.data import Unreadable, summarize_unreadable
from vitkit.detection import COCO_METRICS
from vitkit.detection.coco_eval import SEGM_PREFIX
from vitkit.infer import (
    evaluate_detector_dir,
    evaluate_model_dir,
    is_detector_dir,
    missing_info_note,
    run_config,
)
from vitkit.train.recipe import is_detection_data
from vitkit.viz.attention import check_keeps_inputs, check_picture_path, picture_formats, save_picture
from vitkit.viz.plots import confusion_figure, pr_curves_figure
from vitkit.weights import read_model_info

RARE_BOXES = 10  # a class with fewer ground-truth boxes than this is marked in the per-class table
CLASSIFIER_BATCH, DETECTOR_BATCH = 256, 8  # images per batch when neither --batch-size nor the run says
HELP = (
    "evaluate a trained or converted model: loss, top-1 / top-5 and per-class accuracy, or a detector's mAP and its "
    "AP per class"
)


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-dir",
        required=True,
        metavar="DIR",
        help="a model directory: written by vitkit train (e.g. runs/train/final), save_pretrained or vitkit convert "
        "(then --data is needed)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="builtin:NAME, a train/val folder (val/ is used) or a folder of class folders (all of it), for a "
        "detector a COCO-format folder (its val split); default: the held-out part of the training data",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"images per batch (default: {CLASSIFIER_BATCH}; a detector: the batch size of the run that wrote it, as "
        f"it was validated, else {DETECTOR_BATCH}: padding within a batch moves a detector's outputs near the borders)",
    )
    add_precision_option(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--workers", type=int, default=0, help="data loader worker processes")
    parser.add_argument(
        "--plot",
        metavar="PNG",
        default=None,
        help="write a classifier's confusion matrix, or a detector's precision-recall curve per class, to this "
        f"picture ({picture_formats(figure=True)}); folders are made",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_tile_options(parser)


def _note(args: argparse.Namespace) -> None:
    note = missing_info_note(args.model_dir, args.data)
    if note:
        print(f"vitkit eval: note: {note}", file=sys.stderr)


def _skipped(skipped: tuple[Unreadable, ...]) -> None:
    if skipped:
        print(summarize_unreadable(skipped), file=sys.stderr)


def _run_detector(args: argparse.Namespace) -> int:
    if args.plot:  # before the evaluation, not after it
        check_picture_path(args.plot, figure=True)
        check_keeps_inputs(args.plot, [p for p in (args.data, args.model_dir) if p], "--plot")
    run = run_config(args.model_dir)
    batch = args.batch_size if args.batch_size is not None else run.get("batch_size") or DETECTOR_BATCH
    saved = read_model_info(args.model_dir).tile
    tile, overlap = tiling(args, saved)
    precision = run_precision(args, batch=batch if tile is None else 1)  # tiles are read one at a time
    if tile is not None:
        mine = " (the model's)" if args.tile is None else ""
        print(f"vitkit eval: whole images in tiles of {tile} px{mine}, sharing {overlap:g} of a side", file=sys.stderr)
    validated = run.get("batch_size")
    if tile is None and validated is not None and batch != validated:  # tiles are read one at a time
        print(
            f"vitkit eval: note: batches of {batch} images, where the run validated in batches of {validated}: "
            "padding within a batch moves a detector's outputs, so AP may differ from the run's (leave out "
            "--batch-size to evaluate as it validated)",
            file=sys.stderr,
        )
    result, _ = evaluate_detector_dir(
        args.model_dir, args.data, batch, args.device, args.workers, precision, tile or 0, overlap
    )
    _note(args)
    values = result.to_dict()
    if args.json:
        print(json.dumps(values, indent=2))
    else:
        metrics = "  ".join(f"{k} {'-' if values[k] is None else f'{values[k]:.4f}'}" for k in COCO_METRICS)
        print(f"images {result.count}  {metrics}")
        if SEGM_PREFIX + COCO_METRICS[0] in values:  # the masks, scored as the boxes
            masks = "  ".join(
                f"{k} {'-' if values[SEGM_PREFIX + k] is None else f'{values[SEGM_PREFIX + k]:.4f}'}"
                for k in COCO_METRICS
            )
            print(f"masks       {masks}")
        for line in per_class_lines(values["per_class"]):
            print(line)
        if result.threshold is not None:
            print(f"best F1 at IoU 0.5 above score {result.threshold:.2f}")
    _skipped(result.skipped)
    if args.plot:
        plot = save_picture(
            pr_curves_figure(result.recall, result.precision, result.classes, result.per_class), args.plot
        )
        print(f"precision-recall curves written to {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def per_class_lines(rows: list[dict]) -> list[str]:
    """A detector's per-class table: class, ground-truth boxes, AP, AP50, AP_small ("-" where there is nothing to
    score), the classes with fewer than 10 boxes marked: their AP is a few boxes' luck."""
    width = max([len("class"), *(len(r["class"]) for r in rows)])
    lines = [f"  {'class':<{width}}  {'boxes':>6}  {'AP':>6}  {'AP50':>6}  {'AP_small':>8}"]
    for r in rows:
        columns = (("ap", 6), ("ap50", 6), ("ap_small", 8))
        cells = [("-" if r[k] is None else f"{r[k]:.4f}").rjust(w) for k, w in columns]
        rare = "  (few boxes)" if 0 < r["boxes"] < RARE_BOXES else ""
        lines.append(f"  {r['class']:<{width}}  {r['boxes']:>6}  {'  '.join(cells)}{rare}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.batch_size is not None and args.batch_size < 1:  # 0 is not "the default"
        raise ValueError(f"batch_size must be positive, got {args.batch_size} (--batch-size)")
    if is_detector_dir(args.model_dir):
        return _run_detector(args)
    if args.tile is not None or args.overlap is not None:
        raise ValueError(f"--tile and --overlap apply to a detector; {args.model_dir} holds a classifier")
    if args.data is not None and is_detection_data(args.data):  # before its layout is read as class folders
        raise ValueError(
            f"{args.model_dir} holds a classifier, and {args.data} is detection data (boxes, not class folders): "
            "evaluate a detector on it, or this classifier on a folder of class folders"
        )
    set_max_pixels(args)
    if args.plot:  # before the evaluation, not after it
        check_picture_path(args.plot, figure=True)
        check_keeps_inputs(args.plot, [p for p in (args.data, args.model_dir) if p], "--plot")
    batch = args.batch_size if args.batch_size is not None else CLASSIFIER_BATCH
    precision = run_precision(args, batch=batch)
    result, info = evaluate_model_dir(args.model_dir, args.data, batch, args.device, args.workers, precision)
    _note(args)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        top5 = f"  top-5 {result.top5:.4f}" if result.top5 is not None else ""  # only with more than 5 classes
        print(f"images {result.count}  loss {result.loss:.4f}  top-1 {result.top1:.4f}{top5}")
        per_class = result.class_accuracies()
        width = max(len(name) for name in per_class)
        for name, acc in per_class.items():
            print(f"  {name:<{width}}  {'-' if acc is None else f'{acc:.4f}'}")
    _skipped(result.skipped)
    if args.plot:
        plot = save_picture(confusion_figure(result.confusion, info.classes), args.plot)
        print(f"confusion matrix written to {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0
