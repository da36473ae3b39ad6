"""Throughput benchmarks: vitkit side by side with timm, interleaved in one process, medians.

Every candidate runs the same batch; rounds alternate between candidates so that frequency changes and other load
on the machine hit all of them alike. Model-FLOP utilisation (MFU) divides the model's analytic matmul FLOPs per
second by the dense GEMM rate measured on the spot for the candidate's precision.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from vitkit.analysis.estimate import MemoryEstimate, MemoryEstimator
from vitkit.analysis.memory import PeakMemory
from vitkit.analysis.precision import SlowPrecisionWarning, StepTimes, cpu_features, precision_dtype, time_training_step
from vitkit.analysis.preflight import SettingNames, enforce
from vitkit.analysis.profile import profile
from vitkit.errors import OptionError
from vitkit.layers.helpers import to_2tuple
from vitkit.models.registry import DETECTION, create_model, families, family, model_entry
from vitkit.perf.optimize import optimize, time_copies
from vitkit.util import listed
from vitkit.weights.convert import export_weights

COMPARE = (None, "timm", "transformers")  # what a model can be benchmarked against: timm's model of the same name
# (a classifier), transformers' class of the same weights (a detector: `compared_detectors`)
DETECTION_BOXES = 8  # ground-truth boxes per image in a timed detection training step
# How a refusal of `bench` for memory names its settings (`vitkit bench` passes its flags).
MEMORY_NAMES = SettingNames(
    batch="batch", img_size="img_size", grad_checkpointing=None, allow="allow_memory=True", strategy=None
)


@dataclass
class Result:
    name: str  # e.g. "vitkit bf16", "timm fp32", "timm autocast-bf16"
    precision: str  # "fp32" or "bf16": what the GEMMs run in
    images_per_second: float  # batch / median step time
    latency_ms: float  # median time of one step (a forward, or forward + backward + AdamW)
    peak_memory_bytes: int  # extra memory of one step beyond weights and input
    mfu: float  # analytic matmul FLOP/s over the GEMM rate measured for `precision`
    times_ms: list[float] = field(repr=False)  # every timed step
    time_split: dict[str, float] = field(default_factory=dict)  # share of one profiled step's CPU time per
    # `SPLIT` category (empty on GPUs, where the CPU time is not the step's time)


@dataclass
class Report:
    model: str
    batch: int
    img_size: tuple[int, int]
    mode: str  # "inference" or "train"
    device: str
    threads: int  # torch intra-op threads
    flops_per_step: int  # analytic matmul FLOPs of one step (3x forward for training)
    gemm_flops_per_second: dict[str, float]  # precision -> measured dense GEMM rate
    results: list[Result]
    processor: str = ""  # what ran it: the CPU's instruction sets (`cpu_features`) or the GPU's name

    def to_dict(self) -> dict:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rate(
    precision: str, device: torch.device, n: int | None = None, repeats: int = 10, min_seconds: float = 0.5
) -> float:
    """Dense matmul FLOP/s at `precision` on `device`: n x n x n products after two warm-ups, at least `repeats` of
    them and for at least `min_seconds`, rated by the fastest. n is 2048 on CPU and 8192 on a GPU by default (a
    2048^3 product takes tens of microseconds there, as long as the synchronisation that times it).

    The fastest, not the median: on a shared or frequency-scaled CPU every product of a short probe can run slow. On
    a 2-core Xeon with AMX, five processes measured bf16 medians of 10 products between 1.31 and 2.11 TFLOP/s, and
    the fastest of 60 products between 2.17 and 2.28 (BENCHMARKS.md): the share of the peak a step reaches moved
    with the probe, not with the step. On a GPU each product is timed by CUDA events (`product_seconds`)."""
    device = torch.device(device)
    n = n or (2048 if device.type == "cpu" else 8192)
    dtype = precision_dtype(precision)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):  # the first products warm up
        a @ b
    return 2 * n**3 / min(product_seconds(lambda: a @ b, device, repeats, min_seconds))


def product_seconds(
    product: Callable[[], object], device: torch.device, repeats: int, min_seconds: float
) -> list[float]:
    """The seconds of each of at least `repeats` calls of `product`, made until they add up to `min_seconds`.

    On CPU each call is timed by the clock. On a GPU each lies between two CUDA events on the current stream, and
    the host waits once for every `repeats` calls (the events' times read after it): a synchronisation per product
    would time the host's round trip with it, as long as a 2048^3 product there."""
    times: list[float] = []
    batch = max(repeats, 1)
    if device.type == "cuda":
        while len(times) < batch or sum(times) < min_seconds:
            events = [(_timing_event(), _timing_event()) for _ in range(batch)]
            for start, end in events:
                start.record()
                product()
                end.record()
            torch.cuda.synchronize(device)
            times += [start.elapsed_time(end) / 1000 for start, end in events]  # milliseconds -> seconds
        return times
    while len(times) < batch or sum(times) < min_seconds:
        start = time.perf_counter()
        product()
        times.append(time.perf_counter() - start)
    return times


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


# Where a step's time goes: operators by category (self CPU time of one profiled step). GEMMs are every matrix
# product, attention's q@k^T and attn@v outside the fused kernel and the convolutions included; attention is its
# fused kernels and softmax; sampling is deformable attention's bilinear sampling (`grid_sample`, or the bag of
# weighted rows of vitkit's gather path; the arithmetic that finds the points and their weights counts as
# element-wise); the optimizer everything under `Optimizer.step` / `zero_grad`; other is the framework: views,
# allocation, the autograd engine's own time.
SPLIT = ("GEMMs", "attention", "sampling", "norms and elementwise", "copies", "optimizer", "other")
GEMM_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::mkldnn_convolution",
    "aten::convolution_backward",
    "aten::mkldnn_linear",
    "mkldnn::_linear_pointwise",
    "mkldnn::_convolution_pointwise",
}
SAMPLING_OPS = ("aten::grid_sampler", "aten::_embedding_bag", "aten::embedding_bag")  # with their backward
ATTENTION_OPS = ("aten::_scaled_dot_product", "aten::_softmax", "aten::_softmax_backward_data", "aten::_safe_softmax")
COPY_OPS = {"aten::copy_", "aten::_to_copy", "aten::cat", "aten::clone", "aten::stack", "aten::_to_dense"}
FRAMEWORK_OPS = (
    "aten::view",
    "aten::_unsafe_view",
    "aten::reshape",
    "aten::as_strided",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::zeros",
    "aten::t",
    "aten::transpose",
    "aten::permute",
    "aten::expand",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::select",
    "aten::slice",
    "aten::split",
    "aten::unbind",
    "aten::chunk",
    "aten::detach",
    "aten::alias",
    "aten::resolve_",
    "aten::result_type",
    "aten::to",
    "aten::lift_fresh",
    "aten::flatten",
    "aten::contiguous",
    "aten::linear",
    "aten::matmul",
    "aten::numpy_T",
)


