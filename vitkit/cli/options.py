"""Option parsing shared by several commands (not a command itself)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from typing import Any

from PIL import Image
from torch import nn

from vitkit.analysis.available import available_memory
from vitkit.analysis.precision import AUTO, PRECISIONS, resolve_precision, slow_precision
from vitkit.analysis.preflight import SettingNames, check_memory
from vitkit.cli.messages import cli_option
from vitkit.data.check import dim_image_note
from vitkit.data.tiles import DEFAULT_OVERLAP, MIN_TILE
from vitkit.detection.postprocess import DEFAULT_THRESHOLD
from vitkit.infer import is_detector_dir, is_detector_name, resolve_device, run_config
from vitkit.infer.runtime import inference_step_times
from vitkit.models.registry import published_weights
from vitkit.train.config import option_flag
from vitkit.weights import from_pretrained
from vitkit.weights.pretrained import create_model

_PYTHON_WORDS = {"True": True, "False": False, "None": None}


def parse_assignment(text: str) -> tuple[str, Any]:
    """'FIELD=VALUE' -> (field, value): the value as JSON (2, 0.1, true, [224, 320]), Python's True / False / None,
    or else the bare string (attn_backend=math). Lists become tuples, as configs hold them."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expects FIELD=VALUE, got {text!r}")
    if raw in _PYTHON_WORDS:
        return key, _PYTHON_WORDS[raw]
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return key, raw
    return key, tuple(value) if isinstance(value, list) else value


