"""What vitkit measures about the machine it runs on, rather than reads from its flags: a few short timings, taken
once per machine and cached in `cache_dir()` under `probe_key()` (the CPU model and what sets its speed, torch's
version, the threads).

- `measured`: a probe's figures, read from its cache file or measured and written there; also a model's timed step
  (`vitkit train`'s and the inference commands' `auto`), keyed beside by the model's `config_digest`.
- `cpu_bf16_attention`: dense attention's fused kernel against the explicit product in bf16 on this CPU, without
  and with a gradient, as `vitkit.kernels.policy.attention_path` asks for `auto`.

The matrix-product rates behind `precision="auto"` are `vitkit.analysis.precision.cpu_matmul_rates`, a probe of the
same kind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from vitkit.util import atomic_write


def cache_dir() -> Path:
    """Where vitkit keeps what it measured about this machine: $VITKIT_CACHE, else $XDG_CACHE_HOME/vitkit, else
    ~/.cache/vitkit."""
    if os.environ.get("VITKIT_CACHE"):
        return Path(os.environ["VITKIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitkit"


def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "cpu family", "model", ...); {} where there is
    none."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():  # the end of the first processor's block
                break
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (else the platform's processor name)."""
    return cpu_info().get("model name") or platform.processor() or platform.machine()


ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
"""Environment variables that cap the instruction sets of oneDNN, MKL and torch's own kernels."""

KEY_FEATURES = ("amx_bf16", "avx512_bf16", "avx512_fp16", "avx512_f", "avx2")
"""The instruction sets (as `torch.cpu.get_capabilities` names them) that set the speed of the products probed."""


def cpu_numbers() -> str:
    """The CPU's family and model numbers, as /proc/cpuinfo gives them ("family 6 model 207"), else ""."""
    info = cpu_info()
    return f"family {info['cpu family']} model {info['model']}" if "cpu family" in info and "model" in info else ""


def isa_caps() -> str:
    """The caps on instruction sets set in the environment (`ISA_CAPS`), e.g. "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16",
    else ""."""
    return " ".join(f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name))


