"""The model registry: one place that builds every vitkit model, and where each family declares itself.

A family (``vit``, ``swin``, ...) pairs a frozen config dataclass with the module built from it, and declares once
what the rest of vitkit needs to know about it (`register_family`): its task, the module holding its weight formats,
its training-recipe defaults, and how its top-level modules read in cost reports. Everything else a family provides
is a method of its model (`vitkit.models.interface`). A named variant is a registry entry holding a filled config;
`create_model(name, **overrides)` replaces config fields with `dataclasses.replace` and builds the module.

A new family is its model file (config, modules, `register_family`, `register_model` rows), its weights file
(`vitkit.weights.<family>`, see `vitkit.weights.family`) and one row in the registry-wide test table
(`tests/models/test_all_models.py`); docs/architecture.md lists what each must provide.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from vitkit.kernels.policy import BACKENDS, check_backend, knows
from vitkit.models.interface import DETECTOR_METHODS, METHODS

CLASSIFICATION, DETECTION = "classification", "detection"
TASKS = (CLASSIFICATION, DETECTION)
COST_PARTS = ("embedding", "backbone", "heads")  # what a family's top-level modules can be in cost reports


@dataclass(frozen=True)
class Family:
    name: str  # short family name stored in saved configs, e.g. "vit"
    config_cls: type  # the frozen config dataclass
    model_cls: type[nn.Module]  # built as model_cls(config)
    task: str = CLASSIFICATION  # what its models do: "classification" (VitkitModel) or "detection" (VitkitDetector)
    display_name: str = ""  # how people write the family in messages, e.g. "ViT"
    weights: str | None = None  # the module declaring its weight formats (a `WEIGHTS` = vitkit.weights.FamilyWeights),
    # imported when weights are read or written; None: vitkit's own (timm's) names only
    recipe: Mapping[str, Any] = field(default_factory=dict)  # training-option defaults (vitkit.train.Recipe fields)
    cost_parts: Mapping[str, str] = field(default_factory=dict)  # top-level module -> one of COST_PARTS, for the
    # cost reports' split (attention and MLP layers are found by their type)


LAYOUTS = ("timm", "hf", "torchvision")
"""How published weights are read: "timm", a timm repository (vitkit's own names; its config.json gives the
normalisation); "hf", a transformers model directory (config.json with its labels, the weights); "torchvision", a
torch file of a ResNet classifier, a detector's backbone only."""


# Where messages send people for the registered models and the published weights: the command and the function
MODELS_LISTED = "`vitkit models` / vitkit.list_models()"
PRETRAINED_LISTED = "`vitkit models --pretrained` / vitkit.list_pretrained()"

LABEL_SETS = ("imagenet-1k",)  # label names a table of published weights may cite (`vitkit.weights.hub.label_names`)


@dataclass(frozen=True)
class PublishedWeights:
    """Weights someone published for a registered variant: `vitkit.create_model(name, pretrained=tag)` downloads and
    loads them (`vitkit.weights.hub`)."""

    tag: str  # how users pick them, as timm names its tags: "name.tag", e.g. "augreg2_in21k_ft_in1k"
    source: str  # "hf-hub:ORG/REPO" (a Hugging Face Hub repository) or the https URL of a torch file (torch.hub's)
    layout: str  # one of LAYOUTS
    data: str  # what they were trained on
    licence: str  # as their publisher gives it
    fields: Mapping[str, Any] = field(default_factory=dict)  # config fields they need beside the variant's (a head
    # of another number of classes, none)
    labels: str | None = None  # the label names of their head where the source carries none: "imagenet-1k"
    size_mb: float | None = None  # the download in MB where it is not the model's own tensors in float32 (a
    # backbone's file); None: those (`vitkit.weights.hub.download_mb`)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not self.source.startswith(("hf-hub:", "https://")):
            raise ValueError(f"source must be hf-hub:ORG/REPO or an https URL, got {self.source!r}")
        if self.labels is not None and self.labels not in LABEL_SETS:
            raise ValueError(f"labels must be one of {LABEL_SETS} or None, got {self.labels!r}")


