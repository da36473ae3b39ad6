"""`fit`: outputs, held-out metrics against an explicit evaluation, refusing to overwrite, flags, fine-tuning (from
model directories and from checkpoint files of other layouts), unreadable images, the start summary, the curves and
the progress bar."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model, from_pretrained, save_pretrained
from vitkit.cli.messages import TRAIN, cli_message
from vitkit.data import Unreadable, UnreadableImageError, load_folder, open_image, summarize_unreadable
from vitkit.train import TrainConfig, build_training_model, enable_grad_checkpointing, fit, load_checkpoint
from vitkit.train.model import describe_init
from vitkit.util import counted
from vitkit.viz import write_curves
from vitkit.weights import CheckpointMismatch, ModelInfo, load_report, read_model_info

# The layout of the tiny ViT that `tiny_config` trains (tests/train/conftest.py).
TINY_MODEL = {"img_size": 28, "patch_size": 7, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 1.0}


def _explicit_accuracy(model_dir: Path, folder: Path, val_fraction: float) -> float:
    """Held-out accuracy computed without vitkit's data pipeline: PIL, numpy and the model."""
    model = from_pretrained(model_dir)
    info = read_model_info(model_dir)
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
    # The class names, the normalisation and the data's description travel in the model's config.json.
    _, _, data = load_folder(digit_folder, 0.25, seed=0)
    for name in ("best", "final"):
        info = read_model_info(out / name)
        assert info.classes == tuple("0123456789") and (info.mean, info.std) == (data.mean, data.std)
        assert (info.val_fraction, info.split_seed, info.category_ids, info.postprocess) == (0.25, 0, None, None)
        # The data path is stored absolute, so the model's data is found from any folder.
        assert info.data == str(digit_folder.resolve()) == saved["data"]
    assert sorted(p.name for p in (out / "final").iterdir()) == ["config.json", "model.safetensors"]
    # The logged validation accuracy is the accuracy an independent evaluation finds.
    assert lines[-1]["val_acc"] == pytest.approx(_explicit_accuracy(out / "final", digit_folder, 0.25))
    best = max(lines, key=lambda m: m["val_acc"])
    assert result.best_acc == best["val_acc"] and result.best_epoch == best["epoch"]
    assert (out / "best" / "model.safetensors").is_file()


def test_refuses_a_used_folder_unless_resumed_or_forced(tmp_path, tiny_config):
    config = tiny_config(tmp_path, epochs=1)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(
        ValueError, match=r"not empty: start there anyway with: fit\(TrainConfig\(.*\), force=True\)"
    ) as caught:
        fit(config)
    # the way on as a Python call, which works as printed
    hint = str(caught.value).split("start there anyway with: ")[1].split("  ")[0]
    eval(hint, {"fit": fit, "TrainConfig": TrainConfig})
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only vitkit's own outputs are replaced
    final = (tmp_path / "final" / "model.safetensors").stat().st_mtime_ns
    resumed = fit(config, resume=True)  # nothing left to train: said, and nothing changed
    assert resumed.epochs_done == 1 and resumed.last["epoch"] == 1 and not resumed.interrupted
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
    assert (tmp_path / "final" / "model.safetensors").stat().st_mtime_ns == final
    with pytest.raises(ValueError, match=r"different settings \(lr: 0.002 -> 0.1\)"):
        fit(tiny_config(tmp_path, epochs=1, lr=0.1), resume=True)
    resume = r"continue the run there with: fit\(TrainConfig.for_resume\('\S+'\), resume=True\)"
    with pytest.raises(ValueError, match=resume):
        fit(config)


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
    assert read_model_info(tmp_path / "tuned" / "final").classes == ("class0", "class1", "class2")
    assert tuned.config.embed_dim == base.config.embed_dim


