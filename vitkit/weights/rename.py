"""Rename tables: how another library's parameter names map onto vitkit's, and back.

A `Layout` is one source format's table for one vitkit family: a list of `Rename` rules. A rule names a
vitkit key or module prefix and the source key(s) or prefix(es) it comes from. `{name}` placeholders stand
for indices (`blocks.{i}`, `layers.{s}.blocks.{b}`); they carry over unchanged unless the rule maps them
(torchvision's Swin keeps stage s's blocks in `features.{2s + 1}`). A prefix rule carries the rest of the
name along (``encoder.ln.weight`` -> ``norm.weight``).
A rule with several source names concatenates their tensors along dim 0 on import, in the order given, and
splits the vitkit tensor into that many equal parts along dim 0 on export (q, k, v <-> the fused qkv).
Where two rules name the same vitkit key (older or newer spellings of a source name), import accepts
either and export writes the first.
A rule may also map the tensor's values (`Rename.values`: a reshape, a transpose, a permutation), and a layout whose
conversion spans several tensors, or needs the model's config, overrides `to_vitkit` / `from_vitkit`, which receive
the vitkit config (None where only the names are wanted).
A layout may hold one part of a model only (`Layout.part`, e.g. a ResNet classifier's file for a detector's
backbone): loading fills that part and leaves the rest of the model as initialised.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

Indices = dict[str, int]
TensorMap = Callable[[torch.Tensor], torch.Tensor]
# Maps one side's placeholder values to the other's; None when the rule does not apply to these indices.
IndexMap = Callable[[Indices], Indices | None]


@dataclass(frozen=True)
class Rename:
    ours: str  # vitkit key or module prefix, `{name}` placeholders for indices
    theirs: tuple[str, ...]  # source key(s) or prefix(es); several are concatenated along dim 0, in this order
    to_ours: IndexMap | None = None  # source indices -> vitkit indices (default: the same names and values)
    to_theirs: IndexMap | None = None  # vitkit indices -> source indices (the inverse of to_ours)
    values: tuple[TensorMap, TensorMap] | None = None  # (source tensor -> vitkit's, vitkit's -> source): applied
    # after concatenating on import and before splitting on export; None: the values as they are


def rename(
    ours: str,
    *theirs: str,
    to_ours: IndexMap | None = None,
    to_theirs: IndexMap | None = None,
    values: tuple[TensorMap, TensorMap] | None = None,
) -> Rename:
    """A rule: the vitkit name `ours` comes from the source name(s) `theirs`, its values mapped by `values`."""
    return Rename(ours, theirs, to_ours, to_theirs, values)


@functools.cache
def _template_re(template: str) -> re.Pattern[str]:
    """`layers.{s}.norm` -> a pattern matching `layers.2.norm` and `layers.2.norm.weight` (indices, rest)."""
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", re.escape(template))
    return re.compile("^" + pattern + r"(?P<rest>\..+)?$")


def _match(template: str, key: str) -> tuple[Indices, str] | None:
    m = _template_re(template).match(key)
    if m is None:
        return None
    indices = {k: int(v) for k, v in m.groupdict().items() if k != "rest"}
    return indices, m.group("rest") or ""


def _fill(template: str, indices: Indices, rest: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: str(indices[m.group(1)]), template) + rest


@dataclass(frozen=True)
class Layout:
    format: str  # the source format's name, e.g. "torchvision"
    family: str  # the vitkit family the table fills (its registered name)
    rules: tuple[Rename, ...]  # the rename table
    markers: tuple[str, ...]  # source keys (after `strip_prefixes`) whose presence, all of them, identifies the layout
    strip_prefixes: tuple[str, ...] = ()  # source prefixes removed before renaming (e.g. Hugging Face's "vit.")
    dropped: tuple[str, ...] = ()  # source names (templates) with no vitkit counterpart: skipped on import, reported
    check_export: Callable[[Any], None] | None = field(default=None, compare=False)  # ValueError for a vitkit
    # config this format cannot express, called before export
    export_buffers: Callable[[nn.Module], dict[str, torch.Tensor]] | None = field(default=None, compare=False)
    # source-named tensors the format stores but vitkit recomputes (e.g. torchvision's relative position index)
    wrapper: str | None = None  # the entry of the format's `torch.save` files that holds the state dict (e.g.
    # facebookresearch/detr's {"model": state_dict}), written so on export; None: the state dict itself
    part: str = ""  # the vitkit key prefix of the one part of the model that the format's files hold (a ResNet
    # classifier's file: a detector's "backbone."): loading fills that part and leaves the rest as initialised;
    # "": the whole model
    part_name: str = ""  # what such a file is, in words (e.g. "ResNet"), for messages
    read_config: Callable[[dict[str, torch.Tensor], dict[str, Any]], tuple[Any, list[str]]] | None = field(
        default=None, compare=False
    )
    # builds the config of the model a file in this layout holds from its shapes and the fields given (formats whose
    # files carry no config, like vit-pytorch's), with what it assumed that neither said (in words, for the load
    # report); None: the model is named (a registered one) or read from a directory
    other_markers: tuple[tuple[str, ...], ...] = ()  # further sets of keys, any one of which, all its keys present,
    # identifies the layout too (one format's several model classes, e.g. transformers' CLIP and SigLIP towers)

    def matches(self, keys: set[str]) -> bool:
        """Whether a state dict with these keys is in this layout."""
        keys = {self.strip(k) for k in keys}
        return any(all(m in keys for m in markers) for markers in (self.markers, *self.other_markers))

    def strip(self, key: str) -> str:
        """The key without the first of `strip_prefixes` it starts with."""
        for prefix in self.strip_prefixes:
            if key.startswith(prefix):
                return key[len(prefix) :]
        return key

    def to_vitkit(
        self, state: dict[str, torch.Tensor], config: Any = None
    ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
        """Rename a source state dict to vitkit names, for a model of `config` (None: names and shapes only).

        Returns (vitkit state, dropped source keys, unmatched source keys): dropped keys have no vitkit
        counterpart by design (e.g. a pooler); unmatched keys are ones no rule covers, or parts of an
        incomplete concatenation, which the key check reports as unexpected.
        """
        out: dict[str, torch.Tensor] = {}
        dropped: list[str] = []
        unmatched: list[str] = []
        # (rule, vitkit name) -> {part number: source key}
        parts: dict[tuple[Rename, str], dict[int, str]] = {}
        for key in state:
            name = self.strip(key)
            hit = self._match_theirs(name)
            if hit is not None:
                rule, part, target = hit
                parts.setdefault((rule, target), {})[part] = key
            elif any(_match(t, name) for t in self.dropped):
                dropped.append(key)
            else:
                unmatched.append(key)
        for (rule, target), got in parts.items():
            if len(got) < len(rule.theirs):
                unmatched.extend(got.values())
                continue
            tensors = [state[got[j]] for j in range(len(rule.theirs))]
            # Several source tensors (q, k, v) stack along dim 0 into one (the fused qkv's output rows).
            tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            out[target] = rule.values[0](tensor) if rule.values else tensor
        return out, dropped, unmatched

    def from_vitkit(self, state: dict[str, torch.Tensor], config: Any = None) -> dict[str, torch.Tensor]:
        """Rename a vitkit state dict (of a model of `config`) to this layout; ValueError for a key the layout has no
        place for."""
        out: dict[str, torch.Tensor] = {}
        for key, tensor in state.items():
            for rule in self.rules:
                hit = _match(rule.ours, key)
                indices = None if hit is None else rule.to_theirs(hit[0]) if rule.to_theirs else hit[0]
                if indices is None:
                    continue
                n = len(rule.theirs)
                if rule.values:
                    tensor = rule.values[1](tensor)
                if tensor.shape[0] % n != 0:
                    raise ValueError(f"{key} {tuple(tensor.shape)} does not split into {n} equal parts along dim 0")
                # The fused tensor splits back along dim 0 into its n sources (qkv -> q, k, v), in table order.
                for template, chunk in zip(rule.theirs, tensor.chunk(n, dim=0), strict=True):
                    out[_fill(template, indices, hit[1])] = chunk.contiguous()
                break
            else:
                raise ValueError(f"{key} has no counterpart in the {self.format} layout of {self.family} models")
        return out

    def _match_theirs(self, name: str) -> tuple[Rename, int, str] | None:
        """(rule, part number, vitkit name) for a source name, or None."""
        for rule in self.rules:
            for part, template in enumerate(rule.theirs):
                hit = _match(template, name)
                indices = None if hit is None else rule.to_ours(hit[0]) if rule.to_ours else hit[0]
                if indices is not None:
                    return rule, part, _fill(rule.ours, indices, hit[1])
        return None
