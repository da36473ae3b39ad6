"""The training loop: `fit(config)` trains a classifier or a detector, validates it after every epoch and never
loses work. One loop serves both tasks; what differs (data, loss, evaluation, the metric that picks the best
model) comes from the run's task (`vitkit.train.task`).

OUT (config.out, created if missing) receives:
- config.json: the resolved configuration;
- metrics.jsonl: one JSON line per epoch: epoch, train_loss, then for a classifier val_loss, val_acc, for a
  detector the loss parts loss_ce, loss_bbox, loss_giou (last decoder layer) and COCO's ap, ap50, ap75, ap_small,
  ap_medium, ap_large (null where there is nothing to score) and, for up to 10 classes, each class's AP ("ap/NAME");
  then lr, seconds, images_per_second, skipped;
- curves.png: the loss and the validation metric against epoch (`vitkit.viz.write_curves`), redrawn every epoch;
- checkpoint.pt: model, optimizer, schedule, EMA, every process's RNG states and the position in the run, written
  atomically at the end of every epoch and when the run is interrupted (SIGINT / SIGTERM stop after the current
  step); `fit(..., resume=True)` continues from it exactly;
- best/ and final/: save_pretrained directories (EMA weights when EMA is on), their config.json holding what the
  model needs beside its weights (`vitkit.weights.ModelInfo`: class names, normalisation, the data it trained on, a
  detector's category ids and postprocessing); best/ holds the epoch of the highest val_acc (classifier) or ap
  (detector).

Resuming (`resume=True`) needs OUT's checkpoint and the settings it was written with, except the output folder and
`RESUME_MAY_CHANGE` (`vitkit.train.resume`): loader workers, device, gradient checkpointing (none changes the model,
the data or the arithmetic of a step) and a larger number of epochs. With more epochs the schedule becomes the one a
run of the new length has (`warmup_cosine` over epochs * steps per epoch, its warmup clipped to that total only),
from the step reached on: the next step's learning rate is the longer schedule's at that step, so where the old
cosine had decayed further the rate rises at once (a finished run goes from min_lr back up to the longer cosine's
value there) and then decays to min_lr at the new last step. The epochs already run and their metrics stay as they
were. Starting afresh in a used OUT (`force=True`) moves the earlier run's outputs aside to OUT.old-<time> and
deletes them only once the new run has finished its first epoch (`vitkit.train.outputs`); a run holds OUT while it
trains (`OutLock`), so a second run into it is refused. Messages name the ways on
(continue, start afresh, train longer) as Python calls, or as command lines where `vitkit train` gives its `hints`.

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
from tqdm import tqdm

from vitkit.analysis.precision import (
    AUTO,
    StepTimes,
    auto_precision,
    slow_precision,
    time_training_step,
)
from vitkit.analysis.preflight import NotEnoughMemory, SettingNames, check_memory
from vitkit.data import Unreadable, summarize_unreadable
from vitkit.data.check import check_detection_folder
from vitkit.detection import FOCAL_PRIOR
from vitkit.kernels.probe import config_digest, measured
from vitkit.layers import to_2tuple
from vitkit.models.registry import create_model, family_of
from vitkit.train.checkpoint import CHECKPOINT_NAME, rng_state, save_checkpoint, set_rng_state
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import (
    DistEnv,
    all_reduce_sum,
    barrier,
    broadcast_object,
    cleanup,
    gather_objects,
    setup,
)
from vitkit.train.ema import ModelEma
from vitkit.train.model import describe_init, enable_grad_checkpointing, load_for_finetune
from vitkit.train.optim import apply_schedule, create_optimizer, warmup_cosine
from vitkit.train.outputs import CURVES_NAME, METRICS_NAME, OutLock, RunHints, aside_list, clear_out, has_final
from vitkit.train.recipe import CLASSIFICATION, DataChoice
from vitkit.train.resume import resolve_run
from vitkit.train.sharding import full_state_dict, load_sharded, save_sharded, shard, sharded_model_state
from vitkit.train.task import Task, create_task
from vitkit.util import counted
from vitkit.viz.curves import write_curves
from vitkit.weights import load_report, model_info
from vitkit.weights.family import family_weights
from vitkit.weights.hub import is_hub
from vitkit.weights.io import save_pretrained

log = logging.getLogger("vitkit.train")

PROGRESS_DELAY = 3.0  # seconds an epoch runs before its progress bar appears (short epochs show none)
PROBE_BATCH = 8  # the most images of the step `precision="auto"` times (`Run._measured_step`)
PROBE_ROUNDS = 3  # its timed steps in each precision
STEP_TIMES_FILE = "step_times.json"  # those steps' times per machine and model, in `vitkit.kernels.probe.cache_dir()`


@dataclass(frozen=True)
class FitResult:
    out: Path  # the output folder
    epochs_done: int  # completed epochs
    best_metric: str  # what picks the best model: "val_acc" (classifier) or "ap" (detector)
    best_value: float  # its best value so far
    best_epoch: int  # epoch (1-based) that reached it
    last: dict[str, Any] | None  # the last epoch's metrics line
    interrupted: bool  # stopped by SIGINT / SIGTERM before the last epoch; resume to continue

    @property
    def best_acc(self) -> float:
        """A classifier's best validation accuracy (`best_value`); ValueError for a detector."""
        if self.best_metric != "val_acc":
            raise ValueError(f"a detector has no accuracy: its best model is picked by {self.best_metric}")
        return self.best_value


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
    """The model a (resolved) config trains: fresh from the registry, or fine-tuned from `config.init` (the model
    saved in that directory, or the registry model `config.model` loaded from it; `load_for_finetune`, whose
    `load_report(model)` says what was loaded, kept and reset). A detector trained with the focal loss gets fresh
    class heads that start every class at `FOCAL_PRIOR`, as a fresh model's do."""
    overrides = dict(config.model_args)
    if config.img_size is not None:
        overrides["img_size"] = config.img_size
    if config.init is not None:
        prior = FOCAL_PRIOR if config.detection_loss == "focal" else None
        return load_for_finetune(config.init, num_classes, model=config.model, prior=prior, **overrides)
    return create_model(config.model, num_classes=num_classes, **overrides)


