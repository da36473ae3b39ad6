"""Cost reports: analytic per-operator FLOPs, parameters and activation memory, checked against measurement."""

from vitkit.analysis.memory import (
    PeakMemory,
    inference_peak_bytes,
    measure_saved_bytes,
    saved_for_backward_bytes,
)
from vitkit.analysis.profile import Report, measure_matmul_flops, profile

__all__ = [
    "PeakMemory",
    "Report",
    "inference_peak_bytes",
    "measure_matmul_flops",
    "measure_saved_bytes",
    "profile",
    "saved_for_backward_bytes",
]
