"""`vitkit explore`: one self-contained HTML page (no server, no network) to explore where a vision transformer looks:
click any patch, or the class token or a register, and see its attention over the image in every layer and head,
attention rollout, the prediction and the model's costs (`vitkit.viz.explorer`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitkit.cli.options import (
    add_memory_option,
    add_model_source,
    add_threshold_option,
    check_inference_memory,
    check_model_source,
    load_source,
    note_dim_images,
    note_tiled_model,
    source_is_detector,
)
from vitkit.data import open_image
from vitkit.infer import detection_reading, inference_info, resolve_device
from vitkit.infer.explore import detector_explorer_data, explorer_data
from vitkit.util import atomic_write
from vitkit.viz.explorer import explorer_page

HELP = (
    "write an attention explorer: one HTML file that opens from disk, where clicking a patch (or the class token, a "
    "register) shows where it attends in every layer and head, with rollout, the prediction and the model's costs; "
    "for a detector, clicking a box shows what its query attended to in every decoder layer"
)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # an untrained registered model's normalisation


def _indices(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated indices such as 0,5,11, got {text!r}") from None


def add_parser(parser: argparse.ArgumentParser) -> None:
    add_model_source(
        parser, "a registered model (see `vitkit models`): untrained, or with --pretrained its published weights"
    )
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--out", required=True, metavar="HTML", help="the page to write (.html); folders are made")
    parser.add_argument("--layers", type=_indices, default=None, help="layers to keep, e.g. 0,5,11 (default: all)")
    parser.add_argument("--heads", type=_indices, default=None, help="heads to keep, e.g. 0,1 (default: all)")
    add_threshold_option(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    add_memory_option(parser)


LARGE_PAGE = 50 * 2**20  # bytes above which a page is slow to open, and keeping fewer maps is worth saying


def _write(out: Path, data: dict) -> None:
    page = explorer_page(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))


def _run_detector(args: argparse.Namespace, out: Path) -> int:
    if args.layers is not None or args.heads is not None:
        raise ValueError("--layers and --heads choose a classifier's maps; a detector's page holds every decoder layer")
    model = load_source(args).to(resolve_device(args.device))
    info = inference_info(model)
    postprocessing = detection_reading(model, args.model_dir).one_per_query()  # one box per object, with its best class
    threshold = postprocessing.shown_above(args.threshold)
    check_inference_memory(model, args, capture=True)
    images = [(Path(p).name, open_image(p)) for p in args.images]
    note_tiled_model("explore", info.tile, images)
    data = detector_explorer_data(model, info, images, threshold, postprocessing, args.model_dir or args.model)
    _write(out, data)
    found = sum(len(page["detections"]) for page in data["images"])
    print(
        f"explorer of {len(images)} image(s), {found} detection(s) above {threshold:.2f}: {out} "
        f"({_size(out.stat().st_size)}); open it in a browser"
    )
    return 0


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--out {out}: expected an .html file name")
    check_model_source(args, untrained=True)
    note_dim_images("explore", args.images)
    if source_is_detector(args):
        return _run_detector(args, out)
    if args.threshold is not None:
        raise ValueError("--threshold is a detector's smallest class probability; this is a classifier")
    model = load_source(args).to(resolve_device(args.device))
    if args.model_dir or args.pretrained:
        info = inference_info(model)
        mean, std, names, name = info.mean, info.std, info.classes or None, args.model_dir or args.model
    else:
        (mean, std), names, name = IMAGENET, None, args.model
    check_inference_memory(model, args, capture=True)
    images = [(Path(p).name, open_image(p)) for p in args.images]
    data = explorer_data(model, images, mean, std, names, name, args.layers, args.heads)
    _write(out, data)
    heads = f" x {len(data['heads'])} head(s)" if data["kind"] == "tokens" else ""
    print(
        f"explorer of {len(images)} image(s), {len(data['layers'])} layer(s){heads}: "
        f"{out} ({_size(out.stat().st_size)}); open it in a browser"
    )
    if out.stat().st_size > LARGE_PAGE and args.layers is None and args.heads is None:
        last = len(data["layers"]) - 1  # every layer is kept: the last one's index
        fewer = f"--layers {last} (or 0,{last})" + (" and --heads 0,1" if heads else "")
        print(
            f"vitkit explore: note: a page of {_size(out.stat().st_size)} opens slowly; it holds every layer's maps: "
            f"{fewer} keep fewer",
            file=sys.stderr,
        )
    return 0
