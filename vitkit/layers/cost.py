"""The operators a layer states next to its `forward`: the vocabulary and combinators of every `cost()`.

A layer's `cost(name, x, ctx)` takes the symbolic input `x` (a `Value`: shape and storage) and lists its operators
in forward order, each with its input and output values, its MACs and FLOPs (the formula in a one-line comment
beside it) and the values it keeps for backward. Leaf operators (linear, conv, attention, norms, sampling) are
written by hand with the functions below; a composite layer composes its children's lists with `Ops`, `cost_of`,
`sequence` and `residual`, so that its `cost` reads like its `forward`.

Conventions (the same as torch's FlopCounterMode for matrix work, so the two can be compared exactly):
- A matmul-type operator (linear, conv, batched matmul) costs `macs` multiply-adds, that is 2 * macs matmul FLOPs;
  its bias add is one more FLOP per output element, counted as "other" FLOPs since FlopCounterMode leaves it out.
- Element-wise and reduction operators cost a fixed number of FLOPs per element, the constants below.
- Bytes are activation bytes (weights excluded) at the element size of `CostContext.dtype`.
- A row's `module` names where its gradients and weight copies belong: linear layers and activations inside a layer
  (an MLP's fc1, gelu and fc2, attention's qkv and proj) are rows of that layer, named by their role (`op`);
  convolutions, norms, dropout and stochastic depth are rows of their own module. `cost_of` applies this to torch's
  parameter-free modules and norms; a layer with parameters of its own states its rows in its `cost()`.

Lifetimes: what a cost list says about memory, worked out in one place (`vitkit.analysis.memory`):
- A value lives from the operator that writes it (`OpCost.output`, unless it is a view or in-place result, which
  shares its input's `Storage`) to its last reader.
- A value handed to a module stays referenced by the caller's expression (or the callee's argument) until that
  module returns: a read by an operator of module `a.b.c` of a value made under `a.x` keeps it alive to the last
  operator under `a.b`.
- An output marked `named` lives at least to its module's last operator (forward keeps it in a variable: q, k, v).
- `holding(op, *values)` keeps values alive up to `op` that forward holds without reading (a mask, a rolled map).
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
from torch import nn

SOFTMAX_FLOPS = 5  # per element: subtract the row max, exp, sum, divide (+ the max itself)
LAYER_NORM_FLOPS = 8  # per element: mean, subtract, square, variance sum, normalise (x2), scale, shift
GELU_FLOPS = 8  # per element: GELU counted as 8 (x * 0.5 * (1 + erf(x / sqrt 2)), or its tanh form)
RELU_FLOPS = 1  # per element: one comparison
BATCH_NORM_FLOPS = 2  # per element in eval: folded scale and shift
SIGMOID_FLOPS = 4  # per element: negate, exp, add, divide


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


def new_value(shape: tuple[int, ...], ctx: CostContext, *, stored: bool = True) -> Value:
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
    # bytes its backward allocates while it runs, where that is not the gradients of its output and main input (a
    # function with a written-out backward: its whole backward at its last operator, 0 at the others)
    backward_bytes: int | None = None

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


def linear(module: str, op: str, x: Value, layer: nn.Module, ctx: CostContext) -> OpCost:
    """`linear_op` for the linear `layer` (an nn.Linear, or any layer with its `out_features` and `bias`)."""
    return linear_op(module, op, x, layer.out_features, ctx, bias=layer.bias is not None)


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """One side of a convolution's or pooling's output: (size + 2 padding - dilation (kernel - 1) - 1) // stride + 1."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv_op(module: str, conv: nn.Conv2d, x: Value, ctx: CostContext) -> OpCost:
    """A Conv2d on x (B, C, H, W): out elements x (C / groups) x kh x kw multiply-adds (+ one add each for a bias)."""
    B, _, H, W = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    out = (B, conv.out_channels, conv_output_size(H, kh, sh, ph, dh), conv_output_size(W, kw, sw, pw, dw))
    macs = numel(out) * conv.in_channels // conv.groups * kh * kw
    return matmul_op(module, "conv", (x,), out, macs, ctx, bias=conv.bias is not None)


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


