"""`vitkit convert` speaks in its own flags: --model-arg and --reset-head for the ways out, --model with the
registered models that fit a checkpoint, and a checkpoint of another width named by its width."""

import json

import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.weights.convert import convert

SMALL_AT_32 = ["--model-arg", "img_size=32", "--model-arg", "num_classes=5"]


def _tiny_checkpoint(tmp_path):
    path = tmp_path / "tiny.pth"
    torch.save(vitkit.create_model("vit_tiny_patch16_224", img_size=32, num_classes=5).state_dict(), path)
    return path


def test_checkpoint_of_another_width(tmp_path, capsys):
    path = _tiny_checkpoint(tmp_path)
    args = ["convert", str(path), "--out", str(tmp_path / "out"), "--model", "vit_small_patch16_224", *SMALL_AT_32]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"vitkit convert: error: {path} is a ViT with embed_dim 192, the model has 384: pass --model NAME with a "
        "registered model of that size: deit_tiny_patch16_224, vit_tiny_patch16_224, or pass --model-arg "
        "embed_dim=192 --model-arg num_heads=3"  # every field that makes it ViT-Tiny, not only the one the shapes show
    )
    assert not (tmp_path / "out").exists()
    # Either way out works, and gives ViT-Tiny itself: the same outputs.
    assert main([*args, "--model-arg", "embed_dim=192", "--model-arg", "num_heads=3"]) == 0
    tiny = vitkit.create_model("vit_tiny_patch16_224", img_size=32, num_classes=5).eval()
    tiny.load_state_dict(torch.load(path, weights_only=True))
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(vitkit.from_pretrained(tmp_path / "out").eval()(x), tiny(x))
    assert (
        main(["convert", str(path), "--out", str(tmp_path / "out2"), "--model", "vit_tiny_patch16_224", *SMALL_AT_32])
        == 0
    )


def test_classifier_messages_use_the_flags(tmp_path, capsys):
    path = _tiny_checkpoint(tmp_path)
    args = [
        "convert",
        str(path),
        "--out",
        str(tmp_path / "out"),
        "--model",
        "vit_tiny_patch16_224",
        "--model-arg",
        "img_size=32",
    ]
    assert main(args) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "has a classifier for 5 classes, the model 1000: pass --model-arg num_classes=5, or pass --reset-head to "
            "keep the model's freshly initialised head"
        )
    )
    assert main([*args, "--model-arg", "num_classes=0"]) == 2
    err = capsys.readouterr().err
    assert "has a classifier but the model has none (num_classes=0): pass --model-arg num_classes=5, or pass " in err
    assert "reset_head" not in err and "build the model" not in err


def test_close_model_names_and_other_families(tmp_path, capsys):
    path = _tiny_checkpoint(tmp_path)
    assert main(["convert", str(path), "--out", str(tmp_path / "out"), "--model", "vit_tiny_patch16_22"]) == 2
    assert "unknown model 'vit_tiny_patch16_22'; closest: vit_tiny_patch16_224" in capsys.readouterr().err

    swin = tmp_path / "swin.pth"
    torch.save(vitkit.create_model("swin_tiny_patch4_window7_224", img_size=64).state_dict(), swin)
    assert main(["convert", str(swin), "--out", str(tmp_path / "out"), "--model", "vit_tiny_patch16_224"]) == 2
    err = capsys.readouterr().err
    assert "it looks like a vitkit swin checkpoint" in err
    assert err.strip().endswith("pass --model NAME with a registered model of that size: swin_tiny_patch4_window7_224")


