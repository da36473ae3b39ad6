"""Loading weights from other libraries' checkpoints into vitkit models, and writing them back.

Formats (`formats()`): "vitkit" (= "timm": vitkit keeps timm's parameter names) and those the families declare in
their weights files (`vitkit.weights.<family>`, `FamilyWeights.layouts`): today torchvision, hf (Hugging Face
transformers), facebookresearch/detr's DETR, fundamentalvision/Deformable-DETR, vit-pytorch and PaddleViT (`.pdparams`,
read without Paddle). A checkpoint is renamed by its
format's table for the model's family, fitted to the model (e.g. a ViT's position table resampled; the classifier,
and whatever else is sized by the classes, kept on request), its keys and shapes checked, and only then loaded. A
format may hold one part of a model (a detector's "torchvision" files are ResNet classifiers: its backbone), the
rest keeping its initialisation. Conversions rename, concatenate and split; where a library stores a tensor
otherwise (Paddle's Linear weights [in, out], vit-pytorch's patches flattened in (p1 p2 c) order, a CLIP class
embedding without its batch dims), its rule maps the values too. A format whose files carry no config (vit-pytorch's,
PaddleViT's) builds its model from their shapes.
`from_pretrained` builds and loads the model of a directory (vitkit's or Hugging Face's) or of a file of such a
format; `load_weights` loads any checkpoint into a model built otherwise (`vitkit.create_model`); `convert` reads a
directory or a checkpoint file in one layout and writes another.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from vitkit.errors import OptionFileExistsError
from vitkit.models.backbone import FeatureMaps
from vitkit.models.registry import build_model, create_model, family_of, list_models, model_entry, replace_config
from vitkit.util import atomic_write, listed
from vitkit.weights import hf, shapes
from vitkit.weights.errors import CheckpointMismatch, LayoutMismatch, ModelNeeded, ModelNotNeeded, shown_models
from vitkit.weights.family import FamilyWeights, family_weights, hf_model_types, registered_weights, source_formats
from vitkit.weights.hub import HUB_PREFIX, HubSnapshot, hub_snapshot, is_hub, published_labels
from vitkit.weights.io import (
    CONFIG_NAME,
    INFO_ATTRIBUTE,
    INFO_CONFIG_ATTRIBUTE,
    PDPARAMS_SUFFIX,
    PICKLE_SUFFIXES,
    WEIGHTS_NAME,
    ModelInfo,
    check_finite,
    check_model_info,
    check_state_dict,
    info_for,
    is_hf_config,
    model_info,
    read_checkpoint,
    read_json,
    read_model_dir,
    save_pretrained,
)
from vitkit.weights.pdparams import write_pdparams
from vitkit.weights.rename import Layout
from vitkit.weights.timm_repo import is_timm_config, timm_info, timm_model

# Entries that wrap the state dict in training checkpoints, tried in this order.
WRAPPER_ENTRIES = ("state_dict", "model", "model_ema")
# Key prefixes added by wrappers: DistributedDataParallel / DataParallel, Lightning-style modules, torch.compile.
WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")
REPORT_ATTRIBUTE = "load_report"  # the `LoadReport` that from_pretrained sets on the model it returns


@dataclass
class LoadReport:
    """What `load_weights` (or `from_pretrained`) did."""

    source: str  # the file read, or "state dict"
    format: str  # the layout the checkpoint was read as: "vitkit" or a format of `formats()`
    loaded: int = 0  # tensors copied into the model
    unwrapped: list[str] = field(default_factory=list)  # wrapper entries and key prefixes removed
    resampled: list[str] = field(default_factory=list)  # tensors fitted to the model's size, with old -> new
    loaded_keys: list[str] = field(default_factory=list)  # the model keys loaded, in the model's order
    head_reset: bool = False  # the checkpoint's classifier was skipped; the model kept its own
    checkpoint_classes: int | None = None  # the classes of the checkpoint's classifier (its rows less the family's
    # extra outputs); None when it has none
    reset: list[str] = field(default_factory=list)  # model keys sized by the classes (the classifier's and the
    # family's `class_sized`) that keep the model's initialisation: skipped (reset_head), or not in the checkpoint
    uncovered: list[str] = field(default_factory=list)  # the other model keys outside the part that a checkpoint of
    # one part holds (`Layout.part`: a ResNet classifier's file gives a detector's backbone), left as initialised
    dropped: list[str] = field(default_factory=list)  # checkpoint keys with no vitkit counterpart, skipped
    missing: list[str] = field(default_factory=list)  # model keys left as initialised (strict=False only)
    unexpected: list[str] = field(default_factory=list)  # checkpoint keys not used (strict=False only)
    mismatched: list[str] = field(default_factory=list)  # keys skipped for their shape (strict=False only)
    assumed: list[str] = field(default_factory=list)  # what a model built from a config-less file's shapes assumed
    # that neither the shapes nor the fields given said (`from_pretrained` of such a file), in words
    kept: dict[str, str] = field(default_factory=dict)  # config fields no tensor says (`FamilyWeights.unread_fields`)
    # that a model named for the checkpoint kept from its registered config though fields the shapes do say were set
    # to fit the checkpoint (`convert`: a ViT's num_heads when embed_dim was set): field -> its value and why it is
    # in doubt, in words

    @property
    def adapted(self) -> bool:
        """Whether the model differs from the checkpoint beyond renaming: tensors resampled, reset or not in it."""
        return bool(self.resampled or self.reset or self.uncovered)

    def summary(self, set_field: Callable[[str], str] = lambda name: f"{name}=N") -> str:
        """A few lines for people: format, counts and everything that was adapted, skipped or assumed. `set_field`
        words how the reader sets a config field (``num_heads=N``; a command: its flag, ``--model-arg num_heads=N``)."""
        lines = [f"{self.source}: {self.format} layout, {self.loaded} tensors loaded"]
        for label, items in (
            ("unwrapped", self.unwrapped),
            ("resampled", self.resampled),
            ("sized by the classes, left as initialised", self.reset),
            ("not in a checkpoint of part of the model (left as initialised)", self.uncovered),
            ("dropped (no vitkit counterpart)", self.dropped),
            ("missing (left as initialised)", self.missing),
            ("unexpected (ignored)", self.unexpected),
            ("shape-mismatched (skipped)", self.mismatched),
            ("assumed", self.assumed),
        ):
            if items:
                lines.append(f"  {label}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}")
        for name, why in self.kept.items():
            lines.append(f"  note: {why}; if its model has another, give {set_field(name)}")
        if self.head_reset:
            lines.append("  classifier: the checkpoint's head was skipped; the model keeps its own")
        return "\n".join(lines)


def formats() -> tuple[str, ...]:
    """The format names weights are read and written in: "vitkit", "timm" (the same names) and every format a
    registered family has a rename table for, e.g. ("vitkit", "timm", "torchvision", "hf", ...)."""
    return ("vitkit", "timm", *source_formats())


# Whose files a format's are, in words, where people name them otherwise than the format (help texts)
FORMAT_SOURCES = {
    "hf": "Hugging Face",
    "detr": "DETR's repository (facebookresearch/detr)",
    "deformable_detr": "Deformable DETR's repository (fundamentalvision/Deformable-DETR)",
    "vit-pytorch": "vit-pytorch",
    "paddlevit": "PaddleViT",
}
DIRECTORY_FORMATS = ("vitkit", "hf")  # the formats `export_weights` writes as a directory; the others as one file


def format_sources() -> list[str]:
    """Whose files each format of `formats()` reads and writes, in words, in that order (a format without words in
    `FORMAT_SOURCES` by its name): what `vitkit convert --help` lists."""
    return [FORMAT_SOURCES.get(name, name) for name in formats()]


def config_less_formats() -> tuple[str, ...]:
    """The formats whose files carry no config, so that the model is built from their shapes
    (`Layout.read_config`: vit-pytorch's, PaddleViT's), in the order of `formats()`."""
    built = {layout.format for w in registered_weights().values() for layout in w.layouts if layout.read_config}
    return tuple(name for name in formats() if name in built)


def unwrap_state_dict(obj: Mapping[str, Any], source: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The state dict inside a training checkpoint: wrapper entries (`state_dict`, `model`, `model_ema`) and
    key prefixes (`module.`, `model.`, `_orig_mod.`) removed. Returns (state dict, what was removed)."""
    notes: list[str] = []
    while not all(isinstance(v, torch.Tensor) for v in obj.values()):
        entry = next((e for e in WRAPPER_ENTRIES if isinstance(obj.get(e), Mapping)), None)
        if entry is None:
            kinds = sorted({type(v).__name__ for v in obj.values() if not isinstance(v, torch.Tensor)})
            raise ValueError(
                f"{source} holds {kinds} values beside tensors and none of the entries {list(WRAPPER_ENTRIES)} "
                f"that wrap a state dict; top-level keys: {list(obj)[:8]}"
            )
        notes.append(f"entry {entry!r}")
        obj = obj[entry]
    if not obj:
        raise ValueError(f"{source} holds no tensors")
    state = dict(obj)
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                notes.append(f"prefix {prefix!r}")
                stripped = True
    return state, notes


