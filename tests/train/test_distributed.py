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
from vitkit.train import DetectionTask, TrainConfig, fit, forward_loss
from vitkit.train.distributed import DistEnv, barrier, cleanup, setup

MODEL = {"img_size": 28, "patch_size": 7, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 1.0}
TINY_DETR = {"backbone_width": 8, "hidden_dim": 16, "num_heads": 2, "dim_feedforward": 32, "num_queries": 6}


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
        barrier(env)  # as `fit` ends: no process leaves the group while Gloo still sends to it (a SIGABRT at exit)
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


def _detector_first_step_gradients(coco: str, env: DistEnv, batch_size: int) -> dict[str, torch.Tensor]:
    """Gradients of a detector's first training step as `fit` takes it, on this process's shard, with the box
    losses only: their normaliser, the number of boxes, is averaged over the processes, so that the sharded step
    is the global batch's step. (The cross-entropies average over each shard's queries or boxes, as DETR's.)"""
    # unaugmented: a batch split over two processes pads each half to its own largest image
    config = TrainConfig(
        out="unused", data=coco, model="detr_digits", model_args=TINY_DETR, batch_size=batch_size, device="cpu",
        box_cls_loss=0.0, hflip=0.0, scale_jitter=0.0, crop=0.0,
    ).resolved()  # fmt: skip
    task = DetectionTask(config, env)
    torch.manual_seed(0)
    model = create_model("detr_digits", num_classes=10, **TINY_DETR)
    task.prepare(model)
    task.criterion.weights["loss_ce"] = 0.0
    trained = DistributedDataParallel(model) if env.world_size > 1 else model
    task.set_epoch(0, 0)
    loss, _, _ = task.train_loss(trained, next(iter(task.train_loader)))
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def _detector_worker(rank: int, world_size: int, port: int, coco: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    env = setup("cpu")
    try:
        gradients = _detector_first_step_gradients(coco, env, batch_size=4)
        if env.is_main:
            torch.save(gradients, out)
        barrier(env)  # as `fit` ends: no process leaves the group while Gloo still sends to it (a SIGABRT at exit)
    finally:
        cleanup(env)


def test_two_processes_compute_a_detectors_box_loss_gradients_of_the_global_batch(tmp_path, digits_coco):
    out = tmp_path / "gradients.pt"
    mp.spawn(_detector_worker, args=(2, _free_port(), str(digits_coco), str(out)), nprocs=2, join=True)
    distributed = torch.load(out, weights_only=True)
    single = _detector_first_step_gradients(str(digits_coco), setup("cpu"), batch_size=8)
    assert distributed.keys() == single.keys() and "bbox_embed.layers.2.weight" in single
    for name, grad in single.items():
        torch.testing.assert_close(distributed[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_torchrun_trains_a_detector_and_only_rank_0_writes(tmp_path, tiny_detector_config):
    # the default detector (denoising queries, two-stage) at a tiny size: every parameter gets a gradient in every
    # process's step, as DistributedDataParallel needs
    tiny = {"backbone_width": 8, "hidden_dim": 32, "num_heads": 2, "dim_feedforward": 32, "num_queries": 6}
    tiny |= {"enc_layers": 1, "dec_layers": 2, "dn_queries": 12}
    config = tiny_detector_config(tmp_path / "ddp", epochs=1, model="deformable_detr_small", model_args=tiny)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "vitkit"]
    command += ["train", "--out", config.out, "--data", config.data, "--epochs", "1", "--batch-size", "4"]
    command += ["--device", "cpu"] + [f"--model-arg={k}={v}" for k, v in config.model_args.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("epoch 1/1") == 1 and "ap50" in done.stdout
    out = Path(config.out)
    line = json.loads((out / "metrics.jsonl").read_text())
    assert line["epoch"] == 1 and 0.0 <= line["ap"] <= 1.0
    assert torch.load(out / "checkpoint.pt", weights_only=True)["world_size"] == 2
    assert "postprocess" in json.loads((out / "final" / "config.json").read_text())  # how it reads detections
