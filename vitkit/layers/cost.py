"""The operators a layer states next to its `forward`: what each `cost()` returns.

A layer's `cost(name, x, ctx)` takes the symbolic input `x` (a `Value`: shape and storage) and lists its operators
in forward order, each with its input and output values, its MACs and FLOPs (the formula in a one-line comment
beside it) and the values it keeps for backward. That is all a layer says (besides marking an output its forward
keeps in a variable to the end): how long tensors stay alive, and so the activation memory of inference and
training, is worked out from these lists in one place, `vitkit.analysis.memory`.

Conventions (the same as torch's FlopCounterMode for matrix work, so the two can be compared exactly):
- A matmul-type operator (linear, conv, batched matmul) costs `macs` multiply-adds, that is 2 * macs matmul FLOPs;
  its bias add is one more FLOP per output element, counted as "other" FLOPs since FlopCounterMode leaves it out.
- Element-wise and reduction operators cost a fixed number of FLOPs per element, the constants below.
- Bytes are activation bytes (weights excluded) at the element size of `CostContext.dtype`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

SOFTMAX_FLOPS = 5  # per element: subtract the row max, exp, sum, divide (+ the max itself)
LAYER_NORM_FLOPS = 8  # per element: mean, subtract, square, variance sum, normalise (x2), scale, shift
GELU_FLOPS = 8  # per element: erf-based GELU counted as 8 (x * 0.5 * (1 + erf(x / sqrt 2)))
RELU_FLOPS = 1  # per element: one comparison
BATCH_NORM_FLOPS = 2  # per element in eval: folded scale and shift


Device = torch.device | str  # where the costed forward runs: torch.device("cuda") or "cpu"


@dataclass(frozen=True)
class CostContext:
    """Where and in what precision the costed forward runs: the element size of activations, and what the
    attention dispatch (`Attention.path`) picks for each call."""

    dtype: torch.dtype = torch.float32  # activation dtype (bfloat16 under autocast or after optimize("bf16"))
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


class Storage:
    """One activation buffer; views and in-place results share their input's `Storage`."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


@dataclass(frozen=True, eq=False)
class Value:
    """A tensor in a cost list: its shape and the storage it lives in (compared by identity)."""

    shape: tuple[int, ...]
    storage: Storage

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def new_value(shape: tuple[int, ...], ctx: CostContext, stored: bool = True) -> Value:
    """A freshly allocated tensor of `shape`; `stored=False` for one a fused kernel never writes out."""
    return Value(tuple(shape), Storage(numel(shape) * ctx.itemsize if stored else 0))


def given(shape: tuple[int, ...]) -> Value:
    """A tensor that exists before the costed code runs (the input image, a weight, a table): counted in no
    memory figure."""
    return Value(tuple(shape), Storage(0))


def view(x: Value, shape: tuple[int, ...]) -> Value:
    """`x` seen with another shape (a view, or an in-place result): no new storage."""
    return Value(tuple(shape), x.storage)


@dataclass(frozen=True)
class OpCost:
    module: str  # qualified module name, e.g. "blocks.0.attn"
    op: str  # operator, e.g. "qkv", "q@k^T", "softmax", "attn@v", "proj", "fc1", "gelu", "fc2"
    inputs: tuple[Value, ...]  # what it reads, main input first
    output: Value  # what it returns (an input's storage again for a view or an in-place update)
    macs: int  # multiply-adds of matrix work (0 for element-wise operators)
    flops: int  # all FLOPs: 2 * macs, plus bias adds or the per-element constant x elements
    saved: tuple[Value, ...] = ()  # what autograd keeps from this operator for the backward pass
    named: bool = False  # forward binds the output to a name it keeps until it returns (q, k, v in attention)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.inputs[0].shape

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.output.shape

    @property
    def out_bytes(self) -> int:
        """Bytes this operator writes to new storage (0 for a view, an in-place update, or a fused intermediate)."""
        if any(self.output.storage is x.storage for x in self.inputs):
            return 0
        return self.output.nbytes

    @property
    def matmul_flops(self) -> int:
        return 2 * self.macs

    @property
    def other_flops(self) -> int:
        return self.flops - 2 * self.macs


def matmul_op(
    module: str,
    op: str,
    inputs: tuple[Value, ...],
    out_shape: tuple[int, ...],
    macs: int,
    ctx: CostContext,
    bias: bool = False,
    stored: bool = True,
    saves: tuple[Value, ...] | None = None,
) -> OpCost:
    """A matrix operator: 2 FLOPs per multiply-add (+1 per output element with a bias).

    `stored=False` for an intermediate a fused kernel never writes out; `saves`: what autograd keeps (default:
    the operands, or nothing for an intermediate of a fused kernel).
    """
    flops = 2 * macs + (numel(out_shape) if bias else 0)
    if saves is None:
        saves = inputs if stored else ()
    return OpCost(module, op, inputs, new_value(out_shape, ctx, stored), macs, flops, saves)


