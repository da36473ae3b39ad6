"""What each speed change of vitkit is worth: variants of one model, interleaved in one process, medians.

    python benchmarks/ablate.py            # optimize(model, "bf16"): packed linears on/off x attention sdpa/auto
    python benchmarks/ablate.py --train    # bf16 autocast training step: attention sdpa/auto x AdamW loop/fused
    python benchmarks/ablate.py --model detr_resnet50 --batch 1 --img-size 800x1216 --rounds 4
                                           # a detector: fp32 and optimize bf16, backbone channels-last on/off x
                                           # frozen norms folded on/off

The figures behind the "predicted and measured" table of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import vitkit
from vitkit.layers import set_attention_backend, to_2tuple
from vitkit.models.registry import DETECTION, family_of
from vitkit.train.optim import create_optimizer, param_groups


def inference_variants(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    optimize_module = sys.modules["vitkit.perf.optimize"]  # `vitkit.perf.optimize` is the function
    supported = optimize_module.packed_linear_supported
    variants = {}
    try:
        for pack in (False, True):
            optimize_module.packed_linear_supported = supported if pack else (lambda: False)
            for backend in ("sdpa", "auto"):
                fast = vitkit.optimize(model, "bf16")
                set_attention_backend(fast.model, backend)
                variants[f"packed linears={pack}, attention={backend}"] = lambda fast=fast: fast(x)
    finally:
        optimize_module.packed_linear_supported = supported
    return variants


def train_variants(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    target = torch.randint(0, model.config.num_classes, (x.shape[0],))
    variants = {}
    for backend in ("sdpa", "auto"):
        for fused in (False, True):
            net = set_attention_backend(copy.deepcopy(model).train(), backend)
            if fused:
                optimizer = create_optimizer(net, 1e-4, 0.05)
            else:
                optimizer = torch.optim.AdamW(param_groups(net, 0.05), lr=1e-4, foreach=False)

            def step(net: nn.Module = net, optimizer: torch.optim.Optimizer = optimizer) -> None:
                with torch.autocast("cpu", torch.bfloat16):
                    loss = nn.functional.cross_entropy(net(x), target)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            variants[f"attention={backend}, fused AdamW={fused}"] = step
    return variants


def detector_variants(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    variants = {}
    for precision in ("fp32", "bf16"):
        for channels_last in (False, True):
            for fold in (False, True):
                net = copy.deepcopy(model)
                if not fold:
                    net.backbone.fold_norms = lambda: 0  # optimize() then leaves the frozen norms in place
                fast = vitkit.optimize(net, precision)
                if not channels_last:
                    fast.model.backbone.forward = _nchw(fast.model.backbone)
                variants[f"{precision}, channels-last={channels_last}, folded norms={fold}"] = lambda f=fast: f(x)
    return variants


def _nchw(backbone: nn.Module) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The backbone's forward on NCHW images (the detector hands it channels-last ones)."""
    forward = backbone.forward
    return lambda images: forward(images.contiguous())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--img-size", default=None, help="HxW (default: the model's)")
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = vitkit.create_model(args.model).eval()
    size = args.img_size.split("x") if args.img_size else to_2tuple(model.config.img_size)
    x = torch.randn(args.batch, 3, *map(int, size))
    if family_of(model).task == DETECTION:
        variants = detector_variants(model, x)
    else:
        variants = (train_variants if args.train else inference_variants)(model, x)
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.inference_mode(not args.train):
        for step in variants.values():
            step(), step()  # warm-up
        for _ in range(args.rounds):
            for name, step in variants.items():
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name:45s} {1000 * statistics.median(values):8.1f} ms")


if __name__ == "__main__":
    main()
