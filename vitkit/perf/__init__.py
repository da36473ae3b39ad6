"""Performance: inference optimisation and benchmarks."""

from vitkit.perf.optimize import OptimizedModel, optimize

__all__ = ["OptimizedModel", "optimize"]
