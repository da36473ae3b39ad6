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


def test_version_from_the_console_entry_point():
    out = subprocess.run([sys.executable, "-m", "vitkit", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"vitkit {vitkit.__version__}"


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "models" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["no-such-command"])
