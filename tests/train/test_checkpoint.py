"""Checkpoints: atomic writes, weights-only reads, RNG states."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from vitkit.train import load_checkpoint, save_checkpoint
from vitkit.train.checkpoint import rng_state, set_rng_state


def test_round_trip_and_rng_states(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = {"model": {"w": torch.arange(4.0)}, "epoch": 3, "rng": rng_state()}
    path = save_checkpoint(state, tmp_path / "checkpoint.pt")
    draws = (random.random(), np.random.rand(), torch.rand(2))
    loaded = load_checkpoint(path)
    assert loaded["epoch"] == 3 and torch.equal(loaded["model"]["w"], torch.arange(4.0))
    set_rng_state(loaded["rng"])
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint({"epoch": 1}, tmp_path / "checkpoint.pt")

    def half_written(obj, f, *args, **kwargs):
        with open(f, "wb") as handle:
            handle.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"epoch": 2}, path)
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_damaged_or_code_carrying_files_are_refused(tmp_path):
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable PyTorch checkpoint"):
        load_checkpoint(damaged)
    carrying = tmp_path / "code.pt"
    torch.save({"f": print}, carrying)
    with pytest.raises(ValueError, match="refused"):
        load_checkpoint(carrying)
