"""Page faults per inference step: vitkit's `optimize(model, "bf16")` against timm under bf16 autocast.

    python benchmarks/faults.py vit_base_patch16_224     # default: swin_tiny_patch4_window7_224
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 python benchmarks/faults.py MODEL

Each candidate runs in a process of its own (one process's allocator history would colour the other's), and the
script prints the median step time and the median count of minor page faults a step takes, with the memory they
stand for (4 KiB each). glibc hands large freed blocks back to the system and takes them again with page faults on
the next step; the second command keeps them (the figures behind "The allocator and the ratios" in BENCHMARKS.md).
timm is needed for its candidate (`make test` installs it).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

import torch


def measure(model_name: str, candidate: str, batch: int, rounds: int) -> tuple[float, float]:
    """(median seconds, median minor page faults) of one step of `candidate` ("vitkit" or "timm")."""
    torch.manual_seed(0)
    x = torch.randn(batch, 3, 224, 224)
    if candidate == "vitkit":
        import vitkit

        fast = vitkit.optimize(vitkit.create_model(model_name).eval(), "bf16")

        def step() -> object:
            return fast(x)
    else:
        import timm

        model = timm.create_model(model_name).eval()

        def step() -> object:
            with torch.autocast("cpu", torch.bfloat16):
                return model(x)

    times, faults = [], []
    with torch.inference_mode():
        step(), step()  # warm-up
        for _ in range(rounds):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(times), statistics.median(faults)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="swin_tiny_patch4_window7_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--candidate", choices=("vitkit", "timm"), help=argparse.SUPPRESS)  # one child's share
    args = parser.parse_args()
    if args.candidate:
        seconds, faults = measure(args.model, args.candidate, args.batch, args.rounds)
        memory = f"{faults * 4 / 1024:.0f} MiB"
        print(f"{args.candidate:8s} {1000 * seconds:8.1f} ms/step  {faults:8.0f} faults/step ({memory})")
        return
    for candidate in ("vitkit", "timm"):
        command = [sys.executable, __file__, args.model, "--batch", str(args.batch), "--rounds", str(args.rounds)]
        subprocess.run([*command, "--candidate", candidate], check=True)


if __name__ == "__main__":
    main()