def detect_format(state: Mapping[str, torch.Tensor], family: str, source: str) -> str:
    """The format of a state dict, recognised from its keys; ValueError when it is no known layout of `family`."""
    keys = set(state)
    weights = family_weights(family)
    if weights.markers and keys.issuperset(weights.markers):
        return "vitkit"
    for layout in weights.layouts:
        if layout.matches(keys):
            return layout.format
    if not weights.markers:
        return "vitkit"  # a family without markers: its own (timm's) names, which the key check verifies
    others, models = _lookalikes(state)
    seen = f"it looks like a {' or '.join(others)} checkpoint" if others else "its keys match no known layout"
    raise CheckpointMismatch(
        f"{source} is not a checkpoint of a {family} model in a known format ({', '.join(formats())}): {seen} "
        f"(first keys: {sorted(keys)[:5]})",
        models=models,
    )


def _lookalikes(state: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """The layouts of every registered family that `state` matches ("hf swin", "vitkit botnet", ...) and the
    registered models it fits."""
    keys, registered = set(state), registered_weights()
    others, models = [], []
    for fmt in source_formats():
        for fam, weights in registered.items():
            layout = weights.layout(fmt)
            if layout is not None and layout.matches(keys):
                # a format named as its family: once; a file of one part: as that part ("torchvision ResNet")
                others.append(f"{fmt} {layout.part_name}" if layout.part else fam if fmt == fam else f"{fmt} {fam}")
                models += shapes.models_with(fam, weights.read_fields(layout.to_vitkit(dict(state))[0]))
    for fam, weights in registered.items():
        if weights.markers and keys.issuperset(weights.markers):
            others.append(f"vitkit {fam}")
            models += shapes.models_with(fam, weights.read_fields(state))
    return list(dict.fromkeys(others)), list(dict.fromkeys(models))


def _layout(family: str, weights: FamilyWeights, fmt: str) -> Layout:
    if fmt not in formats():
        raise ValueError(f"format must be one of {('auto', *formats())}, got {fmt!r}")
    layout = weights.layout(fmt)
    if layout is None:
        raise ValueError(f"there is no {fmt} layout for {family} models")
    return layout


def load_weights(
    model: nn.Module,
    source: str | os.PathLike | Mapping[str, Any],
    format: str = "auto",
    strict: bool = True,
    reset_head: bool = False,
) -> LoadReport:
    """Load a checkpoint of another library (or vitkit's own) into `model`, converting names and layout.

    Args:
        model: a vitkit model of the checkpoint's architecture. A state dict carries no config, so build it
            with the source's settings where they change outputs, e.g. LayerNorm eps (timm and torchvision ViT
            1e-6, Hugging Face ViT 1e-12; `from_pretrained` reads them from a Hugging Face directory). A ViT's
            position table is resampled to the model's grid when the image sizes differ.
        source: a `.safetensors`, `.pth` / `.pt` / `.bin` / `.ckpt` file (read with `torch.load(weights_only=True)`),
            a model directory, or a state dict. Training checkpoints are unwrapped (entries `state_dict`,
            `model`, `model_ema`; key prefixes `module.`, `model.`, `_orig_mod.`).
        format: "auto" (recognised from the keys), "vitkit" / "timm", or a format of the model's family (see
            `formats()`; its weights file `vitkit.weights.<family>` describes each): torchvision, hf, or detr
            (facebookresearch/detr's files, e.g. `detr-r50-e632da11.pth`, or the training checkpoints its
            `main.py` writes: ``{"model": ..., "optimizer": ..., "args": Namespace(...)}``), deformable_detr
            (fundamentalvision/Deformable-DETR's), vit-pytorch (lucidrains' ViT and SimpleViT), paddlevit
            (PaddleViT's ViT / DeiT `.pdparams`). A detector's torchvision format is a ResNet classifier's file
            (torchvision's or timm's): it fills the backbone, the rest of the model keeps its initialisation
            (`LoadReport.uncovered`).
        strict: raise ValueError for missing, unexpected and shape-mismatched keys; when False, load what
            fits and list the rest in the report.
        reset_head: skip the checkpoint's classifier, and the other tensors the family sizes by the classes
            (`FamilyWeights.class_sized`), and keep the model's own (freshly initialised) ones, to fine-tune on
            another number of classes (`LoadReport.reset` lists them). Without it a classifier of another size is
            an error.

    Returns:
        a `LoadReport`.
    """
    if isinstance(model, FeatureMaps):  # cut from a model: the checkpoint is the whole model's
        raise ValueError(
            "a features model takes its weights before it is cut from its model: "
            "vitkit.from_pretrained(PATH, features_only=True, out_indices=...) for a model directory or Hub "
            "repository, or load_weights into vitkit.create_model(NAME) and then "
            "vitkit.models.backbone.FeatureMaps(model, out_indices) for a checkpoint file"
        )
    if isinstance(source, Mapping):
        return _load(model, source, "state dict", format, strict, reset_head)
    return _load(model, read_checkpoint(source), str(source), format, strict, reset_head)


def _load(
    model: nn.Module, obj: Mapping[str, Any], name: str, format: str, strict: bool, reset_head: bool
) -> LoadReport:
    if format not in ("auto", *formats()):
        raise ValueError(f"format must be one of {('auto', *formats())}, got {format!r}")
    fam = family_of(model).name
    state, unwrapped = unwrap_state_dict(obj, name)
    try:
        return _load_state(model, state, unwrapped, name, format, strict, reset_head)
    except ValueError as err:  # read in the layout the user named: say which one it is in, when another
        given = "vitkit" if format == "timm" else format
        try:
            found = detect_format(state, fam, name) if format != "auto" else given
        except ValueError:
            found = given
        if found == given:
            raise
        raise LayoutMismatch(name, format, found) from err


def _load_state(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    unwrapped: Any,
    name: str,
    format: str,
    strict: bool,
    reset_head: bool,
) -> LoadReport:
    fam = family_of(model).name
    weights = family_weights(fam)
    fmt = detect_format(state, fam, name) if format == "auto" else "vitkit" if format == "timm" else format
    report = LoadReport(source=name, format=fmt, unwrapped=unwrapped)
    unmatched: list[str] = []
    layout = None if fmt == "vitkit" else _layout(fam, weights, fmt)
    if layout is not None:
        state, report.dropped, unmatched = layout.to_vitkit(state, model.config)

    expected = model.state_dict()
    names_note = "" if fmt == "vitkit" else " (named as in vitkit)"
    part = layout.part if layout is not None else ""
    channels = _fit_input_channels(weights.input_conv, expected, state)
    if strict:
        _check_architecture(fam, expected, state, name, layout, model.config)
    classes = weights.head + weights.class_sized  # the keys sized by the number of classes
    report.checkpoint_classes = _classes_of(state, weights)
    # The model's own tensors stand in for those the checkpoint does not give (the part it does not hold, a reset
    # classifier), so the key check and the load see a whole model.
    own = {k: v for k, v in expected.items() if not k.startswith(part)} if part else {}
    if reset_head:
        state = {k: v for k, v in state.items() if not k.startswith(classes)}
        own.update((k, v) for k, v in expected.items() if k.startswith(classes))
        report.head_reset = True
    elif not part:
        # class-sized tensors on one side only: the model keeps its own, the checkpoint's are dropped
        extra = [k for k in state if k.startswith(weights.class_sized) and k not in expected]
        state = {k: v for k, v in state.items() if k not in extra}
        report.dropped += extra
        own.update((k, v) for k, v in expected.items() if k.startswith(weights.class_sized) and k not in state)
        body = {k for k in expected if not k.startswith(classes)}
        body_fits = not unmatched and body == {k for k in state if not k.startswith(classes)}
        _check_head(expected, state, weights.head, name, strict and body_fits, weights.extra_outputs)
    report.reset = [k for k in expected if k in own and k.startswith(classes)]
    report.uncovered = [k for k in expected if k in own and not k.startswith(classes)]
    try:
        report.resampled = channels + weights.adapt(model, state)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    expected = model.state_dict()  # the family may have fitted the model to the checkpoint (an older mask head)

    if strict:
        check_state_dict(model, {**state, **own}, source=name, unmatched=unmatched, hint=weights.key_hint)
    else:
        report.missing = [k for k in expected if k not in state and k not in own]
        report.unexpected = [*unmatched, *(k for k in state if k not in expected)]
        report.mismatched = [k for k in expected if k in state and state[k].shape != expected[k].shape]
        state = {k: v for k, v in state.items() if k in expected and v.shape == expected[k].shape}
    check_finite(state, name, names_note)
    model.load_state_dict({**state, **own}, strict=strict)
    report.loaded_keys = [k for k in expected if k in state]
    report.loaded = len(state)
    return report


def _fit_input_channels(
    key: str | None, expected: Mapping[str, torch.Tensor], state: dict[str, torch.Tensor]
) -> list[str]:
    """An RGB checkpoint's input convolution `key` fitted, in place, to a model of other input channels (a grey
    model from ImageNet weights, `shapes.adapt_input_channels`); a line saying so, or none."""
    if key is None or key not in state or key not in expected:
        return []
    ours, theirs = expected[key], state[key]
    if ours.shape[1] == theirs.shape[1] or ours.shape[0] != theirs.shape[0] or ours.shape[2:] != theirs.shape[2:]:
        return []
    fitted = shapes.adapt_input_channels(theirs, ours.shape[1])
    if fitted is None:
        return []
    state[key] = fitted
    how = "summed over R, G and B" if ours.shape[1] == 1 else f"repeated, scaled by 3/{ours.shape[1]}"
    return [f"{key}: 3 -> {ours.shape[1]} input channels ({how}, as timm does)"]


def _classes_of(state: Mapping[str, torch.Tensor], weights: FamilyWeights) -> int | None:
    """The number of classes of a (renamed) checkpoint's classifier: the rows of its first weight less the family's
    extra outputs; None when it has no classifier."""
    key = next((k for k in state if k.startswith(weights.head) and k.endswith("weight")), None)
    return None if key is None else state[key].shape[0] - weights.extra_outputs


def _check_architecture(
    family: str,
    expected: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    source: str,
    layout: Layout | None = None,
    config: Any = None,
) -> None:
    """CheckpointMismatch when the checkpoint's tensors fix config fields (width, depth, patch size, ...) to other
    values than the model's: one line naming them, the registered models of that size and the fields to set. A
    checkpoint of one part of the model (`layout.part`) is named as that part, with its layers that do not fit.

    The fields to set are all that make the model one of those registered models, not only those the shapes show
    (a ViT-Tiny file read into a ViT-Small needs num_heads 3 with embed_dim 192, which no tensor's shape says)."""
    read_fields = family_weights(family).read_fields
    theirs = read_fields(state)
    differ = shapes.differences(theirs, read_fields(expected))
    if not differ:
        return
    listed = {k: v for k, (v, _) in differ.items()}
    part = layout.part if layout is not None else ""
    if part:  # "a torchvision ResNet with backbone_width 64, the model's backbone has 32"
        fields_text = ", ".join(f"{k} {shapes.show_value(v)}" for k, v in listed.items())
        theirs_text, whose = f"a {layout.format} {layout.part_name} with {fields_text}", f"the model's {part[:-1]}"
    else:
        theirs_text, whose = shapes.describe(family, listed), "the model"
    if len(differ) == 1:  # "a ViT with embed_dim 192, the model has 384"
        ours_text = f", {whose} has " + shapes.show_value(next(iter(differ.values()))[1])
    else:
        ours_text = f"; {whose} has " + ", ".join(f"{k} {shapes.show_value(v)}" for k, (_, v) in differ.items())
    layers = f"; {_layers_that_differ(expected, state, part)}" if part else ""
    models = shapes.models_with(family, theirs)
    fields = dict(listed) | (_shared_fields(models, config) if config is not None and not part else {})
    problem = f"{source} is {theirs_text}{ours_text}{layers}"
    if not part and config is not None and (unfit := _unfit_keys(family, config, fields, state)):
        problem += (
            f". Those settings alone would leave {unfit}: it needs settings its shapes do not show, or it is of an "
            "architecture vitkit does not read. The settings its shapes show"
        )
    raise CheckpointMismatch(problem, fields=fields, models=models)


def _unfit_keys(family: str, config: Any, fields: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> str:
    """The checkpoint keys a model of `config` with `fields` set would still not have, and its keys the checkpoint
    lacks, in words ("" when the names fit): a way out that `fields` offers only if they make the names fit. The
    classifier and the tensors sized by the classes are left out (their own checks name them); a model that cannot
    be built with `fields` is left to the load to explain."""
    weights = family_weights(family)
    try:
        with torch.device("meta"):
            expected = build_model(family, replace_config(config, **fields)).state_dict()
    except Exception:  # a combination the config refuses: the load's own error says why
        return ""
    skip = (*weights.head, *weights.class_sized)
    extra = [k for k in state if k not in expected and not k.startswith(skip)]
    missing = [k for k in expected if k not in state and not k.startswith(skip)]
    found = []
    for what, keys in (("of its keys unmatched", extra), ("of the model's missing", missing)):
        if keys:
            found.append(f"{len(keys)} {what} ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})")
    return " and ".join(found)


# Config fields a checkpoint's architecture does not fix: what the run chooses (classes, input size, regularisation)
RUN_FIELDS = ("num_classes", "img_size", "drop_rate", "attn_drop_rate", "drop_path_rate", "attn_backend")


def _shared_fields(models: list[str], config: Any) -> dict[str, Any]:
    """The architecture fields on which the registered `models` agree and `config` differs (those beside the ones
    the shapes fix: num_heads of a ViT); empty without models."""
    if not models:
        return {}
    configs = [dataclasses.asdict(model_entry(name).config) for name in models]
    ours = dataclasses.asdict(config)
    shared = {}
    for key, value in configs[0].items():
        if key in RUN_FIELDS or key not in ours or any(c.get(key) != value for c in configs[1:]):
            continue
        if ours[key] != value:
            shared[key] = value
    return shared


def _layers_that_differ(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], part: str) -> str:
    """The layers (modules) of the model's `part` that a checkpoint of that part does not fit, in words: those of
    another shape (the first with both shapes), those the checkpoint lacks and those the model lacks, a few of each
    with counts."""
    ours = {k: v for k, v in expected.items() if k.startswith(part)}
    shaped = [k for k, v in ours.items() if k in state and state[k].shape != v.shape]
    groups = (
        ("of another shape", shaped),
        ("missing from the checkpoint", [k for k in ours if k not in state]),
        ("not in the model", [k for k in state if k not in ours]),
    )
    found = []
    for what, keys in groups:
        layers = list(dict.fromkeys(k.rsplit(".", 1)[0] for k in keys))
        if layers:
            shown = ", ".join(layers[:4]) + (", ..." if len(layers) > 4 else "")
            found.append(f"{len(layers)} layer{'s' if len(layers) > 1 else ''} {what} [{shown}]")
    if shaped:
        key = shaped[0]
        found[0] += f" ({key}: checkpoint {tuple(state[key].shape)}, model {tuple(ours[key].shape)})"
    return "; ".join(found)


def _check_head(
    expected: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    head: tuple[str, ...],
    source: str,
    check_presence: bool,
    extra_outputs: int = 0,
) -> None:
    """A classifier for another number of classes, or (with `check_presence`) one present on one side only, is its
    own error: the fix is `num_classes` or `reset_head`, not another checkpoint. `extra_outputs`: rows beyond the
    classes. (A classifier of another input width is a body of another width: `_check_architecture` says so.)"""
    keep = "keep the model's freshly initialised head"
    classes_in = {}
    for key, tensor in expected.items():
        if key.startswith(head) and key.endswith("weight") and key in state:
            theirs, ours = state[key].shape[0] - extra_outputs, tensor.shape[0] - extra_outputs
            classes_in[key] = theirs
            if theirs != ours:
                raise CheckpointMismatch(
                    f"{source} has a classifier for {theirs} classes, the model {ours}",
                    fields={"num_classes": theirs},
                    reset_head=keep,
                )
    if not check_presence:
        return
    has_head = any(k.startswith(head) for k in state)
    wants_head = any(k.startswith(head) for k in expected)
    if has_head and not wants_head:
        rows = [v.shape[0] - extra_outputs for k, v in state.items() if k.startswith(head) and k.endswith("weight")]
        raise CheckpointMismatch(
            f"{source} has a classifier but the model has none (num_classes=0)",
            fields={"num_classes": rows[0]} if rows else None,
            reset_head="drop the checkpoint's head",
        )
    if wants_head and not has_head:
        raise CheckpointMismatch(
            f"{source} has no classifier (a backbone checkpoint) but the model has one",
            fields={"num_classes": 0},
            reset_head=keep,
        )


def features_model(model: nn.Module, out_indices: int | Sequence[int] | None) -> FeatureMaps:
    """`model` as timm's features model (`vitkit.models.backbone.FeatureMaps`) of its outputs `out_indices`, carrying
    its `ModelInfo` without the class names (it has no classifier)."""
    features = FeatureMaps(model, out_indices)
    setattr(features, INFO_ATTRIBUTE, model_info(model).without_classes())
    return features


def check_features_args(features_only: bool, out_indices: Any) -> None:
    """ValueError for `out_indices` without `features_only`."""
    if out_indices is not None and not features_only:
        raise ValueError(f"out_indices={out_indices!r} chooses a features model's outputs: pass features_only=True too")


def from_pretrained(
    path: str | os.PathLike,
    format: str = "auto",
    reset_head: bool = False,
    revision: str | None = None,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    **overrides: Any,
) -> nn.Module:
    """The model saved at `path`, built and loaded, in eval mode: the one way to load a model whose architecture the
    weights' source describes (a registered model and a file of weights: `vitkit.create_model` and `load_weights`).

    `path` is:
      - a directory written by `save_pretrained` (`vitkit train`'s final/ and best/, `vitkit convert`,
        `export_weights`): its config.json says the model, and what the model carries beside it (class names,
        normalisation, ...: a `ModelInfo`) is set on the model as `model.pretrained_info` (`model_info(model)`);
        without the entries about the classes when the classifier is not the saved one (`reset_head`, or another
        `num_classes`);
      - a directory written by Hugging Face transformers' `save_pretrained` (ViT, DeiT, DINOv2, CLIP, SigLIP, Swin,
        DETR, Deformable DETR): its config.json becomes the equal vitkit config (LayerNorm eps, qkv bias and MLP
        width included; a base model becomes a model without classifier, and a ViT / DeiT pooler is dropped);
        its class names are `id2label`'s (unless only the default LABEL_i names) and its normalisation that of a
        `preprocessor_config.json`;
      - a checkpoint file of a format whose files carry no config (vit-pytorch's, PaddleViT's): the model is built
        from its shapes and `overrides` (what the shapes do not say, e.g. ``num_heads=8``; `FieldsNeeded` names
        it), and `load_report(model).assumed` says what the shapes left open, e.g. a square image. Any other file
        holds no architecture: `ModelNeeded`;
      - a Hugging Face Hub repository, "hf-hub:ORG/REPO[@REVISION]", of any of those directories or timm's (its
        config.json names the timm model, e.g. timm/vit_base_patch16_224.augreg2_in21k_ft_in1k): downloaded into
        huggingface_hub's cache unless there already (`vitkit.weights.hub`: offline use, errors), its commit
        recorded in `model_info(model).weights`.
    Weights are checked as `load_weights` checks them (sizes, NaN / Inf); with another `img_size` a ViT's position
    table is resampled. What loading did is `load_report(model)`.

    Args:
        path: the directory, file or Hub repository.
        format: "auto", or the layout `path` must be in (a directory: "vitkit" / "timm" or "hf").
        reset_head: keep the built model's own classifier (e.g. with ``num_classes=10`` in `overrides`).
        revision: of a Hub repository, the branch, tag or commit to read (as "hf-hub:ORG/REPO@REVISION" does).
        features_only: the loaded model as timm's features model (`create_model(..., features_only=True)`): its
            outputs `out_indices` as feature maps, pruned of the rest.
        out_indices: with `features_only`, which outputs (None: timm's default for the family).
        overrides: config fields to replace, e.g. ``attn_backend="math"`` or ``dynamic_img_size=True``.
    """
    check_features_args(features_only, out_indices)
    model = _from_pretrained(path, format, reset_head, revision, **overrides)
    return features_model(model, out_indices) if features_only else model


def _from_pretrained(
    path: str | os.PathLike, format: str, reset_head: bool, revision: str | None, **overrides: Any
) -> nn.Module:
    """`from_pretrained` without features_only."""
    if format not in ("auto", *formats()):
        raise ValueError(f"format must be one of {('auto', *formats())}, got {format!r}")
    if is_hub(path):
        return _from_hub(hub_snapshot(path, revision), format, reset_head, overrides)
    if revision is not None:
        raise ValueError(f"revision={revision!r} is for a Hub repository (hf-hub:ORG/REPO); {path} is a local path")
    path = Path(path)
    if path.is_file():
        model, report = _from_file(path, format, reset_head, overrides)
    else:
        model, report = _from_directory(path, format, reset_head, overrides)
    setattr(model, REPORT_ATTRIBUTE, report)
    return model


def _from_hub(snapshot: HubSnapshot, format: str, reset_head: bool, overrides: dict[str, Any]) -> nn.Module:
    """The model of a Hub repository's files, recording where they came from (`ModelInfo.weights`), with the label
    names a table of published weights gives for it where its files carry none."""
    model = from_pretrained(snapshot.directory, format, reset_head, **overrides)
    with_info(model, _hub_info(snapshot, model_info(model)), reset_head)
    load_report(model).source = snapshot.source
    return model


def _hub_info(snapshot: HubSnapshot, info: ModelInfo) -> ModelInfo:
    """The `ModelInfo` of a Hub repository's files: where they came from, and the label names a table of published
    weights gives for it where its files carry none."""
    names = published_labels(f"{HUB_PREFIX}{snapshot.repo}")
    if info.classes is None and names is not None:
        info = dataclasses.replace(info, classes=names)
    return dataclasses.replace(info, weights=snapshot.source)


def load_report(model: nn.Module) -> LoadReport | None:
    """What `from_pretrained` (or `vitkit.train.load_for_finetune`) loaded into `model`, kept and reset; None for a
    model built otherwise."""
    report = getattr(model, REPORT_ATTRIBUTE, None)
    return report if isinstance(report, LoadReport) else None


RUN_MODELS = {"best": "the epoch that validated best", "final": "the last epoch"}  # a training run's model folders


def check_not_run_folder(directory: Path) -> None:
    """ValueError, naming its model folders, when `directory` is a training run's folder (`vitkit train --out`)
    rather than one of the models it holds."""
    models = [name for name in RUN_MODELS if (directory / name / CONFIG_NAME).is_file()]
    if models and not (directory / WEIGHTS_NAME).is_file():
        choices = " or ".join(f"{directory / name} ({RUN_MODELS[name]})" for name in models)
        raise ValueError(f"{directory} is a training run's folder, not a model's: give one of its models, {choices}")


def _from_directory(
    directory: Path, format: str, reset_head: bool, overrides: dict[str, Any]
) -> tuple[nn.Module, LoadReport]:
    check_not_run_folder(directory)
    saved = _directory_config(directory)
    found = "hf" if is_hf_config(saved) else "timm" if is_timm_config(saved) else "vitkit"
    if format != "auto" and not same_layout(format, found):
        raise ValueError(f"{directory} is a {found} directory, not {format}")
    if found == "timm":
        name, fields = timm_model(saved, directory)
        model = create_model(name, **{**fields, **overrides})
        report = load_weights(model, directory, format="vitkit", reset_head=reset_head)
        return with_info(model.eval(), timm_info(saved, directory), reset_head), report
    if found == "vitkit":
        family_name, config, info = read_model_dir(directory, overrides)
        if not (directory / WEIGHTS_NAME).is_file():
            raise FileNotFoundError(
                f"{directory / WEIGHTS_NAME} not found: expected a directory written by vitkit.save_pretrained"
            )
        model = build_model(family_name, config)
        report = load_weights(model, directory / WEIGHTS_NAME, format="vitkit", reset_head=reset_head)
        return with_info(model.eval(), info, reset_head), report
    obj = read_checkpoint(directory)
    family_name, config = _hf_config(directory, saved, obj, overrides)
    model = build_model(family_name, config)
    report = _load(model, obj, str(directory), "hf", strict=True, reset_head=reset_head)
    return with_info(model.eval(), _hf_info(directory, saved), reset_head), report


def _directory_config(directory: Path) -> dict[str, Any]:
    """The parsed config.json of a vitkit or Hugging Face model directory; FileNotFoundError without one."""
    config_path = directory / CONFIG_NAME
    if not directory.exists():
        name = str(directory).split(".")[0]  # a registered name, or name.tag
        hint = (
            f"; {directory} is a model's name: vitkit.create_model({str(directory)!r}, pretrained=True) loads its "
            f"published weights, `--model {directory} --pretrained` on the command line"
            if name in list_models()
            else ""
        )
        raise FileNotFoundError(
            f"{directory} does not exist: expected a model directory (written by vitkit.save_pretrained, vitkit "
            f"train or Hugging Face transformers), a checkpoint file, or hf-hub:ORG/REPO{hint}"
        )
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found: expected a directory written by vitkit.save_pretrained or by Hugging Face "
            "transformers, or a checkpoint file"
        )
    return read_json(config_path)


