"""Fully sharded data parallelism (`vitkit train --strategy fsdp`): PyTorch's FSDP2 and distributed checkpoint.

Under ``torchrun --nproc_per_node N -m vitkit train --strategy fsdp ...`` every process keeps 1/N of each parameter,
its gradient and its AdamW state (`torch.distributed.fsdp.fully_shard`). Each of the model's repeated blocks
(`shard_units()`: ViT and Swin blocks, a detector's backbone blocks and encoder and decoder layers) is one unit:
its parameters are gathered just before it runs, forward and backward, and freed after, and its gradients are
reduce-scattered (averaged) as soon as backward leaves it. The rest of the model (embeddings, norms, heads) is
sharded with the root. With precision bf16 the units compute with bfloat16 copies of their parameters and reduce
gradients in float32 (`MixedPrecisionPolicy`), under the same autocast as a replicated run.

Checkpoints are written with `torch.distributed.checkpoint` (DCP): every process writes its own shards, in
parallel, into a new folder OUT/checkpoint-K; rank 0 adds the rest of the run's state (`TRAINER_STATE`) and then
points OUT/checkpoint.json at the folder (an atomic rename), and only then deletes the previous folder: a crash
while saving leaves the previous checkpoint whole. DCP records every shard's place in its tensor, so a run resumes
on any number of processes (resharding on load) with the same global batch (`resharded_batch`). A single process
with `--strategy fsdp` trains the whole model but writes and reads the same sharded checkpoints, so that a run can
move between one process and many. best/ and final/ are ordinary `save_pretrained` directories: the full weights
gathered on rank 0 (`full_state_dict`).

Evaluation runs the sharded model in every process on its share of the validation images: gathering a unit's
parameters takes all processes, so each process runs the same number of forward passes (`Lockstep`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from vitkit.analysis.estimate import REDUCE_DTYPE
from vitkit.models.interface import require_model
from vitkit.train.checkpoint import load_checkpoint, save_checkpoint
from vitkit.train.distributed import DistEnv, broadcast_object
from vitkit.util import atomic_write

POINTER_NAME = "checkpoint.json"  # names the folder that holds the current sharded checkpoint
FOLDER_PREFIX = "checkpoint-"  # the folders: checkpoint-1, checkpoint-2, ...
TRAINER_STATE = "trainer_state.pt"  # in the folder: the run's state besides the weights and the optimizer
FORWARD_METHODS = ("predict",)  # methods besides forward that run the model (evaluation, inference)


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for a run's precision: bf16 compute with float32 gradient reduction, or float32 throughout."""
    if precision == "bf16":  # the reduction the memory estimate counts
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPE)
    return MixedPrecisionPolicy()


def shard(net: nn.Module, model: nn.Module, precision: str) -> nn.Module:
    """Shard `model`'s units, then `model`, then the training module `net` (the model, or the model with the task's
    training-only parts around it) over the default process group, in place; returns `net`. Create the optimizer
    afterwards: the parameters become `DTensor` shards."""
    policy = mixed_precision(precision)
    # FSDP2 shards parameters in the plain order only (a detector's backbone keeps its convolutions channels-last);
    # its all-gather gives them back in that order anyway
    net.to(memory_format=torch.contiguous_format)
    for unit in require_model(model, "FSDP sharding").shard_units():
        fully_shard(unit, mp_policy=policy)
    if net is not model:  # the model is a unit of its own, so that its methods gather its parameters
        fully_shard(model, mp_policy=policy)
    fully_shard(net, mp_policy=policy)
    for name in FORWARD_METHODS:
        if hasattr(model, name):
            register_fsdp_forward_method(model, name)
    return net


def is_sharded(module: nn.Module) -> bool:
    """Whether `module`'s parameters are FSDP shards."""
    return any(isinstance(p, torch.distributed.tensor.DTensor) for p in module.parameters())


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s whole state dict on the CPU: gathered from every process when it is sharded (every process must
    call it; rank 0 receives the tensors, the others an empty dict), its own otherwise."""
    if not is_sharded(module):
        return module.state_dict()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(module, options=options)


# --- checkpoints ---------------------------------------------------------------------------------------------------


def sharded_checkpoint(out: str | os.PathLike) -> Path | None:
    """The folder of OUT's current sharded checkpoint, or None when OUT has none."""
    pointer = Path(out) / POINTER_NAME
    if not pointer.is_file():
        return None
    folder = Path(out) / json.loads(pointer.read_text())["folder"]
    if not (folder / TRAINER_STATE).is_file():
        raise ValueError(f"{pointer} names {folder}, which holds no complete checkpoint ({TRAINER_STATE} is missing)")
    return folder


