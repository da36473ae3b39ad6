"""`fit`: outputs, held-out metrics against an explicit evaluation, refusing to overwrite, flags, fine-tuning,
unreadable images."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import from_pretrained
from vitkit.data import DataInfo, load_folder
from vitkit.train import enable_grad_checkpointing, fit, load_checkpoint


def _explicit_accuracy(model_dir: Path, folder: Path, val_fraction: float) -> float:
    """Held-out accuracy computed without vitkit's data pipeline: PIL, numpy and the model."""
    model = from_pretrained(model_dir)
    info = DataInfo.load(model_dir)
    _, val, _ = load_folder(folder, val_fraction, seed=0)
    correct = 0
    for path, label in zip(val.paths, val.labels, strict=True):
        pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3), 28x28 already
        x = (torch.from_numpy(pixels).permute(2, 0, 1) - torch.tensor(info.mean)[:, None, None]) / torch.tensor(
            info.std
        )[:, None, None]
        with torch.no_grad():
            correct += int(model(x[None]).argmax().item() == label)
    return correct / len(val)


def test_fit_writes_config_metrics_checkpoint_and_models(tmp_path, tiny_config, digit_folder):
    config = tiny_config(tmp_path / "run")
    result = fit(config)
    out = tmp_path / "run"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2]
    fields = {"epoch", "train_loss", "val_loss", "val_acc", "lr", "seconds", "images_per_second", "skipped"}
    assert all(set(m) == fields for m in lines)
    saved = json.loads((out / "config.json").read_text())
    assert saved["min_scale"] == 0.25 and saved["hflip"] == 0.5 and saved["device"] == "cpu"  # resolved defaults
    assert saved["model_args"]["embed_dim"] == 16
    assert result.epochs_done == 2 and not result.interrupted and result.last == lines[-1]

    final = from_pretrained(out / "final")
    state = load_checkpoint(out / "checkpoint.pt")
    assert state["epoch"] == 2 and state["step"] == 0
    assert all(torch.equal(v, state["model"][k]) for k, v in final.state_dict().items())
    assert DataInfo.load(out / "final").classes == tuple("0123456789")
    # The logged validation accuracy is the accuracy an independent evaluation finds.
    assert lines[-1]["val_acc"] == pytest.approx(_explicit_accuracy(out / "final", digit_folder, 0.25))
    best = max(lines, key=lambda m: m["val_acc"])
    assert result.best_acc == best["val_acc"] and result.best_epoch == best["epoch"]
    assert (out / "best" / "model.safetensors").is_file()


