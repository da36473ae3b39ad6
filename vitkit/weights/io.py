"""Saving and loading vitkit model directories: `config.json` + `model.safetensors`. No pickle anywhere."""

from __future__ import annotations

import dataclasses
import json
import os
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


def _atomic_write(path: Path, write: typing.Callable[[str], None]) -> None:
    """Write through a temporary file in the same folder, then rename, so a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
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
    _atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    text = json.dumps(config, indent=2) + "\n"
    _atomic_write(directory / CONFIG_NAME, lambda tmp: Path(tmp).write_text(text))
    return directory


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise ValueError listing missing, unexpected and shape-mismatched keys (a few of each, with counts)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
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


def from_pretrained(directory: str | os.PathLike, **overrides: Any) -> nn.Module:
    """Rebuild a model written by `save_pretrained`.

    Args:
        directory: folder holding `config.json` and `model.safetensors`.
        overrides: config fields to replace, e.g. ``attn_backend="math"`` or ``dynamic_img_size=True``.
    """
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: expected a directory written by vitkit.save_pretrained")
    try:
        saved = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    if not isinstance(saved, dict) or "family" not in saved or "config" not in saved:
        raise ValueError(f"{config_path} has no 'family' and 'config' entries: not a vitkit model directory")
    fam = family(saved["family"])
    config = _config_from_dict(fam.config_cls, {**saved["config"], **overrides})
    model = build_model(fam.name, config)
    try:
        state = load_file(weights_path)
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{weights_path} is not a readable safetensors file: {err}") from err
    check_state_dict(model, state, source=str(weights_path))
    model.load_state_dict(state)
    return model.eval()


__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "check_state_dict", "from_pretrained", "save_pretrained"]
