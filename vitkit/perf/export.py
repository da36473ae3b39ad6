"""Export a model to ONNX or TorchScript with a dynamic batch axis, verified against PyTorch before it is kept.

A classifier's exported file takes images (B, C, H, W) of one fixed size and any batch size B, and returns
`output`. Before the file appears at its path, it is loaded back (ONNX Runtime for ONNX, `torch.jit.load` for
TorchScript) and run on random images at batch sizes other than the one it was exported with; its outputs must match
the PyTorch model's within `atol` (times the output's largest value where that is over 1). The file is written under a
temporary name and renamed only then, so a failed check leaves nothing at the path. The file carries the model's
`ModelInfo` as JSON under `METADATA_KEY` (ONNX metadata_props; TorchScript extra files).

A detector's exported file (a model of a family registered with task "detection", `VitkitDetector`) takes images
(B, C, H, W) and pixel_mask (B, H, W) (bool, True on real pixels, as `vitkit.detection.pad_images` makes it) and
returns pred_logits (B, Q, K + 1) (DETR: "no object" last) or (B, Q, K) (Deformable DETR: a sigmoid per class) and
pred_boxes (B, Q, 4), and pred_masks (B, Q, H / 4, W / 4) where it `predicts_masks` (DETR's mask head): its
`predict`, the last decoder layer's predictions that inference reads (`aux_outputs` serve the training losses and are
left out of the graph). With `config.dynamic_img_size` (both detectors' default) H and W
are dynamic as well as B, and the check also runs at a second image size, on a batch padded as images of different
sizes are. The mask logits are compared as predictions read them, resampled to each image's own pixels: the padding
beyond holds no mask (`_difference`). DETR's mask path
is written to export as it runs: no nested tensors or per-image loops (which fix the batch size in the graph), the
cumulative sums of the position encoding on a float copy of the mask (ONNX has no CumSum on booleans), and the
mask resampled to the feature map by index arithmetic that picks the same pixels as PyTorch (ONNX's nearest Resize
does not, at some sizes).

Attention backend per format: ONNX uses the "math" attention, the reference formula (the fused kernel's
decomposition with an additive bias does not export with a dynamic batch for Swin and BoTNet; ONNX Runtime fuses the
formula's pattern itself); TorchScript keeps torch's fused "sdpa" kernel, which the traced module calls directly.
Multi-scale deformable attention runs its reference ("math") in both formats: one bilinear `grid_sample` per level
(ONNX GridSample), with the batch and the maps' sizes symbolic; its inference path, the `embedding_bag` gather,
builds its index tables per batch element and would fix the batch size in the graph (`DEFORMABLE_BACKEND`).
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitkit.detection.masks import MASK_CHUNK
from vitkit.errors import OptionError
from vitkit.layers import MultiScaleDeformableAttention, attention_layers, set_attention_backend, to_2tuple
from vitkit.models.interface import VitkitDetector, predicts_masks
from vitkit.models.query_masks import MASK_STRIDE
from vitkit.models.registry import DETECTION, family_of
from vitkit.perf.optimize import OptimizedModel, PackedLinear
from vitkit.util import atomic_write
from vitkit.weights.io import info_for

FORMATS = ("onnx", "torchscript")
BACKENDS = {"onnx": "math", "torchscript": "sdpa"}  # dense attention's backend in each format (see above)
DEFORMABLE_BACKEND = "math"  # multi-scale deformable attention's, in both: its reference keeps the batch free
ROUNDING = 1e-3  # differences up to this (relative above 1) can be float rounding: the refusal names atol then
EXPORT_BATCH = 2  # batch size of the example input (torch.export specialises sizes 0 and 1, so not 1)
CHECK_BATCHES = (1, 3)  # batch sizes the exported file is run at, both different from EXPORT_BATCH
INPUT_NAME = "images"  # ONNX graph input (B, C, H, W)
OUTPUT_NAME = "output"  # ONNX graph output: logits (B, num_classes), or pooled features when num_classes is 0
DETECTOR_INPUTS = ("images", "pixel_mask")  # a detector's graph inputs: (B, C, H, W) float32, (B, H, W) bool
DETECTOR_OUTPUTS = ("pred_logits", "pred_boxes")  # a detector's graph outputs: (B, Q, K + 1 | K), (B, Q, 4)
MASK_OUTPUTS = ("pred_masks",)  # and a detector's that `predicts_masks`: (B, Q, H / 4, W / 4)
SIZE_STEP = (24, 40)  # a dynamic-size model is also checked at (H, W) + this: no multiple of the backbone stride
METADATA_KEY = "vitkit.model_info"  # the file's metadata entry holding, as JSON, what the model carries beside its
# weights (`vitkit.weights.ModelInfo`: class names, normalisation, framing, a detector's category ids and reading)
EXTRA_HINT = "pip install 'vitkit[export]'"
# ONNX export: torch's torch.export-based exporter writes through onnx and onnxscript; onnxruntime runs the check.
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
Inputs = tuple[torch.Tensor, ...]  # the graph's inputs in order: (images,) or (images, pixel_mask)
Runner = Callable[[Inputs], list[np.ndarray]]  # runs an exported file, giving its outputs in order


@dataclass(frozen=True)
class ExportReport:
    format: str  # "onnx" or "torchscript"
    path: Path  # the file written
    max_abs_diff: float  # largest |exported - PyTorch| over every output checked
    batch_sizes: tuple[int, ...]  # batch sizes the exported file was run at (not the one it was exported with)
    img_size: tuple[int, int]  # the input size (H, W) it was exported at: the only one unless dynamic_img_size
    attn_backend: str  # attention backend of the exported graph: "math" or "sdpa"
    atol: float  # the tolerance the outputs were held to
    inputs: tuple[str, ...] = (INPUT_NAME,)  # graph inputs in order: ("images",), or DETECTOR_INPUTS for a detector
    outputs: tuple[str, ...] = (OUTPUT_NAME,)  # graph outputs in order: ("output",), or DETECTOR_OUTPUTS
    dynamic_img_size: bool = False  # H and W are dynamic too (a detector with config.dynamic_img_size)
    check_sizes: tuple[tuple[int, int], ...] = ()  # the (H, W) each batch of `batch_sizes` was run at
    max_diff: float = 0.0  # what `atol` holds: the largest difference, relative to the output's largest value if over 1

    def summary(self) -> str:
        H, W = self.img_size
        batches = ", ".join(str(b) for b in self.batch_sizes)
        if self.inputs == (INPUT_NAME,):
            signature = f"images {H}x{W}, any batch size"
        else:
            sizes = f"any size (exported at {H}x{W})" if self.dynamic_img_size else f"{H}x{W}"
            signature = (
                f"inputs {', '.join(self.inputs)}, outputs {', '.join(self.outputs)}; images of {sizes}, any batch size"
            )
        checked = ""
        if any(size != self.img_size for size in self.check_sizes):
            checked = " (images " + ", ".join(f"{h}x{w}" for h, w in self.check_sizes) + ")"
        return (
            f"wrote {self.format} model to {self.path} ({signature}; attention backend {self.attn_backend})\n"
            f"checked against PyTorch at batch sizes {batches}{checked}: max abs diff {self.max_abs_diff:.3g}"
            + (
                f", {self.max_diff:.3g} of the largest value <= atol {self.atol:g} (relative for outputs above 1)"
                if self.max_diff < self.max_abs_diff
                else f" <= atol {self.atol:g}"
            )
        )


@dataclass(frozen=True)
class Signature:
    """What an exported graph takes and returns."""

    inputs: tuple[str, ...]  # input names, in the order the graph takes them
    outputs: tuple[str, ...]  # output names, in the order the graph returns them
    dynamic_img_size: bool  # H and W dynamic as well as the batch


class DetectorOutputs(nn.Module):
    """A detector as its exported graph runs it: (images, pixel_mask) -> (pred_logits, pred_boxes), its `predict`
    (the last decoder layer only; the auxiliary predictions of the earlier layers are for training)."""

    def __init__(self, detector: VitkitDetector) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: torch.Tensor, pixel_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.detector.predict(images, pixel_mask)
        return tuple(out[name] for name in detector_outputs(self.detector))  # (B, Q, K + 1 | K), (B, Q, 4), ...


def detector_outputs(detector: nn.Module) -> tuple[str, ...]:
    """The names of a detector's graph outputs, in order: DETECTOR_OUTPUTS, then MASK_OUTPUTS where it
    `predicts_masks`."""
    return DETECTOR_OUTPUTS + (MASK_OUTPUTS if predicts_masks(detector) else ())


def is_detector(model: nn.Module) -> bool:
    """Whether `model` is exported as a detector: a model of a family registered with task "detection", or any
    module providing `VitkitDetector`."""
    if isinstance(model, VitkitDetector):
        return True
    try:
        return family_of(model).task == DETECTION
    except ValueError:  # not a model of a registered family
        return False


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


def _signature(model: nn.Module, format: str) -> Signature:
    """What `model`'s graph in `format` takes and returns. TorchScript's trace fixes the image size of a model with
    multi-scale deformable attention (its levels' sizes become constants of the graph); ONNX keeps it dynamic."""
    if not is_detector(model):
        return Signature((INPUT_NAME,), (OUTPUT_NAME,), False)
    deformable = any(isinstance(layer, MultiScaleDeformableAttention) for _, layer in attention_layers(model))
    dynamic = getattr(model.config, "dynamic_img_size", False) and not (format == "torchscript" and deformable)
    # a backbone whose graph fixes the size it was traced at (Swin's windows and shift masks) fixes the detector's
    dynamic = dynamic and getattr(model.backbone, "exports_any_size", True)
    return Signature(DETECTOR_INPUTS, detector_outputs(model), dynamic)


def _padded_mask(batch: int, H: int, W: int) -> torch.Tensor:
    """pixel_mask (batch, H, W) of a padded batch: image 0 fills it, image i > 0 is real on its top-left
    (H - i H / 2 batch) x (W - i W / batch) pixels, as `vitkit.detection.pad_images` lays out smaller images."""
    mask = torch.zeros(batch, H, W, dtype=torch.bool)
    for i in range(batch):
        mask[i, : H - i * H // (2 * batch), : W - i * W // batch] = True
    return mask


def _random_inputs(
    signature: Signature, batch: int, in_chans: int, size: tuple[int, int], generator: torch.Generator
) -> Inputs:
    """Random images (batch, C, H, W), with a detector's pixel_mask (padding zeroed in the images)."""
    images = torch.randn(batch, in_chans, *size, generator=generator)
    if signature.inputs == (INPUT_NAME,):
        return (images,)
    mask = _padded_mask(batch, *size)
    return images * mask[:, None], mask


def _pytorch_outputs(model: nn.Module, inputs: Inputs, signature: Signature) -> list[np.ndarray]:
    """The model's own forward on `inputs`, as the graph's outputs in order."""
    with torch.no_grad():
        out = model(*inputs)
    if isinstance(out, dict):
        return [out[name].numpy() for name in signature.outputs]
    return [out.numpy()]


def _export_onnx(
    model: nn.Module, example: Inputs, signature: Signature, path: str, metadata: dict[str, str]
) -> None:
    # Axes named by strings: the exporter makes each a `Dim.DYNAMIC` (whose range torch.export may narrow, e.g. to
    # images large enough that no feature map is 1 pixel wide) and gives the graph's axes these names.
    if signature.dynamic_img_size:
        dynamic_shapes = ({0: "batch", 2: "height", 3: "width"}, {0: "batch", 1: "height", 2: "width"})
    else:
        dynamic_shapes = ({0: "batch"}, {0: "batch"})
    with warnings.catch_warnings():
        # The images and pixel_mask share their axes: the exporter notes that it names each axis once.
        warnings.filterwarnings("ignore", message=r"# The axis name: \w+ will not be used", category=UserWarning)
        program = torch.onnx.export(
            model,
            example,
            dynamo=True,
            dynamic_shapes=dynamic_shapes[: len(example)],
            input_names=list(signature.inputs),
            output_names=list(signature.outputs),
            verbose=False,
        )
    program.model.metadata_props.update(metadata)  # the model's metadata_props, as onnxruntime's modelmeta reads them
    # One self-contained file (weights inside): a model file renamed after writing keeps no side files to follow.
    program.save(path, external_data=False)


def _onnx_runner(path: str, signature: Signature) -> Runner:
    ort = _require("onnxruntime", "onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return lambda inputs: session.run(
        list(signature.outputs), {name: x.numpy() for name, x in zip(signature.inputs, inputs, strict=True)}
    )


def _export_torchscript(
    model: nn.Module, example: Inputs, signature: Signature, path: str, metadata: dict[str, str]
) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        # The tracer warns where shape checks become constants: the image size and channels, fixed in the export.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        traced = torch.jit.trace(model, example, check_trace=False)  # checked below at other batch sizes
    traced.save(path, _extra_files=metadata)  # torch.jit.load(path, _extra_files=...) reads them back


def _torchscript_runner(path: str, signature: Signature) -> Runner:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        module = torch.jit.load(path, map_location="cpu")

    def run(inputs: Inputs) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*inputs)
        return [t.numpy() for t in out] if isinstance(out, tuple) else [out.numpy()]

    return run


def _narrowest_map(model: nn.Module, size: tuple[int, int]) -> int:
    """The narrowest side of the feature maps a detector makes of images of `size` (its levels' sizes, or its
    backbone's maps'); a large number for a model that says neither."""
    if hasattr(model, "level_sizes"):
        sizes = model.level_sizes(size)
    elif hasattr(getattr(model, "backbone", None), "feature_sizes"):
        sizes = model.backbone.feature_sizes(size)
    else:
        return 1 << 30
    return min(min(s) for s in sizes)


def _difference(name: str, inputs: Inputs, expected: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(the largest |exported - PyTorch| of output `name`, the largest |PyTorch value| it is measured against). A
    detector's mask logits (B, Q, h, w) are compared as `vitkit.detection.masks.detection_masks` reads them:
    resampled to the padded images and cut to each image's own pixels. Their cells beyond an image lie in its padding,
    where the graph's sampling positions at the padding's edge differ from PyTorch's in their last bits; only the
    row and column next to the image reach its edge pixels, in part, through the resampling."""
    difference = got.astype(np.float64) - expected
    if name not in MASK_OUTPUTS:
        return float(np.abs(difference).max()), float(np.abs(expected).max())
    pixels, (h, w) = inputs[1], expected.shape[-2:]  # (B, H, W), True on real pixels (top left)
    worst = size = 0.0
    for b, real in enumerate(pixels):
        rows, cols = int(real.any(dim=1).sum()), int(real.any(dim=0).sum())
        read = expected[b, :, : -(-rows // MASK_STRIDE) + 1, : -(-cols // MASK_STRIDE) + 1]
        size = max(size, float(np.abs(read).max()))
        for start in range(0, difference.shape[1], MASK_CHUNK):  # the queries' differences, resampled as logits are
            chunk = torch.from_numpy(difference[b, start : start + MASK_CHUNK, None])
            full = F.interpolate(chunk, size=(h * MASK_STRIDE, w * MASK_STRIDE), mode="bilinear", align_corners=False)
            worst = max(worst, float(full[..., :rows, :cols].abs().max()))
    return worst, size


def _max_abs_diff(
    run: Runner,
    model: nn.Module,
    checks: list[Inputs],
    signature: Signature,
    format: str,
    path: Path,
    atol: float,
) -> tuple[float, float]:
    """(largest |exported - PyTorch|, the largest of each output's over the largest of its PyTorch values where that
    is over 1) over `checks`; ValueError when a shape differs or the second is beyond `atol`."""
    worst = worst_scaled = 0.0
    for inputs in checks:
        B, _, H, W = inputs[0].shape
        where = f"batch size {B}" + (f", images {H}x{W}" if signature.dynamic_img_size else "")
        expected = _pytorch_outputs(model, inputs, signature)
        try:
            got = [np.asarray(a) for a in run(inputs)]
        except Exception as err:  # e.g. ONNX Runtime refusing a size the export fixed
            raise ValueError(
                f"exported {format} model failed at {where} ({type(err).__name__}: {str(err).strip()}): an axis the "
                f"export should have kept dynamic may be fixed; nothing written to {path}"
            ) from err
        for name, e, g in zip(signature.outputs, expected, got, strict=True):
            label = "" if len(signature.outputs) == 1 else f"{name} of "
            if g.shape != e.shape:
                axis = "batch axis is" if g.shape[:1] != e.shape[:1] else "output shapes are"
                raise ValueError(
                    f"exported {format} model returned {label}shape {g.shape} at {where}, PyTorch {e.shape}: "
                    f"its {axis} not dynamic; nothing written to {path}"
                )
            error, largest = _difference(name, inputs, e, g)
            size = max(1.0, largest)  # absolute up to 1; relative to the largest value above (mask logits)
            if not error <= atol * size:  # also catches NaN
                label = "" if len(signature.outputs) == 1 else f" ({name})"
                scale = "" if size == 1.0 else f" x {size:.3g}, the largest of PyTorch's values"
                said = (
                    f"exported {format} model's outputs{label} differ from PyTorch's by up to {error:.3g} at {where}, "
                    f"more than atol {atol:g}{scale}; nothing written to {path}"
                )
                if not math.isfinite(error) or error > ROUNDING * size:  # not float rounding
                    raise ValueError(said)
                looser = 10.0 ** math.ceil(math.log10(error / size))  # the power of ten that accepts it
                raise OptionError(lambda name, said=said, looser=looser: (
                    f"{said}. A difference this small can be the two runtimes' float rounding: the check accepts it "
                    f"with {name('atol', float(f'{looser:g}'))}"
                ))  # fmt: skip
            worst, worst_scaled = max(worst, error), max(worst_scaled, error / size)
    return worst, worst_scaled


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
    ValueError and nothing is written. The image size is fixed in the export, except for a detector built with
    `dynamic_img_size` (DETR's default), whose graph takes any H and W; a detector's graph takes images and
    pixel_mask and returns pred_logits and pred_boxes (see the module docstring).

    Args:
        model: a vitkit model (ViT, DeiT, Swin, BoTNet, DETR, Deformable DETR), or any module taking images
            (B, C, H, W).
        path: the file to write, e.g. ``model.onnx`` or ``model.pt``; its folder is created if missing.
        format: "onnx" (run with ONNX Runtime; needs ``pip install 'vitkit[export]'``) or "torchscript"
            (``torch.jit.load(path)``).
        img_size: input size, an int for square or (H, W); default the model's `config.img_size`. For a detector
            with `dynamic_img_size`, the size it is exported and first checked at.
        atol: largest difference allowed between exported and PyTorch outputs: absolute for an output whose values
            are at most 1 in size, relative to the largest for one with larger values (a detector's mask logits
            reach tens; float32 keeps 7 digits).
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    packed = any(isinstance(m, PackedLinear) for m in model.modules())
    if packed or (isinstance(model, OptimizedModel) and model.dtype != torch.float32):
        raise ValueError(
            "export takes a model before vitkit.optimize(model, 'bf16'): its bf16 layers (oneDNN's packed CPU "
            "kernels) are not what ONNX or TorchScript hold; export the model optimize was given (ONNX Runtime and "
            "TorchScript optimise the float32 graph themselves)"
        )
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; expected a file name such as model.onnx or model.pt")
    export, load = _format_functions(format)
    (H, W), in_chans = _input_size(model, img_size)
    signature = _signature(model, format)
    if signature.dynamic_img_size and _narrowest_map(model, (H, W)) < 2:  # a map 1 wide: exported as a constant
        side = next(s for s in range(max(H, W), 4097, 16) if _narrowest_map(model, (s, s)) >= 2)
        raise ValueError(
            f"a {H}x{W} example gives this detector a feature map 1 wide, which the export would fix as a constant "
            f"(its graph would refuse other sizes); export at {side} px or more: the graph takes images of any size"
        )
    reference, exported = _models(model, format, signature)
    carried = info_for(model, None, "export_model") if hasattr(model, "config") else None  # any module: nothing
    metadata = {METADATA_KEY: json.dumps(carried.to_json())} if carried is not None else {}
    sizes = [(H, W)] * len(CHECK_BATCHES)
    if signature.dynamic_img_size:  # the first check at the exported size, the others at another one
        sizes[1:] = [(H + SIZE_STEP[0], W + SIZE_STEP[1])] * (len(CHECK_BATCHES) - 1)
    generator = torch.Generator().manual_seed(0)
    example = _random_inputs(signature, EXPORT_BATCH, in_chans, (H, W), generator)
    checks = [_random_inputs(signature, b, in_chans, s, generator) for b, s in zip(CHECK_BATCHES, sizes, strict=True)]
    with torch.no_grad():
        reference(*example)  # the model's own input check, before any export work
    diff = scaled = 0.0

    def write_and_check(tmp: str) -> None:
        nonlocal diff, scaled
        export(exported, example, signature, tmp, metadata)
        diff, scaled = _max_abs_diff(load(tmp, signature), reference, checks, signature, format, path, atol)

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write_and_check)  # renamed to `path` only if the check passed
    return ExportReport(
        format,
        path,
        diff,
        CHECK_BATCHES,
        (H, W),
        BACKENDS[format],
        atol,
        signature.inputs,
        signature.outputs,
        signature.dynamic_img_size,
        tuple(sizes),
        scaled,
    )


def _format_functions(format: str) -> tuple[Callable[..., None], Callable[[str, Signature], Runner]]:
    """(write the file, load it back as a `Runner`) for `format` (one of `FORMATS`); OSError when ONNX export's
    packages are missing."""
    if format == "torchscript":
        return _export_torchscript, _torchscript_runner
    for module in ONNX_PACKAGES:
        _require(module, format)
    return _export_onnx, _onnx_runner


def _models(model: nn.Module, format: str, signature: Signature) -> tuple[nn.Module, nn.Module]:
    """(the reference: a float32 CPU eval copy of `model`, the module to export: a copy of that with the format's
    attention backend, a detector wrapped in `DetectorOutputs`)."""
    reference = copy.deepcopy(model).to(device="cpu", dtype=torch.float32).eval()
    exported = set_attention_backend(copy.deepcopy(reference), BACKENDS[format])
    for _, layer in attention_layers(exported):
        if isinstance(layer, MultiScaleDeformableAttention):
            layer.backend = DEFORMABLE_BACKEND
    if signature.inputs == DETECTOR_INPUTS:
        exported = DetectorOutputs(exported).eval()
    return reference, exported