def assignment(text: str) -> tuple[str, Any]:
    """`parse_assignment` as an argparse type: a malformed pair is a usage error naming the option."""
    try:
        return parse_assignment(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def parse_size(text: str) -> tuple[int, int]:
    """'224' -> (224, 224); '256x320' -> (256, 320)."""
    parts = text.lower().split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected a size like 224 or 256x320, got {text!r}")
    return (int(parts[0]), int(parts[-1]))


class CollectAssignments(argparse.Action):
    """A repeatable KEY=VALUE option gathered into one dict (a later KEY replaces an earlier one)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        key, value = values
        setattr(namespace, self.dest, {**getattr(namespace, self.dest, {}), key: value})


def _option_type(hint: Any) -> Any:
    """The type an annotation asks for on the command line: `float | None` -> float, `dict[str, Any]` -> dict."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return typing.get_origin(hint) or hint


def add_config_options(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """One option per field of the dataclass `config_cls` that has a `help` in its metadata (declared with
    `vitkit.train.config.option`): --field-name or the field's `flag`, its metavar and choices, the type of its
    annotation (a bool is a switch that sets True; a dict takes repeatable KEY=VALUE pairs), and the help text with
    " (default: X)" unless the default is None, a bool or a factory.

    Options left out stay out of the namespace (default SUPPRESS), so that a caller can tell them from defaults.
    """
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        if "help" not in f.metadata:
            continue
        default = f.default  # MISSING for a factory
        shown = default not in (None, dataclasses.MISSING) and not isinstance(default, bool)
        text = f.metadata["help"] + (f" (default: {default})" if shown else "")
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        kwargs.update({k: f.metadata[k] for k in ("metavar", "choices") if k in f.metadata})
        kind = _option_type(hints[f.name])
        if kind is bool:
            kwargs.update(action="store_const", const=True)
        elif kind is dict:
            kwargs.update(action=CollectAssignments, type=assignment)
        elif kind in (int, float):
            kwargs["type"] = kind
        elif kind is not str:
            raise TypeError(f"{config_cls.__name__}.{f.name}: no command-line form for {hints[f.name]}")
        parser.add_argument(option_flag(f), **kwargs)


def add_renamed_option(parser: argparse.ArgumentParser, flag: str, old: str, **kwargs: Any) -> argparse.Action:
    """`parser.add_argument(flag, **kwargs)`, and `old`, the option's earlier spelling, accepted with the same
    meaning for a release but not shown in --help (nor in the usage line). Returns the action of `flag`."""
    action = parser.add_argument(flag, **kwargs)
    same = {k: v for k, v in kwargs.items() if k not in ("dest", "default", "required", "help", "metavar")}
    parser.add_argument(old, dest=action.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **same)
    return action


def add_out_option(parser: argparse.ArgumentParser, metavar: str, help: str) -> None:
    """--out (what the command writes), which `out_path` reads; also accepted, as it was spelt before, as a
    positional argument after the command's own (not in --help, kept for a release; `take_positional_out`)."""
    parser.add_argument("--out", metavar=metavar, default=None, help=f"{help} (required)")
    parser.set_defaults(positional_out=None)


def take_positional_out(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """After `parse_known_args`: a single argument left over that is not an option becomes the output of a command
    with `add_out_option` (`positional_out`); returns what is still unrecognised. (A declared optional positional
    would be taken, empty, before options that precede it on the command line.)"""
    if len(extra) == 1 and not extra[0].startswith("-") and getattr(args, "positional_out", "") is None:
        args.positional_out = extra[0]
        return []
    return extra


def out_path(args: argparse.Namespace) -> str:
    """The --out of a command with `add_out_option` (or its positional spelling); ValueError when neither or two
    different ones are given."""
    out, positional = args.out, args.positional_out
    if out is not None and positional is not None and out != positional:
        raise ValueError(f"two outputs given, --out {out} and {positional}: give one, with --out")
    if out is None and positional is None:
        raise ValueError("the following arguments are required: --out")
    return out if out is not None else positional


IGNORE_MEMORY_CHECK = "--ignore-memory-check"


def add_threshold_option(parser: argparse.ArgumentParser, kept: str = "shown") -> None:
    """--threshold (dest `threshold`, default None): a detector's smallest class probability `kept` ("shown" in
    pictures and pages, "kept" in predictions); None takes the model's saved choice."""
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help=f"a detector's smallest class probability {kept} (default: the one vitkit train chose on the validation "
        f"split, saved in the model's config.json; {DEFAULT_THRESHOLD} without)",
    )


def add_tile_options(parser: argparse.ArgumentParser) -> None:
    """--tile (dest `tile`, default None: the tiles the model was trained on, if any) and --overlap (dest
    `overlap`): a detector's images larger than a tile detected in tiles (`vitkit.infer.tiles`); and --max-pixels
    (dest `max_pixels`): Pillow's limit on an image's pixels (`PIL.Image.MAX_IMAGE_PIXELS`) for this command."""
    parser.add_argument(
        "--tile",
        type=int,
        default=None,
        metavar="PX",
        help="a detector's: detect images larger than PX a side in overlapping tiles of PX, merged into one list "
        "(default: the tiles the model was trained on with vitkit train --tile, else whole images; 0: whole images)",
    )
    parser.add_argument(
        "--overlap",
        type=float,
        default=None,
        help=f"the share of a tile's side its neighbours share (default: {DEFAULT_OVERLAP}); objects up to this "
        "size are found whole by one tile",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        metavar="N",
        help=f"read images of up to N pixels (default: Pillow's limit, {Image.MAX_IMAGE_PIXELS:,}, which guards "
        "against decompression bombs: images above it are refused, up to twice it with a warning)",
    )


def set_max_pixels(args: argparse.Namespace) -> None:
    """Pillow's limit on an image's pixels from --max-pixels, for this command."""
    if args.max_pixels is not None:
        if args.max_pixels <= 0:
            raise ValueError(f"--max-pixels must be a positive number of pixels, got {args.max_pixels}")
        Image.MAX_IMAGE_PIXELS = args.max_pixels


DECODE_BYTES_PER_PIXEL = 9  # an RGB image decoded (3 bytes a pixel), converted and cropped: about three copies


def check_image_sizes(paths: list, ignore_memory: bool = False) -> None:
    """Before any work, from the files' headers: ValueError for an image above Pillow's pixel limit (naming
    --max-pixels) or one whose decoding would not fit in the memory available (unless `ignore_memory`). Files whose
    header cannot be read are left to the reading, which reports them."""
    limit, free = Image.MAX_IMAGE_PIXELS, available_memory("cpu")
    for path in paths:
        Image.MAX_IMAGE_PIXELS = None  # the header only: the limit is compared below, with what to do
        try:
            with Image.open(path) as image:
                width, height = image.size
        except Exception:  # unreadable: reported when read, with the rest
            continue
        finally:
            Image.MAX_IMAGE_PIXELS = limit
        pixels = width * height
        if limit is not None and pixels > 2 * limit:
            raise ValueError(
                f"{path} is {width}x{height}, {pixels:,} pixels: more than twice Pillow's limit of {limit:,} "
                f"(PIL.Image.MAX_IMAGE_PIXELS, a guard against decompression bombs); if you trust the file, allow it "
                f"with --max-pixels {pixels}"
            )
        needed = pixels * DECODE_BYTES_PER_PIXEL
        if free is not None and needed > free and not ignore_memory:
            raise ValueError(
                f"{path} is {width}x{height}: reading it takes about {_size(needed)} and {_size(free)} of memory is "
                f"available; cut it into parts first, or run anyway with {IGNORE_MEMORY_CHECK}"
            )


def note_dim_images(command: str, paths: list) -> None:
    """A note on stderr for each image that reads nearly black (`vitkit.data.check.dim_image_note`), three at most
    and how many more."""
    notes = [note for note in map(dim_image_note, paths) if note is not None]
    for note in notes[:3]:
        print(f"vitkit {command}: note: {note}", file=sys.stderr)
    if len(notes) > 3:
        print(f"vitkit {command}: note: {len(notes) - 3} more images read nearly black too", file=sys.stderr)


def note_tiled_model(command: str, tile: int | None, images: list[tuple[str, Image.Image]]) -> None:
    """A note on stderr for each image larger than the tiles a detector was trained on (`ModelInfo.tile`): the view
    shows the whole image resized, where `predict` and `eval` detect in tiles; three at most."""
    if tile is None:
        return
    larger = [(name, image) for name, image in images if max(image.size) > tile]
    for name, image in larger[:3]:
        print(
            f"vitkit {command}: note: the model was trained on tiles of {tile} px, and shows {name} "
            f"({image.width}x{image.height}) whole, resized, its objects smaller than in training; `vitkit predict` "
            f"detects in tiles. For the view of one tile, crop a part of {tile} px",
            file=sys.stderr,
        )


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def tiling(args: argparse.Namespace, saved_tile: int | None) -> tuple[int | None, float]:
    """(tile side or None for whole images, overlap) from --tile / --overlap and the model's own tile; Pillow's
    pixel limit set from --max-pixels. ValueError for a tile or overlap out of range."""
    set_max_pixels(args)
    tile = saved_tile if args.tile is None else args.tile
    if tile is not None and tile < 0:
        raise ValueError(f"--tile must be a side in pixels (0: whole images), got {tile}")
    if tile and tile < MIN_TILE:
        raise ValueError(
            f"--tile {tile}: a tile of under {MIN_TILE} px holds a few pixels of an object, and an image thousands of "
            f"tiles; give at least {MIN_TILE} (about the model's input side, or the size the model was trained on), or "
            "0 for whole images"
        )
    overlap = DEFAULT_OVERLAP if args.overlap is None else args.overlap
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"--overlap is a share of the tile's side in [0, 1), got {overlap}")
    if args.overlap is not None and not tile:
        why = "--tile 0 asks for whole images" if args.tile == 0 else "the model was not trained on tiles"
        raise ValueError(f"--overlap applies to tiles: give --tile PX too ({why})")
    return tile or None, overlap


MODEL_DIR_HELP = (
    "a model directory (vitkit train's runs/train/final, save_pretrained, vitkit convert, a transformers or timm "
    "model's files) or a Hugging Face Hub repository, hf-hub:ORG/REPO[@REVISION] (downloaded once)"
)


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    """`--precision` of a command that runs a saved model (`run_precision`)."""
    parser.add_argument(
        "--precision",
        choices=(*PRECISIONS, AUTO),
        default=None,
        help="bf16: under bfloat16 autocast; auto: the faster on this device, as matrix products measure and, where "
        "they favour bf16, the model's own forward (default: the precision of the run that wrote the model, as it was "
        "validated, else fp32)",
    )


def run_precision(args: argparse.Namespace, model: nn.Module | None = None, batch: int = 1) -> str:
    """The precision a command runs its model in: `--precision`, else the one the run that wrote `--model-dir`
    validated in, else fp32; "auto" resolved on `--device` (`vitkit.analysis.precision.resolve_precision`). Where
    "auto" meets products that favour bf16 on a CPU, the model's own forward on `batch` images decides
    (`inference_step_times`; the source's model is read for it when `model` is None), and the command says what it
    measured."""
    model_dir = getattr(args, "model_dir", None)
    saved = run_config(model_dir).get("precision") if model_dir else None
    given, device = args.precision or saved or "fp32", resolve_device(args.device)
    precision = resolve_precision(given, device)
    if given != AUTO:  # asked for, or the run's: it runs as asked, said once where it is the slower one here
        slow = slow_precision(precision, device, cli_option)
        if slow is not None:
            print(f"vitkit {args.command}: warning: {slow}", file=sys.stderr)
        return precision
    if precision != "bf16" or device != "cpu":
        return precision
    model = model if model is not None else load_source(args).to(device)
    times = inference_step_times(model, device, batch)
    print(f"vitkit {args.command}: --precision auto: {times.describe('forward')}", file=sys.stderr)
    return times.choice()


def add_model_source(parser: argparse.ArgumentParser, model_help: str) -> None:
    """--model-dir DIR or --model NAME[.TAG] (one of them), and --pretrained: the model a command reads
    (`load_source`)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", metavar="DIR", help=MODEL_DIR_HELP)
    source.add_argument("--model", metavar="NAME[.TAG]", help=model_help)
    parser.add_argument(
        "--pretrained",
        action="store_true",
        help="with --model: load the weights published for it (its default ones, or NAME.TAG's; 'vitkit models "
        "--pretrained' lists them), downloaded once into the Hugging Face or torch.hub cache",
    )


def check_model_source(args: argparse.Namespace, untrained: bool = False) -> None:
    """ValueError for --pretrained without --model, or, unless the command reads `untrained` models, --model
    without --pretrained; the published weights' tag checked before anything is read."""
    if args.model_dir is not None and args.pretrained:
        raise ValueError(f"--pretrained goes with --model NAME; --model-dir loads the weights of {args.model_dir}")
    if args.model is None:
        return
    if args.pretrained or "." in args.model:
        _, weights = published_weights(args.model)  # a model without published weights, or an unknown tag: say so
        if args.pretrained and weights.layout == "torchvision" and not untrained:
            raise ValueError(
                f"{args.model}'s weights ({weights.data}) fill its backbone alone: its class and box heads would be "
                "untrained. Predict with weights published for the whole model ('vitkit models --pretrained'), or "
                f"fine-tune on your data first: vitkit train --data DIR --model {args.model.partition('.')[0]} "
                f"--init {weights.source}"
            )
    if not (args.pretrained or untrained):
        raise ValueError(
            f"--model {args.model} has no trained weights of its own: add --pretrained for the weights published for "
            "it ('vitkit models --pretrained' lists them), or give a trained model with --model-dir"
        )


def source_is_detector(args: argparse.Namespace) -> bool:
    """Whether the model of --model-dir or --model is a detector."""
    if args.model_dir is not None:
        return is_detector_dir(args.model_dir)
    return is_detector_name(args.model.partition(".")[0])


def load_source(args: argparse.Namespace) -> nn.Module:
    """The model of --model-dir (`vitkit.from_pretrained`) or of --model [--pretrained] (`vitkit.create_model`), in
    eval mode."""
    if args.model_dir is not None:
        return from_pretrained(args.model_dir)
    return create_model(args.model, pretrained=args.pretrained).eval()


def add_memory_option(parser: argparse.ArgumentParser) -> None:
    """--ignore-memory-check (dest `ignore_memory_check`): run even when the estimated peak memory exceeds what is
    available (`vitkit.analysis.check_memory` then warns instead of refusing)."""
    parser.add_argument(
        IGNORE_MEMORY_CHECK,
        action="store_true",
        help="run even when the estimated peak memory exceeds the memory available",
    )


def memory_flags(
    batch: str | None = "--batch-size",
    img_size: str | None = "--img-size",
    grad_checkpointing: str | None = "--grad-checkpointing",
    strategy: str | None = "--strategy",
) -> SettingNames:
    """The flags a command's memory refusal names as ways out (`vitkit.analysis.check_memory(..., names=...)`):
    `vitkit train`'s by default, None for a setting the command does not have; the override is always
    --ignore-memory-check."""
    return SettingNames(batch, img_size, grad_checkpointing, IGNORE_MEMORY_CHECK, strategy)


def check_inference_memory(
    model: nn.Module, args: argparse.Namespace, batch: int = 1, batch_flag: str | None = None, capture: bool = False
) -> None:
    """Before a command's forward pass: refuse (or with --ignore-memory-check, warn) when `model` at `batch` (with
    every attention map kept, `capture`) would not fit in its device's memory; the refusal names `batch_flag` (or
    no batch) and --ignore-memory-check as the ways out (`vitkit.analysis.check_memory`)."""
    names = memory_flags(batch=batch_flag, img_size=None, grad_checkpointing=None, strategy=None)
    device = next(model.parameters()).device
    allow = args.ignore_memory_check
    check_memory(model, None, batch, training=False, device=device, capture_attention=capture, allow=allow, names=names)
