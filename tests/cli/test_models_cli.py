"""`vitkit models` and `vitkit --version`."""

import subprocess
import sys

import pytest
import timm
import torch

import vitkit
from vitkit.analysis import profile
from vitkit.cli import main


def test_models_lists_parameter_counts_equal_timm(capsys):
    assert main(["models", "vit_*_patch16_224"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["model", "params", "img_size", "GFLOPs"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert list(rows) == vitkit.list_models("vit_*_patch16_224")
    for name, (params, size, gflops) in rows.items():
        with torch.device("meta"):
            reference = timm.create_model(name, pretrained=False)
        assert int(params.replace(",", "")) == sum(p.numel() for p in reference.parameters())
        assert size == "224"
        assert gflops == f"{profile(name).flops / 1e9:.2f}"


def test_models_no_match_is_an_error(capsys):
    assert main(["models", "resnet*"]) == 2
    assert "no model matches 'resnet*'" in capsys.readouterr().err


def test_models_no_match_suggests_the_closest_names(capsys):
    assert main(["models", "vit_smal"]) == 2
    assert capsys.readouterr().err.strip() == (
        "vitkit models: error: no model matches 'vit_smal'; closest: vit_small_patch16_224, vit_small_patch16_384, "
        "vit_small_patch14_dinov2, vit_small_patch14_reg4_dinov2, deformable_detr_vit_small_dinov2; run 'vitkit "
        "models' for the full list"
    )
    assert main(["models", "small"]) == 2  # more names hold it than are shown: the pattern of them all
    assert "(every name holding it: vitkit models '*small*'); run 'vitkit models' for" in capsys.readouterr().err
    assert main(["models", "--pretrained", "swin_tiny"]) == 2
    err = capsys.readouterr().err
    assert "closest: swin_tiny_patch4_window7_224, " in err and "run 'vitkit models --pretrained' for" in err
    assert main(["models", "qqqq"]) == 2  # nothing close: nothing suggested
    assert capsys.readouterr().err.strip().endswith("no model matches 'qqqq'; run 'vitkit models' for the full list")


def test_version_from_the_console_entry_point():
    out = subprocess.run([sys.executable, "-m", "vitkit", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"vitkit {vitkit.__version__}"


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "models" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["no-such-command"])
