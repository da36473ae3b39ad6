"""Sharded training (`--strategy fsdp`, `vitkit.train.sharding`) on CPU processes (Gloo): the same training as one
process and as DDP on the same global batch; sharded checkpoints that resume bit-identically after a rank is killed,
and on another number of processes (resharding) to the same weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitkit.train import TrainConfig, fit
from vitkit.train.sharding import POINTER_NAME, TRAINER_STATE, resharded_batch

pytestmark = pytest.mark.xdist_group("fsdp")  # one worker makes the runs the tests share (make test: loadgroup)

GLOBAL_BATCH = 6  # 30 training digits: 5 steps an epoch on 1, 2 or 3 processes (batches of 6, 3, 2)
# A process that kills itself (SIGKILL, no chance to save) after the step KILL_AT = "epoch,step,rank" (0-based
# epoch, steps done in it), then runs `vitkit` with its arguments.
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from vitkit.cli import main
    from vitkit.train import loop

    epoch, step, rank = map(int, os.environ["KILL_AT"].split(","))
    sync_stop = loop._Run._sync_stop

    def killing(self, stop):
        if (self.epoch, self.step, self.env.rank) == (epoch, step, rank):
            os.kill(os.getpid(), signal.SIGKILL)
        return sync_stop(self, stop)

    loop._Run._sync_stop = killing
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
            args = self.train_command(config, batch_size=GLOBAL_BATCH // processes) + ["--strategy", strategy]
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
                fit(self.tiny_config(self.root / name, batch_size=GLOBAL_BATCH, strategy=strategy))
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
    assert best["family"] == "vit" and best["class_names"] == [str(i) for i in range(10)]


def test_fsdp_resumes_bit_identically_after_a_rank_is_killed(runs):
    whole = runs.finished("fsdp", 2, "fsdp")
    out = runs.killed(2, copy="resumed")
    done = runs.launch("resumed", 2, "fsdp", resume=True)
    assert "resuming at epoch 2" in done.stdout
    assert_same(weights(whole), weights(out), atol=0)
    ours, theirs = ([json.loads(line) for line in (o / "metrics.jsonl").read_text().splitlines()] for o in (out, whole))
    assert [line["train_loss"] for line in ours] == [line["train_loss"] for line in theirs]
    assert [line["val_acc"] for line in ours] == [line["val_acc"] for line in theirs]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3)])
def test_fsdp_resumes_on_another_number_of_processes(runs, before, after):
    out = runs.killed(before, copy=f"moved{before}to{after}")
    if after == 1:
        fit(TrainConfig.for_resume(out), resume=True)
    else:
        done = runs.launch(out.name, after, "fsdp", resume=True)
        assert f"each of the {after} now takes {GLOBAL_BATCH // after}" in done.stdout
    assert json.loads((out / "config.json").read_text())["batch_size"] == GLOBAL_BATCH // after
    assert_same(weights(runs.finished("single", 1, "ddp")), weights(out), atol=1e-5)


def test_resharding_keeps_the_global_batch():
    assert resharded_batch(3, 2, 1) == 6 and resharded_batch(6, 1, 3) == 2
    with pytest.raises(ValueError, match="global batch of 6 images .* 4 processes cannot share.*1, 2, 3, 6"):
        resharded_batch(3, 2, 4)


def test_ddp_checkpoint_names_fsdp_when_the_processes_change(runs):
    out = runs.finished("ddp", 2, "ddp")
    with pytest.raises(ValueError, match="written by 2 processes and this run has 1.*--strategy fsdp"):
        fit(TrainConfig.for_resume(out, epochs=3), resume=True)


def test_fsdp_refuses_an_ema():
    with pytest.raises(ValueError, match="ema_decay 0.99 keeps a whole copy .* strategy fsdp"):
        TrainConfig(strategy="fsdp", ema_decay=0.99)
