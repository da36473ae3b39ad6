"""The rows of a cost list: what one operator of a forward reads, writes, computes and keeps for backward.

`vitkit.cost.tracer` writes one `OpCost` per operator of a module's forward, in forward order; a leaf whose path or
memory the dispatcher cannot see (an attention kernel's path, a sampling path, a packed layer) states its rows itself
with the functions below, each term commented with the line it counts.

Conventions (the same as torch's FlopCounterMode for matrix work, so the two can be compared exactly):
- A matmul-type operator (linear, conv, batched matmul) costs `macs` multiply-adds, that is 2 * macs matmul FLOPs;
  its bias add is one more FLOP per output element, counted as "other" FLOPs since FlopCounterMode leaves it out.
- Element-wise and reduction operators cost a fixed number of FLOPs per element, the constants below.
- Bytes are activation bytes (weights excluded), at the element size of each tensor.
- A row's `module` names where its gradients and weight copies belong: the rows of torch's linear layers and
  activations inside a layer (an MLP's fc1, gelu and fc2, attention's qkv and proj) are rows of that layer, named by
  their role (`op`); convolutions, norms and dropout are rows of their own module; every other operator is a row
  of the module whose forward runs it.

Lifetimes: what a cost list says about memory, worked out in one place (`vitkit.analysis.memory`):
- A value lives from the operator that writes it (`OpCost.output`, unless it is a view or in-place result, which
  shares its input's `Storage`) to its last reader.
- A value handed to a module stays referenced by the caller's expression (or the callee's argument) until that
  module returns: a read by an operator of module `a.b.c` of a value made under `a.x` keeps it alive to the last
  operator under `a.b`.
- `holding(op, *values)` keeps values alive up to `op` that forward holds without reading (a mask, a rolled map);
  the trace holds each tensor to the last operator before the forward let go of it.
- The last operator's output is the result and lives to the end.
- Training keeps every value an operator lists in `saved` until its backward; a parameter's gradient appears at
  the backward of the last operator of the module that owns it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

SOFTMAX_FLOPS = 5  # per element: subtract the row max, exp, sum, divide (+ the max itself)
LAYER_NORM_FLOPS = 8  # per element: mean, subtract, square, variance sum, normalise (x2), scale, shift
GELU_FLOPS = 8  # per element: GELU counted as 8 (x * 0.5 * (1 + erf(x / sqrt 2)), or its tanh form)
RELU_FLOPS = 1  # per element: one comparison
BATCH_NORM_FLOPS = 2  # per element in eval: folded scale and shift
SIGMOID_FLOPS = 4  # per element: negate, exp, add, divide
GROUP_NORM_FLOPS = LAYER_NORM_FLOPS  # the same arithmetic per element, over groups of channels instead of rows


Device = torch.device | str  # where the costed forward runs: torch.device("cuda") or "cpu"


@dataclass(frozen=True)
class CostContext:
    """Where and in what precision the costed forward runs: the element size of activations, and the path each
    kernel would take there (`vitkit.kernels.policy`)."""

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


def new_value(shape: tuple[int, ...], ctx: CostContext, *, stored: bool = True) -> Value:
    """A freshly allocated tensor of `shape`; `stored=False` for one a fused kernel never writes out."""
    return Value(tuple(shape), Storage(numel(shape) * ctx.itemsize if stored else 0))


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
    # bytes its backward allocates while it runs, where that is not the gradients of its output and main input (a
    # function with a written-out backward: its whole backward at its last operator, 0 at the others)
    backward_bytes: int | None = None

    @property
    def in_shape(self) -> tuple[int, ...]:
        """The main input's shape (the output's for an operator that reads no tensor: a factory)."""
        return self.inputs[0].shape if self.inputs else self.output.shape

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


# --- leaf operators ----------------------------------------------------------------------------------------------


def matmul_op(
    module: str,
    op: str,
    inputs: tuple[Value, ...],
    out_shape: tuple[int, ...],
    macs: int,
    ctx: CostContext,
    *,
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
    return OpCost(module, op, inputs, new_value(out_shape, ctx, stored=stored), macs, flops, saves)


def linear_op(module: str, op: str, x: Value, out_features: int, ctx: CostContext, *, bias: bool = True) -> OpCost:
    """A linear map (..., in) -> (..., out): rows * in * out multiply-adds, + one add per output for the bias."""
    return matmul_op(module, op, (x,), (*x.shape[:-1], out_features), numel(x.shape) * out_features, ctx, bias=bias)


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """One side of a convolution's or pooling's output: (size + 2 padding - dilation (kernel - 1) - 1) // stride + 1."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def copy_op(
    module: str, op: str, x: Value, out_shape: tuple[int, ...], ctx: CostContext, *, copies: bool = True
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
    *,
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
    out = view(x, x.shape) if in_place else new_value(x.shape, ctx, stored=stored)
    return OpCost(
        module, op, inputs, out, 0, flops_per_element * numel(x.shape), (*saves, out) if saves_output else saves
    )


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


# --- combinators -------------------------------------------------------------------------------------------------


class Ops(list[OpCost]):
    """A cost list being built in forward order: `ops(row_or_rows)` appends and returns the latest output, `ops.out`
    is it (the input while the list is empty)."""

    def __init__(self, x: Value) -> None:
        super().__init__()
        self.input = x

    @property
    def out(self) -> Value:
        return self[-1].output if self else self.input

    def __call__(self, *rows: OpCost | Iterable[OpCost]) -> Value:
        for row in rows:
            if isinstance(row, OpCost):
                self.append(row)
            else:
                self.extend(row)
        return self.out
