"""benchmarks/attention_kernels.py in its quick mode, so that the figures behind `Attention.path` stay reproducible."""


def test_quick_run_times_every_kernel_and_path(capsys, load_benchmark):
    script = load_benchmark("attention_kernels")
    assert script.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "matmul fp32" in out and "matmul bf16" in out and "F.linear bf16" in out
    rows = script.attention_rows([(2, 2, 17, 8), (1, 2, 40, 8)], calls=1, backward_tokens=20)
    assert [set(row) for row in rows] == [
        {"shape", "fused", "explicit", "blocked", "fused fwd+bwd", "explicit fwd+bwd"},
        {"shape", "fused", "explicit", "blocked"},  # over backward_tokens: forward only
    ]
    assert all(value > 0 for row in rows for key, value in row.items() if key != "shape")
