"""How the library's structured errors read on the command line: their facts as the library states them, the ways
out in flags. An `vitkit.errors.OptionMessage` names options that are each a flag of the same name (`cli_option`);
the errors of reading weights (`vitkit.weights.errors`) name the flags of the command at hand (`vitkit convert`'s
--model-arg, --from, --reset-head; `vitkit train`'s --model-arg)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vitkit.errors import OptionMessage
from vitkit.weights.errors import (
    CheckpointMismatch,
    FieldsNeeded,
    LayoutMismatch,
    ModelNeeded,
    ModelNotNeeded,
    shown_models,
)


def cli_option(option: str, value: Any = None) -> str:
    """An option as a command's flag: the argument's name with `_` written `-` (``--scale-jitter``), followed by its
    value (``--compare transformers``; a sequence comma-separated, ``--layers 0,-1``; True: the flag alone)."""
    flag = "--" + option.replace("_", "-")
    if value is None or value is True:
        return flag
    shown = ",".join(map(str, value)) if isinstance(value, Sequence) and not isinstance(value, str) else value
    return f"{flag} {shown}"


# The errors of reading weights `cli_message` words: each command catches these around the library call it makes.
STRUCTURED = (CheckpointMismatch, FieldsNeeded, LayoutMismatch, ModelNeeded, ModelNotNeeded)


@dataclass(frozen=True)
class Flags:
    """A command's flags for the ways out the library's errors offer."""

    field: str  # replaces a config field of the model: FLAG FIELD=VALUE
    model: str = "--model"  # names a registered model
    reset_head: str | None = None  # keeps the model's own classifier; None: the command has none
    layout: str | None = None  # names the layout of the weights read; None: the command has none


CONVERT = Flags("--model-arg", reset_head="--reset-head", layout="--from")
TRAIN = Flags("--model-arg")


def _value(value: Any) -> str:
    """A value as FLAG FIELD=VALUE parses it (JSON, no spaces, so the shell keeps it one word)."""
    return json.dumps(list(value) if isinstance(value, tuple) else value, separators=(",", ":"))


def _placeholder(text: str) -> str:
    """A placeholder of a value as the library writes it, "(H, W)", as the command line takes it: "[H,W]"."""
    return text.replace("(", "[").replace(")", "]").replace(" ", "")


def cli_message(err: Exception, flags: Flags | None = None) -> str:
    """`err`'s message with flags for its ways out: an `OptionMessage`'s options as flags of their names, a weights
    error's with `flags` (`str(err)` for any other error)."""
    if isinstance(err, OptionMessage):
        return err.message(cli_option)
    if isinstance(err, ModelNeeded) and err.run_models:  # a training checkpoint: its run's models hold configs
        models = " or ".join(err.run_models)
        return f"{err.problem}: it is a training run's checkpoint; give one of the run's models: {models}"
    if isinstance(err, ModelNeeded) and flags is None:  # a command that reads models, not checkpoint files
        return (
            f"{err.problem}: make it a model directory with the registered model it fits, vitkit convert "
            f"{err.path} --model NAME --out DIR (see `vitkit models`), and give that directory"
        )
    if flags is None:
        return str(err)
    if isinstance(err, CheckpointMismatch):
        ways = []
        if err.models:  # the registered variant first: the whole fix in one name
            ways.append(f"pass {flags.model} NAME with a registered model of that size: {shown_models(err.models)}")
        if err.fields:
            ways.append("pass " + " ".join(f"{flags.field} {k}={_value(v)}" for k, v in err.fields.items()))
        if err.reset_head and flags.reset_head:
            ways.append(f"pass {flags.reset_head} to {err.reset_head}")
        return err.problem + (": " + ", or ".join(ways) if ways else "")
    if isinstance(err, FieldsNeeded):
        given = " ".join(f"{flags.field} {k}={_placeholder(v)}" for k, v in err.fields.items())
        return f"{err.problem}: give {'it' if len(err.fields) == 1 else 'them'} with {given}"
    if isinstance(err, LayoutMismatch) and flags.layout:
        return (
            f"{err.problem}: read it as {err.found} ({flags.layout} {err.found}), or let the layout be recognised "
            f"(no {flags.layout})"
        )
    if isinstance(err, ModelNeeded):
        return (
            f"{err.problem}: name the model with {flags.model} (e.g. {flags.model} vit_base_patch16_224; see "
            "`vitkit models`)"
        )
    if isinstance(err, ModelNotNeeded):
        given = " ".join(f"{flags.field} {k}={_placeholder(v)}" for k, v in err.fields.items())
        return f"{err.problem}: drop {flags.model}" + (f", and give {given}" if given else "")
    return str(err)
