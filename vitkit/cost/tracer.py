"""Costs from the forward: a module's forward run on meta tensors, every operator counted by one rule.

`trace(module, *inputs, ctx=...)` runs ``module(*inputs)`` with its parameters, buffers and inputs replaced by meta
tensors (floating ones in the context's dtype), under a dispatch mode that writes one `OpCost` per operator in
forward order, named after the module whose forward runs it. Nothing is allocated and no number is computed, so a
model of any size costs a few thousand dispatches.

- A leaf states its own rows, and what runs inside it is not counted again:
  - a kernel declared with `costed` (an attention or sampling path): the dispatcher would see the path of the meta
    device, not the one the target device and dtype take, nor the memory a fused kernel keeps;
  - a module with a ``cost_rows(name, ctx, *args, **kwargs)`` method, as a `costed` kernel's (a packed layer);
  - torch's layers, each by its rule in `MODULE_RULES` (a linear layer's row belongs to the layer holding it),
    where the dispatcher's count would name or attribute them otherwise.
- Every other operator becomes a row by one rule (`operator_flops`): matrix products their multiply-adds (torch's
  FlopCounterMode formulas) plus one FLOP per output element for a bias, element-wise operators `PER_ELEMENT`
  FLOPs per output element (1 unless listed), reductions one per input element, data movement none. Views and
  aliases write nothing and make no row; an in-place operator's output is its input's storage.
- Memory: each tensor's bytes are its storage's, and it is held (`holding`) to the last row before the forward
  let go of it (seen by a finaliser on every tensor the trace makes). What autograd saves for backward is seen
  through saved-tensor hooks (the forward runs with gradients on, and the hooks keep nothing) and listed as the
  `saved` of the operator that saved it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from vitkit.cost.rows import (
    BATCH_NORM_FLOPS,
    GELU_FLOPS,
    GROUP_NORM_FLOPS,
    LAYER_NORM_FLOPS,
    RELU_FLOPS,
    SIGMOID_FLOPS,
    SOFTMAX_FLOPS,
    CostContext,
    OpCost,
    Storage,
    Value,
    dropout_ops,
    elementwise_op,
    linear_op,
    matmul_op,
)

aten = torch.ops.aten

PER_ELEMENT = {
    "softmax": SOFTMAX_FLOPS,
    "_softmax": SOFTMAX_FLOPS,
    "_log_softmax": SOFTMAX_FLOPS,
    "sigmoid": SIGMOID_FLOPS,
    "gelu": GELU_FLOPS,
    "native_layer_norm": LAYER_NORM_FLOPS,
    "native_group_norm": GROUP_NORM_FLOPS,
    "_native_batch_norm_legit_no_training": BATCH_NORM_FLOPS,
    "_native_batch_norm_legit": BATCH_NORM_FLOPS,
    "native_batch_norm": BATCH_NORM_FLOPS,
    "addcmul": 2,  # a multiply and an add
    "addcdiv": 2,
    "lerp": 2,
    "upsample_bilinear2d": 7,  # 4 products, 3 sums per output element
    "upsample_bicubic2d": 31,  # 16 products, 15 sums
    "_upsample_bicubic2d_aa": 31,  # counted as without antialiasing
    "grid_sampler_2d": 8,  # per sampled channel: 4 multiply-adds, one per pixel around the point
}
"""FLOPs per output element of the operators that take more (or other) than one; every other element-wise
operator (torch's `pointwise` tag) takes one."""

PER_INPUT_ELEMENT = {"cumsum", "cumprod", "topk", "sort", "argsort", "max", "min", "logsumexp", "avg_pool2d"}
"""Operators that take one FLOP per input element besides torch's `reduction`-tagged ones (a sum, a mean, a max)."""

DATA_MOVEMENT = {
    "clone", "_to_copy", "copy", "contiguous", "cat", "stack", "index_select", "gather", "index", "embedding", "roll",
    "constant_pad_nd", "repeat", "flip", "fill", "zero", "masked_scatter", "index_put", "scatter", "slice_scatter",
    "select_scatter", "lift_fresh_copy", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "arange",
    "scalar_tensor", "upsample_nearest2d", "_unsafe_index", "lift_fresh",
    "_unsafe_view", "pixel_shuffle",
}  # fmt: skip
"""Operators that move or make data and compute nothing (clone is tagged `pointwise` by torch)."""

_BIASED = {aten.addmm: 0, aten.convolution: 2, aten._convolution: 2}  # the bias argument's position


def operator_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int] | None:
    """(multiply-adds, FLOPs) of one call of the aten operator `func`, by the rule of the module docstring; None for
    an operator the rule does not know (a trace counts it as nothing; tests/analysis/test_elementwise_flops.py holds
    that no registered model runs one)."""
    packet = func._overloadpacket
    if packet in flop_registry:
        macs = flop_registry[packet](*args, **kwargs, out_val=out) // 2
        bias = 0
        if packet in _BIASED and len(args) > _BIASED[packet] and args[_BIASED[packet]] is not None:
            bias = out.numel()
        elif packet is aten.baddbmm and kwargs.get("beta", 1) != 0:
            bias = out.numel()
        return macs, 2 * macs + bias
    if func.is_view:
        return 0, 0
    name = packet.__name__.removesuffix("_")
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
    if name in DATA_MOVEMENT or not outputs:
        return 0, 0
    if name == "clamp":  # a comparison per bound given
        return 0, sum(bound is not None for bound in (*args[1:3], kwargs.get("min"), kwargs.get("max"))) * out.numel()
    if name in ("_embedding_bag", "_embedding_bag_forward_only"):  # a multiply-add per gathered row and channel
        return 0, 2 * args[1].numel() * args[0].shape[-1]
    if name == "max_pool2d_with_indices":  # k^2 - 1 comparisons per output element
        taps = args[1] ** 2 if isinstance(args[1], int) else args[1][0] * args[1][-1]
        return 0, (taps - 1) * outputs[0].numel()
    if name in PER_ELEMENT:
        return 0, PER_ELEMENT[name] * outputs[0].numel()
    if torch.Tag.reduction in func.tags or name in PER_INPUT_ELEMENT:
        return 0, inputs[0].numel() if inputs else 0
    if torch.Tag.pointwise in func.tags or name == "bernoulli":
        return 0, outputs[0].numel() if outputs else 0
    return None