def test_class_names_travel_through_convert(tmp_path):
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, num_classes=2, depth=1)
    vitkit.save_pretrained(model, tmp_path / "vk", vitkit.weights.ModelInfo(("no", "yes"), (0.5,), (0.5,)))
    assert main(["convert", str(tmp_path / "vk"), "--out", str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"] == {"0": "no", "1": "yes"}
    assert main(["convert", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (saved["classes"], saved["mean"], saved["std"]) == (["no", "yes"], [0.5] * 3, [0.5] * 3)


@pytest.mark.parametrize("given", ["hf", "torchvision"])
def test_a_file_read_in_the_wrong_layout_names_the_right_one(tmp_path, capsys, given):
    path = _tiny_checkpoint(tmp_path)
    args = ["convert", str(path), "--out", str(tmp_path / "out"), "--model", "vit_tiny_patch16_224", *SMALL_AT_32]
    assert main([*args, "--from", given]) == 2
    err = capsys.readouterr().err
    assert f"is in the timm / vitkit layout, not {given}'s: read it as vitkit (--from vitkit)" in err
    assert "format=" not in err  # the command's flags, not the library's arguments
    assert "missing" not in err  # not the same names listed as missing and unexpected
    assert main([*args, "--from", "timm"]) == 0


@pytest.mark.parametrize(
    ("flag", "given", "meant"), [("--from", "huggingface", "hf"), ("--to", "torchvison", "torchvision")]
)
def test_a_misspelt_layout_gets_the_closest_name(tmp_path, capsys, flag, given, meant):
    with pytest.raises(SystemExit) as done:
        main(["convert", "a.pth", "--out", str(tmp_path / "out"), flag, given])
    assert done.value.code == 2
    assert f"unknown layout {given!r}: did you mean {meant}? (known: " in capsys.readouterr().err


def test_a_head_count_kept_from_the_named_model_is_said(tmp_path, capsys):
    """A ViT-Tiny file read into ViT-Small with only its width set: no tensor says the heads, so the 6 of ViT-Small
    are kept; the report says so, with the flag to give the file's. Given, or with nothing resized, no note."""
    path = _tiny_checkpoint(tmp_path)
    args = ["convert", str(path), "--model", "vit_small_patch16_224", *SMALL_AT_32, "--model-arg", "embed_dim=192"]
    assert main([*args, "--out", str(tmp_path / "six")]) == 0
    out = capsys.readouterr().out
    assert (
        "  note: num_heads 6 was assumed (vit_small_patch16_224's, kept when embed_dim changed): no tensor of the "
        "checkpoint says it (the registered models of its size, deit_tiny_patch16_224, vit_tiny_patch16_224, have "
        "3); if its model has another, give --model-arg num_heads=N\n"
    ) in out
    assert json.loads((tmp_path / "six" / "config.json").read_text())["config"]["num_heads"] == 6
    assert main([*args, "--model-arg", "num_heads=3", "--out", str(tmp_path / "three")]) == 0
    assert "note:" not in capsys.readouterr().out
    tiny = ["convert", str(path), "--model", "vit_tiny_patch16_224", *SMALL_AT_32, "--out", str(tmp_path / "tiny")]
    assert main(tiny) == 0
    assert "note:" not in capsys.readouterr().out
    # the library's report says the same in its arguments
    fields = {"img_size": 32, "num_classes": 5, "embed_dim": 192}
    report, _ = convert(path, tmp_path / "lib", model_name="vit_small_patch16_224", overrides=fields)
    assert list(report.kept) == ["num_heads"] and report.summary().endswith("give num_heads=N")


def test_a_training_checkpoint_given_as_a_model_names_its_runs_models(tmp_path, capsys):
    """A run's checkpoint.pt holds no config, but its run's best/ and final/ do: the error names them."""
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    run = tmp_path / "run"
    vitkit.save_pretrained(model, run / "final")
    torch.save({"model": model.state_dict(), "epoch": 1}, run / "checkpoint.pt")
    from PIL import Image

    Image.new("RGB", (32, 32)).save(tmp_path / "x.png")
    for command in (["eval", "--model-dir"], ["predict", str(tmp_path / "x.png"), "--model-dir"]):
        assert main([*command, str(run / "checkpoint.pt")]) == 2
        err = capsys.readouterr().err
        assert f"it is a training run's checkpoint; give one of the run's models: {run / 'final'}" in err
    with pytest.raises(ValueError, match=r"load one of its run's model directories instead: .*final"):
        vitkit.from_pretrained(run / "checkpoint.pt")
    torch.save(model.state_dict(), run / "downloaded.pth")  # another file beside them is no checkpoint of the run
    with pytest.raises(ValueError, match=r"build the registered model it fits and load the file into it"):
        vitkit.from_pretrained(run / "downloaded.pth")