def layer_norm_op(module: str, x: Value, ctx: CostContext) -> OpCost:
    """LayerNorm over the last dim: LAYER_NORM_FLOPS per element; keeps its input (and per-row statistics)."""
    return elementwise_op(module, "layer_norm", x, LAYER_NORM_FLOPS, ctx, saves=(x,))


def relu_op(module: str, x: Value, ctx: CostContext, *, in_place: bool = False) -> OpCost:
    """ReLU: one comparison per element; backward needs its output."""
    return elementwise_op(module, "relu", x, RELU_FLOPS, ctx, in_place=in_place, saves_output=True)


def add_op(module: str, x: Value, y: Value, ctx: CostContext, *, in_place: bool = False) -> OpCost:
    """The residual add x + y (x += y `in_place`): one add per element, nothing kept for backward."""
    return elementwise_op(module, "residual_add", (x, y), 1, ctx, in_place=in_place)


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


def max_pool_op(module: str, pool: nn.MaxPool2d, x: Value, ctx: CostContext) -> OpCost:
    """A square max pool of kernel k on x (B, C, H, W): k^2 - 1 comparisons per output element."""
    B, C, H, W = x.shape
    k, s, p = pool.kernel_size, pool.stride, pool.padding
    out = (B, C, conv_output_size(H, k, s, p), conv_output_size(W, k, s, p))
    return reduce_op(module, "max_pool", x, out, (k * k - 1) * numel(out), ctx)


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


def cost_of(name: str, module: nn.Module, x: Value, ctx: CostContext, **kwargs: object) -> list[OpCost]:
    """The rows of `module` (named `name`) on x: its own `cost()`, or for torch's modules the rows their forward runs.

    A linear layer's and an activation's rows belong to the layer holding them (module: `name` without its last
    part; op: the linear layer's child name, or "gelu" / "relu"); a convolution's, norm's, pooling's and dropout's to
    themselves. Dropout and the identity add nothing in eval; a Sequential is its children in turn.
    """
    if hasattr(module, "cost"):
        return module.cost(name, x, ctx, **kwargs)
    parent, _, child = name.rpartition(".")
    if isinstance(module, nn.Identity):
        return []
    if isinstance(module, nn.Linear):
        return [linear(parent, child, x, module, ctx)]
    if isinstance(module, nn.GELU):
        return [elementwise_op(parent, "gelu", x, GELU_FLOPS, ctx, saves=(x,))]
    if isinstance(module, nn.ReLU):
        return [relu_op(parent, x, ctx, in_place=module.inplace)]
    if isinstance(module, nn.Dropout):
        return dropout_ops(name, x, module.p, module.training, ctx)
    if isinstance(module, nn.LayerNorm):
        return [layer_norm_op(name, x, ctx)]
    if isinstance(module, nn.BatchNorm2d):  # autograd keeps its input
        return [elementwise_op(name, "batch_norm", x, BATCH_NORM_FLOPS, ctx, saves=(x,))]
    if isinstance(module, nn.Conv2d):
        return [conv_op(name, module, x, ctx)]
    if isinstance(module, nn.MaxPool2d):
        return [max_pool_op(name, module, x, ctx)]
    if isinstance(module, nn.Sequential):
        return sequence(name, x, ctx, module)
    raise TypeError(f"{type(module).__name__} ({name}) states no cost: give it a cost(name, x, ctx) method")


def sequence(name: str, x: Value, ctx: CostContext, parent: nn.Module, *children: str) -> list[OpCost]:
    """The rows of `parent`'s children `children` (default: all, in registration order) applied in turn to x, as
    ``for child in children: x = child(x)``; each named `name.child`."""
    ops = Ops(x)
    for child in children or [n for n, _ in parent.named_children()]:
        ops(cost_of(f"{name}.{child}" if name else child, getattr(parent, child), ops.out, ctx))
    return ops


def residual(name: str, x: Value, ctx: CostContext, branch: list[OpCost]) -> list[OpCost]:
    """x + branch(x): the branch's rows (computed from x), then the add (module `name`)."""
    return [*branch, add_op(name, x, branch[-1].output, ctx)]
