"""Where and how a model runs: the device (a GPU when there is one) and the precision of its forward pass.

Training and inference both use these.
"""

from __future__ import annotations

import torch


def resolve_device(device: str | None) -> str:
    """ "cuda" when asked for or, with `device` None, when a GPU is present; otherwise "cpu"."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU")
    return device


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """bfloat16 autocast for precision "bf16", a disabled context for "fp32"."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
