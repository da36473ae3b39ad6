"""`vitkit <command>`: argument parsing only; each command lives in its own module and calls the library.

A command module `vitkit/cli/NAME.py` defines `HELP`, `add_parser(parser)` and `run(args) -> int` (a '-' in the
command's name is a '_' in the module's).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from PIL import Image

from vitkit.cli.messages import cli_message
from vitkit.cli.options import take_positional_out

# One line per command module, in the order `vitkit --help` lists them.
COMMANDS = (
    "models",
    "profile",
    "bench",
    "convert",
    "export",
    "example-data",
    "check-data",
    "train",
    "eval",
    "predict",
    "attention",
    "explore",
)


def build_parser() -> argparse.ArgumentParser:
    from vitkit import __version__

    parser = argparse.ArgumentParser(prog="vitkit", description="Vision transformers: models, costs, weights.")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"vitkit.cli.{name.replace('-', '_')}")  # example-data: example_data.py
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        command.set_defaults(run=module.run)
        module.add_parser(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    extra = take_positional_out(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    limit = Image.MAX_IMAGE_PIXELS  # --max-pixels changes it for one command
    try:
        return args.run(args) or 0
    except BrokenPipeError:  # the reader went away (`vitkit profile --json | head`): nothing left to say
        sys.stderr.close()
        return 0
    except (ValueError, OSError, ImportError) as err:
        message = cli_message(err)  # the library's ways out as flags
        print(f"vitkit {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        Image.MAX_IMAGE_PIXELS = limit
