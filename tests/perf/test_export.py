"""`vitkit export` / `export_model`: ONNX and TorchScript files with a dynamic batch axis, checked here against
PyTorch independently of the export's own check (the ONNX file is run with ONNX Runtime in the test itself)."""

import json
import re
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import vitkit
from vitkit.cli import main
from vitkit.cli.messages import cli_option
from vitkit.layers import attention_layers
from vitkit.perf import export as export_module
from vitkit.perf.export import CHECK_BATCHES, EXPORT_BATCH, export_model

TEST_BATCHES = (1, 4)  # batch sizes this file runs the exported models at


def tiny_vit(**overrides) -> nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model("vit_tiny_patch16_224", depth=2, img_size=32, num_classes=10, **overrides).eval()


def tiny_deit() -> nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model("deit_tiny_distilled_patch16_224", depth=1, img_size=32, num_classes=10).eval()


def tiny_swin() -> nn.Module:
    # 8x8 patch map, windows of 4: stage 0 has a shifted block (with its mask), stage 1 starts with a patch merging.
    torch.manual_seed(0)
    return vitkit.create_model(
        "swin_tiny_patch4_window7_224",
        img_size=32,
        embed_dim=16,
        depths=(2, 1),
        num_heads=(2, 4),
        window_size=4,
        num_classes=10,
    ).eval()


def tiny_botnet() -> nn.Module:
    torch.manual_seed(0)
    model = vitkit.create_model(
        "botnet26t_256",
        img_size=64,
        stem_chs=16,
        widths=(16, 32, 64, 64),
        depths=(1, 1, 1, 2),
        bot_depths=(0, 0, 1, 2),
        num_heads=2,
        num_classes=10,
    )
    with torch.no_grad():  # BatchNorm statistics away from the identity, so the export has to carry them
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def run_onnx(path, x: torch.Tensor) -> torch.Tensor:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert inp.shape[0] == "batch" and inp.shape[1:] == list(x.shape[1:])  # only the batch axis is symbolic
    return torch.from_numpy(session.run(None, {inp.name: x.numpy()})[0])


