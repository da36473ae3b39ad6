"""benchmarks/gpu.py, the prepared GPU check, in its CPU dry run: the same code on tiny models, so that it runs the
day a GPU machine is there. What it checks is checked here too: a backend that disagreed would fail it."""

import json

import pytest
import torch

import vitkit.kernels.attention
import vitkit.perf.bench

pytestmark = pytest.mark.usefixtures("hub_offline")


def test_dry_run_checks_and_times_every_case(tmp_path, load_benchmark):
    out = tmp_path / "gpu.json"
    full_rate = vitkit.perf.bench.gemm_rate
    assert load_benchmark("gpu").main(["--dry-run", "--out", str(out)]) == 0
    assert vitkit.perf.bench.gemm_rate is full_rate  # its small GEMMs do not leak into later `vitkit bench` calls
    report = json.loads(out.read_text())
    checks = report["checks"]
    models = {"vit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "detr_tiny", "deformable_detr_small"}
    assert {row["model"] for row in checks if row["check"] == "backends"} == models
    backends = {(row["model"], row["precision"], row["backend"]) for row in checks if row["check"] == "backends"}
    kinds = {"deformable_detr_small": ("sdpa", "gather", "levelwise", "auto")}  # a dense and a deformable kind
    assert backends == {
        (m, p, b) for m in models for p in ("float64", "fp32", "bf16") for b in kinds.get(m, ("sdpa", "auto"))
    }
    assert all(row["ok"] for row in checks) and any(row["check"] == "capture" for row in checks)
    speed = [(r["model"], r["mode"], [c["name"] for c in r["results"]]) for r in report["speed"]]
    assert speed == [
        ("vit_tiny_patch16_224", "inference", ["vitkit bf16", "timm fp32", "timm autocast-bf16"]),
        (
            "vit_tiny_patch16_224",
            "train",
            ["vitkit autocast-bf16 train", "timm fp32 train", "timm autocast-bf16 train"],
        ),
        ("detr_tiny", "inference", ["vitkit bf16", "transformers fp32", "transformers autocast-bf16"]),
        (
            "detr_tiny",
            "train",
            ["vitkit autocast-bf16 train", "transformers fp32 train", "transformers autocast-bf16 train"],
        ),
    ]


def test_a_wrong_backend_fails_the_check(monkeypatch, load_benchmark):
    script = load_benchmark("gpu")
    fused = vitkit.kernels.attention.F.scaled_dot_product_attention

    def wrong(q, k, v, **kwargs):  # a fused kernel that forgot the scale
        return fused(q, k, v, **{**kwargs, "scale": 1.0})

    monkeypatch.setattr(vitkit.kernels.attention.F, "scaled_dot_product_attention", wrong)
    case = script.CHECKS[True][0]
    rows = script.check_backends(case, torch.device("cpu"))
    assert [row["ok"] for row in rows if row["backend"] == "sdpa"] == [False, False, False]


def test_a_mistake_below_fp32_rounding_fails_the_float64_check(monkeypatch, load_benchmark):
    """A fused kernel whose scale is off by one part in 1e8 passes in fp32 and bf16, where rounding is larger;
    the float64 row catches it."""
    script = load_benchmark("gpu")
    fused = vitkit.kernels.attention.F.scaled_dot_product_attention

    def slightly_wrong(q, k, v, **kwargs):
        return fused(q, k, v, **{**kwargs, "scale": q.shape[-1] ** -0.5 * (1 + 1e-8)})

    monkeypatch.setattr(vitkit.kernels.attention.F, "scaled_dot_product_attention", slightly_wrong)
    rows = script.check_backends(script.CHECKS[True][0], torch.device("cpu"))
    assert {row["precision"]: row["ok"] for row in rows if row["backend"] == "sdpa"} == {
        "float64": False,
        "fp32": True,
        "bf16": True,
    }
