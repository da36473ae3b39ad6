"""`vitkit predict`: the most probable classes of images under a classifier, as a table, CSV or JSON; or a detector's
boxes drawn on each image and listed in JSON.

Images are files, folders (searched at any depth) and glob patterns. stdout holds the results (a table, or JSON
with `--json` and no file); warnings, the list of unreadable files and notes go to stderr. The exit status is 0
when at least one image was read, 1 when none could be, 2 for a mistake in the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torch import nn
from tqdm import tqdm

from vitkit.cli.options import (
    add_memory_option,
    add_model_source,
    add_precision_option,
    add_threshold_option,
    add_tile_options,
    check_image_sizes,
    check_inference_memory,
    check_model_source,
    load_source,
    note_dim_images,
    run_precision,
    set_max_pixels,
    source_is_detector,
    tiling,
)
from vitkit.data import Unreadable, summarize_unreadable
from vitkit.data.sources import IMAGE_EXTENSIONS
from vitkit.infer import (
    crop_note,
    detect_paths,
    detection_reading,
    format_predictions,
    image_paths,
    inference_info,
    missing_info_note,
    picture_paths,
    predict_paths,
    resolve_device,
    write_detections,
    write_json,
    write_predictions_csv,
)
from vitkit.layers import to_2tuple
from vitkit.viz.attention import check_keeps_inputs, check_writable
from vitkit.weights import model_info

HELP = "classify images with a trained or converted model, or find objects with a detector"
STDOUT = "-"
DEFAULTS = {"top_k": 5, "batch_size": 32, "out": "runs/predict"}  # a detector's threshold: the one saved with it
CLASSIFIER_ONLY = ("top_k", "batch_size", "csv")
DETECTOR_ONLY = ("threshold", "out", "tile", "overlap")


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_model_source(parser, "a registered model, with --pretrained: the weights published for it")
    parser.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files, folders of them (searched at any depth) or quoted glob patterns ('imgs/**/*.png')",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help=f"a classifier's: classes shown per image (default: {DEFAULTS['top_k']})",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"a classifier's: images per forward pass (default: {DEFAULTS['batch_size']}; a detector reads one "
        "at a time)",
    )
    parser.add_argument("--workers", type=int, default=0, help="data loader processes decoding images (default: 0)")
    parser.add_argument(
        "--csv", metavar="FILE", default=None, help="a classifier's: also write the table as CSV to FILE"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        default=None,
        metavar="FILE",
        help="print the results as JSON instead of a table; with FILE, write them there as well as printing the table",
    )
    add_threshold_option(parser, "kept")
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where a detector writes each image with its boxes (PNG) and detections.json "
        f"(default: {DEFAULTS['out']})",
    )
    add_tile_options(parser)
    add_precision_option(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    add_memory_option(parser)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check(args: argparse.Namespace, detector: bool) -> None:
    """Options of the other kind of model are errors; defaults filled in for the rest."""
    unused = [name for name in (CLASSIFIER_ONLY if detector else DETECTOR_ONLY) if getattr(args, name) is not None]
    if unused:
        kind, other = ("a detector", "classifier") if detector else ("a classifier", "detector")
        verb = "apply" if len(unused) > 1 else "applies"
        raise ValueError(f"{', '.join(map(_flag, unused))} only {verb} to a {other}; {_source(args)} is {kind}")
    for name, kind in (("json", "JSON"), ("csv", "CSV")):
        value = getattr(args, name, None)
        if value not in (None, STDOUT) and Path(value).suffix.lower() in IMAGE_EXTENSIONS:
            raise ValueError(
                f"--{name} takes the {kind} file to write, got the image {value}: put --{name} after the images, "
                f"or write --{name}=FILE"
            )
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if detector:  # every output is checked before any work
        check_writable(args.out, folder=True)
    for name in ("json", "csv"):
        if getattr(args, name, None) not in (None, STDOUT):
            check_writable(getattr(args, name))


def _check_keeps_inputs(args: argparse.Namespace, paths: list[Path], detector: bool) -> None:
    """Before any work: no output replaces an image read or a file of the model folder."""
    reads = [*([args.model_dir] if args.model_dir else []), *paths]
    for name in ("json", "csv"):
        if getattr(args, name, None) not in (None, STDOUT):
            check_keeps_inputs(getattr(args, name), reads, _flag(name))
    if detector:
        inputs = {path.resolve() for path in paths}
        for path, picture in zip(paths, picture_paths(paths, args.out), strict=True):
            if picture.resolve() in inputs:
                raise ValueError(
                    f"--out {args.out}: the picture of {path} would be written to {picture}, an image this command "
                    "reads, and replace it; choose another folder"
                )


def _source(args: argparse.Namespace) -> str:
    return args.model_dir or args.model


def _note(args: argparse.Namespace, model: nn.Module) -> None:
    """What stands in for what a model directory lacks, or published weights without label names."""
    if args.model_dir is not None:
        note = missing_info_note(args.model_dir)
    elif model_info(model).classes is None:
        note = f"{args.model}'s weights come with no label names (none were published): classes are shown as indices"
    else:
        note = None
    if note:
        print(f"vitkit predict: note: {note}", file=sys.stderr)


def _warn(item: Unreadable) -> None:
    tqdm.write(f"vitkit predict: warning: cannot read image {item}", file=sys.stderr)


def _finish(skipped: list[Unreadable], total: int, read: int) -> int:
    """Print the unreadable files; the exit status (1 when nothing could be read)."""
    if skipped:
        print(summarize_unreadable(skipped), file=sys.stderr)
    if read == 0:
        print(f"vitkit predict: error: none of the {total} images could be read", file=sys.stderr)
        return 1
    return 0


def _run_detector(args: argparse.Namespace) -> int:
    paths = image_paths(args.images)
    _check_keeps_inputs(args, paths, detector=True)
    model = load_source(args).to(resolve_device(args.device))
    info = inference_info(model)
    postprocessing = detection_reading(model, args.model_dir).one_per_query()  # one box per object, with its best class
    check_inference_memory(model, args)  # one image at a time
    tile, overlap = tiling(args, model_info(model).tile)
    check_image_sizes(paths, args.ignore_memory_check)
    note_dim_images("predict", paths)
    _note(args, model)
    if tile is not None:
        side = min(to_2tuple(model.config.img_size))
        mine = " (the model's)" if args.tile is None else ""
        scale = f"; the model takes {side} px, so each tile is resized by {side / tile:.2g}" if side != tile else ""
        print(
            f"vitkit predict: images larger than {tile} px a side in tiles of {tile} px{mine}, sharing {overlap:g} "
            f"of a side, merged by ownership and per-class NMS{scale}",
            file=sys.stderr,
        )
    threshold = postprocessing.shown_above(args.threshold)
    found, skipped = detect_paths(
        model, info, paths, threshold, postprocessing, args.workers, on_unreadable=_warn, tile=tile, overlap=overlap,
        precision=run_precision(args, model, batch=1),  # a detector reads one image at a time
    )  # fmt: skip
    rows = [item.to_dict() for item in found]
    notes = sys.stdout
    if found:
        if args.json == STDOUT:
            print(json.dumps(rows, indent=2))
            notes = sys.stderr
        else:
            for item in found:
                n = len(item.detections)
                print(f"{item.image}: {n} object{'' if n == 1 else 's'}" + ("" if n else f" above {threshold:.2f}"))
                for d in item.detections:
                    x0, y0, x1, y1 = d.box
                    print(f"  {d.label}  {d.score:.4f}  box {x0:.1f} {y0:.1f} {x1:.1f} {y1:.1f}")
        _, listing = write_detections(found, args.out, info.classes, threshold)
        print(f"pictures with the boxes and detections written to {listing.parent}, listed in {listing}", file=notes)
        if args.json not in (None, STDOUT):
            print(f"JSON written to {write_json(rows, args.json)}", file=notes)
    return _finish(skipped, len(paths), len(found))


def run(args: argparse.Namespace) -> int:
    check_model_source(args)
    detector = source_is_detector(args)
    _check(args, detector)
    if detector:
        return _run_detector(args)
    paths = image_paths(args.images)
    _check_keeps_inputs(args, paths, detector=False)
    set_max_pixels(args)
    check_image_sizes(paths, args.ignore_memory_check)
    note_dim_images("predict", paths)
    model = load_source(args).to(resolve_device(args.device))
    info = inference_info(model)
    check_inference_memory(model, args, args.batch_size, "--batch-size")
    _note(args, model)
    found = predict_paths(
        model, info, paths, args.top_k, args.batch_size, args.workers, on_unreadable=_warn,
        precision=run_precision(args, model, args.batch_size),
    )  # fmt: skip
    notes = sys.stdout
    if found.predictions:
        if args.json == STDOUT:
            print(json.dumps(found.to_dicts(), indent=2))
            notes = sys.stderr
        else:
            print(format_predictions(found.predictions))
        if args.csv:
            print(f"CSV written to {write_predictions_csv(found.predictions, args.csv)}", file=notes)
        if args.json not in (None, STDOUT):
            print(f"JSON written to {write_json(found.to_dicts(), args.json)}", file=notes)
    img_size = to_2tuple(model.config.img_size)
    for note in filter(None, (crop_note(p, img_size, info.framing()) for p in found.predictions)):
        print(f"vitkit predict: note: {note}", file=sys.stderr)
    return _finish(found.skipped, len(paths), len(found.predictions))