@dataclass(frozen=True)
class TimmTag:
    """Weights timm publishes for a variant of the same name as timm's: its Hub repository `timm/NAME.TAG`."""

    tag: str  # e.g. "augreg2_in21k_ft_in1k"
    data: str  # what they were trained on
    fields: Mapping[str, Any] = field(default_factory=dict)  # config fields beside the variant's
    labels: str | None = "imagenet-1k"  # the label names of their head (None: no names published, or no head)
    licence: str = "Apache-2.0"  # as timm's pretrained config gives it

    def weights(self, name: str) -> PublishedWeights:
        return PublishedWeights(
            self.tag, f"hf-hub:timm/{name}.{self.tag}", "timm", self.data, self.licence, self.fields, self.labels
        )


@dataclass(frozen=True)
class ModelEntry:
    name: str  # registry name, e.g. "vit_small_patch16_224"
    family: str  # Family.name
    config: Any  # the family's config dataclass, filled
    paper: str  # the paper that defines the variant (title, arXiv id)
    recipe: Mapping[str, Any] = field(default_factory=dict)  # training-option defaults of this variant, over the
    # family's
    pretrained: tuple[PublishedWeights, ...] = ()  # the weights published for it, the default first
    unpublished: str = ""  # why none are, where none are


_FAMILIES: dict[str, Family] = {}
_MODELS: dict[str, ModelEntry] = {}


def register_family(
    name: str,
    config_cls: type,
    model_cls: type[nn.Module],
    *,
    task: str = CLASSIFICATION,
    display_name: str | None = None,
    weights: str | None = None,
    recipe: Mapping[str, Any] | None = None,
    cost_parts: Mapping[str, str] | None = None,
) -> None:
    """Declare a model family; `model_cls(config)` must build the model, keep it as `model.config` and provide
    the methods of `vitkit.models.interface.VitkitModel` (and of `VitkitDetector` for task "detection").

    Args:
        name: the family's short name, stored in saved configs.
        config_cls: its frozen config dataclass.
        model_cls: its module class.
        task: "classification" or "detection".
        display_name: how people write it in messages (default: `name`).
        weights: the module declaring its weight formats, e.g. "vitkit.weights.vit".
        recipe: defaults of `vitkit.train.TrainConfig` options for its models (`vitkit.train.Recipe` fields).
        cost_parts: top-level module name -> "embedding", "backbone" or "heads", for cost reports.
    """
    if name in _FAMILIES:
        raise ValueError(f"model family {name!r} is already registered")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    methods = METHODS + (DETECTOR_METHODS if task == DETECTION else ())
    missing = [method for method in methods if not callable(getattr(model_cls, method, None))]
    if missing:
        raise TypeError(f"{model_cls.__name__} lacks {missing} of the vitkit model interface (models/interface.py)")
    if task == DETECTION and not isinstance(getattr(model_cls, "no_object_logit", None), bool):
        raise TypeError(
            f"{model_cls.__name__} must declare no_object_logit (a bool: whether its class logits end with a "
            '"no object" logit) as a detector (models/interface.py)'
        )
    unknown = sorted(set((cost_parts or {}).values()) - set(COST_PARTS))
    if unknown:
        raise ValueError(f"cost_parts values must be among {COST_PARTS}, got {unknown}")
    _FAMILIES[name] = Family(
        name, config_cls, model_cls, task, display_name or name, weights, dict(recipe or {}), dict(cost_parts or {})
    )


def register_model(
    name: str,
    family: str,
    config: Any,
    paper: str = "",
    *,
    recipe: Mapping[str, Any] | None = None,
    pretrained: Sequence[PublishedWeights | TimmTag] = (),
    unpublished: str = "",
) -> None:
    """Register a named variant: a filled config of a registered family, with training-recipe defaults of its own
    over the family's (`recipe`) and the weights published for it, the default first (`pretrained`; a `TimmTag`
    names timm's repository of the variant's name), or why there are none (`unpublished`)."""
    if name in _MODELS:
        raise ValueError(f"model {name!r} is already registered")
    if family not in _FAMILIES:
        raise ValueError(f"unknown model family {family!r}; families are {sorted(_FAMILIES)}")
    if not isinstance(config, _FAMILIES[family].config_cls):
        raise TypeError(f"{name}: config must be a {_FAMILIES[family].config_cls.__name__}")
    pretrained = [w.weights(name) if isinstance(w, TimmTag) else w for w in pretrained]
    tags = [w.tag for w in pretrained]
    if len(set(tags)) != len(tags) or any("." in tag for tag in tags):
        raise ValueError(f"{name}: weight tags must be distinct and without '.', got {tags}")
    if pretrained and unpublished:
        raise ValueError(f"{name}: published weights and a reason there are none, {unpublished!r}")
    _MODELS[name] = ModelEntry(name, family, config, paper, dict(recipe or {}), tuple(pretrained), unpublished)