def _hf_config(
    directory: Path, saved: dict[str, Any], obj: Mapping[str, Any], overrides: Mapping[str, Any]
) -> tuple[str, Any]:
    """(family, the vitkit config) of a transformers directory: its parsed config.json `saved`, its checkpoint `obj`."""
    model_type = saved["model_type"]
    readers = hf_model_types()
    if model_type not in readers:
        raise ValueError(
            f"{directory / CONFIG_NAME}: Hugging Face model_type {model_type!r} is not supported; supported: "
            f"{sorted(readers)}"
        )
    state, _ = unwrap_state_dict(obj, str(directory))
    family_name, read_config = readers[model_type]
    return family_name, replace_config(read_config(saved, set(state), str(directory / CONFIG_NAME)), **overrides)


def saved_config(directory: str | os.PathLike, **overrides: Any) -> Any:
    """The config of the model in a vitkit or Hugging Face transformers directory, as `from_pretrained` builds it,
    with `overrides` replaced (e.g. the image size a run trains at). Nothing is built or loaded; a Hub repository
    ("hf-hub:ORG/REPO") is downloaded unless cached."""
    directory = hub_snapshot(directory).directory if is_hub(directory) else Path(directory)
    saved = _directory_config(directory)
    if is_timm_config(saved):
        name, fields = timm_model(saved, directory)
        return replace_config(model_entry(name).config, **{**fields, **overrides})
    if not is_hf_config(saved):
        return read_model_dir(directory, overrides)[1]
    return _hf_config(directory, saved, read_checkpoint(directory), overrides)[1]


