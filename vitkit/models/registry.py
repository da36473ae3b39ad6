"""The model registry: one place that builds every vitkit model.

A family (``vit``, ``swin``, ...) pairs a frozen config dataclass with the module built from it. A named
variant is a registry entry holding a filled config; `create_model(name, **overrides)` replaces config
fields with `dataclasses.replace` and builds the module.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class Family:
    name: str  # short family name stored in saved configs, e.g. "vit"
    config_cls: type  # the frozen config dataclass
    model_cls: type[nn.Module]  # built as model_cls(config)


@dataclass(frozen=True)
class ModelEntry:
    name: str  # registry name, e.g. "vit_small_patch16_224"
    family: str  # Family.name
    config: Any  # the family's config dataclass, filled
    paper: str  # the paper that defines the variant (title, arXiv id)


_FAMILIES: dict[str, Family] = {}
_MODELS: dict[str, ModelEntry] = {}


def register_family(name: str, config_cls: type, model_cls: type[nn.Module]) -> None:
    """Declare a model family; `model_cls(config)` must build the model and keep it as `model.config`."""
    if name in _FAMILIES:
        raise ValueError(f"model family {name!r} is already registered")
    _FAMILIES[name] = Family(name, config_cls, model_cls)


def register_model(name: str, family: str, config: Any, paper: str = "") -> None:
    """Register a named variant: a filled config of a registered family."""
    if name in _MODELS:
        raise ValueError(f"model {name!r} is already registered")
    if family not in _FAMILIES:
        raise ValueError(f"unknown model family {family!r}; families are {sorted(_FAMILIES)}")
    if not isinstance(config, _FAMILIES[family].config_cls):
        raise TypeError(f"{name}: config must be a {_FAMILIES[family].config_cls.__name__}")
    _MODELS[name] = ModelEntry(name, family, config, paper)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style `pattern` (e.g. ``"vit_*"``), sorted."""
    return sorted(name for name in _MODELS if fnmatch.fnmatchcase(name, pattern))


def model_entry(name: str) -> ModelEntry:
    """The registry entry for `name`; ValueError naming the closest registered names if there is none."""
    if name not in _MODELS:
        close = difflib.get_close_matches(name, list(_MODELS), n=5, cutoff=0.5)
        hint = f"; closest: {', '.join(close)}" if close else f"; see list_models() ({len(_MODELS)} models)"
        raise ValueError(f"unknown model {name!r}{hint}")
    return _MODELS[name]


def family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"unknown model family {name!r}; families are {sorted(_FAMILIES)}")
    return _FAMILIES[name]


def family_of(model: nn.Module) -> Family:
    """The registered family whose module class built `model`."""
    for fam in _FAMILIES.values():
        if type(model) is fam.model_cls:
            return fam
    raise ValueError(f"{type(model).__name__} is not a vitkit model (registered families: {sorted(_FAMILIES)})")


def replace_config(config: Any, **overrides: Any) -> Any:
    """`dataclasses.replace` with a clear error for field names the config does not have."""
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"{type(config).__name__} has no field(s) {unknown}; its fields are {sorted(fields)}")
    return dataclasses.replace(config, **overrides)


def build_model(family_name: str, config: Any) -> nn.Module:
    """Build a model of a registered family from a config."""
    return family(family_name).model_cls(config)


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build the registered variant `name`, with config fields replaced by `overrides`.

    Example: ``create_model("vit_small_patch16_224", num_classes=10, img_size=32)``.
    """
    entry = model_entry(name)
    return build_model(entry.family, replace_config(entry.config, **overrides))
