"""Cost reports: analytic per-operator FLOPs, parameters and activation memory, checked against measurement; the
memory preflight that refuses a run that would not fit."""

from vitkit.analysis.available import available_memory
from vitkit.analysis.estimate import MemoryEstimate, MemoryEstimator, estimate_memory
from vitkit.analysis.memory import (
    PeakMemory,
    Sharding,
    StepPeak,
    inference_peak_bytes,
    measure_saved_bytes,
    saved_for_backward_bytes,
    training_peak,
    training_peak_bytes,
)
from vitkit.analysis.precision import PRECISIONS, precision_dtype
from vitkit.analysis.preflight import MemoryWarning, NotEnoughMemory, SettingNames, check_memory
from vitkit.analysis.profile import Report, measure_matmul_flops, profile

__all__ = [
    "PRECISIONS",
    "MemoryEstimate",
    "MemoryEstimator",
    "MemoryWarning",
    "NotEnoughMemory",
    "PeakMemory",
    "Report",
    "SettingNames",
    "Sharding",
    "StepPeak",
    "available_memory",
    "check_memory",
    "estimate_memory",
    "inference_peak_bytes",
    "measure_matmul_flops",
    "measure_saved_bytes",
    "precision_dtype",
    "profile",
    "saved_for_backward_bytes",
    "training_peak",
    "training_peak_bytes",
]