def cpu_signature() -> str:
    """What sets a CPU's speed besides its model name: the family and model numbers, the instruction sets among
    `KEY_FEATURES` it has, and any cap on them set in the environment (`isa_caps`). The name alone can mislead. A
    hypervisor may report "Intel(R) Xeon(R) Processor" both for a Xeon with AMX and for one whose AMX it hides, where
    bf16 products run 6-7x and 0.6-0.8x fp32's speed."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    try:
        present = capabilities() if capabilities is not None else {}
    except RuntimeError:  # a build or platform that cannot read the CPU's features
        present = {}
    features = " ".join(name for name in KEY_FEATURES if present.get(name))
    return " | ".join(part for part in (cpu_numbers(), features, isa_caps()) if part)


def probe_key() -> str:
    """What a probe's figures hold for: the CPU (`cpu_model`, `cpu_signature`), torch's version and the threads it
    runs on. A cache shared between machines (a home folder on several kinds of nodes, a disk moved to another
    instance type) or a run under an instruction-set cap reads only the figures measured for its own kind."""
    return f"{cpu_model()} | {cpu_signature()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


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


def isolated(call: Callable[[], dict[str, float]]) -> dict[str, float]:
    """`call()` in a thread of its own, on the caller's thread count: the caller's thread-local state (autocast, grad
    mode, saved-tensor hooks, dispatch and device modes such as a cost trace's) does not reach the timings, which a
    probe may be asked for from inside any of them."""
    threads, result = torch.get_num_threads(), {}

    def run() -> None:
        torch.set_num_threads(threads)
        try:
            result["figures"] = call()
        except BaseException as error:  # raised again in the caller's thread
            result["error"] = error

    worker = threading.Thread(target=run, name="vitkit-probe")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["figures"]


def measured(
    file: str, names: tuple[str, ...], measure: Callable[[], dict[str, float]], what: str = "", isolate: bool = True
) -> dict[str, float]:
    """This machine's figures `names` of one probe: read from `cache_dir() / file` when measured before under
    `probe_key()` (followed by `what`, where the figures hold for one thing measured, such as a model's step), else
    `measure()`d and written there beside other machines' (a read-only cache: measured again next time). `isolate`:
    measured in a thread of its own (`isolated`), as the products' probes are; False for a model's own step, which
    runs in the caller's thread as the caller set it up, as before it was cached."""
    path, key = cache_dir() / file, " | ".join(part for part in (probe_key(), what) if part)
    try:
        figures = json.loads(path.read_text())[key]
        if set(figures) == set(names) and all(isinstance(figures[name], (int, float)) for name in names):
            return figures
    except (OSError, ValueError, KeyError, TypeError):
        pass
    figures = isolated(measure) if isolate else measure()
    try:
        known = json.loads(path.read_text()) if path.is_file() else {}
        known = known if isinstance(known, dict) else {}
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({**known, key: figures}, indent=1)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    except (OSError, ValueError):
        pass
    return figures


def config_digest(config: object) -> str:
    """A short digest of a model's config (every field it was built of, as its repr gives them): what a cached
    timing of that model is keyed by, beside `probe_key` (`measured`'s `what`)."""
    return hashlib.sha256(repr(config).encode()).hexdigest()[:16]


def best_time(call: Callable[[], object], repeats: int = 3) -> float:
    """The best of `repeats` timings (s) of `call`, after a first call that sets its kernels up."""
    call()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


ATTENTION_PROBE = (8, 6, 197, 64)  # (B, h, N, d): ViT-S/16's self-attention on 8 images at 224 px
ATTENTION_FILE = "attention_bf16.json"  # `cpu_bf16_attention`'s figures per machine, in `cache_dir()`


@dataclass(frozen=True)
class AttentionTimes:
    """Seconds of one bf16 attention call of ATTENTION_PROBE's shape on each path: torch's fused kernel and the
    explicit product, without a gradient and with one (forward and backward)."""

    fused: float
    explicit: float
    fused_grad: float
    explicit_grad: float

    def explicit_faster(self, grad: bool) -> bool:
        """Whether the explicit product beat the fused kernel, with a gradient or without."""
        return self.explicit_grad < self.fused_grad if grad else self.explicit < self.fused

    def describe(self) -> str:
        """ "the explicit product without a gradient (2.7 ms against the fused kernel's 5.5); the explicit product
        with a gradient (9.6 ms against 25.4)" """
        parts = []
        for grad, explicit, fused in ((False, self.explicit, self.fused), (True, self.explicit_grad, self.fused_grad)):
            if self.explicit_faster(grad):
                won, time, other, lost = "the explicit product", explicit, "the fused kernel's", fused
            else:
                won, time, other, lost = "the fused kernel", fused, "the explicit product's", explicit
            when = "with" if grad else "without"
            parts.append(f"{won} {when} a gradient ({time * 1e3:.1f} ms against {other} {lost * 1e3:.1f})")
        return "; ".join(parts)


def _time_attention() -> dict[str, float]:
    from vitkit.kernels.attention import explicit_attention  # it asks the policy, which asks this module

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(ATTENTION_PROBE, generator=generator, dtype=torch.bfloat16) for _ in range(3))
    scale = ATTENTION_PROBE[-1] ** -0.5
    times = {}
    with torch.no_grad():
        times["fused"] = best_time(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale))
        times["explicit"] = best_time(lambda: explicit_attention(q, k, v, None, scale))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        times["fused_grad"] = best_time(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale).sum().backward())
        times["explicit_grad"] = best_time(lambda: explicit_attention(q, k, v, None, scale).sum().backward())
    return times


@functools.cache
def cpu_bf16_attention() -> AttentionTimes:
    """This CPU's `AttentionTimes` (about a quarter of a second to measure, once per machine). On the CPUs measured:
    with AVX512-BF16 and no AMX the explicit product wins both ways (1.7x and 2.6x on a Zen 4); with AMX tiles the
    fused kernel wins without a gradient; where bf16 is emulated the fused kernel wins."""
    names = tuple(field.name for field in fields(AttentionTimes))
    return AttentionTimes(**measured(ATTENTION_FILE, names, _time_attention))


def known_cpu_bf16_attention() -> AttentionTimes | None:
    """`cpu_bf16_attention` when this process has it already, else None: what a traced call (torch.compile,
    torch.export) may ask without timing anything inside the trace."""
    return cpu_bf16_attention() if cpu_bf16_attention.cache_info().currsize else None
