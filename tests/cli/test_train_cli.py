"""`vitkit train / eval / predict / attention` end to end on a few digits, checked against explicit computations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import from_pretrained
from vitkit.cli import main
from vitkit.data import load_builtin, load_folder, write_image_folder
from vitkit.train import TrainConfig
from vitkit.viz import confusion_image
from vitkit.weights import read_model_info

TINY = ["--model", "vit_tiny_patch16_224", "--model-arg", "img_size=28", "--model-arg", "patch_size=7"]
TINY += ["--model-arg", "embed_dim=16", "--model-arg", "depth=2", "--model-arg", "num_heads=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained for one epoch on 30 digits; returns (run folder, data folder)."""
    _, test, info = load_builtin("mnist5k")
    data = write_image_folder(test, info.classes, tmp_path_factory.mktemp("digits"), per_class=4)
    out = tmp_path_factory.mktemp("run")
    args = ["train", *TINY, "--data", str(data), "--val-fraction", "0.25", "--epochs", "1", "--batch-size", "8"]
    assert main([*args, "--device", "cpu", "--out", str(out), "--force"]) == 0
    return out, data


def _explicit_probabilities(model_dir, path) -> torch.Tensor:
    """Softmax of the model on one image, preprocessed with PIL and numpy only (the digits are 28x28 already)."""
    model = from_pretrained(model_dir)
    info = read_model_info(model_dir)
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
    x = (torch.from_numpy(pixels) - torch.tensor(info.mean)) / torch.tensor(info.std)  # (H, W, 3)
    with torch.no_grad():
        return model(x.permute(2, 0, 1)[None]).softmax(dim=-1)[0]  # (K,)


def test_train_writes_a_run(trained, capsys):
    out, _ = trained
    assert {p.name for p in out.iterdir()} >= {"config.json", "metrics.jsonl", "checkpoint.pt", "best", "final"}
    assert json.loads((out / "config.json").read_text())["model_args"]["embed_dim"] == 16


