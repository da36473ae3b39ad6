"""The training loop: `fit(config)` trains a classifier, validates it after every epoch and never loses work.

OUT (config.out) receives:
- config.json: the resolved configuration;
- metrics.jsonl: one JSON line per epoch (epoch, train_loss, val_loss, val_acc, lr, seconds, images_per_second,
  skipped);
- checkpoint.pt: model, optimizer, schedule, EMA, every process's RNG states and the position in the run, written
  atomically at the end of every epoch and when the run is interrupted (SIGINT / SIGTERM stop after the current
  step); `fit(..., resume=True)` continues from it exactly;
- best/ and final/: save_pretrained directories (EMA weights when EMA is on) with dataset.json (class names,
  normalisation) beside the model.

Under torchrun every process trains its shard of each batch (DistributedDataParallel); only rank 0 writes and logs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchvision.transforms import v2
from tqdm import tqdm

from vitkit.data import (
    EpochSampler,
    TransformedImages,
    eval_transform,
    load_data,
    make_loader,
    normalize,
    train_transform,
)
from vitkit.layers import to_2tuple
from vitkit.models.registry import create_model
from vitkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from vitkit.train.config import CONFIG_NAME, TrainConfig, current_model_name
from vitkit.train.distributed import DistEnv, all_reduce_sum, barrier, cleanup, gather_objects, setup
from vitkit.train.ema import ModelEma
from vitkit.train.evaluate import autocast, evaluate
from vitkit.train.model import enable_grad_checkpointing, load_for_finetune
from vitkit.train.optim import create_optimizer, warmup_cosine
from vitkit.weights.io import save_pretrained

log = logging.getLogger("vitkit.train")

METRICS_NAME = "metrics.jsonl"
OUTPUTS = (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME, "best", "final")  # what a fresh run replaces in OUT
RESUME_MAY_CHANGE = ("out", "workers", "device")  # options a resumed run may set differently


@dataclass(frozen=True)
class FitResult:
    out: Path  # the output folder
    epochs_done: int  # completed epochs
    best_acc: float  # best validation accuracy so far
    best_epoch: int  # epoch (1-based) that reached it
    last: dict[str, Any] | None  # the last epoch's metrics line
    interrupted: bool  # stopped by SIGINT / SIGTERM before the last epoch; resume to continue


class StopOnSignal:
    """While active (in the main thread), SIGINT and SIGTERM set `requested` instead of killing the process; the
    loop then stops at the end of its step. A second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def build_training_model(config: TrainConfig, num_classes: int) -> nn.Module:
    """The model a (resolved) config trains: fine-tuned from `config.init`, or fresh from the registry."""
    overrides = dict(config.model_args)
    if config.img_size is not None:
        overrides["img_size"] = config.img_size
    if config.init is not None:
        return load_for_finetune(config.init, num_classes, **overrides)
    return create_model(config.model, num_classes=num_classes, **overrides)


def forward_loss(
    model: nn.Module, images: torch.Tensor, targets: torch.Tensor, criterion: nn.Module, precision: str
) -> torch.Tensor:
    """The training loss of one batch: the forward pass under `precision`, the criterion in float32."""
    with autocast(images.device, precision):
        logits = model(images)  # (B, K)
    return criterion(logits.float(), targets)


def _batch_mixer(config: TrainConfig, num_classes: int) -> v2.Transform | None:
    mixers = []
    if config.mixup > 0:
        mixers.append(v2.MixUp(alpha=config.mixup, num_classes=num_classes))
    if config.cutmix > 0:
        mixers.append(v2.CutMix(alpha=config.cutmix, num_classes=num_classes))
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


def _check_resume(saved: dict[str, Any], config: TrainConfig) -> None:
    saved, current = current_model_name(saved), current_model_name(config.to_dict())
    changed = sorted(k for k in current if k not in RESUME_MAY_CHANGE and saved.get(k) != current[k])
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in changed)
        raise ValueError(f"cannot resume with different settings ({details}); start a new run in another folder")