# --- torch's layers ------------------------------------------------------------------------------------------------


def _parent(name: str) -> tuple[str, str]:
    parent, _, child = name.rpartition(".")
    return parent, child


def linear_row(name: str) -> tuple[str, str]:
    """(module, op) of the row of the linear layer `name`: a row of the layer holding it, named by its role (an
    MLP's fc1); of its own, named by its role at the model's top (a head) or "linear" in a list."""
    parent, child = _parent(name)
    return (name, child) if not parent else (name, "linear") if child.isdigit() else (parent, child)


def _linear(name: str, m: nn.Linear, x: Value, out: Tensor, ctx: CostContext) -> list[OpCost]:
    """rows x in x out MACs (+ the bias)."""
    return [linear_op(*linear_row(name), x, m.out_features, ctx, bias=m.bias is not None)]


def _conv(name: str, m: nn.Conv2d, x: Value, out: Tensor, ctx: CostContext) -> list[OpCost]:
    """Output elements x (C_in / groups) x kh x kw MACs (+ the bias)."""
    macs = out.numel() * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
    return [matmul_op(name, "conv", (x,), tuple(out.shape), macs, ctx, bias=m.bias is not None)]


def _gelu(name: str, m: nn.Module, x: Value, out: Tensor, ctx: CostContext) -> list[OpCost]:
    return [elementwise_op(_parent(name)[0], "gelu", x, GELU_FLOPS, ctx, saves=(x,))]  # a row of its holder


def _relu(name: str, m: nn.ReLU, x: Value, out: Tensor, ctx: CostContext) -> list[OpCost]:  # backward: its output
    return [elementwise_op(_parent(name)[0], "relu", x, RELU_FLOPS, ctx, in_place=m.inplace, saves_output=True)]


def _dropout(name: str, m: nn.Dropout, x: Value, out: Tensor, ctx: CostContext) -> list[OpCost]:
    return dropout_ops(name, x, m.p, m.training, ctx)


def _norm(op: str, flops: int) -> Callable[..., list[OpCost]]:
    """A norm: `flops` per element, autograd keeps its input (and per-row statistics, not counted)."""

    def rule(name: str, m: nn.Module, x: Value, out: Tensor, ctx: CostContext) -> list[OpCost]:
        return [elementwise_op(name, op, x, flops, ctx, saves=(x,))]

    return rule


