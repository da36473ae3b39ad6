"""Cost reports: analytic per-operator FLOPs, parameters and activation memory, checked against measurement."""

from vitkit.analysis.memory import PeakMemory
from vitkit.analysis.profile import Report, measure_matmul_flops, profile

__all__ = ["PeakMemory", "Report", "measure_matmul_flops", "profile"]
