"""bench(): the candidates, their fields and the CLI; no timing is asserted (timings are benchmarks)."""

import json

import pytest
import torch

from vitkit.analysis import MemoryWarning, NotEnoughMemory, estimate_memory, profile
from vitkit.cli import main
from vitkit.perf.bench import (
    SPLIT,
    _category,
    adamw,
    bench,
    bench_memory,
    build_candidates,
    gemm_rate,
    time_candidates,
    time_split,
)
from vitkit.train import create_optimizer


def test_inference_against_timm_reports_every_candidate():
    report = bench("vit_tiny_patch16_224", batch=2, img_size=64, precision="bf16", compare="timm", rounds=2, warmup=1)
    assert [r.name for r in report.results] == ["vitkit bf16", "timm fp32", "timm autocast-bf16"]
    assert report.img_size == (64, 64) and report.mode == "inference"
    assert set(report.gemm_flops_per_second) == {"bf16", "fp32"}
    for r in report.results:
        assert len(r.times_ms) == 2 and r.latency_ms == pytest.approx(
            sorted(r.times_ms)[0] / 2 + sorted(r.times_ms)[1] / 2
        )
        assert r.images_per_second == pytest.approx(2 / (r.latency_ms / 1000))
        assert r.peak_memory_bytes > 0 and 0 < r.mfu
        assert sum(r.time_split.values()) == pytest.approx(1.0) and r.time_split["optimizer"] == 0


