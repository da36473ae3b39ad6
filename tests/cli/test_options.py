"""Option parsing shared by commands: FIELD=VALUE (`vitkit train` and `vitkit convert`'s --model-arg), image sizes,
options generated from a config dataclass (`vitkit train`), and refusals that name options."""

from __future__ import annotations

import argparse
import pickle
from dataclasses import dataclass
from typing import Any

import pytest

from vitkit.cli.messages import cli_message
from vitkit.cli.options import add_config_options, parse_assignment, parse_size
from vitkit.errors import OptionError
from vitkit.train.config import option


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("depth=6", ("depth", 6)),
        ("mlp_ratio=2.5", ("mlp_ratio", 2.5)),
        ("qkv_bias=false", ("qkv_bias", False)),
        ("qkv_bias=False", ("qkv_bias", False)),
        ("init_values=None", ("init_values", None)),
        ("img_size=[224, 320]", ("img_size", (224, 320))),
        ("attn_backend=math", ("attn_backend", "math")),
    ],
)
def test_values(text, expected):
    assert parse_assignment(text) == expected


def test_option_errors_name_arguments_in_python_and_flags_on_the_command_line():
    err = OptionError(lambda name: f"fewer ({name('layers', [0, -1])}; {name('scale_jitter')}; {name('force', True)})")
    assert str(err) == "fewer (layers=[0, -1]; scale_jitter; force=True)"
    assert cli_message(err) == "fewer (--layers 0,-1; --scale-jitter; --force)"
    copied = pickle.loads(pickle.dumps(err))  # as its text, as from another process
    assert isinstance(copied, ValueError) and str(copied) == cli_message(copied) == str(err)


def test_missing_value_is_an_error():
    with pytest.raises(ValueError, match="expects FIELD=VALUE, got 'depth'"):
        parse_assignment("depth")


@pytest.mark.parametrize(("text", "expected"), [("224", (224, 224)), ("256x320", (256, 320)), ("64X32", (64, 32))])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["0", "22ax3", "1x2x3", "-4", ""])
def test_bad_sizes(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size like 224 or 256x320"):
        parse_size(text)


@dataclass(frozen=True)
class _Config:
    depth: int = option(4, help="blocks")
    rate: float | None = option(None, help="a rate")
    name: str = option("tiny", help="a name", choices=("tiny", "small"))
    fast: bool = option(False, help="go fast")
    extra: dict[str, Any] = option(default_factory=dict, flag="--extra-arg", metavar="KEY=VALUE", help="fields")
    out: str = option("runs", help="output folder", metavar="DIR")
    hidden: int = 0  # no help: not an option


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_config_options(parser, _Config)
    return parser


def test_config_options_are_generated_from_the_fields():
    parser = _parser()
    options = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(options) == {"depth", "rate", "name", "fast", "extra", "out"}
    assert options["depth"].option_strings == ["--depth"] and options["depth"].type is int
    assert options["depth"].help == "blocks (default: 4)"
    assert options["rate"].type is float and options["rate"].help == "a rate"
    assert options["name"].choices == ("tiny", "small") and options["name"].help == "a name (default: tiny)"
    assert options["fast"].help == "go fast" and options["fast"].const is True
    assert options["extra"].option_strings == ["--extra-arg"] and options["extra"].metavar == "KEY=VALUE"
    assert options["extra"].help == "fields"
    assert options["out"].metavar == "DIR" and options["out"].help == "output folder (default: runs)"


def test_config_options_left_out_stay_out_of_the_namespace():
    assert vars(_parser().parse_args([])) == {}
    args = _parser().parse_args(["--depth", "6", "--fast", "--extra-arg", "a=1", "--extra-arg", "b=x", "--rate", "0.5"])
    assert vars(args) == {"depth": 6, "fast": True, "extra": {"a": 1, "b": "x"}, "rate": 0.5}
    assert _Config(**vars(args)) == _Config(depth=6, rate=0.5, fast=True, extra={"a": 1, "b": "x"})


def test_config_option_errors(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--extra-arg", "depth"])
    assert "argument --extra-arg: expects FIELD=VALUE, got 'depth'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--name", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err
