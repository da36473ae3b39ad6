"""Memory preflight: the peak memory of a run, estimated from the analytic costs before anything large is allocated,
checked against the memory the device has free.

The estimate adds up the weights, the input batch, AdamW's state (and an EMA copy) for training, and the peak of
one step's own allocations: for inference the live activations (`inference_peak_bytes`), for training the
activations kept for backward, the gradients and the backward's working tensors (`training_peak`). It needs
only the operator lists of `cost()`, no forward pass, so it is cheap at any size.

The training strategy changes what each process holds. Under "ddp" (and in a single process) every process holds the
whole model, its gradients and AdamW's state. Under "fsdp" (FSDP2's `fully_shard` on each of the model's
`shard_units()`, then on the root) a process of `world` keeps 1/world of every parameter, gradient and AdamW moment
(flat-sharded on dim 0, padded to a multiple of world; buffers whole), and in its step the parameters FSDP gathers
unit by unit and the full gradients of the unit in backward (`vitkit.analysis.memory.Sharding`); with bf16 those are
FSDP's mixed precision (bf16 gathered parameters and gradients, fp32 shards and reduce-scatter), so autocast makes
no weight copies.

`check_memory` refuses a run that would not fit with `NotEnoughMemory`, a ValueError whose message gives the
estimate, the memory available and the ways out (the largest batch that fits, gradient checkpointing, a smaller
image, FSDP over enough processes), or with `allow=True` only warns.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitkit.analysis.memory import Sharding, inference_peak_bytes, training_peak
from vitkit.analysis.precision import precision_dtype
from vitkit.analysis.profile import _resolve
from vitkit.cost.rows import numel
from vitkit.layers.helpers import to_2tuple
from vitkit.models.interface import require_model

SAFETY = 0.9  # the share of the available memory a run may plan to use; the rest is left to the allocator and OS
ADAMW_STATES = 2  # AdamW's first and second moments, one of each per trainable parameter, in its dtype
CAST_MODULES = (nn.Linear, nn.Conv2d)  # whose weights autocast copies to bf16
ATTENTION_WEIGHTS = "q@k^T"  # the operator row whose output has the shape of a layer's attention weights
NO_LIMIT = 1 << 60  # a cgroup limit at or above this is "max"
MEMINFO = Path("/proc/meminfo")  # MemAvailable: what the kernel can give new allocations
CGROUP_ROOT = Path("/sys/fs/cgroup")  # where the cgroup hierarchies are mounted
SELF_CGROUP = Path("/proc/self/cgroup")  # this process's cgroups, one "id:controllers:path" line per hierarchy
STRATEGIES = ("ddp", "fsdp")  # whole model in every process (DistributedDataParallel), or FSDP2's sharding
REDUCE_DTYPE = torch.float32  # FSDP mixed precision's reduce_dtype: gradients are reduce-scattered in fp32
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


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak memory of a run, in bytes, and what the device had available when checked."""

    model: str  # registry name or class name
    img_size: tuple[int, int]  # (H, W)
    batch: int
    training: bool  # a training step (forward, backward, AdamW) or an inference forward
    precision: str  # "fp32", or "bf16" (bfloat16 activations: autocast, or `optimize("bf16")`)
    grad_checkpointing: bool
    device: str  # "cpu", "cuda", "cuda:1"
    weights_bytes: int  # parameters and buffers
    optimizer_bytes: int  # AdamW's two moments per trainable parameter, and the EMA copy (training)
    input_bytes: int  # the batch of images (fp32)
    step_bytes: int  # peak of one step's own allocations: activations, bf16 weight copies, gradients, backward work
    resident_bytes: int = 0  # of the weights, what is already allocated on the device (a built model's)
    available_bytes: int | None = None  # free memory on the device when checked; None: unknown, or not checked
    processes: int = 1  # processes on this machine each running this (torchrun on CPU), sharing its memory
    strategy: str = "ddp"  # "ddp": each process holds the whole model; "fsdp": FSDP2 shards it over `world`
    world: int = 1  # processes of the whole run (every machine); fsdp shards over all of them
    gradient_bytes: int = 0  # of step_bytes: the gradients alive at the step's peak (training)
    gathered_bytes: int = 0  # of step_bytes: FSDP's gathered parameters and reduce-scatter buffers at that peak

    @property
    def sharded(self) -> bool:
        """Whether the figures are one process's share of a model sharded by FSDP (fsdp over more than one)."""
        return self.strategy == "fsdp" and self.world > 1

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.optimizer_bytes + self.input_bytes + self.step_bytes

    @property
    def needed_bytes(self) -> int:
        """What the run still has to allocate: the total less what is already resident."""
        return self.total_bytes - self.resident_bytes

    @property
    def fits(self) -> bool:
        """Whether the run (all its `processes`) needs at most `SAFETY` of the available memory (True when that is
        unknown)."""
        return self.available_bytes is None or self.processes * self.needed_bytes <= SAFETY * self.available_bytes


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2 without a limit) reads as None


