"""Cost reports: analytic per-operator FLOPs, parameters and activation memory, checked against measurement."""

from vitkit.analysis.profile import Report, measure_matmul_flops, profile

__all__ = ["Report", "measure_matmul_flops", "profile"]