def test_training_steps_update_the_weights(capsys):
    assert main(["bench", "vit_tiny_patch16_224", "--batch", "2", "--img-size", "32", "--train", "--rounds", "1",
                 "--warmup", "0", "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "train" and [r["name"] for r in data["results"]] == ["vitkit fp32 train"]
    assert data["flops_per_step"] % 3 == 0


def test_table_output(capsys):
    assert main(["bench", "deit_tiny_patch16_224", "--batch", "1", "--img-size", "32", "--rounds", "1",
                 "--compare", "timm"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "vitkit fp32" in out and "timm fp32" in out and "vs timm fp32" in out and "1.00x" in out


def test_gemm_rate_is_positive():
    assert gemm_rate("fp32", torch.device("cpu"), n=128, repeats=2) > 0


def test_errors():
    with pytest.raises(ValueError, match="precision must be one of"):
        bench("vit_tiny_patch16_224", precision="int8")
    with pytest.raises(ValueError, match="compare must be one of"):
        bench("vit_tiny_patch16_224", compare="hf")
    with pytest.raises(ValueError, match="unknown model"):
        bench("vit_tiny")


def test_compile_applies_to_training_steps():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    report = bench("vit_tiny_patch16_224", batch=2, img_size=32, train=True, compile=True, rounds=1, warmup=1)
    assert [r.name for r in report.results] == ["vitkit fp32 train compiled"]
    assert counters["stats"]["unique_graphs"] >= 1  # the model was compiled, not run eagerly


def test_training_steps_use_the_optimizer_given():
    built = []

    def factory(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        built.append((model, lr, weight_decay))
        return torch.optim.SGD(model.parameters(), lr=lr)

    report = bench("vit_tiny_patch16_224", batch=2, img_size=32, train=True, rounds=1, warmup=0, optimizer=factory)
    assert [r.name for r in report.results] == ["vitkit fp32 train"]
    ((model, lr, weight_decay),) = built
    assert model.config.img_size == 224 and model.config.dynamic_img_size and (lr, weight_decay) == (1e-4, 0.05)
    assert report.flops_per_step == 3 * profile("vit_tiny_patch16_224", 32, 2).matmul_flops


def test_candidates_are_built_apart_from_timing():
    candidates = build_candidates(
        "vit_tiny_patch16_224", 2, (32, 32), "fp32", False, False, None, torch.device("cpu"), adamw
    )
    assert list(candidates) == ["vitkit fp32"]
    precision, step = candidates["vitkit fp32"]
    assert precision == "fp32" and step().shape == (2, 1000)
    results, rates = time_candidates(candidates, batch=2, flops=10**9, rounds=3, warmup=1, device=torch.device("cpu"))
    (result,) = results
    assert len(result.times_ms) == 3 and result.latency_ms == pytest.approx(sorted(result.times_ms)[1])
    assert result.mfu == pytest.approx(10**9 / (result.latency_ms / 1000) / rates["fp32"])


def test_the_command_times_the_optimizer_vitkit_train_uses(monkeypatch):
    seen = {}

    def fake_bench(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop")

    monkeypatch.setattr("vitkit.cli.bench.bench", fake_bench)
    assert main(["bench", "vit_tiny_patch16_224", "--train"]) == 2
    assert seen["optimizer"] is create_optimizer and seen["train"] is True


def test_detector_against_transformers(capsys):
    assert main(["bench", "detr_tiny", "--batch", "1", "--img-size", "64x96", "--precision", "bf16", "--rounds", "1",
                 "--warmup", "0", "--compare", "transformers"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    for name in ("vitkit bf16", "transformers fp32", "transformers autocast-bf16", "vs transformers fp32"):
        assert name in out
    assert "64x96" in out


def test_detector_comparison_errors():
    with pytest.raises(ValueError, match="--compare transformers covers the DETR models"):
        bench("vit_tiny_patch16_224", compare="transformers")
    with pytest.raises(ValueError, match="bench --train times classifiers; detr_tiny is a detector"):
        bench("detr_tiny", train=True)


def test_time_split_covers_the_step_and_finds_the_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    optimizer = adamw(model, lr=1e-3, weight_decay=0.0)
    x = torch.randn(32, 64)

    def train_step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for step, has_optimizer in ((lambda: model(x), False), (train_step, True)):
        split = time_split(step)
        assert list(split) == list(SPLIT) and sum(split.values()) == pytest.approx(1.0)
        assert split["GEMMs"] > 0 and (split["optimizer"] > 0) == has_optimizer


def test_time_split_categories():
    assert _category("aten::addmm", False) == "GEMMs" and _category("mkldnn::_linear_pointwise", False) == "GEMMs"
    assert _category("aten::_scaled_dot_product_flash_attention_for_cpu", False) == "attention"
    assert _category("aten::_softmax", False) == "attention" and _category("aten::copy_", False) == "copies"
    assert _category("aten::native_layer_norm", False) == "norms and elementwise"
    assert _category("aten::gelu", False) == "norms and elementwise" and _category("aten::view", False) == "other"
    assert _category("aten::add_", True) == "optimizer" and _category("Optimizer.step#AdamW.step", False) == "optimizer"


@pytest.fixture
def one_mebibyte(monkeypatch):
    """The machine seen with 1 MiB available; building a candidate fails the test."""
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": 2**20)

    def built(*args, **kwargs):
        raise AssertionError("a candidate was built before the memory check")

    monkeypatch.setattr("vitkit.perf.bench.build_candidates", built)


def test_a_run_that_does_not_fit_is_refused_before_any_model_is_built(one_mebibyte):
    with pytest.raises(NotEnoughMemory, match=r"needs about .* To run anyway, pass allow_memory=True\.") as caught:
        bench("vit_tiny_patch16_224", batch=8, img_size=448, train=True)
    assert caught.value.estimate.training and caught.value.estimate.batch == 8
    assert "grad_checkpointing" not in str(caught.value)  # bench has no such setting


def test_allow_memory_runs_anyway(monkeypatch):
    monkeypatch.setattr("vitkit.analysis.preflight.available_memory", lambda device="cpu": 2**20)
    with pytest.warns(MemoryWarning, match="Running anyway"):
        report = bench("vit_tiny_patch16_224", batch=1, img_size=32, rounds=1, warmup=0, allow_memory=True)
    assert [r.name for r in report.results] == ["vitkit fp32"]


def test_the_command_refuses_with_its_flags(one_mebibyte, capsys):
    assert main(["bench", "vit_tiny_patch16_224", "--batch", "8", "--img-size", "448", "--train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit bench: error: vit_tiny_patch16_224 training at batch 8, 448x448, fp32")
    assert "a smaller --img-size" in err and "pass --ignore-memory-check" in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_the_estimate_holds_every_candidates_model_at_once():
    alone = bench_memory("vit_tiny_patch16_224", (224, 224), "fp32", True, None)(4)
    single = estimate_memory("vit_tiny_patch16_224", 224, 4, training=True)
    assert alone == single
    with_timm = bench_memory("vit_tiny_patch16_224", (224, 224), "fp32", True, "timm")(4)
    assert (
        with_timm.weights_bytes == 2 * single.weights_bytes and with_timm.optimizer_bytes == 2 * single.optimizer_bytes
    )
    assert with_timm.step_bytes == single.step_bytes  # the steps run one at a time
    bf16 = bench_memory("vit_tiny_patch16_224", (224, 224), "bf16", True, "timm")(4)
    assert bf16.weights_bytes == 3 * single.weights_bytes  # timm's autocast training builds a model of its own
    assert bf16.step_bytes == single.step_bytes  # the fp32 reference step is the largest
