"""AdamW with decoupled weight decay on weight matrices only (a detector's backbone at a learning rate of its own),
and a per-step linear-warmup + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from vitkit.models.interface import VitkitDetector, VitkitModel

FUSED_DEVICES = {"cpu", "cuda"}  # where torch's fused AdamW kernel runs


def no_decay_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters of `model` that take no weight decay besides those of ndim <= 1: the ones each
    vitkit model in it names (`no_weight_decay()`; the model itself, or the one a training wrapper holds)."""
    found = set()
    for module in model.modules():
        if isinstance(module, VitkitModel):
            params = dict(module.named_parameters())
            unknown = sorted(module.no_weight_decay() - set(params))
            if unknown:
                raise ValueError(f"{type(module).__name__}.no_weight_decay() names {unknown}, not its parameters")
            found |= {id(params[name]) for name in module.no_weight_decay()}
    return found


def detector_backbone(model: nn.Module) -> nn.Module:
    """The backbone of the detector that `model` is or holds (`VitkitDetector.backbone`); ValueError without one."""
    detector = next((module for module in model.modules() if isinstance(module, VitkitDetector)), None)
    if detector is None:
        raise ValueError(f"a backbone learning rate was given but {type(model).__name__} has no backbone")
    return detector.backbone


def param_groups(model: nn.Module, weight_decay: float, backbone_lr: float | None = None) -> list[dict]:
    """The optimizer groups of the trainable parameters: decayed and not decayed (every parameter of ndim <= 1 --
    biases, norm scales, LayerScale gammas -- and those the model names in `no_weight_decay()`: learned tokens,
    position tables); with `backbone_lr`, the parameters of a detector's backbone form two more groups (decayed, not
    decayed) at that learning rate, after the others (DETR trains its backbone ten times slower than the
    transformer)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if backbone_lr is None:
        parts = [(named, {})]
    else:
        inside = {id(p) for p in detector_backbone(model).parameters()}
        parts = [
            ([(n, p) for n, p in named if id(p) not in inside], {}),
            ([(n, p) for n, p in named if id(p) in inside], {"lr": backbone_lr}),
        ]
    plain = no_decay_parameters(model)
    return [
        {
            "params": [p for _, p in part if (p.ndim > 1 and id(p) not in plain) == decayed],
            "weight_decay": weight_decay if decayed else 0.0,
        }
        | extra
        for part, extra in parts
        for decayed in (True, False)
    ]


def create_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    backbone_lr: float | None = None,
) -> torch.optim.AdamW:
    """AdamW (decoupled weight decay, Loshchilov & Hutter arXiv:1711.05101) over `param_groups(model)`, the backbone
    at `backbone_lr` when given (`param_groups`).

    On CPU and CUDA it is torch's fused implementation: one kernel over all parameters instead of a dozen
    elementwise passes each (BENCHMARKS.md, "bf16 training step"); the update is the same AdamW.
    """
    for name, value in (("learning rate", lr), ("backbone learning rate", backbone_lr)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if weight_decay < 0:
        raise ValueError(f"weight decay must be >= 0, got {weight_decay}")
    groups = param_groups(model, weight_decay, backbone_lr)
    devices = {p.device.type for group in groups for p in group["params"]}
    fused = bool(devices) and devices <= FUSED_DEVICES
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def warmup_cosine_factor(step: int, total_steps: int, warmup_steps: int, min_factor: float) -> float:
    """Learning-rate multiplier at optimizer step `step` (0-based).

    Linear warmup (step + 1) / warmup_steps over the first `warmup_steps` steps, then a half cosine from 1 down to
    `min_factor` at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps - 1, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, min_factor: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler stepped once per optimizer step following `warmup_cosine_factor`."""
    if total_steps <= 0 or not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"need 0 <= warmup_steps <= total_steps, 0 < total_steps; got {warmup_steps}, {total_steps}")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_factor(step, total_steps, warmup_steps, min_factor)
    )


def apply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> list[float]:
    """Set every parameter group's learning rate to the schedule's value at its current step, and return them.

    A schedule's state (`state_dict`) holds its step, not its function: a run resumed with more epochs loads the
    step into a scheduler built for the new total, and this puts the optimizer on the new schedule at once
    (otherwise the step after the resume would still use the old schedule's rate).
    """
    step = scheduler.last_epoch
    rates = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    return rates
