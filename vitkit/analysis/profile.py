"""Cost reports: add up the analytic per-operator costs that each layer states next to its forward.

`profile(model_or_name, img_size, batch)` needs no forward pass. With `measure=True` it also runs the model once
under torch's FlopCounterMode, taught the CPU attention kernel that the stock counter misses
(`aten._scaled_dot_product_flash_attention_for_cpu`), and reports the measured matmul FLOPs beside the analytic ones.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from vitkit.analysis.memory import PeakMemory, inference_peak_bytes, saved_for_backward_bytes
from vitkit.cost.rows import OpCost
from vitkit.layers import Mlp, attention_layers
from vitkit.layers.helpers import to_2tuple
from vitkit.models.interface import require_model
from vitkit.models.registry import create_model, family_of, model_entry

aten = torch.ops.aten


@dataclass
class Report:
    """The cost of one forward pass of a model at one input size. `to_dict()` is the stable JSON form."""

    model: str  # registry name or class name
    img_size: tuple[int, int]  # (H, W)
    batch: int  # B
    backend: str  # attention backend the costs assume ("auto", "sdpa" or "math")
    dtype: str  # activation dtype they assume, e.g. "float32" or "bfloat16"
    device: str  # device type they assume ("cpu", "cuda"): with dtype, it picks each attention call's path
    params: int  # parameter count
    macs: int  # multiply-adds of every conv / linear / matmul, attention included
    matmul_flops: int  # 2 * macs
    other_flops: int  # softmax, norms, activations, bias and residual adds (constants in vitkit.cost.rows)
    flops: int  # matmul_flops + other_flops
    activation_bytes: int  # peak live activations of an inference forward pass (estimate from the op rows)
    train_flops: int  # forward + backward: 3x forward for matmuls, 2x for the other operators
    train_activation_bytes: int  # activations autograd keeps for backward (what each operator saves, once)
    ops: list[OpCost] = field(repr=False)  # one row per operator in forward order
    measured_matmul_flops: int | None = None  # FlopCounterMode total of a real forward pass, when measured
    measured_activation_bytes: int | None = None  # peak extra memory of that pass, counted at the dispatcher
    parts: dict[str, str] = field(default_factory=dict, repr=False)  # qualified module name -> what it is in the
    # grouped views ("attention", "mlp", "embedding", "backbone", "heads"; `model_parts`)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["parts"]  # how the views read the rows, not a cost
        out["img_size"] = list(self.img_size)
        out["ops"] = [
            {
                "module": op.module,
                "op": op.op,
                "in_shape": list(op.in_shape),
                "out_shape": list(op.out_shape),
                "macs": op.macs,
                "flops": op.flops,
                "bytes": op.out_bytes,
            }
            for op in self.ops
        ]
        return out


def resolve_model(
    model_or_name: nn.Module | str, img_size: int | tuple[int, int] | None, real: bool, overrides: dict[str, Any]
) -> nn.Module:
    """A model instance; a registry name is built (on the meta device unless weights are needed), accepting other
    image sizes through its dynamic-size option so the parameters stay those of the variant."""
    if isinstance(model_or_name, nn.Module):
        if overrides:
            raise ValueError("config overrides apply to a model name, not to a built model")
        return model_or_name
    config = model_entry(model_or_name).config
    overrides = dict(overrides)
    if img_size is not None and to_2tuple(img_size) != to_2tuple(config.img_size):
        if not any(f.name == "dynamic_img_size" for f in dataclasses.fields(config)):
            raise ValueError(f"{model_or_name} takes only {config.img_size}x{config.img_size} images")
        overrides["dynamic_img_size"] = True
    if real:
        return create_model(model_or_name, **overrides).eval()
    with torch.device("meta"):
        return create_model(model_or_name, **overrides).eval()


def profile(
    model_or_name: nn.Module | str,
    img_size: int | tuple[int, int] | None = None,
    batch: int = 1,
    measure: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    overrides: dict[str, Any] | None = None,
) -> Report:
    """The analytic cost report of one forward pass.

    Args:
        model_or_name: a vitkit model, costed in the mode it is in (in training mode its dropout counts), or a
            registry name (built in eval mode).
        img_size: input size, an int or (H, W); default the model's training size.
        batch: batch size B.
        measure: also run one forward pass under a FLOP counter that knows the attention kernels and a
            memory counter, and fill `measured_matmul_flops` and `measured_activation_bytes`.
        dtype: the activation dtype the costs assume (torch.bfloat16 for bf16 autocast or `optimize("bf16")`).
        device: the device they assume: with the "auto" attention backend, bf16 on CPU counts the explicit path
            and bf16 on a GPU the fused kernel (see `vitkit.layers.Attention.path`).
        overrides: config fields for a model given by name, e.g. ``{"attn_backend": "math"}``.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    sides = (img_size, img_size) if isinstance(img_size, int) else img_size
    if img_size is not None and not (
        isinstance(sides, tuple | list)
        and len(sides) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sides)
    ):
        raise ValueError(f"img_size must be a positive int or a pair (H, W) of them, got {img_size!r}")
    if measure and torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "measuring runs the model on 'cuda', but torch sees no CUDA device: measure on the CPU, or count the "
            "costs a GPU run would have without measuring"
        )
    model = require_model(resolve_model(model_or_name, img_size, measure, overrides or {}), "profile")
    if measure and isinstance(model_or_name, str):
        model = model.to(device, dtype)  # measured where and as the costs assume
    elif measure and next(model.parameters()).dtype != dtype:
        raise ValueError(
            f"measure=True runs the model as it is: its weights are {next(model.parameters()).dtype}, the costs "
            f"assume {dtype}; pass dtype={next(model.parameters()).dtype} or convert the model"
        )
    size = to_2tuple(img_size if img_size is not None else model.config.img_size)
    ops = model.cost(size, batch, dtype=dtype, device=device)
    layers = attention_layers(model)
    macs = sum(op.macs for op in ops)
    matmul = sum(op.matmul_flops for op in ops)
    other = sum(op.other_flops for op in ops)
    report = Report(
        model=model_or_name if isinstance(model_or_name, str) else type(model).__name__,
        img_size=size,
        batch=batch,
        backend=layers[0][1].backend if layers else "none",
        dtype=str(dtype).removeprefix("torch."),
        device=torch.device(device).type,
        params=sum(p.numel() for p in model.parameters()),
        macs=macs,
        matmul_flops=matmul,
        other_flops=other,
        flops=matmul + other,
        activation_bytes=inference_peak_bytes(ops),
        train_flops=3 * matmul + 2 * other,
        train_activation_bytes=saved_for_backward_bytes(ops),
        ops=ops,
        parts=model_parts(model),
    )
    if measure:
        report.measured_matmul_flops, report.measured_activation_bytes = measure_forward(model, size, batch)
    return report


