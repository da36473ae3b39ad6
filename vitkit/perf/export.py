"""Export a model to ONNX or TorchScript with a dynamic batch axis, verified against PyTorch before it is kept.

The exported file takes images (B, C, H, W) of one fixed size and any batch size B. Before the file appears at
its path, it is loaded back (ONNX Runtime for ONNX, `torch.jit.load` for TorchScript) and run on random images at
batch sizes other than the one it was exported with; its outputs must match the PyTorch model's within `atol`.
The file is written under a temporary name and renamed only then, so a failed check leaves nothing at the path.

Attention backend per format: ONNX uses the explicit "math" attention (the fused kernel's decomposition with an
additive bias does not export with a dynamic batch for Swin and BoTNet; ONNX Runtime fuses the explicit pattern
itself); TorchScript keeps torch's fused "sdpa" kernel, which the traced module calls directly.
"""

from __future__ import annotations

import copy
import importlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch import nn

from vitkit.layers import set_attention_backend, to_2tuple
from vitkit.weights.io import atomic_write

FORMATS = ("onnx", "torchscript")
BACKENDS = {"onnx": "math", "torchscript": "sdpa"}  # attention backend each format is exported with (see above)
EXPORT_BATCH = 2  # batch size of the example input (torch.export specialises sizes 0 and 1, so not 1)
CHECK_BATCHES = (1, 3)  # batch sizes the exported file is run at, both different from EXPORT_BATCH
INPUT_NAME = "images"  # ONNX graph input (B, C, H, W)
OUTPUT_NAME = "output"  # ONNX graph output: logits (B, num_classes), or pooled features when num_classes is 0
EXTRA_HINT = "pip install 'vitkit[export]'"
# ONNX export: torch's torch.export-based exporter writes through onnx and onnxscript; onnxruntime runs the check.
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
Runner = Callable[[torch.Tensor], np.ndarray]  # runs an exported file on images (B, C, H, W)


@dataclass(frozen=True)
class ExportReport:
    format: str  # "onnx" or "torchscript"
    path: Path  # the file written
    max_abs_diff: float  # largest |exported - PyTorch| over every output checked
    batch_sizes: tuple[int, ...]  # batch sizes the exported file was run at (not the one it was exported with)
    img_size: tuple[int, int]  # the fixed input size (H, W)
    attn_backend: str  # attention backend of the exported graph: "math" or "sdpa"
    atol: float  # the tolerance the outputs were held to

    def summary(self) -> str:
        H, W = self.img_size
        batches = ", ".join(str(b) for b in self.batch_sizes)
        return (
            f"wrote {self.format} model to {self.path} (images {H}x{W}, any batch size; "
            f"attention backend {self.attn_backend})\n"
            f"checked against PyTorch at batch sizes {batches}: max abs diff {self.max_abs_diff:.3g} "
            f"<= atol {self.atol:g}"
        )


def _require(module: str, format: str) -> ModuleType:
    """Import an optional dependency, or OSError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise OSError(f"{format} export needs the {module} package: {EXTRA_HINT}") from err


def _input_size(model: nn.Module, img_size: int | tuple[int, int] | None) -> tuple[tuple[int, int], int]:
    """The (H, W) to export at and the input channels, from `img_size` or the model's config."""
    config = getattr(model, "config", None)
    if img_size is None:
        if config is None or not hasattr(config, "img_size"):
            raise ValueError(f"{type(model).__name__} has no config.img_size: pass img_size=(H, W) to export it")
        img_size = config.img_size
    size = to_2tuple(img_size)
    if min(size) <= 0:
        raise ValueError(f"img_size must be a positive int or (H, W), got {img_size!r}")
    return size, getattr(config, "in_chans", 3)


def _export_onnx(model: nn.Module, example: torch.Tensor, path: str) -> None:
    batch = torch.export.Dim("batch")
    program = torch.onnx.export(
        model,
        (example,),
        dynamo=True,
        dynamic_shapes=({0: batch},),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        verbose=False,
    )
    # One self-contained file (weights inside): a model file renamed after writing keeps no side files to follow.
    program.save(path, external_data=False)