def time_category(name: str, in_optimizer: bool) -> str:
    """The `SPLIT` category of a profiled operator by its name."""
    if in_optimizer or name.startswith("Optimizer."):
        return "optimizer"
    if name in GEMM_OPS:
        return "GEMMs"
    if name.startswith(ATTENTION_OPS):
        return "attention"
    if name.startswith(SAMPLING_OPS):
        return "sampling"
    if name in COPY_OPS:
        return "copies"
    if not name.startswith("aten::") or name.startswith(FRAMEWORK_OPS):
        return "other"
    return "norms and elementwise"


# torch.profiler's own log lines, which its C++ side (Kineto) writes to the process's stderr: "USDT:2026-12-01
# 22:22:22 17472:17472 SyncActivityProfilerHandler.cpp:39] profiler_start", and on a machine without a GPU "ERROR:...
# DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35", which reads like the benchmark failing.
PROFILER_CHATTER = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")


@contextmanager
def quiet_profiler() -> Iterator[None]:
    """Keep torch.profiler's log lines (`PROFILER_CHATTER`) out of the user's output: while it runs, the process's
    stderr (file descriptor 2, where C++ writes) goes to a temporary file, whose other lines are then passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not PROFILER_CHATTER.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def time_split(step: Callable[[], object]) -> dict[str, float]:
    """Share of one step's CPU time (operators' self time, torch.profiler) per `SPLIT` category."""
    with quiet_profiler(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    events = list(prof.events())
    scopes = [e.time_range for e in events if e.name.startswith("Optimizer.")]  # step and zero_grad
    totals = dict.fromkeys(SPLIT, 0.0)
    for e in events:
        start = e.time_range.start
        in_optimizer = any(r.start <= start <= r.end for r in scopes)
        totals[time_category(e.name, in_optimizer)] += e.self_cpu_time_total
    total = sum(totals.values()) or 1.0
    return {k: v / total for k, v in totals.items()}


def _peak_memory(step: Callable[[], object], device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with PeakMemory() as memory:
        step()
    return memory.peak


def _inference_step(model: nn.Module, x: torch.Tensor, autocast: bool = False) -> Callable[[], object]:
    def step() -> object:
        with torch.inference_mode(), torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            return model(x)

    return step


def _train_step(
    model: nn.Module, x: torch.Tensor, num_classes: int, autocast: bool, optimizer: torch.optim.Optimizer
) -> Callable[[], object]:
    model.train()
    target = torch.randint(0, num_classes, (x.shape[0],), device=x.device)

    def step() -> object:
        with torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def detection_targets(batch: int, num_classes: int, boxes: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """`boxes` random ground-truth boxes per image ((cx, cy, w, h) in [0, 1], centres 0.2-0.8 and sides 0.05-0.3 of
    the image, labels in [0, num_classes)), the same on every call: what a timed detection training step matches."""
    generator = torch.Generator().manual_seed(0)
    targets = []
    for _ in range(batch):
        centres = 0.2 + 0.6 * torch.rand(boxes, 2, generator=generator)
        sides = 0.05 + 0.25 * torch.rand(boxes, 2, generator=generator)
        labels = torch.randint(0, num_classes, (boxes,), generator=generator)
        targets.append({"labels": labels.to(device), "boxes": torch.cat([centres, sides], 1).to(device)})
    return targets


def detection_train_step(
    model: nn.Module,
    x: torch.Tensor,
    targets: list[dict[str, torch.Tensor]],
    autocast: bool,
    optimizer: torch.optim.Optimizer,
) -> Callable[[], object]:
    """One step of `vitkit train` on a detector (its DETR set criterion: matching, classification, L1 and GIoU on
    every decoder layer), on an unpadded batch; the loss is the one the model declares (DETR's softmax with "no
    object", or Deformable DETR's focal loss)."""
    from vitkit.detection import criterion_for
    from vitkit.models.interface import has_no_object_logit

    no_object = has_no_object_logit(model)
    criterion = criterion_for(
        "ce" if no_object else "focal", model.config.num_classes, model.config.aux_loss, no_object
    )
    model.train()

    def step() -> object:  # the parts named for a profiler (`benchmarks/gpu_step_profile.py`)
        with record_function("model"), torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            outputs = model(x)
        with record_function("criterion"):
            loss = criterion(outputs, targets)["total"]
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def _transformers_train_step(
    reference: nn.Module, x: torch.Tensor, targets: list[dict[str, torch.Tensor]], autocast: bool
) -> Callable[[], object]:
    """transformers' training step for the same detector: its own loss (`labels` given), with the matching costs
    and auxiliary losses on every decoder layer as vitkit's, and torch's AdamW at its defaults."""
    reference.config.auxiliary_loss = True  # vitkit trains every decoder layer, as the DETR papers do
    if getattr(reference.config, "focal_alpha", None) is not None:  # Deformable DETR's focal matching cost
        reference.config.class_cost = 2
    reference.train()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-4)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]

    def step() -> object:
        with torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            loss = reference(pixel_values=x, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def _timm_model(name: str, img_size: tuple[int, int], dynamic: bool, device: torch.device) -> nn.Module:
    # timm is an optional comparison, imported only when asked for; vitkit never needs it otherwise.
    try:
        import timm
    except ImportError as err:
        raise ImportError("comparing with timm needs timm installed: pip install timm") from err
    if name not in timm.list_models():
        raise ValueError(f"timm has no model named {name!r} to compare with")
    kwargs = {"dynamic_img_size": True} if dynamic else {}
    return timm.create_model(name, pretrained=False, **kwargs).to(device).eval()


def _transformers_model(model: nn.Module, device: torch.device) -> nn.Module:
    """transformers' model with `model`'s weights, as a user gets it from an exported directory (the class its
    config.json names, e.g. `DetrForObjectDetection`; its default attention implementation)."""
    # transformers is an optional comparison, imported only when asked for; vitkit never needs it otherwise.
    try:
        import transformers
    except ImportError as err:
        raise ImportError("comparing with transformers needs it installed: pip install transformers") from err
    with tempfile.TemporaryDirectory() as directory:
        export_weights(model, directory, format="hf")
        architecture = json.loads((Path(directory) / "config.json").read_text())["architectures"][0]
        reference = getattr(transformers, architecture).from_pretrained(directory)
    return reference.to(device).eval()


OptimizerFactory = Callable[..., torch.optim.Optimizer]  # (model, lr=..., weight_decay=...) -> optimizer
Candidate = tuple[str, Callable[[], object]]  # (precision the GEMMs run in, one step)


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """torch's AdamW over all parameters, its fused kernel where torch has one (CPU, CUDA): the default
    optimizer of timed training steps; `vitkit bench --train` passes `vitkit.train.create_optimizer`."""
    device = next(model.parameters()).device.type
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=device in ("cpu", "cuda"))


