"""Distributed training with two CPU processes (Gloo): the same gradients and the same training as one process
on the same global batch, and only rank 0 writing and reporting."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from vitkit import create_model
from vitkit.data import EpochSampler, TransformedImages, load_folder, make_loader, normalize, train_transform
from vitkit.train import fit, forward_loss
from vitkit.train.distributed import cleanup, setup

MODEL = {"img_size": 28, "patch_size": 7, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_step_gradients(folder: str, rank: int, world_size: int, batch_size: int) -> dict[str, torch.Tensor]:
    """Gradients of the first training step as `vitkit.train.fit` takes it, on this process's shard."""
    train, _, info = load_folder(folder, 0.25, seed=0)
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", num_classes=10, **MODEL)
    trained = DistributedDataParallel(model) if world_size > 1 else model
    sampler = EpochSampler(len(train), world_size, rank, seed=0)
    sampler.set_epoch(0)
    images = TransformedImages(train, train_transform((28, 28), 3, min_scale=0.5, hflip=0.5))
    batch = next(iter(make_loader(images, sampler, batch_size)))
    pixels = normalize(batch.images, info.mean, info.std)
    forward_loss(trained, pixels, batch.labels, nn.CrossEntropyLoss(label_smoothing=0.1), "fp32").backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _worker(rank: int, world_size: int, port: int, folder: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    env = setup("cpu")
    try:
        gradients = _first_step_gradients(folder, env.rank, env.world_size, batch_size=4)
        if env.is_main:
            torch.save(gradients, out)
    finally:
        cleanup(env)


def test_two_processes_compute_the_gradients_of_the_global_batch(tmp_path, digit_folder):
    out = tmp_path / "gradients.pt"
    mp.spawn(_worker, args=(2, _free_port(), str(digit_folder), str(out)), nprocs=2, join=True)
    distributed = torch.load(out, weights_only=True)
    single = _first_step_gradients(str(digit_folder), rank=0, world_size=1, batch_size=8)
    assert distributed.keys() == single.keys()
    for name, grad in single.items():
        torch.testing.assert_close(distributed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_torchrun_trains_like_one_process_and_only_rank_0_writes(tmp_path, tiny_config, train_command):
    fit(tiny_config(tmp_path / "single"))
    config = tiny_config(tmp_path / "ddp")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    command += train_command(config, batch_size=config.batch_size // 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("epoch 1/2") == 1 and done.stdout.count("epoch 2/2") == 1
    out = Path(config.out)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "config.json").read_text())["batch_size"] == 4
    assert torch.load(out / "checkpoint.pt", weights_only=True)["world_size"] == 2
    single = load_file(tmp_path / "single" / "final" / "model.safetensors")
    ddp = load_file(out / "final" / "model.safetensors")
    for name, value in single.items():
        torch.testing.assert_close(ddp[name], value, rtol=0, atol=1e-4, msg=name)
