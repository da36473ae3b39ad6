"""What the mask head adds to a training step of the default detector: the batches of a detection folder as training
draws them (the task's own loader: a new size nearly every step, as in training, so oneDNN sets up its kernels as
often as there) through the task's own step (model, matcher, criterion, backward, the run's AdamW), with the head
(`masks=True`) and without, the variant that runs first rotating from batch to batch; then `torch.profiler` on the
step with the head, the forward of each mask part.

    python benchmarks/mask_step.py --data ~/shapes            # `vitkit example-data shapes --out ~/shapes`
    python benchmarks/mask_step.py --data ~/shapes --steps 150

Prints each variant's mean milliseconds a step (two images, the recipe's batch on 2 cores), split into the model's
forward, the criterion (matching and losses), the backward and the optimizer, and the mask parts' forward
milliseconds; the figures behind BENCHMARKS.md's "Instance masks" step rows.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from vitkit.detection import criterion, matcher
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


PHASES = ("forward", "criterion", "backward", "optimizer")


class Clock:
    """Seconds of each phase of the steps timed, per variant; the criterion's timed inside the task's loss."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, list[float]]] = {}
        self.variant: str | None = None
        forward = criterion.SetCriterion.forward

        def timed(module: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            out = forward(module, *args, **kwargs)
            if self.variant is not None:
                self.seconds[self.variant]["criterion"][-1] += time.perf_counter() - started
            return out

        criterion.SetCriterion.forward = timed

    def start(self, variant: str) -> None:
        self.variant = variant
        phases = self.seconds.setdefault(variant, {phase: [] for phase in PHASES})
        for times in phases.values():
            times.append(0.0)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[self.variant][phase][-1] += seconds

    def mean_ms(self, variant: str, phase: str, skip: int) -> float:
        times = self.seconds[variant][phase][skip:]
        return sum(times) / max(len(times), 1) * 1000


def training_step(data: str, with_masks: bool, clock: Clock) -> tuple[Callable[[Any], None], Any]:
    """The task's step of the default detector on `data`, with the mask head or without, and its task."""
    config = TrainConfig(data=data, model_args={"masks": with_masks}, out="/tmp/unused").resolved()
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_group=False)
    task = create_task(config, env)
    torch.manual_seed(0)
    net = task.prepare(build_training_model(config, task.num_classes)).train()
    optimizer = create_optimizer(net, config.lr, config.weight_decay, backbone_lr=config.backbone_lr)

    def step(batch: Any) -> None:
        started = time.perf_counter()
        loss, _, _ = task.train_loss(net, batch)
        clock.add("forward", time.perf_counter() - started)  # the criterion's share taken out when printed
        started = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        clock.add("backward", time.perf_counter() - started)
        started = time.perf_counter()
        optimizer.step()
        clock.add("optimizer", time.perf_counter() - started)

    return step, task


def loader_batches(task: Any, count: int) -> list[Any]:
    """The first `count` batches the task's training loader gives, epoch after epoch."""
    batches: list[Any] = []
    epoch = 0
    while len(batches) < count:
        task.set_epoch(epoch, 0)
        epoch += 1
        for batch in task.train_loader:
            batches.append(batch)
            if len(batches) == count:
                break
    return batches


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
    parser.add_argument("--steps", type=int, default=150, help="batches each variant trains on (default: an epoch)")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the means (warm-up)")
    args = parser.parse_args()
    clock = Clock()
    steps, tasks = {}, {}
    for name, with_masks in (("with the mask head", True), ("boxes only", False)):
        steps[name], tasks[name] = training_step(args.data, with_masks, clock)
    batches = loader_batches(tasks["with the mask head"], args.steps)  # both variants read them (boxes only: no masks)
    names = list(steps)
    for i, batch in enumerate(batches):  # the variant that runs first on a new size rotates
        for name in names[i % len(names) :] + names[: i % len(names)]:
            clock.start(name)
            steps[name](batch)
    clock.variant = None
    for name in names:
        parts = {phase: clock.mean_ms(name, phase, args.skip) for phase in PHASES}
        parts["forward"] -= parts["criterion"]
        total = sum(parts.values())
        split = ", ".join(f"{phase} {ms:.1f}" for phase, ms in parts.items())
        print(f"{name:<20} {total:6.1f} ms a step ({split})")

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
    profiled = batches[: args.skip + 12]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in profiled:
            clock.start("profiled")
            steps["with the mask head"](batch)
    for event in sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total):
        if event.key.startswith("mask part: "):
            print(f"  {event.key[11:]:<40} forward {event.cpu_time_total / len(profiled) / 1000:5.2f} ms a step")


if __name__ == "__main__":
    main()
