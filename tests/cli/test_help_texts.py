"""The help texts say what the code does, from the code's own lists: the default detector, every weights layout
`vitkit convert` reads and writes, the detectors `vitkit bench --compare transformers` covers, the picture formats
of `vitkit eval --plot`."""

from __future__ import annotations

import argparse
import re

from vitkit.cli import build_parser
from vitkit.models.registry import DETECTION, families
from vitkit.train import DEFAULT_DETECTOR
from vitkit.viz.attention import writable_suffixes
from vitkit.weights.convert import FORMAT_SOURCES, config_less_formats, formats


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _option_help(command: str, dest: str) -> str:
    return next(a.help for a in _command(command)._actions if a.dest == dest)


def test_the_default_detector_is_the_one_training_uses():
    text = build_parser().format_help()
    assert DEFAULT_DETECTOR in " ".join(text.split())
    assert not re.search(r"(?<!\w)detr_digits", text)  # the earlier default (deformable_detr_digits is another)


def test_convert_names_every_layout_it_reads_and_writes():
    description = _command("convert").description
    assert all(FORMAT_SOURCES.get(name, name) in description for name in formats())
    for named in ("Hugging Face", "vit-pytorch", "PaddleViT", "Deformable DETR's repository"):
        assert named in description
    # the files that build their own model, which --model is not for: vit-pytorch's and PaddleViT's
    assert config_less_formats() == ("vit-pytorch", "paddlevit")
    assert "not for directories, nor for vit-pytorch or paddlevit files" in _option_help("convert", "model")
    out = _option_help("convert", "out")
    assert "a directory for vitkit / hf, a file (.safetensors, .pth, .pt, .bin, .ckpt, .pdparams) for the others" in out


def test_bench_compare_names_the_detectors_transformers_covers():
    detectors = [fam.display_name for fam in families() if fam.task == DETECTION]
    assert detectors == ["DETR", "Deformable DETR"]
    text = _option_help("bench", "compare")
    assert "timm's of the same name for a classifier" in text and "for a detector (DETR and Deformable DETR)" in text


def test_eval_plot_lists_the_formats_it_writes():
    assert {".png", ".jpg", ".pdf", ".svg"} <= writable_suffixes(figure=True)  # what the help names is taken
    assert _option_help("eval", "plot").endswith("to this picture (.png, .jpg, .pdf, .svg); folders are made")
    assert "(.png, .jpg, .pdf, .svg)" in _option_help("attention", "out")