def run_torchscript(path, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
        module = torch.jit.load(str(path))
    with torch.no_grad():
        return module(x)


RUNNERS = {"onnx": run_onnx, "torchscript": run_torchscript}


def assert_matches_pytorch(model: nn.Module, path, format: str, img_size: tuple[int, int]) -> None:
    """The exported file gives the PyTorch model's outputs at batch sizes other than the exported one."""
    assert EXPORT_BATCH not in TEST_BATCHES
    for batch in TEST_BATCHES:
        x = torch.randn(batch, 3, *img_size)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(RUNNERS[format](path, x), expected, atol=1e-4, rtol=0)


def only_file(folder):
    """The one file in `folder` (no temporary or side files left beside the export)."""
    (path,) = folder.iterdir()
    return path


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_cli_exports_a_saved_model(tmp_path, capsys, format):
    model = tiny_vit()
    info = vitkit.weights.ModelInfo(
        tuple(f"class {k}" for k in range(model.config.num_classes)), (0.5,) * 3, (0.25,) * 3, crop_pct=0.875
    )
    vitkit.save_pretrained(model, tmp_path / "model", info)
    out = tmp_path / "export" / f"vit.{format}"
    assert main(["export", "--model-dir", str(tmp_path / "model"), "--format", format, "--out", str(out)]) == 0
    assert only_file(out.parent) == out
    printed = capsys.readouterr().out
    assert f"wrote {format} model to {out}" in printed
    assert "batch sizes 1, 3: max abs diff" in printed
    assert_matches_pytorch(model, out, format, (32, 32))
    # what the model needs beside its weights travels in the file: names, normalisation, framing
    if format == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        carried = session.get_modelmeta().custom_metadata_map["vitkit.model_info"]
    else:
        extra = {"vitkit.model_info": ""}
        torch.jit.load(str(out), _extra_files=extra)
        carried = extra["vitkit.model_info"]
    assert json.loads(carried) == info.to_json()


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
@pytest.mark.parametrize("build", [tiny_deit, tiny_swin, tiny_botnet], ids=["deit", "swin", "botnet"])
def test_library_exports_every_family(tmp_path, build, format):
    model = build()
    backends = [layer.backend for _, layer in attention_layers(model)]
    size = model.config.img_size
    report = export_model(model, tmp_path / "model.bin", format)
    assert only_file(tmp_path) == report.path == tmp_path / "model.bin"
    assert report.format == format and report.img_size == (size, size) and report.atol == 1e-4
    assert report.batch_sizes == CHECK_BATCHES and EXPORT_BATCH not in report.batch_sizes
    assert 0 <= report.max_abs_diff <= 1e-4
    assert report.attn_backend == {"onnx": "math", "torchscript": "sdpa"}[format]
    assert [layer.backend for _, layer in attention_layers(model)] == backends  # original untouched
    assert_matches_pytorch(model, report.path, format, (size, size))


def test_img_size_of_a_dynamic_size_model(tmp_path):
    model = tiny_vit(dynamic_img_size=True)
    report = export_model(model, tmp_path / "vit.pt", "torchscript", img_size=(32, 48))
    assert report.img_size == (32, 48)
    assert_matches_pytorch(model, report.path, "torchscript", (32, 48))


class BatchBaked(nn.Module):
    """Reads the batch size as a Python number, which tracing freezes: other batch sizes give other outputs."""

    def __init__(self, shape: bool) -> None:
        super().__init__()
        self.config = SimpleNamespace(img_size=8, in_chans=3)
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shape:
            return x.mean() + torch.zeros(int(x.shape[0]), 3)  # (B, 3), traced as (2, 3)
        return x.mean(dim=(2, 3)) * float(x.shape[0])  # (B, C), traced as scaled by 2


@pytest.mark.parametrize(
    "shape, message",
    [
        (False, r"outputs differ from PyTorch's by up to .* at batch size 1, more than atol 0.0001; nothing"),
        (True, r"returned shape \(2, 3\) at batch size 1, PyTorch \(1, 3\): its batch axis is not dynamic"),
    ],
)
def test_mismatch_writes_nothing(tmp_path, shape, message):
    out = tmp_path / "model.pt"
    with pytest.raises(ValueError, match=message):
        export_model(BatchBaked(shape), out, "torchscript")
    assert list(tmp_path.iterdir()) == []
    out.write_bytes(b"earlier export")
    with pytest.raises(ValueError, match=f"nothing written to {re.escape(str(out))}"):
        export_model(BatchBaked(shape), out, "torchscript")
    assert only_file(tmp_path).read_bytes() == b"earlier export"


def test_library_errors(tmp_path, monkeypatch):
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"format must be one of \('onnx', 'torchscript'\), got 'tflite'"):
        export_model(model, tmp_path / "m.tflite", "tflite")
    with pytest.raises(ValueError, match="expected images of size 32x32, got 48x48"):
        export_model(model, tmp_path / "m.pt", "torchscript", img_size=48)
    with pytest.raises(ValueError, match="atol must be >= 0, got -1"):
        export_model(model, tmp_path / "m.pt", "torchscript", atol=-1)
    with pytest.raises(IsADirectoryError, match="is a directory; expected a file name"):
        export_model(model, tmp_path, "torchscript")
    with pytest.raises(ValueError, match=r"has no config.img_size: pass img_size=\(H, W\)"):
        export_model(nn.Conv2d(3, 4, 1), tmp_path / "m.pt", "torchscript")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(OSError, match=r"onnx export needs the onnxruntime package: pip install 'vitkit\[export\]'"):
        export_model(model, tmp_path / "m.onnx", "onnx")
    assert list(tmp_path.iterdir()) == []


def test_cli_errors(tmp_path, capsys):
    out = str(tmp_path / "m.onnx")
    assert main(["export", "--model-dir", str(tmp_path / "missing"), "--format", "onnx", "--out", out]) == 2
    said = capsys.readouterr().err
    assert "missing does not exist: expected a model directory (written by vitkit.save_pretrained" in said
    with pytest.raises(SystemExit):
        main(["export", "--model-dir", str(tmp_path), "--format", "tflite", "--out", out])
    assert "invalid choice: 'tflite'" in capsys.readouterr().err
    vitkit.save_pretrained(tiny_vit(), tmp_path / "model")
    assert (
        main(["export", "--model-dir", str(tmp_path / "model"), "--format", "onnx", "--atol", "-1", "--out", out]) == 2
    )
    assert "vitkit export: error: atol must be >= 0, got -1.0" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_bf16_optimized_model_is_refused_and_profiled(tmp_path):
    """export takes the model before optimize(model, "bf16"); `profile` counts the optimized model as the one it
    was made from (the packed linear layers as linear layers, the fused GELU in fc1), with less written."""
    from vitkit.analysis import profile

    model = vitkit.create_model("vit_tiny_patch16_224", depth=2).eval()
    optimized = vitkit.optimize(model, "bf16")
    for candidate in (optimized, optimized.model):
        with pytest.raises(ValueError, match=r"export takes a model before vitkit.optimize\(model, 'bf16'\)"):
            export_model(candidate, tmp_path / "x.pt", "torchscript")
    assert not list(tmp_path.iterdir())
    ours, theirs = (profile(m, 224, dtype=torch.bfloat16) for m in (optimized.model, model))
    assert (ours.macs, ours.flops) == (theirs.macs, theirs.flops) and ours.activation_bytes < theirs.activation_bytes