def _inactive_file(stat: Path) -> int:
    """Reclaimable page cache in a cgroup's memory.stat, which its usage figure includes."""
    try:
        fields = dict(line.split(" ", 1) for line in stat.read_text().splitlines() if " " in line)
        # v1's usage counts the cgroups below too, as its total_ figure does
        return int(fields.get("total_inactive_file", fields.get("inactive_file", 0)))
    except (OSError, ValueError):
        return 0


def _cgroup_free() -> int | None:
    """Room left under the memory limit of this process's cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes`),
    the reclaimable page cache counted as free; None when no limit is set."""
    try:
        groups = SELF_CGROUP.read_text().splitlines()
    except OSError:
        groups = []
    own = {"v2": "", "v1": ""}
    for line in groups:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            own["v2"] = path.lstrip("/")
        elif "memory" in controllers.split(","):
            own["v1"] = path.lstrip("/")
    root = CGROUP_ROOT
    candidates = [
        (root / own["v2"], "memory.max", "memory.current"),
        (root, "memory.max", "memory.current"),
        (root / "memory" / own["v1"], "memory.limit_in_bytes", "memory.usage_in_bytes"),
        (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ]
    free = []
    for directory, limit_file, usage_file in candidates:
        limit, usage = _read_int(directory / limit_file), _read_int(directory / usage_file)
        if limit is not None and usage is not None and limit < NO_LIMIT:
            free.append(max(limit - usage + _inactive_file(directory / "memory.stat"), 0))
    return min(free) if free else None


def _mem_available() -> int | None:
    """The kernel's estimate of memory available to new allocations (/proc/meminfo MemAvailable), or the free
    physical pages where there is no /proc."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation can still get on `device`, or None when that cannot be read.

    CPU: the system's MemAvailable, lowered to the room under this process's cgroup limit when there is one.
    CUDA: the device's free memory (`torch.cuda.mem_get_info`) plus what torch's caching allocator holds unused.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    figures = [f for f in (_mem_available(), _cgroup_free()) if f is not None]
    return min(figures) if figures else None


def _owner(name: str, modules: list[str]) -> str | None:
    """The operator module a parameter belongs to: the longest one its name lies in (None for a parameter no
    operator names, such as a class token: its gradient is counted with the first operator's)."""
    best = None
    for m in modules:
        if (name == m or name.startswith(m + ".")) and (best is None or len(m) > len(best)):
            best = m
    return best


@contextmanager
def _mode(model: nn.Module, training: bool) -> Iterator[nn.Module]:
    """The model in training or eval mode for the block (what its `cost()` lists depends on it: dropout runs only in
    training), every module's own mode restored after."""
    modes = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield model
    finally:
        for m, mode in modes:
            m.training = mode


def _checkpointed_blocks(model: nn.Module) -> list[str]:
    """Names of the modules `set_grad_checkpointing(True)` checkpoints, the model left as it was: each gets its
    `forward` rebound on the instance (`vitkit.models.interface.checkpoint_blocks`)."""
    before = {name for name, m in model.named_modules() if "forward" in m.__dict__}
    model.set_grad_checkpointing(True)
    names = [name for name, m in model.named_modules() if "forward" in m.__dict__]
    if not before:
        model.set_grad_checkpointing(False)
    return names


def _rows(p: torch.Tensor) -> tuple[int, int]:
    """(rows on dim 0, elements per row): how FSDP splits a parameter (a scalar as one row)."""
    rows = p.shape[0] if p.dim() > 0 else 1
    return rows, (p.numel() // rows if rows else 0)


class MemoryEstimator:
    """`MemoryEstimate`s of one model and setting at any batch size (call it with the batch); the per-parameter
    figures are worked out once. The arguments are `estimate_memory`'s."""

    def __init__(
        self,
        model: nn.Module | str,
        img_size: int | tuple[int, int] | None = None,
        *,
        training: bool,
        precision: str = "fp32",
        grad_checkpointing: bool = False,
        ema: bool = False,
        device: torch.device | str = "cpu",
        overrides: dict[str, Any] | None = None,
        capture_attention: bool = False,
        name: str | None = None,
        processes: int = 1,
        strategy: str = "ddp",
        world: int = 1,
    ) -> None:
        dtype = precision_dtype(precision)  # what the activations are (bf16: autocast)
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        _check_strategy(strategy, world, processes, training)
        self.name = name or (model if isinstance(model, str) else type(model).__name__)
        self.processes, self.strategy, self.world = processes, strategy, world
        self.model = require_model(_resolve(model, img_size, False, overrides or {}), "a memory estimate")
        self.size = to_2tuple(img_size if img_size is not None else self.model.config.img_size)
        self.training, self.precision, self.ema = training, precision, ema
        self.capture = capture_attention and not training
        self.grad_checkpointing = grad_checkpointing and training
        self.device = torch.device(device)
        self.dtype = dtype
        self.buffers = sum(b.numel() * b.element_size() for b in {id(b): b for b in self.model.buffers()}.values())
        tensors = {id(t): t for t in (*self.model.parameters(), *self.model.buffers())}.values()
        self.whole = sum(t.numel() * t.element_size() for t in tensors)
        self.loaded = sum(
            t.numel() * t.element_size()
            for t in tensors
            if t.device.type == self.device.type and (self.device.index is None or t.device == self.device)
        )
        with _mode(self.model, training):
            # the operators' modules, which the batch does not change (two: training BatchNorm refuses one value per
            # channel, as at a 1x1 map)
            ops = self.model.cost(self.size, 2, self.dtype, self.device)
        self.first_module = ops[0].module
        modules = sorted({op.module for op in ops})
        names = {id(m): n for n, m in self.model.named_modules()}
        self.units = tuple(names[id(u)] for u in self.model.shard_units()) if training else ()
        # (parameter, its operator module, its shard unit ("" for the root), whether it trains), each once
        self.params = [
            (p, _owner(n, modules) or self.first_module, _unit(n, self.units), training and p.requires_grad)
            for n, p in self.model.named_parameters()
        ]
        self.blocks = _checkpointed_blocks(self.model) if self.grad_checkpointing else []
        self._ops: dict[int, list[Any]] = {}  # batch -> the model's operators at that batch
        self._hold()

    def _hold(self) -> None:
        """What each process holds under the strategy: its weights, optimizer state, the gradients each operator
        module's backward makes and autocast's weight copies, and under fsdp the `Sharding`."""
        self.sharding = None
        self.grads: dict[str, int] = {}  # operator module -> bytes of its parameters' gradients
        self.copies: dict[str, int] = {}  # operator module -> bytes of autocast's copies of its weights
        if self.strategy == "fsdp" and self.world > 1:
            self._hold_sharded()
        else:
            self.weights, self.resident = self.whole, self.loaded
            self.optimizer = ADAMW_STATES * sum(
                p.numel() * p.element_size() for p, _, _, trains in self.params if trains
            )
            for p, module, _, trains in self.params:
                if trains:
                    self.grads[module] = self.grads.get(module, 0) + p.numel() * p.element_size()
            if self.dtype != torch.float32:
                cast = {id(p) for m in self.model.modules() if isinstance(m, CAST_MODULES) for p in m.parameters()}
                for p, module, _, _ in self.params:
                    if id(p) in cast and p.dtype != self.dtype:
                        self.copies[module] = self.copies.get(module, 0) + p.numel() * self.dtype.itemsize
        self.optimizer += self.weights if self.ema and self.training else 0

    def _hold_sharded(self) -> None:
        """FSDP2 over `world` processes: each parameter split on dim 0 into world chunks of ceil(rows / world)
        rows (the last ones padded), of which a process keeps one, with a gradient and AdamW's moments of the same
        size; gathered in the compute dtype (bf16 under mixed precision), reduce-scattered in fp32."""
        world, mixed = self.world, self.dtype != torch.float32
        gathered: dict[str, int] = {}
        reduce_input: dict[str, int] = {}
        grad_shards: dict[str, int] = {}
        weights = optimizer = 0
        for p, module, unit, trains in self.params:
            rows, row = _rows(p)
            shard = math.ceil(rows / world) * row  # elements per process, padded
            compute = self.dtype if mixed and p.dtype.is_floating_point else p.dtype
            weights += shard * p.element_size()
            gathered[unit] = gathered.get(unit, 0) + world * shard * compute.itemsize
            if trains:
                optimizer += ADAMW_STATES * shard * p.element_size()
                reduce = REDUCE_DTYPE if mixed else p.dtype
                reduce_input[unit] = reduce_input.get(unit, 0) + world * shard * reduce.itemsize
                grad_shards[unit] = grad_shards.get(unit, 0) + shard * p.element_size()
                self.grads[module] = self.grads.get(module, 0) + p.numel() * compute.itemsize
        self.weights = weights + self.buffers
        self.resident = min(self.loaded, self.weights)  # the whole model built here gives way to its shard
        self.optimizer = optimizer
        self.sharding = Sharding(self.units, gathered, reduce_input, grad_shards)

    def __call__(self, batch: int) -> MemoryEstimate:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if batch not in self._ops:
            with _mode(self.model, self.training):
                self._ops[batch] = self.model.cost(self.size, batch, self.dtype, self.device)
        ops = self._ops[batch]
        gradients = gathered = 0
        if self.training:
            peak = training_peak(ops, self.grads, self.copies, self.blocks, self.sharding)
            step, gradients, gathered = peak.total, peak.gradients, peak.gathered
        else:
            # capturing keeps each layer's detached weights (B, h, Nq, Nk), in fp32, to the end of the pass
            captured = {i: numel(op.out_shape) * 4 for i, op in enumerate(ops) if op.op == ATTENTION_WEIGHTS}
            step = inference_peak_bytes(ops, captured if self.capture else None) + sum(self.copies.values())
        return MemoryEstimate(
            model=self.name,
            img_size=self.size,
            batch=batch,
            training=self.training,
            precision=self.precision,
            grad_checkpointing=self.grad_checkpointing,
            device=str(self.device),
            weights_bytes=self.weights,
            optimizer_bytes=self.optimizer,
            input_bytes=batch * self.model.config.in_chans * self.size[0] * self.size[1] * 4,
            step_bytes=step,
            resident_bytes=self.resident,
            processes=self.processes,
            strategy=self.strategy,
            world=self.world,
            gradient_bytes=gradients,
            gathered_bytes=gathered,
        )

    def variant(
        self,
        img_size: tuple[int, int] | None = None,
        grad_checkpointing: bool | None = None,
        strategy: str | None = None,
        world: int | None = None,
    ) -> MemoryEstimator:
        """The same run at another image size, with gradient checkpointing switched, or under another strategy or
        world size."""
        strategy, world = strategy or self.strategy, world or self.world
        if (img_size is None or img_size == self.size) and grad_checkpointing in (None, self.grad_checkpointing):
            _check_strategy(strategy, world, self.processes, self.training)
            other = copy.copy(self)  # the operators and parameter records are the same: only what is held changes
            other.strategy, other.world = strategy, world
            other._hold()
            return other
        return MemoryEstimator(
            self.model,
            img_size or self.size,
            training=self.training,
            precision=self.precision,
            grad_checkpointing=self.grad_checkpointing if grad_checkpointing is None else grad_checkpointing,
            ema=self.ema,
            device=self.device,
            capture_attention=self.capture,
            name=self.name,
            processes=self.processes,
            strategy=strategy,
            world=world,
        )


def _check_strategy(strategy: str, world: int, processes: int, training: bool) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if strategy == "fsdp" and not training:
        raise ValueError("strategy 'fsdp' is a training strategy; estimate inference with the default 'ddp'")
    if strategy == "fsdp" and processes > world:
        raise ValueError(f"processes on this machine ({processes}) cannot exceed the processes of the run ({world})")


def _unit(name: str, units: tuple[str, ...]) -> str:
    """The shard unit a parameter lies in, or "" for the root's."""
    return next((u for u in units if name.startswith(u + ".")), "")


def estimate_memory(
    model: nn.Module | str,
    img_size: int | tuple[int, int] | None,
    batch: int,
    *,
    training: bool,
    precision: str = "fp32",
    grad_checkpointing: bool = False,
    ema: bool = False,
    device: torch.device | str = "cpu",
    overrides: dict[str, Any] | None = None,
    capture_attention: bool = False,
    strategy: str = "ddp",
    world: int = 1,
) -> MemoryEstimate:
    """The estimated peak memory of a run, from the model's operator lists (no forward pass; `available_bytes` is
    left None).

    Args:
        model: a vitkit model or a registry name (built on the meta device, so nothing is allocated).
        img_size: input size, an int or (H, W); None: the model's.
        batch: images per step.
        training: a training step as `vitkit train` runs it (forward, zero_grad, backward, AdamW), else an
            inference forward.
        precision: "fp32", or "bf16": bfloat16 activations, with bfloat16 copies of the linear and convolution
            weights beside the fp32 ones (autocast's, or `optimize("bf16")`'s model beside the original).
        grad_checkpointing: training recomputes each block in backward (`set_grad_checkpointing`).
        ema: training keeps an exponential moving average of the weights (a second copy).
        device: where the run allocates; a built model's weights already there are counted as resident.
        overrides: config fields for a model given by name, e.g. ``{"attn_backend": "math"}``.
        capture_attention: inference inside `vitkit.capture_attention` (every layer): the attention weights of
            all layers are kept until the pass ends.
        strategy: how a training run spreads over its processes: "ddp" (each holds the whole model) or "fsdp"
            (FSDP2 shards parameters, gradients and optimizer state over `world`; the figures are then one
            process's, see the module docstring). One process (world 1) holds the whole model either way.
        world: processes of the run, on every machine.
    """
    estimator = MemoryEstimator(
        model,
        img_size,
        training=training,
        precision=precision,
        grad_checkpointing=grad_checkpointing,
        ema=ema,
        device=device,
        overrides=overrides,
        capture_attention=capture_attention,
        strategy=strategy,
        world=world,
    )
    return estimator(batch)


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
