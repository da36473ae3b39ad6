"""The precisions vitkit trains, runs and costs models in, named once: what `--precision` takes, and
the activation dtype each means (bf16: bfloat16 autocast in training, bfloat16 weights and activations after
`vitkit.optimize`, bfloat16 activations in cost reports and memory estimates), and whether a device runs bf16
faster than fp32 at all (`slow_precision`): measured on matrix products (`cpu_matmul_rates`), and on a model's own
step where one is at hand (`time_step`)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from vitkit.errors import Namer, python_option
from vitkit.kernels.probe import best_time, cpu_amx, isa_caps, measured, native_cpu_bf16

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def precision_dtype(precision: str) -> torch.dtype:
    """The activation dtype of `precision`; ValueError naming the precisions for any other."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


AUTO = "auto"  # the faster of fp32 and bf16 on the device at hand (`auto_precision`)
# the products the probe times: a square one, and ViT-S's MLP on 8 images of 197 tokens, (M x K) @ (K x N)
PROBE_SHAPES = ((1024, 1024, 1024), (1576, 384, 1536))
FASTER_BY = 1.1  # `auto` takes bf16 when the probe measures it at least this much faster than fp32
RATES_FILE = "matmul_rates.json"  # the probe's results per machine, in `vitkit.kernels.probe.cache_dir()`


@dataclass(frozen=True)
class MatmulRates:
    """A device's matrix-product rate in each precision (FLOP/s), measured on PROBE_SHAPES."""

    fp32: float
    bf16: float

    @property
    def bf16_speedup(self) -> float:
        """bf16's rate over fp32's: 2-7 on CPUs with AMX or AVX512-BF16 that use it well, under 1 where bf16 is
        emulated, and between where the instructions exist but run slowly (0.6-0.8 on some Xeons without AMX)."""
        return self.bf16 / self.fp32

    def describe(self) -> str:
        """ "bf16 0.52 TFLOP/s, fp32 0.24" """
        return f"bf16 {self.bf16 / 1e12:.2f} TFLOP/s, fp32 {self.fp32 / 1e12:.2f}"


def _rate(dtype: torch.dtype, device: torch.device, repeats: int = 3) -> float:
    """FLOP/s of PROBE_SHAPES' products in `dtype`, each product's best of `repeats` timings counted."""
    flops, seconds = 0, 0.0
    for m, k, n in PROBE_SHAPES:
        x = torch.randn(m, k, dtype=dtype, device=device)
        w = torch.randn(n, k, dtype=dtype, device=device)
        flops, seconds = flops + 2 * m * k * n, seconds + best_time(lambda x=x, w=w: F.linear(x, w), repeats)
    return flops / seconds


def _time_rates() -> dict[str, float]:
    cpu = torch.device("cpu")
    with torch.inference_mode():
        return {"fp32": _rate(torch.float32, cpu), "bf16": _rate(torch.bfloat16, cpu)}


@functools.cache
def cpu_matmul_rates() -> MatmulRates:
    """This CPU's `MatmulRates` under torch's current thread count: read from the cache
    (`vitkit.kernels.probe.cache_dir`) when this machine's were measured before (`probe_key`), else measured (a few
    tenths of a second) and cached."""
    return MatmulRates(**measured(RATES_FILE, ("fp32", "bf16"), _time_rates))


def choose_precision(rates: MatmulRates) -> str:
    """bf16 when `rates` measure it at least FASTER_BY times fp32's rate, else fp32."""
    return "bf16" if rates.bf16 >= FASTER_BY * rates.fp32 else "fp32"


def auto_precision(device: torch.device | str) -> tuple[str, str]:
    """(the faster of fp32 and bf16 on `device`, why): on a CPU, as the probe measures them (`cpu_matmul_rates`);
    on a GPU, bf16 where it has bf16 matrix units."""
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", f"{torch.cuda.get_device_name(device)} has bf16 matrix units"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16 matrix units"
    rates = cpu_matmul_rates()
    chosen = choose_precision(rates)
    return chosen, f"measured on this CPU: {rates.describe()}"


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """`precision` ("fp32", "bf16" or "auto") as it runs on `device`: "auto" resolved by `auto_precision`."""
    if precision == AUTO:
        return auto_precision(device)[0]
    precision_dtype(precision)  # ValueError for any other
    return precision


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one step of a model (a training step, forward and backward, or an inference forward) in fp32 and
    in bf16 (under autocast, or `optimize`d), as `time_step` measured them."""

    fp32: float
    bf16: float

    def choice(self) -> str:
        """bf16 when its step is at least FASTER_BY times faster than fp32's, else fp32."""
        return "bf16" if self.fp32 >= FASTER_BY * self.bf16 else "fp32"

    def describe(self, what: str = "training step") -> str:
        """ "this model's training step 212 ms in bf16 against 170 in fp32: fp32" """
        return (
            f"this model's {what} {1000 * self.bf16:.0f} ms in bf16 against {1000 * self.fp32:.0f} in fp32: "
            f"{self.choice()}"
        )


