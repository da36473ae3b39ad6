"""What a forward costs: its operators, each with its FLOPs, the memory it writes and what autograd keeps.

`trace` runs a module's forward on meta tensors and counts every operator by one rule (`vitkit.cost.tracer`); the
rows it writes, and those a leaf states itself, are `OpCost`s (`vitkit.cost.rows`). `vitkit.analysis` adds them up.
"""

from vitkit.cost.rows import CostContext, Device, OpCost, Storage, Value
from vitkit.cost.tracer import costed, trace, tracing

__all__ = [
    "CostContext",
    "Device",
    "OpCost",
    "Storage",
    "Value",
    "costed",
    "trace",
    "tracing",
]
