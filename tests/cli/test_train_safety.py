"""`vitkit train --resume / --force` never lose work and never surprise: every hint is a complete command that works
as printed, the original command plus --resume resumes, --force keeps the earlier run until the new one has a
checkpoint; models keep working from another folder and --init takes checkpoint files."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitkit import create_model
from vitkit.cli import main
from vitkit.data import load_builtin, write_image_folder
from vitkit.train import loop
from vitkit.train.checkpoint import save_checkpoint
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistEnv
from vitkit.train.outputs import ASIDE_MARK, LOCK_NAME, OutLock, RunHints

TINY = ["--model", "vit_tiny_patch16_224", "--model-arg", "img_size=28", "--model-arg", "patch_size=7"]
TINY += ["--model-arg", "embed_dim=16", "--model-arg", "depth=1", "--model-arg", "num_heads=2"]
TINY += ["--model-arg", "mlp_ratio=1", "--model-arg", "qkv_bias=true"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    _, test, info = load_builtin("mnist5k")
    return write_image_folder(test, info.classes, tmp_path_factory.mktemp("digits"), per_class=4)


def _train(data: Path, out: Path, *extra: str) -> list[str]:
    """The arguments (after `vitkit`) of a short training run."""
    args = ["train", *TINY, "--data", str(data), "--val-fraction", "0.25", "--batch-size", "8", "--device", "cpu"]
    return [*args, "--epochs", "1", "--out", str(out), *extra]


def _files(aside: Path) -> dict[Path, bytes]:
    """The outputs in a folder --force moved aside, without vitkit's mark."""
    return {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file() and p.name != ASIDE_MARK}


def _hint(text: str, after: str) -> list[str]:
    """The command printed after `after` in an error message, as arguments of `main` (without "vitkit")."""
    words = shlex.split(text.split(after, 1)[1].split("  ")[0].strip())
    assert words[:2] == ["vitkit", "train"]
    return words[1:]


def test_resume_without_a_checkpoint_is_an_error_with_the_command_that_starts_afresh(data, tmp_path, capsys):
    for out, where in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "is empty")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        assert main(_train(data, out, "--resume")) == 2
        err = capsys.readouterr().err
        assert f"nothing to resume: {out} {where} (checkpoint.pt not found)" in err
        fresh = _hint(err, "start a new run with: ")
        assert "--resume" not in fresh and fresh[-2:] == ["--out", str(out)]
        assert main(fresh) == 0  # the hint, as printed, trains
        assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("mine")
    assert main(_train(data, notes, "--resume")) == 2
    assert _hint(capsys.readouterr().err, "start a new run with: ")[-1] == "--force"  # a used folder needs it


