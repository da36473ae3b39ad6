"""The GPU check, one prepared run for the day a GPU machine is there (under 8 minutes on one GPU):

1. every attention backend agrees with the reference (`math`, the formula) on ViT, Swin, DETR and Deformable DETR,
   forward and backward (every parameter's gradient): in float64 within 1e-10 of the formula in float64 (a wrong
   mask, index or scale shows there, whatever rounding hides); in fp32 (TF32 off) within 1e-4 of the formula in
   fp32, or within the formula's own fp32 error against float64 where that is larger (two fp32 computations of
   one formula honestly differ by that much; it is printed beside each fp32 row); under bf16 autocast no further
   off than the formula itself computed in bf16 (times 1.5);
2. `capture_attention` works with the fused kernels on: the recorded maps are the reference's and the output is
   the one computed without capturing;
3. speed against the libraries users compare with: ViT-B/16 against timm and DETR-R50 against transformers,
   inference and a training step, in bf16 (img/s, peak memory, the share of the GPU's bf16 GEMM rate measured in
   the same run), with `vitkit.perf.bench` (interleaved rounds, medians).

    bash benchmarks/gpu.sh                       # on the GPU machine: this script, --device cuda
    python benchmarks/gpu.py --dry-run           # on CPU: tiny models and sizes, the same code (about a minute)

Prints one line per check and a table per benchmark; `--out FILE` writes all of it as JSON. Exits 1 when a check
fails. The rows go to BENCHMARKS.md ("On a GPU").
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import vitkit
from vitkit.kernels.policy import knows
from vitkit.layers import (
    Attention,
    attention_backend,
    attention_layers,
    set_attention_backend,
)
from vitkit.perf import bench as bench_module


@dataclass(frozen=True)
class Case:
    name: str  # registered model
    overrides: dict  # create_model overrides
    img_size: int
    batch: int


# What each check runs: at full size on a GPU, shrunk on CPU for the dry run.
CHECKS = {
    False: [
        Case("vit_base_patch16_224", {}, 224, 4),
        Case("swin_tiny_patch4_window7_224", {}, 224, 4),
        Case("detr_resnet50", {}, 512, 2),
        Case("deformable_detr_resnet50", {}, 512, 2),
    ],
    True: [
        Case("vit_tiny_patch16_224", {"depth": 2, "img_size": 32}, 32, 2),
        Case(
            "swin_tiny_patch4_window7_224",
            {"depths": (1, 1, 1, 1), "embed_dim": 24, "num_heads": (1, 2, 3, 6), "img_size": 64, "window_size": 4},
            64,
            2,
        ),
        Case("detr_tiny", {}, 96, 2),
        Case("deformable_detr_small", {}, 96, 2),
    ],
}
# (model, batch, image size, compare with) for the speed rows.
SPEED = {
    False: [("vit_base_patch16_224", 64, 224, "timm"), ("detr_resnet50", 8, 512, "transformers")],
    True: [("vit_tiny_patch16_224", 2, 64, "timm"), ("detr_tiny", 2, 96, "transformers")],
}
TOLERANCE = {"float64": 1e-10, "fp32": 1e-4}  # |a - b| / |b| of the output and all gradients against the formula


def _moved(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights moved off their initial values (init symmetries hide wrong masks and norms)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator).to(p.device, p.dtype))
    return model


def _calibrate_norms(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Set each batch norm's running statistics (a detector's frozen backbone norms) to its input's statistics on
    `x`, in order: a random ResNet with unit statistics multiplies its activations stage after stage (DETR-R50's
    encoder logits reach 1e14), where no comparison means anything; a trained backbone keeps them of order 10."""
    norms = [m for m in model.modules() if isinstance(getattr(m, "running_var", None), torch.Tensor)]

    def calibrate(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        (x,) = inputs
        module.running_mean.copy_(x.mean((0, 2, 3)))
        module.running_var.copy_(x.var((0, 2, 3)))

    handles = [m.register_forward_pre_hook(calibrate) for m in norms]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()


def _scalar(outputs: object) -> torch.Tensor:
    """One number from a classifier's logits or a detector's dict of predictions, every output taking part."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().square().mean()
    if isinstance(outputs, dict):
        return sum(_scalar(v) for v in outputs.values() if isinstance(v, (torch.Tensor, dict, list)))
    if isinstance(outputs, list):
        return sum(_scalar(v) for v in outputs)
    raise TypeError(type(outputs).__name__)


def _run(model: torch.nn.Module, x: torch.Tensor, precision: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, torch.bfloat16, enabled=precision == "bf16"):
        out = _scalar(model(x))
    out.backward()
    grads = [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
    return out.detach().float(), grads


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _distance(
    run: tuple[torch.Tensor, list[torch.Tensor]], reference: tuple[torch.Tensor, list[torch.Tensor]]
) -> float:
    """The larger relative gap of the output and of the gradients, taken as one vector: a parameter whose gradient
    is nearly zero (DETR's first decoder self-attention sees zero queries) makes a per-parameter ratio meaningless."""
    (out, grads), (ref_out, ref_grads) = run, reference
    if len(grads) != len(ref_grads):
        return float("inf")
    flat = torch.cat([g.flatten() for g in grads])
    return max(_gap(out, ref_out), _gap(flat, torch.cat([r.flatten() for r in ref_grads])))


def _knows(model: torch.nn.Module, backend: str) -> bool:
    """Whether some attention layer of `model` has `backend` (dense layers "sdpa", deformable ones "gather" and
    "levelwise")."""
    return any(knows(backend, deformable=not isinstance(x, Attention)) for _, x in attention_layers(model))


def check_backends(case: Case, device: torch.device) -> list[dict]:
    """Each backend against `math`, forward and backward, in fp32 and bf16: the largest relative gap."""
    torch.manual_seed(0)
    # eval mode: dropout and stochastic depth would differ from call to call; gradients flow all the same
    model = _moved(vitkit.create_model(case.name, **case.overrides)).to(device).eval()
    x = torch.randn(case.batch, model.config.in_chans, case.img_size, case.img_size, device=device)
    _calibrate_norms(model, x)
    rows = []
    set_attention_backend(model, "math")
    reference = _run(model, x, "fp32")  # the formula in fp32: the reference of both precisions
    exact = copy.deepcopy(model).double()
    reference64 = _run(exact, x.double(), "fp32")  # the formula in float64
    # the formula's own rounding in fp32, against float64: how far two fp32 computations of the same formula may
    # honestly differ (a detector's backward through a random ResNet amplifies it to 1e-2)
    fp32_error = _distance(reference, reference64)
    backends = [b for b in ("sdpa", "gather", "levelwise", "auto") if b == "auto" or _knows(model, b)]
    for precision in ("float64", "fp32", "bf16"):
        if precision == "float64":  # each backend against the formula, both exact to 1e-16: a wrong mask or index
            allowed = TOLERANCE["float64"]  # shows here, whatever the fp32 rounding hides
        elif precision == "fp32":  # no further from the formula than the formula in fp32 is from float64
            allowed = max(TOLERANCE["fp32"], fp32_error)
        else:  # bf16 is held to the formula's own error in bf16: no backend may lose more than it does
            allowed = 1.5 * _distance(_run(model, x, "bf16"), reference)
        for backend in backends:
            net, inputs, against = (exact, x.double(), reference64) if precision == "float64" else (model, x, reference)
            with attention_backend(net, backend):  # the layers that do not know it stay on the reference
                gap = _distance(_run(net, inputs, precision), against)
            row = {"check": "backends", "model": case.name, "precision": precision, "backend": backend, "gap": gap}
            if precision == "fp32":
                row["fp32_error"] = fp32_error
            rows.append({**row, "allowed": allowed, "ok": gap <= allowed})
    set_attention_backend(model, "auto")
    return rows


def check_capture(case: Case, device: torch.device) -> dict:
    """`capture_attention` with the fast paths on: the maps equal the reference's, the output is unchanged."""
    torch.manual_seed(0)
    model = _moved(vitkit.create_model(case.name, **case.overrides)).to(device).eval()
    x = torch.randn(case.batch, model.config.in_chans, case.img_size, case.img_size, device=device)
    _calibrate_norms(model, x)
    with torch.no_grad():
        set_attention_backend(model, "math")
        with vitkit.capture_attention(model) as reference:
            model(x)
        set_attention_backend(model, "auto")
        plain = model(x)
        with vitkit.capture_attention(model) as maps:
            captured = model(x)
    gap = max(_gap(maps[name], reference[name]) for name in reference)
    rows_sum = max((maps[name].sum(-1) - 1).abs().max().item() for name in maps)
    output_gap = _gap(captured, plain)
    ok = list(maps) == list(reference) and gap <= 1e-4 and rows_sum <= 1e-4 and output_gap <= 1e-5
    return {
        "check": "capture",
        "model": case.name,
        "layers": len(maps),
        "gap": gap,
        "rows_sum": rows_sum,
        "output_gap": output_gap,
        "ok": ok,
    }


def speed(dry_run: bool, device: str, rounds: int) -> list[dict]:
    reports = []
    full_rate = bench_module.gemm_rate
    if dry_run:  # small GEMMs for the rate: a 2048^3 bf16 product takes a minute on a CPU without bf16 units
        bench_module.gemm_rate = functools.partial(full_rate, n=256, repeats=2, min_seconds=0)
    try:
        for name, batch, size, compare in SPEED[dry_run]:
            for train in (False, True):
                try:
                    report = bench_module.bench(
                        name,
                        batch=batch,
                        img_size=size,
                        precision="bf16",
                        train=train,
                        compare=compare,
                        rounds=rounds,
                        warmup=1 if dry_run else 3,
                        device=device,
                    )
                except Exception as err:  # printed; the other benchmarks still run
                    print(f"\n{name} {'train' if train else 'inference'}: {err!r}", flush=True)
                    continue
                print_table(report)
                reports.append(report.to_dict())
    finally:
        bench_module.gemm_rate = full_rate  # the dry run leaves vitkit bench as it found it
    return reports


def print_table(report: bench_module.Report) -> None:
    rate = report.gemm_flops_per_second["bf16"] / 1e12
    print(
        f"\n{report.model} {report.mode}, batch {report.batch}, {report.img_size[0]}x{report.img_size[1]}, "
        f"{report.device}, bf16 GEMM rate {rate:.1f} TFLOP/s"
    )
    print("| candidate | img/s | ms/step | peak MiB | share of the bf16 GEMM rate |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in report.results:
        share = r.mfu * report.gemm_flops_per_second[r.precision] / report.gemm_flops_per_second["bf16"]
        print(
            f"| {r.name} | {r.images_per_second:.1f} | {r.latency_ms:.1f} | {r.peak_memory_bytes / 2**20:.0f} | "
            f"{100 * share:.1f}% |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny models and sizes on CPU: the code, not the GPU")
    parser.add_argument("--device", default=None, help="cuda (default) or cpu (the default with --dry-run)")
    parser.add_argument("--rounds", type=int, default=None, help="timed steps per candidate (default 10; 1 dry)")
    parser.add_argument("--skip-speed", action="store_true", help="the checks only")
    parser.add_argument("--out", type=Path, default=None, help="write every row as JSON here")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device: run on the GPU machine, or pass --dry-run", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 checks compare true fp32 products
        torch.backends.cudnn.allow_tf32 = False
        print(torch.cuda.get_device_name(device), "torch", torch.__version__)
    cases = CHECKS[args.dry_run]
    rows = []
    checks = [(case, functools.partial(check_backends, case, device)) for case in cases]
    checks.append((cases[0], lambda: [check_capture(cases[0], device)]))
    for case, check in checks:
        try:
            new = check()
        except Exception as err:  # one model's error is its failed row, printed; the run goes on to the next
            new = [{"check": "error", "model": case.name, "gap": float("nan"), "ok": False, "error": repr(err)}]
        for row in new:  # printed as they come, so that a run stopped early still shows its rows
            detail = row.get("error") or f"{row.get('precision', '')} {row.get('backend', '')}".strip()
            allowed = f" (allowed {row['allowed']:.2e})" if "allowed" in row else ""
            if "fp32_error" in row:
                allowed += f"; the formula's fp32 error against float64 {row['fp32_error']:.2e}"
            print(
                f"{'ok  ' if row['ok'] else 'FAIL'} {row['check']:<8} {row['model']:<30} {detail:<12} "
                f"gap {row['gap']:.2e}{allowed}",
                flush=True,
            )
        rows += new
    reports = [] if args.skip_speed else speed(args.dry_run, device.type, args.rounds or (1 if args.dry_run else 10))
    if args.out is not None:
        args.out.write_text(json.dumps({"device": str(device), "checks": rows, "speed": reports}, indent=2))
    failed = [row for row in rows if not row["ok"]]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
