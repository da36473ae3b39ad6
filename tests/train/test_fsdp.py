"""Sharded training (`--strategy fsdp`, `vitkit.train.sharding`) on CPU processes (Gloo): the same training as one
process and as DDP on the same global batch; sharded checkpoints that resume bit-identically after a rank is killed,
and on another number of processes (resharding) to the same weights."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch import nn
from torch.distributed.tensor import DTensor

from vitkit import create_model, from_pretrained
from vitkit.data import (
    EpochSampler,
    TransformedImages,
    load_digits_detect,
    load_folder,
    make_loader,
    normalize,
    train_transform,
    write_coco_folder,
)
from vitkit.train import TrainConfig, fit, forward_loss
from vitkit.train.distributed import DistEnv, barrier, cleanup, setup
from vitkit.train.sharding import (
    POINTER_NAME,
    TRAINER_STATE,
    Lockstep,
    load_sharded,
    resharded_batch,
    save_sharded,
    shard,
    sharded_model_state,
)

TINY_MODEL = {"img_size": 28, "patch_size": 7, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 1.0}
pytestmark = pytest.mark.xdist_group("fsdp")  # one worker makes the runs the tests share (make test: loadgroup)

CLIP = 0.1  # below the tiny ViT's gradient norms: every step clips, by the norm over all shards
GLOBAL_BATCH = 6  # 30 training digits: 5 steps an epoch on 1, 2 or 3 processes (batches of 6, 3, 2)
# A process that kills itself (SIGKILL, no chance to save) after the step KILL_AT = "epoch,step,rank" (0-based
# epoch, steps done in it), then runs `vitkit` with its arguments.
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from vitkit.cli import main
    from vitkit.train import loop

    epoch, step, rank = map(int, os.environ["KILL_AT"].split(","))
    sync_stop = loop.Run.sync_stop

    def killing(self, stop):
        if (self.epoch, self.step, self.env.rank) == (epoch, step, rank):
            os.kill(os.getpid(), signal.SIGKILL)
        return sync_stop(self, stop)

    loop.Run.sync_stop = killing
    sys.exit(main(sys.argv[1:]))
    """
)


class Runs:
    """`vitkit train` runs of the tiny ViT on the digits, 2 epochs of batches of GLOBAL_BATCH, shared by the tests of
    this module: each is made once, on first use, in `root`."""

    def __init__(self, root: Path, tiny_config, train_command) -> None:
        self.root, self.tiny_config, self.train_command = root, tiny_config, train_command
        self.killer = root / "killer.py"
        self.killer.write_text(KILLER)
        self.made: set[str] = set()

    def launch(self, name: str, processes: int, strategy: str, resume: bool = False, kill_at: str | None = None):
        """The finished (or killed) process of `vitkit train` on `processes` (torchrun when more than one)."""
        out = self.root / name
        config = self.tiny_config(out, epochs=2, strategy=strategy)
        if resume:
            args = ["vitkit", "train", "--out", str(out), "--resume"]
        else:
            args = self.train_command(config, batch_size=GLOBAL_BATCH // processes)
            args += ["--strategy", strategy, "--clip-grad", str(CLIP)]
        program = [str(self.killer), *args[1:]] if kill_at else ["-m", *args]
        if processes > 1:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
            command += [str(processes), *program]
        else:
            command = [sys.executable, *program]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1", "KILL_AT": kill_at or ""}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        if kill_at is None:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def finished(self, name: str, processes: int, strategy: str) -> Path:
        """The output folder of an uninterrupted run (one process: `fit` in this process)."""
        if name not in self.made:
            if processes == 1:
                fit(self.tiny_config(self.root / name, batch_size=GLOBAL_BATCH, strategy=strategy, clip_grad=CLIP))
            else:
                self.launch(name, processes, strategy)
            self.made.add(name)
        return self.root / name

    def killed(self, processes: int, copy: str) -> Path:
        """A copy named `copy` of a run killed in its second epoch (rank `processes - 1`, after 2 steps), whose
        sharded checkpoint of the first epoch is whole."""
        name = f"killed{processes}"
        out = self.root / name
        if name not in self.made:
            done = self.launch(name, processes, "fsdp", kill_at=f"1,2,{processes - 1}")
            assert done.returncode != 0
            assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
            folder = out / json.loads((out / POINTER_NAME).read_text())["folder"]
            assert (folder / TRAINER_STATE).is_file() and not (out / "final").exists()
            self.made.add(name)
        shutil.copytree(out, self.root / copy)
        return self.root / copy


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_config, train_command) -> Runs:
    return Runs(tmp_path_factory.mktemp("fsdp"), tiny_config, train_command)


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        torch.testing.assert_close(b[key], value, rtol=0, atol=atol, msg=key)


