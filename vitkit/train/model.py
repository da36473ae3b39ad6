"""Models for training: built from the registry or from saved weights (fine-tuning), and gradient checkpointing."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.models.interface import require_model
from vitkit.models.registry import DETECTION, create_model, family_of
from vitkit.weights import CheckpointMismatch, LoadReport, load_pretrained, load_weights
from vitkit.weights.family import family_weights

INIT_ATTRIBUTE = "init_report"  # the `LoadReport` that `load_for_finetune` sets on the model it returns


def load_for_finetune(
    source: str | os.PathLike,
    num_classes: int,
    model: str | None = None,
    prior: float | None = None,
    **overrides: Any,
) -> nn.Module:
    """A model initialised from saved weights, for `num_classes` classes.

    Args:
        source: a vitkit or Hugging Face model directory, or a checkpoint file in any layout
            `vitkit.load_weights` reads (timm / vitkit, torchvision, Hugging Face, facebookresearch/detr,
            fundamentalvision/Deformable-DETR; `.safetensors`, `.pth`, `.pt`, `.bin`; training checkpoints are
            unwrapped). For a detector, a ResNet classifier's file (torchvision's or timm's) initialises the
            backbone alone.
        num_classes: the classes to train; a classifier for another number (every class head of a detector, and
            whatever else the family sizes by the classes) is freshly initialised, everything else is loaded.
        model: the registry model to build and load `source` into; None for a directory builds the model saved
            there. A checkpoint file holds no architecture, so it needs `model`.
        prior: for a detector, the probability every class of a fresh class head starts at (the focal loss's
            initialisation, `vitkit.detection.FOCAL_PRIOR`: the model's ``reset_classifier(num_classes, prior)``);
            None leaves a fresh head as the model initialises it. A loaded head is kept as it is.
        overrides: config fields to replace; with another `img_size` a ViT's position table is resampled.

    The model returned carries what was loaded, kept and reset: `init_report(model)`, worded by `describe_init`.
    ValueError when the weights do not fit, worded with `vitkit train`'s options (`--model-arg`, `--model`).

    Example: ``load_for_finetune("runs/train/final", num_classes=3, img_size=56)``,
    ``load_for_finetune("vit_tiny.pth", 5, model="vit_tiny_patch16_224")``,
    ``load_for_finetune("r50_deformable_detr-checkpoint.pth", 3, model="deformable_detr_resnet50", prior=0.01)``.
    """
    source = os.fspath(source)
    try:
        if model is not None:
            built = create_model(model, num_classes=num_classes, **overrides)
            report = load_adapting_head(built, source)
        elif not Path(source).is_dir():
            raise ValueError(
                f"{source} is a checkpoint file, which holds weights but no architecture: name the model it fits "
                "with --model (see 'vitkit models')"
            )
        else:
            built, report = _load_saved(source, num_classes, overrides)
    except CheckpointMismatch as err:
        raise ValueError(train_message(err)) from err
    report.source = source
    fam = family_of(built)
    if prior is not None:
        if fam.task != DETECTION:
            raise ValueError(f"prior is the starting probability of a detector's classes; {fam.name} is no detector")
        if any(k.startswith(family_weights(fam.name).head) for k in report.reset):  # the class head is fresh
            built.reset_classifier(num_classes, prior=prior)
    setattr(built, INIT_ATTRIBUTE, report)
    return built


def _load_saved(source: str, num_classes: int, overrides: dict[str, Any]) -> tuple[nn.Module, LoadReport]:
    """The model saved in the directory `source` (vitkit's or Hugging Face's) for `num_classes` classes: its
    classifier where it has that many, else a fresh one."""
    try:
        return load_pretrained(source, num_classes=num_classes, **overrides)
    except CheckpointMismatch as err:
        if err.reset_head is None:  # the body does not fit: no head choice helps
            raise
        return load_pretrained(source, reset_head=True, num_classes=num_classes, **overrides)


def load_adapting_head(model: nn.Module, source: str | os.PathLike) -> LoadReport:
    """`vitkit.load_weights(model, source)` (any layout, position table resampled), keeping the model's freshly
    initialised classifier when the checkpoint's is for another number of classes or missing."""
    try:
        return load_weights(model, source)
    except CheckpointMismatch as err:
        if err.reset_head is None:  # the body does not fit: no head choice helps
            raise
        return load_weights(model, source, reset_head=True)


def init_report(model: nn.Module) -> LoadReport | None:
    """What `load_for_finetune` loaded into `model`, kept and reset (None for a model it did not make)."""
    report = getattr(model, INIT_ATTRIBUTE, None)
    return report if isinstance(report, LoadReport) else None


def describe_init(report: LoadReport, num_classes: int) -> str:
    """What a fine-tuned model took from its checkpoint, in one line: the tensors loaded (by top-level module), those
    resampled, those the checkpoint does not hold (left as initialised) and the class-sized ones reset, e.g.
    "loaded 262 tensors (backbone, input_proj, level_embed, query_embed, encoder, decoder, bbox_embed); reset
    class_embed.0..5 for 3 classes (the checkpoint's head has 91)". `report.source` and `report.format` say where
    from."""
    said = [f"loaded {report.loaded} tensors ({', '.join(_top_modules(report.loaded_keys))})"]
    if report.resampled:
        said.append("resampled " + ", ".join(report.resampled))
    if report.uncovered:
        said.append(f"kept as initialised: {', '.join(_top_modules(report.uncovered))} (not in the checkpoint)")
    if report.reset:
        if report.checkpoint_classes is None:
            why = "the checkpoint has no class head"
        elif report.head_reset:
            why = f"the checkpoint's head has {report.checkpoint_classes}"
        else:
            why = "not in the checkpoint"
        said.append(f"reset {', '.join(_modules(report.reset))} for {num_classes} classes ({why})")
    return "; ".join(said)


def _top_modules(keys: list[str]) -> list[str]:
    """The top-level modules (or parameters) that hold `keys`, in order."""
    return list(dict.fromkeys(k.split(".")[0] for k in keys))


def _modules(keys: list[str]) -> list[str]:
    """The modules that hold `keys`, in order, runs of numbered ones joined: "class_embed.0..5"."""
    runs: list[tuple[str, int | None, int | None]] = []  # (name or list prefix, first index, last index)
    for name in dict.fromkeys(k.rsplit(".", 1)[0] for k in keys):
        numbered = re.fullmatch(r"(.+)\.(\d+)", name)
        if numbered is None:
            runs.append((name, None, None))
            continue
        prefix, i = numbered.group(1), int(numbered.group(2))
        if runs and runs[-1][0] == prefix and runs[-1][2] == i - 1:
            runs[-1] = (prefix, runs[-1][1], i)
        else:
            runs.append((prefix, i, i))
    return [p if a is None else f"{p}.{a}" if a == b else f"{p}.{a}..{b}" for p, a, b in runs]


def train_message(err: CheckpointMismatch) -> str:
    """A `CheckpointMismatch` worded with `vitkit train`'s options: `--model-arg FIELD=VALUE` for the config values
    that make the model fit, `--model NAME` for registered models of the checkpoint's size."""
    ways = []
    if err.models:  # the registered variant first: the whole fix in one name
        shown = ", ".join(err.models[:5]) + (", ..." if len(err.models) > 5 else "")
        ways.append(f"pass --model NAME with a registered model of that size: {shown}")
    if err.fields:
        values = (json.dumps(v, separators=(",", ":")) for v in err.fields.values())
        ways.append("pass " + " ".join(f"--model-arg {k}={v}" for k, v in zip(err.fields, values, strict=True)))
    return err.problem + (": " + ", or ".join(ways) if ways else "")


def enable_grad_checkpointing(model: nn.Module) -> int:
    """Recompute every block of a vitkit model in backward (torch.utils.checkpoint) instead of storing its
    activations: the model's `set_grad_checkpointing` (ViT's encoder blocks, each Swin block, BoTNet's bottleneck
    and BoT blocks). Parameter names and the state dict are unchanged. Returns the number of blocks wrapped.
    """
    return require_model(model, "gradient checkpointing").set_grad_checkpointing(True)