def linear_op(module: str, op: str, x: Value, out_features: int, bias: bool, ctx: CostContext) -> OpCost:
    """nn.Linear (..., in) -> (..., out): rows * in * out multiply-adds, + one add per output for the bias."""
    out_shape = (*x.shape[:-1], out_features)
    return matmul_op(module, op, (x,), out_shape, numel(x.shape) * out_features, ctx, bias)


def copy_op(
    module: str, op: str, x: Value, out_shape: tuple[int, ...], ctx: CostContext, copies: bool = True
) -> OpCost:
    """A data-movement operator (roll, pad, permute then reshape): no FLOPs; a view when `copies` is False."""
    out = new_value(out_shape, ctx) if copies else view(x, out_shape)
    return OpCost(module, op, (x,), out, 0, 0)


def elementwise_op(
    module: str,
    op: str,
    inputs: Value | tuple[Value, ...],
    flops_per_element: int,
    ctx: CostContext,
    in_place: bool = False,
    saves: tuple[Value, ...] = (),
    stored: bool = True,
    saves_output: bool = False,
) -> OpCost:
    """An element-wise or row-wise operator producing the main input's shape.

    Args:
        inputs: the main input, or a tuple of it and the other operands (a residual, a bias).
        in_place: updates the main input's storage instead of writing a new tensor.
        saves: the values autograd keeps for backward (an add keeps none, GELU its input).
        stored: False for an intermediate a fused kernel never writes out.
        saves_output: autograd keeps the output too (softmax's backward needs it).
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    x = inputs[0]
    out = view(x, x.shape) if in_place else new_value(x.shape, ctx, stored)
    return OpCost(
        module, op, inputs, out, 0, flops_per_element * numel(x.shape), (*saves, out) if saves_output else saves
    )


def layer_norm_op(module: str, x: Value, ctx: CostContext) -> OpCost:
    """LayerNorm over the last dim: LAYER_NORM_FLOPS per element; keeps its input (and per-row statistics)."""
    return elementwise_op(module, "layer_norm", x, LAYER_NORM_FLOPS, ctx, saves=(x,))


def holding(op: OpCost, *held: Value) -> OpCost:
    """`op` with `held` among its inputs: tensors that forward keeps in a variable (or an argument) up to this
    operator without reading them, so the memory accounting keeps them alive until it runs."""
    return dataclasses.replace(op, inputs=(*op.inputs, *held))


def dropout_ops(module: str, x: Value, p: float, training: bool, ctx: CostContext) -> list[OpCost]:
    """Dropout at rate `p` on x in a `training` forward; nothing in eval or at p = 0, where torch returns x itself.

    On CPU torch draws a mask in x's dtype (bernoulli, scaled by 1 / (1 - p)) and multiplies x by it; on CUDA one
    kernel writes the output and a one-byte mask. Either way autograd keeps the mask for the backward pass.
    """
    if not training or p == 0:
        return []
    itemsize = 1 if ctx.device.type == "cuda" else ctx.itemsize
    mask = Value(x.shape, Storage(numel(x.shape) * itemsize))
    draw = OpCost(module, "dropout_mask", (x,), mask, 0, 2 * numel(x.shape))  # bernoulli and scale: 2 per element
    return [draw, elementwise_op(module, "dropout", (x, mask), 1, ctx, saves=(mask,))]  # x * mask: 1 per element


def drop_path_ops(module: str, x: Value, p: float, training: bool, ctx: CostContext) -> list[OpCost]:
    """Stochastic depth (`drop_path`) at rate `p` on x (B, ...) in a `training` forward: x * mask / (1 - p) with one
    draw per sample, two new tensors of x's shape; autograd keeps only the (B, 1, ...) mask."""
    if not training or p == 0:
        return []
    mask = new_value((x.shape[0],) + (1,) * (len(x.shape) - 1), ctx)
    draw = OpCost(module, "drop_path_mask", (x,), mask, 0, x.shape[0])  # one bernoulli draw per sample
    kept = elementwise_op(module, "drop_path", (x, mask), 1, ctx, saves=(mask,))  # x * mask: 1 per element
    return [draw, kept, elementwise_op(module, "drop_path_scale", kept.output, 1, ctx)]  # / (1 - p)


def reduce_op(module: str, op: str, x: Value, out_shape: tuple[int, ...], flops: int, ctx: CostContext) -> OpCost:
    """A reduction or pooling (mean, average or max pool) to `out_shape`, `flops` as counted beside the call."""
    return OpCost(module, op, (x,), new_value(out_shape, ctx), 0, flops)
