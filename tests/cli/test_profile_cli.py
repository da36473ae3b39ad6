"""`vitkit profile`: tables, JSON, plot, errors."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.analysis import estimate_memory, profile
from vitkit.analysis.report import scaling
from vitkit.cli import main
from vitkit.viz import plot_scaling


def test_table_by_block_with_totals_and_shape_flow(capsys):
    assert main(["profile", "vit_tiny_patch16_224", "--train"]) == 0
    out = capsys.readouterr().out
    report = profile("vit_tiny_patch16_224")
    lines = out.splitlines()
    total = next(line for line in lines if line.startswith("total"))
    assert total.split()[1:4] == [f"{report.macs / 1e9:.3f}", f"{report.flops / 1e9:.3f}", "100.0%"]
    assert sum(line.startswith("blocks.") for line in lines) == 12
    assert "split: attention" in out and "activations kept for backward" in out
    assert "(B, h, N, d) @ (B, h, d, N) -> (B, h, N, N)" in out  # the shape flow of one block


def test_json_is_the_report(capsys):
    assert main(["profile", "deit_tiny_patch16_224", "--img-size", "160x224", "--batch-size", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(profile("deit_tiny_patch16_224", (160, 224), batch=2).to_dict()))


def test_by_op_and_math_backend(capsys):
    assert main(["profile", "vit_tiny_patch16_224", "--by", "op", "--backend", "math"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[3 : next(i for i, line in enumerate(lines) if line.startswith("total"))]  # one row per operator
    rows = {line.split()[0] for line in table if line.strip()}
    assert {"qkv", "q@k^T", "softmax", "attn@v", "proj", "fc1", "gelu", "fc2"} <= rows
    assert "attention backend math" in out


def test_plot_writes_a_png(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    path, expected = tmp_path / "scaling.png", tmp_path / "expected.png"
    swept = []  # the sweep the command asked for, and its points
    monkeypatch.setattr(
        "vitkit.cli.profile.scaling", lambda *args: swept.append((args, scaling(*args))) or swept[-1][1]
    )
    assert main(["profile", "vit_small_patch16_224", "--plot", str(path)]) == 0
    assert "attention's N^2 terms dominate from" in capsys.readouterr().out
    # the library's figure of the same sweep (64 to 2048 px), pixel for pixel
    ((args, points),) = swept
    assert args[:2] == ("vit_small_patch16_224", list(range(64, 2048 + 1, 64)))
    plot_scaling(points, expected, "vit_small_patch16_224")
    ours, theirs = np.asarray(Image.open(path)), np.asarray(Image.open(expected))
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs)
    assert ours[..., :3].std() > 10  # lines and text, not a blank page


def test_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "vit_tiny_patch16_224", "--img-size", "22ax3"])
    assert "expected a size like 224 or 256x320, got '22ax3'" in capsys.readouterr().err
    assert main(["profile", "vit_tiny_patch16_224", "--img-size", "100"]) == 2
    assert "not a positive multiple of patch size 16" in capsys.readouterr().err
    assert main(["profile", "vit_tiny_patch16_224", "--plot", "costs.txt"]) == 2  # before the report, not after
    said = capsys.readouterr()
    assert said.out == "" and "costs.txt: .txt is not a picture format vitkit can write" in said.err


def test_dtype_and_device_pick_the_attention_path_counted(capsys, native_bf16):
    assert main(["profile", "vit_tiny_patch16_224", "--precision", "bf16", "--by", "op", "--json"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert main(["profile", "vit_tiny_patch16_224", "--precision", "bf16", "--device", "cuda", "--json"]) == 0
    gpu = json.loads(capsys.readouterr().out)
    assert (cpu["dtype"], cpu["device"], gpu["device"]) == ("bfloat16", "cpu", "cuda")
    assert {"q_copy", "k_copy", "v_copy"} <= {op["op"] for op in cpu["ops"]}  # the explicit path runs on CPU
    assert not {"q_copy", "k_copy", "v_copy"} & {op["op"] for op in gpu["ops"]}  # the fused kernel on GPUs
    assert cpu["matmul_flops"] == gpu["matmul_flops"]


@pytest.fixture
def one_mebibyte(monkeypatch):
    """The machine seen with 1 MiB available: too little for any measured forward pass."""
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": 2**20)


def test_measure_is_refused_when_the_estimate_exceeds_the_memory_available(one_mebibyte, capsys):
    assert main(["profile", "vit_tiny_patch16_224", "--batch-size", "4", "--measure"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit profile: error: vit_tiny_patch16_224 inference at batch 4, 224x224, fp32 needs about")
    assert "but only 1 MiB is available" in err and "To run anyway, pass --ignore-memory-check." in err
    assert "--grad-checkpointing" not in err and "Traceback" not in err
    assert err.count("\n") == 1  # one paragraph


def test_the_memory_check_names_the_commands_flags(monkeypatch, capsys):
    room = int(estimate_memory("vit_tiny_patch16_224", 448, 3, training=False).needed_bytes / 0.9) + 16  # batch 3 fits
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": room)
    assert main(["profile", "vit_tiny_patch16_224", "--img-size", "448", "--batch-size", "8", "--measure"]) == 2
    err = capsys.readouterr().err
    assert "Ways out: --batch-size 3 (the largest batch that fits); --img-size 224 (the model's own size)." in err


def test_ignore_memory_check_measures_anyway_and_the_analytic_report_needs_no_check(one_mebibyte, capsys):
    with pytest.warns(UserWarning, match=r"needs about .* Running anyway \(--ignore-memory-check\)"):
        assert main(["profile", "vit_tiny_patch16_224", "--measure", "--ignore-memory-check"]) == 0
    assert "measured peak activation memory" in capsys.readouterr().out
    assert main(["profile", "vit_tiny_patch16_224"]) == 0  # nothing runs: nothing to check


def test_training_memory_per_process_for_a_strategy_and_world(capsys):
    args = ["profile", "vit_small_patch16_224", "--train", "--batch-size", "8", "--precision", "bf16"]
    assert main([*args, "--strategy", "fsdp", "--world", "4"]) == 0
    out = capsys.readouterr().out
    e = estimate_memory("vit_small_patch16_224", None, 8, training=True, precision="bf16", strategy="fsdp", world=4)
    assert "\ntraining memory per process (fsdp over 4 processes, batch 8, 224x224, bf16):\n" in out
    rows = dict(
        line.strip().rsplit(None, 2)[:2] for line in out.split("training memory per process")[1].splitlines()[1:]
    )
    figures = {
        "weight shards": e.weights_bytes,
        "gradients at the step's peak": e.gradient_bytes,
        "AdamW state shards": e.optimizer_bytes,
        "activations and backward work": e.step_bytes - e.gradient_bytes - e.gathered_bytes,
        "gathered units": e.gathered_bytes,
        "input": e.input_bytes,
        "total": e.total_bytes,
    }
    assert rows == {label: f"{value / 2**20:,.1f}" for label, value in figures.items()}
    assert e.gathered_bytes > 0 and e.weights_bytes < e.total_bytes / 10
    assert out.startswith("vit_small_patch16_224  input 8x224x224")  # the report above it as before
    # ddp at the default world: the whole model in the process, nothing gathered
    assert main([*args, "--strategy", "ddp"]) == 0
    out = capsys.readouterr().out
    whole = estimate_memory("vit_small_patch16_224", None, 8, training=True, precision="bf16")
    assert "(ddp over 1 process, batch 8" in out and f"{whole.total_bytes / 2**20:,.1f} MiB" in out
    assert "gathered units" not in out and "weights " in out


def test_training_memory_in_json_and_only_with_train(capsys):
    assert main(["profile", "vit_tiny_patch16_224", "--train", "--world", "2", "--strategy", "fsdp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    e = estimate_memory("vit_tiny_patch16_224", None, 1, training=True, strategy="fsdp", world=2)
    assert data["training_memory"]["total_bytes"] == e.total_bytes and data["training_memory"]["world"] == 2
    assert main(["profile", "vit_tiny_patch16_224", "--train", "--json"]) == 0
    assert "training_memory" not in json.loads(capsys.readouterr().out)  # the report as before
    assert main(["profile", "vit_tiny_patch16_224", "--world", "2"]) == 2
    assert "--strategy and --world estimate a training run's memory: add --train" in capsys.readouterr().err


def test_the_sweep_takes_the_dtype_and_counts_only_dense_attention_as_quadratic():
    """In bf16 the activations of the sweep are half fp32's; a Deformable DETR's N^2 terms are its decoder's
    self-attention among the queries, the same at every size (its sampling's softmax grows with the tokens)."""
    fp32, bf16 = (scaling("vit_tiny_patch16_224", [224], dtype=d)[0] for d in (torch.float32, torch.bfloat16))
    assert bf16.activation_bytes_sdpa * 2 == fp32.activation_bytes_sdpa and bf16.quadratic_flops == fp32.quadratic_flops
    small, large = scaling("deformable_detr_small", [128, 512])
    assert small.quadratic_flops == large.quadratic_flops > 0 and large.linear_flops > 10 * small.linear_flops


def test_mistakes_before_any_work(capsys):
    assert main(["profile", "botnet26t_256", "--plot", "b.png"]) == 2
    captured = capsys.readouterr()
    assert "takes only 256x256 images, so there are no other sizes to plot" in captured.err and not captured.out
    assert main(["profile", "vit_tiny_patch16_224", "--train", "--strategy", "fsdp", "--world", "0"]) == 2
    assert "world must be >= 1, got 0" in capsys.readouterr().err
    for size in (-16, 96.0, (0, 3)):
        with pytest.raises(ValueError, match="img_size must be a positive int or a pair"):
            profile("vit_tiny_patch16_224", size)
    if not torch.cuda.is_available():
        assert main(["profile", "vit_tiny_patch16_224", "--measure", "--device", "cuda"]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err
