"""Never losing work: a run killed with SIGKILL, or stopped with Ctrl-C in the middle of an epoch, and resumed
ends with the same weights, bit for bit, as the run that was never interrupted; a finished run extended with more
epochs continues on the cosine of the new length."""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vitkit.cli import main
from vitkit.train import TrainConfig, fit, loop
from vitkit.weights import read_model_info


def _start(command: list[str]) -> subprocess.Popen:
    # The same number of threads as this process, so that the float arithmetic is the same.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "CI": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(condition, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before it could be interrupted: {process.communicate()}"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.005)


def _epochs_logged(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_config):
    """The uninterrupted run, and its configuration for a folder of the test's choosing."""

    def config_for(out: Path) -> TrainConfig:
        return tiny_config(out, epochs=10, workers=0)

    out = tmp_path_factory.mktemp("reference")
    fit(config_for(out))
    return config_for, _final_weights(out)


def test_sigkill_at_any_moment_then_resume_is_bit_identical(tmp_path, reference, train_command):
    config_for, expected = reference
    config = config_for(tmp_path / "killed")
    process = _start(train_command(config))
    out = Path(config.out)
    _wait_for(lambda: _epochs_logged(out) >= 2, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "final").exists()
    result = fit(config, resume=True)
    assert result.epochs_done == 10
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 10
    _assert_identical(_final_weights(out), expected)


def test_ctrl_c_saves_mid_epoch_and_resume_is_bit_identical(tmp_path, reference, train_command):
    config_for, expected = reference
    config = config_for(tmp_path / "stopped")
    process = _start(train_command(config))
    out = Path(config.out)
    _wait_for(lambda: _epochs_logged(out) >= 1, process)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    hint = stdout.split("continue with: ")[1].splitlines()[0]
    assert hint == f"vitkit train --out {shlex.quote(config.out)} --resume"
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] > 0  # stopped after a step of an unfinished epoch
    assert main(shlex.split(hint)[1:]) == 0  # the hint, as printed
    _assert_identical(_final_weights(out), expected)


def test_a_detector_stopped_mid_epoch_resumes_bit_identical(tmp_path, tiny_detector_config):
    """A detector's own state resumes too: the box classifier trained beside the model, and the partial sums of
    the loss parts (the metrics lines are the uninterrupted run's). With dropout on, the model draws from torch's
    global generator, which the resumed run's new data iterator must leave alone."""
    dropout = {**tiny_detector_config(tmp_path).model_args, "drop_rate": 0.1}
    config = tiny_detector_config(tmp_path / "stopped", epochs=6, batch_size=4, model_args=dropout)
    reference = tiny_detector_config(tmp_path / "reference", epochs=6, batch_size=4, model_args=dropout)
    fit(reference)
    command = ["vitkit", "train", "--out", config.out, "--data", config.data, "--model", config.model]
    command += ["--epochs", "6", "--batch-size", "4", "--device", "cpu"]
    for key, value in config.model_args.items():
        command += ["--model-arg", f"{key}={value}"]
    process = _start(command)
    out = Path(config.out)
    _wait_for(lambda: _epochs_logged(out) >= 1, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] > 0
    fit(config, resume=True)
    _assert_identical(_final_weights(out), _final_weights(Path(reference.out)))
    expected = (Path(reference.out) / "metrics.jsonl").read_text().splitlines()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    drop = ("seconds", "images_per_second")
    assert [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines] == [
        {k: v for k, v in json.loads(line).items() if k not in drop} for line in expected
    ]


def _cosine_lr(step: int, total: int, peak: float, low: float) -> float:
    """The learning rate at optimizer step `step` of a cosine from `peak` to `low` over `total` steps, no warmup."""
    return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * min(step / (total - 1), 1.0)))


def test_more_epochs_continue_on_the_cosine_of_the_new_length(tmp_path, tiny_config, caplog):
    """One step per epoch (30 images, batches of 32), no warmup: each metrics line's lr is its step's. Extended
    from 2 to 4 epochs, the steps after the resume follow the 4-step cosine at once, and the first two lines stay."""
    config = tiny_config(tmp_path, epochs=2, batch_size=32, warmup_epochs=0.0)
    fit(config)
    before = (tmp_path / "metrics.jsonl").read_text().splitlines()
    peak, low = config.resolved().lr, config.resolved().min_lr
    assert [json.loads(line)["lr"] for line in before] == pytest.approx([_cosine_lr(s, 2, peak, low) for s in (0, 1)])
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        result = fit(tiny_config(tmp_path, epochs=4, batch_size=32, warmup_epochs=0.0), resume=True)
    assert result.epochs_done == 4
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines[:2] == before
    rates = [json.loads(line)["lr"] for line in lines[2:]]
    assert rates == pytest.approx([_cosine_lr(s, 4, peak, low) for s in (2, 3)])
    assert rates[0] > 10 * low  # the old schedule had reached min_lr: the longer cosine is higher there
    assert "extending the run from 2 to 4 epochs" in caplog.text
    assert json.loads((tmp_path / "config.json").read_text())["epochs"] == 4
    with pytest.raises(ValueError, match="can extend it, not shorten it"):
        fit(tiny_config(tmp_path, epochs=3, batch_size=32, warmup_epochs=0.0), resume=True)