def read_model_info(directory: str | os.PathLike) -> ModelInfo:
    """What the model in a vitkit or Hugging Face directory carries beside its config (see `from_pretrained`), read
    without building it; entries it does not hold are None. A Hub repository ("hf-hub:ORG/REPO") is downloaded
    unless cached, and says where it came from (`ModelInfo.weights`)."""
    if is_hub(directory):
        snapshot = hub_snapshot(directory)
        return _hub_info(snapshot, read_model_info(snapshot.directory))
    directory = Path(directory)
    saved = _directory_config(directory)
    if is_timm_config(saved):
        return timm_info(saved, directory)
    return _hf_info(directory, saved) if is_hf_config(saved) else read_model_dir(directory)[2]


def _hf_info(directory: Path, saved: dict[str, Any]) -> ModelInfo:
    """Class names from a transformers config's id2label, normalisation from `preprocessor_config.json`."""
    names = hf.class_names(saved, str(directory / CONFIG_NAME))
    mean = std = None
    framing: dict[str, Any] = {}
    processor = directory / hf.PREPROCESSOR_NAME
    if processor.is_file():
        settings = read_json(processor)
        if isinstance(settings, dict) and settings.get("do_normalize", True):
            mean, std = settings.get("image_mean"), settings.get("image_std")
        if isinstance(settings, dict):
            framing = hf.processor_framing(settings)
    values = {"classes": names, "mean": mean, "std": std, **framing}
    return check_model_info(values, len(names or ()), str(processor))


