"""Whether bf16 pays on this device: `slow_precision` says so before a run, on CPUs that emulate bf16."""

import pytest
import torch

import vitkit
from vitkit.analysis import precision
from vitkit.analysis.precision import MatmulRates, cpu_matmul_rates, slow_precision
from vitkit.cli.messages import cli_option


def test_rates_are_measured_once_and_positive():
    rates = cpu_matmul_rates()
    assert rates.fp32 > 0 and rates.bf16 > 0 and rates is cpu_matmul_rates()
    assert rates.bf16_speedup == pytest.approx(rates.bf16 / rates.fp32)


def test_emulated_bf16_is_named_with_its_rates(monkeypatch):
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: False)
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=110e9, bf16=14e9))
    message = slow_precision("bf16", "cpu")
    assert "bf16 is slower than fp32 on this CPU" in message
    assert "14.0 GFLOP/s in bf16 against 110.0 in fp32 (7.9x slower); use fp32 (precision='fp32')" in message
    assert slow_precision("bf16", "cpu", cli_option).endswith("use fp32 (--precision fp32)")  # as commands say it
    assert slow_precision("fp32", "cpu") is None
    with pytest.warns(UserWarning, match=r'7.9x slower\); use fp32 \(optimize\(model, "fp32"\)\)'):
        vitkit.optimize(vitkit.create_model("vit_tiny_patch16_224", depth=1), "bf16")
    # emulated but not slower (a CPU whose emulation keeps up): nothing to say
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: MatmulRates(fp32=100e9, bf16=120e9))
    assert slow_precision("bf16", "cpu") is None


def test_native_bf16_is_not_measured(monkeypatch):
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: True)
    monkeypatch.setattr(precision, "cpu_matmul_rates", lambda: pytest.fail("measured on a native bf16 CPU"))
    assert slow_precision("bf16", torch.device("cpu")) is None
    with pytest.raises(ValueError, match="precision must be one of"):
        slow_precision("fp16", "cpu")
