"""Weight files: vitkit model directories (`config.json` + `model.safetensors`, no pickle anywhere) and safe
reading of other libraries' checkpoints (safetensors, or `torch.load(weights_only=True)`, which never runs code).

A vitkit `config.json` (format_version 7, the format vitkit writes) holds:
  - "format_version": 7, "family": the model family, "config": every field of the family's config;
  - what the model needs to be used without its training data (`ModelInfo`), each entry where known:
    "classes" (the class names in label order, one per class), "mean" and "std" (the per-channel normalisation
    of images scaled to [0, 1] that the model expects), for a detector "category_ids" (its data's category id of
    each class) and "postprocess" (how its outputs become detections: `vitkit.detection.Postprocessing`'s
    settings), and "data" (what it was trained on: "builtin:NAME" or a folder) with, for a classifier's data,
    "val_fraction" and "split_seed" (the share of each class held out for validation, 0 where the data has its own
    split, and the seed of that split), and "weights" (the published weights it was loaded or fine-tuned from, at
    which revision: "hf-hub:ORG/REPO@COMMIT" or a URL), and for a classifier whose publishers evaluated it otherwise
    than vitkit does by default, "crop_pct", "interpolation" and "crop_mode" (`vitkit.data.Framing`).
`vitkit train` writes every entry; `save_pretrained`, `export_weights` and `vitkit convert` those they are given.
`read_model_dir` is the one reader: a file of another format_version, lacking a config field, or with an entry
that is not one of these is refused with a message naming what is wrong. Files of format_version 5 are read too:
version 6 added the "weights" entry and Deformable DETR's choice of backbone, version 7 DETR's (the config fields in
`ADDED`), which files of earlier versions lack and which take their defaults, the values those models were built
with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pickle
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitkit.data.sources import check_normalisation
from vitkit.data.transforms import CROP_MODES, INTERPOLATIONS, Framing
from vitkit.models.backbone import FeatureMaps
from vitkit.models.registry import DETECTION, family, family_of
from vitkit.util import atomic_write
from vitkit.weights.pdparams import is_pdparams, read_pdparams

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 7  # what save_pretrained writes
READ_VERSIONS = (5, 6, 7)  # the versions read
# config fields each version added, which files of earlier versions lack: they take their defaults, the values the
# earlier models were built with (6: Deformable DETR's choice of backbone; 7: DETR's)
ADDED = {6: ("backbone", "backbone_args", "backbone_scales"), 7: ("backbone", "backbone_args", "backbone_scales")}
INFO_ATTRIBUTE = "pretrained_info"  # the `ModelInfo` that from_pretrained sets on a model
# the model's config when `INFO_ATTRIBUTE` was set: its class names are about that model's classifier, and a fresh
# classifier (`reset_classifier`, of any number of classes) comes with a new config (a deep copy keeps the two one)
INFO_CONFIG_ATTRIBUTE = "pretrained_info_config"
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")  # files written by torch.save
PDPARAMS_SUFFIX = ".pdparams"  # files written by Paddle's paddle.save (PaddleViT's weights)
# Weight files looked for, in this order, when a checkpoint path is a directory (vitkit's and Hugging Face's names).
DIRECTORY_WEIGHTS = (WEIGHTS_NAME, "pytorch_model.bin")
# What model directories of vitkit's early development kept beside config.json, which is read no more: its entries
# (`ModelInfo`) are in config.json.
SPLIT_LAYOUT = ("dataset.json", "postprocess.json")


@dataclass(frozen=True)
class ModelInfo:
    """What a saved model carries beside its config and weights, to be used on images without its training data:
    the entries of its config.json beside the config (see the module docstring). None: not known (not saved).

    `from_pretrained` sets it on the model it returns as `model.pretrained_info` (`model_info(model)`), without
    the entries about the classes when the classifier is not the saved one; `save_pretrained` and
    `export_weights` write what they are given, or else what the model carries (its class names only while its
    classifier has as many outputs); give `info` for a model fine-tuned on other classes of the same number.
    """

    classes: tuple[str, ...] | None = None  # class names, one per class (classifier output), in label order
    mean: tuple[float, ...] | None = None  # per-channel normalisation mean of images scaled to [0, 1]
    std: tuple[float, ...] | None = None  # per-channel normalisation std, as many values as `mean`
    category_ids: tuple[int, ...] | None = None  # a detector's: its data's category id of each class (COCO's
    # results format); None: the class indices
    postprocess: Mapping[str, Any] | None = None  # a detector's: how its outputs become detections, as
    # `vitkit.detection.Postprocessing.to_dict()` writes it; None: the default reading of its class logits
    data: str | None = None  # the data it was trained on: "builtin:NAME" or the (absolute) folder path
    val_fraction: float | None = None  # a classifier's: the share of each class of `data` held out for validation,
    # 0 where the data has a split of its own
    split_seed: int | None = None  # a classifier's: the seed of that held-out split
    weights: str | None = None  # the published weights it was loaded or fine-tuned from, where it was:
    # "hf-hub:ORG/REPO@COMMIT" or a torchvision file's URL (`vitkit.weights.hub`)
    tile: int | None = None  # a detector's: the side of the tiles it was trained on, cut from larger images
    # (`vitkit.data.tiles`); predict and eval cut larger images into such tiles. None: trained on whole images
    crop_pct: float | None = None  # a classifier's evaluation framing (`vitkit.data.Framing`), as its weights'
    interpolation: str | None = None  # publishers evaluated them (timm's pretrained_cfg, a transformers image
    crop_mode: str | None = None  # processor); None: Framing's defaults (crop_pct 1, bilinear, centre crop)

    def to_json(self) -> dict[str, Any]:
        """The known entries, as config.json stores them (tuples as lists)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v
            for k, v in values.items()
            if v is not None
        }

    def without_classes(self) -> ModelInfo:
        """The entries that stay true of a model whose classifier is not the saved one: the normalisation, the
        framing, the reading of detections, the tiles and the weights it started from (the classes, their category
        ids and the data they came from dropped)."""
        return ModelInfo(
            mean=self.mean,
            std=self.std,
            postprocess=self.postprocess,
            weights=self.weights,
            crop_pct=self.crop_pct,
            interpolation=self.interpolation,
            crop_mode=self.crop_mode,
            tile=self.tile,
        )

    def framing(self) -> Framing:
        """How images become the model's input in evaluation (`vitkit.data.eval_transform`)."""
        given = {"crop_pct": self.crop_pct, "interpolation": self.interpolation, "crop_mode": self.crop_mode}
        return Framing(**{k: v for k, v in given.items() if v is not None})


