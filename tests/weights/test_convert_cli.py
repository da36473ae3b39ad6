"""`vitkit convert` and `vitkit.weights.convert`: a Hugging Face directory and a torchvision file through vitkit and
back, equal logits."""

import os

import pytest
import torch
import transformers
from torchvision.models.vision_transformer import VisionTransformer

import vitkit
import vitkit.weights
from vitkit.cli import main
from vitkit.weights.convert import same_layout

TV_TINY = dict(image_size=32, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5)
SETS = ["--set", "img_size=32", "--set", "patch_size=4", "--set", "embed_dim=32", "--set", "depth=2"]
SETS += ["--set", "num_heads=4", "--set", "mlp_ratio=2.0", "--set", "num_classes=5"]


def test_convert_torchvision_file_round_trip(tmp_path, capsys):
    torch.manual_seed(0)
    theirs = VisionTransformer(**TV_TINY).eval()
    torch.save(theirs.state_dict(), tmp_path / "tv.pth")
    assert (
        main(["convert", str(tmp_path / "tv.pth"), str(tmp_path / "vk"), "--model", "vit_base_patch16_224", *SETS]) == 0
    )
    out = capsys.readouterr().out
    assert "torchvision layout, 32 tensors loaded" in out and f"wrote vitkit weights to {tmp_path / 'vk'}" in out

    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = theirs(x)
        torch.testing.assert_close(vitkit.from_pretrained(tmp_path / "vk")(x), expected, atol=1e-5, rtol=1e-5)

    assert main(["convert", str(tmp_path / "vk"), str(tmp_path / "back.pth"), "--to", "torchvision"]) == 0
    back = VisionTransformer(**TV_TINY).eval()
    back.load_state_dict(torch.load(tmp_path / "back.pth"))
    with torch.no_grad():
        torch.testing.assert_close(back(x), expected, atol=1e-5, rtol=1e-5)


def test_convert_hf_directory_round_trip(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.DeiTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=4
    )
    theirs = transformers.DeiTForImageClassificationWithTeacher(config).eval()
    theirs.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "vk")]) == 0
    assert main(["convert", str(tmp_path / "vk"), str(tmp_path / "hf2"), "--from", "vitkit", "--to", "hf"]) == 0
    assert "hf layout" in capsys.readouterr().out
    back = transformers.DeiTForImageClassificationWithTeacher.from_pretrained(tmp_path / "hf2").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(pixel_values=x).logits, theirs(pixel_values=x).logits, atol=1e-5, rtol=1e-5)


def test_convert_errors(tmp_path, capsys):
    torch.save(VisionTransformer(**TV_TINY).state_dict(), tmp_path / "tv.pth")
    assert main(["convert", str(tmp_path / "tv.pth"), str(tmp_path / "out")]) == 2
    assert "checkpoint file without a config: name the model with --model" in capsys.readouterr().err

    args = ["convert", str(tmp_path / "tv.pth"), str(tmp_path / "out"), "--model", "vit_base_patch16_224", *SETS]
    assert main([*args, "--set", "num_classes=7"]) == 2
    assert "classifier for 5 classes, the model 7" in capsys.readouterr().err
    assert main([*args, "--set", "num_classes=7", "--reset-head"]) == 0
    assert vitkit.from_pretrained(tmp_path / "out").config.num_classes == 7

    assert main(["convert", str(tmp_path / "out"), str(tmp_path / "x"), "--from", "hf"]) == 2
    assert "is a vitkit directory, not hf" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "out"), str(tmp_path / "x"), "--model", "vit_base_patch16_224"]) == 2
    assert "out is a model directory with its own config.json: drop --model" in capsys.readouterr().err
    assert main([*args, "--set", "depth"]) == 2
    assert "--model-arg expects FIELD=VALUE, got 'depth'" in capsys.readouterr().err


def test_convert_from_python_is_what_the_command_does(tmp_path):
    torch.manual_seed(0)
    theirs = VisionTransformer(**TV_TINY).eval()
    torch.save(theirs.state_dict(), tmp_path / "tv.pth")
    fields = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5)
    report, written = vitkit.weights.convert(
        tmp_path / "tv.pth", tmp_path / "vk", model_name="vit_base_patch16_224", overrides=fields
    )
    assert (report.format, report.loaded, written) == ("torchvision", 32, tmp_path / "vk")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.from_pretrained(written)(x), theirs(x), atol=1e-5, rtol=1e-5)

    # A vitkit directory reads as "timm" too (the same layout), and not as another library's.
    report, written = vitkit.weights.convert(written, tmp_path / "tv.safetensors", "timm", "torchvision")
    assert report.format == "vitkit" and written == tmp_path / "tv.safetensors"
    with pytest.raises(ValueError, match="is a vitkit directory, not torchvision"):
        vitkit.weights.convert(tmp_path / "vk", tmp_path / "x", src_format="torchvision")
    with pytest.raises(vitkit.weights.ModelNotNeeded, match="vk is a model directory with its own config.json"):
        vitkit.weights.convert(tmp_path / "vk", tmp_path / "x", model_name="vit_base_patch16_224")
    assert not (tmp_path / "x").exists()