def families() -> list[Family]:
    """Every registered family, in registration order."""
    return list(_FAMILIES.values())


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style `pattern` (e.g. ``"vit_*"``), sorted."""
    return sorted(name for name in _MODELS if fnmatch.fnmatchcase(name, pattern))


def list_pretrained(pattern: str = "*") -> list[str]:
    """The published weights of the registered models, as "name.tag" (the default tag of each model first) matching a
    shell-style `pattern` (e.g. ``"vit_base*"``)."""
    return [
        f"{name}.{w.tag}"
        for name in list_models()
        for w in _MODELS[name].pretrained
        if fnmatch.fnmatchcase(f"{name}.{w.tag}", pattern) or fnmatch.fnmatchcase(name, pattern)
    ]


def published_weights(name: str, pretrained: bool | str = True) -> tuple[ModelEntry, PublishedWeights]:
    """The registry entry and the published weights `pretrained` names for the model `name` ("name.tag" names its
    tag too): True the default, or a tag. ValueError listing the model's tags when it has none of that name."""
    name, _, tag = name.partition(".")
    entry = model_entry(name)
    if isinstance(pretrained, str):
        if tag and tag != pretrained:
            raise ValueError(f"two tags given: {name}.{tag} and pretrained={pretrained!r}")
        tag = pretrained
    tags = [w.tag for w in entry.pretrained]
    if not tags:
        why = f": {entry.unpublished}" if entry.unpublished else ""
        raise ValueError(f"no weights are published for {name}{why} ({PRETRAINED_LISTED} list those that are)")
    if not tag:
        return entry, entry.pretrained[0]
    if tag not in tags:
        raise ValueError(f"{name} has no weights tagged {tag!r}; its tags: {', '.join(tags)} (the first, the default)")
    return entry, entry.pretrained[tags.index(tag)]


def weights_at(source: str) -> tuple[ModelEntry, PublishedWeights] | None:
    """The registered model and published weights whose source is `source` (e.g. "hf-hub:timm/NAME.TAG"); None
    when no table names it."""
    for entry in _MODELS.values():
        for weights in entry.pretrained:
            if weights.source == source:
                return entry, weights
    return None


def closest_models(text: str, n: int = 5) -> list[str]:
    """The registered model names closest to `text` (a misspelt or partial name, or a pattern that matches none:
    "vit_smal", "swin_tiny"), at most `n`: those holding it first (those starting with it before the others), then
    the most alike by difflib, each most alike first; none when nothing is close."""
    alike = difflib.SequenceMatcher(b=text)

    def order(name: str) -> tuple[bool, float]:
        alike.set_seq1(name)  # difflib compares changing first sequences with a fixed second one
        return not name.startswith(text), -alike.ratio()

    holding = sorted(list_models(f"*{text}*"), key=order)
    close = difflib.get_close_matches(text, list(_MODELS), n=n, cutoff=0.5)
    return list(dict.fromkeys(holding + close))[:n]


def model_entry(name: str) -> ModelEntry:
    """The registry entry for `name`; ValueError naming the closest registered names if there is none."""
    if name not in _MODELS:
        close = closest_models(name)
        hint = f"; closest: {', '.join(close)}" if close else f"; see {MODELS_LISTED} ({len(_MODELS)} models)"
        raise ValueError(f"unknown model {name!r}{hint}")
    return _MODELS[name]


def family(name: str) -> Family:
    """The registered family `name`; ValueError listing the families if there is none."""
    if name not in _FAMILIES:
        raise ValueError(f"unknown model family {name!r}; families are {sorted(_FAMILIES)}")
    return _FAMILIES[name]


