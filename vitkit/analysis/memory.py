"""Activation memory: estimated from a forward's operator rows (`vitkit.cost.tracer`), and measured at the
dispatcher.

`inference_peak_bytes`, `training_peak_bytes` and `saved_for_backward_bytes` are the one place that turns the
operator rows of a model's `cost()` into memory: which tensors are alive together, and which ones training
keeps, by the lifetime rules written at the top of `vitkit.cost.rows`.

Under FSDP (`Sharding`) a training step also holds, beside the activations, the parameters FSDP2 gathers unit by
unit and the full gradients of the unit in backward until they are reduce-scattered; `training_peak` walks the same
operators with them.

torch reports peak memory only for CUDA (`torch.cuda.max_memory_allocated`). `PeakMemory` watches every tensor that
an operator returns while it is active, counts the bytes of each storage once, and subtracts them when the last
tensor using that storage is freed; its `peak` is the largest total seen. Tensors that existed before (weights,
the input) are not counted, so the figure is the extra memory a forward (or training step) needs.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vitkit.cost.rows import OpCost, Storage


def _has_storage(t: Any) -> bool:
    # meta tensors take no memory; opaque layouts (oneDNN's reordered weights, sparse) expose no storage
    return isinstance(t, torch.Tensor) and t.device.type != "meta" and t.layout == torch.strided


class PeakMemory(TorchDispatchMode):
    """Context manager: `with PeakMemory() as mem: fn()`, then `mem.peak` (bytes) and `mem.current`."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._refs: dict[int, int] = {}  # storage address -> number of live tensors created here that use it
        self._sizes: dict[int, int] = {}  # storage address -> bytes

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.current -= self._sizes.pop(key)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if _has_storage(t)}
        for t in tree_flatten(out)[0]:
            if not _has_storage(t):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or (key in inputs and key not in self._refs):
                continue  # a view of, or an in-place result on, a tensor that existed before
            if key not in self._refs:
                self._refs[key] = 0
                self._sizes[key] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            self._refs[key] += 1
            weakref.finalize(t, self._release, key)
        return out


def _release(ops: Sequence[OpCost]) -> dict[Storage, tuple[int, int]]:
    """(first, last) op index between which each storage the ops write is alive, by the lifetime rules of
    `vitkit.cost.rows`: from its writer to its last reader, to the end of the module it was handed to, to the end
    for the result."""
    path = [tuple(op.module.split(".")) if op.module else () for op in ops]
    # call_end[i][n]: the last op of the call of module path[i][:n] that op i runs in (the run of ops under it from
    # i on): a module called several times (a decoder's shared final norm) lets go of each call's input at that
    # call's end
    call_end: list[list[int]] = [[] for _ in ops]
    for i in range(len(ops) - 1, -1, -1):
        parts = path[i]
        after = path[i + 1] if i + 1 < len(ops) else None
        call_end[i] = [
            call_end[i + 1][n] if after is not None and after[:n] == parts[:n] and n < len(call_end[i + 1]) else i
            for n in range(len(parts) + 1)
        ]
    span: dict[Storage, tuple[int, int]] = {}
    made_in: dict[Storage, tuple[str, ...]] = {}
    for i, op in enumerate(ops):
        for x in op.inputs:
            if x.storage not in span:
                continue  # a tensor from before (the input image, weights)
            maker, reader = made_in[x.storage], path[i]
            common = 0
            while common < min(len(maker), len(reader)) and maker[common] == reader[common]:
                common += 1
            end = call_end[i][common + 1] if len(reader) > common else i
            span[x.storage] = (span[x.storage][0], max(span[x.storage][1], end))
        out = op.output.storage
        if out not in span and out.nbytes > 0 and op.out_bytes > 0:
            span[out] = (i, i)
            made_in[out] = path[i]
    if ops and ops[-1].output.storage in span:
        span[ops[-1].output.storage] = (span[ops[-1].output.storage][0], len(ops) - 1)
    return span


def inference_peak_bytes(ops: Sequence[OpCost], retained: Mapping[int, int] | None = None) -> int:
    """Peak activation bytes alive at once while the operators run without grad (see `_release` for lifetimes).

    `retained`: operator index -> bytes that operator also keeps until the pass ends (`capture_attention`'s
    copies of the attention weights)."""
    change = [0] * (len(ops) + 1)
    for storage, (first, last) in _release(ops).items():
        change[first] += storage.nbytes
        change[last + 1] -= storage.nbytes
    for i, nbytes in (retained or {}).items():
        change[i] += nbytes
    peak = live = 0
    for delta in change[:-1]:
        live += delta
        peak = max(peak, live)
    return peak


