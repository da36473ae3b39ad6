"""The precisions vitkit trains, runs and costs models in, named once: what `--precision` takes, and
the activation dtype each means (bf16: bfloat16 autocast in training, bfloat16 weights and activations after
`vitkit.optimize`, bfloat16 activations in cost reports and memory estimates), and whether a device runs bf16
faster than fp32 at all (`slow_precision`)."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitkit.errors import Namer, python_option
from vitkit.kernels.policy import cpu_amx, native_cpu_bf16

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def precision_dtype(precision: str) -> torch.dtype:
    """The activation dtype of `precision`; ValueError naming the precisions for any other."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


@dataclass(frozen=True)
class MatmulRates:
    """A device's matrix-product rate in each precision (FLOP/s), measured on a (512 x 512) x (512 x 512) linear."""

    fp32: float
    bf16: float

    @property
    def bf16_speedup(self) -> float:
        """bf16's rate over fp32's: about 2-4 on CPUs with AVX512-BF16 or AMX, under 1 on CPUs without them."""
        return self.bf16 / self.fp32


def _linear_rate(dtype: torch.dtype, device: torch.device, n: int = 512, repeats: int = 3) -> float:
    x = torch.randn(n, n, dtype=dtype, device=device)
    w = torch.randn(n, n, dtype=dtype, device=device)
    F.linear(x, w)  # the first call sets oneDNN's kernel up
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        F.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


@functools.cache
def cpu_matmul_rates() -> MatmulRates:
    """This CPU's `MatmulRates` under torch's current thread count, measured once per process (about 10 ms where
    bf16 is native, up to about 100 ms where it is emulated)."""
    cpu = torch.device("cpu")
    with torch.inference_mode():
        return MatmulRates(fp32=_linear_rate(torch.float32, cpu), bf16=_linear_rate(torch.bfloat16, cpu))


def cpu_features() -> str:
    """The CPU's bf16-related instruction sets as torch sees them, e.g. "AVX512, native bf16 with AMX" or
    "AVX2, no native bf16 (...)"."""
    capability = torch.backends.cpu.get_cpu_capability()
    if native_cpu_bf16():
        return f"{capability}, native bf16{' with AMX' if cpu_amx() else ''}"
    return f"{capability}, no native bf16 (neither AVX512-BF16 nor AMX)"


def slow_precision(precision: str, device: torch.device | str, name: Namer = python_option) -> str | None:
    """Why `precision` would run slower than fp32 on `device`, or None: on CPUs without bf16 instructions torch
    emulates bf16 products, several times slower than fp32 (a Zen 3 core: 14 GFLOP/s against 110 in `F.linear`);
    on GPUs without bf16 (before Ampere) as well. `name` words the way out (`vitkit.errors.Namer`)."""
    if precision_dtype(precision) != torch.bfloat16:
        return None
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        return f"{torch.cuda.get_device_name(device)} has no bf16 matrix units: bf16 runs slower than fp32 there"
    if device.type != "cpu" or native_cpu_bf16():
        return None
    rates = cpu_matmul_rates()
    if rates.bf16_speedup >= 1:
        return None
    return (
        f"bf16 is slower than fp32 on this CPU ({cpu_features()}): matrix products run at "
        f"{rates.bf16 / 1e9:.1f} GFLOP/s in bf16 against {rates.fp32 / 1e9:.1f} in fp32 "
        f"({1 / rates.bf16_speedup:.1f}x slower); use fp32 ({name('precision', 'fp32')})"
    )
