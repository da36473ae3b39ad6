"""The peak memory of a run, estimated from the model's operator rows (`model.cost()`, its forward traced on meta
tensors) before anything large is allocated.

The estimate adds up the weights, the input batch, AdamW's state (and an EMA copy) for training, and the peak of
one step's own allocations: for inference the live activations (`inference_peak_bytes`), for training the
activations kept for backward, the gradients and the backward's working tensors (`training_peak`).

The training strategy changes what each process holds. Under "ddp" (and in a single process) every process holds the
whole model, its gradients and AdamW's state. Under "fsdp" (FSDP2's `fully_shard` on each of the model's
`shard_units()`, then on the root) a process of `world` keeps 1/world of every parameter, gradient and AdamW moment
(flat-sharded on dim 0, padded to a multiple of world; buffers whole), and in its step the parameters FSDP gathers
unit by unit and the full gradients of the unit in backward (`vitkit.analysis.memory.Sharding`); with bf16 those are
FSDP's mixed precision (bf16 gathered parameters and gradients, fp32 shards and reduce-scatter), so autocast makes
no weight copies.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitkit.analysis.memory import Sharding, inference_peak_bytes, training_peak
from vitkit.analysis.precision import precision_dtype
from vitkit.analysis.profile import resolve_model
from vitkit.cost.rows import numel
from vitkit.layers.helpers import to_2tuple
from vitkit.models.interface import require_model

SAFETY = 0.9  # the share of the available memory a run may plan to use; the rest is left to the allocator and OS
ADAMW_STATES = 2  # AdamW's first and second moments, one of each per trainable parameter, in its dtype
CAST_MODULES = (nn.Linear, nn.Conv2d)  # whose weights autocast copies to bf16
ATTENTION_WEIGHTS = "q@k^T"  # the operator row whose output has the shape of a layer's attention weights
STRATEGIES = ("ddp", "fsdp")  # whole model in every process (DistributedDataParallel), or FSDP2's sharding
REDUCE_DTYPE = torch.float32  # FSDP mixed precision's reduce_dtype: gradients are reduce-scattered in fp32


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
        self.model = require_model(resolve_model(model, img_size, False, overrides or {}), "a memory estimate")
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
