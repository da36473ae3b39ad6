"""PaddlePaddle `.pdparams` files (PaddleViT's weights), read and written without Paddle.

What ``paddle.save(layer.state_dict(), "x.pdparams")`` writes (Paddle's `paddle.framework.io.save`, through
`_legacy_save`, `_build_saved_state_dict` and `paddle.framework.io_utils._unpack_saved_dict`) is a pickle of a
plain dict:
  - each structured name (``encoder.layers.0.attn.qkv.weight``) -> a `numpy.ndarray` with the tensor's value, in
    Paddle's shapes: a Linear weight is [in, out], the transpose of torch's; Conv2D [out, in, kh, kw] as in torch;
  - ``"StructuredToParameterName@@"`` -> {structured name: Paddle's internal tensor name (``linear_0.w_0``)}, which
    `paddle.load` gives the tensors it makes of the listed arrays before dropping the table;
  - with pickle protocol 2 or 3 only, each array of more than 2**30 - 1 bytes flattened and cut into slices
    ``<name>@@.0``, ``<name>@@.1``, ... of (2**30 - 1) // itemsize elements, and ``"UnpackBigParamInfor@@"`` ->
    {name: {"OriginShape": shape, "slices": [slice names]}}, from which `paddle.load` (`_pack_loaded_dict`)
    concatenates and reshapes them.
The protocol is `paddle.save`'s `protocol` argument, 2 to 4: 4 by default since Paddle 2.1.1, 2 before.
`paddle.load` reads with ``pickle.load(f, encoding="latin1")``.

A dict that holds a state dict (PaddleViT's training checkpoints: ``{"model": ..., "optimizer": ..., "epoch": ...}``)
is not a state dict to `paddle.save`: it pickles such a dict as it is (`_pickle_save`), each tensor as the tuple
``(internal name, array)``, built by a call of `builtins.tuple`; `model.state_dict()` is an `OrderedDict`.

Reading never runs code from the file: the unpickler builds NumPy arrays, dtypes and scalars and plain containers
and refuses every other global (as `torch.load(weights_only=True)` does), e.g. the `builtins.eval` through which
Paddle pickles a static-graph LoDTensor. Arrays are written under the names of the NumPy that writes them:
`numpy._core.multiarray` under NumPy 2, which NumPy before 1.26.1 cannot import (`numpy.core.multiarray`, the
name NumPy 1 writes, is read by every NumPy).
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAME_TABLE = "StructuredToParameterName@@"  # paddle.save's {structured name: internal tensor name}
SLICE_TABLE = "UnpackBigParamInfor@@"  # paddle.save's {name: {"OriginShape": shape, "slices": [names]}}
PROTOCOL = 4  # the pickle protocol paddle.save writes by default (Paddle >= 2.1.1)
PROTOCOLS = (2, 3, 4)  # the protocols paddle.save writes
CHECKPOINT_ENTRY = "model"  # the entry of PaddleViT's training checkpoints that holds the state dict
_NUMERIC_KINDS = "biufc"  # NumPy dtype kinds of bool, signed and unsigned int, float and complex arrays

# The globals that the pickles of paddle.save name, and nothing else.
_ALLOWED_GLOBALS = frozenset(
    {
        # arrays and dtypes (`numpy.core` up to NumPy 1.26, `numpy._core` since NumPy 2) and NumPy scalars
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        # a Layer's state_dict(), and a tensor inside a checkpoint: tuple((name, array))
        ("collections", "OrderedDict"),
        ("builtins", "tuple"),
        ("__builtin__", "tuple"),
        # protocol 2 has no bytes opcode: bytes are pickled as _codecs.encode(latin-1 text, "latin1"), b"" as bytes()
        ("_codecs", "encode"),
        ("builtins", "bytes"),
        ("__builtin__", "bytes"),
    }
)


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle that names a global outside the allowed NumPy and container ones (the global: `str()`)."""


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that finds only `_ALLOWED_GLOBALS` and refuses the rest before importing anything."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise _RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def _pickle_protocol(head: bytes) -> int | None:
    """The protocol of a pickle starting with `head` (its PROTO opcode), None if it does not start like one."""
    if len(head) >= 2 and head[:1] == pickle.PROTO:
        return head[1]
    return None


def is_pdparams(path: str | os.PathLike) -> bool:
    """Whether `path` is a file that starts as `paddle.save` starts one: a pickle of protocol 2 to 4 whose first
    object is a dict.

    A sniff of the first 12 bytes, to tell a `.pdparams` file from a torch file: `torch.save` writes a zip archive
    (``PK``) or, in its legacy format, a pickle that starts with a number. `read_pdparams` checks the rest.
    """
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(12)
    if _pickle_protocol(head) not in PROTOCOLS:
        return False
    body = head[2:]
    if body[:1] == pickle.FRAME:  # protocol 4 frames: FRAME and an 8-byte length before the first opcode
        body = body[9:]
    return body[:1] == pickle.EMPTY_DICT