def with_info(model: nn.Module, info: ModelInfo, reset_head: bool = False) -> nn.Module:
    """Set `info` on the model as `pretrained_info`, its entries about the classes only where they are about the
    loaded classifier."""
    num_classes = getattr(model.config, "num_classes", 0)
    if reset_head or (info.classes is not None and len(info.classes) != num_classes):
        info = info.without_classes()
    setattr(model, INFO_ATTRIBUTE, info)
    setattr(model, INFO_CONFIG_ATTRIBUTE, model.config)  # the names are about this classifier (`model_info`)
    return model


def same_layout(a: str, b: str) -> bool:
    """Whether two format names mean the same parameter layout ("vitkit" keeps timm's names)."""
    return a == b or {a, b} == {"timm", "vitkit"}


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    src_format: str = "auto",
    dst_format: str = "vitkit",
    model_name: str | None = None,
    reset_head: bool = False,
    overrides: Mapping[str, Any] | None = None,
    force: bool = False,
) -> tuple[LoadReport, Path]:
    """Read weights in one library's layout and write them in another's (what `vitkit convert` does).

    Args:
        src: what `from_pretrained` reads (a model directory with its own `config.json`, vitkit's or Hugging
            Face's, or a file of a format that builds its model from its shapes), or a checkpoint file of any
            layout (`.safetensors`, `.pth`, `.pt`, `.bin`), which carries no config: then `model_name` names the
            registered model to load it into.
        dst: where to write (see `export_weights`): a directory for "vitkit" / "hf", a file for the other formats.
        src_format: "auto" or the layout of `src`.
        dst_format: the layout to write.
        model_name: the registered model for a checkpoint file; not for what builds its own model.
        reset_head: keep the built model's freshly initialised classifier, not the checkpoint's.
        overrides: config fields to replace, e.g. ``{"num_classes": 10}``.
        force: write where something is already: replace the file `dst`, or the files of the same names in the
            folder `dst`. Never `src`'s own files: that is refused whatever `force` says.

    What a model directory holds beside its config (`ModelInfo`) is written with the weights where the layout of
    `dst` has a place for it (not the entries about the classes when the classifier is reset).

    Returns:
        (what loading `src` did, the path written).
    """
    src, overrides = Path(src), dict(overrides or {})
    _check_destination(src, Path(dst), dst_format, force)
    if not model_name:
        model = from_pretrained(src, src_format, reset_head, **overrides)
        report = load_report(model)
    elif (src / CONFIG_NAME).is_file():
        raise ModelNotNeeded(f"{src} is a model directory with its own {CONFIG_NAME}")
    else:
        model = create_model(model_name, **overrides)
        try:
            report = load_weights(model, src, format=src_format, reset_head=reset_head)
        except ValueError as err:
            _builds_own_model(src, src_format, err)
            raise
        report.kept = kept_fields(model, model_name, overrides)
    return report, export_weights(model.eval(), dst, dst_format)  # with what the model carries


