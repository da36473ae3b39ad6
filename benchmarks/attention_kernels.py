"""This CPU's kernels as vitkit's fast paths see them: GEMM rates and the attention paths, medians of repeated calls.

    python benchmarks/attention_kernels.py          # GEMM rates (plain matmul and oneDNN's packed linear), attention
    python benchmarks/attention_kernels.py --quick  # small shapes, a few calls: that the script runs (the test suite)

The GEMM rows are n x n x n products in fp32 and bf16 (`vitkit bench` measures n = 2048 as its peak) and bf16 linear
layers at ViT-S/16 and ViT-B/16 shapes (batch 16), through `F.linear` and through `PackedLinear`'s reordered weight.
The attention rows time torch's fused kernel, `explicit_attention` and `blocked_attention` (32 MiB blocks) in bf16,
forward without autograd, and forward and backward for the fused kernel and the explicit path: the figures behind
`Attention.path`'s choice on a CPU (BENCHMARKS.md, "A CPU with AMX tiles").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vitkit.kernels.attention import EXPLICIT_MAX_BYTES, blocked_attention, explicit_attention
from vitkit.kernels.probe import cpu_amx, native_cpu_bf16
from vitkit.perf.bench import gemm_rate
from vitkit.perf.optimize import PackedLinear, packed_linear_supported


def median_ms(fn: Callable[[], object], calls: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def gemm_rows(sizes: list[int], linears: list[tuple[int, int, int]], calls: int) -> list[dict]:
    """TFLOP/s of n^3 products in fp32 and bf16, and of bf16 linear layers (tokens, in, out) plain and packed."""
    cpu = torch.device("cpu")
    rows = [
        {
            "kernel": f"matmul {precision}",
            "shape": f"{n}^3",
            "tflops": gemm_rate(precision, cpu, n=n, repeats=calls) / 1e12,
        }
        for precision in ("fp32", "bf16")
        for n in sizes
    ]
    packed = packed_linear_supported()
    with torch.inference_mode():
        for m, k, n in linears:
            x, weight, bias = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16()
            flops = 2 * m * k * n
            ms = median_ms(lambda: F.linear(x, weight, bias), calls)  # noqa: B023
            rows.append({"kernel": "F.linear bf16", "shape": f"{m}x{k}x{n}", "tflops": flops / ms / 1e9})
            if packed:
                layer = PackedLinear(weight, bias)
                ms = median_ms(lambda: layer(x), calls)  # noqa: B023
                rows.append({"kernel": "PackedLinear bf16", "shape": f"{m}x{k}x{n}", "tflops": flops / ms / 1e9})
    return rows


def attention_rows(shapes: list[tuple[int, int, int, int]], calls: int, backward_tokens: int) -> list[dict]:
    """Milliseconds of each attention path for q, k, v of shape (B, h, N, d) in bf16, laid out as a fused qkv
    projection leaves them; forward and backward for calls of at most `backward_tokens` tokens."""
    rows = []
    for B, h, N, d in shapes:
        torch.manual_seed(0)
        q, k, v = torch.randn(B, N, 3, h, d).bfloat16().permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, h, N, d)
        scale = d**-0.5
        row = {"shape": f"({B}, {h}, {N}, {d})"}
        with torch.inference_mode():
            row["fused"] = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale), calls)  # noqa: B023
            row["explicit"] = median_ms(lambda: explicit_attention(q, k, v, None, scale), calls)  # noqa: B023
            blocked = lambda: blocked_attention(q, k, v, None, scale, EXPLICIT_MAX_BYTES)  # noqa: B023, E731
            row["blocked"] = median_ms(blocked, calls)
        if N <= backward_tokens:
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            fused = lambda: F.scaled_dot_product_attention(qg, kg, vg, scale=scale).sum().backward()  # noqa: B023, E731
            explicit = lambda: explicit_attention(qg, kg, vg, None, scale).sum().backward()  # noqa: B023, E731
            row["fused fwd+bwd"], row["explicit fwd+bwd"] = median_ms(fused, calls), median_ms(explicit, calls)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes and few calls: a check that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        sizes, linears, shapes, calls, backward_tokens = [64], [(64, 32, 48)], [(2, 2, 17, 8)], 2, 64
    else:
        sizes, calls, backward_tokens = [1024, 2048, 3072, 4096], 10, 1000
        linears = [(3152, 384, 1536), (3152, 1536, 384), (3152, 384, 1152), (3152, 768, 3072), (3152, 3072, 768)]
        shapes = [(16, 6, 197, 64), (16, 12, 197, 64), (1, 12, 4096, 64), (1024, 3, 49, 32)]
    print(
        f"{torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"native bf16 {native_cpu_bf16()}, AMX {cpu_amx()}"
    )
    print(f"\n{'kernel':20s} {'shape':>16s} {'TFLOP/s':>8s}")
    for row in gemm_rows(sizes, linears, calls):
        print(f"{row['kernel']:20s} {row['shape']:>16s} {row['tflops']:8.3f}")
    rows = attention_rows(shapes, calls, backward_tokens)
    columns = ("fused", "explicit", "blocked", "fused fwd+bwd", "explicit fwd+bwd")
    print(f"\nattention, bf16, ms{'':9s}" + "".join(f"{c:>18s}" for c in columns))
    for row in rows:
        print(f"{row['shape']:27s}" + "".join(f"{row[c]:18.2f}" if c in row else f"{'-':>18s}" for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