def _progress_enabled(env: DistEnv) -> bool:
    return env.is_main and sys.stderr.isatty() and "CI" not in os.environ


def _check_training_memory(
    model: nn.Module, config: TrainConfig, env: DistEnv, allow: bool, names: SettingNames
) -> None:
    """`check_memory` for a training step of `model` under `config` in every process; all processes stop together
    (NotEnoughMemory where the memory is short, ValueError in the others) unless `allow`."""
    refused = None
    try:
        check_memory(
            model,
            config.img_size,
            config.batch_size,
            training=True,
            precision=config.precision,
            grad_checkpointing=config.grad_checkpointing,
            ema=config.ema_decay > 0,
            device=env.device,
            allow=allow,
            names=names,
            # CPU processes on one machine share its memory; each GPU process has its own device
            processes=env.local_world_size if env.device.type == "cpu" else 1,
            strategy=config.strategy,
            world=env.world_size,
        )
    except NotEnoughMemory as err:
        refused = err
    if env.world_size > 1:  # every process stops together, not only the one whose memory is short
        short = all_reduce_sum(torch.tensor([float(refused is not None)], device=env.device), env)
        if refused is None and short.item() > 0:
            raise ValueError(
                f"{int(short.item())} of {env.world_size} processes have too little memory for this "
                "run (their message says what fits); stopped before training"
            )
    if refused is not None:
        raise refused


def rate(per_second: float) -> str:
    """Images a second as the epoch line shows them: whole above 10, else two significant digits (0.42, not 0)."""
    return f"{per_second:.0f}" if per_second >= 10 else f"{per_second:.2g}"


