"""The price of sharding on one machine: a training step of a ViT on N processes under DDP and under FSDP
(`vitkit.train.sharding.shard`, as `vitkit train --strategy fsdp` runs it), interleaved rounds of the same steps,
with each process's peak of tensor memory beside the estimate of `vitkit.analysis`. On CPU: Gloo, one thread per
process (2 processes by default); on CUDA: NCCL, one GPU per process (all GPUs by default; on one GPU FSDP shards
over a group of one: its overhead, and the estimate against the allocator's peak).

    python benchmarks/fsdp_step.py [--models vit_small_patch16_224 vit_base_patch16_224] [--batch 4] [--steps 5]
    python benchmarks/fsdp_step.py --device cuda --models vit_huge_patch14_224 --batch 32 --precision bf16

A step is what `vitkit train` runs: forward under the precision's autocast, cross-entropy, backward, global-norm
clipping, AdamW. Printed: per model and strategy the median step time over all rounds, FSDP's time over DDP's, and
a process's peak memory against the per-process estimate: on CUDA the allocator's peak in the timed processes; on
CPU the bytes allocated through torch's allocator by rank 0 of the same run over a fake process group
(`measured_peak`), with its weights and batch.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from vitkit import create_model
from vitkit.analysis import estimate_memory
from vitkit.analysis.memory import allocated_peak
from vitkit.train.optim import create_optimizer
from vitkit.train.sharding import shard


def step_times(
    name: str, strategy: str, batch: int, steps: int, precision: str, device: torch.device
) -> tuple[list[float], int]:
    """(seconds of each of `steps` timed steps after 2 untimed ones, this process's peak tensor bytes)."""
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    if True:
        model = create_model(name).to(device)
        if strategy == "fsdp":
            trained = shard(model, model, precision)
        else:
            trained = DistributedDataParallel(model, [device.index] if cuda else None)
        optimizer = create_optimizer(trained, 1e-4, 0.05)
        images = torch.randn(batch, 3, 224, 224, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)
        times = []
        for i in range(steps + 2):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            train_step(trained, optimizer, images, labels, precision)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= 2:
                times.append(time.perf_counter() - start)
    used = torch.cuda.max_memory_allocated(device) if cuda else 0  # on CPU: `measured_peak`
    del model, trained, optimizer
    return times, used


def train_step(trained: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
               precision: str) -> None:  # fmt: skip
    """One step as `vitkit train` takes it: forward under the precision's autocast, cross-entropy, backward,
    global-norm clipping, AdamW."""
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = trained(images)
    loss = nn.functional.cross_entropy(logits.float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)
    optimizer.step()


def measured_peak(name: str, strategy: str, batch: int, precision: str, world: int) -> int:
    """Rank 0's peak bytes on CPU over its first two training steps (optimizer state created in the first), with
    its weights (resident before) and the batch: one process of `world`, its collectives those of torch's
    FakeProcessGroup (FSDP allocates and frees its buffers as under Gloo; Gloo's worker thread frees some of them
    where the profiler does not see it, so the real processes are not measured). Under ddp the model unwrapped, as
    the estimate counts it: DDP's gradient buckets (one more copy of the gradients) are left out of both."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the profiler sees the allocations of the thread it profiles
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = create_model(name)
        trained = shard(model, model, precision) if strategy == "fsdp" else model  # ddp: its buckets not counted
        if strategy == "fsdp":
            fully_shard.state(trained)._lazy_init()  # else its first forward allocates the shards again
        resident = sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in model.parameters())
        resident += sum(b.nbytes for b in model.buffers())
        images, labels = torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))
        optimizer = create_optimizer(trained, 1e-4, 0.05)
        with tempfile.TemporaryDirectory() as tmp:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                for _ in range(2):
                    train_step(trained, optimizer, images, labels, precision)
            step = allocated_peak(prof, Path(tmp) / "trace.json")
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    return resident + images.nbytes + step


def worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.world)
    results: dict[tuple[str, str], dict[str, list]] = {}
    for _ in range(args.rounds):
        for name in args.models:
            for strategy in ("ddp", "fsdp"):
                times, peak = step_times(name, strategy, args.batch, args.steps, args.precision, device)
                slot = results.setdefault((name, strategy), {"times": [], "peaks": []})
                slot["times"] += times
                slot["peaks"].append(peak)
    gathered = [None] * args.world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit_small_patch16_224", "vit_base_patch16_224"])
    parser.add_argument("--batch", type=int, default=4, help="images per process and step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every model and strategy")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--world", type=int, default=None, help="processes (default: 2 on CPU, every GPU)")
    args = parser.parse_args()
    args.world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.pt")
        mp.spawn(worker, args=(port, args, out), nprocs=args.world, join=True)
        gathered = torch.load(out, weights_only=False)
    where = "CPU processes x 1 thread" if args.device == "cpu" else f"processes on {torch.cuda.get_device_name(0)}"
    counted = "rank 0 over a fake group, torch's allocator" if args.device == "cpu" else "the CUDA allocator"
    print(f"{args.world} {where}, batch {args.batch} per process at 224x224, {args.precision}, {args.rounds} "
          f"interleaved rounds of {args.steps} steps; peak: {counted}")  # fmt: skip
    print(f"{'model':<24} {'strategy':<8} {'step s':>7} {'fsdp/ddp':>8} {'peak MiB':>9} {'estimate':>9} {'ratio':>6}")
    for name in args.models:
        if args.device == "cpu":
            peaks = {s: measured_peak(name, s, args.batch, args.precision, args.world) for s in ("ddp", "fsdp")}
        ddp = statistics.median(t for rank in gathered for t in rank[(name, "ddp")]["times"])
        for strategy in ("ddp", "fsdp"):
            seconds = statistics.median(t for rank in gathered for t in rank[(name, strategy)]["times"])
            if args.device == "cpu":
                peak = peaks[strategy]
            else:
                peak = max(p for rank in gathered for p in rank[(name, strategy)]["peaks"])
            estimate = estimate_memory(
                name, 224, args.batch, training=True, precision=args.precision, device=args.device,
                strategy=strategy, world=args.world,
            )  # fmt: skip
            est = estimate.total_bytes
            print(
                f"{name:<24} {strategy:<8} {seconds:>7.2f} {seconds / ddp:>8.2f} {peak / 2**20:>9.0f} "
                f"{est / 2**20:>9.0f} {peak / est:>6.2f}"
            )


if __name__ == "__main__":
    main()
