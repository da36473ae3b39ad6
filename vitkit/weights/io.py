"""Weight files: vitkit model directories (`config.json` + `model.safetensors`, no pickle anywhere) and safe
reading of other libraries' checkpoints (safetensors, or `torch.load(weights_only=True)`, which never runs code).

A vitkit `config.json` (format_version 5, the one format vitkit reads and writes) holds:
  - "format_version": 5, "family": the model family, "config": every field of the family's config;
  - "class_names" (optional): the class names in label order, one per classifier output;
  - "mean", "std" (optional): the per-channel normalisation of images scaled to [0, 1] that the model expects.
A file of another format_version, or lacking a config field, is refused with a message naming what is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitkit.data.sources import check_normalisation
from vitkit.models.registry import build_model, family, family_of
from vitkit.util import atomic_write
from vitkit.weights.pdparams import is_pdparams, read_pdparams

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 5  # what save_pretrained writes, and the only version read
INFO_ATTRIBUTE = "pretrained_info"  # the `ModelInfo` that from_pretrained / load_pretrained set on a model
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")  # files written by torch.save
PDPARAMS_SUFFIX = ".pdparams"  # files written by Paddle's paddle.save (PaddleViT's weights)
# Weight files looked for, in this order, when a checkpoint path is a directory (vitkit's and Hugging Face's names).
DIRECTORY_WEIGHTS = (WEIGHTS_NAME, "pytorch_model.bin")


@dataclass(frozen=True)
class ModelInfo:
    """What a saved model carries beside its config and weights, to be used on images without its training data.

    `from_pretrained` and `load_pretrained` set it on the model they return as `model.pretrained_info`
    (`model_info(model)`); `save_pretrained` and `export_weights` write what they are given, e.g.
    ``save_pretrained(model, path, **dataclasses.asdict(model_info(model)))``, never names a model merely carries
    (after fine-tuning on other classes they would be wrong). `vitkit.weights.convert` passes them on.
    """

    class_names: tuple[str, ...] | None = None  # one per classifier output, in label order; None: unknown
    mean: tuple[float, ...] | None = None  # per-channel normalisation mean of images scaled to [0, 1]; None: unknown
    std: tuple[float, ...] | None = None  # per-channel normalisation std, as many values as `mean`

    def to_json(self) -> dict[str, Any]:
        """The known entries, as config.json stores them."""
        values = {"class_names": self.class_names, "mean": self.mean, "std": self.std}
        return {k: list(v) for k, v in values.items() if v is not None}


def check_model_info(
    class_names: Any, mean: Any, std: Any, num_classes: int, source: str, in_chans: int | None = None
) -> ModelInfo:
    """A `ModelInfo` from loose values (lists from JSON, tuples from Python); ValueError naming what is wrong."""
    if class_names is not None:
        if isinstance(class_names, str) or not isinstance(class_names, Sequence):
            raise ValueError(f"{source}: class_names must be a list of strings, got {class_names!r}")
        class_names = tuple(class_names)
        if not all(isinstance(name, str) for name in class_names):
            raise ValueError(f"{source}: class_names must be strings, got {list(class_names)[:5]}")
        if len(class_names) != num_classes:
            raise ValueError(f"{source}: {len(class_names)} class_names for a model with {num_classes} classes")
        repeated = sorted({n for n in class_names if class_names.count(n) > 1})
        if repeated:
            raise ValueError(f"{source}: class_names repeat {repeated}")
    if (mean is None) != (std is None):
        raise ValueError(f"{source}: mean and std come together; got only {'mean' if std is None else 'std'}")
    if mean is not None:  # the same check as dataset.json's
        mean, std = check_normalisation(mean, std, source, in_chans)
    return ModelInfo(class_names, mean, std)


def model_info(model: nn.Module) -> ModelInfo:
    """The `ModelInfo` that `from_pretrained` / `load_pretrained` set on `model` (an empty one otherwise)."""
    info = getattr(model, INFO_ATTRIBUTE, None)
    return info if isinstance(info, ModelInfo) else ModelInfo()


def info_for(
    model: nn.Module,
    class_names: Sequence[str] | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    source: str,
) -> ModelInfo:
    """The names and normalisation given for `model`, checked against it (count of classes, channels)."""
    config = model.config
    num_classes, in_chans = getattr(config, "num_classes", 0), getattr(config, "in_chans", None)
    return check_model_info(class_names, mean, std, num_classes, source, in_chans)


def save_pretrained(
    model: nn.Module,
    directory: str | os.PathLike,
    class_names: Sequence[str] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model` to `directory` as `config.json` (family, every config field, class names and normalisation
    when known) and `model.safetensors`. Returns the directory. `from_pretrained(directory)` rebuilds an equal model.

    Args:
        model: a vitkit model.
        directory: created if missing.
        class_names: one name per classifier output, in label order (None: not written).
        mean, std: the per-channel normalisation of images scaled to [0, 1] that the model expects (e.g. the
            training data's; None: not written).
        state_dict: the weights to write, when not `model.state_dict()`: a sharded model's, gathered
            (`vitkit.train.sharding.full_state_dict`).
    """
    fam = family_of(model)
    info = info_for(model, class_names, mean, std, source="save_pretrained")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "format_version": FORMAT_VERSION,
        "family": fam.name,
        "config": dataclasses.asdict(model.config),
        **info.to_json(),
    }
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().contiguous() for k, v in weights.items()}
    atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    text = json.dumps(config, indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda tmp: Path(tmp).write_text(text))
    return directory


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the model, with the ways out.

    `str()` words them for Python callers (``build the model with num_classes=5``, ``reset_head=True``);
    `cli_message()` with vitkit's command-line flags (``--set num_classes=5``, ``--reset-head``, ``--model``).
    """

    def __init__(
        self,
        problem: str,
        fields: Mapping[str, Any] | None = None,
        reset_head: str | None = None,
        models: Sequence[str] = (),
    ) -> None:
        self.problem = problem  # what does not fit, e.g. "x.pth is a ViT with embed_dim 192, the model has 384"
        self.fields = dict(fields or {})  # config values that would make the model fit
        self.reset_head = reset_head  # what skipping the checkpoint's classifier does, when it is a way out
        self.models = list(models)  # registered models that fit the checkpoint
        super().__init__(self.message())

    def message(self, cli: bool = False) -> str:
        ways = []
        if self.models:  # the registered variant first: the whole fix in one name
            shown = ", ".join(self.models[:5]) + (", ..." if len(self.models) > 5 else "")
            ways.append(f"{'pass --model NAME with' if cli else 'use'} a registered model of that size: {shown}")
        if self.fields:
            if cli:
                ways.append("pass " + " ".join(f"--set {k}={_cli_value(v)}" for k, v in self.fields.items()))
            else:
                ways.append("build the model with " + ", ".join(f"{k}={v!r}" for k, v in self.fields.items()))
        if self.reset_head:
            ways.append(f"pass {'--reset-head' if cli else 'reset_head=True'} to {self.reset_head}")
        return self.problem + (": " + ", or ".join(ways) if ways else "")

    def cli_message(self) -> str:
        """The message with vitkit's command-line flags for the ways out."""
        return self.message(cli=True)