def test_same_layout():
    assert same_layout("timm", "vitkit") and same_layout("vitkit", "timm") and same_layout("hf", "hf")
    assert not same_layout("vitkit", "torchvision") and not same_layout("hf", "timm")


def test_an_export_never_mixes_two_models_files_in_one_folder(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    info = vitkit.weights.ModelInfo(("a", "b", "c"), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    hf_dir = vitkit.export_weights(model, tmp_path / "out", "hf", info)
    written = sorted(p.name for p in hf_dir.iterdir())
    assert "preprocessor_config.json" in written
    mixed = r"out holds preprocessor_config.json, which the vitkit weights do not replace"
    with pytest.raises(ValueError, match=mixed):
        vitkit.export_weights(model, hf_dir, "vitkit", info)
    assert sorted(p.name for p in hf_dir.iterdir()) == written  # refused before anything was written
    assert transformers.AutoConfig.from_pretrained(hf_dir).model_type == "vit"
    # the same layout again replaces its own files; nothing is left beside the folder
    assert vitkit.export_weights(model, hf_dir, "hf", info) == hf_dir
    assert sorted(p.name for p in hf_dir.iterdir()) == written and sorted(os.listdir(tmp_path)) == ["out"]
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"file is a file; vitkit weights are a folder"):
        vitkit.export_weights(model, tmp_path / "file", "vitkit")
    one_file = r"out is a folder; timm weights are one file: name it, e.g. .*model.safetensors"
    with pytest.raises(ValueError, match=one_file):
        vitkit.export_weights(model, hf_dir, "timm")
    # the command says it the same way, replacing what is there only with --force
    vk_dir = vitkit.export_weights(model, tmp_path / "vk", "vitkit", info)
    assert main(["convert", str(vk_dir), "--out", str(hf_dir), "--force"]) == 2
    assert "which the vitkit weights do not replace: the folder would mix two models' files" in capsys.readouterr().err


def test_convert_replaces_nothing_unless_forced_and_never_its_source(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    hf_dir = vitkit.export_weights(model, tmp_path / "hf", "hf")
    trained = vitkit.export_weights(model, tmp_path / "run" / "final", "vitkit")
    before = {p: p.read_bytes() for p in [*hf_dir.iterdir(), *trained.iterdir()]}

    # the source's own files, whatever the layout written, with or without --force
    for out, to in ((hf_dir, "vitkit"), (hf_dir / "model.safetensors", "timm"), (hf_dir, "hf")):
        for force in ([], ["--force"]):
            assert main(["convert", str(hf_dir), "--to", to, "--out", str(out), *force]) == 2
            err = capsys.readouterr().err
            assert f"{out} would replace files of the folder being converted" in err, err
            assert err.rstrip().endswith(f"write to a new {'file' if to == 'timm' else 'folder'}")
    assert main(["convert", str(hf_dir / "model.safetensors"), "--model", "vit_tiny_patch16_224", "--model-arg",
                 "img_size=32", "--model-arg", "depth=1", "--model-arg", "num_classes=3", "--to", "timm",
                 "--out", str(hf_dir / "model.safetensors"), "--force"]) == 2  # fmt: skip
    assert "would replace the file being converted" in capsys.readouterr().err

    # a trained model, a checkpoint file: refused without --force, replaced with it
    assert main(["convert", str(hf_dir), "--out", str(trained)]) == 2
    assert f"{trained} holds config.json and model.safetensors already: converting would replace them. Write to a " \
        "new folder, or replace what is there with --force" in capsys.readouterr().err
    ckpt = tmp_path / "run" / "checkpoint.pt"
    ckpt.write_bytes(b"a run's checkpoint")
    assert main(["convert", str(hf_dir), "--to", "timm", "--out", str(ckpt)]) == 2
    assert f"{ckpt} is a file already: converting would replace it" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before and ckpt.read_bytes() == b"a run's checkpoint"
    with pytest.raises(FileExistsError, match=r"replace what is there with force=True"):
        vitkit.weights.convert(hf_dir, trained)
    assert main(["convert", str(hf_dir), "--out", str(trained), "--force"]) == 0
    assert main(["convert", str(hf_dir), "--to", "timm", "--out", str(ckpt), "--force"]) == 0
    assert torch.equal(vitkit.from_pretrained(trained).pos_embed, model.pos_embed)