INFO_ENTRIES = tuple(f.name for f in dataclasses.fields(ModelInfo))  # config.json's entries beside the config


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _names(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def _ids(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(_integer(v) for v in value)


# entry -> (check, what it must be); mean and std are checked together (`check_normalisation`)
_ENTRY_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "classes": (_names, "a list of class names (strings)"),
    "category_ids": (_ids, "a list of integers"),
    "postprocess": (lambda v: isinstance(v, Mapping), "an object of postprocessing settings"),
    "data": (lambda v: isinstance(v, str) and bool(v), "the data's name or folder (a string)"),
    "val_fraction": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "split_seed": (_integer, "an integer"),
    "weights": (lambda v: isinstance(v, str) and bool(v), "where the weights came from (a string)"),
    "tile": (lambda v: _integer(v) and v > 0, "a positive number of pixels"),
    "crop_pct": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "interpolation": (lambda v: isinstance(v, str) and v in INTERPOLATIONS, f"one of {', '.join(INTERPOLATIONS)}"),
    "crop_mode": (lambda v: isinstance(v, str) and v in CROP_MODES, f"one of {', '.join(CROP_MODES)}"),
}


def check_model_info(
    values: Mapping[str, Any], num_classes: int, source: str, in_chans: int | None = None
) -> ModelInfo:
    """A `ModelInfo` from loose values (config.json's entries, or a ModelInfo's fields) for a model of
    `num_classes` classes and `in_chans` channels; ValueError naming `source`, the entry and what is wrong."""
    given = {k: values.get(k) for k in INFO_ENTRIES}
    for name, (check, expected) in _ENTRY_CHECKS.items():
        if given[name] is not None and not check(given[name]):
            raise ValueError(f"{source}: {name} must be {expected}, got {given[name]!r}")
    for name in ("classes", "category_ids"):
        items = given[name]
        if items is None:
            continue
        if len(items) != num_classes:
            raise ValueError(f"{source}: {len(items)} {name} for a model with {num_classes} classes")
        repeated = sorted({v for v in items if list(items).count(v) > 1})
        if repeated:
            raise ValueError(f"{source}: {name} repeat {repeated}")
    if (given["mean"] is None) != (given["std"] is None):
        raise ValueError(f"{source}: mean and std come together; got only {'mean' if given['std'] is None else 'std'}")
    if given["mean"] is not None:
        given["mean"], given["std"] = check_normalisation(given["mean"], given["std"], source, in_chans)
    if given["data"] is None and (given["val_fraction"] is not None or given["split_seed"] is not None):
        raise ValueError(f"{source}: val_fraction and split_seed describe the split of the data, which is not given")
    return ModelInfo(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if k != "postprocess"},
        postprocess=None if given["postprocess"] is None else dict(given["postprocess"]),
    )