def saved_for_backward_bytes(ops: Sequence[OpCost]) -> int:
    """Activation bytes autograd keeps between forward and backward: every storage some operator saves, once."""
    saved = {x.storage for op in ops for x in op.saved}
    return sum(storage.nbytes for storage in saved)


def measure_saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Activation bytes autograd keeps for the backward pass of `model(x)` (run here with grad, in the model's
    mode): each storage once, the weights, buffers and `x` left out. The measured counterpart of
    `saved_for_backward_bytes`."""
    existing = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), x) if _has_storage(t)}
    sizes: dict[int, int] = {}  # storage address -> bytes

    def pack(t: torch.Tensor) -> torch.Tensor:
        if _has_storage(t) and t.untyped_storage().data_ptr() not in existing:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(sizes.values())


def _under(module: str, prefix: str) -> bool:
    """Whether the operator module `module` lies in the module `prefix` (itself or below it)."""
    return module == prefix or module.startswith(prefix + ".")


def _recompute_peak(
    ops: Sequence[OpCost],
    spans: dict[Storage, tuple[int, int]],
    block: list[str | None],
    end: int,
    saved: Mapping[Storage, int],
) -> int:
    """Peak bytes while a checkpointed block whose last operator is `end` runs its forward again: the tensors its
    backward needs (`saved`) stay, the others live as in the forward."""
    start = end
    while start > 0 and block[start - 1] == block[end]:
        start -= 1
    change = [0] * (end - start + 2)
    for storage, (first, last) in spans.items():
        if start <= first <= end:
            change[first - start] += storage.nbytes
            if storage not in saved:
                change[min(last, end) + 1 - start] -= storage.nbytes
    peak = live = 0
    for delta in change[:-1]:
        live += delta
        peak = max(peak, live)
    return peak


@dataclass(frozen=True)
class Sharding:
    """How FSDP2 (`torch.distributed.fsdp.fully_shard` on each shard unit, then on the root) holds one process's
    parameters through a training step, for `training_peak`. Bytes per process; "" names the root (the parameters
    outside every unit: embeddings, norms, heads).

    Forward: a unit's parameters are all-gathered just before it runs into one flat buffer, copied out into the
    parameters and freed after it (the flat buffer lives until the next unit's copy-out); the root's stay gathered
    from the start of forward to the end of backward (their flat buffer until the first unit's copy-out).
    Backward: each unit is gathered again, the one before it prefetched (its flat buffer); its full gradients live
    until its reduce-scatter, whose input buffer is held until the next unit's reduce-scatter and whose output is
    the gradient shard.
    """

    units: tuple[str, ...]  # module names of the shard units, in forward order
    gathered: Mapping[str, int]  # unit -> bytes of its parameters gathered in full (compute dtype, padded)
    reduce_input: Mapping[str, int]  # unit -> bytes of its reduce-scatter input (reduce dtype, padded)
    grad_shards: Mapping[str, int]  # unit -> bytes of its gradient shard on this process (padded)


@dataclass(frozen=True)
class StepPeak:
    """The peak of one training step's own allocations (`training_peak`), in bytes, and what of it, at that
    moment, is gradients and FSDP's gathered parameters and communication buffers; the rest is activations, weight
    copies and backward work."""

    total: int
    gradients: int = 0
    gathered: int = 0

    def higher(self, total: int, gradients: int, gathered: int) -> StepPeak:
        """This peak, or the moment given if it is higher."""
        return StepPeak(total, gradients, gathered) if total > self.total else self


def training_peak_bytes(
    ops: Sequence[OpCost],
    grad_bytes: Mapping[str, int] | None = None,
    copy_bytes: Mapping[str, int] | None = None,
    checkpointed: Sequence[str] = (),
) -> int:
    """Peak bytes one training step allocates beyond the weights, optimizer state and input (`training_peak`'s
    total, without sharding)."""
    return training_peak(ops, grad_bytes, copy_bytes, checkpointed).total


def training_peak(
    ops: Sequence[OpCost],
    grad_bytes: Mapping[str, int] | None = None,
    copy_bytes: Mapping[str, int] | None = None,
    checkpointed: Sequence[str] = (),
    sharding: Sharding | None = None,
) -> StepPeak:
    """Peak bytes one training step allocates beyond the weights, optimizer state and input, as `vitkit train` runs
    it: the forward with the previous step's gradients still alive, `zero_grad(set_to_none=True)`, the backward.

    Forward: what each operator saves stays until backward, the rest lives as in `inference_peak_bytes`. Backward
    walks the operators in reverse: each holds the gradient of its output and of its main input while it runs (or
    its `backward_bytes`, where it gives them), the gradients of a module's parameters appear at its last operator,
    and a saved tensor is freed after the backward of the first operator that saved it. A checkpointed block keeps
    only its inputs through the forward and saves its tensors again when its backward begins (the recomputation).

    Under FSDP (`sharding`) the previous step's gradients are shards, a unit's full gradients are replaced by its
    shard when its backward ends, and the gathered parameters and communication buffers of `Sharding` are added
    where they are alive.

    Args:
        ops: the operators of the forward, in order (a model's `cost()`).
        grad_bytes: operator module name -> bytes of the gradients of the parameters it owns (as autograd makes
            them: in the compute dtype under FSDP mixed precision).
        copy_bytes: operator module name -> bytes of the low-precision weight copies autocast makes in its forward
            and autograd keeps until its backward.
        checkpointed: names of the modules whose forward is recomputed in backward (`set_grad_checkpointing`).
        sharding: the FSDP units and their buffers; None for a model held whole (one process, DDP).
    """
    grad_bytes, copy_bytes = grad_bytes or {}, copy_bytes or {}
    spans = _release(ops)
    block = [next((b for b in checkpointed if _under(op.module, b)), None) for op in ops]
    kept, inner = _kept_for_backward(ops, spans, block, checkpointed)
    layout = _Layout(ops, sharding) if sharding is not None else None
    forward, copies = _training_forward_peak(ops, spans, kept, copy_bytes, grad_bytes, layout)
    backward = _backward_peak(ops, spans, block, kept, inner, grad_bytes, copy_bytes, copies, layout)
    return forward if forward.total >= backward.total else backward


class _Layout:
    """Where each operator stands among the FSDP units: which unit it runs in (-1: the root), and the gathered
    and communication buffers alive while it runs forward and backward."""

    def __init__(self, ops: Sequence[OpCost], sharding: Sharding) -> None:
        self.sharding = sharding
        names = sharding.units
        self.unit = [next((k for k, u in enumerate(names) if _under(op.module, u)), -1) for op in ops]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, k in enumerate(self.unit):
            if k >= 0:
                first.setdefault(k, i)
                last[k] = i
        self.first, self.last = first, last  # unit -> index of its first and last operator (if it runs any)
        ran = sorted(first, key=first.get)  # the units in the order they run
        self.previous = {k: ran[j - 1] if j > 0 else None for j, k in enumerate(ran)}
        self.following = {k: ran[j + 1] if j + 1 < len(ran) else None for j, k in enumerate(ran)}
        self.ran = ran

    def gathered(self, k: int | None) -> int:
        return 0 if k is None else self.sharding.gathered.get(self.sharding.units[k], 0)

    def reduce_input(self, k: int | None) -> int:
        return 0 if k is None else self.sharding.reduce_input.get(self.sharding.units[k], 0)

    def shard(self, k: int) -> int:
        return self.sharding.grad_shards.get(self.sharding.units[k], 0)

    @property
    def root(self) -> int:
        return self.sharding.gathered.get("", 0)

    def forward(self, i: int) -> int:
        """FSDP's buffers while operator `i` runs forward: the root's parameters, and the running unit's parameters
        and flat all-gather buffer; between units, the last unit's flat buffer (the root's before the first)."""
        k = self.unit[i]
        if k >= 0:
            return self.root + 2 * self.gathered(k)
        ran = [j for j in self.ran if self.first[j] < i]
        return self.root + (self.gathered(ran[-1]) if ran else self.root)

    def entering(self, i: int, backward: bool) -> int | None:
        """FSDP's buffers while the unit whose forward begins (or whose backward begins, `backward`) at operator
        `i` is copied out of its all-gather, or None if no unit begins there. Forward: its flat buffer and
        parameters, and the flat buffer before it (held by `wait_for_unshard` until the copy-out is done);
        backward: its flat buffer and parameters, and the reduce-scatter input of the unit after it."""
        k = self.unit[i]
        if k < 0 or i != (self.first[k] if not backward else self.last[k]):
            return None
        if backward:
            return self.root + 2 * self.gathered(k) + self.reduce_input(self.following[k])
        before = self.gathered(self.previous[k]) if self.previous[k] is not None else self.root
        return self.root + 2 * self.gathered(k) + before

    def backward(self, i: int) -> int:
        """FSDP's buffers while operator `i` runs backward: the root's parameters; in a unit its parameters, the
        unit before it prefetched and the reduce-scatter input of the unit after it; in the root, the reduce-scatter
        input of the last unit reduced and the unit prefetched next (the last unit, before any)."""
        k = self.unit[i]
        if k >= 0:
            return self.root + self.gathered(k) + self.gathered(self.previous[k]) + self.reduce_input(self.following[k])
        reduced = [j for j in self.ran if self.first[j] > i]  # units whose backward is done
        if not reduced:
            return self.root + (self.gathered(self.ran[-1]) if self.ran else 0)
        return self.root + self.reduce_input(reduced[0]) + self.gathered(self.previous[reduced[0]])


def _kept_for_backward(
    ops: Sequence[OpCost],
    spans: dict[Storage, tuple[int, int]],
    block: list[str | None],
    checkpointed: Sequence[str],
) -> tuple[dict[Storage, int], dict[str, dict[Storage, int]]]:
    """(what the forward keeps for backward, and what each checkpointed block saves again when its backward begins),
    each storage -> the index of the first operator that keeps it (its backward frees it). A checkpointed block
    keeps its inputs (tensors made before it that its operators read) instead of what it saves."""
    kept: dict[Storage, int] = {}
    inner: dict[str, dict[Storage, int]] = {b: {} for b in checkpointed}
    for i, op in enumerate(ops):
        b = block[i]
        for x in op.saved:
            if x.nbytes > 0 and x.storage in spans:
                (inner[b] if b is not None else kept).setdefault(x.storage, i)
        if b is not None:
            for x in op.inputs:
                made = spans.get(x.storage)
                if made is not None and block[made[0]] != b:
                    kept.setdefault(x.storage, i)
    for saved in inner.values():
        for storage in list(saved):
            if storage in kept:
                del saved[storage]  # a block input, kept anyway
    return kept, inner


def _training_forward_peak(
    ops: Sequence[OpCost],
    spans: dict[Storage, tuple[int, int]],
    kept: Mapping[Storage, int],
    copy_bytes: Mapping[str, int],
    grad_bytes: Mapping[str, int],
    layout: _Layout | None,
) -> tuple[StepPeak, int]:
    """(peak of the training forward, bytes of the weight copies made by its end): live activations, every kept
    one to the end, the weight copies of the modules reached so far, the previous step's gradients (their shards
    under FSDP) and FSDP's gathered parameters."""
    change = [0] * (len(ops) + 1)
    for storage, (first, last) in spans.items():
        change[first] += storage.nbytes
        if storage not in kept:
            change[last + 1] -= storage.nbytes
    if layout is None:
        grads = sum(grad_bytes.values())  # the previous step's gradients, freed by zero_grad after the forward
    else:
        grads = sum(layout.sharding.grad_shards.values())
    seen: set[str] = set()
    live = copies = 0
    peak = StepPeak(0)
    for i, op in enumerate(ops):
        if op.module not in seen:
            seen.add(op.module)
            copies += copy_bytes.get(op.module, 0)
        entering = layout.entering(i, backward=False) if layout is not None else None
        if entering is not None:
            peak = peak.higher(live + copies + grads + entering, grads, entering)
        live += change[i]
        gathered = layout.forward(i) if layout is not None else 0
        peak = peak.higher(live + copies + grads + gathered, grads, gathered)
    return peak, copies


def _backward_peak(
    ops: Sequence[OpCost],
    spans: dict[Storage, tuple[int, int]],
    block: list[str | None],
    kept: Mapping[Storage, int],
    inner: Mapping[str, Mapping[Storage, int]],
    grad_bytes: Mapping[str, int],
    copy_bytes: Mapping[str, int],
    copies: int,
    layout: _Layout | None,
) -> StepPeak:
    """Peak of the backward: the operators in reverse, with what the forward kept (and the weight copies) alive at
    its start, gradients appearing and saved tensors freed as `training_peak` says. Under FSDP a unit's gradients
    give way to its shard once its first operator is done (at that moment its full gradients and the reduce-scatter
    input are both alive), and the root's to its shard at the end."""
    freed_at: dict[int, int] = {}
    for saved in (kept, *inner.values()):
        for storage, i in saved.items():
            freed_at[i] = freed_at.get(i, 0) + storage.nbytes
    live = sum(storage.nbytes for storage in kept) + copies
    if ops and ops[-1].output.storage not in kept:
        live += ops[-1].output.nbytes  # the result the loss reads
    first_op: dict[str, int] = {}
    for i, op in enumerate(ops):
        first_op.setdefault(op.module, i)
    done: set[str] = set()
    grads = 0  # gradients alive: full ones, and under FSDP the shards of the units done
    unit_grads: dict[int, int] = {}  # FSDP unit -> bytes of its full gradients so far
    peak = StepPeak(live)
    for i in range(len(ops) - 1, -1, -1):
        op, b = ops[i], block[i]
        gathered = layout.backward(i) if layout is not None else 0
        entering = layout.entering(i, backward=True) if layout is not None else None
        if entering is not None:
            peak = peak.higher(live + grads + entering, grads, entering)
        if b is not None and (i == len(ops) - 1 or block[i + 1] != b):  # the block's backward begins: recompute
            recompute = _recompute_peak(ops, spans, block, i, inner[b])
            peak = peak.higher(live + grads + gathered + recompute, grads, gathered)
            live += sum(storage.nbytes for storage in inner[b])
        if op.module not in done:
            done.add(op.module)
            grads += grad_bytes.get(op.module, 0)
            if layout is not None and layout.unit[i] >= 0:
                unit_grads[layout.unit[i]] = unit_grads.get(layout.unit[i], 0) + grad_bytes.get(op.module, 0)
        work = op.output.nbytes + (op.inputs[0].nbytes if op.inputs else 0)  # gradients of output and input
        if op.backward_bytes is not None:
            work = op.backward_bytes
        peak = peak.higher(live + grads + gathered + work, grads, gathered)
        if first_op[op.module] == i:
            live -= copy_bytes.get(op.module, 0)  # the module's first operator: its weight copies are done
        live -= freed_at.get(i, 0)
        k = layout.unit[i] if layout is not None else -1
        if k >= 0 and layout.first[k] == i:  # the unit's backward is done: its reduce-scatter
            reducing = layout.root + layout.gathered(layout.previous[k]) + layout.reduce_input(k)
            peak = peak.higher(live + grads + reducing, grads, reducing)
            grads += layout.shard(k) - unit_grads.pop(k, 0)
    if layout is not None:  # the root's reduce-scatter, its full gradients and its input both alive
        root_input = layout.sharding.reduce_input.get("", 0)
        peak = peak.higher(live + grads + root_input, grads, root_input)
    return peak


def allocated_peak(profiler: Any, trace: str | os.PathLike) -> int:
    """Peak bytes allocated through torch's CPU allocator while `profiler` (a `torch.profiler.profile` with
    `profile_memory=True`) ran: what `PeakMemory` counts, and also what no operator returns, such as the storages
    FSDP resizes. The memory events of its trace (written to `trace`) in time order, each free matched by address
    to an allocation made while profiling: the allocator reports a free by the size it last recorded at that
    address, which may be stale from an earlier profiling session. The profiler sees the allocations of the thread
    it profiles (run with one thread), not those other threads free."""
    profiler.export_chrome_trace(os.fspath(trace))
    events = [e for e in json.loads(Path(trace).read_text())["traceEvents"] if e.get("name") == "[memory]"]
    allocated: dict[int, int] = {}  # address -> bytes of a block allocated while profiling and not yet freed
    live = peak = 0
    for e in sorted(events, key=lambda e: e["ts"]):
        address, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            live += nbytes - allocated.pop(address, 0)
            allocated[address] = nbytes
            peak = max(peak, live)
        else:
            live -= allocated.pop(address, 0)  # 0: a block from before
    return peak