def test_a_complete_run_without_its_final_model_writes_it_on_resume(tmp_path, tiny_config):
    """A run killed after its last checkpoint but before (or while) writing final/: resuming writes final/ from the
    checkpoint, equal to what the run would have written, instead of calling the run complete."""
    config = tiny_config(tmp_path, epochs=1)
    fit(config)
    expected = _final_weights(tmp_path)
    shutil.rmtree(tmp_path / "final")
    fit(config, resume=True)
    _assert_identical(_final_weights(tmp_path), expected)
    assert read_model_info(tmp_path / "final").data is not None  # the whole directory, its data's description too


def test_resuming_on_data_whose_classes_changed_is_refused(tmp_path, tiny_config, digit_folder):
    data = tmp_path / "data"
    shutil.copytree(digit_folder, data)
    config = tiny_config(tmp_path / "run", data=str(data), epochs=1)
    fit(config)
    shutil.copytree(data / "9", data / "9b")
    again = tiny_config(tmp_path / "run", data=str(data), epochs=2)
    with pytest.raises(
        ValueError,
        match=r"the data's classes have changed since the checkpoint .*\(new \['9b'\]; 10 "
        r"then, 11 now\)",
    ):
        fit(again, resume=True)


def test_loader_workers_leave_stop_signals_to_the_main_process():
    from vitkit.data import ignore_stop_signals

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        ignore_stop_signals(0)
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in before)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_run_from_init_resumes_when_that_model_is_gone(tmp_path, tiny_config, caplog):
    """A resumed run takes only the architecture from --init (the checkpoint holds the weights): with the model it
    started from moved away, it reads the architecture from the run's own saved model and ends as the run resumed
    with it there."""
    fit(tiny_config(tmp_path / "base", epochs=1))
    ends = []
    for name, move in (("kept", False), ("moved", True)):
        init = tmp_path / f"init_{name}"
        shutil.copytree(tmp_path / "base" / "final", init)
        out = tmp_path / name
        fields = dict(model=None, model_args={}, init=str(init), img_size=14)
        fit(tiny_config(out, epochs=1, **fields))
        if move:
            shutil.move(init, tmp_path / "elsewhere")
        with caplog.at_level(logging.INFO, logger="vitkit.train"):
            fit(tiny_config(out, epochs=2, **fields), resume=True)
        assert ("is gone: its architecture is read from" in caplog.text) == move
        ends.append(_final_weights(out))
    _assert_identical(*ends)


def test_a_kill_between_an_epochs_metrics_row_and_its_checkpoint_repeats_no_row(tmp_path, tiny_config, monkeypatch):
    """The epoch's row is written before its checkpoint: a run killed in between resumes from the epoch before and
    writes that epoch's row once, as the uninterrupted run does."""
    config = tiny_config(tmp_path, epochs=3)
    saving = loop.Run.save

    def killed_at_the_second_checkpoint(self, epoch_end=True):
        if epoch_end and self.epoch == 2:
            raise KeyboardInterrupt  # the process dies: no checkpoint of epoch 2
        saving(self, epoch_end)

    monkeypatch.setattr(loop.Run, "save", killed_at_the_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        fit(config)
    rows = [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2]  # the row of epoch 2 came before the kill
    monkeypatch.undo()
    fit(config, resume=True)
    rows = [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3]


def test_a_resume_of_a_sharded_run_without_a_checkpoint_names_the_sharded_checkpoint(tmp_path, tiny_config):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds no checkpoint \(no sharded checkpoint: checkpoint\.json not found\)"):
        fit(tiny_config(tmp_path, strategy="fsdp", ema_decay=0.0), resume=True)
    with pytest.raises(ValueError, match=r"holds no checkpoint \(checkpoint\.pt not found\)"):
        fit(tiny_config(tmp_path), resume=True)


def test_a_stopped_run_names_its_best_model_so_far(tmp_path, tiny_config, monkeypatch, caplog):
    stopping = loop.Run.sync_stop
    monkeypatch.setattr(loop.Run, "sync_stop", lambda self, stop: self.epoch == 1 or stopping(self, stop))
    caplog.set_level(logging.INFO, logger="vitkit.train")  # as `vitkit train` shows it; alone, the root's WARNING
    result = fit(tiny_config(tmp_path))
    assert result.interrupted
    best = f"{result.best_value:.4f}"
    assert f"the best model so far is in {tmp_path / 'best'} (val_acc {best}, epoch 1)" in caplog.text
