"""Which path a kernel takes for a call: one policy, asked by the layers when they run and by their costs.

Dense attention (`attention_path`) has four paths (`vitkit.kernels.attention`): torch's fused kernel, the explicit
product, the explicit product a block of queries at a time, and the reference formula. Multi-scale deformable
sampling (`deformable_path`) has three (`vitkit.kernels.deformable`): the gather, the levelwise `grid_sample` and the
reference. The measurements behind each rule are in BENCHMARKS.md.
"""

from __future__ import annotations

import functools

import torch

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


@functools.cache
def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX), as oneDNN reports it. Without,
    torch emulates bf16 products, several times slower than fp32."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def cpu_amx() -> bool:
    """Whether this CPU has AMX bf16 tiles (Intel Xeon since Sapphire Rapids), as torch reports it."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    try:
        return bool(capabilities is not None and capabilities().get("amx_bf16", False))
    except RuntimeError:  # a build or platform that cannot read the CPU's features
        return False


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
    - `auto` in bf16 on a CPU with bf16 instructions: without AMX, the explicit path while the weights fit in
      `explicit_max_bytes`, beyond it the blocked path (the fused kernel with a gradient); with AMX, the fused kernel
      for inference (it runs on the tiles) and the explicit path with a gradient.
    - Everywhere else (fp32, GPUs, CPUs that emulate bf16): the fused kernel.
    """
    if backend == "math":
        return "reference"
    if capture or (dropout > 0 and device.type == "cpu"):
        return "explicit"
    if backend != "auto" or device.type != "cpu" or dtype != torch.bfloat16 or not native_cpu_bf16():
        return "fused"
    if not grad and cpu_amx():
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