def test_resume_and_force_together_is_an_error(data, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(_train(data, tmp_path, "--resume", "--force"))
    assert done.value.code == 2
    assert "argument --force: not allowed with argument --resume" in capsys.readouterr().err


def test_the_original_command_plus_resume_resumes_and_extends(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    assert main(_train(data, out, "--resume")) == 0  # with its --model-arg values, as first given
    said = capsys.readouterr().out  # the run is complete: nothing to resume, and how to train it longer
    assert f"the run in {out} is complete: it has trained 1 epoch (best val_acc" in said and "resuming" not in said
    assert _hint(said, "give more epochs: ") == ["train", "--out", str(out), "--resume", "--epochs", "2"]
    more = _train(data, out, "--resume")
    more[more.index("--epochs") + 1] = "2"
    assert main([*more, "--workers", "1"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert "extending the run from 1 to 2 epochs" in capsys.readouterr().out
    changed = _train(data, out, "--resume", "--model-arg", "depth=2")
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "different settings (model_args:" in err
    assert _hint(err, "Continue it with its own settings: ") == ["train", "--out", str(out), "--resume"]
    new = _hint(err, "in a new folder: ")
    assert new[-2:] == ["--out", f"{out}-2"] and "depth=2" in new
    assert main(new) == 0


def test_force_keeps_the_earlier_run_until_the_new_run_has_a_checkpoint(data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    (out / "notes.txt").write_text("mine")
    earlier = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "notes.txt"}

    def crash(self):
        raise RuntimeError("the machine fell over")

    monkeypatch.setattr("vitkit.train.loop.Run.end_epoch", crash)
    with pytest.raises(RuntimeError):
        main(_train(data, out, "--force"))
    (aside,) = tmp_path.glob("run.old-*")
    assert _files(aside) == earlier
    assert f"{aside} (a complete run of 1 epoch, its final model in {aside / 'final'})" in capsys.readouterr().out
    monkeypatch.undo()

    seen = []

    def spy(state, path):
        seen.append(sorted(p.name for p in tmp_path.glob("run.old-*")))
        return save_checkpoint(state, path)

    monkeypatch.setattr("vitkit.train.loop.save_checkpoint", spy)
    assert main(_train(data, out, "--force")) == 0
    (first,) = seen  # one epoch, one checkpoint: the complete run and the crashed one were both still aside
    assert len(first) == 2 and aside.name in first
    said = capsys.readouterr().out  # the second --force names the complete run, not only the crashed one it moved
    assert f"(kept as well: {aside} (a complete run of 1 epoch, its final model in {aside / 'final'}))" in said
    assert not list(tmp_path.glob("run.old-*"))  # both deleted once the new run trained its epoch: none orphaned
    assert (out / "notes.txt").read_text() == "mine"


def test_eval_works_from_another_folder(data, tmp_path, monkeypatch, capsys):
    """The model's config.json holds the data path absolute: a run trained with relative paths evaluates from
    anywhere."""
    shutil.copytree(data, tmp_path / "work" / "digits")
    monkeypatch.chdir(tmp_path / "work")
    assert main(_train(Path("digits"), Path("run"))) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["eval", "--model-dir", "work/run/final", "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 10


def test_init_with_a_checkpoint_that_does_not_fit_is_a_one_line_error(data, tmp_path, capsys):
    wide = create_model(
        "vit_tiny_patch16_224", img_size=28, patch_size=7, embed_dim=32, depth=1, num_heads=2, mlp_ratio=1.0
    )
    torch.save(wide.state_dict(), tmp_path / "wide.pth")
    assert main(_train(data, tmp_path / "run", "--init", str(tmp_path / "wide.pth"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "is a ViT with embed_dim 32, the model has 16: pass --model-arg embed_dim=32" in err


def test_a_forced_run_stopped_in_its_first_epoch_keeps_the_earlier_run(data, tmp_path, monkeypatch, capsys):
    """Ctrl-C moments after `--force` (a wrong --out, say) saves the new run's checkpoint but leaves the earlier
    run's outputs where --force moved them, and says where."""
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    earlier = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr("vitkit.train.loop.Run.sync_stop", lambda self, stop: True)  # Ctrl-C at the first step
    assert main(_train(data, out, "--force")) == 130
    (aside,) = tmp_path.glob("run.old-*")
    assert _files(aside) == earlier
    assert (out / "checkpoint.pt").is_file()
    said = capsys.readouterr().out
    assert "the run ended within its first epoch; the earlier run's outputs are kept" in said
    assert f"{aside} (a complete run of 1 epoch" in said


def test_the_run_force_replaced_is_kept_and_named_until_an_epoch_is_done(data, tmp_path, capsys, monkeypatch):
    """--force moves the earlier run aside; the new run stopped in its first epoch (Ctrl-C: a checkpoint within the
    epoch) keeps it, and the refusals name it; a --resume that finishes the epoch deletes it."""
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    stopping = loop.Run.sync_stop
    monkeypatch.setattr(loop.Run, "sync_stop", lambda self, stop: self.step == 1 or stopping(self, stop))
    assert main(_train(data, out, "--force")) == 130
    monkeypatch.setattr(loop.Run, "sync_stop", stopping)
    aside = list(tmp_path.glob("run.old-*"))
    assert len(aside) == 1 and (aside[0] / "final").is_dir()
    said = capsys.readouterr()
    assert f"{aside[0]} (a complete run of 1 epoch" in said.out + said.err
    assert main(_train(data, out)) == 2  # not empty: the refusal names the folder kept aside
    said = capsys.readouterr().err
    assert f"The outputs of the run --force replaced in {out} are kept until a run there trains an epoch: " in said
    assert f"{aside[0]} (a complete run of 1 epoch" in said
    assert main(["train", "--out", str(out), "--resume"]) == 0
    assert not aside[0].exists() and "deleted the earlier run's outputs" in capsys.readouterr().out


def test_forces_and_kills_in_any_order_always_name_the_complete_run(data, tmp_path, monkeypatch, capsys):
    """A complete run; --force, killed before its first checkpoint; --force again, stopped in its first epoch: every
    message names the complete run (and the half runs) until a run in the folder trains an epoch."""
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0

    def killed(self, stop):
        raise KeyboardInterrupt  # as kill -9 in the first step: no checkpoint

    monkeypatch.setattr(loop.Run, "train_epoch", killed)
    with pytest.raises(KeyboardInterrupt):
        main(_train(data, out, "--force"))
    monkeypatch.undo()
    (complete,) = tmp_path.glob("run.old-*")
    named = f"{complete} (a complete run of 1 epoch, its final model in {complete / 'final'})"
    capsys.readouterr()
    assert main(_train(data, out, "--resume")) == 2  # nothing to resume: the refusal names the complete run
    assert named in capsys.readouterr().err

    monkeypatch.setattr(loop.Run, "sync_stop", lambda self, stop: True)  # Ctrl-C at the first step
    assert main(_train(data, out, "--force")) == 130
    monkeypatch.undo()
    said = capsys.readouterr()
    assert named in said.out + said.err
    assert sorted(tmp_path.glob("run.old-*"))[0] == complete and len(list(tmp_path.glob("run.old-*"))) == 2
    assert main(_train(data, out)) == 2  # not empty: names both, the complete run first
    err = capsys.readouterr().err
    assert named in err and "(a run stopped in its first epoch, with no model)" in err
    assert main(["train", "--out", str(out), "--resume"]) == 0  # trains its epoch: then neither is kept
    assert not list(tmp_path.glob("run.old-*"))


def test_a_second_run_in_the_same_folder_is_refused_naming_the_first(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    assert not (out / LOCK_NAME).exists()  # a run lets its folder go
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )  # another run, as far as OUT can tell
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        for extra in (["--resume", "--epochs", "2"], ["--force"], []):
            assert main(_train(data, out, *extra)) == 2
            err = capsys.readouterr().err
            assert f"{out} is in use by another training run (process {holder.pid} on " in err
            assert "or train in a new folder: vitkit train" in err
        assert sorted(p.name for p in out.iterdir()) == before and not list(tmp_path.glob("run.old-*"))
    finally:
        holder.kill()  # killed: the system releases its lock
        holder.wait()
    assert main(_train(data, out, "--resume", "--epochs", "2")) == 0
    assert [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_killed_run_frees_its_folder_though_its_loader_workers_live_on(tmp_path):
    """The lock is the run's process's alone: a child forked with the lock file open (a loader worker, which
    outlives a `kill -9` of its parent for a while) does not keep OUT held."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WITH_CHILD, str(out)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert holder.stdout.readline().strip() == "held"
        child = int(holder.stdout.readline())
        holder.kill()  # kill -9: the child lives on, the file still open in it
        holder.wait()
        os.kill(child, 0)  # still running
        lock = OutLock(out, DistEnv(0, 1, 0, torch.device("cpu"), False), RunHints())
        lock.acquire(TrainConfig(out=str(out)))
        assert lock.held
        lock.release()
    finally:
        holder.kill()
        if child is not None:
            os.kill(child, signal.SIGKILL)


def test_a_second_run_in_the_same_process_is_refused_and_leaves_the_first_its_lock(tmp_path):
    """A POSIX lock is the whole process's: a second run into the same folder from this process (a thread, a
    notebook) is refused all the same, and its refusal leaves the first run's lock in place for other processes."""
    out = tmp_path / "run"
    env = DistEnv(0, 1, 0, torch.device("cpu"), False)
    first = OutLock(out, env, RunHints())
    first.acquire(TrainConfig(out=str(out)))
    try:
        with pytest.raises(ValueError, match=rf"is in use by another training run \(process {os.getpid()}, this one\)"):
            OutLock(out, env, RunHints()).acquire(TrainConfig(out=str(out)))
        other = subprocess.run([sys.executable, "-c", HOLD, str(out)], capture_output=True, text=True, timeout=60)
        assert "is in use by another training run" in other.stderr  # still held against other processes
    finally:
        first.release()
    second = OutLock(out, env, RunHints())
    second.acquire(TrainConfig(out=str(out)))  # free once the first lets it go
    second.release()


HOLD_WITH_CHILD = """
import os, sys, time
from pathlib import Path
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistEnv
from vitkit.train.outputs import OutLock, RunHints
import torch
lock = OutLock(Path(sys.argv[1]), DistEnv(0, 1, 0, torch.device("cpu"), False), RunHints())
lock.acquire(TrainConfig(out=sys.argv[1]))
print("held", flush=True)
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
print(pid, flush=True)
time.sleep(600)
"""


HOLD = """
import sys, time
from pathlib import Path
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistEnv
from vitkit.train.outputs import OutLock, RunHints
import torch
lock = OutLock(Path(sys.argv[1]), DistEnv(0, 1, 0, torch.device("cpu"), False), RunHints())
lock.acquire(TrainConfig(out=sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def test_a_folder_of_the_users_named_like_an_aside_is_neither_named_nor_deleted(data, tmp_path, capsys):
    """Only folders vitkit moved aside (marked so) are kept, named and deleted after an epoch: a user's own
    run.old-baseline stays as it is."""
    mine = tmp_path / "run.old-baseline"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    assert main(_train(data, out, "--force")) == 0
    said = capsys.readouterr()
    assert "run.old-baseline" not in said.out + said.err
    assert (mine / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("run.old")] == ["run.old-baseline"]


def test_a_saved_models_folder_is_no_runs_and_a_lost_config_resumes_from_the_checkpoint(data, tmp_path, capsys):
    """A run's final/ holds a saved model: training there, forced or resumed, is refused before anything moves,
    naming the run above it and --init; the model still loads. A run whose config.json was lost resumes from the
    settings its checkpoint saved."""
    out = tmp_path / "run"
    assert main(_train(data, out)) == 0
    before = _files(out / "final")
    for extra, init in ((("--force",), f"--init {out / 'final'}"), (("--resume",), "the run's init")):
        assert main(_train(data, out / "final", *extra)) == 2
        err = capsys.readouterr().err
        said = f"{out / 'final'} holds a saved model (its config.json names the model's family), not a training run"
        assert said in err and f"The run that wrote it is {out}." in err and init in err
    assert _files(out / "final") == before
    (out / "config.json").unlink()
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_run_whose_data_moved_resumes_from_its_new_place(data, tmp_path, capsys):
    """The data folder moved after the run began: resuming says so (not that the path is some other kind of data)
    and takes the folder's new place, the only setting that may change for it."""
    old, new, out = tmp_path / "digits", tmp_path / "moved", tmp_path / "run"
    shutil.copytree(data, old)
    assert main(_train(old, out)) == 0
    old.rename(new)
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2"]) == 2
    said = f"the run in {out} trained on {old}, which is gone (moved or deleted): put it back, or give its new place"
    assert said in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2", "--data", str(tmp_path / "typo")]) == 2
    assert "which is gone" not in capsys.readouterr().err  # a place given that does not exist: not the run's data
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2", "--data", str(new)]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_warmup_as_long_as_the_run_is_said(data, tmp_path, capsys):
    """A warmup of the whole run never anneals the learning rate: the run trains, and says so at its start."""
    assert main(_train(data, tmp_path / "run", "--warmup-epochs", "2")) == 0
    said = "--warmup-epochs 2.0 is not shorter than the run's 1 epoch: the learning rate rises the whole run"
    assert said in capsys.readouterr().out
    assert main(_train(data, tmp_path / "short", "--warmup-epochs", "0.5")) == 0
    assert "is not shorter than the run's" not in capsys.readouterr().out