def _check_destination(src: Path, dst: Path, dst_format: str, force: bool) -> None:
    """Refuse a conversion that would replace what it reads (`src` itself, or a file of the folder `src`), and,
    unless `force`, one that would replace anything: the file `dst`, or files in the folder `dst` (a trained model,
    a run's `final/`)."""
    sources = [p for p in (src.iterdir() if src.is_dir() else [src]) if p.is_file()] if src.exists() else []
    if dst_format in DIRECTORY_FORMATS:  # the files a folder export writes
        written = (CONFIG_NAME, WEIGHTS_NAME, hf.PREPROCESSOR_NAME)
        replaced = [p for p in sources if p.parent.resolve() == dst.resolve() and p.name in written]
    else:
        replaced = [p for p in sources if p.resolve() == dst.resolve()]
    if replaced:
        raise ValueError(
            f"{dst} would replace {'the file' if src.is_file() else 'files of the folder'} being converted "
            f"({listed([str(p) for p in replaced][:3])}): write to a new {_kind(dst_format)}"
        )
    if force:
        return
    if dst.is_file():
        held = "is a file already"
    elif dst.is_dir() and any(dst.iterdir()):
        names = sorted(entry.name for entry in dst.iterdir())
        held = f"holds {listed(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''} already"
    else:
        return
    raise OptionFileExistsError(
        lambda name: (
            f"{dst} {held}: converting would replace {'it' if dst.is_file() else 'them'}. Write to a new "
            f"{_kind(dst_format)}, or replace what is there with {name('force', True)}"
        )
    )