def compared_detectors() -> str:
    """The registered detector families, which `compare="transformers"` covers, in words: "DETR and Deformable DETR"."""
    return listed([fam.display_name for fam in families() if fam.task == DETECTION])


def _check_setting(model_name: str, train: bool, compare: str | None) -> bool:
    """Refuse what `bench` cannot time for this model; whether it is a detector."""
    detector = family(model_entry(model_name).family).task == DETECTION
    if detector and compare == "timm":
        raise OptionError(
            lambda name: f"{model_name} is a detector: compare it with transformers ({name('compare', 'transformers')})"
        )
    if compare == "transformers" and not detector:
        raise OptionError(
            lambda name: (
                f"{name('compare', 'transformers')} covers the detectors ({compared_detectors()}); compare "
                f"{model_name} with timm"
            )
        )
    return detector


def bench_memory(
    model_name: str,
    size: tuple[int, int],
    precision: str,
    train: bool,
    compare: str | None,
    device: str = "cpu",
) -> Callable[[int], MemoryEstimate]:
    """The estimated peak memory of `bench`'s run, as a function of the batch: every candidate's model (and, when
    training, its AdamW state) is held at once, and the candidates' steps run one at a time.

    The vitkit candidate is estimated in `precision` (for bf16 inference: its fp32 weights and the bf16 copy
    `optimize` makes); a reference model (timm's, transformers') like vitkit's model in fp32, and under bf16
    autocast like the vitkit bf16 step, a second reference model when it trains in bf16.
    """
    ours = MemoryEstimator(model_name, size, training=train, precision=precision, device=device)
    theirs = MemoryEstimator(model_name, size, training=train, device=device) if compare is not None else None

    def at(batch: int) -> MemoryEstimate:
        vitkit_run = ours(batch)
        held, steps = [vitkit_run], [vitkit_run.step_bytes]
        if theirs is not None:
            reference = theirs(batch)
            held.append(reference)
            steps.append(reference.step_bytes)
            if precision == "bf16":
                steps.append(vitkit_run.step_bytes)  # the reference under autocast
                if train:
                    held.append(reference)  # its own model and optimizer for autocast training
        return replace(
            vitkit_run,
            weights_bytes=sum(r.weights_bytes for r in held),
            optimizer_bytes=sum(r.optimizer_bytes for r in held),
            step_bytes=max(steps),
        )

    return at