def save_sharded(
    out: str | os.PathLike, net: nn.Module, optimizer: torch.optim.Optimizer, trainer: dict[str, Any], env: DistEnv
) -> Path:
    """Write a sharded checkpoint of `net` and `optimizer` (every process its shards) with the run's other state
    `trainer` (rank 0) into a new folder of OUT, point OUT/checkpoint.json at it, then delete the older folders.
    Every process of the group calls it. Returns the folder."""
    out = Path(out)
    number = broadcast_object(_next_number(out) if env.is_main else None, env)  # rank 0 names the folder
    folder = out / f"{FOLDER_PREFIX}{number}"
    model_state, optimizer_state = get_state_dict(net, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=folder, no_dist=env.world_size == 1)  # returns when every process has written
    if env.is_main:
        save_checkpoint(trainer, folder / TRAINER_STATE)
        text = json.dumps({"format_version": 1, "folder": folder.name}) + "\n"
        atomic_write(out / POINTER_NAME, lambda tmp: Path(tmp).write_text(text))
        for old in _folders(out):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    return folder


@contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that it "assumes" a single process even when told so (no_dist)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _folders(out: Path) -> list[Path]:
    return [p for p in out.glob(f"{FOLDER_PREFIX}*") if p.is_dir() and p.name[len(FOLDER_PREFIX) :].isdigit()]


def _next_number(out: Path) -> int:
    """One more than the highest checkpoint-K folder in OUT (one left by a save that crashed included)."""
    return 1 + max((int(p.name[len(FOLDER_PREFIX) :]) for p in _folders(out)), default=0)


def load_trainer_state(folder: str | os.PathLike) -> dict[str, Any]:
    """The run's state besides weights and optimizer, as `save_sharded` wrote it (read without running code)."""
    return load_checkpoint(Path(folder) / TRAINER_STATE)


def sharded_model_state(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's tensors in the sharded checkpoint `folder`, by name, as tensors on the meta device of the sizes and
    dtypes saved: read from its metadata alone, no shard read. What a family fits the model to before it resumes
    (`FamilyWeights.adapt`: a mask head of an earlier vitkit's layout)."""
    saved = dcp.FileSystemReader(Path(folder)).read_metadata().state_dict_metadata
    prefix = "model."
    return {
        name[len(prefix) :]: torch.empty(meta.size, dtype=meta.properties.dtype, device="meta")
        for name, meta in saved.items()
        if name.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }


def load_sharded(folder: str | os.PathLike, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read `net`'s weights and `optimizer`'s state from the sharded checkpoint `folder`, whatever number of
    processes wrote it (each process reads the parts of the shards it now holds). Every process calls it. A
    checkpoint of another model (other tensor names or sizes) is refused, naming them, before anything is read."""
    model_state, optimizer_state = get_state_dict(net, optimizer)
    saved = sharded_model_state(folder)
    mine = {name: tuple(tensor.shape) for name, tensor in model_state.items()}
    theirs = {name: tuple(tensor.shape) for name, tensor in saved.items()}
    if mine != theirs:
        missing, unexpected = sorted(mine.keys() - theirs.keys()), sorted(theirs.keys() - mine.keys())
        common = sorted(mine.keys() & theirs.keys())
        resized = [f"{k} {theirs[k]} against {mine[k]}" for k in common if mine[k] != theirs[k]]
        parts = [f"{what}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for what, names in (
            ("the model's tensors it lacks", missing), ("tensors the model has not", unexpected),
            ("saved sizes against the model's", resized),
        ) if names]  # fmt: skip
        raise ValueError(f"the sharded checkpoint {folder} does not fit the model this run builds ({'; '.join(parts)})")
    state = {"model": model_state, "optimizer": optimizer_state}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=Path(folder), no_dist=not (dist.is_available() and dist.is_initialized()))
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def resharded_batch(saved_batch: int, saved_world: int, world: int) -> int:
    """The per-process batch that keeps a run's global batch (`saved_batch` x `saved_world`) on `world` processes;
    ValueError when it does not divide."""
    total = saved_batch * saved_world
    if total % world:
        fitting = [n for n in range(1, total + 1) if total % n == 0]
        raise ValueError(
            f"the run trains a global batch of {total} images ({saved_batch} per process x {saved_world}), which "
            f"{world} processes cannot share equally; resume it with a number of processes that divides it: "
            f"{', '.join(map(str, fitting))}"
        )
    return total // world


# --- evaluation in step --------------------------------------------------------------------------------------------


class Lockstep(Iterable[Any]):
    """A validation loader that keeps the processes of a sharded model in step: its batches, then as many forward
    passes on a blank image (`idle`) as this process ran fewer than `passes`. The evaluation's forward passes are
    counted at `counted` (a unit the model runs once per pass: its first shard unit), so a batch the evaluation
    skips (every image unreadable) is made up for too."""

    def __init__(self, loader: Iterable[Any], passes: int, counted: nn.Module, idle: Callable[[], Any]) -> None:
        self.loader, self.passes, self.counted, self.idle = loader, passes, counted, idle

    def __iter__(self) -> Iterator[Any]:
        ran = 0

        def count(*_: Any) -> None:
            nonlocal ran
            ran += 1

        handle = self.counted.register_forward_pre_hook(count)
        try:
            yield from self.loader
            with torch.no_grad():
                while ran < self.passes:
                    self.idle()
        finally:
            handle.remove()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


def most_batches(share: int, batch_size: int) -> int:
    """The batches of the largest process share of `share` samples (rank 0's, which is never smaller)."""
    return math.ceil(share / batch_size)
