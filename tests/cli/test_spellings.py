"""Every command spells an option one way (--batch-size, --precision, --out, --model-arg); the earlier spellings
(--batch, --dtype, --set, a positional output) still parse to the same values for a release, and --help shows
none of them."""

from __future__ import annotations

import re

import pytest

from vitkit.cli import COMMANDS, build_parser, main
from vitkit.cli.options import out_path, take_positional_out


def parsed(argv: list[str]) -> dict:
    """The values a command line gives its command, with the output read as the command reads it."""
    args, extra = build_parser().parse_known_args(argv)
    assert take_positional_out(args, extra) == []
    values = vars(args)
    if "positional_out" in values:
        values["out"] = out_path(args)
        del values["positional_out"]
    del values["run"]
    return values


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["profile", "vit_tiny_patch16_224", "--batch", "4"], ["profile", "vit_tiny_patch16_224", "--batch-size", "4"]),
        (
            ["profile", "vit_tiny_patch16_224", "--dtype", "bf16"],
            ["profile", "vit_tiny_patch16_224", "--precision", "bf16"],
        ),
        (["bench", "vit_tiny_patch16_224", "--batch", "2"], ["bench", "vit_tiny_patch16_224", "--batch-size", "2"]),
        (
            ["convert", "a.pth", "out", "--set", "depth=2", "--set", "img_size=[32,64]"],
            ["convert", "a.pth", "--out", "out", "--model-arg", "depth=2", "--model-arg", "img_size=[32,64]"],
        ),
        (["convert", "a.pth", "--to", "timm", "b.pth"], ["convert", "a.pth", "--to", "timm", "--out", "b.pth"]),
        (
            ["export", "m.onnx", "--model-dir", "d", "--format", "onnx"],
            ["export", "--model-dir", "d", "--format", "onnx", "--out", "m.onnx"],
        ),
        (["example-data", "shapes", "--train", "8", "dir"], ["example-data", "shapes", "--out", "dir", "--train", "8"]),
    ],
)
def test_earlier_spellings_parse_to_the_same_values(old, new):
    assert parsed(old) == parsed(new)


def test_both_spellings_of_a_repeatable_option_add_up():
    both = parsed(["convert", "a.pth", "--out", "o", "--set", "depth=2", "--model-arg", "num_heads=3"])
    assert both["overrides"] == ["depth=2", "num_heads=3"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_only_the_current_spellings(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert not re.search(r"--batch(?!-)|--dtype|--set\b|positional_out", text)
    positional = text.split("positional arguments:")[1].split("options:")[0] if "positional arguments:" in text else ""
    assert not re.search(r"^  (OUT|DST|dst|out)\b", positional, re.MULTILINE)


def test_an_output_is_needed_once(tmp_path, capsys):
    assert main(["export", "--model-dir", str(tmp_path), "--format", "onnx"]) == 2
    assert "the following arguments are required: --out" in capsys.readouterr().err
    assert main(["export", "a.onnx", "--model-dir", str(tmp_path), "--format", "onnx", "--out", "b.onnx"]) == 2
    assert "two outputs given, --out b.onnx and a.onnx" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "a.onnx", "b.onnx", "--model-dir", str(tmp_path), "--format", "onnx"])
    assert "unrecognized arguments: a.onnx b.onnx" in capsys.readouterr().err
