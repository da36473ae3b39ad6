"""Inference optimisation: weights cast to bf16 once, fp32 where precision needs it, the fastest attention path.

On CPU in bf16 the linear layers also get their weights reordered once into oneDNN's blocked layout, with the bias
(and the MLP's GELU) applied inside the GEMM: `PackedLinear`. That removes the bias copy torch's `addmm` makes and
the separate pass over the (B, N, 4C) hidden activations that GELU takes (profiled on ViT-S/16, batch 16: 28 ms and
36 ms of a 546 ms bf16 forward), and the reordered GEMMs themselves run 6-14% faster (BENCHMARKS.md).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.analysis.precision import (
    AUTO,
    SlowPrecisionWarning,
    StepTimes,
    precision_dtype,
    resolve_precision,
    slow_precision,
    time_step,
)
from vitkit.cost.rows import GELU_FLOPS, CostContext, OpCost, Value, linear_op, numel
from vitkit.cost.tracer import linear_row
from vitkit.kernels.probe import cpu_bf16_attention, native_cpu_bf16
from vitkit.layers import Mlp, attention_layers

ACTIVATIONS = ("none", "gelu")


@functools.cache
def packed_linear_supported() -> bool:
    """Whether this torch build and CPU run oneDNN's bf16 linear with a reordered weight and a fused GELU.

    The operators are the ones inductor uses for frozen CPU graphs (`torch.ops.mkldnn._linear_pointwise`); they
    are not public API, so this probes them once on a small input against `F.linear` + `F.gelu` and reports False
    (plain bf16 `nn.Linear` is used then) if they are missing, fail or disagree.
    """
    try:
        if not native_cpu_bf16():
            return False
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(24, 16, generator=generator).bfloat16()
        bias = torch.randn(24, generator=generator).bfloat16()
        x = torch.randn(2, 3, 16, generator=generator).bfloat16()
        layer = PackedLinear(weight, bias, "gelu")
        expected = F.gelu(F.linear(x.float(), weight.float(), bias.float()))
        return bool(torch.allclose(layer(x).float(), expected, atol=5e-2, rtol=2e-2))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class PackedLinear(nn.Module):
    """A bf16 CPU inference linear layer: y = act(x W^T + b) in one oneDNN call on a weight reordered once.

    The reordered weight is opaque to torch (and not among `parameters()`); `state_dict()`, pickling and
    `copy.deepcopy` see it dense (`weight`), and loading reorders again, so the layer saves and loads like the
    `nn.Linear` it replaces. It stays on the CPU: optimize a model after moving it to its device. The oneDNN
    operator has no backward, so an input that requires grad takes `F.linear` (and GELU) instead.

    Args:
        weight: (out_features, in_features), cast to bf16.
        bias: (out_features,) or None, cast to bf16.
        activation: "none" or "gelu" (exact, erf), applied to the fp32 accumulators before rounding to bf16.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if weight.ndim != 2 or weight.device.type != "cpu":
            raise ValueError(f"expected a 2-D CPU weight, got shape {tuple(weight.shape)} on {weight.device}")
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        self.packed = self._pack(weight)
        self.dense: torch.Tensor | None = None  # the dense weight, made when first asked for
        self.bias = None if bias is None else nn.Parameter(bias.detach().bfloat16(), requires_grad=False)

    @staticmethod
    def _pack(weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().bfloat16().contiguous(), None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "none") -> PackedLinear:
        return cls(linear.weight, linear.bias, activation)

    @property
    def weight(self) -> torch.Tensor:
        """The weight as a dense bf16 (out_features, in_features) tensor, made once and kept: `Attention` reads
        row blocks of its qkv weight for separate queries, keys and values (DETR) on every call."""
        if self.dense is None:
            self.dense = self.packed.to_dense()
        return self.dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.shape[-1] != self.in_features:
            raise ValueError(
                f"PackedLinear takes bf16 CPU inputs (..., {self.in_features}); got {x.dtype} {tuple(x.shape)} on "
                f"{x.device} (optimize a model after moving it to its device)"
            )
        if x.requires_grad and torch.is_grad_enabled():  # e.g. input gradients for a saliency map
            y = F.linear(x, self.weight, self.bias)
            return F.gelu(y) if self.activation == "gelu" else y
        # algorithm "none" selects the exact erf GELU ("tanh" would be the approximation); unused for "none"
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.activation, [], "none")

    def cost_rows(self, name: str, ctx: CostContext, x: Value) -> list[OpCost]:
        """The rows of a packed layer, whose reordered weight and fused GELU a trace cannot see: the `nn.Linear` it
        replaces, with the GELU's FLOPs in the same operator (it writes no tensor of its own)."""
        op = linear_op(*linear_row(name), x, self.out_features, ctx, bias=self.bias is not None)
        if self.activation == "gelu":
            op = dataclasses.replace(op, flops=op.flops + GELU_FLOPS * numel(op.out_shape))
        return [op]

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = self.weight
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        key = prefix + "weight"
        if key in state_dict:
            weight = state_dict[key]
            if tuple(weight.shape) != (self.out_features, self.in_features):
                errors.append(
                    f"size mismatch for {key}: {tuple(weight.shape)} in the state dict, "
                    f"{(self.out_features, self.in_features)} in the model"
                )
            else:
                self.packed, self.dense = self._pack(weight), None
        elif strict:
            missing.append(key)
        rest = {k: v for k, v in state_dict.items() if k != key}
        super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing, unexpected, errors)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["packed"] = self.weight  # an opaque oneDNN tensor can be neither pickled nor copied
        state["dense"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.packed = self._pack(self.packed)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, act={self.activation}"


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every `nn.Linear` of a bf16 CPU `model` by a `PackedLinear`, fusing each vitkit `Mlp`'s GELU."""
    for module in list(model.modules()):
        if isinstance(module, Mlp) and type(module.act) is nn.GELU and module.act.approximate == "none":
            if isinstance(module.fc1, nn.Linear):
                module.fc1 = PackedLinear.from_linear(module.fc1, "gelu").train(module.training)
                module.act = nn.Identity().train(module.training)  # Mlp computes act(fc1(x)): GELU runs in fc1
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear.from_linear(child).train(child.training))
    return model