class Scaled(nn.Module):
    """Outputs of a chosen size: the per-channel means of the images times `scale`."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) * self.scale  # (B, C)


@pytest.mark.parametrize(
    "scale, error, passes",
    [
        (20.0, 1e-3, True),  # a mask logit's size: 1e-3 is 5e-5 of it
        (20.0, 3e-3, False),  # 1.5e-4 of it
        (0.5, 9e-5, True),
        (0.5, 2e-4, False),  # small values: absolute
        (0.5, float("nan"), False),
    ],
)
def test_the_check_is_absolute_for_small_values_and_relative_for_large_ones(tmp_path, scale, error, passes):
    model = Scaled(scale)
    x = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)) + 0.5  # means near 1: outputs near `scale`
    signature = export_module.Signature(("images",), ("output",), False)
    expected = model(x).numpy()

    def run(inputs):
        return [expected + error]

    check = [(x,)]
    if passes:
        worst, held = export_module._max_abs_diff(run, model, check, signature, "onnx", tmp_path / "m.onnx", 1e-4)
        assert worst == pytest.approx(error, rel=0.01)  # float32's rounding of `expected + error`
        assert held == pytest.approx(error / max(1.0, float(expected.max())), rel=0.01)
    else:
        largest = r" x .*, the largest of PyTorch's values" if scale > 1 else ""
        said = rf"differ from PyTorch's by up to .*, more than atol 0.0001{largest};"
        with pytest.raises(ValueError, match=said) as e:
            export_module._max_abs_diff(run, model, check, signature, "onnx", tmp_path / "m.onnx", 1e-4)
        if error == error:  # a small difference: the way to accept it, in the caller's words
            assert str(e.value).endswith("the two runtimes' float rounding: the check accepts it with atol=0.001")
            assert e.value.message(cli_option).endswith("accepts it with --atol 0.001")
        else:
            assert "float rounding" not in str(e.value)


def test_mask_logits_are_compared_where_predict_reads_them():
    """A detector's mask logits (B, Q, h, w) of a padded batch are compared as `detection_masks` reads them, resampled
    to each image's own pixels: a difference deep in the padding counts for nothing, one in the row just past the
    image for the share the image's edge pixels read of it (bilinear, x4), one inside the image whole."""
    pixels = torch.zeros(2, 32, 32, dtype=torch.bool)
    pixels[0] = True
    pixels[1, :12, :20] = True  # image 1: 3 x 5 cells of 8 x 8
    expected = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)).double().numpy()
    inputs = (torch.zeros(2, 3, 32, 32), pixels)

    def differing(rows: slice, cols: slice) -> float:
        got = expected.copy()
        got[1, 2, rows, cols] += 1.0
        error, largest = export_module._difference("pred_masks", inputs, expected, got)
        assert largest == pytest.approx(max(abs(expected[0]).max(), abs(expected[1, :, :4, :6]).max()))
        return error

    assert differing(slice(5, 8), slice(0, 8)) == 0.0  # padding
    assert differing(slice(3, 4), slice(0, 8)) == pytest.approx(3 / 8)  # the first row of padding
    assert differing(slice(0, 3), slice(0, 4)) == pytest.approx(1.0)  # inside the image
    got = expected.copy()
    got[1, 0, 6, 6] += 1.0
    assert export_module._difference("pred_logits", inputs, expected, got)[0] == pytest.approx(1.0)  # every value


def test_the_check_line_says_which_difference_atol_holds():
    """Up to 1 the absolute difference is held to atol; above, its share of the output's largest value, and the
    line says so rather than comparing the absolute difference with atol."""
    from pathlib import Path

    from vitkit.perf.export import ExportReport

    common = dict(format="onnx", path=Path("m.onnx"), batch_sizes=(1, 3), img_size=(8, 8), attn_backend="math")
    plain = ExportReport(max_abs_diff=2e-6, atol=1e-4, max_diff=2e-6, **common).summary()
    assert plain.endswith("max abs diff 2e-06 <= atol 0.0001")
    scaled = ExportReport(max_abs_diff=4.4e-4, atol=1e-4, max_diff=2.71e-5, **common).summary()
    assert scaled.endswith(
        "max abs diff 0.00044, 2.71e-05 of the largest value <= atol 0.0001 (relative for outputs above 1)"
    )
