"""Settling what a run trains before it starts: its configuration resolved, and for a resumed run the checkpoint it
continues and the check that the settings given continue it (`resolve_run`).

Resuming needs the settings the checkpoint was written with, except the output folder and `RESUME_MAY_CHANGE`:
loader workers, device, gradient checkpointing (none changes the model, the data or the arithmetic of a step) and a
larger number of epochs (see `vitkit.train.loop` for the schedule of a longer run).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from vitkit.analysis.precision import AUTO, PRECISIONS, resolve_precision
from vitkit.data import data_gone
from vitkit.train.config import CONFIG_NAME, TrainConfig, absolute_data
from vitkit.train.distributed import DistEnv, broadcast_object
from vitkit.train.outputs import RunHints, check_out, new_folder
from vitkit.train.sharding import resharded_batch
from vitkit.weights.hub import is_hub

log = logging.getLogger("vitkit.train")

# Options a resumed run may set differently: none changes the model, the data or a step's arithmetic. `epochs` may
# only grow (the schedule is recomputed over the new total). The output folder is where the run is found, whatever
# its config.json holds.
RESUME_MAY_CHANGE = ("epochs", "workers", "device", "grad_checkpointing")


def resolve_run(
    given: TrainConfig, env: DistEnv, resume: bool, force: bool, hints: RunHints
) -> tuple[TrainConfig, dict[str, Any] | None]:
    """(the resolved configuration on this process's device, the checkpoint to resume from or None for a fresh run);
    the options given that the run does not use are logged as warnings. ValueError, with the ways on worded by
    `hints`, when OUT does not hold what `resume` / `force` expect (`vitkit.train.outputs.check_out`), or the
    settings differ from the checkpoint's beyond `RESUME_MAY_CHANGE`."""
    original, original_precision = given.init, given.precision
    if given.precision == AUTO:  # measured by rank 0 only: every process must run the same precision
        chosen = resolve_precision(AUTO, env.device) if env.is_main else None
        given = dataclasses.replace(given, precision=broadcast_object(chosen, env))
    typed = getattr(given, "_given", frozenset())  # the options given beside the saved ones (`for_resume`)
    if resume and "data" not in typed and data_gone(given.data):  # the saved data, moved since
        raise ValueError(
            f"the run in {given.out} trained on {given.data}, which is gone (moved or deleted): put it back, or give "
            f"its new place to resume with ({hints.option('data')})"
        )
    if resume and given.init is not None and (is_hub(given.init) or not Path(given.init).exists()):
        given = _init_stand_in(given, env)  # a Hub repository is not looked up again: its commit may have moved
    config = dataclasses.replace(given.resolved(), device=env.device.type)
    if env.is_main:
        for message in given.ignored():
            log.warning(message)
        if config.warmup_epochs >= config.epochs:  # the schedule's peak at the run's end: no annealing at all
            log.warning(
                f"{hints.option('warmup_epochs', config.warmup_epochs)} is not shorter than the run's "
                f"{config.epochs} epoch{'s' if config.epochs != 1 else ''}: the learning rate rises the whole run "
                f"and never anneals, and the model ends at its peak rate; warm up for a part of the run"
            )
    state = check_out(Path(config.out), resume, force, given, hints)
    if state is not None:
        compared = config if given.init == original else dataclasses.replace(config, init=_absolute(original))
        saved = json.loads(state["config"])
        if original_precision == AUTO and saved.get("precision") in PRECISIONS:  # as the run measured when it began
            config = dataclasses.replace(config, precision=saved["precision"])
            compared = dataclasses.replace(compared, precision=saved["precision"])
        check_resume(saved, compared, given, hints)
        if "sharded" in state and state["world_size"] != env.world_size:  # keep the global batch
            batch = resharded_batch(config.batch_size, state["world_size"], env.world_size)
            if env.is_main and batch != config.batch_size:
                log.info(
                    f"the run had {state['world_size']} processes of batch {config.batch_size}; each of the "
                    f"{env.world_size} now takes {batch}, the same global batch"
                )
            config = dataclasses.replace(config, batch_size=batch)
    return config, state


def check_resume(saved: dict[str, Any], config: TrainConfig, given: TrainConfig, hints: RunHints) -> None:
    """ValueError unless the resolved `config` continues the run whose resolved settings the checkpoint saved:
    only `RESUME_MAY_CHANGE` may differ, and epochs only grow. A setting the run does not use (a `val_fraction`
    resolved to None) cannot differ. `given`: the configuration as the caller gave it, for the ways on (worded by
    `hints`)."""
    moved = {"data"} if data_gone(saved.get("data")) else set()  # moved: its new place (the classes are checked)
    saved, current = _comparable(saved), _comparable(config.to_dict())
    unused = {"val_fraction"} if current.get("val_fraction") is None else set()
    unused |= moved
    changed = sorted(k for k in current if k not in (*RESUME_MAY_CHANGE, "out", *unused) and saved.get(k) != current[k])
    out = config.out
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in changed)
        fresh = hints.start(dataclasses.replace(given.fresh(), out=os.fspath(new_folder(Path(out)))))
        raise ValueError(
            f"cannot resume the run in {out} with different settings ({details}); only "
            f"{', '.join(map(hints.option, RESUME_MAY_CHANGE))} may change. Continue it with its own settings: "
            f"{hints.resume(out)}  or train the new settings in a new folder: {fresh}"
        )
    if saved.get("epochs") is not None and config.epochs < saved["epochs"]:
        raise ValueError(
            f"the run in {out} trains {saved['epochs']} epochs and resuming can extend it, not shorten it (epochs "
            f"{config.epochs}); continue it with: {hints.resume(out)}  (its best model so far is in {out}/best)"
        )


def _comparable(values: dict[str, Any]) -> dict[str, Any]:
    """Resolved settings as a resumed run compares them: a data or init path made absolute."""
    values = dict(values)
    values["tile"] = values.get("tile") or None  # 0 and None both train on whole images
    if isinstance(values.get("data"), str):
        values["data"] = absolute_data(values["data"])
    if isinstance(values.get("init"), str):
        values["init"] = _absolute(values["init"])
    return values


def _absolute(init: str) -> str:
    """An init path made absolute; a Hub repository as it is."""
    return init if is_hub(init) else os.path.abspath(init)


def _init_stand_in(given: TrainConfig, env: DistEnv) -> TrainConfig:
    """`given` with `init` replaced by the run's own final/ or best/ model when the model it started from is gone,
    or is a Hub repository (not downloaded again, nor looked up: its branch may point elsewhere by now): a resumed
    run takes only the architecture from `init` (the checkpoint holds every weight), and the run's saved models
    have that architecture, and record the commit the run started from. `given` as it is when the run has saved
    no model yet."""
    out = Path(given.out)
    stand_in = next((d for d in (out / "final", out / "best") if (d / CONFIG_NAME).is_file()), None)
    if stand_in is None:
        return given
    if env.is_main:
        why = "a Hub repository, is not looked up again" if is_hub(given.init) else "is gone"
        log.info(
            f"the model this run started from, {given.init}, {why}: its architecture is read from {stand_in} "
            "instead (the checkpoint holds the weights)"
        )
    return dataclasses.replace(given, init=os.fspath(stand_in))
