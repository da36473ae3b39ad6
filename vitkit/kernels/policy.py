"""Which path a kernel takes for a call: one policy, asked by the layers when they run and by their costs.

Dense attention (`attention_path`) has four paths (`vitkit.kernels.attention`): torch's fused kernel, the explicit
product, the explicit product a block of queries at a time, and the reference formula. Multi-scale deformable
sampling (`deformable_path`) has three (`vitkit.kernels.deformable`): the gather, the levelwise `grid_sample` and the
reference. The measurements behind each rule are in BENCHMARKS.md; where CPUs differ, the rule asks what this one
measured (`vitkit.kernels.probe`).
"""

from __future__ import annotations

import torch

from vitkit.kernels import probe

ATTENTION_BACKENDS = ("auto", "sdpa", "math")
"""A dense attention layer's backends: `sdpa`, torch's fused kernel (never keeps the N x N weights); `math`, the
reference formula; `auto` (the default), the fused kernel except where the explicit path is faster."""

DEFORMABLE_BACKENDS = ("auto", "gather", "levelwise", "math")
"""A deformable attention layer's backends: `gather`, one `embedding_bag` over all levels; `levelwise`, `grid_sample`
per level with a written-out backward; `math`, the reference; `auto` (the default), the gather for inference and
the levelwise path in training."""

BACKENDS = ("auto", "sdpa", "gather", "levelwise", "math")
"""Every backend name; `auto` and `math` mean the same to both kinds of layer."""

def knows(backend: str, deformable: bool) -> bool:
    """Whether a dense (or a `deformable`) attention layer has the backend `backend`."""
    return backend in (DEFORMABLE_BACKENDS if deformable else ATTENTION_BACKENDS)


ATTENTION_PATHS = ("fused", "explicit", "blocked", "reference")
DEFORMABLE_PATHS = ("gather", "levelwise", "reference")


def check_backend(backend: str, kinds: tuple[str, ...] = ATTENTION_BACKENDS) -> str:
    """`backend`, or ValueError unless it is one of `kinds`."""
    if backend not in kinds:
        raise ValueError(f"attention backend must be one of {kinds}, got {backend!r}")
    return backend


def attention_path(
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    weights_bytes: int,
    *,
    dropout: float = 0.0,
    grad: bool = False,
    capture: bool = False,
    explicit_max_bytes: int,
) -> str:
    """Which of `ATTENTION_PATHS` computes a dense attention call whose N x N weights take `weights_bytes`.

    - `math`: the reference.
    - Capturing the weights, or dropout on them on a CPU (torch's fused CPU kernel has none): the explicit path.
    - `auto` in bf16 on a CPU where the explicit product measures faster than the fused kernel, with a gradient or
      without as the call needs (`vitkit.kernels.probe.cpu_bf16_attention`): the explicit path while the weights fit
      in `explicit_max_bytes`, beyond it the blocked path (the fused kernel with a gradient). Measured: with
      AVX512-BF16 and no AMX, both ways; with AMX tiles, with a gradient only (the fused kernel runs on the tiles);
      where bf16 is emulated, neither.
    - Everywhere else (fp32, GPUs, and a call traced before this process measured): the fused kernel.
    """
    if backend == "math":
        return "reference"
    if capture or (dropout > 0 and device.type == "cpu"):
        return "explicit"
    if backend != "auto" or device.type != "cpu" or dtype != torch.bfloat16:
        return "fused"
    times = probe.known_cpu_bf16_attention() if torch.compiler.is_compiling() else probe.cpu_bf16_attention()
    if times is None or not times.explicit_faster(grad):
        return "fused"
    if weights_bytes <= explicit_max_bytes:
        return "explicit"
    return "fused" if grad else "blocked"


def deformable_path(backend: str, training: bool) -> str:
    """Which of `DEFORMABLE_PATHS` samples a deformable attention call of a layer in training mode or not: `math` the
    reference, `gather` and `levelwise` themselves, `auto` the gather for inference and the levelwise path in
    training (the gather's backward is slow)."""
    if backend == "math":
        return "reference"
    if backend == "auto":
        return "levelwise" if training else "gather"
    return backend
