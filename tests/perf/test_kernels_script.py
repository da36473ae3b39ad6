"""benchmarks/kernels.py in its quick mode, so that the figures behind `Attention.path` stay reproducible."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "kernels.py"


def load_script():
    spec = importlib.util.spec_from_file_location("kernels_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_run_times_every_kernel_and_path(capsys):
    script = load_script()
    assert script.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "matmul fp32" in out and "matmul bf16" in out and "F.linear bf16" in out
    rows = script.attention_rows([(2, 2, 17, 8), (1, 2, 40, 8)], calls=1, backward_tokens=20)
    assert [set(row) for row in rows] == [
        {"shape", "fused", "explicit", "blocked", "fused fwd+bwd", "explicit fwd+bwd"},
        {"shape", "fused", "explicit", "blocked"},  # over backward_tokens: forward only
    ]
    assert all(value > 0 for row in rows for key, value in row.items() if key != "shape")