def model_info(model: nn.Module) -> ModelInfo:
    """The `ModelInfo` that `from_pretrained` set on `model` (an empty one otherwise), without its class names once
    the classifier they name was replaced (`reset_classifier`: a fresh head, of any number of classes)."""
    info = getattr(model, INFO_ATTRIBUTE, None)
    if not isinstance(info, ModelInfo):
        return ModelInfo()
    config = getattr(model, INFO_CONFIG_ATTRIBUTE, None)
    if info.classes is not None and config is not None and getattr(model, "config", None) is not config:
        return info.without_classes()
    return info


def info_for(model: nn.Module, info: ModelInfo | None, source: str) -> ModelInfo:
    """`info` checked against `model`: as many classes, mean / std values for its channels. None: what the model
    carries (`model_info`: what `from_pretrained` or `create_model(..., pretrained=True)` set on it), without its
    class names where they no longer number the classifier's outputs."""
    config = model.config
    num_classes, in_chans = getattr(config, "num_classes", 0), getattr(config, "in_chans", None)
    if info is None:
        info = model_info(model)
        if info.classes is not None and len(info.classes) != num_classes:
            info = info.without_classes()
    values = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    return check_model_info(values, num_classes, source, in_chans)


def save_pretrained(
    model: nn.Module,
    directory: str | os.PathLike,
    info: ModelInfo | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model` to `directory` as `config.json` (family, every config field, and the entries of `info`) and
    `model.safetensors`. Returns the directory. `from_pretrained(directory)` rebuilds an equal model.

    Args:
        model: a vitkit model.
        directory: created if missing.
        info: what the model needs to be used without its training data (class names, normalisation, ...; see
            `ModelInfo`); None: what the model carries, as timm's and transformers' models keep their labels and
            preprocessing (`model_info`: set by `from_pretrained` and `create_model(..., pretrained=True)`; nothing
            for a model built fresh), its class names only while the classifier has as many outputs.
        state_dict: the weights to write, when not `model.state_dict()`: a sharded model's, gathered
            (`vitkit.train.sharding.full_state_dict`).

    Example: ``save_pretrained(model, "runs/mine", ModelInfo(classes=("cat", "dog"), mean=(0.5,) * 3,
    std=(0.25,) * 3))``.
    """
    if isinstance(model, FeatureMaps):
        raise ValueError(
            "a features model (features_only=True) holds its classifier pruned to the outputs it gives, which no "
            "config describes: save the whole model (vitkit.save_pretrained(model, DIR)) and build the features "
            "model from it (vitkit.from_pretrained(DIR, features_only=True, out_indices=...))"
        )
    fam = family_of(model)
    info = info_for(model, info, source="save_pretrained")
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
    model: nn.Module,
    state: dict[str, torch.Tensor],
    source: str,
    unmatched: typing.Sequence[str] = (),
    hint: typing.Callable[[list[str], list[str]], str] | None = None,
) -> None:
    """Raise ValueError listing missing, unexpected and shape-mismatched keys (a few of each, with counts).

    `unmatched`: checkpoint keys that a converter could not rename, reported as unexpected under their own names.
    `hint`: (missing, unexpected) -> the setting that would make them fit, in words ("" when none does).
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
    words = hint(missing, unexpected) if hint is not None and not mismatched else ""
    words = f". {words}" if words else ""
    raise ValueError(f"{source} does not fit {type(model).__name__}: " + "; ".join(parts) + words)


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


def read_model_dir(
    directory: str | os.PathLike, overrides: Mapping[str, Any] | None = None
) -> tuple[str, Any, ModelInfo]:
    """(family, config, `ModelInfo`) of a vitkit model directory: its `config.json`, every entry checked, with the
    config fields in `overrides` replaced (the entries about the classes are checked against the saved config).
    ValueError naming the entry that is wrong, the fields missing or unknown, or what a directory of vitkit's early
    split layout (`SPLIT_LAYOUT`) lacks in its config.json."""
    directory = Path(directory)
    path = directory / CONFIG_NAME
    saved = read_json(path)
    if not isinstance(saved, dict) or "family" not in saved or "config" not in saved:
        raise ValueError(f"{path} has no 'family' and 'config' entries: not a vitkit model directory")
    fam = family(saved["family"])
    beside = [name for name in SPLIT_LAYOUT if (directory / name).is_file()]
    if beside and "data" not in saved:
        detector = fam.task == DETECTION
        held = ("classes", "category_ids", "postprocess", "data") if detector else ("classes", "data", "val_fraction")
        lacking = [k for k in held if k not in saved]
        raise ValueError(
            f"{directory} keeps its model's description in {' and '.join(beside)}, which vitkit does not read: its "
            f"{CONFIG_NAME} lacks the entries {lacking} that hold it. Write the directory again with this vitkit "
            "(vitkit train, or save_pretrained with the model's ModelInfo)"
        )
    version = saved.get("format_version")
    if "format_version" not in saved:
        raise ValueError(f"{path} has no 'format_version'; this vitkit reads format_version {FORMAT_VERSION}")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        raise ValueError(
            f"{path}: format_version {version!r} is not one this vitkit reads ({', '.join(map(str, READ_VERSIONS))})"
            + ("; it was written by a newer vitkit: upgrade vitkit to read it" if newer else "")
        )
    if not isinstance(saved["config"], dict):
        raise ValueError(f"{path}: 'config' must be an object of config fields, got {saved['config']!r}")
    known = {"format_version", "family", "config", *INFO_ENTRIES}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise ValueError(f"{path}: unknown entries {unknown}; a vitkit config.json holds {sorted(known)}")
    names = {f.name for f in dataclasses.fields(fam.config_cls)}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - names)
    if unknown:  # the caller's, not the file's: worded as `create_model` words them
        raise ValueError(f"{fam.config_cls.__name__} has no field(s) {unknown}; its fields are {sorted(names)}")
    fields = dict(saved["config"])
    added = {name for later, names in ADDED.items() if later > version for name in names}
    if added:  # the fields added since take the values the file's models were built with: their defaults
        defaults = {f.name: f.default for f in dataclasses.fields(fam.config_cls) if f.name in added}
        fields = {**defaults, **fields}
    config = _config_from_dict(fam.config_cls, {**fields, **overrides}, str(path))
    info = check_model_info(saved, fields.get("num_classes", 0), str(path), fields.get("in_chans"))
    return fam.name, config, info


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
    "ModelInfo",
    "check_finite",
    "check_model_info",
    "check_state_dict",
    "info_for",
    "is_hf_config",
    "model_info",
    "read_checkpoint",
    "read_json",
    "read_model_dir",
    "save_pretrained",
]
