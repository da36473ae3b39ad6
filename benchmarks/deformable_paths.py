"""Time multi-scale deformable attention's three paths at Deformable DETR's sizes, interleaved, on this machine.

For each case (the encoder's self-attention over every token, the decoder's cross-attention from 300 queries) it
times the sampling and weighted sum alone (`reference_deformable_attention`, `gathered_deformable_attention` and
`levelwise_deformable_attention`, the part the paths differ in) in inference, fp32 and bf16, and forward + backward
in fp32 and under bf16 values, and prints the median milliseconds and the reference's time over each path's.
`MultiScaleDeformableAttention.path` ("auto": the gather for inference, the levelwise path in training) follows
from these numbers.

    python benchmarks/deformable_paths.py --img-size 800x1216 --rounds 5
    python benchmarks/deformable_paths.py --img-size 512x512 --batch 8 --rounds 2 --train-step deformable_detr_resnet50

With `--train-step MODEL` it times that detector's whole training step instead (`vitkit bench --train`'s step: the
set criterion on random boxes, AdamW), on the reference (`math`) and on `auto` (the levelwise path), interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from vitkit import create_model
from vitkit.kernels.deformable import (
    gathered_deformable_attention,
    levelwise_deformable_attention,
    reference_deformable_attention,
)
from vitkit.layers import set_attention_backend
from vitkit.perf.bench import DETECTION_BOXES, adamw, detection_targets, detection_train_step

PATHS = {
    "reference": reference_deformable_attention,
    "gather": gathered_deformable_attention,
    "levelwise": levelwise_deformable_attention,
}
MODES = (
    ("fp32", torch.float32, False),
    ("bf16", torch.bfloat16, False),
    ("fp32 train", torch.float32, True),
    ("bf16 train", torch.bfloat16, True),
)


def level_shapes(height: int, width: int, levels: int = 4) -> list[tuple[int, int]]:
    """The maps of strides 8, 16, 32 and 64 (a stride-2 3x3 convolution for the last), as the ResNet-50 model's."""
    shapes, h, w = [], -(-height // 8), -(-width // 8)
    for _ in range(levels):
        shapes.append((h, w))
        h, w = (h + 1) // 2, (w + 1) // 2
    return shapes


def inputs(
    queries: int | None,
    shapes: list[tuple[int, int]],
    heads: int,
    dim: int,
    points: int,
    dtype: torch.dtype,
    batch: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Values (B, N, h, d), locations (B, Q, h, L, K, 2) around random references, weights (B, Q, h, L, K)."""
    g = torch.Generator().manual_seed(0)
    N = sum(h * w for h, w in shapes)
    Q = N if queries is None else queries
    L, d = len(shapes), dim // heads
    value = torch.randn(batch, N, heads, d, generator=g).to(dtype)
    centre = torch.rand(batch, Q, 1, L, 1, 2, generator=g)
    locations = (centre + 0.02 * torch.randn(batch, Q, heads, L, points, 2, generator=g)).float()
    logits = torch.randn(batch, Q, heads, L * points, generator=g)
    weights = logits.softmax(-1).view(batch, Q, heads, L, points).to(dtype)
    return value, locations, weights


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img-size", default="800x1216", help="HxW of the image (default 800x1216)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--train-step", metavar="MODEL", help="time MODEL's training step on math and auto instead")
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.img_size.split("x"))
    if args.train_step:
        train_step(args.train_step, args.batch, (height, width), args.rounds)
        return 0
    shapes = level_shapes(height, width)
    cases = {"encoder (every token)": None, "decoder (300 queries)": 300}
    print(f"levels {shapes}, 8 heads, d = 32, 4 points, {torch.get_num_threads()} threads; median ms of {args.rounds}")
    print(f"batch {args.batch}")
    print("| case | mode | reference ms | gather ms | levelwise ms | reference / gather | reference / levelwise |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case, queries in cases.items():
        for mode, dtype, train in MODES:
            value, locations, weights = inputs(queries, shapes, 8, 256, 4, dtype, args.batch)
            for t in (value, locations, weights):
                t.requires_grad_(train)

            def step(attend=None, value=value, locations=locations, weights=weights, train=train) -> None:
                with torch.set_grad_enabled(train):
                    out = attend(value, shapes, locations, weights)
                    if train:
                        out.float().square().mean().backward()

            steps = {name: (lambda fn=fn, step=step: step(fn)) for name, fn in PATHS.items()}
            for run in steps.values():  # warm-up
                run()
            times: dict[str, list[float]] = {name: [] for name in steps}
            for _ in range(args.rounds):
                for name, run in steps.items():
                    times[name].append(timed(run))
            ref, gather, levelwise = (1000 * statistics.median(times[name]) for name in PATHS)
            print(
                f"| {case} | {mode} | {ref:.0f} | {gather:.0f} | {levelwise:.0f} | {ref / gather:.2f}x "
                f"| {ref / levelwise:.2f}x |"
            )
    return 0


def train_step(name: str, batch: int, size: tuple[int, int], rounds: int) -> None:
    """Seconds of `name`'s fp32 training step with every deformable layer on the reference and on `auto`."""
    torch.manual_seed(0)
    model = create_model(name)
    x = torch.randn(batch, model.config.in_chans, *size)
    targets = detection_targets(batch, model.config.num_classes, DETECTION_BOXES, x.device)
    step = detection_train_step(model, x, targets, False, adamw(model, lr=1e-4, weight_decay=0.05))
    times: dict[str, list[float]] = {"math": [], "auto": []}
    for backend in times:  # warm-up
        set_attention_backend(model, backend)
        step()
    for _ in range(rounds):
        for backend, seconds in times.items():
            set_attention_backend(model, backend)
            seconds.append(timed(step))
    reference, levelwise = (statistics.median(times[b]) for b in times)
    print(f"{name} training step, batch {batch}, {size[0]}x{size[1]}, fp32, {torch.get_num_threads()} threads")
    print(f"reference (math) {reference:.3f} s, levelwise (auto) {levelwise:.3f} s: {reference / levelwise:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