def build_candidates(
    model_name: str,
    batch: int,
    size: tuple[int, int],
    precision: str,
    compile: bool,
    train: bool,
    compare: str | None,
    dev: torch.device,
    optimizer: OptimizerFactory,
) -> dict[str, Candidate]:
    """The steps to time, by candidate name, all on one random batch (see `bench` for the candidates)."""
    config = model_entry(model_name).config
    detector = _check_setting(model_name, train, compare)
    dynamic = size != to_2tuple(config.img_size) and not detector  # detectors take any size as they are
    torch.manual_seed(0)
    model = create_model(model_name, **({"dynamic_img_size": True} if dynamic else {})).to(dev).eval()
    x = torch.randn(batch, config.in_chans, *size, device=dev)
    reference = None
    if compare == "timm":
        reference = _timm_model(model_name, size, dynamic, dev)
        model.load_state_dict(reference.state_dict())  # the same weights: the same work
    elif compare == "transformers":
        reference = _transformers_model(model, dev)
    bf16 = precision == "bf16"
    candidates: dict[str, Candidate] = {}
    if not train:
        with warnings.catch_warnings():  # `vitkit bench` says a slower precision before the run, in its own words
            warnings.simplefilter("ignore", SlowPrecisionWarning)
            fast = optimize(model, precision, compile=compile)
        candidates[f"vitkit {precision}{' compiled' if compile else ''}"] = (precision, _inference_step(fast, x))
        if reference is not None:
            candidates[f"{compare} fp32"] = ("fp32", _inference_step(reference, x))
            if bf16:
                candidates[f"{compare} autocast-bf16"] = ("bf16", _inference_step(reference, x, autocast=True))
        return candidates
    # vitkit's step is the one `vitkit train` runs when given its optimizer; timm's candidates use torch's AdamW
    # with its defaults, as a timm training script does.
    vitkit_optimizer = optimizer(model, lr=1e-4, weight_decay=0.05)
    net = torch.compile(model) if compile else model
    label = f"vitkit {'autocast-bf16' if bf16 else 'fp32'} train{' compiled' if compile else ''}"
    if detector:
        targets = detection_targets(batch, config.num_classes, DETECTION_BOXES, dev)
        candidates[label] = (precision, detection_train_step(net, x, targets, bf16, vitkit_optimizer))
        if reference is not None:
            candidates[f"{compare} fp32 train"] = ("fp32", _transformers_train_step(reference, x, targets, False))
            if bf16:
                second = _transformers_model(model, dev)
                step = _transformers_train_step(second, x, targets, True)
                candidates[f"{compare} autocast-bf16 train"] = ("bf16", step)
        return candidates
    candidates[label] = (precision, _train_step(net, x, config.num_classes, bf16, vitkit_optimizer))
    if reference is not None:
        timm_adamw = torch.optim.AdamW(reference.parameters(), lr=1e-4)
        candidates["timm fp32 train"] = ("fp32", _train_step(reference, x, config.num_classes, False, timm_adamw))
        if bf16:
            timm_bf16 = _timm_model(model_name, size, dynamic, dev)
            timm_adamw = torch.optim.AdamW(timm_bf16.parameters(), lr=1e-4)
            step = _train_step(timm_bf16, x, config.num_classes, True, timm_adamw)
            candidates["timm autocast-bf16 train"] = ("bf16", step)
    return candidates