def test_fsdp_trains_like_one_process_and_like_ddp(runs):
    single = weights(runs.finished("single", 1, "ddp"))
    ddp = weights(runs.finished("ddp", 2, "ddp"))
    out = runs.finished("fsdp", 2, "fsdp")
    summary = (out / "metrics.jsonl").read_text()
    assert len(summary.splitlines()) == 2
    # 2 processes of batches of 3 average the gradients of the global batch of 6 (not sum them: pytorch #162338)
    assert_same(single, ddp, atol=1e-5)
    assert_same(single, weights(out), atol=1e-5)
    assert_same(ddp, weights(out), atol=1e-5)
    assert not (out / "checkpoint.pt").exists() and len(list(out.glob("checkpoint-*"))) == 1
    assert json.loads((out / "config.json").read_text())["strategy"] == "fsdp"
    best = json.loads((out / "best" / "config.json").read_text())
    assert best["family"] == "vit" and best["classes"] == [str(i) for i in range(10)]


def _first_step_gradients(
    folder: str, env: DistEnv, batch_size: int, precision: str, checkpointing: bool
) -> dict[str, torch.Tensor]:
    """The whole gradients of the first training step as `fit` takes it on this process's batch: under fsdp (the
    model sharded when there are several processes) with `precision` and gradient checkpointing or not."""
    train, _, info = load_folder(folder, 0.25, seed=0)
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", num_classes=10, **TINY_MODEL)
    if checkpointing:
        model.set_grad_checkpointing()
    trained = shard(model, model, precision) if env.world_size > 1 else model
    sampler = EpochSampler(len(train), env.world_size, env.rank, seed=0)
    images = TransformedImages(train, train_transform((28, 28), 3, min_scale=0.5, hflip=0.5))
    batch = next(iter(make_loader(images, sampler, batch_size)))
    pixels = normalize(batch.images, info.mean, info.std)
    forward_loss(trained, pixels, batch.labels, nn.CrossEntropyLoss(), precision).backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {k: g.full_tensor() if isinstance(g, DTensor) else g for k, g in grads.items()}


def _gradients_worker(rank: int, port: int, folder: str, out: str, precision: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    env = setup("cpu")
    try:
        gradients = _first_step_gradients(folder, env, 4, precision, checkpointing=True)
        if env.is_main:
            torch.save(gradients, out)
        barrier(env)  # as `fit` ends: no process leaves the group while Gloo still sends to it (a SIGABRT at exit)
    finally:
        cleanup(env)
    # the gradients are saved and the group left: exit without the interpreter's teardown, where Gloo's threads can
    # still abort the process now and then ("terminate called without an active exception", SIGABRT)
    os._exit(0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_sharded_processes_average_the_gradients_of_the_global_batch(tmp_path, digit_folder, precision):
    """AdamW's steps do not show a gradient scale (sums instead of averages over the processes, the Gloo bug of
    pytorch #162338): the gradients themselves are compared, of 2 processes of 4 images, sharded and checkpointed,
    against one process of 8. In bf16, FSDP computes with bf16 copies of the weights, the single process under
    autocast: the same up to bf16 rounding."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "gradients.pt"
    mp.spawn(_gradients_worker, args=(port, str(digit_folder), str(out), precision), nprocs=2, join=True)
    sharded = torch.load(out, weights_only=True)
    single = _first_step_gradients(str(digit_folder), setup("cpu"), 8, precision, checkpointing=False)
    assert sharded.keys() == single.keys()
    for name, grad in single.items():
        if precision == "fp32":
            torch.testing.assert_close(sharded[name], grad, rtol=1e-5, atol=1e-7, msg=name)
        else:  # within bf16's rounding of the gradient's scale, far from a factor of 2
            scale = grad.abs().max().item()
            torch.testing.assert_close(sharded[name], grad, rtol=0, atol=0.05 * scale, msg=name)
            assert sharded[name].float().norm() == pytest.approx(grad.float().norm().item(), rel=0.05)


def test_fsdp_resumes_bit_identically_after_a_rank_is_killed(runs):
    whole = runs.finished("fsdp", 2, "fsdp")
    out = runs.killed(2, copy="resumed")
    done = runs.launch("resumed", 2, "fsdp", resume=True)
    assert "resuming at epoch 2" in done.stdout
    assert_same(weights(whole), weights(out), atol=0)
    ours, theirs = ([json.loads(line) for line in (o / "metrics.jsonl").read_text().splitlines()] for o in (out, whole))
    assert [line["train_loss"] for line in ours] == [line["train_loss"] for line in theirs]
    assert [line["val_acc"] for line in ours] == [line["val_acc"] for line in theirs]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 3)])  # fewer processes, and more by an uneven share
def test_fsdp_resumes_on_another_number_of_processes(runs, before, after):
    out = runs.killed(before, copy=f"moved{before}to{after}")
    if after == 1:
        fit(TrainConfig.for_resume(out), resume=True)
    else:
        done = runs.launch(out.name, after, "fsdp", resume=True)
        assert f"each of the {after} now takes {GLOBAL_BATCH // after}" in done.stdout
    assert json.loads((out / "config.json").read_text())["batch_size"] == GLOBAL_BATCH // after
    assert_same(weights(runs.finished("single", 1, "ddp")), weights(out), atol=1e-5)


def test_a_fresh_run_replaces_a_sharded_checkpoint(runs):
    out = runs.root / "replaced"
    shutil.copytree(runs.finished("fsdp", 2, "fsdp"), out)
    fit(runs.tiny_config(out, epochs=1, batch_size=GLOBAL_BATCH, strategy="fsdp"), force=True)
    folders = [p.name for p in out.glob("checkpoint-*")]
    assert folders == [json.loads((out / POINTER_NAME).read_text())["folder"]]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    assert not list(runs.root.glob("replaced.old-*"))  # moved aside, deleted after the first epoch


def test_resharding_keeps_the_global_batch():
    assert resharded_batch(3, 2, 1) == 6 and resharded_batch(6, 1, 3) == 2
    with pytest.raises(ValueError, match="global batch of 6 images .* 4 processes cannot share.*1, 2, 3, 6"):
        resharded_batch(3, 2, 4)


def test_ddp_checkpoint_names_fsdp_when_the_processes_change(runs):
    out = runs.finished("ddp", 2, "ddp")
    with pytest.raises(ValueError, match="written by 2 processes and this run has 1.*strategy='fsdp'"):
        fit(TrainConfig.for_resume(out, epochs=3), resume=True)


def test_a_sharded_checkpoint_of_another_model_is_refused_naming_its_tensors(tmp_path):
    """Resuming reads a sharded checkpoint into the model the run builds: where that model has other tensors (its data
    or the model it started from changed since), the error names them before anything is read, not DCP's missing
    key deep in its planner. Their names and sizes come from the checkpoint's metadata alone."""
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_group=False)
    saved = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    folder = save_sharded(tmp_path, saved, torch.optim.AdamW(saved.parameters()), {"epoch": 1}, env)
    shapes = sharded_model_state(folder)
    assert {k: (tuple(v.shape), v.device.type) for k, v in shapes.items()} == {
        "0.weight": ((8, 4), "meta"), "0.bias": ((8,), "meta"), "1.weight": ((2, 8), "meta"), "1.bias": ((2,), "meta"),
    }  # fmt: skip
    other = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2), nn.Linear(2, 2))
    expected = (
        r"the sharded checkpoint .*checkpoint-1 does not fit the model this run builds \(the model's tensors it "
        r"lacks: 2\.bias, 2\.weight; saved sizes against the model's: 0\.bias \(8,\) against \(6,\), "
        r"0\.weight \(8, 4\) against \(6, 4\), 1\.weight \(2, 8\) against \(2, 6\)\)"
    )
    with pytest.raises(ValueError, match=expected):
        load_sharded(folder, other, torch.optim.AdamW(other.parameters()))
    same = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    load_sharded(folder, same, torch.optim.AdamW(same.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), same.state_dict().values(), strict=True))