def test_eval_reports_what_an_explicit_evaluation_finds(trained, capsys, tmp_path):
    out, data = trained
    plot = tmp_path / "confusion.png"
    assert main(["eval", "--model-dir", str(out / "final"), "--json", "--plot", str(plot), "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    _, val, _ = load_folder(data, 0.25, seed=0)
    probabilities = torch.stack([_explicit_probabilities(out / "final", p) for p in val.paths])  # (N, K)
    labels = torch.tensor(val.labels)
    assert report["images"] == len(val) == 10
    assert report["top1"] == pytest.approx((probabilities.argmax(1) == labels).float().mean().item())
    top5 = (probabilities.topk(5, dim=1).indices == labels[:, None]).any(1).float().mean().item()
    assert report["top5"] == pytest.approx(top5)
    loss = -probabilities[torch.arange(len(labels)), labels].log().mean().item()
    assert report["loss"] == pytest.approx(loss, rel=1e-4)
    predicted = probabilities.argmax(1)
    for k, name in enumerate("0123456789"):
        mine = labels == k
        assert mine.any()  # every digit has a held-out image
        assert report["per_class"][name] == pytest.approx((predicted[mine] == k).float().mean().item())
    assert sum(map(sum, report["confusion"])) == 10
    expected = confusion_image(torch.tensor(report["confusion"]), list("0123456789"))
    assert np.array_equal(np.asarray(Image.open(plot).convert("RGB")), np.asarray(expected))


def test_eval_prints_a_table(trained, capsys):
    out, _ = trained
    assert main(["eval", "--model-dir", str(out / "final"), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("images 10  loss ") and len(text.splitlines()) == 11


def test_predict_gives_the_top_classes_with_their_probabilities(trained, capsys):
    out, data = trained
    images = sorted(data.rglob("*.png"))[:2]
    assert main(["predict", "--model-dir", str(out / "final"), *map(str, images), "--top-k", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["image"] for row in rows] == [str(p) for p in images]
    for row, path in zip(rows, images, strict=True):
        probabilities = _explicit_probabilities(out / "final", path)
        values, indices = probabilities.topk(3)
        assert [t["class"] for t in row["top"]] == [str(i) for i in indices.tolist()]
        assert [t["probability"] for t in row["top"]] == pytest.approx(values.tolist(), rel=1e-5)
    assert main(["predict", "--model-dir", str(out / "final"), str(images[0]), "--top-k", "2"]) == 0
    header, row = capsys.readouterr().out.splitlines()  # a table: a header, then a row per image
    assert row.split()[0] == str(images[0])


def test_attention_writes_an_overlay(trained, capsys, tmp_path):
    out, data = trained
    image = str(sorted(data.rglob("*.png"))[0])
    for extra in ([], ["--rollout"], ["--layer", "0", "--head", "1"], ["--head", "mean", "--alpha", "0.3"]):
        target = tmp_path / f"heat{len(extra)}.png"
        assert main(["attention", "--model-dir", str(out / "final"), image, "--out", str(target), *extra]) == 0
        width, height = Image.open(target).size
        assert width > 2 * 224 and height > 224  # the image beside its map, a colour bar, a title
    assert "rollout" in capsys.readouterr().out
    assert main(["attention", "--model-dir", str(out / "final"), image, "--out", str(target), "--layer", "5"]) == 2
    assert "layer 5 is out of range" in capsys.readouterr().err


def test_user_mistakes_are_one_line_errors(trained, capsys, tmp_path):
    out, data = trained
    assert main(["train", *TINY, "--data", str(data), "--out", str(out), "--device", "cpu"]) == 2
    assert f"is not empty: continue the run there with: vitkit train --out {out} --resume" in capsys.readouterr().err
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    assert main(["predict", "--model-dir", str(out / "final"), str(text)]) == 1  # nothing could be read
    assert f"cannot read image {text}" in capsys.readouterr().err
    assert main(["eval", "--model-dir", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "run")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_resume_needs_only_the_folder(trained, capsys):
    out, _ = trained
    assert main(["train", "--out", str(out), "--resume", "--lr", "0.1"]) == 2
    assert "different settings (lr: 0.002 -> 0.1)" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume"]) == 0


def test_every_option_reaches_the_configuration(monkeypatch, tmp_path):
    seen = {}

    def fake_fit(config: TrainConfig, resume: bool, force: bool, **memory):
        seen.update(config=config, resume=resume, force=force)
        return type("Result", (), {"interrupted": False})()

    monkeypatch.setattr("vitkit.cli.train.fit", fake_fit)
    args = ["train", "--model", "vit_small_patch16_224", "--model-arg", "depth=3", "--model-arg", "global_pool=avg"]
    args += ["--data", "builtin:mnist5k", "--val-fraction", "0.3", "--epochs", "7", "--batch-size", "16"]
    args += ["--lr", "0.01", "--min-lr", "0.001", "--warmup-epochs", "1.5", "--weight-decay", "0.1"]
    args += ["--label-smoothing", "0.2", "--clip-grad", "2", "--ema-decay", "0.99", "--img-size", "32"]
    args += ["--precision", "bf16", "--device", "cpu", "--workers", "3", "--seed", "9", "--min-scale", "0.4"]
    args += ["--hflip", "0.1", "--randaugment", "7", "--mixup", "0.8", "--cutmix", "1.0", "--grad-checkpointing"]
    args += ["--out", str(tmp_path), "--force"]
    assert main(args) == 0
    expected = TrainConfig(
        out=str(tmp_path), data="builtin:mnist5k", val_fraction=0.3, model="vit_small_patch16_224",
        model_args={"depth": 3, "global_pool": "avg"}, init=None, img_size=32, epochs=7, batch_size=16, lr=0.01,
        min_lr=0.001, warmup_epochs=1.5, weight_decay=0.1, label_smoothing=0.2, clip_grad=2.0, ema_decay=0.99,
        precision="bf16", device="cpu", workers=3, seed=9, min_scale=0.4, hflip=0.1, randaugment=7, mixup=0.8,
        cutmix=1.0, grad_checkpointing=True,
    )  # fmt: skip
    assert seen == {"config": expected, "resume": False, "force": True}
    assert main(["train", "--out", str(tmp_path), "--init", str(tmp_path / "model")]) == 0
    assert seen["config"] == TrainConfig(out=str(tmp_path), init=str(tmp_path / "model"))
