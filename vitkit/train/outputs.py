"""The output folder of a training run (OUT): what a run writes there, whether a run may start or resume in it
(`check_out`: `resume` continues the run OUT holds, `force` replaces it), moving an earlier run's outputs aside for a
fresh run (`clear_out`), and how messages name the ways on (`RunHints`).

A fresh run needs an empty or new OUT, or `force`: the earlier run's outputs (`OUTPUTS`) then move to a sibling
OUT.old-<time>, deleted once the new run has finished its first epoch; files of the user's own in OUT stay. Every
folder moved aside is kept until then, however many runs `force` replaced before one finished an epoch (a run killed
in its first epoch, forced again), and messages name each with what it holds (`describe_aside`).

A run holds OUT while it trains (`OutLock`: an advisory lock on OUT/.vitkit-train.lock that the system releases when
the process ends, even killed): a second run in the same OUT is refused, naming the process that holds it.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from vitkit.errors import python_option
from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint
from vitkit.train.config import CONFIG_NAME, TrainConfig, is_model_config, model_folder_words
from vitkit.train.distributed import DistEnv, barrier, broadcast_object
from vitkit.train.sharding import FOLDER_PREFIX, POINTER_NAME, load_trainer_state, sharded_checkpoint
from vitkit.weights.io import WEIGHTS_NAME

log = logging.getLogger("vitkit.train")

METRICS_NAME = "metrics.jsonl"
CURVES_NAME = "curves.png"
LOCK_NAME = ".vitkit-train.lock"
ASIDE_MARK = ".vitkit-moved-aside"  # in a folder of outputs `force` moved aside: vitkit made it, and may delete it
# what a fresh run replaces, with the folders of sharded checkpoints (checkpoint-K, named by POINTER_NAME)
OUTPUTS = (CONFIG_NAME, METRICS_NAME, CURVES_NAME, CHECKPOINT_NAME, POINTER_NAME, "best", "final")

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None


def _same_file(handle: Any, path: Path) -> bool:
    """Whether the open `handle` is the file at `path` (not one unlinked since it was opened)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


_HELD: set[str] = set()  # the lock files runs of this process hold (a POSIX lock is the whole process's)


class OutLock:
    """OUT held by one training run. Rank 0 takes an advisory lock on OUT/.vitkit-train.lock and writes who holds it
    there; the system releases it when the process ends, so a crashed run leaves nothing that blocks the next. The
    lock is POSIX's (`fcntl.lockf`), which belongs to the process alone: the loader's worker processes, forked with
    the file open, do not hold it, so a run killed with `kill -9` frees OUT at once, not when its orphaned workers
    notice and exit (as a `flock`, shared with them, would). `acquire` raises ValueError in every process of the run
    when another run holds OUT."""

    def __init__(self, out: Path, env: DistEnv, hints: RunHints) -> None:
        self.out, self.env, self.hints = out, env, hints
        self.handle = None
        self.key = ""  # the lock file's real path while held
        self.held = False

    def acquire(self, given: TrainConfig, create: bool = True) -> None:
        """Hold OUT unless held already: when it is missing, create it (`create`) or leave it (then nothing is
        held). ValueError, naming the process that holds it and the ways on (`given`: the run as the user gave it),
        when another run does."""
        if self.held:
            return
        outcome = None
        if self.env.is_main:
            try:
                if create:
                    self.out.mkdir(parents=True, exist_ok=True)
                outcome = self._take(given) if self.out.is_dir() else "missing"
            except OSError as err:  # said in every process, not left for the others to wait on
                taken = next((p for p in (self.out, *self.out.parents) if p.exists()), None)
                if taken is not None and not taken.is_dir():
                    outcome = f"cannot use {self.out} as the output folder: {taken} is a file, not a folder"
                else:
                    outcome = f"cannot use {self.out} as the output folder: {err}"
        outcome = broadcast_object(outcome, self.env)
        if outcome not in (None, "missing"):
            raise ValueError(outcome)
        self.held = outcome is None

    def _take(self, given: TrainConfig) -> str | None:
        if fcntl is None:
            return None
        path = self.out / LOCK_NAME
        key = os.path.realpath(path)
        if key in _HELD:  # by a run of this process: refused here, without opening the file (closing any descriptor
            # of it would free that run's lock)
            return self._refusal(f"process {os.getpid()}, this one", given)
        handle = open(path, "a+")  # noqa: SIM115 (held open while the run trains)
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not _same_file(handle, path):  # unlinked by a run that ended just now: lock the new one
                handle.close()
                return self._take(given)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # no locks on this file system
                handle.close()
                log.warning(f"{self.out} cannot be locked ({err}): a second run into it would not be refused")
                return None
            handle.seek(0)
            text = handle.read()
            handle.close()
            try:
                holder = json.loads(text)
                who = f"process {holder['pid']} on {holder['host']}, started {holder['started']}: {holder['command']}"
            except (ValueError, KeyError, TypeError):
                who = "another process"
            return self._refusal(who, given)
        handle.seek(0)
        handle.truncate()
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": shlex.join([os.path.basename(sys.argv[0]) or "python", *sys.argv[1:]]),
        }
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        self.handle, self.key = handle, key
        _HELD.add(key)
        return None

    def _refusal(self, who: str, given: TrainConfig) -> str:
        try:
            new = self.hints.start(dataclasses.replace(given.minimal(), out=os.fspath(new_folder(self.out))))
        except (ValueError, OSError):  # the run itself cannot be resolved: the refusal still reaches every rank
            new = f"the same command with another output folder, e.g. {new_folder(self.out)}"
        return (
            f"{self.out} is in use by another training run ({who}); two runs in one folder would write over each "
            f"other's checkpoints and metrics. Wait for it to end, or stop it, then run this again; or train in "
            f"a new folder: {new}"
        )

    def release(self) -> None:
        """Let OUT go (the lock file is removed)."""
        if self.handle is not None:
            (self.out / LOCK_NAME).unlink(missing_ok=True)
            self.handle.close()
            self.handle = None
            _HELD.discard(self.key)
        self.held = False


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
    if (out / CONFIG_NAME).is_file():  # a saved model's folder is no run's, whatever force says
        try:
            holds_model = is_model_config(json.loads((out / CONFIG_NAME).read_text()))
        except (OSError, ValueError):
            holds_model = False
        if holds_model:
            raise ValueError(model_folder_words(out, hints.option("init", out)))
    checkpoint = out / CHECKPOINT_NAME
    sharded = sharded_checkpoint(out)
    force_option = hints.option("force", True)
    if resume and force:
        raise ValueError(
            f"{hints.option('resume', True)} continues the run in {out} and {force_option} replaces it: pass one. "
            f"Continue: {hints.resume(out)}  or start over: {hints.start(given.fresh(), force=True)}"
        )
    used = out.is_dir() and any(p.name != LOCK_NAME for p in out.iterdir())
    if resume:
        if sharded is not None and (not checkpoint.is_file() or _newer(out / POINTER_NAME, checkpoint)):
            return {**load_trainer_state(sharded), "sharded": sharded}
        if checkpoint.is_file():
            return load_checkpoint(checkpoint)
        where = "does not exist" if not out.exists() else "holds no checkpoint" if used else "is empty"
        looked = (
            f"no sharded checkpoint: {POINTER_NAME} not found"
            if given.strategy == "fsdp"
            else f"{checkpoint.name} not found"
        )
        raise ValueError(
            f"nothing to resume: {out} {where} ({looked}); start a new run with: "
            f"{hints.start(given.fresh(), force=used)}" + moved_aside_note(out, hints)
        )
    if used and not force:
        given = given.minimal()
        if checkpoint.is_file() or sharded is not None:
            ways = f"continue the run there with: {hints.resume(out)}  or start over with: {hints.start(given, True)}"
        else:
            ways = f"start there anyway with: {hints.start(given, force=True)}"
        new = hints.start(dataclasses.replace(given, out=os.fspath(new_folder(out))))
        raise ValueError(
            f"{out} is not empty: {ways}  or use a new folder: {new}  With {force_option}, vitkit's earlier outputs "
            f"there are moved aside and kept until the new run has trained an epoch." + moved_aside_note(out, hints)
        )
    return None