def _progress_enabled(env: DistEnv) -> bool:
    return env.is_main and sys.stderr.isatty() and "CI" not in os.environ


class _Run:
    """One training run's state; `fit` drives it."""

    def __init__(self, config: TrainConfig, env: DistEnv) -> None:
        self.config, self.env = config, env
        self.out = Path(config.out)
        train_source, val_source, self.info = load_data(config.data, config.val_fraction, config.seed)
        self.num_classes = len(self.info.classes)

        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.model = build_training_model(config, self.num_classes).to(env.device)
        torch.manual_seed(config.seed + env.rank)  # dropout and mixing differ between processes
        if config.grad_checkpointing:
            enable_grad_checkpointing(self.model)
        self.ema = ModelEma(self.model, config.ema_decay) if config.ema_decay > 0 else None
        device_ids = [env.device.index] if env.device.type == "cuda" else None
        self.trained = DistributedDataParallel(self.model, device_ids) if env.world_size > 1 else self.model

        model_config = self.model.config
        img_size, channels = to_2tuple(model_config.img_size), model_config.in_chans
        self.image_shape = (channels, *img_size)  # (C, H, W) of one input
        augment = train_transform(img_size, channels, config.min_scale, config.hflip, config.randaugment)
        self.train_sampler = EpochSampler(len(train_source), env.world_size, env.rank, seed=config.seed)
        val_sampler = EpochSampler(len(val_source), env.world_size, env.rank, shuffle=False, pad=False)
        pin = env.device.type == "cuda"
        self.train_loader = make_loader(
            TransformedImages(train_source, augment), self.train_sampler, config.batch_size, config.workers, pin
        )
        self.val_loader = make_loader(
            TransformedImages(val_source, eval_transform(img_size, channels)),
            val_sampler,
            config.batch_size,
            config.workers,
            pin,
        )
        self.steps_per_epoch = math.ceil(len(self.train_sampler) / config.batch_size)

        self.optimizer = create_optimizer(self.model, config.lr, config.weight_decay)
        total_steps = config.epochs * self.steps_per_epoch
        warmup_steps = min(round(config.warmup_epochs * self.steps_per_epoch), total_steps)
        self.scheduler = warmup_cosine(self.optimizer, total_steps, warmup_steps, config.min_lr / config.lr)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        self.mixer = _batch_mixer(config, self.num_classes)

        self.epoch, self.step = 0, 0  # the next epoch to run (0-based) and steps already done in it
        self.best_acc, self.best_epoch = -1.0, 0
        self.partial = self._fresh_partial()  # this epoch's train statistics so far
        self.warned: set[str] = set()
        self.skipped: list[str] = []  # unreadable samples met by this process in this epoch

    def _fresh_partial(self) -> dict[str, float]:
        return {"loss_sum": 0.0, "images": 0, "seconds": 0.0, "lr": self.optimizer.param_groups[0]["lr"]}

    @property
    def eval_model(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.model

    def info_line(self, message: str) -> None:
        if self.env.is_main:
            log.info(message)

    def state(self) -> dict[str, Any]:
        rng = gather_objects(rng_state(), self.env)
        return {
            "format_version": 1,
            "config": json.dumps(self.config.to_dict()),
            "world_size": self.env.world_size,
            "epoch": self.epoch,
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": rng,
            "best_acc": self.best_acc,
            "best_epoch": self.best_epoch,
            "partial": dict(self.partial),
        }

    def save(self) -> None:
        state = self.state()  # every process takes part in gathering the RNG states
        if self.env.is_main:
            save_checkpoint(state, self.out / CHECKPOINT_NAME)

    def restore(self, state: dict[str, Any]) -> None:
        if state["world_size"] != self.env.world_size:
            raise ValueError(
                f"the checkpoint was written by {state['world_size']} processes, this run has {self.env.world_size}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        set_rng_state(state["rng"][self.env.rank])
        self.epoch, self.step = state["epoch"], state["step"]
        self.best_acc, self.best_epoch = state["best_acc"], state["best_epoch"]
        self.partial = dict(state["partial"])
        if self.env.is_main:
            self._truncate_metrics()
        where = f"epoch {self.epoch + 1}" + (f", step {self.step + 1}" if self.step else "")
        self.info_line(f"resuming at {where} from {self.out / CHECKPOINT_NAME}")

    def _truncate_metrics(self) -> None:
        """Drop metrics lines of epochs the checkpoint does not include (written just before a crash)."""
        path = self.out / METRICS_NAME
        if path.is_file():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            kept = [line for line in lines if json.loads(line)["epoch"] <= self.epoch]
            path.write_text("".join(line + "\n" for line in kept))

    def _sync_stop(self, stop: StopOnSignal) -> bool:
        """Whether any process was asked to stop (all processes stop after the same step)."""
        if self.env.world_size == 1:
            return stop.requested
        flag = torch.tensor([float(stop.requested)], device=self.env.device)
        return bool(all_reduce_sum(flag, self.env).item() > 0)

    def train_epoch(self, stop: StopOnSignal) -> bool:
        """Run the rest of the current epoch; False when a stop was requested (the checkpoint is then saved)."""
        config, env = self.config, self.env
        self.train_sampler.set_epoch(self.epoch, start=self.step * config.batch_size)
        self.trained.train()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=self.step,
            desc=f"epoch {self.epoch + 1}/{config.epochs}",
            leave=False,
            disable=not _progress_enabled(env),
        )
        started = time.perf_counter()
        for batch in self.train_loader:
            self.skipped += [s.name for s in batch.skipped]
            targets = batch.labels.to(env.device, non_blocking=True)
            if len(targets) > 0:
                images = batch.images.to(env.device, non_blocking=True)
                images = normalize(images, self.info.mean, self.info.std)  # (B, C, H, W) float
                if self.mixer is not None:
                    images, targets = self.mixer(images, targets)
                loss = forward_loss(self.trained, images, targets, self.criterion, config.precision)
            else:  # every image was unreadable: a zero loss through the model keeps the processes in step
                loss = self.trained(torch.zeros(1, *self.image_shape, device=env.device)).sum() * 0.0
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip_grad > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_grad)
            self.partial["lr"] = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.scheduler.step()
            if self.ema is not None:
                self.ema.update(self.model)
            value = loss.item()
            self.partial["loss_sum"] += value * len(targets)
            self.partial["images"] += len(targets)
            self.step += 1
            bar.update()
            bar.set_postfix(loss=f"{value:.3f}")
            if self._sync_stop(stop):
                self.partial["seconds"] += time.perf_counter() - started
                bar.close()
                self.save()
                return False
        self.partial["seconds"] += time.perf_counter() - started
        bar.close()
        return True

    def end_epoch(self) -> dict[str, Any]:
        """Validate, log, write the metrics line and the best model, then the checkpoint."""
        env, config = self.env, self.config
        started = time.perf_counter()
        result = evaluate(self.eval_model, self.val_loader, self.info, env, config.precision)
        totals = torch.tensor([self.partial["loss_sum"], self.partial["images"]], dtype=torch.float64)
        loss_sum, images = all_reduce_sum(totals.to(env.device), env).tolist()
        skipped = sorted({name for names in gather_objects(self.skipped, env) for name in names} | set(result.skipped))
        for name in skipped:
            if name not in self.warned and env.is_main:
                log.warning(f"skipped unreadable image {name}")
            self.warned.add(name)
        train_seconds = self.partial["seconds"]
        metrics = {
            "epoch": self.epoch + 1,
            "train_loss": loss_sum / max(images, 1),
            "val_loss": result.loss,
            "val_acc": result.top1,
            "lr": self.partial["lr"],
            "seconds": train_seconds + time.perf_counter() - started,
            "images_per_second": images / train_seconds if train_seconds > 0 else 0.0,
            "skipped": len(skipped),
        }
        self.epoch, self.step = self.epoch + 1, 0
        self.partial = self._fresh_partial()
        self.skipped = []
        if env.is_main:
            with open(self.out / METRICS_NAME, "a") as handle:
                handle.write(json.dumps(metrics) + "\n")
        if result.top1 > self.best_acc:
            self.best_acc, self.best_epoch = result.top1, self.epoch
            if env.is_main:
                self.write_model("best")
        self.save()
        self.info_line(
            f"epoch {metrics['epoch']}/{config.epochs}  train_loss {metrics['train_loss']:.4f}  "
            f"val_loss {result.loss:.4f}  val_acc {result.top1:.4f}  lr {metrics['lr']:.2e}  "
            f"{metrics['seconds']:.1f}s  {metrics['images_per_second']:.0f} img/s"
            + (f"  skipped {len(skipped)} unreadable" if skipped else "")
        )
        return metrics

    def write_model(self, name: str) -> Path:
        directory = save_pretrained(self.eval_model, self.out / name)
        self.info.save(directory)
        return directory