def _onnx_runner(path: str) -> Runner:
    ort = _require("onnxruntime", "onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {INPUT_NAME: x.numpy()})[0]


def _export_torchscript(model: nn.Module, example: torch.Tensor, path: str) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        # The tracer warns where shape checks become constants: the image size and channels, fixed in the export.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        traced = torch.jit.trace(model, (example,), check_trace=False)  # checked below at other batch sizes
    traced.save(path)


def _torchscript_runner(path: str) -> Runner:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        module = torch.jit.load(path, map_location="cpu")

    def run(x: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return module(x).numpy()

    return run


def _max_abs_diff(
    run: Runner, model: nn.Module, inputs: list[torch.Tensor], format: str, path: Path, atol: float
) -> float:
    """Largest |exported - PyTorch| over `inputs`; ValueError when a shape differs or a value is beyond `atol`."""
    worst = 0.0
    for x in inputs:
        with torch.no_grad():
            expected = model(x).numpy()
        got = np.asarray(run(x))
        if got.shape != expected.shape:
            raise ValueError(
                f"exported {format} model returned shape {got.shape} at batch size {x.shape[0]}, PyTorch "
                f"{expected.shape}: its batch axis is not dynamic; nothing written to {path}"
            )
        diff = float(np.abs(got - expected).max())
        if not diff <= atol:  # also catches NaN
            raise ValueError(
                f"exported {format} model's outputs differ from PyTorch's by up to {diff:.3g} at batch size "
                f"{x.shape[0]}, more than atol {atol:g}; nothing written to {path}"
            )
        worst = max(worst, diff)
    return worst


def export_model(
    model: nn.Module,
    path: str | os.PathLike,
    format: str,
    img_size: int | tuple[int, int] | None = None,
    atol: float = 1e-4,
) -> ExportReport:
    """Export `model` for inference (float32, CPU, eval mode) with a dynamic batch axis, and verify it.

    The model is copied (the original is not changed). The file at `path` is written only if the exported
    model's outputs match PyTorch's within `atol` at batch sizes `CHECK_BATCHES` on random images; otherwise
    ValueError and nothing is written. The image size is fixed in the export.

    Args:
        model: a vitkit model (ViT, DeiT, Swin, BoTNet), or any module taking images (B, C, H, W).
        path: the file to write, e.g. ``model.onnx`` or ``model.pt``; its folder is created if missing.
        format: "onnx" (run with ONNX Runtime; needs ``pip install 'vitkit[export]'``) or "torchscript"
            (``torch.jit.load(path)``).
        img_size: input size, an int for square or (H, W); default the model's `config.img_size`.
        atol: largest absolute difference allowed between exported and PyTorch outputs.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; expected a file name such as model.onnx or model.pt")
    if format == "onnx":
        export, load = _export_onnx, _onnx_runner
        for module in ONNX_PACKAGES:
            _require(module, format)
    else:
        export, load = _export_torchscript, _torchscript_runner
    (H, W), in_chans = _input_size(model, img_size)

    reference = copy.deepcopy(model).to(device="cpu", dtype=torch.float32).eval()
    exported = set_attention_backend(copy.deepcopy(reference), BACKENDS[format])
    generator = torch.Generator().manual_seed(0)
    example = torch.randn(EXPORT_BATCH, in_chans, H, W, generator=generator)
    inputs = [torch.randn(b, in_chans, H, W, generator=generator) for b in CHECK_BATCHES]
    with torch.no_grad():
        reference(example)  # the model's own input check, before any export work
    diff = 0.0

    def write_and_check(tmp: str) -> None:
        nonlocal diff
        export(exported, example, tmp)
        diff = _max_abs_diff(load(tmp), reference, inputs, format, path, atol)

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write_and_check)  # renamed to `path` only if the check passed
    return ExportReport(format, path, diff, CHECK_BATCHES, (H, W), BACKENDS[format], atol)