class OptimizedModel(nn.Module):
    """A model prepared for inference: takes the same fp32 images as the original and returns fp32 logits.

    With bf16, linear and convolution weights (and the activations between them) are bf16, cast once when the
    model is built rather than on every call as `torch.autocast` does. BatchNorm keeps fp32 parameters, and so
    does LayerNorm on CPU (torch's CPU kernel takes bf16 inputs with fp32 parameters; CUDA's wants them in the
    input's dtype and accumulates in fp32 all the same); attention runs the "auto" backend, whose softmax computes in
    fp32 in both of its paths.
    """

    def __init__(self, model: nn.Module, precision: str) -> None:
        super().__init__()
        self.model = model
        self.precision = precision
        self.dtype = precision_dtype(precision)
        self.config = getattr(model, "config", None)
        self.measured: StepTimes | None = None  # the times `optimize(..., "auto")` chose it by, where it timed them

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Images in any float dtype -> the model's outputs (a tensor, or a detector's dict of them) in fp32; other
        arguments (a detector's pixel mask) pass through as they are."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"expected a floating-point image tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        return to_float(self.model(x.to(self.dtype), *args, **kwargs))


def to_float(outputs: Any) -> Any:
    """Floating-point tensors in `outputs` (nested dicts, lists, tuples) as fp32; everything else as it is."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.is_floating_point() else outputs
    if isinstance(outputs, dict):
        return {k: to_float(v) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(to_float(v) for v in outputs)
    return outputs


def optimize(model: nn.Module, precision: str = "bf16", compile: bool = False, batch: int = 1) -> OptimizedModel:
    """An inference copy of `model` (the original is left as it is).

    Args:
        model: a vitkit model (any module whose attention is vitkit's `Attention`), on the device it will run on.
        precision: "bf16" (weights cast once; batch norms in fp32, layer norms too on CPU; on CPU, reordered
            weights with fused bias and GELU where `packed_linear_supported()`), "fp32", or "auto": the one that
            measures faster on the model's device (`vitkit.analysis.precision.auto_precision`; on a CPU whose
            products favour bf16, both copies are built and their forwards on `batch` images timed, and the faster
            is returned, its `measured` holding the times). In both, a model's frozen convolution norms (a detector's
            backbone, `fold_norms`) are folded into the convolutions first, in fp32.
        compile: wrap the forward in `torch.compile` with weight freezing (the first call compiles, about half a
            minute for ViT-S on 2 cores; needs a C++ compiler on CPU). Inductor then does its own weight packing.
            With "auto", the products alone decide (compiling both copies would take minutes).
        batch: the images a call will take, for "auto"'s timing.
    """
    device = next(iter(model.parameters()), torch.empty(0)).device
    timed = precision == AUTO and not compile and device.type == "cpu"
    timed = timed and hasattr(getattr(model, "config", None), "img_size")  # inputs can be made up to time it
    if timed and resolve_precision(AUTO, device) == "bf16":
        return _faster_copy(model, batch)
    precision = resolve_precision(precision, device)  # "auto": the faster of the two here
    dtype = precision_dtype(precision)
    slow = slow_precision(precision, device, name=lambda option, value: f'optimize(model, "{value}")')
    if slow is not None:
        warnings.warn(slow, SlowPrecisionWarning, stacklevel=2)
    model = copy.deepcopy(model).eval()
    for module in list(model.modules()):
        if callable(getattr(module, "fold_norms", None)):  # a detector's frozen-norm backbone
            module.fold_norms()
    for _, layer in attention_layers(model):
        layer.backend = "auto"
    if dtype != torch.float32:
        # normalisation statistics and affine parameters stay fp32: batch norm's kernels take bf16 inputs with them
        # on CPU and CUDA, layer norm's on CPU only (CUDA's wants its input's dtype, and accumulates in fp32 anyway)
        kept = (nn.LayerNorm, nn.BatchNorm2d) if device.type == "cpu" else (nn.BatchNorm2d,)
        for module in model.modules():
            if isinstance(module, kept):
                continue
            for param in module.parameters(recurse=False):
                param.data = param.data.to(dtype)
            for name, buf in module.named_buffers(recurse=False):
                if buf.is_floating_point():
                    setattr(module, name, buf.to(dtype))
    for param in model.parameters():
        param.requires_grad_(False)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if precision == "bf16" and on_cpu and not compile and packed_linear_supported():
        pack_linears(model)
    optimized = OptimizedModel(model, precision).eval()
    if compile:
        if precision == "bf16" and on_cpu:
            cpu_bf16_attention()  # attention's bf16 path is measured now: a traced call cannot time anything
        # Freezing lets inductor treat the weights as constants: prepacked oneDNN GEMMs with fused bias and
        # activation on CPU. Safe here since the weights of an inference copy never change.
        optimized.model = torch.compile(model, options={"freezing": True})
    return optimized


def _faster_copy(model: nn.Module, batch: int) -> OptimizedModel:
    """The faster of `model`'s fp32 and bf16 `optimize`d copies (`time_copies` on `probe_images`), with the times in
    its `measured`: products that run faster in bf16 do not make every model faster (a small detector on one image
    at a time on a Xeon with AMX: 37 ms in fp32 against 53 in bf16 at image sizes not seen before)."""
    from vitkit.infer.runtime import probe_images

    generator = torch.Generator().manual_seed(0)
    copies, times = time_copies(model, lambda i: probe_images(model, batch, i, generator))
    chosen = copies[times.choice()]
    chosen.measured = times
    return chosen


def time_copies(
    model: nn.Module, images: Callable[[int], torch.Tensor]
) -> tuple[dict[str, OptimizedModel], StepTimes]:
    """`model`'s fp32 and bf16 `optimize`d copies by precision, and their forwards on `images(i)` timed
    (`vitkit.analysis.precision.time_step`)."""
    copies = {"fp32": optimize(model, "fp32"), "bf16": optimize(model, "bf16")}

    def forward(bf16: bool, i: int) -> None:
        with torch.inference_mode():
            copies["bf16" if bf16 else "fp32"](images(i))

    return copies, time_step(forward)
