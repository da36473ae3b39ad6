"""The analytic cost of one operator: what each layer's `cost()` returns, next to its `forward`.

Conventions (the same as torch's FlopCounterMode for matrix work, so the two can be compared exactly):
- A matmul-type operator (linear, conv, batched matmul) costs `macs` multiply-adds, that is 2 * macs matmul FLOPs;
  its bias add is one more FLOP per output element, counted as "other" FLOPs since FlopCounterMode leaves it out.
- Element-wise and reduction operators cost a fixed number of FLOPs per element, the constants below.
- Bytes are activation bytes (weights excluded) at `dtype_bytes` per element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SOFTMAX_FLOPS = 5  # per element: subtract the row max, exp, sum, divide (+ the max itself)
LAYER_NORM_FLOPS = 8  # per element: mean, subtract, square, variance sum, normalise (x2), scale, shift
GELU_FLOPS = 8  # per element: erf-based GELU counted as 8 (x * 0.5 * (1 + erf(x / sqrt 2)))
RELU_FLOPS = 1  # per element: one comparison
BATCH_NORM_FLOPS = 2  # per element in eval: folded scale and shift


@dataclass(frozen=True)
class OpCost:
    module: str  # qualified module name, e.g. "blocks.0.attn"
    op: str  # operator, e.g. "qkv", "q@k^T", "softmax", "attn@v", "proj", "fc1", "gelu", "fc2"
    in_shape: tuple[int, ...]  # shape of the main input
    out_shape: tuple[int, ...]  # shape of the output
    macs: int  # multiply-adds of matrix work (0 for element-wise operators)
    flops: int  # all FLOPs: 2 * macs, plus bias adds or the per-element constant x elements
    out_bytes: int  # bytes this operator materialises (0 when fused into a kernel that never stores it)
    live_bytes: int  # activation bytes alive while it runs: its output plus `held` (inputs, tensors kept by callers)

    @property
    def matmul_flops(self) -> int:
        return 2 * self.macs

    @property
    def other_flops(self) -> int:
        return self.flops - 2 * self.macs


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def matmul_op(
    module: str,
    op: str,
    in_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    macs: int,
    held: int,
    dtype_bytes: int,
    bias: bool = False,
    materialised: bool = True,
) -> OpCost:
    """A matrix operator: 2 FLOPs per multiply-add (+1 per output element with a bias).

    `held` is the activation bytes alive besides the output (its inputs and whatever the callers keep).
    """
    out_bytes = numel(out_shape) * dtype_bytes if materialised else 0
    flops = 2 * macs + (numel(out_shape) if bias else 0)
    return OpCost(module, op, in_shape, out_shape, macs, flops, out_bytes, held + out_bytes)


def copy_op(
    module: str,
    op: str,
    in_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    held: int,
    dtype_bytes: int,
    materialised: bool = True,
) -> OpCost:
    """A data-movement operator (roll, pad, permute copy): no FLOPs, its output materialised unless it is a view."""
    out_bytes = numel(out_shape) * dtype_bytes if materialised else 0
    return OpCost(module, op, in_shape, out_shape, 0, 0, out_bytes, held + out_bytes)


def elementwise_op(
    module: str,
    op: str,
    shape: tuple[int, ...],
    flops_per_element: int,
    held: int,
    dtype_bytes: int,
    materialised: bool = True,
) -> OpCost:
    """An element-wise or row-wise operator on `shape` producing the same shape; `held` as for `matmul_op`."""
    out_bytes = numel(shape) * dtype_bytes if materialised else 0
    return OpCost(module, op, shape, shape, 0, flops_per_element * numel(shape), out_bytes, held + out_bytes)


def linear_op(
    module: str, op: str, in_shape: tuple[int, ...], out_features: int, bias: bool, held: int, dtype_bytes: int
) -> OpCost:
    """nn.Linear (..., in) -> (..., out): rows * in * out multiply-adds, + one add per output for the bias.

    The input is counted as alive on top of `held`.
    """
    out_shape = (*in_shape[:-1], out_features)
    held += numel(in_shape) * dtype_bytes
    return matmul_op(module, op, in_shape, out_shape, numel(in_shape) * out_features, held, dtype_bytes, bias)


def layer_norm_op(module: str, shape: tuple[int, ...], held: int, dtype_bytes: int) -> OpCost:
    """LayerNorm over the last dim: LAYER_NORM_FLOPS per element; the input is alive on top of `held`."""
    return elementwise_op(module, "layer_norm", shape, LAYER_NORM_FLOPS, held + numel(shape) * dtype_bytes, dtype_bytes)