MODULE_RULES: dict[type, Callable[..., list[OpCost]]] = {
    nn.Linear: _linear,
    nn.Conv2d: _conv,
    nn.GELU: _gelu,
    nn.ReLU: _relu,
    nn.Dropout: _dropout,
    nn.LayerNorm: _norm("layer_norm", LAYER_NORM_FLOPS),
    nn.GroupNorm: _norm("group_norm", GROUP_NORM_FLOPS),
    nn.BatchNorm2d: _norm("batch_norm", BATCH_NORM_FLOPS),
    nn.Identity: lambda name, m, x, out, ctx: [],
}
"""torch's layers and their rows: rule(name, module, x, output, ctx), x the input's `Value`."""


def _rule(module: nn.Module) -> Callable[..., list[OpCost]] | None:
    """The rule of a torch layer whose forward is torch's (a subclass with a forward of its own is traced)."""
    kinds = (kind for kind in MODULE_RULES if isinstance(module, kind) and type(module).forward is kind.forward)
    return next((MODULE_RULES[kind] for kind in kinds), None)


# --- kernels -------------------------------------------------------------------------------------------------------

_TRACES: list[_Trace] = []  # the trace running (one at a time, in one thread)


def _active() -> _Trace | None:
    """The trace running in this thread, if any."""
    return _TRACES[-1] if _TRACES and _TRACES[-1].thread == threading.get_ident() else None


def tracing() -> bool:
    """Whether a forward runs under `trace` in this thread now (gradient checkpointing stands aside then)."""
    return _active() is not None


def costed(cost: Callable[..., list[OpCost]]) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Declare a kernel's rows: ``@costed(rows)`` on ``kernel(*args, **kwargs) -> Tensor``, where ``rows(name, ctx,
    *args, **kwargs)`` takes the same arguments with each tensor as its `Value` and lists the kernel's operators on
    `ctx`'s device and dtype. Outside a trace the kernel runs; inside one its rows are taken instead and its output
    is a tensor of the last row's shape."""

    def declare(kernel: Callable[..., Tensor]) -> Callable[..., Tensor]:
        @functools.wraps(kernel)
        def run(*args: Any, **kwargs: Any) -> Tensor:
            tracer = _active()
            return kernel(*args, **kwargs) if tracer is None else tracer.leaf(cost, args, kwargs)

        return run

    return declare


class _Output(torch.autograd.Function):
    """A leaf's output in the trace: an empty tensor with an autograd history when an input requires grad."""

    @staticmethod
    def forward(ctx: Any, shape: tuple[int, ...], dtype: torch.dtype, *inputs: Tensor) -> Tensor:
        ctx.inputs = len(inputs)
        return torch.empty(shape, dtype=dtype, device="meta")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, ...]:
        return (None,) * (2 + ctx.inputs)