@pytest.mark.parametrize("named", [False, True], ids=["folder", "folder-and-model"])
def test_finetuning_normalises_images_as_the_initial_weights_were(tmp_path, tiny_config, caplog, named):
    """From a model folder, with `--model` naming its architecture or not: the folder's normalisation."""
    config = tiny_config(tmp_path / "run", init=str(tmp_path / "start"), epochs=1, **({} if named else {"model": None}))
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", **config.model_args, num_classes=10)
    save_pretrained(model, tmp_path / "start", ModelInfo(mean=(0.5,) * 3, std=(0.25,) * 3))  # as timm's augreg
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(config)
    saved = read_model_info(tmp_path / "run" / "final")
    assert (saved.mean, saved.std) == ((0.5,) * 3, (0.25,) * 3)
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "normalised as the initial weights were trained: mean (0.5, 0.5, 0.5), std (0.25, 0.25, 0.25)" in said
    fit(tiny_config(tmp_path / "scratch", epochs=1))  # from scratch: the data's
    assert read_model_info(tmp_path / "scratch" / "final").mean == (0.485, 0.456, 0.406)


def _reason(path: Path) -> str:
    """Why `open_image` refuses a file."""
    with pytest.raises(UnreadableImageError) as caught:
        open_image(path)
    return caught.value.reason


def test_unreadable_images_are_listed_with_their_reason_every_epoch(tmp_path, tiny_config, digit_folder, caplog):
    folder = tmp_path / "data"
    for path in digit_folder.rglob("*.png"):
        target = folder / path.relative_to(digit_folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    config = tiny_config(tmp_path / "run", data=str(folder))
    train, _, _ = load_folder(folder, config.val_fraction, seed=config.seed)
    broken = [p for p in train.paths if p.parent.name == "3"][:2]  # two training images
    broken[0].write_bytes(b"\x89PNG broken")
    broken[1].write_bytes(broken[1].read_bytes()[:60])  # truncated
    with caplog.at_level(logging.WARNING, logger="vitkit.train"):
        fit(config)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = summarize_unreadable(Unreadable(str(p), _reason(p)) for p in broken)
    assert warned == [expected, expected]  # after each epoch that met them
    assert all(f"{p}: {_reason(p)}" in expected for p in broken)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["skipped"] for m in lines] == [2, 2]


def test_an_epoch_with_no_readable_image_is_refused(tmp_path, tiny_config, digit_folder, caplog, monkeypatch):
    """Batches of unreadable images step through (nothing crashes), but an epoch that read none stops the run with
    the files and their reasons, and saves no model: it learnt nothing."""
    # files that break after the folder was read (a class of only broken files is refused when it is read)
    monkeypatch.setattr("vitkit.data.sources._none_readable", lambda files: None)
    folder = tmp_path / "data"
    for split in ("train", "val"):
        for path in sorted(digit_folder.rglob("*.png"))[:20:2]:
            target = folder / split / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes() if split == "val" else b"broken")
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError) as caught:
        fit(tiny_config(tmp_path / "run", data=str(folder), epochs=1))  # val_fraction 0.25 given
    said = str(caught.value)
    assert said.startswith("no training image of epoch 1 could be read; skipped 10 unreadable images:")
    assert str(folder / "train") in said and "Fix or remove them" in said
    message = f"val_fraction 0.25 is ignored: {folder} has a val/ folder, which is the validation split"
    assert [r.getMessage() for r in caplog.records].count(message) == 1  # said once, by the run, not the loader
    assert json.loads((tmp_path / "run" / "config.json").read_text())["val_fraction"] is None
    assert not (tmp_path / "run" / "final").exists()