def _kind(dst_format: str) -> str:
    """What `export_weights` writes for a format: "folder" or "file"."""
    return "folder" if dst_format in DIRECTORY_FORMATS else "file"


def kept_fields(model: nn.Module, name: str, overrides: Mapping[str, Any]) -> dict[str, str]:
    """What `model`, the registered model `name` with `overrides`, into which a checkpoint loaded, took from its
    registered config that no tensor says (`FamilyWeights.unread_fields`: a ViT's num_heads), when the overrides
    changed fields the tensors do say (embed_dim): field -> its value and why it is in doubt, in words, with the
    value of the registered models of the model's size where they agree on one. Empty when no such field was
    changed: the checkpoint is then of the model named, heads and all (the caller's choice)."""
    fam = family_of(model).name
    weights = family_weights(fam)
    registered = model_entry(name).config
    fixed = weights.read_fields(model.state_dict())  # the model's fields its tensors say: the checkpoint's
    changed = [k for k in overrides if k in fixed and not shapes.same(overrides[k], getattr(registered, k, None))]
    if not changed:
        return {}
    sized = shapes.models_with(fam, fixed)
    kept = {}
    for key in weights.unread_fields:
        if key in overrides:
            continue
        value = getattr(model.config, key)
        why = (
            f"{key} {shapes.show_value(value)} was assumed ({name}'s, kept when {listed(changed)} changed): no tensor "
            "of the checkpoint says it"
        )
        theirs = {shapes.show_value(getattr(model_entry(m).config, key)) for m in sized}
        if len(theirs) == 1 and theirs != {shapes.show_value(value)}:
            why += f" (the registered models of its size, {shown_models(sized)}, have {theirs.pop()})"
        kept[key] = why
    return kept


def _builds_own_model(path: Path, format: str, err: ValueError) -> None:
    """`ModelNotNeeded` when `path`, which did not fit the model named, is in a layout whose files build their own
    model from their shapes (`Layout.read_config`): following the fields `err` lists would not make a registered
    model fit such a file."""
    state, _ = unwrap_state_dict(read_checkpoint(path), str(path))
    for weights in registered_weights().values():
        for layout in weights.layouts:
            if layout.read_config is not None and format in ("auto", layout.format) and layout.matches(set(state)):
                problem = err.problem if isinstance(err, CheckpointMismatch) else str(err)
                raise ModelNotNeeded(
                    f"{path} is a {layout.format} file, which builds its own model from its shapes, and it does not "
                    f"fit the model named ({problem})",
                    fields={"num_heads": "H"},
                ) from err


def _from_file(path: Path, format: str, reset_head: bool, fields: dict[str, Any]) -> tuple[nn.Module, LoadReport]:
    """The model a checkpoint file of a config-less format holds (vit-pytorch's: `Layout.read_config`), built from
    its shapes and `fields`, and loaded; `report.assumed` says what the shapes left open. `ModelNeeded` for a file
    no such format reads; `LayoutMismatch` when `format` names another than the file's."""
    state, _ = unwrap_state_dict(read_checkpoint(path), str(path))
    keys = set(state)
    readable = [
        (fam, layout)
        for fam, weights in registered_weights().items()
        for layout in weights.layouts
        if layout.read_config is not None and layout.matches(keys)
    ]
    for fam, layout in readable:
        if format not in ("auto", layout.format):
            continue
        try:
            config, assumed = layout.read_config(state, dict(fields))
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a whole {layout.format} state dict ({err})") from err
        model = build_model(fam, config)
        report = load_weights(model, path, format=layout.format, reset_head=reset_head)
        report.assumed = assumed
        setattr(model, INFO_ATTRIBUTE, ModelInfo())
        return model.eval(), report
    if readable:  # in a config-less layout, but not the one named
        raise LayoutMismatch(str(path), format, readable[0][1].format)
    named = ""
    if format in config_less_formats():  # a format whose files build their own model, named for a file in another
        others, _ = _lookalikes(state)
        seen = f"; it looks like a {' or '.join(others)} checkpoint" if others else ""
        named = f", and not in the {format} layout{seen}"
    raise ModelNeeded(str(path), named)


