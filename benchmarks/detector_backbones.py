"""Deformable DETR on its backbones, side by side: a ResNet-50, Swin-T and DINOv2 ViT-S/14 through ViTDet's simple
feature pyramid. One inference forward (batch 1) and one training step (forward, backward, AdamW; batch 2), at one
image size, fp32 and bf16 (autocast), medians of a few rounds in one process; an inference pass's peak activation
memory from its trace (`vitkit.profile`).

    python benchmarks/detector_backbones.py                      # 640 px, fp32 and bf16
    python benchmarks/detector_backbones.py --img-size 1024 --precisions fp32 --rounds 3
    python benchmarks/detector_backbones.py --img-size 1024 --models deformable_detr_vit_small_dinov2 \
        deformable_detr_vit_small_dinov2@global                  # windowed against all-global attention

A name ending in "@global" is the variant with its ViT's windows turned off (every block attends over all patches).

The figures behind BENCHMARKS.md's "Transformer backbones for the detectors".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import vitkit
from vitkit.analysis import profile

MODELS = ("deformable_detr_resnet50", "deformable_detr_swin_tiny", "deformable_detr_vit_small_dinov2")


def timed(step, rounds: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img-size", type=int, default=640)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    size = (args.img_size, args.img_size)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, images {size[0]}x{size[1]}")
    print(f"{'model':40} {'prec':5} {'params':>11} {'GFLOPs':>8} {'infer s':>8} {'train s':>8} {'act MiB':>9}")
    for name in args.models:
        registered, _, option = name.partition("@")
        fields = {"backbone_args": {}} if option == "global" else {}  # the ViT's own fields: no windows
        model = vitkit.create_model(registered, img_size=size, **fields)
        report = profile(model, size, batch=1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x1, x2 = torch.randn(1, 3, *size), torch.randn(2, 3, *size)
        for precision in args.precisions:
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32

            def infer(x1=x1, dtype=dtype, model=model):
                model.eval()
                with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                    model(x1)

            def train(x2=x2, dtype=dtype, model=model, optimizer=optimizer):
                model.train()
                with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                    out = model(x2)
                loss = out["pred_logits"].float().sigmoid().mean() + out["pred_boxes"].float().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            infer_s, train_s = timed(infer, args.rounds), timed(train, args.rounds)
            peak = profile(model, size, batch=1, dtype=dtype).activation_bytes / 2**20  # inference, from the trace
            print(
                f"{name:40} {precision:5} {report.params:>11,} {report.flops / 1e9:>8.1f} {infer_s:>8.2f} "
                f"{train_s:>8.2f} {peak:>9.0f}"
            )


if __name__ == "__main__":
    main()
