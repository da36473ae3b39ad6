"""The output folder of a training run (OUT): what a run writes there, whether a run may start or resume in it
(`check_out`: `resume` continues the run OUT holds, `force` replaces it), moving an earlier run's outputs aside for a
fresh run (`clear_out`), and how messages name the ways on (`RunHints`).

A fresh run needs an empty or new OUT, or `force`: the earlier run's outputs (`OUTPUTS`) then move to a sibling
OUT.old-<time>, deleted once the new run has finished its first epoch; files of the user's own in OUT stay.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from vitkit.errors import python_option
from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint
from vitkit.train.config import CONFIG_NAME, TrainConfig
from vitkit.train.distributed import DistEnv, barrier
from vitkit.train.sharding import FOLDER_PREFIX, POINTER_NAME, load_trainer_state, sharded_checkpoint
from vitkit.weights.io import WEIGHTS_NAME

log = logging.getLogger("vitkit.train")

METRICS_NAME = "metrics.jsonl"
CURVES_NAME = "curves.png"
# what a fresh run replaces, with the folders of sharded checkpoints (checkpoint-K, named by POINTER_NAME)
OUTPUTS = (CONFIG_NAME, METRICS_NAME, CURVES_NAME, CHECKPOINT_NAME, POINTER_NAME, "best", "final")


class RunHints:
    """How messages about a run name the ways on (continue it, start afresh, train it longer): here as Python calls
    of `fit` and options as its arguments (``force=True``); `vitkit train` names them as its command lines and flags
    (`vitkit.cli.train.CommandHints`)."""

    def option(self, name: str, value: Any = None) -> str:
        """An option of `fit` or `TrainConfig`, alone or set to `value`: ``force=True``, ``strategy='fsdp'``."""
        return python_option(name, value)

    def resume(self, out: str | os.PathLike, epochs: int | None = None) -> str:
        """What continues the run in `out` with its saved settings (with `epochs` in all, when given)."""
        more = "" if epochs is None else f", epochs={epochs}"
        return f"fit(TrainConfig.for_resume({os.fspath(out)!r}{more}), resume=True)"

    def start(self, config: TrainConfig, force: bool = False) -> str:
        """What trains `config` afresh (`force`: in a folder that holds a run)."""
        defaults = TrainConfig()
        given = [
            f"{f.name}={getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if f.name != "out" and getattr(config, f.name) != getattr(defaults, f.name)
        ]
        arguments = ", ".join([*given, f"out={config.out!r}"])
        return f"fit(TrainConfig({arguments}){', force=True' if force else ''})"


def new_folder(out: Path) -> Path:
    """A sibling of `out` that does not exist yet: OUT-2, OUT-3, ..."""
    n = 2
    while (candidate := out.with_name(f"{out.name}-{n}")).exists():
        n += 1
    return candidate


def check_out(out: Path, resume: bool, force: bool, given: TrainConfig, hints: RunHints) -> dict[str, Any] | None:
    """The checkpoint to resume from, or None for a fresh run; ValueError, with the ways that work (worded by
    `hints`), when OUT does not hold what `resume` / `force` expect. Changes nothing."""
    checkpoint = out / CHECKPOINT_NAME
    sharded = sharded_checkpoint(out)
    force_option = hints.option("force", True)
    if resume and force:
        raise ValueError(
            f"{hints.option('resume', True)} continues the run in {out} and {force_option} replaces it: pass one. "
            f"Continue: {hints.resume(out)}  or start over: {hints.start(given.minimal(), force=True)}"
        )
    used = out.is_dir() and any(out.iterdir())
    if resume:
        if sharded is not None and (not checkpoint.is_file() or _newer(out / POINTER_NAME, checkpoint)):
            return {**load_trainer_state(sharded), "sharded": sharded}
        if checkpoint.is_file():
            return load_checkpoint(checkpoint)
        where = "does not exist" if not out.exists() else "holds no checkpoint" if used else "is empty"
        raise ValueError(
            f"nothing to resume: {out} {where} ({checkpoint.name} not found); start a new run with: "
            f"{hints.start(given.minimal(), force=used)}" + moved_aside_note(out, hints)
        )
    if used and not force:
        given = given.minimal()
        if checkpoint.is_file() or sharded is not None:
            ways = f"continue the run there with: {hints.resume(out)}  or start over with: {hints.start(given, True)}"
        else:
            ways = f"start there anyway with: {hints.start(given, force=True)}"
        new = hints.start(dataclasses.replace(given, out=os.fspath(new_folder(out))))
        ways += moved_aside_note(out, hints)
        raise ValueError(
            f"{out} is not empty: {ways}  ({force_option} moves vitkit's earlier outputs aside until the new run's "
            f"first checkpoint), or use a new folder: {new}"
        )
    return None


def moved_aside(out: Path) -> list[Path]:
    """Earlier runs' outputs that `force` moved aside from OUT and that are still there (OUT.old-<time>), oldest
    first: a run that replaced them ended before finishing its first epoch."""
    out = out.resolve()
    return sorted(p for p in out.parent.glob(f"{glob.escape(out.name)}.old-*") if p.is_dir())


def moved_aside_note(out: Path, hints: RunHints) -> str:
    """For a message about OUT: where the outputs of the run `force` replaced are, while they are kept."""
    aside = moved_aside(out)
    if not aside:
        return ""
    return (
        f" (the outputs of the run {hints.option('force', True)} replaced there are kept in "
        f"{', '.join(map(str, aside))} until a run in {out} finishes its first epoch; to go back to that run, move "
        f"them into {out})"
    )


def _newer(a: Path, b: Path) -> bool:
    return a.stat().st_mtime > b.stat().st_mtime


def clear_out(out: Path, env: DistEnv) -> Path | None:
    """Make OUT ready for a fresh run: created, with an earlier run's outputs (`OUTPUTS`) moved to a sibling
    OUT.old-<time>, which is returned (None when there was nothing to move). Other files in OUT stay."""
    barrier(env)  # every process has looked at OUT before rank 0 changes it
    aside = None
    if env.is_main:
        found = [out / name for name in OUTPUTS if (out / name).exists()]
        found += sorted(p for p in out.glob(f"{FOLDER_PREFIX}*") if p.is_dir())
        if found:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = out.resolve().with_name(f"{out.resolve().name}.old-{stamp}")
            n = 1
            while aside.exists():
                aside, n = aside.with_name(f"{out.resolve().name}.old-{stamp}-{n}"), n + 1
            aside.mkdir()
            for path in found:
                shutil.move(path, aside / path.name)
            log.info(
                f"moved the earlier run's outputs in {out} to {aside}; deleted once this run finishes its first epoch"
            )
        out.mkdir(parents=True, exist_ok=True)
    return aside


def has_final(out: Path) -> bool:
    """Whether OUT holds the final model of its run, whole (the loop writes the weights, then config.json; a run
    killed in between is resumed to write it again)."""
    final = out / "final"
    return all((final / name).is_file() for name in (WEIGHTS_NAME, CONFIG_NAME))