def export_weights(model: nn.Module, path: str | os.PathLike, format: str, info: ModelInfo | None = None) -> Path:
    """Write `model`'s weights in another library's layout; returns the path written.

    What the model needs beside its weights (`info`, or what the model carries: class names, normalisation, ...) goes
    where the layout has a place for it: "vitkit" into config.json (every entry; see `save_pretrained`); "hf" the
    class names as `id2label` / `label2id` in config.json (transformers' default LABEL_i names when none are given)
    and, for the families whose transformers classes read images through an image processor (ViT, DeiT, Swin) with
    a normalisation given, a `preprocessor_config.json` with it and the framing (`hf.image_processor`). The
    single-file formats hold weights only.

    Args:
        model: a vitkit model.
        path: "vitkit" and "hf" write a directory (`config.json` + `model.safetensors`, loadable by
            `vitkit.from_pretrained` or transformers' `from_pretrained`); the other formats (timm, torchvision,
            detr) write one state-dict file, `.safetensors` or `.pth` / `.pt` / `.bin` (`torch.save`, as their
            users load with `model.load_state_dict(torch.load(path))`). A format whose files wrap the state dict
            (`Layout.wrapper`) writes its `.pth` files so: facebookresearch/detr's hold ``{"model": state_dict}``
            (its code reads ``torch.load(path)["model"]``); a `.safetensors` file, which holds one flat mapping of
            tensors, the state dict itself.
        format: one of `formats()`: "vitkit", "timm", "torchvision", "hf", ...
        info: what to write beside the weights; None: what the model carries (see `vitkit.save_pretrained`).
    """
    if format not in formats():
        raise ValueError(f"format must be one of {formats()}, got {format!r}")
    path = Path(path)
    if format == "vitkit":
        return _write_directory(path, format, lambda staging: save_pretrained(model, staging, info))
    fam = family_of(model).name
    weights = family_weights(fam)
    if format == "timm" and not weights.in_timm:
        own = ["vitkit", *(["hf"] if weights.hf_export is not None else [])]
        own += [f for f in source_formats() if f != "hf" and _writes(weights.layout(f), model.config)]
        raise ValueError(
            f"timm has no {family_of(model).display_name or fam} models, so no timm weights of one to write; write "
            f"{listed(own, 'or')}"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if format == "hf":
        described = info_for(model, info, source="export_weights")
        return _write_directory(
            path, format, lambda staging: _write_hf_directory(model, weights, state, staging, described)
        )
    if path.is_dir():
        example = path / "model.safetensors"
        raise ValueError(f"{path} is a folder; {format} weights are one file: name it, e.g. {example}")
    wrapper = None
    if format != "timm":  # timm's names are vitkit's
        layout = _layout(fam, weights, format)
        if layout.check_export is not None:
            layout.check_export(model.config)
        state = layout.from_vitkit(state, model.config)
        if layout.export_buffers is not None:
            state.update(layout.export_buffers(model))
        wrapper = layout.wrapper
    _write_state_dict(state, path, wrapper)
    return path


def _writes(layout: Layout | None, config: Any) -> bool:
    """Whether `layout` can hold a model of `config` whole (not a format of its backbone alone)."""
    if layout is None:
        return False
    try:
        if layout.check_export is not None:
            layout.check_export(config)
    except ValueError:
        return False
    return True


def _write_directory(path: Path, format: str, write: Callable[[Path], object]) -> Path:
    """`write` a directory format's files into a new folder beside `path`, then move them into `path`. Refused when
    `path` is a file, or a folder holding files the export does not write: they would sit beside another model's
    (an earlier export of another layout, a run's checkpoint)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file; {format} weights are a folder (config.json, model.safetensors): name one")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        write(staging)
        written = {entry.name for entry in staging.iterdir()}
        stale = sorted(entry.name for entry in path.iterdir() if entry.name not in written) if path.is_dir() else []
        if stale:
            raise ValueError(
                f"{path} holds {listed(stale)}, which the {format} weights do not replace: the folder would mix two "
                f"models' files. Write into a new or empty folder, or remove {'it' if len(stale) == 1 else 'them'}"
            )
        path.mkdir(exist_ok=True)
        for name in written:
            os.replace(staging / name, path / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _write_state_dict(state: dict[str, torch.Tensor], path: Path, wrapper: str | None = None) -> None:
    """`.safetensors` (the flat state dict) or `torch.save` (the state dict, or ``{wrapper: state_dict}``)."""
    suffix = path.suffix.lower()
    if suffix not in (".safetensors", PDPARAMS_SUFFIX, *PICKLE_SUFFIXES):
        raise ValueError(f"{path}: expected a .safetensors, {PDPARAMS_SUFFIX} or {'/'.join(PICKLE_SUFFIXES)} file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == PDPARAMS_SUFFIX:  # as paddle.save writes it; Paddle's set_state_dict asserts float32 parameters
        floats = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        atomic_write(path, lambda tmp: write_pdparams(floats, tmp))
    elif suffix == ".safetensors":
        atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    else:
        obj = state if wrapper is None else {wrapper: state}
        atomic_write(path, lambda tmp: torch.save(obj, tmp))


def _write_hf_directory(
    model: nn.Module, weights: FamilyWeights, state: dict[str, torch.Tensor], directory: Path, info: ModelInfo
) -> Path:
    if weights.hf_export is None:
        raise ValueError(f"there is no Hugging Face layout for {family_of(model).name} models")
    renamed, config = weights.hf_export(model.config, state)
    config.update(hf.labels(model.config.num_classes, info.classes))
    processor = None
    if weights.hf_image_processor:
        processor = hf.image_processor(
            model.config.img_size, model.config.in_chans, info.mean, info.std, info.framing()
        )
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(renamed, tmp, metadata={"format": "pt"}))
    for name, content in ((CONFIG_NAME, config), (hf.PREPROCESSOR_NAME, processor)):
        if content is not None:
            text = json.dumps(content, indent=2) + "\n"
            atomic_write(directory / name, lambda tmp, text=text: Path(tmp).write_text(text))
    return directory


__all__ = [
    "LoadReport",
    "convert",
    "detect_format",
    "export_weights",
    "formats",
    "from_pretrained",
    "load_report",
    "load_weights",
    "read_model_info",
    "same_layout",
    "saved_config",
]