def test_refuses_a_used_folder_unless_resumed_or_forced(tmp_path, tiny_config):
    config = tiny_config(tmp_path, epochs=1)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty: pass --resume .* or --force"):
        fit(config)
    fit(config, force=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only vitkit's own outputs are replaced
    resumed = fit(config, resume=True)  # nothing left to train: the final model is written again
    assert resumed.epochs_done == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
    with pytest.raises(ValueError, match=r"different settings \(lr: 0.002 -> 0.1\)"):
        fit(tiny_config(tmp_path, epochs=1, lr=0.1), resume=True)


def test_every_training_option_runs(tmp_path, tiny_config):
    config = tiny_config(
        tmp_path,
        epochs=1,
        precision="bf16",
        ema_decay=0.9,
        mixup=0.2,
        cutmix=1.0,
        randaugment=9,
        grad_checkpointing=True,
        workers=1,
        min_scale=0.5,
        hflip=0.0,
        clip_grad=0.0,
        label_smoothing=0.0,
    )
    result = fit(config)
    assert np.isfinite(result.last["train_loss"]) and np.isfinite(result.last["val_loss"])
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    final = from_pretrained(tmp_path / "final")
    # With EMA the saved models are the averaged weights, not the raw ones.
    assert all(torch.equal(v, state["ema"][k]) for k, v in final.state_dict().items())
    assert not all(torch.equal(v, state["model"][k]) for k, v in final.state_dict().items())


def test_grad_checkpointing_does_not_change_training(tmp_path, tiny_config):
    fit(tiny_config(tmp_path / "plain", epochs=1))
    fit(tiny_config(tmp_path / "ckpt", epochs=1, grad_checkpointing=True))
    plain, ckpt = from_pretrained(tmp_path / "plain" / "final"), from_pretrained(tmp_path / "ckpt" / "final")
    for (name, a), b in zip(plain.state_dict().items(), ckpt.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def test_botnet_trains_with_grad_checkpointing_as_without(tmp_path, tiny_config, monkeypatch):
    """`vitkit train --model botnet26t_256 --grad-checkpointing`, narrowed: its 8 bottleneck and BoT blocks are
    recomputed, and the weights and BatchNorm statistics come out as without checkpointing."""
    wrapped = []

    def spy(model: torch.nn.Module) -> int:
        wrapped.append(enable_grad_checkpointing(model))
        return wrapped[-1]

    monkeypatch.setattr("vitkit.train.loop.enable_grad_checkpointing", spy)
    botnet = dict(model="botnet26t_256", model_args=dict(img_size=32, stem_chs=16, widths=(32, 64, 128, 256)))
    fit(tiny_config(tmp_path / "plain", epochs=1, **botnet))
    fit(tiny_config(tmp_path / "ckpt", epochs=1, grad_checkpointing=True, **botnet))
    assert wrapped == [8]
    plain, ckpt = from_pretrained(tmp_path / "plain" / "final"), from_pretrained(tmp_path / "ckpt" / "final")
    assert any("running_mean" in name for name in plain.state_dict())
    for (name, a), b in zip(plain.state_dict().items(), ckpt.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def test_finetune_from_a_trained_model(tmp_path, tiny_config):
    fit(tiny_config(tmp_path / "base", epochs=1))
    three = tmp_path / "three"
    for label in range(3):
        for i in range(4):
            folder = three / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((20, 20, 3), 60 * label + i, dtype=np.uint8)).save(folder / f"{i}.png")
    config = tiny_config(
        tmp_path / "tuned",
        data=str(three),
        model=None,
        model_args={},
        init=str(tmp_path / "base" / "final"),
        img_size=14,
        epochs=1,
    )
    fit(config)
    base, tuned = from_pretrained(tmp_path / "base" / "final"), from_pretrained(tmp_path / "tuned" / "final")
    assert tuned.config.num_classes == 3 and tuned.config.img_size == 14 and tuned.pos_embed.shape[1] == 1 + 4
    assert DataInfo.load(tmp_path / "tuned" / "final").classes == ("class0", "class1", "class2")
    assert tuned.config.embed_dim == base.config.embed_dim


def test_unreadable_images_are_skipped_with_one_warning_each(tmp_path, tiny_config, digit_folder, caplog):
    folder = tmp_path / "data"
    for path in digit_folder.rglob("*.png"):
        target = folder / path.relative_to(digit_folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    broken = sorted((folder / "3").iterdir())
    for path in broken[:2]:
        path.write_bytes(b"\x89PNG broken")
    with caplog.at_level(logging.WARNING, logger="vitkit.train"):
        fit(tiny_config(tmp_path / "run", data=str(folder)))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(warned) == sorted(f"skipped unreadable image {p}" for p in broken[:2])
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["skipped"] for m in lines] == [2, 2]


def test_batches_with_no_readable_image_still_step(tmp_path, tiny_config, digit_folder):
    folder = tmp_path / "data"
    for split in ("train", "val"):
        for path in sorted(digit_folder.rglob("*.png"))[:20:2]:
            target = folder / split / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes() if split == "val" else b"broken")
    result = fit(tiny_config(tmp_path / "run", data=str(folder), epochs=1))
    assert result.last["skipped"] == 10 and result.last["train_loss"] == 0.0
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