def moved_aside(out: Path) -> list[Path]:
    """Earlier runs' outputs that `force` moved aside from OUT and that are still there (OUT.old-<time>, marked by
    `ASIDE_MARK` as vitkit's: a folder of the user's of such a name is not one), oldest first: a run that replaced
    them ended before finishing its first epoch."""
    out = out.resolve()
    found = out.parent.glob(f"{glob.escape(out.name)}.old-*")
    return sorted(p for p in found if p.is_dir() and (p / ASIDE_MARK).is_file())


def describe_aside(folder: Path) -> str:
    """What a folder of outputs moved aside holds, for messages: a complete run, a run stopped after some epochs,
    or one stopped in its first epoch."""
    path = folder / METRICS_NAME
    rows = [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    epochs = f"{len(rows)} epoch{'s' if len(rows) != 1 else ''}"
    if has_final(folder):
        return f"a complete run of {epochs}, its final model in {folder / 'final'}"
    if rows and (folder / "best").is_dir():
        return f"a run stopped after {epochs}, its best model in {folder / 'best'}"
    return "a run stopped in its first epoch, with no model"


def aside_list(folders: list[Path]) -> str:
    """`folders` moved aside, each with what it holds."""
    return "; ".join(f"{folder} ({describe_aside(folder)})" for folder in folders)


def moved_aside_note(out: Path, hints: RunHints) -> str:
    """For a message about OUT: where the outputs of the runs `force` replaced are, while they are kept, and what
    each holds."""
    aside = moved_aside(out)
    if not aside:
        return ""
    return (
        f" The outputs of the run{'s' if len(aside) > 1 else ''} {hints.option('force', True)} replaced in {out} are "
        f"kept until a run there trains an epoch: {aside_list(aside)}. To go back to one, move its contents into {out}."
    )


def _newer(a: Path, b: Path) -> bool:
    return a.stat().st_mtime > b.stat().st_mtime


def clear_out(out: Path, env: DistEnv) -> list[Path]:
    """Make OUT ready for a fresh run: created, with an earlier run's outputs (`OUTPUTS`) moved to a sibling
    OUT.old-<time>. Returns every folder moved aside from OUT that is still kept (this one and those of earlier runs
    `force` replaced that never trained an epoch), oldest first: the new run deletes them once it has trained an
    epoch. Other files in OUT stay."""
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
            (aside / ASIDE_MARK).write_text(f"vitkit moved the outputs of a run in {out.resolve()} here\n")
            for path in found:
                shutil.move(path, aside / path.name)
            kept = [p for p in moved_aside(out) if p != aside.resolve()]
            also = f" (kept as well: {aside_list(kept)})" if kept else ""
            log.info(
                f"moved the earlier run's outputs in {out} to {aside} ({describe_aside(aside)}); deleted once this run "
                f"finishes its first epoch{also}"
            )
        out.mkdir(parents=True, exist_ok=True)
    return moved_aside(out) if env.is_main else []


def has_final(out: Path) -> bool:
    """Whether OUT holds the final model of its run, whole (the loop writes the weights, then config.json; a run
    killed in between is resumed to write it again)."""
    final = out / "final"
    return all((final / name).is_file() for name in (WEIGHTS_NAME, CONFIG_NAME))
