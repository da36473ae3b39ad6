"""`vitkit train --resume / --force` never lose work and never surprise: every hint is a complete command that works
as printed, the original command plus --resume resumes, --force keeps the earlier run until the new one has a
checkpoint; models keep working from another folder and --init takes checkpoint files."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from vitkit import create_model
from vitkit.cli import main
from vitkit.data import load_builtin, write_image_folder
from vitkit.train import loop
from vitkit.train.checkpoint import save_checkpoint

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
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == earlier
    assert f"the earlier run's outputs are in {aside}" in capsys.readouterr().out
    monkeypatch.undo()

    seen = []

    def spy(state, path):
        seen.append(sorted(p.name for p in tmp_path.glob("run.old-*")))
        return save_checkpoint(state, path)

    monkeypatch.setattr("vitkit.train.loop.save_checkpoint", spy)
    assert main(_train(data, out, "--force")) == 0
    (first,) = seen  # one epoch, one checkpoint: the outputs of the crashed run were still aside when it came
    assert len(first) == 2 and aside.name in first
    assert [p.name for p in tmp_path.glob("run.old-*")] == [aside.name]  # and are deleted after it
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
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == earlier
    assert (out / "checkpoint.pt").is_file()
    assert f"the run ended within its first epoch; the earlier run's outputs are in {aside}" in capsys.readouterr().out


def test_the_run_force_replaced_is_kept_and_named_until_an_epoch_is_done(
    data, tmp_path, capsys, monkeypatch
):
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
    assert f"the earlier run's outputs are in {aside[0]}" in said.out + said.err
    assert main(_train(data, out)) == 2  # not empty: the refusal names the folder kept aside
    assert f"the outputs of the run --force replaced there are kept in {aside[0]}" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume"]) == 0
    assert not aside[0].exists() and "deleted the earlier run's outputs" in capsys.readouterr().out
