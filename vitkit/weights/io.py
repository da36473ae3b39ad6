"""Weight files: vitkit model directories (`config.json` + `model.safetensors`, no pickle anywhere) and safe
reading of other libraries' checkpoints (safetensors, or `torch.load(weights_only=True)`, which never runs code).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import re
import tempfile
import typing
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitkit.models.registry import build_model, family, family_of

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")  # files written by torch.save
# Weight files looked for, in this order, when a checkpoint path is a directory (vitkit's and Hugging Face's names).
DIRECTORY_WEIGHTS = (WEIGHTS_NAME, "pytorch_model.bin")


def atomic_write(path: Path, write: typing.Callable[[str], None]) -> None:
    """Write through a temporary file in the same folder, fsync it, then rename, so that a crash at any moment
    leaves either the old file or the complete new one, never half a file. The file gets the usual permissions
    (0666 less the umask), not mkstemp's owner-only ones."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself reaches the disk
        finally:
            os.close(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write `model` to `directory` as `config.json` (family and config fields) and `model.safetensors`.

    Returns the directory. `from_pretrained(directory)` rebuilds an equal model.
    """
    fam = family_of(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "format_version": FORMAT_VERSION,
        "family": fam.name,
        "config": dataclasses.asdict(model.config),
    }
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    text = json.dumps(config, indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda tmp: Path(tmp).write_text(text))
    return directory


def check_state_dict(
    model: nn.Module, state: dict[str, torch.Tensor], source: str, unmatched: typing.Sequence[str] = ()
) -> None:
    """Raise ValueError listing missing, unexpected and shape-mismatched keys (a few of each, with counts).

    `unmatched`: checkpoint keys that a converter could not rename, reported as unexpected under their own names.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [*unmatched, *(k for k in state if k not in expected)]
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if not (missing or unexpected or mismatched):
        return
    parts = [
        f"{len(items)} {what} {items[:5]}{' ...' if len(items) > 5 else ''}"
        for what, items in (("missing", missing), ("unexpected", unexpected), ("shape-mismatched", mismatched))
        if items
    ]
    raise ValueError(f"{source} does not fit {type(model).__name__}: " + "; ".join(parts))


def _config_from_dict(config_cls: type, fields: dict[str, Any]) -> Any:
    """Rebuild a config dataclass from JSON values (lists back to tuples where the field allows a tuple)."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"config has field(s) {unknown} that {config_cls.__name__} does not know")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return config_cls(**values)


def read_json(path: Path) -> Any:
    """Parse a JSON file; ValueError naming the file if it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err


def build_from_config(directory: str | os.PathLike, **overrides: Any) -> nn.Module:
    """The model described by a vitkit directory's `config.json` (freshly initialised; weights not loaded)."""
    config_path = Path(directory) / CONFIG_NAME
    saved = read_json(config_path)
    if not isinstance(saved, dict) or "family" not in saved or "config" not in saved:
        raise ValueError(f"{config_path} has no 'family' and 'config' entries: not a vitkit model directory")
    fam = family(saved["family"])
    config = _config_from_dict(fam.config_cls, {**saved["config"], **overrides})
    return build_model(fam.name, config)


def is_hf_config(config: Any) -> bool:
    """Whether a parsed `config.json` was written by Hugging Face transformers (it names a `model_type`)."""
    return isinstance(config, dict) and "model_type" in config and "family" not in config


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint file without running any code from it.

    `.safetensors` files are read with safetensors; `.pth`, `.pt`, `.bin` and `.ckpt` with
    `torch.load(weights_only=True)`, which unpickles only tensors and plain containers (and
    `argparse.Namespace`, which training scripts store beside the weights). A directory stands for the
    weight file inside it (`model.safetensors`, else `pytorch_model.bin`). Returns the top-level mapping,
    which may wrap the state dict (e.g. ``{"model": ..., "epoch": ...}``).
    """
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in DIRECTORY_WEIGHTS if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds no weight file: expected one of {list(DIRECTORY_WEIGHTS)}")
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        try:
            return load_file(path)
        except Exception as err:  # safetensors raises its own error types for damaged files
            raise ValueError(f"{path} is not a readable safetensors file: {err}") from err
    if suffix not in PICKLE_SUFFIXES:
        raise ValueError(f"{path}: unknown checkpoint type {suffix!r}; expected .safetensors or {PICKLE_SUFFIXES}")
    with open(path, "rb"):  # OSErrors of the file itself (permissions) surface as they are
        pass
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", str(err))
        if refused:
            raise ValueError(
                f"{path} refused: its pickle would call {refused.group(1)}, which is not a tensor or plain "
                "container; vitkit never runs code from a checkpoint (re-save the weights with "
                "torch.save(model.state_dict()) or as .safetensors)"
            ) from err
        detail = re.search(r"WeightsUnpickler error:\s*(.+?)\n\n", str(err), re.S)
        raise ValueError(
            f"{path} is not a readable PyTorch checkpoint (damaged, or not written by torch.save)"
            + (f": {detail.group(1).strip()}" if detail else "")
        ) from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:  # torch's reader on a damaged archive
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} is not a readable PyTorch checkpoint (truncated or damaged): {first_line}") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}, expected a state dict (a mapping of names to tensors)")
    return obj


__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "atomic_write",
    "build_from_config",
    "check_state_dict",
    "is_hf_config",
    "read_checkpoint",
    "read_json",
    "save_pretrained",
]