def family_of(model: nn.Module) -> Family:
    """The registered family whose module class built `model` (sharded by FSDP, which subclasses it, or not)."""
    cls = type(model)
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: nothing was sharded (and it imports slowly)
    if fsdp is not None and issubclass(cls, fsdp.FSDPModule):  # fully_shard made it FSDP<class>(FSDPModule, class)
        cls = next(c for c in cls.__mro__ if not issubclass(c, fsdp.FSDPModule))
    for fam in _FAMILIES.values():
        if cls is fam.model_cls:
            return fam
    raise ValueError(f"{type(model).__name__} is not a vitkit model (registered families: {sorted(_FAMILIES)})")


_SCALARS = {"int": int, "float": (int, float), "bool": bool, "str": str}
Fields = tuple  # the annotation of a config field that holds another config's fields (`as_fields`)


def as_fields(value: Mapping[str, Any] | Sequence[Sequence[Any]]) -> tuple[tuple[str, Any], ...]:
    """Config fields given as a dict or as (name, value) pairs (JSON's lists too) as a `Fields` value: (name, value)
    pairs sorted by name, lists as tuples, so that the config holding them stays hashable and comparable."""
    items = value.items() if isinstance(value, Mapping) else value
    pairs = []
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str):
            raise ValueError(f"expected config fields as a dict or (name, value) pairs, got {value!r}")
        name, field_value = item
        pairs.append((name, tuple(field_value) if isinstance(field_value, list) else field_value))
    return tuple(sorted(pairs))


def _value_matches(value: Any, annotation: str) -> bool:
    """Whether `value` fits a config annotation written as a string: int, float, bool, str, None, tuple[T, ...],
    tuple[T, T] and unions of these with `|`."""
    for option in (part.strip() for part in annotation.split("|")):
        if option == "None":
            if value is None:
                return True
        elif option.startswith("tuple[") and option.endswith("]"):
            inner = [t.strip() for t in option[len("tuple[") : -1].split(",")]
            if isinstance(value, tuple):
                if inner[-1] == "...":
                    if all(_value_matches(v, inner[0]) for v in value):
                        return True
                elif len(value) == len(inner) and all(_value_matches(v, t) for v, t in zip(value, inner, strict=True)):
                    return True
        elif option == "Fields":
            pairs = isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value)
            if pairs and all(isinstance(name, str) for name, _ in value):
                return True
        elif option in _SCALARS:
            # bool is an int in Python, but a config's True is never meant as a count
            if isinstance(value, _SCALARS[option]) and (option == "bool" or not isinstance(value, bool)):
                return True
    return False


def check_field_types(config: Any) -> None:
    """ValueError naming the field, what it takes and what came, for each config value of the wrong type
    (e.g. the string 'False' for a bool, 2.5 for a depth). Family configs call it first in `__post_init__`."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not _value_matches(value, str(f.type)):
            raise ValueError(f"{type(config).__name__}.{f.name} takes {f.type}, got {value!r}")


def check_positive(config: Any, *names: str) -> None:
    """ValueError for a config field among `names` that is not > 0 (a size, count or ratio)."""
    for name in names:
        value = getattr(config, name)
        if value <= 0:
            raise ValueError(f"{type(config).__name__}.{name} must be > 0, got {value!r}")


def check_rates(config: Any, *names: str) -> None:
    """ValueError for a config field among `names` that is not a probability in [0, 1) (dropout rates)."""
    for name in names:
        value = getattr(config, name)
        if not 0 <= value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be in [0, 1), got {value!r}")


def backend_overrides(name: str, backend: str) -> dict[str, str]:
    """The config fields that switch the attention layers of the registered model `name` that know `backend` to it,
    as `vitkit.layers.set_attention_backend` switches a built model's: `attn_backend` for the dense layers and, where
    the config has it, `deformable_backend` for the deformable ones."""
    check_backend(backend, BACKENDS)
    fields = {f.name for f in dataclasses.fields(model_entry(name).config)}
    kinds = {"attn_backend": False, "deformable_backend": True}  # each kind of layer's field: deformable?
    overrides = {f: backend for f, deformable in kinds.items() if f in fields and knows(backend, deformable)}
    if not overrides:
        raise ValueError(f"{name} has no attention layer with a {backend!r} backend")
    return overrides


def replace_config(config: Any, **overrides: Any) -> Any:
    """`dataclasses.replace` with a clear error for field names the config does not have."""
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"{type(config).__name__} has no field(s) {unknown}; its fields are {sorted(fields)}")
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}  # (H, W) as a list too
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