class Run:
    """One training run's state; `fit` drives it."""

    def __init__(
        self,
        config: TrainConfig,
        env: DistEnv,
        allow_memory: bool = False,
        memory_names: SettingNames | None = None,
        hints: RunHints | None = None,
        resuming: dict[str, torch.Tensor] | None = None,
        probe: str | None = None,
    ) -> None:
        """`resuming`: the model weights of the checkpoint the run continues (a sharded one's: their names and sizes,
        on the meta device), which the family fits the model to before its optimizer is built (`FamilyWeights.adapt`:
        a mask head of an earlier vitkit's layout). `probe`, a fresh run's on a CPU where `config.precision` is bf16:
        "auto" (what `precision="auto"` took from the products' rates: kept only if the model's own step measures
        faster in it) or "bf16" (asked for: kept, and the summary warns where the model's step measures slower in it);
        `_measured_step`."""
        self.config, self.env = config, env
        self.hints = hints or RunHints()  # how messages name the ways on
        self.out = Path(config.out)
        self.task: Task = create_task(config, env)

        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.model = build_training_model(config, self.task.num_classes).to(env.device)
        if resuming is not None:
            family_weights(family_of(self.model).name).adapt(self.model, dict(resuming))
        # the published weights the model started from (directly, or through the model directory it was saved in)
        started = model_info(self.model)
        self.task.info = dataclasses.replace(self.task.info, weights=started.weights)
        auto = probe == AUTO
        self.precision_why = ""  # for the summary: why `auto` took the precision it took, as the first process measured
        self.slower_step: StepTimes | None = None  # an explicit bf16's step where it measured slower than fp32's
        if auto and env.is_main:
            self.precision_why = f" (auto: {auto_precision(env.device)[1]})"
        # a classifier's weights trained on images normalised their own way (timm's CLIP, SigLIP, augreg: mean and
        # std 0.5) are fine-tuned on images normalised that way, and saved so (a detection folder's images are
        # normalised as it was read)
        data = (self.task.info.mean, self.task.info.std)
        own = self.task.name == CLASSIFICATION and started.mean is not None
        self.own_normalisation = own and (started.mean, started.std) != data
        if self.own_normalisation:
            self.task.info = dataclasses.replace(self.task.info, mean=started.mean, std=started.std)
        net = self.task.prepare(self.model)  # the model, or the model with the task's training-only parts
        # before the optimizer state and the first batch: refuse a run that would exhaust memory
        _check_training_memory(self.model, config, env, allow_memory, memory_names or SettingNames())
        if config.grad_checkpointing:
            enable_grad_checkpointing(self.model)
        # why the precision would run slower than fp32 on this device, for the summary (bf16 only where the products
        # favour it, whether auto or the model's step keeps it)
        self.slow = slow_precision(config.precision, env.device, self.hints.option) if env.is_main else None
        measure = probe is not None and config.precision == "bf16" and env.device.type == "cpu"
        if measure and not auto:  # asked for: where the products already measure slower, their warning says it
            measure = broadcast_object(self.slow is None if env.is_main else None, env)  # all processes time it or none
        if measure:
            times = self._measured_step(net)  # the step as it will train, after the memory check
            if auto and times.choice() != config.precision:  # fp32's activations are larger: checked again
                self.config = config = dataclasses.replace(config, precision=times.choice())
                self.task.config = config
                _check_training_memory(self.model, config, env, allow_memory, memory_names or SettingNames())
            if auto and env.is_main:
                self.precision_why = f"{self.precision_why[:-1]}; {times.describe()})"
            if not auto and times.bf16 > times.fp32:
                self.slower_step = times
        torch.manual_seed(config.seed + env.rank)  # dropout and mixing differ between processes
        self.ema = ModelEma(self.model, config.ema_decay) if config.ema_decay > 0 else None
        self.sharded = config.strategy == "fsdp"  # sharded checkpoints, and on several processes a sharded model
        if env.world_size > 1 and self.sharded:
            self.trained = shard(net, self.model, config.precision)
        elif env.world_size > 1:
            device_ids = [env.device.index] if env.device.type == "cuda" else None
            self.trained = DistributedDataParallel(net, device_ids)
        else:
            self.trained = net
        self.steps_per_epoch = math.ceil(len(self.task.train_sampler) / config.batch_size)

        self.optimizer = create_optimizer(net, config.lr, config.weight_decay, backbone_lr=config.backbone_lr)
        self.trained_parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        total_steps = config.epochs * self.steps_per_epoch
        warmup_steps = min(round(config.warmup_epochs * self.steps_per_epoch), total_steps)
        self.scheduler = warmup_cosine(self.optimizer, total_steps, warmup_steps, config.min_lr / config.lr)

        self.epoch, self.step = 0, 0  # the next epoch to run (0-based) and steps already done in it
        self.best_value, self.best_epoch = -math.inf, 0  # the best value of task.best_metric, and its epoch
        self.partial = self._fresh_partial()  # this epoch's train statistics so far
        self.skipped: list[Unreadable] = []  # unreadable samples met by this process in this epoch
        self.replaced: list[Path] = []  # earlier runs' outputs moved aside, deleted after the first epoch
        self.sized: list[DataChoice] = []  # the options the data chose (`TrainConfig.data_choices`), for the summary
        self.curves = True  # whether curves.png is drawn (off after matplotlib failed once)

    def _measured_step(self, net: nn.Module) -> StepTimes:
        """The model's training step timed by the first process in fp32 and bf16 (`_time_step`: synthetic batches of
        at most PROBE_BATCH images at the sizes training gives the model, `Task.probe_sizes`), in every process; a
        failure reaches every process. `precision="auto"` keeps bf16 only where it is FASTER_BY times faster."""
        times, failed = None, None
        if self.env.is_main:
            try:
                times = self._time_step(net)
            except Exception as error:  # said to every process, so that none waits for the others
                failed = f"{type(error).__name__}: {error}"
                if self.env.world_size == 1:
                    raise
        times, failed = broadcast_object((times, failed), self.env)
        if failed is not None:
            raise RuntimeError(f"timing the training step in fp32 and bf16 failed in the first process ({failed})")
        return times

    def _time_step(self, net: nn.Module) -> StepTimes:
        """`_measured_step`'s timing, in this process (`time_training_step`): synthetic batches at `Task.probe_sizes`,
        through the task's forward. Measured once per machine, as the products' rates are: cached with them
        (`vitkit.kernels.probe.measured`) under the model (its whole config), the task, the batch and the sizes."""
        task, generator, device = self.task, torch.Generator().manual_seed(0), self.env.device
        batch, channels = min(self.config.batch_size, PROBE_BATCH), task.image_shape[0]
        sizes = task.probe_sizes(PROBE_ROUNDS + 1)  # as training varies them: new kernels for new shapes

        def images(i: int) -> torch.Tensor:
            return torch.randn(batch, channels, *sizes[i], generator=generator).to(device)

        def measure() -> dict[str, float]:
            times = time_training_step(net, lambda x: task.images_forward(net, x), images, device, PROBE_ROUNDS)
            return dataclasses.asdict(times)

        built = config_digest(self.model.config)
        step = f"{self.config.model} {built} | {task.name} | {batch} x {channels} at {' '.join(map(str, sizes))}"
        return StepTimes(**measured(STEP_TIMES_FILE, ("fp32", "bf16"), measure, what=step, isolate=False))

    def _fresh_partial(self) -> dict[str, float]:
        """Sums over this epoch's steps so far: of train_loss (`loss_sum`) and of each loss part, per image."""
        parts = dict.fromkeys(self.task.loss_parts, 0.0)
        return {"loss_sum": 0.0, **parts, "images": 0, "seconds": 0.0, "lr": self.optimizer.param_groups[0]["lr"]}

    @property
    def eval_model(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.model

    def info_line(self, message: str) -> None:
        if self.env.is_main:
            log.info(message)

    def summary(self) -> str:
        """What the run trains, on what, where: printed once at its start."""
        config, env, task = self.config, self.env, self.task
        init = config.init
        if init is not None and is_hub(init) and task.info.weights:  # the repository at the commit it came from
            init = task.info.weights
        name = config.model or f"the model in {init}"
        source = f", initialised from {init}" if init is not None and config.model else ""
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        classes = task.info.classes
        shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
        channels, height, width = task.image_shape
        if task.name == CLASSIFICATION:
            seen = f"seen as {channels}x{height}x{width}"
        else:
            side = config.img_size or min(to_2tuple(self.model.config.img_size))
            seen = f"{counted(channels, 'channel')}, resized to a shorter side of {side} px"
        processes = f" x {env.world_size} processes ({config.strategy})" if env.world_size > 1 else ""
        lines = [
            f"training {name} ({task.name}){source}: {trainable:,} trainable parameters",
            f"  data    {config.data}: {len(classes)} class{'' if len(classes) == 1 else 'es'} ({shown}), "
            f"{task.splits()}, {seen}",
            f"  run     {counted(config.epochs, 'epoch')} of {counted(self.steps_per_epoch, 'step')}, batch "
            f"{config.batch_size}"
            f"{processes}, lr {config.lr:g}",
            f"  device  {env.device}, {config.precision}{self.precision_why}, "
            f"{counted(torch.get_num_threads(), 'thread')}, "
            f"{counted(config.workers, 'loader worker')}",
            f"  output  {self.out.resolve()}",
        ]
        augment = task.augmentation()
        if augment:
            lines.insert(2, f"  augment {augment}")
        for i, c in enumerate(self.sized):  # what the data chose, one line each, before device and output
            lines.insert(-2, f"  {'sized' if i == 0 else '':8}{c.field.replace('_', ' ')} {c.value}: {c.why}")
        if task.name != CLASSIFICATION and Path(str(config.data)).is_dir():  # `vitkit check-data`'s line, warnings
            check = check_detection_folder(config.data)
            lines.insert(2, f"  check   {check.summary()}")
            lines += [f"  warning {warning}" for warning in check.warnings]
        if self.slow is not None:  # last, where it is read
            lines.append(f"  warning {self.slow}")
        if self.slower_step is not None:
            t, option = self.slower_step, self.hints.option
            lines.append(
                f"  warning bf16 is slower than fp32 for this model on this CPU: its training step takes "
                f"{1000 * t.bf16:.0f} ms in bf16 against {1000 * t.fp32:.0f} in fp32 (its many small operators gain "
                f"nothing from faster products); use fp32 ({option('precision', 'fp32')}) or the faster of the two "
                f"({option('precision', AUTO)})"
            )
        init = load_report(self.model)
        if init is not None and init.adapted:  # what the checkpoint gave, where the model is not it as it was
            lines.insert(1, f"  init    {init.format} layout: {describe_init(init, task.num_classes)}")
        if self.own_normalisation:
            mean, std = (", ".join(f"{v:.4g}" for v in values) for values in (task.info.mean, task.info.std))
            lines.insert(2, f"  input   normalised as the initial weights were trained: mean ({mean}), std ({std})")
        return "\n".join(lines)

    def state(self, weights: bool = True) -> dict[str, Any]:
        """The checkpoint's contents; without `weights`, all but the model's, the optimizer's and the task's trained
        state (which a sharded checkpoint holds in its shards). Every process takes part (gathering the processes'
        RNG states and epoch sums)."""
        state = {
            "format_version": 1,
            "config": json.dumps(self.config.to_dict()),
            "world_size": self.env.world_size,
            "epoch": self.epoch,
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "rng": gather_objects(rng_state(), self.env),
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "partials": gather_objects(dict(self.partial), self.env),  # each process's sums over this epoch so far
            # the earlier run that --force moved aside, kept until this run finishes its first epoch
            "replaced": [str(p) for p in self.replaced],
            "classes": list(self.task.info.classes),  # what the data named; a resume checks its data still does
        }
        if weights:
            state["model"] = self.model.state_dict()
            state["optimizer"] = self.optimizer.state_dict()
            state["ema"] = self.ema.state_dict() if self.ema is not None else None
            state["task"] = self.task.state_dict()
        return state

    def save(self, epoch_end: bool = True) -> None:
        """Write the checkpoint (`checkpoint.pt`, or a sharded one under strategy fsdp); at an epoch's end, also
        delete the earlier run's outputs that `force` moved aside (a run stopped within its first epoch, e.g. by
        Ctrl-C on a wrong output folder, leaves them)."""
        if self.sharded:  # every process writes its shards
            save_sharded(self.out, self.trained, self.optimizer, self.state(weights=False), self.env)
        else:
            state = self.state()
            if self.env.is_main:
                save_checkpoint(state, self.out / CHECKPOINT_NAME)
        if self.env.is_main:
            if epoch_end and self.replaced:  # a whole epoch trained: the earlier runs are not needed
                for folder in self.replaced:
                    shutil.rmtree(folder, ignore_errors=True)
                log.info(f"deleted the earlier run's outputs in {', '.join(map(str, self.replaced))}")
                self.replaced = []

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from the checkpoint `state` (`vitkit.train.outputs.check_out`'s): written by this number of
        processes, or by any number for a sharded checkpoint, whose shards are then split anew."""
        env, saved_world = self.env, state["world_size"]
        self._check_classes(state)
        if "sharded" in state:
            load_sharded(state["sharded"], self.trained, self.optimizer)
        elif saved_world != env.world_size:
            raise ValueError(
                f"the checkpoint in {self.out} was written by {saved_world} processes and this run has "
                f"{env.world_size}: a run under strategy ddp resumes on as many processes as it had (runs under "
                f"{self.hints.option('strategy', 'fsdp')} write checkpoints that resume on any number)"
            )
        else:
            try:
                self.model.load_state_dict(state["model"])
            except RuntimeError as err:  # e.g. an --init directory that holds another model now
                first = str(err).strip().splitlines()[-1].strip()
                raise ValueError(
                    f"the checkpoint in {self.out} does not fit the model this run builds ({first}): its data or the "
                    "model it started from have changed since it was written"
                ) from None
            self.optimizer.load_state_dict(state["optimizer"])
            if self.ema is not None:
                self.ema.load_state_dict(state["ema"])
            self.task.load_state_dict(state.get("task", {}))
        self.scheduler.load_state_dict(state["scheduler"])
        saved_epochs = json.loads(state["config"])["epochs"]
        if saved_epochs != self.config.epochs:
            before = self.optimizer.param_groups[0]["lr"]
            after = apply_schedule(self.scheduler)[0]  # the step reached, on the schedule of the new total
            self.info_line(
                f"extending the run from {saved_epochs} to {self.config.epochs} epochs: the cosine schedule is "
                f"recomputed over {self.config.epochs} epochs, so the learning rate at step "
                f"{self.scheduler.last_epoch} becomes {after:.3g} (was {before:.3g})"
            )
        if env.rank < len(state["rng"]):  # a process added by resharding keeps the seed it started with
            set_rng_state(state["rng"][env.rank])
        self.epoch, self.step = state["epoch"], state["step"]
        replaced = state.get("replaced") or []  # a run stopped within its first epoch keeps them
        replaced = [replaced] if isinstance(replaced, str) else replaced  # checkpoints that kept one
        self.replaced = [Path(p) for p in replaced if Path(p).is_dir()]
        self.best_value = state["best_value"]
        self.best_epoch = state["best_epoch"]
        self.partial = self._resumed_partial(state)
        if self.env.is_main:
            self._truncate_metrics()
        where = f"epoch {self.epoch + 1}" + (f", step {self.step + 1}" if self.step else "")
        source = state.get("sharded", self.out / CHECKPOINT_NAME)
        moved = f" (written by {saved_world} processes)" if saved_world != env.world_size else ""
        self.info_line(f"resuming at {where} from {source}{moved}")

    def _check_classes(self, state: dict[str, Any]) -> None:
        """ValueError when the data's classes are not those the checkpoint was trained on (a class folder added,
        renamed or removed since): its classifier would not fit, or would name other classes."""
        saved, now = state["classes"], list(self.task.info.classes)
        if saved == now:
            return
        added, gone = [c for c in now if c not in saved], [c for c in saved if c not in now]
        changes = "; ".join(f"{what} {names}" for what, names in (("new", added), ("gone", gone)) if names)
        raise ValueError(
            f"the data's classes have changed since the checkpoint in {self.out} was written "
            f"({changes or 'the same names in another order'}; {len(saved)} then, {len(now)} now): resume on the "
            f"data it was trained on, or train afresh on this one ({self.hints.option('force', True)})"
        )

    def _resumed_partial(self, state: dict[str, Any]) -> dict[str, float]:
        """This process's epoch sums from the checkpoint: rank 0 takes the sums of every process that wrote it (only
        their total over the processes is read, at the epoch's end), the others start from zero; the learning rate
        and the seconds are rank 0's."""
        fresh = self._fresh_partial()
        saved = state.get("partials", [state.get("partial", {})])  # checkpoints before "partials" kept rank 0's
        mine = dict(fresh)
        for key in fresh:
            if key in ("lr", "seconds"):
                mine[key] = saved[0].get(key, fresh[key])
            elif self.env.is_main:
                mine[key] = sum(p.get(key, 0.0) for p in saved)
        return mine

    def _truncate_metrics(self) -> None:
        """Drop metrics lines of epochs the checkpoint does not include (written just before a crash)."""
        path = self.out / METRICS_NAME
        if path.is_file():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            kept = [line for line in lines if json.loads(line)["epoch"] <= self.epoch]
            path.write_text("".join(line + "\n" for line in kept))

    def sync_stop(self, stop: StopOnSignal) -> bool:
        """Whether any process was asked to stop (all processes stop after the same step)."""
        if self.env.world_size == 1:
            return stop.requested
        flag = torch.tensor([float(stop.requested)], device=self.env.device)
        return bool(all_reduce_sum(flag, self.env).item() > 0)

    def train_epoch(self, stop: StopOnSignal) -> bool:
        """Run the rest of the current epoch; False when a stop was requested (the checkpoint is then saved)."""
        config, env, task = self.config, self.env, self.task
        task.set_epoch(self.epoch, start=self.step * config.batch_size)
        self.trained.train()
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=self.step,
            desc=f"epoch {self.epoch + 1}/{config.epochs}",
            leave=False,
            delay=PROGRESS_DELAY,
            disable=not _progress_enabled(env),
        )
        started = time.perf_counter()
        for batch in task.train_loader:
            self.skipped += batch.skipped
            loss, parts, count = task.train_loss(self.trained, batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip_grad > 0:
                nn.utils.clip_grad_norm_(self.trained_parameters, config.clip_grad)
            self.partial["lr"] = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.scheduler.step()
            if self.ema is not None:
                self.ema.update(self.model)
            values = {name: value.item() for name, value in parts.items()}
            self.partial["loss_sum"] += values["train_loss"] * count
            for name in task.loss_parts:
                self.partial[name] += values[name] * count
            self.partial["images"] += count
            self.step += 1
            bar.update()
            bar.set_postfix(loss=f"{values['train_loss']:.3f}", refresh=False)  # shown with the next update
            if self.sync_stop(stop):
                self.partial["seconds"] += time.perf_counter() - started
                bar.close()
                self.save(epoch_end=False)
                return False
        self.partial["seconds"] += time.perf_counter() - started
        bar.close()
        return True

    def end_epoch(self) -> dict[str, Any]:
        """Validate, log, then write the metrics line, the curves, the best model and the checkpoint."""
        env, config, task = self.env, self.config, self.task
        started = time.perf_counter()
        sums = ["loss_sum", *task.loss_parts, "images"]
        totals = torch.tensor([self.partial[name] for name in sums], dtype=torch.float64)
        totals = dict(zip(sums, all_reduce_sum(totals.to(env.device), env).tolist(), strict=True))
        images = totals["images"]
        met = [item for items in gather_objects(self.skipped, env) for item in items]
        if images == 0:  # every training image of the epoch unreadable: nothing was learnt, so nothing is saved
            raise ValueError(
                f"no training image of epoch {self.epoch + 1} could be read; {summarize_unreadable(met)}. Fix or "
                f"remove them (vitkit check-data names problems in a detection folder), then train again"
            )
        validation, val_skipped = task.evaluate(self.eval_model)
        met += val_skipped  # the evaluation's, with their reasons (`vitkit.data.Unreadable`)
        skipped = {item.name for item in met}
        train_seconds = self.partial["seconds"]
        metrics = {
            "epoch": self.epoch + 1,
            "train_loss": totals["loss_sum"] / max(images, 1),
            **{name: totals[name] / max(images, 1) for name in task.loss_parts},
            **{name: None if math.isnan(value) else value for name, value in validation.items()},
            "lr": self.partial["lr"],
            "seconds": train_seconds + time.perf_counter() - started,
            "images_per_second": images / train_seconds if train_seconds > 0 else 0.0,
            "skipped": len(skipped),
        }
        self.epoch, self.step = self.epoch + 1, 0
        self.partial = self._fresh_partial()
        self.skipped = []
        self.info_line(
            f"epoch {metrics['epoch']}/{config.epochs}  train_loss {metrics['train_loss']:.4f}  "
            f"{task.describe(validation)}  lr {metrics['lr']:.2e}  "
            f"{metrics['seconds']:.1f}s  {rate(metrics['images_per_second'])} img/s"
            + (f"  skipped {len(skipped)} unreadable" if skipped else "")
        )
        if met and env.is_main:
            log.warning(summarize_unreadable(met))
        if env.is_main:
            with open(self.out / METRICS_NAME, "a") as handle:
                handle.write(json.dumps(metrics) + "\n")
            self.draw_curves()
        value = validation[task.best_metric]  # the same in every process
        if value > self.best_value:
            self.best_value, self.best_epoch = value, self.epoch
            self.write_model("best")
        self.save()
        return metrics

    def draw_curves(self) -> None:
        """Redraw curves.png from metrics.jsonl; a failure to draw is a warning, never the end of the run."""
        if not self.curves:
            return
        lines = (self.out / METRICS_NAME).read_text().splitlines()
        try:
            write_curves([json.loads(line) for line in lines if line.strip()], self.out / CURVES_NAME)
        except OSError as err:
            log.warning(f"{CURVES_NAME} is not drawn: {err}")
            self.curves = False

    def result(self, last: dict[str, Any] | None, interrupted: bool) -> FitResult:
        metric = self.task.best_metric
        return FitResult(self.out, self.epoch, metric, self.best_value, self.best_epoch, last, interrupted)

    def write_model(self, name: str) -> Path:
        """Save the evaluated model (EMA weights with EMA) as OUT/name, with what it needs beside its weights (the
        task's `saved_info`) in its config.json: rank 0 writes, every process calls it (a sharded model's weights
        are gathered from all)."""
        model = self.eval_model
        weights = full_state_dict(model)
        directory = self.out / name
        if self.env.is_main:
            save_pretrained(model, directory, self.task.saved_info(), state_dict=weights)
        return directory


def fit(
    config: TrainConfig,
    resume: bool = False,
    force: bool = False,
    allow_memory: bool = False,
    memory_names: SettingNames | None = None,
    hints: RunHints | None = None,
) -> FitResult:
    """Train as `config` says, writing everything to `config.out` (see the module docstring).

    Args:
        config: the run; None defaults are resolved (`TrainConfig.resolved`) and written to config.json.
        resume: continue from OUT/checkpoint.pt (ValueError when there is none); the resolved options must match
            the checkpoint's except `RESUME_MAY_CHANGE`. A resumed run ends with the weights an uninterrupted
            run would have had. `TrainConfig.for_resume(out, **changes)` gives the saved options with `changes`
            applied, as `vitkit train --out OUT --resume` uses them.
        force: start afresh even when OUT already holds a run: its outputs are moved to OUT.old-<time> and
            deleted once the new run has finished its first epoch. Not together with `resume`.
        allow_memory: run even when the estimated peak memory of a step exceeds the memory available
            (`vitkit.analysis.check_memory` warns instead of refusing before anything is allocated).
        memory_names: how a refusal names the ways out (`vitkit.cli.options.memory_flags` for the command line;
            None: the library's argument names).
        hints: how messages name the ways on: continue the run, start afresh, train it longer (`RunHints`, as
            Python calls, when None; `vitkit train` passes its command lines).
    """
    hints = hints or RunHints()
    env = setup(config.device)
    run = None
    lock = OutLock(Path(config.out), env, hints)
    try:
        lock.acquire(config, create=False)  # a second run in OUT is refused before anything is read or said
        resolved, state = resolve_run(config, env, resume, force, hints)
        if state is not None and state["epoch"] >= resolved.epochs and has_final(Path(resolved.out)):
            return _complete(resolved, state, env, hints)  # else it is written below from the checkpoint
        resuming = state.get("model") if state is not None else None
        if state is not None and "sharded" in state:  # its tensors' names and sizes
            resuming = sharded_model_state(state["sharded"])
        probe = config.precision if state is None else None  # a resumed run keeps the precision it began in
        run = Run(resolved, env, allow_memory, memory_names, hints, resuming, probe)  # data, model, memory: before OUT
        run.sized = config.data_choices() if state is None else []
        lock.acquire(config)  # OUT is created now where it was missing
        _begin(run, state)
        return _train(run)
    finally:
        if run is not None and run.replaced and env.is_main:
            log.warning(
                f"the run ended within its first epoch; the earlier run's outputs are kept until this run, resumed, "
                f"finishes its first epoch: {aside_list(run.replaced)}. To go back to one, move its contents into "
                f"{run.out}"
            )
        lock.release()
        cleanup(env)


def _complete(config: TrainConfig, state: dict[str, Any], env: DistEnv, hints: RunHints) -> FitResult:
    """A resumed run that has trained all its epochs: said, with how to train it longer, and nothing changed."""
    out, epochs = Path(config.out), config.epochs
    metric = "val_acc" if config.task == CLASSIFICATION else "ap"
    best = state["best_value"]
    lines = (out / METRICS_NAME).read_text().splitlines() if (out / METRICS_NAME).is_file() else []
    last = json.loads(lines[-1]) if lines else None
    if env.is_main:
        log.info(
            f"the run in {out} is complete: it has trained {epochs} epoch{'s' if epochs != 1 else ''} (best {metric} "
            f"{best:.4f} at epoch "
            f"{state['best_epoch']}, in {out / 'best'}; the final model in {out / 'final'}). To train it longer, "
            f"give more epochs: {hints.resume(out, epochs=2 * epochs)}"
        )
    return FitResult(out, state["epoch"], metric, best, state["best_epoch"], last, interrupted=False)


def _begin(run: Run, state: dict[str, Any] | None) -> None:
    """Make OUT ready for a fresh run (`state` None) or restore the checkpoint `state`; then write config.json and
    log what the run trains."""
    if state is None:
        run.replaced = clear_out(run.out, run.env)
    else:
        run.restore(state)
    if run.env.is_main:
        run.config.save(run.out)
        log.info(run.summary())
    barrier(run.env)


def _train(run: Run) -> FitResult:
    """Train the epochs left, then write the final model; a stop asked for by SIGINT / SIGTERM ends the run after
    the current step with its checkpoint saved."""
    env, last = run.env, None
    with StopOnSignal() as stop:
        while run.epoch < run.config.epochs:
            if not run.train_epoch(stop):
                torchrun = f" (under torchrun with {env.world_size} processes)" if env.world_size > 1 else ""
                best = (
                    f"; the best model so far is in {run.out / 'best'} ({run.task.best_metric} {run.best_value:.4f}, "
                    f"epoch {run.best_epoch})"
                    if run.best_epoch > 0
                    else ""
                )
                run.info_line(
                    f"stopped in epoch {run.epoch + 1} after step {run.step}; checkpoint saved{best}; continue with: "
                    f"{run.hints.resume(run.out)}{torchrun}"
                )
                return run.result(last, interrupted=True)
            last = run.end_epoch()
        final = run.write_model("final")  # a stop asked for now waits for it: the run is complete
    if env.is_main:
        run.info_line(
            f"best {run.task.best_metric} {run.best_value:.4f} (epoch {run.best_epoch}); final model in {final}"
        )
    barrier(env)
    return run.result(last, interrupted=False)
