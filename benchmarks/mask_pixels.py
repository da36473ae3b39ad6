"""What the mask head's pixel path costs: vitkit's (RF-DETR's block: a depthwise 3x3 convolution, LayerNorm, a linear
layer and GELU, added to its input) against Mask DINO's (a full 3x3 convolution, GroupNorm, ReLU and a 1x1
convolution), both on the encoder's finest level bilinearly upsampled to stride 4, interleaved in one process.

    python benchmarks/mask_pixels.py            # forward and backward of the pixel path alone, and a training
                                                # step of deformable_detr_small with masks, 2 images of 128x144
    python benchmarks/mask_pixels.py --rounds 5

Prints each one's median milliseconds and its FLOPs (torch's counter); the figures behind BENCHMARKS.md's
"Instance masks" pixel-path rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitkit.detection import SetCriterion
from vitkit.models import create_model


class MaskDinoPixels(nn.Module):
    """Mask DINO's pixel path at stride 4 (its pixel decoder's last 3x3 convolution and mask-feature projection)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv, self.norm, self.proj = (
            nn.Conv2d(dim, dim, 3, padding=1),
            nn.GroupNorm(32, dim),
            nn.Conv2d(dim, dim, 1),
        )

    def forward(self, finest: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        x = F.interpolate(finest, size=size, mode="bilinear", align_corners=False)
        return self.proj(F.relu(self.norm(self.conv(x))))


def timed(fn: Callable[[], object], rounds: int, repeats: int) -> list[float]:
    return [_once(fn, repeats) for _ in range(rounds)]


def _once(fn: Callable[[], object], repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1000


def flops(fn: Callable[[], object]) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def pixel_paths(variants: dict[str, Callable], finest: torch.Tensor, size: tuple[int, int], rounds: int) -> None:
    """Print each pixel path's median forward and backward, interleaved, and its forward FLOPs."""

    def step(pixels: Callable) -> Callable[[], None]:
        return lambda: pixels(finest, size).square().mean().backward()

    steps = {name: step(pixels) for name, pixels in variants.items()}
    for run in steps.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):  # interleaved: each round runs every variant
        for name, run in steps.items():
            times[name] += timed(run, 1, 10 if finest.shape[-1] < 50 else 2)
    for name, pixels in variants.items():
        with torch.no_grad():
            count = flops(lambda pixels=pixels: pixels(finest.detach(), size))
        median = statistics.median(times[name])
        print(f"  {name:<28} forward+backward {median:7.2f} ms, forward {count / 1e9:.2f} GFLOP")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = create_model("deformable_detr_small", masks=True, num_classes=4)
    dim = model.config.hidden_dim
    ours, theirs = model.mask_head, MaskDinoPixels(dim)
    variants = {"vitkit (depthwise block)": ours.pixels, "Mask DINO (3x3 conv + 1x1)": theirs.forward}
    for label, finest, size in (
        ("pixel path, 2 x (128, 16x18) -> 32x36", torch.randn(2, dim, 16, 18), (32, 36)),
        ("pixel path, 1 x (128, 100x152) -> 200x304 (an 800x1216 image)", torch.randn(1, dim, 100, 152), (200, 304)),
    ):
        print(label)
        pixel_paths(variants, finest.requires_grad_(), size, args.rounds)

    images = torch.randn(2, 3, 128, 144)
    targets = [
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.2]]),
         "masks": torch.rand(2, 128, 144) > 0.5}
        for _ in range(2)
    ]  # fmt: skip
    criterion = SetCriterion(
        4, classification="focal", no_object_logit=False
    )  # as training the detector, less denoising
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    original = ours.pixels

    def step() -> None:
        loss = criterion(model(images), targets)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def with_pixels(pixels: Callable) -> Callable[[], None]:
        def run() -> None:
            ours.pixels = pixels
            try:
                step()
            finally:
                ours.pixels = original

        return run

    model.train()
    steps = {name: with_pixels(pixels) for name, pixels in variants.items()}
    for run in steps.values():
        run()
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, run in steps.items():
            times[name] += timed(run, 1, 10)
    print("training step of deformable_detr_small with masks, 2 images of 128x144")
    for name in steps:
        print(f"  {name:<28} {statistics.median(times[name]):7.2f} ms")


if __name__ == "__main__":
    main()
