"""Peak activation memory measured at the dispatcher, on any device (CPU included).

torch reports peak memory only for CUDA (`torch.cuda.max_memory_allocated`). `PeakMemory` watches every tensor that
an operator returns while it is active, counts the bytes of each storage once, and subtracts them when the last
tensor using that storage is freed; its `peak` is the largest total seen. Tensors that existed before (weights,
the input) are not counted, so the figure is the extra memory a forward (or training step) needs.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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
