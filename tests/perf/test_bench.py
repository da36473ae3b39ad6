"""bench(): the candidates, their fields and the CLI; no timing is asserted (timings are benchmarks)."""

import functools
import json
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit import create_model
from vitkit.analysis import MemoryWarning, NotEnoughMemory, estimate_memory, profile
from vitkit.analysis.precision import cpu_features
from vitkit.cli import main
from vitkit.cli.messages import cli_option
from vitkit.perf.bench import (
    SPLIT,
    adamw,
    bench,
    bench_memory,
    build_candidates,
    gemm_rate,
    product_seconds,
    quiet_profiler,
    time_candidates,
    time_category,
    time_split,
)
from vitkit.train import create_optimizer


def counted_matmul_flops(name: str, img_size: int, batch: int, backward: bool = False) -> int:
    """FlopCounterMode's count for the model run with explicit (math) attention, which it counts fully: one forward
    pass, or with `backward` a forward and a backward pass (the input's gradient included). Shapes only (meta)."""
    with torch.device("meta"):
        model = create_model(name, attn_backend="math", dynamic_img_size=True)
        x = torch.randn(batch, model.config.in_chans, img_size, img_size, requires_grad=backward)
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


@pytest.fixture
def small_gemms(monkeypatch):
    """GEMM rates measured on 256 x 256 products: one 2048 x 2048 bf16 product takes a minute on a CPU without bf16
    units (`gemm_rate` itself is tested on its own)."""
    monkeypatch.setattr("vitkit.perf.bench.gemm_rate", functools.partial(gemm_rate, n=256, repeats=2, min_seconds=0))


def test_inference_against_timm_reports_every_candidate(small_gemms):
    report = bench("vit_tiny_patch16_224", batch=2, img_size=64, precision="bf16", compare="timm", rounds=2, warmup=1)
    assert [r.name for r in report.results] == ["vitkit bf16", "timm fp32", "timm autocast-bf16"]
    assert report.img_size == (64, 64) and report.mode == "inference"
    assert set(report.gemm_flops_per_second) == {"bf16", "fp32"}
    assert report.flops_per_step == counted_matmul_flops("vit_tiny_patch16_224", 64, 2)
    for r in report.results:
        assert len(r.times_ms) == 2 and r.latency_ms == pytest.approx(
            sorted(r.times_ms)[0] / 2 + sorted(r.times_ms)[1] / 2
        )
        assert r.images_per_second == pytest.approx(2 / (r.latency_ms / 1000))
        assert r.peak_memory_bytes > 0 and 0 < r.mfu
        rate = report.gemm_flops_per_second[r.precision]
        assert r.mfu == pytest.approx(report.flops_per_step / (r.latency_ms / 1000) / rate)
        assert sum(r.time_split.values()) == pytest.approx(1.0) and r.time_split["optimizer"] == 0