def read_pdparams(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in a `.pdparams` file, under Paddle's names and in Paddle's shapes (Linear weights [in, out]).

    Reads what `paddle.save` writes for a state dict (any protocol it writes; sliced big arrays joined again; the
    name table dropped), and PaddleViT's training checkpoints, whose ``"model"`` entry holds the state dict (their
    other entries, optimizer state and epoch, are unpickled under the same rules and dropped). Tensors are copies,
    contiguous, in native byte order and the arrays' dtypes.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when missing).
        ValueError: the file is not a pickle, is damaged, would call a global other than NumPy's array builders
            and plain containers (named in the message; nothing from the file runs), does not hold a dict of
            names to arrays, or holds an array that is not numbers.
    """
    path = Path(path)
    with open(path, "rb") as f:
        protocol = _pickle_protocol(f.read(2))
        if protocol not in PROTOCOLS:
            f.seek(0)
            head = f.read(8)
            what = "is not a pickle" if protocol is None else f"is a pickle of protocol {protocol}"
            raise ValueError(
                f"{path} {what} (it starts with {head!r}); a .pdparams file is a pickle of protocol "
                f"{', '.join(map(str, PROTOCOLS))}, written by paddle.save"
            )
        f.seek(0)
        try:
            obj = _ArrayUnpickler(f, encoding="latin1").load()
        except _RefusedGlobal as err:
            raise ValueError(
                f"{path} refused: its pickle would call {err}, which is not a NumPy array builder or plain "
                "container; vitkit never runs code from a checkpoint"
            ) from err
        # What the unpickler raises on a truncated or damaged pickle, or a NumPy that lacks the file's modules.
        except (pickle.UnpicklingError, EOFError, ImportError, AttributeError, TypeError, ValueError, KeyError) as err:
            raise ValueError(f"{path} is not a readable pickle (truncated or damaged): {err}") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}, expected a dict of parameter names to arrays")
    if isinstance(obj.get(CHECKPOINT_ENTRY), dict):
        obj = obj[CHECKPOINT_ENTRY]
    arrays = {k: v for k, v in obj.items() if k not in (NAME_TABLE, SLICE_TABLE)}
    if SLICE_TABLE in obj:
        _join_slices(arrays, obj[SLICE_TABLE], path)
    return {key: _to_tensor(key, value, path) for key, value in arrays.items()}


def _join_slices(arrays: dict[Any, Any], table: Any, path: Path) -> None:
    """Replace the slices of each big array by the array, as `paddle.load` does (slices flat, in order)."""
    if not isinstance(table, dict):
        raise ValueError(f"{path}: {SLICE_TABLE!r} is a {type(table).__name__}, expected a dict")
    for name, entry in table.items():
        shape = entry.get("OriginShape") if isinstance(entry, dict) else None
        slices = entry.get("slices") if isinstance(entry, dict) else None
        if not isinstance(shape, (tuple, list)) or not isinstance(slices, list):
            raise ValueError(f"{path}: {SLICE_TABLE!r} entry {name!r} is {entry!r}, expected OriginShape and slices")
        missing = [s for s in slices if s not in arrays]
        if missing:
            raise ValueError(f"{path}: slices {missing} of {name!r} are missing")
        parts = [arrays.pop(s) for s in slices]
        if not all(isinstance(p, np.ndarray) and p.ndim == 1 for p in parts):
            raise ValueError(f"{path}: the slices of {name!r} are not flat arrays")
        joined = np.concatenate(parts)
        if joined.size != math.prod(shape):
            raise ValueError(
                f"{path}: the slices of {name!r} hold {joined.size} values, not the {math.prod(shape)} of its shape "
                f"{tuple(shape)}"
            )
        arrays[name] = joined.reshape(shape)


def _to_tensor(key: Any, value: Any, path: Path) -> torch.Tensor:
    """A copy of one entry's array as a contiguous tensor in native byte order; ValueError for anything else."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        value = value[1]  # a tensor pickled inside a checkpoint: (internal name, array)
    if not isinstance(key, str) or not isinstance(value, np.ndarray):
        raise ValueError(
            f"{path}: entry {key!r} is a {type(value).__name__}, expected a dict of parameter names to NumPy arrays"
        )
    if value.dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"{path}: {key} is an array of {value.dtype}, expected numbers (bool, int, float, complex)")
    return torch.from_numpy(np.array(value, dtype=value.dtype.newbyteorder("="), order="C", copy=True))


def write_pdparams(state: Mapping[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Write `state` as ``paddle.save(state_dict, path)`` does, for `paddle.load` and `Layer.set_state_dict`.

    A protocol 4 pickle of a dict of names to NumPy arrays and the name table; no array is sliced (protocol 4
    holds arrays of any size). Paddle's internal tensor names are Paddle's own counters, so the table gives each
    tensor its structured name: `set_state_dict` matches by structured name. Names, shapes and dtypes are written
    as given: `set_state_dict` skips, with a warning only, a name or shape the model does not have, and asserts
    that each dtype is the parameter's (float32 for PaddleViT's models). The file is written in place: wrap the
    call in `vitkit.weights.io.atomic_write` for an all-or-nothing write.

    Raises:
        ValueError: a name that is not a string, a value that is not a tensor, or a dtype NumPy lacks (bfloat16).
    """
    arrays: dict[str, np.ndarray] = {}
    for key, tensor in state.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise ValueError(f"entry {key!r} is a {type(tensor).__name__}, expected names (str) to tensors")
        if tensor.dtype == torch.bfloat16:
            raise ValueError(f"{key} is bfloat16, which NumPy has no dtype for: cast it to float32 first")
        try:
            arrays[key] = tensor.detach().cpu().contiguous().numpy()
        except TypeError as err:  # dtypes NumPy lacks (float8, ...)
            raise ValueError(f"{key} is {tensor.dtype}, which NumPy has no dtype for: cast it first") from err
    saved: dict[str, Any] = {**arrays, NAME_TABLE: {key: key for key in arrays}}
    with open(path, "wb") as f:
        pickle.dump(saved, f, protocol=PROTOCOL)


__all__ = [
    "NAME_TABLE",
    "PROTOCOL",
    "SLICE_TABLE",
    "is_pdparams",
    "read_pdparams",
    "write_pdparams",
]
