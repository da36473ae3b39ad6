"""Models for training: built from the registry or from saved weights (fine-tuning), and gradient checkpointing."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.models.interface import require_model
from vitkit.models.registry import DETECTION, create_model, family_of
from vitkit.weights import CheckpointMismatch, LoadReport, ModelNeeded, from_pretrained, load_report, load_weights
from vitkit.weights.backbone import classifier_backbone, load_backbone
from vitkit.weights.convert import REPORT_ATTRIBUTE, detect_format, read_model_info, unwrap_state_dict, with_info
from vitkit.weights.family import family_weights, saved_family
from vitkit.weights.hub import hub_snapshot, is_hub, local_source
from vitkit.weights.io import ModelInfo, model_info, read_checkpoint


def load_for_finetune(
    source: str | os.PathLike,
    num_classes: int,
    model: str | None = None,
    prior: float | None = None,
    **overrides: Any,
) -> nn.Module:
    """A model initialised from saved weights for `num_classes` classes: `vitkit.from_pretrained(source)` for a
    directory, the registry model `model` filled by `vitkit.load_weights(model, source)` otherwise, each keeping the
    saved classifier where it has that many classes and a fresh one where not.

    Args:
        source: a vitkit, Hugging Face or timm model directory, a Hub repository ("hf-hub:ORG/REPO[@REVISION]",
            downloaded unless cached; its commit is recorded in `vitkit.weights.model_info(model).weights`), or a
            checkpoint file in any layout `vitkit.load_weights` reads (timm / vitkit, torchvision, Hugging Face,
            facebookresearch/detr, fundamentalvision/Deformable-DETR; `.safetensors`, `.pth`, `.pt`, `.bin`;
            training checkpoints are unwrapped). For a detector, a ResNet classifier's file (torchvision's or
            timm's) initialises its ResNet backbone alone; for a detector built on a Swin or ViT, any checkpoint
            of that classifier (`vitkit.weights.backbone.load_backbone`) initialises its backbone alone.
        num_classes: the classes to train; a classifier for another number (every class head of a detector, and
            whatever else the family sizes by the classes) is freshly initialised, everything else is loaded.
        model: the registry model to build and load `source` into; None for a directory builds the model saved
            there. A checkpoint file holds no architecture, so it needs `model` (`vitkit.weights.ModelNeeded`).
        prior: for a detector, the probability every class of a fresh class head starts at (the focal loss's
            initialisation, `vitkit.detection.FOCAL_PRIOR`: the model's ``reset_classifier(num_classes, prior)``);
            None leaves a fresh head as the model initialises it. A loaded head is kept as it is.
        overrides: config fields to replace; with another `img_size` a ViT's position table is resampled.

    The model returned carries what was loaded, kept and reset: `vitkit.weights.load_report(model)`, worded by
    `describe_init`. The weights' errors (`vitkit.weights.CheckpointMismatch`, ...) carry their facts and ways out.

    Example: ``load_for_finetune("runs/train/final", num_classes=3, img_size=56)``,
    ``load_for_finetune("vit_tiny.pth", 5, model="vit_tiny_patch16_224")``,
    ``load_for_finetune("r50_deformable_detr-checkpoint.pth", 3, model="deformable_detr_resnet50", prior=0.01)``.
    """
    source = os.fspath(source)
    if model is not None:
        built = create_model(model, num_classes=num_classes, **overrides)
        local = local_source(source)
        backbone = classifier_backbone(built) is not None and not _holds_family(local, family_of(built).name)
        if backbone:
            report = load_backbone(built, source)  # a Swin's or ViT's weights: the backbone alone
        else:
            report = _keeping_fresh_head(lambda reset_head: load_weights(built, local, reset_head=reset_head))
        if not backbone and saved_family(local) is not None:  # a model directory (vitkit's, timm's, transformers'):
            # its normalisation, framing and names, as from_pretrained carries them (a Hub one with its commit)
            with_info(built, read_model_info(source), reset_head=report.head_reset)
        elif is_hub(source):  # where the weights came from, at which commit
            with_info(built, ModelInfo(weights=hub_snapshot(source).source))
    elif not is_hub(source) and not Path(source).is_dir():
        raise ModelNeeded(source)
    else:
        built = _keeping_fresh_head(
            lambda reset_head: from_pretrained(source, reset_head=reset_head, num_classes=num_classes, **overrides)
        )
        report = load_report(built)
    report.source = (model_info(built).weights or source) if is_hub(source) else source  # a Hub one at its commit
    fam = family_of(built)
    if prior is not None:
        if fam.task != DETECTION:
            raise ValueError(f"prior is the starting probability of a detector's classes; {fam.name} is no detector")
        if any(k.startswith(family_weights(fam.name).head) for k in report.reset):  # the class head is fresh
            built.reset_classifier(num_classes, prior=prior)
    setattr(built, REPORT_ATTRIBUTE, report)
    return built


def _holds_family(source: str | os.PathLike, family_name: str) -> bool:
    """Whether a local file or directory holds a model of the family `family_name` (in any of its layouts); a
    detector built on a classifier backbone takes whatever else (a classifier's weights) into that backbone."""
    if Path(source).is_dir():
        found = saved_family(source)
        return found is not None and found.name == family_name
    state, _ = unwrap_state_dict(read_checkpoint(source), os.fspath(source))
    try:
        detect_format(state, family_name, os.fspath(source))
    except CheckpointMismatch:
        return False
    return True


def _keeping_fresh_head(load: Callable[[bool], Any]) -> Any:
    """`load(reset_head=False)`, or `load(reset_head=True)` when the saved classifier is for another number of
    classes (or missing): the model keeps its freshly initialised one."""
    try:
        return load(False)
    except CheckpointMismatch as err:
        if err.reset_head is None:  # the body does not fit: no head choice helps
            raise
        return load(True)


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


def enable_grad_checkpointing(model: nn.Module) -> int:
    """Recompute every block of a vitkit model in backward (torch.utils.checkpoint) instead of storing its
    activations: the model's `set_grad_checkpointing` (ViT's encoder blocks, each Swin block, BoTNet's bottleneck
    and BoT blocks). Parameter names and the state dict are unchanged. Returns the number of blocks wrapped.
    """
    return require_model(model, "gradient checkpointing").set_grad_checkpointing(True)