def test_training_steps_update_the_weights(capsys, monkeypatch):
    built = {}

    def recording(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        model.pos_embed.requires_grad_(False)  # frozen: no step may move it
        built["before"] = {k: v.clone() for k, v in model.state_dict().items()}
        built["model"], built["optimizer"] = model, create_optimizer(model, lr, weight_decay)
        return built["optimizer"]

    monkeypatch.setattr("vitkit.cli.bench.create_optimizer", recording)
    assert main(["bench", "vit_tiny_patch16_224", "--batch-size", "2", "--img-size", "32", "--train", "--rounds", "1",
                 "--warmup", "0", "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "train" and [r["name"] for r in data["results"]] == ["vitkit fp32 train"]
    assert data["flops_per_step"] % 3 == 0
    assert data["flops_per_step"] == counted_matmul_flops("vit_tiny_patch16_224", 32, 2, backward=True)
    model, before, optimizer = built["model"], built["before"], built["optimizer"]
    after = model.state_dict()
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == len(before) - 1 and "pos_embed" not in trained  # every parameter but the frozen one
    assert {k for k in before if not torch.equal(before[k], after[k])} == trained
    (steps,) = {int(optimizer.state[p]["step"]) for p in model.parameters() if p.requires_grad}
    assert steps >= 1  # the timed step, and those run to measure its memory and its time split
    moved = max((after[k] - before[k]).abs().max().item() for k in trained)
    assert 0 < moved <= 3e-4 * steps  # AdamW at lr 1e-4 moves an element by about lr per step, never by 3x that


def test_table_output(capsys):
    assert main(["bench", "deit_tiny_patch16_224", "--batch-size", "1", "--img-size", "32", "--rounds", "1",
                 "--compare", "timm"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "vitkit fp32" in out and "timm fp32" in out and "vs timm fp32" in out and "1.00x" in out
    assert f"TFLOP/s ({cpu_features()})" in out  # a figure names the instruction sets it was measured with
    assert "bf16 attention" not in out  # fp32: the fused kernel, nothing measured to say


def test_a_bf16_table_says_which_attention_path_this_cpu_measured_faster(monkeypatch, capsys):
    from vitkit.kernels import probe

    amx = probe.AttentionTimes(fused=1.1e-3, explicit=1.6e-3, fused_grad=9e-3, explicit_grad=4e-3)
    monkeypatch.setattr(probe, "cpu_bf16_attention", lambda: amx)
    monkeypatch.setattr("vitkit.cli.bench.cpu_bf16_attention", lambda: amx)
    assert main(["bench", "vit_tiny_patch16_224", "--batch-size", "1", "--img-size", "32", "--rounds", "1",
                 "--precision", "bf16"]) == 0  # fmt: skip
    assert (
        "bf16 attention (auto) takes the fused kernel without a gradient (1.1 ms against the explicit product's 1.6); "
        "the explicit product with a gradient (4.0 ms against the fused kernel's 9.0), as measured on this CPU"
    ) in capsys.readouterr().out


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_bench_auto_lets_the_models_own_step_decide(monkeypatch, capsys, train, fake_time_step):
    """--precision auto where the products favour bf16: the model's step in each precision decides (its real
    steps run, faked times), and the table says so and times the precision chosen."""
    import importlib

    from vitkit.analysis import precision
    from vitkit.analysis.precision import MatmulRates, StepTimes

    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=650e9))
    fake = fake_time_step(StepTimes(fp32=0.01, bf16=0.03))
    timing = precision if train else importlib.import_module("vitkit.perf.optimize")  # the step's, the copies'
    monkeypatch.setattr(timing, "time_step", fake)
    args = ["bench", "vit_tiny_patch16_224", "--batch-size", "2", "--img-size", "32", "--rounds", "1"]
    assert main(args + ["--precision", "auto"] + (["--train"] if train else [])) == 0
    assert fake.ran == [False, True]
    captured = capsys.readouterr()
    step = "training step" if train else "forward"
    why = f"this model's {step} 30 ms in bf16 against 10 in fp32: fp32"
    assert f"precision fp32 (auto: measured on this CPU: bf16 0.65 TFLOP/s, fp32 0.10; {why})" in captured.err
    assert f"precision auto takes fp32 (measured on this CPU: bf16 0.65 TFLOP/s, fp32 0.10; {why})" in captured.out
    assert "vitkit fp32" in captured.out and "bf16" not in captured.out.split("candidate")[1]


def test_cpu_features_name_amx_where_torch_sees_it(monkeypatch):
    from vitkit.analysis import precision
    from vitkit.kernels.probe import ISA_CAPS

    for name in ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: True)
    for amx, expected in ((True, ", native bf16 with AMX"), (False, ", native bf16")):
        monkeypatch.setattr(precision, "cpu_amx", lambda amx=amx: amx)
        assert cpu_features() == torch.backends.cpu.get_cpu_capability() + expected
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # oneDNN kept from the AMX it has
    assert cpu_features().endswith(", native bf16; capped by ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16")


def test_a_slower_bf16_is_said_once_in_the_commands_words(monkeypatch, capsys):
    """`vitkit bench --precision bf16` where bf16's products measure slower (faked): one warning, naming the
    command's options; `optimize`'s own warning, in Python's words, is not repeated."""
    import warnings

    from vitkit.analysis import precision
    from vitkit.analysis.precision import MatmulRates, SlowPrecisionWarning

    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=255e9, bf16=162e9))
    args = ["bench", "vit_tiny_patch16_224", "--batch-size", "1", "--img-size", "32", "--rounds", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(args + ["--precision", "bf16"]) == 0
    assert not [w for w in caught if issubclass(w.category, SlowPrecisionWarning)]
    err = capsys.readouterr().err
    assert err.count("bf16 is slower than fp32") == 1
    assert "warning: bf16 is slower than fp32 on this CPU" in err and "use fp32 (--precision fp32)" in err
    with pytest.warns(SlowPrecisionWarning, match=r'use fp32 \(optimize\(model, "fp32"\)\)'):  # the library says it
        vitkit.optimize(create_model("vit_tiny_patch16_224", depth=1), "bf16")


class ProductClock(TorchDispatchMode):
    """A clock in which the k-th matrix product run under it takes `durations[k]` seconds and nothing else takes
    any time; it stands in for the `time` module (`perf_counter`)."""

    def __init__(self, durations: list[float]) -> None:
        super().__init__()
        self.durations = iter(durations)
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            self.now += next(self.durations)
        return func(*args, **(kwargs or {}))


def test_gemm_rate_is_the_flops_of_one_product_over_the_fastest_time(monkeypatch):
    n, repeats = 96, 5
    with FlopCounterMode(display=False) as counter:
        gemm_rate("fp32", torch.device("cpu"), n=n, repeats=repeats, min_seconds=0)
    assert counter.get_total_flops() == (2 + repeats) * 2 * n**3  # two warm-up products, then the timed ones
    with FlopCounterMode(display=False) as counter:
        gemm_rate("fp32", torch.device("cpu"), repeats=1, min_seconds=0)
    assert counter.get_total_flops() == 3 * 2 * 2048**3  # on CPU 2048^3 by default
    # warm-ups of 0.5 ms are left out (faster than any timed product); the fastest of 4, 1, 3, 2 and 5 ms is 1 ms
    clock = ProductClock([0.0005, 0.0005, 0.004, 0.001, 0.003, 0.002, 0.005])
    monkeypatch.setattr("vitkit.perf.bench.time", clock)
    with clock:
        rate = gemm_rate("fp32", torch.device("cpu"), n=n, repeats=repeats, min_seconds=0)
    assert rate == pytest.approx(2 * n**3 / 0.001)
    # past `repeats`, products go on until `min_seconds` are timed: 2 + 3 products of 0.2 s reach 0.5 s
    clock = ProductClock([1.0, 1.0, 0.2, 0.2, 0.2, 0.1])
    monkeypatch.setattr("vitkit.perf.bench.time", clock)
    with clock:
        assert gemm_rate("bf16", torch.device("cpu"), n=64, repeats=2, min_seconds=0.5) == pytest.approx(
            2 * 64**3 / 0.2
        )
    assert next(clock.durations) == 0.1  # the sixth product never ran


def test_on_a_gpu_products_are_timed_by_cuda_events_with_one_synchronisation_a_batch(monkeypatch):
    clock, waits, products = {"ms": 0.0}, [], []
    durations = iter([4.0, 1.0, 3.0, 2.0, 5.0, 6.0])  # milliseconds of the products, in turn

    class Event:  # torch.cuda.Event's timing, on a clock the products advance
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = None

        def record(self) -> None:
            self.at = clock["ms"]

        def elapsed_time(self, end: "Event") -> float:
            assert waits, "an event's time is read only after the host waited for the device"
            return end.at - self.at

    def product() -> None:
        products.append(len(waits))  # how many waits came before this product
        clock["ms"] += next(durations)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    cuda = torch.device("cuda")
    seconds = product_seconds(product, cuda, repeats=2, min_seconds=0.009)
    # 2 products a batch until 9 ms are timed: 4 + 1, then 3 + 2 (10 ms); one wait after each batch
    assert seconds == pytest.approx([0.004, 0.001, 0.003, 0.002])
    assert products == [0, 0, 1, 1] and waits == [cuda, cuda]


def test_errors():
    with pytest.raises(ValueError, match="precision must be one of"):
        bench("vit_tiny_patch16_224", precision="int8")
    with pytest.raises(ValueError, match="compare must be one of"):
        bench("vit_tiny_patch16_224", compare="hf")
    with pytest.raises(ValueError, match="unknown model"):
        bench("vit_tiny")
    with pytest.raises(ValueError, match=r"compile with warmup=0 would time torch.compile's compilation") as err:
        bench("vit_tiny_patch16_224", compile=True, warmup=0)  # refused before any model is built or compiled
    assert err.value.message(cli_option).endswith("give it a warm-up step (--warmup 1 or more)")


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


def test_the_gemm_rate_is_the_faster_of_a_probe_before_and_one_after_the_rounds(monkeypatch):
    probed = []
    rates_in_turn = iter([1e9, 4e9, 3e9, 2e9])  # bf16 then fp32 before the rounds, the same after them

    def probe(precision: str, device: torch.device) -> float:
        probed.append(precision)
        return next(rates_in_turn)

    monkeypatch.setattr("vitkit.perf.bench.gemm_rate", probe)
    candidates = {"a": ("fp32", lambda: torch.ones(8) @ torch.ones(8)), "b": ("bf16", lambda: torch.ones(8).sum())}
    results, rates = time_candidates(candidates, batch=1, flops=10**6, rounds=2, warmup=0, device=torch.device("cpu"))
    assert probed == ["bf16", "fp32", "bf16", "fp32"]
    assert rates == {"bf16": 3e9, "fp32": 4e9}  # bf16's later probe was faster, fp32's earlier one
    for result in results:
        assert result.mfu == pytest.approx(10**6 / (result.latency_ms / 1000) / rates[result.precision])


def test_the_command_times_the_optimizer_vitkit_train_uses(monkeypatch):
    seen = {}

    def fake_bench(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop")

    monkeypatch.setattr("vitkit.cli.bench.bench", fake_bench)
    assert main(["bench", "vit_tiny_patch16_224", "--train"]) == 2
    assert seen["optimizer"] is create_optimizer and seen["train"] is True


def test_detector_against_transformers(capsys, small_gemms):
    assert main(["bench", "detr_tiny", "--batch-size", "1", "--img-size", "64x96", "--precision", "bf16",
                 "--rounds", "1", "--warmup", "0", "--compare", "transformers"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    for name in ("vitkit bf16", "transformers fp32", "transformers autocast-bf16", "vs transformers fp32"):
        assert name in out
    assert "64x96" in out


def test_detector_comparison_errors(capsys):
    with pytest.raises(ValueError, match=r"transformers. covers the detectors \(DETR and Deformable DETR\); compare"):
        bench("vit_tiny_patch16_224", compare="transformers")
    with pytest.raises(ValueError, match="detr_tiny is a detector: compare it with transformers"):
        bench("detr_tiny", compare="timm")
    assert main(["bench", "detr_tiny", "--compare", "timm"]) == 2  # the command names its flag
    assert "compare it with transformers (--compare transformers)" in capsys.readouterr().err


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("name", ["detr_tiny", "deformable_detr_small"])
def test_detector_training_step_is_the_set_criterion_beside_transformers(name):
    from vitkit.detection import criterion_for
    from vitkit.models.interface import has_no_object_logit
    from vitkit.perf.bench import DETECTION_BOXES, detection_targets

    candidates = build_candidates(
        name, 2, (64, 64), "fp32", False, True, "transformers", torch.device("cpu"), create_optimizer
    )
    assert list(candidates) == ["vitkit fp32 train", "transformers fp32 train"]
    torch.manual_seed(0)
    model = create_model(name).train()  # the candidate's model, seeded alike
    x = torch.randn(2, 3, 64, 64)
    targets = detection_targets(2, model.config.num_classes, DETECTION_BOXES, torch.device("cpu"))
    assert [len(t["boxes"]) for t in targets] == [DETECTION_BOXES] * 2
    loss = "ce" if has_no_object_logit(model) else "focal"
    criterion = criterion_for(loss, model.config.num_classes, model.config.aux_loss, has_no_object_logit(model))
    torch.manual_seed(1)  # the same dropout draws in both
    expected = criterion(model(x), targets)["total"]
    _, vitkit_step = candidates["vitkit fp32 train"]
    torch.manual_seed(1)
    torch.testing.assert_close(vitkit_step().detach(), expected.detach())  # the first step: the weights as built
    for _, step in candidates.values():
        assert torch.isfinite(step())  # a second step each, after an update


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
    cases = {
        ("aten::addmm", False): "GEMMs",
        ("mkldnn::_linear_pointwise", False): "GEMMs",
        ("aten::_scaled_dot_product_flash_attention_for_cpu", False): "attention",
        ("aten::_softmax", False): "attention",
        ("aten::copy_", False): "copies",
        ("aten::native_layer_norm", False): "norms and elementwise",
        ("aten::gelu", False): "norms and elementwise",
        ("aten::view", False): "other",
        ("aten::add_", True): "optimizer",
        ("Optimizer.step#AdamW.step", False): "optimizer",
    }
    assert {case: time_category(*case) for case in cases} == cases


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
    assert main(["bench", "vit_tiny_patch16_224", "--batch-size", "8", "--img-size", "448", "--train"]) == 2
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


def test_the_profilers_log_lines_stay_out_of_the_output(capfd):
    """torch.profiler's C++ side writes "USDT:... profiler_start" and, without a GPU, "ERROR:... gpuGetDeviceCount
    failed" to the process's stderr; `time_split` keeps them out, and passes on anything else written there."""
    with quiet_profiler():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            torch.ones(2) + 1
        os.write(2, b"a real warning\n")
    split = time_split(lambda: torch.ones(8, 8) @ torch.ones(8, 8))
    assert split["GEMMs"] > 0
    err = capfd.readouterr().err
    assert "a real warning" in err
    assert "profiler_start" not in err and "gpuGetDeviceCount" not in err and ".cpp:" not in err
