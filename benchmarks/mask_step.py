"""What the mask head adds to a training step of the default detector: the same batches of a detection folder through
the task's own step (model, matcher, criterion, backward, the run's AdamW), with the head (`masks=True`) and without,
interleaved in one process; then `torch.profiler` on the step with the head, the forward of each mask part.

    python benchmarks/mask_step.py --data ~/shapes            # `vitkit example-data shapes --out ~/shapes`
    python benchmarks/mask_step.py --data ~/shapes --rounds 8 --batches 12

Prints each variant's median milliseconds a step (two images, the recipe's batch on 2 cores) and the mask parts'
forward milliseconds; the figures behind BENCHMARKS.md's "Instance masks" step rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from vitkit.data import load_detection
from vitkit.data.coco import COCO_AUGMENT
from vitkit.detection import collate_detection, criterion, matcher
from vitkit.models import query_masks
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistEnv
from vitkit.train.loop import build_training_model
from vitkit.train.optim import create_optimizer
from vitkit.train.task import create_task

PARTS = (  # (module, function): the mask parts timed by name, where the training step calls them
    (criterion, "mask_pair_losses"),
    (matcher, "mask_costs"),
    (criterion, "canvas_masks"),
    (matcher, "canvas_masks"),
)


def training_step(data: str, with_masks: bool) -> Callable[[Any], None]:
    """The task's step of the default detector on `data`, with the mask head or without."""
    config = TrainConfig(data=data, model_args={"masks": with_masks}, out="/tmp/unused").resolved()
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_group=False)
    task = create_task(config, env)
    torch.manual_seed(0)
    net = task.prepare(build_training_model(config, task.num_classes)).train()
    optimizer = create_optimizer(net, config.lr, config.weight_decay, backbone_lr=config.backbone_lr)

    def step(batch: Any) -> None:
        loss, _, _ = task.train_loss(net, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def named(module: Any, name: str) -> None:
    """`module.name` run under a profiler label of its name."""
    function = getattr(module, name)

    def labelled(*args: Any, **kwargs: Any) -> Any:
        with record_function(f"mask part: {name}"):
            return function(*args, **kwargs)

    setattr(module, name, labelled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a COCO-format folder whose annotations have segmentations")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    train, _, _ = load_detection(args.data, img_size=128, augment=COCO_AUGMENT)
    batches = [collate_detection([train[(2 * i, i, i)], train[(2 * i + 1, i + 1000, i)]]) for i in range(args.batches)]
    steps = {"with the mask head": training_step(args.data, True), "boxes only": training_step(args.data, False)}
    for step in steps.values():
        for batch in batches[:3]:
            step(batch)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):  # interleaved: each round runs every variant
        for name, step in steps.items():
            started = time.perf_counter()
            for batch in batches:
                step(batch)
            times[name].append((time.perf_counter() - started) / len(batches) * 1000)
    for name in steps:
        print(f"{name:<20} {statistics.median(times[name]):6.1f} ms a step (rounds: {times[name][0]:.1f} ...)")

    for module, name in PARTS:
        named(module, name)
    pixels, products = query_masks.QueryMasks.pixels, query_masks.QueryMasks.forward

    def labelled_pixels(self: Any, *args: Any) -> Any:
        with record_function("mask part: pixel embeddings"):
            return pixels(self, *args)

    def labelled_products(self: Any, *args: Any) -> Any:
        with record_function("mask part: mask embeddings and products"):
            return products(self, *args)

    query_masks.QueryMasks.pixels, query_masks.QueryMasks.forward = labelled_pixels, labelled_products
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            steps["with the mask head"](batch)
    for event in sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total):
        if event.key.startswith("mask part: "):
            print(f"  {event.key[11:]:<40} forward {event.cpu_time_total / len(batches) / 1000:5.2f} ms a step")


if __name__ == "__main__":
    main()
