"""Where a bf16 (or `--precision fp32`) training step's time goes on a GPU (or `--device cpu`): `torch.profiler`
(CPU and CUDA) over a few steps of `vitkit bench`'s training candidates, after warm-ups: the operators by host time
and by device time, then the calls that make the host wait or copy (synchronisations, copies, `.item()`,
`nonzero`); for vitkit's detection step, the host time and kernel launches of each part (model, criterion,
backward, optimizer).

    python benchmarks/gpu_step_profile.py                                  # DETR-R50, batch 8 at 512 px
    python benchmarks/gpu_step_profile.py --model vit_base_patch16_224 --batch 64 --img-size 224 --compare timm
    python benchmarks/gpu_step_profile.py --model deformable_detr_small --batch 2 --img-size 128 --compare none \
        --device cpu --precision fp32                                      # the default detector's step on a CPU

The figures behind BENCHMARKS.md's "On a GPU" (what bounds DETR-R50's training step) and the default detector's step
on a CPU ("Detection from scratch").
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from vitkit.perf.bench import adamw, build_candidates

WAITS = ("Synchronize", "Memcpy", "aten::item", "aten::_local_scalar_dense", "aten::nonzero")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="detr_resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--img-size", type=int, default=512)
    parser.add_argument("--compare", default="transformers", help="timm, transformers or none")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps, after as many warm-ups")
    parser.add_argument("--device", default="cuda", help="cuda; cpu for a try of the script (no launches there)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"), help="the candidates profiled")
    args = parser.parse_args()
    device = torch.device(args.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    compare = None if args.compare == "none" else args.compare
    size = (args.img_size, args.img_size)
    candidates = build_candidates(args.model, args.batch, size, args.precision, False, True, compare, device, adamw)
    for name, (precision, step) in candidates.items():
        if precision != args.precision:
            continue
        try:
            for _ in range(args.steps):
                step()
            synchronize()
            with profile(activities=activities) as prof:
                for _ in range(args.steps):
                    step()
                synchronize()
        except Exception as err:  # printed; the next candidate still runs
            print(f"===== {name}: {err!r}", flush=True)
            continue
        averages = prof.key_averages()
        print(f"===== {name}: {args.steps} steps", flush=True)
        print(averages.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=55))
        print(averages.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=55))
        for event in averages:
            if any(key in event.key for key in WAITS):
                print(f"{event.key}: {event.count / args.steps:.0f} a step, {event.self_cpu_time_total / 1e3:.1f} ms")
        print_parts(prof.events(), args.steps)


PARTS = ("model", "criterion", "backward", "optimizer")  # `vitkit.perf.bench.detection_train_step`'s ranges


def print_parts(events: list, steps: int) -> None:
    """Host milliseconds and kernel launches a step of each part the step names (`PARTS`); launches from the
    autograd engine's own thread fall outside the ranges and are counted as "backward (engine)"."""
    spans = {part: [e for e in events if e.name == part] for part in PARTS}
    if not any(spans.values()):
        return
    launches = dict.fromkeys([*PARTS, "backward (engine)", "elsewhere"], 0)
    for event in events:
        if "LaunchKernel" not in event.name:
            continue
        parent, part = event.cpu_parent, None
        while parent is not None and part is None:
            part = parent.name if parent.name in PARTS else None
            engine = parent.name.startswith("autograd::engine")
            parent = parent.cpu_parent
            if engine and part is None:
                part = "backward (engine)"
        launches[part or "elsewhere"] += 1
    for part, found in spans.items():
        host = sum(e.cpu_time_total for e in found) / 1e3 / steps
        print(f"{part}: host {host:.1f} ms a step, {launches[part] / steps:.0f} launches")
    for part in ("backward (engine)", "elsewhere"):
        print(f"{part}: {launches[part] / steps:.0f} launches")


if __name__ == "__main__":
    main()