def _torchvision_vit(num_classes: int):
    """torchvision's ViT in the layout of the tiny ViT the tests train (28x28 images, 7x7 patches, width 16)."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(1)
    return VisionTransformer(28, 7, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=16, num_classes=num_classes)


def test_init_from_checkpoint_files_of_other_layouts(tmp_path, tiny_config):
    """`--init FILE --model NAME`: a torchvision .pth loads with equal logits; another class count keeps everything
    but the classifier; a timm .safetensors of another image size gets its position table resampled as timm does."""
    import timm
    from safetensors.torch import save_file
    from timm.layers import resample_abs_pos_embed

    theirs = _torchvision_vit(10).eval()
    torch.save(theirs.state_dict(), tmp_path / "torchvision.pth")
    config = tiny_config(tmp_path / "run", init=str(tmp_path / "torchvision.pth")).resolved()
    assert config.model == "vit_tiny_patch16_224" and config.init == str(tmp_path / "torchvision.pth")
    model = build_training_model(config, num_classes=10).eval()
    x = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), atol=1e-5, rtol=1e-5)
    three = build_training_model(config, num_classes=3)
    assert three.head.weight.shape == (3, 16)
    loaded = model.state_dict()
    assert all(torch.equal(v, loaded[k]) for k, v in three.state_dict().items() if not k.startswith("head."))

    timm_model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**TINY_MODEL, "img_size": 56})
    save_file(timm_model.state_dict(), tmp_path / "timm.safetensors")  # 1000 classes, an 8x8 grid
    config = tiny_config(tmp_path / "run", init=str(tmp_path / "timm.safetensors")).resolved()
    model = build_training_model(config, num_classes=10)
    expected = resample_abs_pos_embed(timm_model.pos_embed.detach(), (4, 4), (8, 8), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected)
    assert torch.equal(model.blocks[1].mlp.fc2.weight, timm_model.blocks[1].mlp.fc2.weight)
    # the run's summary says what the file gave and what was adapted: resampled, reset
    said = describe_init(load_report(model), 10)
    assert said.startswith("loaded ") and "resampled pos_embed: 8x8 -> 4x4 grid" in said
    assert said.endswith("reset head for 10 classes (the checkpoint's head has 1000)")


def test_init_that_does_not_fit_names_the_train_options(tmp_path, tiny_config):
    save_pretrained(create_model("vit_tiny_patch16_224", **{**TINY_MODEL, "embed_dim": 32}), tmp_path / "wide")
    torch.save(create_model("vit_tiny_patch16_224", **{**TINY_MODEL, "embed_dim": 32}).state_dict(), tmp_path / "w.pt")
    for init in (tmp_path / "wide", tmp_path / "w.pt"):
        config = tiny_config(tmp_path / "run", init=str(init)).resolved()
        with pytest.raises(CheckpointMismatch, match=r"embed_dim 32, the model has 16: build the model with") as caught:
            build_training_model(config, num_classes=10)
        assert caught.value.fields == {"embed_dim": 32}
        assert cli_message(caught.value, TRAIN).endswith("the model has 16: pass --model-arg embed_dim=32")
    # A directory alone builds the model saved there, with --model-arg fields replaced.
    alone = tiny_config(tmp_path / "run", model=None, model_args={"embed_dim": 16}, init=str(tmp_path / "wide"))
    with pytest.raises(CheckpointMismatch) as caught:
        build_training_model(alone.resolved(), num_classes=10)
    said = cli_message(caught.value, TRAIN)
    assert said.endswith("pass --model-arg embed_dim=32") and "--set" not in said and "reset" not in said


def test_start_summary_curves_and_class_names_of_a_run_from_a_checkpoint_file(
    tmp_path, tiny_config, digit_folder, caplog, monkeypatch
):
    """A run fine-tuned from a torchvision file, written into a folder that does not exist yet: the summary says
    what trains on what, and curves.png is redrawn from the metrics lines after every epoch."""
    torch.save(_torchvision_vit(10).state_dict(), tmp_path / "torchvision.pth")
    drawn = []

    def spy(records, path):
        drawn.append([r["epoch"] for r in records])
        return write_curves(records, path)

    monkeypatch.setattr("vitkit.train.loop.write_curves", spy)
    out = tmp_path / "new" / "run"
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(tiny_config(out, init=str(tmp_path / "torchvision.pth")))
    assert drawn == [[1], [1, 2]]
    assert Image.open(out / "curves.png").size == (1000, 400)
    messages = [r.getMessage() for r in caplog.records]
    summary = next(m for m in messages if m.startswith("training "))
    assert messages.index(summary) < next(i for i, m in enumerate(messages) if m.startswith("epoch 1/2"))
    final = from_pretrained(out / "final")
    trainable = sum(p.numel() for p in final.parameters())
    train, val, _ = load_folder(digit_folder, 0.25, seed=0)
    assert summary.splitlines() == [
        f"training vit_tiny_patch16_224 (classification), initialised from {tmp_path / 'torchvision.pth'}: "
        f"{trainable:,} trainable parameters",
        f"  data    {digit_folder}: 10 classes (0, 1, 2, 3, 4, ...), {len(train)} train / {len(val)} val images, "
        "seen as 3x28x28",
        "  run     2 epochs of 4 steps, batch 8, lr 0.002",
        f"  device  cpu, fp32, {counted(torch.get_num_threads(), 'thread')}, 0 loader workers",
        f"  output  {out}",
    ]
    assert read_model_info(out / "final").classes == tuple("0123456789")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_epoch_longer_than_the_delay_shows_a_progress_bar(tmp_path, tiny_config, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    for delay, shown in ((0.0, True), (60.0, False)):
        terminal = _Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        monkeypatch.setattr("vitkit.train.loop.PROGRESS_DELAY", delay)
        fit(tiny_config(tmp_path / f"run{delay}", epochs=1))
        if shown:  # the bar of the epoch's 4 steps (30 images, batches of 8)
            assert "epoch 1/1:" in terminal.getvalue() and "/4 [" in terminal.getvalue()
        else:
            assert terminal.getvalue() == ""


def test_a_bf16_run_where_bf16_is_slow_says_so_last_in_its_summary(tmp_path, tiny_config, caplog, monkeypatch):
    asked = []

    def slow(precision, device, name):
        asked.append((precision, str(device)))
        return f"bf16 is slower than fp32 on this CPU (...): use fp32 ({name('precision', 'fp32')})"

    monkeypatch.setattr("vitkit.train.loop.slow_precision", slow)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        fit(tiny_config(tmp_path / "run", precision="bf16", epochs=1))
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert asked == [("bf16", "cpu")]
    assert (
        summary.splitlines()[-1] == "  warning bf16 is slower than fp32 on this CPU (...): use fp32 (precision='fp32')"
    )


def test_the_epoch_line_shows_a_slow_rate_with_two_digits_not_zero():
    from vitkit.train.loop import rate

    assert [rate(v) for v in (0.0, 0.0424, 0.42, 3.14159, 9.96, 10.0, 13.6, 1234.4)] == [
        "0", "0.042", "0.42", "3.1", "10", "10", "14", "1234",
    ]  # fmt: skip


def test_a_class_folder_of_only_unreadable_files_is_refused_before_training(tmp_path):
    """A class the model could never learn: every file of it fails to read (text named .jpg, a JPEG cut short); a
    class with one readable file among broken ones trains (its broken files are skipped and listed)."""
    rng = np.random.default_rng(0)
    good = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(good, "JPEG")
    for name in ("a", "b", "bad", "mixed"):
        (tmp_path / name).mkdir()
    for name in ("a", "b"):
        for k in range(3):
            Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(tmp_path / name / f"{k}.png")
    (tmp_path / "bad" / "0.jpg").write_text("not an image")
    (tmp_path / "bad" / "1.jpg").write_bytes(good.getvalue()[: len(good.getvalue()) // 3])
    (tmp_path / "mixed" / "0.jpg").write_text("not an image")
    (tmp_path / "mixed" / "1.jpg").write_bytes(good.getvalue())
    with pytest.raises(ValueError, match=r"class folder\(s\) \['bad'\] hold no readable image") as err:
        load_folder(tmp_path)
    assert "for example bad/0.jpg: cannot identify image file" in str(err.value)
    (tmp_path / "bad" / "0.jpg").unlink()
    with pytest.raises(ValueError, match=r"for example bad/1.jpg: Truncated File Read"):  # Pillow's words
        load_folder(tmp_path)
    (tmp_path / "bad" / "1.jpg").write_bytes(good.getvalue())  # one readable file: the class trains
    train, val, info = load_folder(tmp_path, val_fraction=0.5)
    assert list(info.classes) == ["a", "b", "bad", "mixed"] and len(train) + len(val) == 9