def outputs_sum(outputs: Any) -> torch.Tensor:
    """The sum of every tensor in a model's outputs (a tensor, or dicts, lists and tuples of them), in fp32: a loss
    that reaches every parameter the outputs used, for a timed training step (and a step that must keep processes
    in step without a real loss)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().sum()
    values = outputs.values() if isinstance(outputs, dict) else outputs
    return sum(outputs_sum(value) for value in values)


def time_step(step: Callable[[bool, int], object], rounds: int = 3) -> StepTimes:
    """`step(autocast, i)`'s seconds without autocast (fp32) and under bf16 autocast: one call of each (i = 0) to set
    their kernels up, then the medians of `rounds` calls of each (i = 1..rounds), interleaved, the precision that
    goes first alternating. Where the products alone favour bf16, a model's step may not: its many small operators
    gain nothing, autocast adds casts, and a step at a shape not seen before sets up new kernels, which costs more in
    bf16 (the small detector's training step on a Xeon with AMX, a new image size every step: 20-30% slower in
    bf16). `i` lets the step take a new shape each round where training does."""
    for autocast in (False, True):
        step(autocast, 0)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(1, rounds + 1):
        for autocast in (False, True) if i % 2 else (True, False):
            start = time.perf_counter()
            step(autocast, i)
            times[autocast].append(time.perf_counter() - start)
    return StepTimes(fp32=statistics.median(times[False]), bf16=statistics.median(times[True]))


def time_training_step(
    net: torch.nn.Module,
    forward: Callable[[torch.Tensor], Any],
    images: Callable[[int], torch.Tensor],
    device: torch.device,
    rounds: int = 3,
) -> StepTimes:
    """`time_step` of a training step of `net`: `forward(images(i))` in training mode, under bf16 autocast or not,
    and the backward of its outputs' sum. Afterwards `net`'s buffers (BatchNorm's statistics), its gradients (none)
    and torch's CPU random numbers are as they were, even where a step failed."""
    buffers = [b.detach().clone() for b in net.buffers()]  # BatchNorm's statistics move in training mode

    def step(autocast: bool, i: int) -> None:
        x = images(i)
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            outputs = forward(x)
        outputs_sum(outputs).backward()
        net.zero_grad(set_to_none=True)

    net.train()
    try:
        with torch.random.fork_rng(devices=[]):
            return time_step(step, rounds)
    finally:
        net.zero_grad(set_to_none=True)
        with torch.no_grad():
            for kept, buffer in zip(buffers, net.buffers(), strict=True):
                buffer.copy_(kept)


def cpu_features() -> str:
    """The CPU's bf16-related instruction sets as torch sees them, e.g. "AVX512, native bf16 with AMX" or
    "AVX2, no native bf16 (...)", and any cap on them set in the environment (`isa_caps`)."""
    capability, caps = torch.backends.cpu.get_cpu_capability(), isa_caps()
    capped = f"; capped by {caps}" if caps else ""
    if native_cpu_bf16():
        return f"{capability}, native bf16{' with AMX' if cpu_amx() else ''}{capped}"
    return f"{capability}, no native bf16 (neither AVX512-BF16 nor AMX){capped}"


class SlowPrecisionWarning(UserWarning):
    """A precision asked for that runs slower than fp32 here (`slow_precision`'s message): `vitkit.optimize` warns
    with it."""


def slow_precision(precision: str, device: torch.device | str, name: Namer = python_option) -> str | None:
    """Why `precision` would run slower than fp32 on `device`, or None: on a CPU, when the probe measures bf16's
    products slower (`cpu_matmul_rates`): emulated where the CPU lacks bf16 instructions (a Zen 3 core: 14 GFLOP/s
    against 110), and slower on some CPUs that have them (a Xeon without AMX: 0.6-0.8x); on GPUs without bf16
    (before Ampere). `name` words the way out (`vitkit.errors.Namer`)."""
    if precision_dtype(precision) != torch.bfloat16:
        return None
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        return f"{torch.cuda.get_device_name(device)} has no bf16 matrix units: bf16 runs slower than fp32 there"
    if device.type != "cpu":
        return None
    rates = cpu_matmul_rates()  # measured: the instructions being there does not make them fast
    if rates.bf16_speedup >= 1:
        return None
    return (
        f"bf16 is slower than fp32 on this CPU ({cpu_features()}): matrix products run at "
        f"{rates.bf16 / 1e9:.1f} GFLOP/s in bf16 against {rates.fp32 / 1e9:.1f} in fp32 "
        f"({1 / rates.bf16_speedup:.1f}x slower); use fp32 ({name('precision', 'fp32')}) or the faster of the two "
        f"({name('precision', AUTO)})"
    )