def time_candidates(
    candidates: dict[str, Candidate], batch: int, flops: int, rounds: int, warmup: int, device: torch.device
) -> tuple[list[Result], dict[str, float]]:
    """Run each candidate's step `warmup` times, then `rounds` times interleaved with the others; returns their
    results (medians; MFU from `flops` per step) and the GEMM rate measured for each precision: the faster of a
    probe before the rounds and one after them, so that a probe caught in a slow moment of a shared machine does
    not make the steps' share of it look larger than it is (a share above 100% was seen on a VM)."""
    precisions = sorted({p for p, _ in candidates.values()})
    rates = {p: gemm_rate(p, device) for p in precisions}
    for _, step in candidates.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, (_, step) in candidates.items():
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    rates = {p: max(rate, gemm_rate(p, device)) for p, rate in rates.items()}
    results = []
    for name, (prec, step) in candidates.items():
        median = statistics.median(times[name])
        results.append(
            Result(
                name=name,
                precision=prec,
                images_per_second=batch / median,
                latency_ms=1000 * median,
                peak_memory_bytes=_peak_memory(step, device),
                time_split=time_split(step) if device.type == "cpu" else {},
                mfu=flops / median / rates[prec],
                times_ms=[1000 * t for t in times[name]],
            )
        )
    return results, rates


def model_step_times(
    model_name: str, batch: int, img_size: int | tuple[int, int] | None, train: bool, device: str = "cpu"
) -> StepTimes:
    """What `--precision auto` decides by where the products favour bf16: the model's own step, fp32 against bf16,
    on random weights and at most 8 random images of the bench's size. Inference: its fp32 and bf16 `optimize`d
    copies' forwards (`vitkit.perf.optimize.time_copies`); training: the forward under autocast or not, and the
    backward of the outputs' sum (`vitkit.analysis.precision.time_training_step`)."""
    config = model_entry(model_name).config
    size = to_2tuple(img_size if img_size is not None else config.img_size)
    detector = family(model_entry(model_name).family).task == DETECTION
    dynamic = size != to_2tuple(config.img_size) and not detector
    torch.manual_seed(0)
    model = create_model(model_name, **({"dynamic_img_size": True} if dynamic else {})).to(device)
    x = torch.randn(min(batch, 8), config.in_chans, *size, device=device)
    if not train:  # the copies `optimize` makes in each precision, on the bench's images
        return time_copies(model.eval(), lambda i: x)[1]
    return time_training_step(model, model, lambda i: x, torch.device(device))