def _key(t: Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


class _Trace(TorchDispatchMode):
    """The counting mode of one `trace`."""

    def __init__(self, ctx: CostContext, names: dict[int, str]) -> None:
        super().__init__()
        self.ctx, self.names = ctx, names
        self.thread = threading.get_ident()
        self.rows: list[OpCost] = []
        self.held: dict[int, list[Value]] = defaultdict(list)  # row index -> storages freed after it
        self.saved: dict[int, list[Value]] = defaultdict(list)  # row index -> storages autograd saves there
        self.storages: dict[StorageWeakRef, Storage] = {}  # the storages of tensors the trace made, while alive
        self.refs: dict[StorageWeakRef, int] = {}  # ... and how many tensors of the trace use each
        self.stack: list[str] = []  # the modules whose forward runs, innermost last
        self.quiet = 0  # > 0 inside a leaf
        self.pending: list[Storage] = []  # saved by autograd since the last operator
        self.last: weakref.ref | None = None  # the last counted operator's output
        self.done = False

    # which tensor is which
    def value(self, t: Tensor) -> Value:
        """`t` as a `Value`: its storage if the trace made it, else a given one (a weight, the input)."""
        return Value(tuple(t.shape), self.storages.get(_key(t)) or Storage(0))

    def track(self, t: Tensor, storage: Storage) -> None:
        """Count `t` among the tensors using `storage` until Python frees it."""
        key = _key(t)
        if key not in self.storages:
            self.storages[key], self.refs[key] = storage, 0
        self.refs[key] += 1
        weakref.finalize(t, self.release, key)

    def release(self, key: StorageWeakRef) -> None:
        if self.done or key not in self.refs:
            return
        self.refs[key] -= 1
        if self.refs[key] == 0:  # freed: alive up to the last row written
            storage = self.storages.pop(key)
            del self.refs[key]
            if self.rows:
                self.held[len(self.rows) - 1].append(Value((), storage))

    @property
    def module(self) -> str:
        return self.stack[-1] if self.stack else ""

    # what autograd saves
    def pack(self, t: Tensor) -> None:
        if not (self.quiet or self.done) and isinstance(t, Tensor):
            storage = self.storages.get(_key(t))
            if storage is not None:
                self.pending.append(storage)

    def settle(self, inputs: list[Tensor]) -> list[Storage]:
        """Attribute what autograd saved since the last operator: an output of that operator that its backward
        keeps is its; the inputs of the operator about to run (`inputs`) are that one's (returned); the rest the last
        one's."""
        pending, self.pending = self.pending, []
        if not self.rows:
            return []
        last = len(self.rows) - 1
        out = self.last() if self.last is not None else None
        self.last = None  # read once: after it, what autograd saves belongs to the operators that follow
        keeps_output = out is not None and out.grad_fn is not None and hasattr(out.grad_fn, "_raw_saved_result")
        reads = {id(self.storages.get(_key(t))) for t in inputs}
        incoming = []
        for storage in pending:
            if keeps_output and storage is self.rows[last].output.storage:
                self.saved[last].append(Value((), storage))
                keeps_output = False
            elif id(storage) in reads:
                incoming.append(storage)
            else:
                self.saved[last].append(Value((), storage))
        return incoming

    # operators
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.quiet or self.done:
            return func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        incoming = self.settle(inputs)
        out = func(*args, **kwargs)
        first = len(self.rows)
        self.count(func, args, kwargs, inputs, out)
        target = first if len(self.rows) > first else len(self.rows) - 1
        if target >= 0:
            self.saved[target] += [Value((), s) for s in incoming]
        return out

    def count(self, func: Any, args: tuple, kwargs: dict, inputs: list[Tensor], out: Any) -> None:
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        read = {_key(t) for t in inputs}
        written = [
            a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write
        ]  # arguments written in place (an in-place operator's self, an out=)
        values = tuple(self.value(t) for t in inputs)
        name = func._overloadpacket.__name__
        costs = operator_flops(func, args, kwargs, out) or (0, 0)  # an operator the rule does not know: nothing
        macs, flops = costs
        if written:
            target = kwargs.get(written[0])
            if target is None:
                position = [a.name for a in func._schema.arguments].index(written[0])
                target = args[position] if position < len(args) else outputs[0]
            self.rows.append(OpCost(self.module, name, values, self.value(target), macs, flops))
            self.last = weakref.ref(target)
            return
        made = 0
        for t in outputs:
            key = _key(t)
            if key in read or key in self.storages:  # a view or an alias of an input
                if key in self.storages:
                    self.track(t, self.storages[key])
                continue
            storage = Storage(t.untyped_storage().nbytes())
            self.track(t, storage)
            op = name if not made else f"{name}.{made}"
            row_costs = costs if not made else (0, 0)
            self.rows.append(OpCost(self.module, op, values, Value(tuple(t.shape), storage), *row_costs))
            if not made:
                self.last = weakref.ref(t)
            made += 1

    # leaves
    @contextmanager
    def quietly(self) -> Iterator[None]:
        self.quiet += 1
        try:
            yield
        finally:
            self.quiet -= 1

    def add_leaf(self, rows: list[OpCost], out: Any) -> None:
        """A leaf's rows, and its output tensor as the last row's output."""
        self.settle([])
        self.rows += rows
        self.last = None
        if isinstance(out, Tensor) and rows and _key(out) not in self.storages:
            storage = rows[-1].output.storage
            if storage.nbytes or not any(storage is x.storage for x in rows[-1].inputs):
                self.track(out, storage)

    def leaf(self, cost: Callable[..., list[OpCost]], args: tuple, kwargs: dict, weights: Any = ()) -> Tensor:
        """A leaf's call (a `costed` kernel's, a `cost_rows` module's with its `weights`): its rows, and an empty
        output of the last row's shape."""
        as_value = lambda t: self.value(t) if isinstance(t, Tensor) else t  # noqa: E731
        rows = cost(self.module, self.ctx, *tree_map(as_value, args), **tree_map(as_value, kwargs))
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        with self.quietly():
            grads = [t for t in (*tensors, *weights) if t.requires_grad] if torch.is_grad_enabled() else []
            out = _Output.apply(rows[-1].out_shape, tensors[0].dtype, *grads)
        self.add_leaf(rows, out)
        return out

    def module_forward(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        """The forward a leaf module runs in the trace: its rows (its `cost_rows` or its rule), and its output (its
        own forward's, run quietly, for torch's layers; an empty one of the last row's shape for `cost_rows`)."""
        own = getattr(module, "cost_rows", None)
        rule = _rule(module)

        def run(*args: Any, **kwargs: Any) -> Any:
            if own is not None:
                return self.leaf(own, args, kwargs, module.parameters())
            with self.quietly():
                out = forward(*args, **kwargs)
            self.add_leaf(rule(self.module, module, self.value(args[0]), out, self.ctx), out)
            return out

        return run

    def finish(self) -> None:
        """The outputs live to the end; what autograd saved last belongs to the last row."""
        self.settle([])
        for storage in list(self.storages.values()):
            if self.rows:
                self.held[len(self.rows) - 1].append(Value((), storage))
        self.done = True

    def result(self) -> list[OpCost]:
        rows = []
        for i, row in enumerate(self.rows):
            held = [x for x in self.held.get(i, []) if x.storage is not row.output.storage]
            saved = self.saved.get(i, [])
            if held or saved:
                row = dataclasses.replace(row, inputs=(*row.inputs, *held), saved=(*row.saved, *saved))
            rows.append(row)
        return rows


def _meta(t: Tensor, ctx: CostContext, grad: bool = False) -> Tensor:
    """A meta tensor of t's shape; floating point in ctx's dtype."""
    dtype = ctx.dtype if t.is_floating_point() else t.dtype
    return torch.empty(t.shape, dtype=dtype, device="meta").requires_grad_(grad)


def _meta_state(module: nn.Module, ctx: CostContext) -> dict[str, Tensor]:
    """Meta stand-ins for `module`'s parameters (keeping their requires_grad) and buffers."""
    state = {n: _meta(p, ctx, p.requires_grad) for n, p in module.named_parameters()}
    return state | {n: _meta(b, ctx) for n, b in module.named_buffers()}


def trace(module: nn.Module, *inputs: Any, ctx: CostContext | None = None, **kwargs: Any) -> list[OpCost]:
    """The rows of ``module(*inputs, **kwargs)`` in forward order, on `ctx`'s device and dtype (default: float32 on
    the CPU), counted as the module docstring says. Tensors among the inputs count as given (no memory of the pass);
    only their shapes are read. The module is left as it was."""
    ctx = ctx or CostContext()
    tracer = _Trace(ctx, {id(m): n for n, m in module.named_modules()})
    state = _meta_state(module, ctx)
    inputs, kwargs = tree_map(lambda t: _meta(t, ctx) if isinstance(t, Tensor) else t, (inputs, kwargs))
    patched = []
    for m in module.modules():
        if getattr(m, "cost_rows", None) is not None or _rule(m) is not None:
            patched.append((m, m.__dict__.get("forward")))
            m.forward = tracer.module_forward(m, m.forward)

    def enter(m: nn.Module, args: Any) -> None:
        if _active() is tracer:  # the modules another thread runs meanwhile are not this forward's
            tracer.stack.append(tracer.names.get(id(m), tracer.module))

    def leave(m: nn.Module, args: Any, out: Any) -> None:
        if _active() is tracer:
            tracer.stack.pop()

    hooks = [
        nn.modules.module.register_module_forward_pre_hook(enter),
        nn.modules.module.register_module_forward_hook(leave, always_call=True),
    ]
    _TRACES.append(tracer)
    try:
        with tracer, torch.autograd.graph.saved_tensors_hooks(tracer.pack, lambda packed: packed):
            with torch.enable_grad():
                out = torch.func.functional_call(module, state, inputs, kwargs, strict=False)
            tracer.finish()
            del out
    finally:
        tracer.done = True
        _TRACES.pop()
        for hook in hooks:
            hook.remove()
        for m, forward in patched:
            if forward is None:
                del m.forward
            else:
                m.forward = forward
    return tracer.result()
