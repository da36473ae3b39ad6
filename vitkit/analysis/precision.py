"""The precisions vitkit trains, runs and costs models in, named once: what `--precision` and `--dtype` take, and
the activation dtype each means (bf16: bfloat16 autocast in training, bfloat16 weights and activations after
`vitkit.optimize`, bfloat16 activations in cost reports and memory estimates)."""

from __future__ import annotations

import torch

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def precision_dtype(precision: str) -> torch.dtype:
    """The activation dtype of `precision`; ValueError naming the precisions for any other."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]
