"""Memory preflight: a run checked against the memory the device has free before anything large is allocated.

`check_memory` refuses a run that would not fit (`vitkit.analysis.estimate`) with `NotEnoughMemory`, a ValueError
whose message gives the estimate, the memory available (`vitkit.analysis.available`) and the ways out (the largest
batch that fits, gradient checkpointing, a smaller image, FSDP over enough processes), or with `allow=True` only
warns.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import nn

from vitkit.analysis.available import available_memory
from vitkit.analysis.estimate import SAFETY, MemoryEstimate, MemoryEstimator
from vitkit.layers.helpers import to_2tuple

MAX_PROCESSES = 4096  # the most processes a refusal considers sharding over


class NotEnoughMemory(ValueError):
    """A run whose estimated peak memory exceeds the memory available; `estimate` holds the figures."""

    def __init__(self, message: str, estimate: MemoryEstimate) -> None:
        super().__init__(message)
        self.estimate = estimate


class MemoryWarning(UserWarning):
    """A run allowed to go ahead although its estimated peak memory exceeds the memory available."""


@dataclass(frozen=True)
class SettingNames:
    """How the caller's user changes each setting a refusal suggests: the library's arguments (the default), or a
    command's flags (`vitkit.cli.options.memory_flags`). None where the caller has no such setting: that way out is
    then not offered."""

    batch: str | None = "batch"  # "--batch-size" is shown as "--batch-size 12", "batch" as "batch=12"
    img_size: str | None = "img_size"
    grad_checkpointing: str | None = "grad_checkpointing=True"
    allow: str = "allow=True"  # the override
    strategy: str | None = "strategy"  # "--strategy" is shown as "--strategy fsdp", "strategy" as 'strategy="fsdp"'


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _setting(flag: str, value: object) -> str:
    return f"{flag} {value}" if flag.startswith("-") else f"{flag}={value}"


def _largest_batch(estimate_at: Callable[[int], MemoryEstimate], below: int, available: int) -> int | None:
    """The largest batch under `below` whose estimate fits in `available` bytes, or None if not even 1 does."""

    def fits(b: int) -> bool:
        return replace(estimate_at(b), available_bytes=available).fits

    if below <= 1 or not fits(1):
        return None
    low, high = 1, below - 1  # fits(low) holds
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def _fewest_processes(sharded_at: Callable[[int], MemoryEstimate], low: int, available: int) -> int | None:
    """The fewest processes from `low` to `MAX_PROCESSES` over which the FSDP estimate fits in `available` bytes, or
    None. The estimate falls with the number at first (the shards shrink) and then rises again (a parameter of few
    rows, a position table of one, is padded to one row per process and gathered from all): the first power of two
    from `low` that fits is found by doubling, then the fewest below it by bisection."""

    def fits(n: int) -> bool:
        return replace(sharded_at(n), available_bytes=available).fits

    if low > MAX_PROCESSES:
        return None
    if fits(low):
        return low
    failing = n = low
    while not fits(n := min(2 * n, MAX_PROCESSES)):
        if n == MAX_PROCESSES:
            return None
        failing = n
    while n - failing > 1:  # fits(n), not fits(failing)
        middle = (failing + n) // 2
        failing, n = (failing, middle) if fits(middle) else (middle, n)
    return n


def _sharding_way_out(
    e: MemoryEstimate, sharded_at: Callable[[int], MemoryEstimate], available: int, flag: str
) -> str | None:
    """FSDP as a way out for a training run: over the run's own processes when that fits, else over the fewest that
    fit. The processes of one machine share a CPU's memory, each with its own activations: there sharding helps
    through the processes already on the machine, and more processes go on other machines."""
    p, run_world = e.processes, max(e.world, e.processes)
    fewest = _fewest_processes(sharded_at, max(2, p), available)
    if fewest is None or (e.sharded and fewest <= e.world):
        return None
    sharded = sharded_at(max(fewest, run_world))
    each = f"about {_size(sharded.total_bytes)} each"
    if p > 1:
        each += f", {_size(p * sharded.total_bytes)} on this machine"
    if e.sharded:
        return f"fsdp over {fewest} or more processes ({each})"
    choice = f"{flag} fsdp" if flag.startswith("-") else f'{flag}="fsdp"'
    if fewest <= run_world:
        return f"{choice} (over the run's {run_world} processes: {each})"
    if not e.device.startswith("cpu"):
        return f"{choice} with {fewest} or more processes ({each})"
    if fewest * sharded_at(fewest).needed_bytes <= SAFETY * available:
        return f"{choice} with {fewest} or more processes, on this machine too ({each})"
    per_machine = "one" if p == 1 else f"at most {p}"
    return (
        f"{choice} with {fewest} or more processes, {per_machine} per machine ({each}; more processes on this "
        "machine do not help, as each holds its own activations)"
    )


def refusal(
    estimate: MemoryEstimate,
    estimate_at: Callable[[int], MemoryEstimate],
    names: SettingNames,
    checkpointed_at: Callable[[int], MemoryEstimate] | None = None,
    smaller: Callable[[], MemoryEstimate] | None = None,
    sharded_at: Callable[[int], MemoryEstimate] | None = None,
) -> str:
    """The one-paragraph message for an estimate that does not fit: the figures (per process under fsdp) and the
    ways out.

    Args:
        estimate: the run's estimate, with `available_bytes`.
        estimate_at: the same run's estimate at another batch size.
        names: how the user changes each setting.
        checkpointed_at: the run's estimate with gradient checkpointing at a batch size, when it can be enabled.
        smaller: the run's estimate at a smaller image size (the model's own), when the run's is larger.
        sharded_at: the run's estimate (at its batch) under fsdp over a number of processes, when it trains.
    """
    e, available = estimate, estimate.available_bytes or 0
    H, W = e.img_size
    run = f"{e.model} {'training' if e.training else 'inference'} at batch {e.batch}, {H}x{W}, {e.precision}" + (
        ", gradient checkpointing" if e.grad_checkpointing else ""
    )
    shards = " shards" if e.sharded else ""
    parts = [f"{'weight shards' if e.sharded else 'weights'} {_size(e.weights_bytes)}"]
    if e.optimizer_bytes:
        parts.append(f"optimizer state{shards} {_size(e.optimizer_bytes)}")
    step = "activations, gradients and backward" if e.training else "activations"
    gathered = f" (gathered units {_size(e.gathered_bytes)})" if e.sharded else ""
    parts.append(f"{step} {_size(e.step_bytes)}{gathered}")
    parts.append(f"input {_size(e.input_bytes)}")
    resident = f", {_size(e.resident_bytes)} of it already loaded" if e.resident_bytes else ""
    shared = ""
    if e.processes > 1:
        together = _size(e.processes * e.needed_bytes)
        where = f", {e.processes} of them" if e.sharded else f" in each of {e.processes} processes"
        shared = f"{where} on this machine, {together} more in all"
    if e.sharded:
        run += f", fsdp over {e.world} processes"
    per_process = " per process" if e.sharded else ""
    message = (
        f"{run} needs about {_size(e.total_bytes)} of {e.device} memory{per_process} ({', '.join(parts)}{resident})"
        f"{shared}, but only {_size(available)} is available and a run may plan to use {SAFETY:.0%} of it."
    )
    ways = []
    if names.batch is not None:
        largest = _largest_batch(estimate_at, e.batch, available)
        if largest is not None:
            ways.append(f"{_setting(names.batch, largest)} (the largest batch that fits)")
    if checkpointed_at is not None and names.grad_checkpointing is not None:
        with_checkpoints = replace(checkpointed_at(e.batch), available_bytes=available)
        if with_checkpoints.fits:
            each = " a process" if e.processes > 1 or e.sharded else " in all"
            ways.append(f"{names.grad_checkpointing} (about {_size(with_checkpoints.total_bytes)}{each})")
        elif names.batch is not None and (largest := _largest_batch(checkpointed_at, e.batch, available)):
            ways.append(f"{names.grad_checkpointing} with {_setting(names.batch, largest)}")
    if names.img_size is not None:
        own = replace(smaller(), available_bytes=available) if smaller is not None else None
        if own is not None and own.fits:
            h, w = own.img_size
            ways.append(f"{_setting(names.img_size, h if h == w else f'{h}x{w}')} (the model's own size)")
        else:
            ways.append(f"a smaller {names.img_size} (activations grow with the pixel count)")
    if sharded_at is not None and e.training and names.strategy is not None:
        way = _sharding_way_out(e, sharded_at, available, names.strategy)
        if way is not None:
            ways.append(way)
    if ways:
        message += " Ways out: " + "; ".join(ways) + "."
    return message


def enforce(
    estimate_at: Callable[[int], MemoryEstimate],
    batch: int,
    *,
    allow: bool = False,
    names: SettingNames = SettingNames(),
    checkpointed_at: Callable[[int], MemoryEstimate] | None = None,
    smaller: Callable[[], MemoryEstimate] | None = None,
    sharded_at: Callable[[int], MemoryEstimate] | None = None,
) -> MemoryEstimate:
    """The estimate at `batch` with the memory now available on its device; `NotEnoughMemory` when it does not fit
    (a `MemoryWarning` instead with `allow`). For callers whose run is more than one model (`vitkit bench`):
    `estimate_at(batch)` is the whole run's estimate; the other arguments as `refusal`'s."""
    estimate = estimate_at(batch)
    estimate = replace(estimate, available_bytes=available_memory(estimate.device))
    if estimate.fits:
        return estimate
    message = refusal(estimate, estimate_at, names, checkpointed_at, smaller, sharded_at)
    if allow:
        warnings.warn(f"{message} Running anyway ({names.allow}).", MemoryWarning, stacklevel=2)
        return estimate
    raise NotEnoughMemory(f"{message} To run anyway, pass {names.allow}.", estimate)


def check_memory(
    model: nn.Module | str,
    img_size: int | tuple[int, int] | None,
    batch: int,
    *,
    training: bool,
    precision: str = "fp32",
    grad_checkpointing: bool = False,
    ema: bool = False,
    device: torch.device | str = "cpu",
    allow: bool = False,
    names: SettingNames = SettingNames(),
    overrides: dict[str, Any] | None = None,
    capture_attention: bool = False,
    processes: int = 1,
    strategy: str = "ddp",
    world: int = 1,
) -> MemoryEstimate:
    """Estimate the run's peak memory (`estimate_memory`, same arguments) and compare it with what `device` has
    available (`available_memory`); call it before allocating the batch. `processes`: how many processes on this
    machine run the same thing at once and share that memory (torchrun's `LOCAL_WORLD_SIZE` on CPU); together they
    must fit. `strategy` and `world` (torchrun's `WORLD_SIZE`): as `estimate_memory`'s; under fsdp the figures are
    each process's share.

    Returns the estimate, `available_bytes` filled in. Raises `NotEnoughMemory` (a ValueError) when the memory
    still to allocate exceeds `SAFETY` of what is available; its message gives the estimate, the memory available
    and the ways out: the largest batch that fits, gradient checkpointing (training), a smaller image, fsdp over
    enough processes (training, when `names.strategy` is set), and the override. With `allow=True` it warns
    (`MemoryWarning`) instead. `names` says how the caller's user changes each setting
    (`vitkit.cli.options.memory_flags` for a command). When the available memory cannot be read, nothing is
    refused.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    at = MemoryEstimator(
        model,
        img_size,
        training=training,
        precision=precision,
        grad_checkpointing=grad_checkpointing,
        ema=ema,
        device=device,
        overrides=overrides,
        capture_attention=capture_attention,
        processes=processes,
        strategy=strategy,
        world=world,
    )
    checkpointed_at = at.variant(grad_checkpointing=True) if training and not grad_checkpointing else None
    own = to_2tuple(at.model.config.img_size)
    smaller = partial(at.variant(img_size=own), batch) if own[0] * own[1] < at.size[0] * at.size[1] else None

    def sharded_at(n: int) -> MemoryEstimate:
        return at.variant(strategy="fsdp", world=n)(batch)

    return enforce(
        at,
        batch,
        allow=allow,
        names=names,
        checkpointed_at=checkpointed_at,
        smaller=smaller,
        sharded_at=sharded_at if training else None,
    )
