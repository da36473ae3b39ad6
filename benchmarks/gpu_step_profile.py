"""Where a bf16 training step's time goes on a GPU: `torch.profiler` (CPU and CUDA) over a few steps of `vitkit
bench`'s training candidates, after warm-ups: the operators by host time and by device time, then the calls that
make the host wait or copy (synchronisations, copies, `.item()`, `nonzero`).

    python benchmarks/gpu_step_profile.py                                  # DETR-R50, batch 8 at 512 px
    python benchmarks/gpu_step_profile.py --model vit_base_patch16_224 --batch 64 --img-size 224 --compare timm

The figures behind BENCHMARKS.md's "On a GPU" (what bounds DETR-R50's training step).
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
    args = parser.parse_args()
    device = torch.device("cuda")
    compare = None if args.compare == "none" else args.compare
    size = (args.img_size, args.img_size)
    candidates = build_candidates(args.model, args.batch, size, "bf16", False, True, compare, device, adamw)
    for name, (_, step) in candidates.items():
        if "fp32" in name:
            continue
        try:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(args.steps):
                    step()
                torch.cuda.synchronize()
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


if __name__ == "__main__":
    main()
