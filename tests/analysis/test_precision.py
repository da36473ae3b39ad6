"""Whether bf16 pays on this device, measured, not assumed from the CPU's flags: `slow_precision` says so before
a run, `auto` picks the faster precision; the probe is cached per machine."""

import json

import pytest
import torch

import vitkit
from vitkit.analysis import precision
from vitkit.analysis.precision import (
    FASTER_BY,
    MatmulRates,
    StepTimes,
    auto_precision,
    choose_precision,
    cpu_matmul_rates,
    resolve_precision,
    slow_precision,
)
from vitkit.cli.messages import cli_option
from vitkit.kernels.probe import probe_key
from vitkit.train import TrainConfig


def test_rates_are_measured_once_and_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path))
    cpu_matmul_rates.cache_clear()
    rates = cpu_matmul_rates()
    assert rates.fp32 > 0 and rates.bf16 > 0 and rates is cpu_matmul_rates()
    assert rates.bf16_speedup == pytest.approx(rates.bf16 / rates.fp32)
    cached = json.loads((tmp_path / "matmul_rates.json").read_text())
    assert cached == {probe_key(): {"fp32": rates.fp32, "bf16": rates.bf16}}
    cached[probe_key()] = {"fp32": 1e9, "bf16": 5e9}  # another process reads the machine's figures, not measuring
    (tmp_path / "matmul_rates.json").write_text(json.dumps(cached))
    cpu_matmul_rates.cache_clear()
    monkeypatch.setattr(precision, "_rate", lambda *args: pytest.fail("measured again"))
    assert cpu_matmul_rates() == MatmulRates(fp32=1e9, bf16=5e9)
    cpu_matmul_rates.cache_clear()


def test_figures_cached_for_another_kind_of_cpu_of_the_same_name_are_not_read(tmp_path, monkeypatch):
    """A cache shared between machines, or a run under an instruction-set cap: the key holds what sets the speed of
    the products beside the CPU's name, which a hypervisor may report generically ("Intel(R) Xeon(R) Processor",
    with AMX and with AMX hidden). Figures of another kind are measured again, not read."""
    from vitkit.kernels import probe

    for name in probe.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(probe, "cpu_model", lambda: "Intel(R) Xeon(R) Processor")
    amx = {"amx_bf16": True, "avx512_bf16": True, "avx512_f": True, "avx2": True, "sse2": True}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: amx)
    with_amx = probe.probe_key()
    assert "amx_bf16 avx512_bf16 avx512_f avx2 |" in with_amx and "sse2" not in with_amx
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # oneDNN kept from AMX: another kind's speed
    capped = probe.probe_key()
    assert capped != with_amx and "| ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 |" in capped
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**amx, "amx_bf16": False})  # AMX hidden
    hidden = probe.probe_key()
    assert len({with_amx, capped, hidden}) == 3 and "avx512_bf16 avx512_f avx2 |" in hidden
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path))
    (tmp_path / "matmul_rates.json").write_text(json.dumps({with_amx: {"fp32": 1e11, "bf16": 6e11}}))
    cpu_matmul_rates.cache_clear()
    monkeypatch.setattr(precision, "_time_rates", lambda: {"fp32": 2.55e11, "bf16": 1.62e11})
    assert cpu_matmul_rates() == MatmulRates(fp32=2.55e11, bf16=1.62e11)  # measured here, not the AMX figures
    assert json.loads((tmp_path / "matmul_rates.json").read_text()) == {
        with_amx: {"fp32": 1e11, "bf16": 6e11},
        hidden: {"fp32": 2.55e11, "bf16": 1.62e11},
    }
    cpu_matmul_rates.cache_clear()


def test_auto_takes_bf16_only_where_it_measures_faster(monkeypatch):
    """The decision on fake timings: the flags say nothing, the rates decide, with a margin."""
    assert choose_precision(MatmulRates(fp32=255e9, bf16=162e9)) == "fp32"  # a Xeon with AVX512-BF16, no AMX
    assert choose_precision(MatmulRates(fp32=110e9, bf16=14e9)) == "fp32"  # emulated (Zen 3)
    assert choose_precision(MatmulRates(fp32=100e9, bf16=100e9 * FASTER_BY * 0.99)) == "fp32"  # within the margin
    assert choose_precision(MatmulRates(fp32=100e9, bf16=220e9)) == "bf16"  # Zen 4
    assert choose_precision(MatmulRates(fp32=100e9, bf16=650e9)) == "bf16"  # AMX
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: True)  # the flags say bf16, the probe says slower
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=255e9, bf16=162e9))
    assert auto_precision("cpu") == ("fp32", "measured on this CPU: bf16 0.16 TFLOP/s, fp32 0.26")
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=220e9))
    assert auto_precision("cpu")[0] == "bf16"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp16", "cpu")


def test_a_slower_bf16_is_named_with_its_rates_even_where_the_cpu_has_the_instructions(monkeypatch):
    for native in (False, True):
        monkeypatch.setattr(precision, "native_cpu_bf16", lambda native=native: native)
        monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=110e9, bf16=14e9))
        message = slow_precision("bf16", "cpu")
        assert "bf16 is slower than fp32 on this CPU" in message
        assert "14.0 GFLOP/s in bf16 against 110.0 in fp32 (7.9x slower); use fp32 (precision='fp32')" in message
        assert "or the faster of the two (precision='auto')" in message
        assert slow_precision("bf16", "cpu", cli_option).endswith("(--precision auto)")  # as commands say it
    assert slow_precision("fp32", "cpu") is None
    with pytest.warns(UserWarning, match=r'7.9x slower\); use fp32 \(optimize\(model, "fp32"\)\)'):
        vitkit.optimize(vitkit.create_model("vit_tiny_patch16_224", depth=1), "bf16")
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=120e9))
    assert slow_precision("bf16", "cpu") is None  # not slower: nothing to say
    with pytest.raises(ValueError, match="precision must be one of"):
        slow_precision("fp16", torch.device("cpu"))


