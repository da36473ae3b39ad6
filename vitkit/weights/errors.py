"""The errors of reading weights that the caller can fix, each an exception carrying its facts.

`str()` words the ways out for Python callers (arguments: ``num_classes=5``, ``reset_head=True``, ``format='hf'``);
`vitkit.cli.messages` words the same facts with the flags of the command at hand (``--model-arg num_classes=5``,
``--reset-head``, ``--from hf``). All are ValueErrors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vitkit.models.registry import MODELS_LISTED


def shown_models(models: Sequence[str]) -> str:
    """The first few registered model names of a list, for a message: "a, b, c, d, e, ..."."""
    return ", ".join(models[:5]) + (", ..." if len(models) > 5 else "")


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the model, with the ways out: registered models of the checkpoint's size,
    config values that would make the model fit, and whether skipping the checkpoint's classifier would."""

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
        ways = []
        if self.models:  # the registered variant first: the whole fix in one name
            ways.append(f"use a registered model of that size: {shown_models(self.models)}")
        if self.fields:
            ways.append("build the model with " + ", ".join(f"{k}={v!r}" for k, v in self.fields.items()))
        if self.reset_head:
            ways.append(f"pass reset_head=True to {self.reset_head}")
        super().__init__(problem + (": " + ", or ".join(ways) if ways else ""))


class LayoutMismatch(ValueError):
    """A checkpoint read as one library's layout (`given`) that is in another's (`found`)."""

    def __init__(self, path: str, given: str, found: str) -> None:
        self.path, self.given, self.found = path, given, found
        super().__init__(
            f"{self.problem}: read it as {found} (format={found!r}), or let the layout be recognised (format='auto')"
        )

    @property
    def problem(self) -> str:
        shown = "timm / vitkit" if self.found == "vitkit" else self.found
        return f"{self.path} is in the {shown} layout, not {self.given}'s"


RUN_CHECKPOINT = "checkpoint.pt"  # the file a training run keeps beside its best/ and final/ (`vitkit.train` names
# its checkpoint with it)


class ModelNeeded(ValueError):
    """A checkpoint file that holds weights but no architecture: the registered model it fits must be named."""

    def __init__(self, path: str, detail: str = "") -> None:
        self.path = path
        self.detail = detail  # what else was found, e.g. ", and not in the vit-pytorch layout; it looks like ..."
        # a training run's checkpoint (`vitkit.train`'s checkpoint.pt): the model directories beside it, which hold
        # their configs
        beside = Path(path).parent
        ran = Path(path).name == RUN_CHECKPOINT
        self.run_models = tuple(
            str(beside / n) for n in ("best", "final") if ran and (beside / n / "config.json").is_file()
        )
        if self.run_models:
            way = f"load one of its run's model directories instead: {' or '.join(self.run_models)}"
        else:
            way = (
                "build the registered model it fits and load the file into it (vitkit.create_model(name), "
                f"vitkit.load_weights(model, path); see {MODELS_LISTED})"
            )
        super().__init__(f"{self.problem}: {way}")

    @property
    def problem(self) -> str:
        return f"{self.path} is a checkpoint file without a config{self.detail}"


class ModelNotNeeded(ValueError):
    """A model named for weights that build their own: a model directory, or a file whose layout builds its model
    from its shapes."""

    def __init__(self, problem: str, fields: Mapping[str, str] | None = None) -> None:
        self.problem = problem  # e.g. "runs/x is a model directory with its own config.json"
        self.fields = dict(fields or {})  # config fields the weights do not say -> a placeholder of the value
        given = "".join(f", {k}={v}" for k, v in self.fields.items())
        super().__init__(f"{problem}: read it without a model name (vitkit.from_pretrained(path{given}))")


class FieldsNeeded(ValueError):
    """Weights that do not say some config fields of the model they build: the caller gives them."""

    def __init__(self, problem: str, fields: Mapping[str, str]) -> None:
        self.problem = problem  # what is not known, e.g. "a vit-pytorch state dict does not say its number of heads"
        self.fields = dict(fields)  # field -> a placeholder of its value, e.g. {"num_heads": "H"}
        super().__init__(f"{problem}: give " + ", ".join(f"{k}={v}" for k, v in self.fields.items()))


__all__ = ["CheckpointMismatch", "FieldsNeeded", "LayoutMismatch", "ModelNeeded", "ModelNotNeeded"]