def bench(
    model_name: str,
    batch: int = 16,
    img_size: int | tuple[int, int] | None = None,
    precision: str = "fp32",
    compile: bool = False,
    train: bool = False,
    compare: str | None = None,
    rounds: int = 10,
    warmup: int = 2,
    device: str = "cpu",
    optimizer: OptimizerFactory = adamw,
    allow_memory: bool = False,
    memory_names: SettingNames = MEMORY_NAMES,
) -> Report:
    """Benchmark a registered model, optionally against timm's model of the same name (transformers' for a detector).

    Inference candidates: vitkit `optimize(model, precision, compile)`; with `compare="timm"`: timm fp32 eager,
    and for bf16 also timm under `torch.autocast` (how timm users get bf16). Training candidates (one step is
    forward + backward + AdamW): vitkit in `precision` (bf16 = autocast) with `optimizer`, timm fp32 (and timm
    autocast for bf16) with torch's AdamW at its defaults. A detector's training step is `vitkit train`'s: its set
    criterion on `DETECTION_BOXES` random boxes an image (`detection_targets`); transformers' step is its own loss
    on the same boxes.

    Args:
        model_name: registry name.
        batch: images per step.
        img_size: input size (default: the model's); other sizes use the model's dynamic-size option.
        precision: "fp32" or "bf16".
        compile: `torch.compile` the vitkit candidate (for inference through `optimize`, with frozen weights).
        train: benchmark training steps instead of inference.
        compare: None, "timm" (the classifiers) or "transformers" (the detectors: the transformers class the
            exported config names, e.g. `DeformableDetrForObjectDetection`, with the same weights, fp32 and under
            bf16 autocast).
        rounds: timed steps per candidate (interleaved).
        warmup: untimed steps per candidate first.
        device: "cpu" or "cuda".
        optimizer: builds the vitkit training candidate's optimizer, called as
            ``optimizer(model, lr=..., weight_decay=...)``; `vitkit bench` passes `vitkit.train.create_optimizer`.
        allow_memory: run even when the estimated peak memory of all candidates (`bench_memory`) exceeds the
            memory available; without it that is refused (`vitkit.analysis.NotEnoughMemory`) before any model
            is built.
        memory_names: how a refusal names the settings to change (`vitkit bench` passes its flags).

    A precision slower than fp32 here runs as asked without a warning: `vitkit bench` gives it before the run
    (`vitkit.analysis.precision.slow_precision`).
    """
    precision_dtype(precision)  # ValueError for an unknown precision
    if compare not in COMPARE:
        raise ValueError(f"compare must be one of {COMPARE}, got {compare!r}")
    if batch < 1 or rounds < 1 or warmup < 0:
        raise ValueError(f"need batch >= 1, rounds >= 1, warmup >= 0; got {batch}, {rounds}, {warmup}")
    if compile and warmup == 0:  # the first call compiles: timed, it would be reported as the model's speed
        raise OptionError(
            lambda name: (
                f"{name('compile')} with {name('warmup', 0)} would time torch.compile's compilation as the model's "
                f"first step; give it a warm-up step ({name('warmup', 1)} or more)"
            )
        )
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device")
    config = model_entry(model_name).config
    size = to_2tuple(img_size if img_size is not None else config.img_size)
    _check_setting(model_name, train, compare)
    estimate_at = bench_memory(model_name, size, precision, train, compare, device)
    enforce(estimate_at, batch, allow=allow_memory, names=memory_names)
    candidates = build_candidates(model_name, batch, size, precision, compile, train, compare, dev, optimizer)
    flops = profile(model_name, size, batch).matmul_flops * (3 if train else 1)
    results, rates = time_candidates(candidates, batch, flops, rounds, warmup, dev)
    mode = "train" if train else "inference"
    processor = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_features()
    return Report(model_name, batch, size, mode, str(dev), torch.get_num_threads(), flops, rates, results, processor)
