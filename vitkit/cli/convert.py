"""`vitkit convert SRC --out DST`: read weights in one library's layout and write them in another's."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from typing import Any

from vitkit.cli.messages import CONVERT, STRUCTURED, cli_message
from vitkit.cli.options import add_out_option, add_renamed_option, out_path, parse_assignment
from vitkit.util import listed
from vitkit.weights.convert import DIRECTORY_FORMATS, config_less_formats, convert, format_sources, formats
from vitkit.weights.io import PDPARAMS_SUFFIX, PICKLE_SUFFIXES

HELP = f"convert weights between the layouts of {listed(format_sources())}"


def add_parser(parser: argparse.ArgumentParser) -> None:
    known = formats()
    files = ", ".join((".safetensors", *PICKLE_SUFFIXES, PDPARAMS_SUFFIX))
    parser.add_argument("src", help=f"a model directory (vitkit, Hugging Face or timm) or a checkpoint file ({files})")
    add_out_option(
        parser,
        "DST",
        f"where to write: a directory for {' / '.join(DIRECTORY_FORMATS)}, a file ({files}) for the others",
    )
    sources = ("auto", *known)
    parser.add_argument(
        "--from",
        dest="src_format",
        default="auto",
        type=_layout_name(sources),
        metavar="{" + ",".join(sources) + "}",
        help="layout of SRC (default: auto, recognised from its keys)",
    )
    parser.add_argument(
        "--to",
        dest="dst_format",
        default="vitkit",
        type=_layout_name(known),
        metavar="{" + ",".join(known) + "}",
        help="layout to write (default: vitkit)",
    )
    parser.add_argument(
        "--model",
        help="registered model to load a checkpoint file into (see `vitkit models`); not for directories, nor for "
        f"{listed(config_less_formats(), 'or')} files, whose model is built from their shapes and --model-arg "
        "num_heads=H",
    )
    add_renamed_option(
        parser,
        "--model-arg",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="replace a config field, e.g. --model-arg num_classes=10 --model-arg img_size=384 (values parsed as JSON)",
    )
    parser.add_argument(
        "--reset-head", action="store_true", help="skip the checkpoint's classifier; keep a freshly initialised one"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace what DST holds: the file, or the files of the same names in the folder (never SRC's own)",
    )


# What people call the layouts, beside vitkit's names for them
LAYOUT_ALIASES = {"huggingface": "hf", "transformers": "hf", "hugging-face": "hf", "deformable-detr": "deformable_detr"}


def _layout_name(known: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: a layout name of `known`, else an error naming the closest one and all of them."""

    def parse(value: str) -> str:
        if value in known:
            return value
        close = [LAYOUT_ALIASES[value.lower()]] if value.lower() in LAYOUT_ALIASES else []
        close = close or difflib.get_close_matches(value.lower(), known, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}? " if close else ""
        raise argparse.ArgumentTypeError(f"unknown layout {value!r}: {hint}(known: {', '.join(known)})")

    return parse


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    try:
        return dict(parse_assignment(item) for item in items)
    except ValueError as err:
        raise ValueError(f"--model-arg {err}") from err


def run(args: argparse.Namespace) -> int:
    dst = out_path(args)
    overrides = _parse_overrides(args.overrides)
    try:
        report, written = convert(
            args.src,
            dst,
            src_format=args.src_format,
            dst_format=args.dst_format,
            model_name=args.model,
            reset_head=args.reset_head,
            overrides=overrides,
            force=args.force,
        )
    except STRUCTURED as err:  # the ways out in this command's flags, not the library's arguments
        raise ValueError(cli_message(err, CONVERT)) from None
    print(report.summary(lambda name: f"{CONVERT.field} {name}=N"))
    print(f"wrote {args.dst_format} weights to {written}")
    return 0