def test_fsdp_refuses_an_ema():
    with pytest.raises(ValueError, match="ema_decay 0.99 keeps a whole copy .* strategy fsdp"):
        TrainConfig(strategy="fsdp", ema_decay=0.99)


def test_lockstep_runs_the_passes_a_process_lacks():
    unit = torch.nn.Linear(2, 2)
    calls = []
    unit.register_forward_hook(lambda *_: calls.append("pass"))

    def evaluate(batches):  # an evaluation that skips an empty batch
        for batch in batches:
            if batch:
                unit(torch.zeros(1, 2))

    evaluate(Lockstep([[1], [], [1]], passes=4, counted=unit, idle=lambda: unit(torch.ones(1, 2))))
    assert len(calls) == 4  # 2 batches with images, then 2 blank passes
    calls.clear()
    evaluate(Lockstep([[1], [1]], passes=2, counted=unit, idle=lambda: unit(torch.ones(1, 2))))
    assert len(calls) == 2


def test_fsdp_trains_and_evaluates_a_detector_on_uneven_shares(tmp_path):
    """The default detector (denoising queries, two-stage) at a tiny size, sharded over 2 processes; 5 validation
    images in batches of 2 give one process 2 batches and the other 1 (`Lockstep` keeps them in step)."""
    train, val, _ = load_digits_detect()
    data = tmp_path / "coco"
    write_coco_folder(train, data, "train", limit=8)
    write_coco_folder(val, data, "val", limit=5)
    tiny = {"backbone_width": 8, "hidden_dim": 32, "num_heads": 2, "dim_feedforward": 32, "num_queries": 6}
    tiny |= {"enc_layers": 1, "dec_layers": 2, "dn_queries": 12}
    out = tmp_path / "detector"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "vitkit"]
    command += ["train", "--out", str(out), "--data", str(data), "--epochs", "1", "--batch-size", "2"]
    command += ["--device", "cpu", "--strategy", "fsdp"] + [f"--model-arg={k}={v}" for k, v in tiny.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    line = json.loads((out / "metrics.jsonl").read_text())
    assert 0.0 <= line["ap"] <= 1.0
    assert "postprocess" in json.loads((out / "final" / "config.json").read_text())  # how it reads detections
    model = from_pretrained(out / "final")
    assert model.config.dn_queries == 12 and not any(isinstance(p, DTensor) for p in model.parameters())
