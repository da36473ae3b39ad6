"""Readable views of a cost `Report`: grouped tables, the shape flow of one block, the scaling sweep."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

import torch

from vitkit.analysis.profile import CATEGORIES, Report, category, group_key, profile
from vitkit.cost.rows import OpCost
from vitkit.models.registry import create_model, model_entry

# How the notes write each operator's shapes; letters: B batch, N tokens, C channels, h heads, d = C / h.
SYMBOLIC = {
    "qkv": "(B, N, C) -> Linear -> (B, N, 3C) -> reshape (B, N, 3, h, d) -> permute (3, B, h, N, d)",
    "q*scale": "q (B, h, N, d) * d^-0.5",
    "q@k^T": "(B, h, N, d) @ (B, h, d, N) -> (B, h, N, N)",
    "+bias": "(B, h, N, N) + bias",
    "softmax": "softmax over the last dim of (B, h, N, N)",
    "attn@v": "(B, h, N, N) @ (B, h, N, d) -> (B, h, N, d)",
    "merge_heads": "(B, h, N, d) -> transpose (B, N, h, d) -> reshape (B, N, C)",
    "proj": "(B, N, C) -> Linear -> (B, N, C)",
    "fc1": "(B, N, C) -> Linear -> (B, N, rC)",
    "gelu": "GELU on (B, N, rC)",
    "fc2": "(B, N, rC) -> Linear -> (B, N, C)",
    "layer_norm": "LayerNorm over C",
    "add": "x + branch(x): the residual",
}


@dataclass(frozen=True)
class Row:
    name: str  # group name (block, operator or module)
    macs: int
    flops: int
    train_flops: int
    out_bytes: int


def grouped(report: Report, by: str) -> list[Row]:
    """Sum the report's operator rows by block, by operator or by layer (module), in first-seen order."""
    if by not in ("block", "op", "layer"):
        raise ValueError(f"by must be 'block', 'op' or 'layer', got {by!r}")
    groups: dict[str, list[OpCost]] = OrderedDict()
    for op in report.ops:
        groups.setdefault(op.op if by == "op" else group_key(op.module, by, report.parts), []).append(op)
    return [
        Row(
            name,
            sum(o.macs for o in ops),
            sum(o.flops for o in ops),
            sum(3 * o.matmul_flops + 2 * o.other_flops for o in ops),
            sum(o.out_bytes for o in ops),
        )
        for name, ops in groups.items()
    ]


def shares(report: Report) -> dict[str, float]:
    """Fraction of all FLOPs spent in attention, MLP, embedding, a detector's backbone (only when there is one) and
    everything else."""
    totals = dict.fromkeys(CATEGORIES, 0)
    for op in report.ops:
        totals[category(op.module, report.parts)] += op.flops
    return {k: v / report.flops for k, v in totals.items() if k != "backbone" or v}


def shape_flow(report: Report) -> list[str]:
    """The first attention block's operators with their shapes, symbolic and numeric."""
    first = next((op.module for op in report.ops if op.op == "qkv"), None)
    if first is None:
        return []
    block = group_key(first, "block", report.parts)
    lines = []
    for op in report.ops:
        if group_key(op.module, "block", report.parts) != block:
            continue
        numeric = f"{tuple(op.in_shape)} -> {tuple(op.out_shape)}"
        lines.append(f"{op.module:<24} {op.op:<13} {numeric:<42} {SYMBOLIC.get(op.op, '')}".rstrip())
    return lines


def _quadratic(op: OpCost, dense: set[str]) -> bool:
    """Whether `op` is one of dense attention's N^2 terms; `dense` names the modules that form q@k^T (a deformable
    layer's softmax over its sampling points grows with the tokens, not their square)."""
    return op.op in ("q@k^T", "attn@v") or (op.op in ("softmax", "+bias") and op.module in dense)


@dataclass(frozen=True)
class ScalePoint:
    side: int  # square image side
    tokens: int  # tokens attended per attention call at the first block
    quadratic_flops: int  # attention's N^2 terms: q@k^T, softmax, bias add, attn@v
    linear_flops: int  # everything else
    activation_bytes_sdpa: int
    activation_bytes_math: int


def check_scalable(model_name: str) -> None:
    """ValueError unless the registered model `model_name` takes images of other sizes (`scaling` sweeps them)."""
    config = model_entry(model_name).config
    if not any(f.name == "dynamic_img_size" for f in dataclasses.fields(config)):
        raise ValueError(
            f"{model_name} takes only {config.img_size}x{config.img_size} images, so there are no other sizes to plot"
        )


def scaling(
    model_name: str,
    sides: list[int],
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[ScalePoint]:
    """Cost and peak activation memory of `model_name` at square sizes `sides`, for both attention backends, with
    activations in `dtype` on `device` (as `profile` assumes them)."""
    check_scalable(model_name)
    models = {}
    for backend in ("sdpa", "math"):
        with torch.device("meta"):
            models[backend] = create_model(model_name, dynamic_img_size=True, attn_backend=backend).eval()
    points = []
    for side in sides:
        fused, reference = (profile(models[b], side, batch, dtype=dtype, device=device) for b in ("sdpa", "math"))
        dense = {op.module for op in fused.ops if op.op == "q@k^T"}
        quadratic = sum(op.flops for op in fused.ops if _quadratic(op, dense))
        tokens = next((op.in_shape[1] for op in fused.ops if op.op == "qkv"), 0)
        points.append(
            ScalePoint(
                side, tokens, quadratic, fused.flops - quadratic, fused.activation_bytes, reference.activation_bytes
            )
        )
    return points


def crossover(points: list[ScalePoint]) -> ScalePoint | None:
    """The first size at which attention's N^2 terms cost at least as much as all the linear terms."""
    return next((p for p in points if p.quadratic_flops >= p.linear_flops), None)
