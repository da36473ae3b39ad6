"""Performance: inference optimisation, benchmarks and export."""

from vitkit.perf.export import ExportReport, export_model
from vitkit.perf.optimize import OptimizedModel, PackedLinear, optimize, packed_linear_supported

__all__ = ["ExportReport", "OptimizedModel", "PackedLinear", "export_model", "optimize", "packed_linear_supported"]
