"""Activation memory: estimated from the operators each layer states, and measured at the dispatcher.

`inference_peak_bytes` and `saved_for_backward_bytes` are the one place that turns the operator lists of the
layers' `cost()` methods into memory: which tensors are alive together, and which ones training keeps.

torch reports peak memory only for CUDA (`torch.cuda.max_memory_allocated`). `PeakMemory` watches every tensor that
an operator returns while it is active, counts the bytes of each storage once, and subtracts them when the last
tensor using that storage is freed; its `peak` is the largest total seen. Tensors that existed before (weights,
the input) are not counted, so the figure is the extra memory a forward (or training step) needs.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vitkit.layers.cost import OpCost, Storage


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
    """(first, last) op index between which each storage the ops write is alive.

    A tensor lives from the operator that writes it until its last reader, except that a tensor handed to a
    module stays referenced by the caller's expression (or the callee's argument) until that module returns: the
    read by an op of module `a.b.c` of a tensor made in `a.x` keeps it alive to the last op under `a.b`. An output
    marked `named` lives at least until its module's last op. The last operator's output is the result and lives
    to the end.
    """
    path = [tuple(op.module.split(".")) if op.module else () for op in ops]
    last_under: dict[tuple[str, ...], int] = {}
    for i, parts in enumerate(path):
        for n in range(len(parts) + 1):
            last_under[parts[:n]] = i
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
            end = last_under[reader[: common + 1]] if len(reader) > common else i
            span[x.storage] = (span[x.storage][0], max(span[x.storage][1], end))
        out = op.output.storage
        if out not in span and out.nbytes > 0 and op.out_bytes > 0:
            span[out] = (i, last_under[path[i]] if op.named else i)
            made_in[out] = path[i]
    if ops and ops[-1].output.storage in span:
        span[ops[-1].output.storage] = (span[ops[-1].output.storage][0], len(ops) - 1)
    return span


def inference_peak_bytes(ops: Sequence[OpCost]) -> int:
    """Peak activation bytes alive at once while the operators run without grad (see `_release` for lifetimes)."""
    change = [0] * (len(ops) + 1)
    for storage, (first, last) in _release(ops).items():
        change[first] += storage.nbytes
        change[last + 1] -= storage.nbytes
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
