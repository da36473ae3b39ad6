"""Where a training epoch's seconds go: `vitkit train` with a clock around each part of the step.

Runs `vitkit train ARGS` in this process with timers around the forward and the loss (`train_loss`: the model, the
matcher and the criterion), the criterion alone, `backward`, the gradient clipping, `optimizer.step` and
`zero_grad`; what the epoch's loop spends outside them (the loader, the scheduler, the progress bar) is "other".
After each epoch it prints the seconds of each part, and the validation's (`end_epoch`).

    python benchmarks/train_phases.py --data ~/shapes --out /tmp/phases --epochs 2 --model-arg masks=false

The figures behind BENCHMARKS.md's "The default detector on this CPU" step breakdowns.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from vitkit.cli import main
from vitkit.train import loop

SECONDS: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, its seconds added to SECONDS[name] at every call."""

    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[name] = SECONDS.get(name, 0.0) + time.perf_counter() - started

    return run


def instrument() -> None:
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = timed("clip", torch.nn.utils.clip_grad_norm_)
    train_epoch, end_epoch = loop.Run.train_epoch, loop.Run.end_epoch

    def epoch(self: loop.Run, stop: Any) -> bool:
        if not getattr(self, "_timed", False):  # once per run: the same task and optimizer serve every epoch
            self._timed = True
            task = self.task
            task.train_loss = timed("forward and loss", task.train_loss)
            criterion = getattr(task, "criterion", None)  # a detection task's
            if criterion is not None:
                task.criterion = _TimedCriterion(criterion)
            self.optimizer.step = timed("optimizer", self.optimizer.step)
            self.optimizer.zero_grad = timed("zero_grad", self.optimizer.zero_grad)
        SECONDS.clear()
        started = time.perf_counter()
        going_on = train_epoch(self, stop)
        total = time.perf_counter() - started
        other = total - sum(v for k, v in SECONDS.items() if k != "criterion")
        parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in SECONDS.items())
        print(f"[phases] epoch {self.epoch + 1}: {total:.2f} s in {self.steps_per_epoch} steps: {parts}, "
              f"other {other:.2f} (the criterion is part of the forward and loss)", flush=True)  # fmt: skip
        return going_on

    def validate(self: loop.Run) -> Any:
        started = time.perf_counter()
        result = end_epoch(self)
        print(f"[phases] validation and saving: {time.perf_counter() - started:.2f} s", flush=True)
        return result

    loop.Run.train_epoch, loop.Run.end_epoch = epoch, validate


class _TimedCriterion:
    """The task's criterion, its calls timed under "criterion"; every attribute read through."""

    def __init__(self, criterion: Any) -> None:
        self._criterion = criterion
        self._call = timed("criterion", criterion)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._criterion, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)


if __name__ == "__main__":
    # the timed optimizer.step replaces the method the scheduler wrapped: torch warns, and the order is unchanged
    warnings.filterwarnings("ignore", message=".*optimizer.step\\(\\)` has been overridden")
    instrument()
    sys.exit(main(["train", *sys.argv[1:]]))