def _sdpa_cpu_flop(
    query_shape: tuple[int, ...], key_shape: tuple[int, ...], value_shape: tuple[int, ...], *args: Any, **kwargs: Any
) -> int:
    """FLOPs of the CPU flash-attention kernel: q@k^T and attn@v, as FlopCounterMode counts the other kernels."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# Kernels FlopCounterMode does not know on its own, with the formula it uses for the other attention kernels.
ATTENTION_KERNEL_FLOPS = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop}


def measure_forward(model: nn.Module, img_size: tuple[int, int], batch: int = 1) -> tuple[int, int]:
    """(matmul FLOPs, peak activation bytes) of one real forward pass without grad, both counted at the
    dispatcher: FLOPs by FlopCounterMode taught the attention kernels, memory by `PeakMemory`."""
    param = next(model.parameters())
    x = torch.randn(batch, model.config.in_chans, *img_size, device=param.device, dtype=param.dtype)
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=ATTENTION_KERNEL_FLOPS) as counter:
        with PeakMemory() as memory:
            model(x)
    return counter.get_total_flops(), memory.peak


def measure_matmul_flops(model: nn.Module, img_size: tuple[int, int], batch: int = 1) -> int:
    """Matmul FLOPs of one real forward pass (no grad), counted at the dispatcher, attention kernels included."""
    return measure_forward(model, img_size, batch)[0]


def model_parts(model: nn.Module) -> dict[str, str]:
    """What the parts of `model` are in the grouped views of its cost, by qualified module name: its attention layers
    (`vitkit.layers.attention_layers`: dense and deformable, self and cross) "attention", its MLPs
    (`vitkit.layers.Mlp`) "mlp", and the top-level modules its family declares (`Family.cost_parts`: "embedding",
    "backbone" or "heads"; none for a model of no registered family)."""
    try:
        parts = dict(family_of(model).cost_parts)
    except ValueError:
        parts = {}
    parts.update((name, "attention") for name, _ in attention_layers(model))
    parts.update((name, "mlp") for name, module in model.named_modules() if isinstance(module, Mlp))
    return parts


def part_of(module: str, parts: Mapping[str, str]) -> str | None:
    """What the innermost part in `parts` holding the module `module` (a qualified name) is; None if none holds it."""
    names = module.split(".")
    for end in range(len(names), 0, -1):
        part = parts.get(".".join(names[:end]))
        if part is not None:
            return part
    return None


TOP = "model"  # the grouped row of the model's own operators (its forward's position adds, concatenations)


def group_key(module: str, by: str, parts: Mapping[str, str]) -> str:
    """The row a module's operators are summed into: its block (`blocks.3`, `layers.1.blocks.0`; a detector's
    `backbone`, `encoder`, `decoder`), the top-level module, with every module of the "heads" part in one `heads`
    row, or the full module name (`by` "layer"); `TOP` for the model's own."""
    if not module:
        return TOP
    if by == "layer":
        return module
    match = re.match(r"(.*?blocks\.\d+)", module)
    if match:
        return match.group(1)
    top = module.split(".")[0]
    return "heads" if parts.get(top) == "heads" else top


CATEGORIES = ("attention", "mlp", "embedding", "backbone", "other")  # what the totals' percentages are split by


def category(module: str, parts: Mapping[str, str]) -> str:
    """The `CATEGORIES` entry of a module's operators: the part holding it (`model_parts`), with the heads and
    whatever no part holds counted as "other"."""
    part = part_of(module, parts)
    return part if part in CATEGORIES else "other"
