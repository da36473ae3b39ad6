"""Running one training on several processes: torchrun's environment, the process group, DDP helpers.

Under ``torchrun --nproc_per_node N -m vitkit train ...`` every process reads RANK, WORLD_SIZE and LOCAL_RANK
from the environment and joins one process group (NCCL on GPUs, Gloo on CPUs); the same command works across
machines with torchrun's --nnodes / --rdzv options. Without torchrun the run is a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vitkit.infer.runtime import resolve_device


@dataclass(frozen=True)
class DistEnv:
    rank: int  # global rank of this process, 0 .. world_size - 1
    world_size: int  # number of processes in the run
    local_rank: int  # rank on this machine (selects the GPU)
    device: torch.device  # where this process computes
    owns_group: bool  # whether `setup` created the process group (and `cleanup` should destroy it)
    local_world_size: int = 1  # processes on this machine (torchrun's LOCAL_WORLD_SIZE; 1 when not given)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and reports."""
        return self.rank == 0


def setup(device: str | None = None) -> DistEnv:
    """Join the process group described by torchrun's environment variables (a no-op for a single process).

    A process group that already exists (initialised by the caller) is used as it is.
    """
    kind = resolve_device(device)
    joined = dist.is_available() and dist.is_initialized()
    if joined:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    else:
        rank = int(os.environ.get("RANK", 0))
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    target = torch.device("cuda", local_rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(target)  # before the process group, so NCCL binds this process to its GPU
    owns = not joined and world_size > 1
    if owns:
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if world_size > 1 else 1
    return DistEnv(rank, world_size, local_rank, target, owns, local_world_size)


def cleanup(env: DistEnv) -> None:
    """Leave the process group if `setup` created it."""
    if env.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The sum of `values` over all processes (the tensor itself for a single process)."""
    if env.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    """`obj` from every process, in rank order."""
    if env.world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's `obj` in every process."""
    if env.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(env: DistEnv) -> None:
    if env.world_size > 1:
        dist.barrier()