def _cli_value(value: Any) -> str:
    """A value as `--set FIELD=VALUE` parses it (JSON, no spaces, so the shell keeps it one word)."""
    return json.dumps(list(value) if isinstance(value, tuple) else value, separators=(",", ":"))


def check_finite(state: Mapping[str, torch.Tensor], source: str, names_note: str = "") -> None:
    """ValueError naming the tensors (a few, with counts) that hold NaN or Inf values: such weights only ever
    give NaN outputs. `names_note` follows the names (e.g. that they are vitkit's, not the file's)."""
    bad = []
    for name, tensor in state.items():
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
            counts = ", ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n)
            bad.append(f"{name} ({counts} of {tensor.numel()})")
    if bad:
        raise ValueError(
            f"{source} holds NaN or Inf values in {len(bad)} of {len(state)} tensors{names_note}: "
            f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; a model with them outputs NaN (did the "
            "training run diverge?), so they are not loaded"
        )


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


def _config_from_dict(config_cls: type, fields: dict[str, Any], source: str = "") -> Any:
    """Rebuild a config dataclass from JSON values (lists back to tuples where the field allows a tuple); every
    field must be present. ValueError naming missing and unknown fields."""
    where = f"{source}: " if source else ""
    names = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ValueError(f"{where}config has field(s) {unknown} that {config_cls.__name__} does not know")
    missing = [name for name in names if name not in fields]
    if missing:
        raise ValueError(
            f"{where}config lacks field(s) {missing} of {config_cls.__name__}; a vitkit config.json holds every "
            "field it was saved with, so the value the model was built with is unknown"
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return config_cls(**values)


def read_json(path: Path) -> Any:
    """Parse a JSON file; ValueError naming the file if it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err


def read_vitkit_config(path: Path) -> dict[str, Any]:
    """A vitkit `config.json`, its format checked: an object with the format_version this vitkit reads, a family
    name and a config object. ValueError naming the entry that is wrong."""
    saved = read_json(path)
    if not isinstance(saved, dict) or "family" not in saved or "config" not in saved:
        raise ValueError(f"{path} has no 'family' and 'config' entries: not a vitkit model directory")
    version = saved.get("format_version")
    if "format_version" not in saved:
        raise ValueError(f"{path} has no 'format_version'; this vitkit reads format_version {FORMAT_VERSION}")
    if isinstance(version, bool) or version != FORMAT_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        raise ValueError(
            f"{path}: format_version {version!r} is not the one this vitkit reads ({FORMAT_VERSION})"
            + ("; it was written by a newer vitkit: upgrade vitkit to read it" if newer else "")
        )
    if not isinstance(saved["config"], dict):
        raise ValueError(f"{path}: 'config' must be an object of config fields, got {saved['config']!r}")
    known = {"format_version", "family", "config", "class_names", "mean", "std"}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise ValueError(f"{path}: unknown entries {unknown}; a vitkit config.json holds {sorted(known)}")
    return saved


def _saved_config(directory: str | os.PathLike, overrides: dict[str, Any]) -> tuple[str, Any]:
    """(family, config) of a vitkit directory's `config.json`, `overrides` replaced."""
    config_path = Path(directory) / CONFIG_NAME
    saved = read_vitkit_config(config_path)
    fam = family(saved["family"])
    names = {f.name for f in dataclasses.fields(fam.config_cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:  # the caller's, not the file's: worded as `create_model` words them
        raise ValueError(f"{fam.config_cls.__name__} has no field(s) {unknown}; its fields are {sorted(names)}")
    fields = {**saved["config"], **overrides}
    return fam.name, _config_from_dict(fam.config_cls, fields, str(config_path))


def read_config(directory: str | os.PathLike, **overrides: Any) -> Any:
    """The config in a vitkit directory's `config.json`, `overrides` replaced (nothing built)."""
    return _saved_config(directory, overrides)[1]


def build_from_config(directory: str | os.PathLike, **overrides: Any) -> nn.Module:
    """The model described by a vitkit directory's `config.json` (freshly initialised; weights not loaded)."""
    return build_model(*_saved_config(directory, overrides))


def read_saved_info(directory: str | os.PathLike) -> ModelInfo:
    """The class names and normalisation in a vitkit directory's `config.json`, checked against its config."""
    config_path = Path(directory) / CONFIG_NAME
    saved = read_vitkit_config(config_path)
    config = saved["config"]
    return check_model_info(
        saved.get("class_names"),
        saved.get("mean"),
        saved.get("std"),
        config.get("num_classes", 0),
        str(config_path),
        config.get("in_chans"),
    )


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
    if suffix == PDPARAMS_SUFFIX or (suffix in PICKLE_SUFFIXES and is_pdparams(path)):
        return read_pdparams(path)  # Paddle's paddle.save: NumPy arrays only, read without Paddle
    if suffix not in PICKLE_SUFFIXES:
        raise ValueError(
            f"{path}: unknown checkpoint type {suffix!r}; expected .safetensors, {PDPARAMS_SUFFIX} or {PICKLE_SUFFIXES}"
        )
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
    "FORMAT_VERSION",
    "WEIGHTS_NAME",
    "CheckpointMismatch",
    "ModelInfo",
    "atomic_write",
    "build_from_config",
    "check_finite",
    "check_model_info",
    "check_state_dict",
    "is_hf_config",
    "info_for",
    "model_info",
    "read_checkpoint",
    "read_config",
    "read_json",
    "read_saved_info",
    "read_vitkit_config",
    "save_pretrained",
]
