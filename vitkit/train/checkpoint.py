"""The training checkpoint: everything needed to continue a run exactly, written so that a crash never leaves a
damaged file (`vitkit.weights.io.atomic_write`: temporary file, fsync, rename) and read back without running code.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitkit.util import atomic_write
from vitkit.weights.errors import RUN_CHECKPOINT
from vitkit.weights.io import read_checkpoint

CHECKPOINT_NAME = RUN_CHECKPOINT  # one name: loading's errors recognise a run's checkpoint by it


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write `state` (tensors, numbers, strings, lists, tuples and dicts of them) atomically to `path`."""
    path = Path(path)
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` without running code (`vitkit.weights.io.read_checkpoint`)."""
    return read_checkpoint(path)


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators (CPU, and CUDA when it is in use)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generators saved by `rng_state`."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
