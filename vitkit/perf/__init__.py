"""Performance: inference optimisation, benchmarks and export."""

from vitkit.perf.export import ExportReport, export_model
from vitkit.perf.optimize import OptimizedModel, optimize

__all__ = ["ExportReport", "OptimizedModel", "export_model", "optimize"]