def test_auto_in_a_training_run_and_in_optimize_resolves_to_the_measured_faster(monkeypatch):
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=255e9, bf16=162e9))
    assert TrainConfig(precision="auto", device="cpu").resolved().precision == "fp32"
    assert vitkit.optimize(vitkit.create_model("vit_tiny_patch16_224", depth=1), "auto").precision == "fp32"
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=220e9))
    assert TrainConfig(precision="auto", device="cpu").resolved().precision == "bf16"  # a run then times its step
    # (tests/train/test_fit_detector.py), and optimize its two copies (below)
    with pytest.raises(ValueError, match="precision must be 'fp32', 'bf16', 'auto'"):
        TrainConfig(precision="fp16")


def test_a_models_own_step_decides_where_the_products_favour_bf16():
    """The step's times on fake steps: bf16 is kept only at FASTER_BY times fp32's speed; the timing interleaves
    the two after one call of each."""
    from vitkit.analysis.precision import time_step

    assert StepTimes(fp32=0.100, bf16=0.050).choice() == "bf16"
    assert StepTimes(fp32=0.100, bf16=0.100 / FASTER_BY * 1.01).choice() == "fp32"  # within the margin
    assert StepTimes(fp32=0.092, bf16=0.220).choice() == "fp32"  # the small detector on a Xeon with AMX
    assert StepTimes(fp32=0.1, bf16=0.2).describe() == (
        "this model's training step 200 ms in bf16 against 100 in fp32: fp32"
    )
    calls = []
    times = time_step(lambda autocast, i: calls.append((autocast, i)), rounds=3)
    assert calls == [(False, 0), (True, 0), (False, 1), (True, 1), (True, 2), (False, 2), (False, 3), (True, 3)]
    assert times.fp32 >= 0 and times.bf16 >= 0
    slow = time_step(lambda autocast, i: __import__("time").sleep(0.02 if autocast else 0.002), rounds=2)
    assert slow.choice() == "fp32" and slow.bf16 > slow.fp32


def test_a_commands_auto_lets_the_models_forward_decide(monkeypatch, tmp_path, capsys, fake_time_step):
    """eval and predict with --precision auto: where the products favour bf16, the model's inference forward is
    timed (real forwards, faked times) and decides, once per machine (the next command reads the times); a
    detector's images change width from round to round."""
    import argparse

    from vitkit.cli.options import run_precision
    from vitkit.infer import runtime
    from vitkit.infer.runtime import inference_step_times

    model_dir = tmp_path / "vit"
    vitkit.save_pretrained(vitkit.create_model("vit_tiny_patch16_224", depth=1, num_classes=3), model_dir)
    args = argparse.Namespace(precision="auto", model_dir=str(model_dir), device="cpu", command="eval")
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=650e9))
    for times, chosen in ((StepTimes(fp32=0.02, bf16=0.04), "fp32"), (StepTimes(fp32=0.06, bf16=0.02), "bf16")):
        monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / f"cache-{chosen}"))  # another machine
        fake = fake_time_step(times)
        monkeypatch.setattr(runtime, "time_step", fake)
        for _ in range(2):  # timed by the first command only
            assert run_precision(args, batch=4) == chosen and fake.ran == [False, True]
            assert f"vitkit eval: --precision auto: {times.describe('forward')}" in capsys.readouterr().err
        assert run_precision(args, batch=2) == chosen and fake.ran == [False, True] * 2  # another batch: timed
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=50e9))
    monkeypatch.setattr(runtime, "time_step", lambda *a: pytest.fail("the products decide where bf16 is slower"))
    assert run_precision(args) == "fp32"
    assert run_precision(argparse.Namespace(**{**vars(args), "precision": "bf16"})) == "bf16"  # as asked
    monkeypatch.undo()
    detector = vitkit.create_model("deformable_detr_small", num_classes=2, img_size=64)
    shapes = []
    detector.register_forward_pre_hook(lambda module, inputs: shapes.append(tuple(inputs[0].shape)))
    times = inference_step_times(detector, "cpu", batch=2)
    assert times.fp32 > 0 and times.bf16 > 0
    assert shapes == [(2, 3, 64, 64 + 16 * i) for i in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert not detector.training


def test_optimize_auto_returns_the_copy_whose_forward_measures_faster(monkeypatch, fake_time_step):
    """Where the products favour bf16, `optimize(model, "auto")` builds both copies, times their forwards (real
    forwards, faked times) and returns the faster with its times; the products decide alone where bf16 is slower."""
    import importlib

    optimizing = importlib.import_module("vitkit.perf.optimize")  # the module: the package exports the function

    model = vitkit.create_model("vit_tiny_patch16_224", depth=1)
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=650e9))
    for times, chosen in ((StepTimes(fp32=0.02, bf16=0.04), "fp32"), (StepTimes(fp32=0.06, bf16=0.02), "bf16")):
        fake = fake_time_step(times)
        monkeypatch.setattr(optimizing, "time_step", fake)
        fast = vitkit.optimize(model, "auto", batch=2)
        assert fast.precision == chosen and fast.measured == times and fake.ran == [False, True]
        assert next(fast.parameters()).dtype == (torch.bfloat16 if chosen == "bf16" else torch.float32)
    monkeypatch.setattr(optimizing, "time_step", lambda *a: pytest.fail("the products decide where bf16 is slower"))
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=50e9))
    slow = vitkit.optimize(model, "auto")
    assert slow.precision == "fp32" and slow.measured is None
