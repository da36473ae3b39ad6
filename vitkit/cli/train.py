"""`vitkit train`: train a classifier or a detector on bundled data, an ImageFolder tree or a COCO-format folder (also
under torchrun)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
from typing import Any

from vitkit.cli.messages import STRUCTURED, TRAIN, cli_message, cli_option
from vitkit.cli.options import add_config_options, add_memory_option, memory_flags
from vitkit.train import RunHints, TrainConfig, fit
from vitkit.train.config import option_flag
from vitkit.train.resume import RESUME_MAY_CHANGE

HELP = (
    "train a classifier (default: a small ViT on the bundled MNIST digits) or a detector (deformable_detr_small on "
    "detection data); runs under torchrun for several GPUs/nodes"
)


def add_parser(parser: argparse.ArgumentParser) -> None:
    # One option per TrainConfig field (help, type and choices declared there); options left out stay out of the
    # namespace, so --resume keeps the saved value of every option not given.
    add_config_options(parser, TrainConfig)
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run in --out from its checkpoint, with its saved settings; only {_may_change()} may change",
    )
    start.add_argument(
        "--force",
        action="store_true",
        help="start afresh even if --out holds a run (its outputs are moved to OUT.old-<time> and deleted once the "
        "new run has finished its first epoch)",
    )
    add_memory_option(parser)


def _may_change() -> str:
    """ "--epochs (more), --workers, --device and --grad-checkpointing": the options a resumed run may change."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    flags = [option_flag(fields[name]) + (" (more)" if name == "epochs" else "") for name in RESUME_MAY_CHANGE]
    return ", ".join(flags[:-1]) + " and " + flags[-1]


class CommandHints(RunHints):
    """The ways on from a run (continue it, start afresh, train it longer) as `vitkit train` command lines, ready to
    paste into a shell, and its options as flags."""

    def option(self, name: str, value: Any = None) -> str:
        return cli_option(name, value)

    def resume(self, out: str | os.PathLike, epochs: int | None = None) -> str:
        more = [] if epochs is None else ["--epochs", str(epochs)]
        return shlex.join(["vitkit", "train", "--out", os.fspath(out), "--resume", *more])

    def start(self, config: TrainConfig, force: bool = False) -> str:
        return config.command(*(["--force"] if force else []))


class _Stdout(logging.StreamHandler):
    """Log lines to whatever sys.stdout is when they are written (one handler, however often `vitkit train` runs in
    a process)."""

    @property
    def stream(self) -> object:
        return sys.stdout

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def _setup_logging() -> None:
    logger = logging.getLogger("vitkit")
    if not any(isinstance(h, _Stdout) for h in logger.handlers):
        handler = _Stdout()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields}
    config = TrainConfig.for_resume(**given) if args.resume else TrainConfig(**given)
    _setup_logging()
    try:
        result = fit(
            config,
            resume=args.resume,
            force=args.force,
            allow_memory=args.ignore_memory_check,
            memory_names=memory_flags(),
            hints=CommandHints(),
        )
    except STRUCTURED as err:  # the ways out in this command's flags, not the library's arguments
        raise ValueError(cli_message(err, TRAIN)) from None
    code = 130 if result.interrupted else 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun process whose run is done and group left: end here,
        # without the interpreter's teardown, where Gloo's threads can still abort it ("terminate called without an
        # active exception", SIGABRT) and turn a finished run into a failed one
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    return code