def _prepare_out(out: Path, resume: bool, force: bool, env: DistEnv) -> dict[str, Any] | None:
    """The checkpoint to resume from, or None after clearing earlier outputs for a fresh run."""
    checkpoint = out / CHECKPOINT_NAME
    if resume and checkpoint.is_file():
        return load_checkpoint(checkpoint)
    if out.is_dir() and any(out.iterdir()) and not (resume or force):
        raise ValueError(f"{out} is not empty: pass --resume to continue the run there, or --force to start over")
    barrier(env)  # every process has looked at OUT before rank 0 changes it
    if env.is_main:
        for name in OUTPUTS:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        out.mkdir(parents=True, exist_ok=True)
    return None


def fit(config: TrainConfig, resume: bool = False, force: bool = False) -> FitResult:
    """Train as `config` says, writing everything to `config.out` (see the module docstring).

    Args:
        config: the run; None defaults are resolved (`TrainConfig.resolved`) and written to config.json.
        resume: continue from OUT/checkpoint.pt when there is one (else start afresh); the options must match
            the checkpoint's except `RESUME_MAY_CHANGE`. A resumed run ends with the weights an uninterrupted
            run would have had. `TrainConfig.for_resume(out, **changes)` gives the saved options with `changes`
            applied, as `vitkit train --out OUT --resume` uses them.
        force: start afresh even when OUT already holds a run (its outputs are replaced).
    """
    env = setup(config.device)
    try:
        config = dataclasses.replace(config.resolved(), device=env.device.type)
        state = _prepare_out(Path(config.out), resume, force, env)
        if state is not None:
            _check_resume(json.loads(state["config"]), config)
        run = _Run(config, env)
        if state is not None:
            run.restore(state)
        if env.is_main:
            config.save(run.out)
        barrier(env)
        last = None
        with StopOnSignal() as stop:
            while run.epoch < config.epochs:
                if not run.train_epoch(stop):
                    run.info_line(
                        f"stopped in epoch {run.epoch + 1} after step {run.step}; checkpoint saved, continue with "
                        "resume (vitkit train --resume)"
                    )
                    return FitResult(run.out, run.epoch, run.best_acc, run.best_epoch, last, interrupted=True)
                last = run.end_epoch()
        if env.is_main:
            final = run.write_model("final")
            run.info_line(f"best val_acc {run.best_acc:.4f} (epoch {run.best_epoch}); final model in {final}")
        barrier(env)
        return FitResult(run.out, run.epoch, run.best_acc, run.best_epoch, last, interrupted=False)
    finally:
        cleanup(env)
