"""`vitkit bench MODEL`: throughput, latency, peak memory and model-FLOP utilisation, optionally beside timm."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vitkit.analysis.precision import (
    AUTO,
    PRECISIONS,
    auto_precision,
    slow_precision,
)
from vitkit.cli.messages import cli_option
from vitkit.cli.options import add_memory_option, add_renamed_option, memory_flags, parse_size
from vitkit.kernels.probe import cpu_bf16_attention
from vitkit.perf.bench import COMPARE, Report, bench, compared_detectors, model_step_times
from vitkit.train import create_optimizer
from vitkit.util import counted

HELP = "benchmark a model (img/s, latency, peak memory, MFU), interleaved with timm's or transformers' with --compare"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="registered model name (see `vitkit models`)")
    add_renamed_option(parser, "--batch-size", "--batch", type=int, default=16, help="images per step (default 16)")
    parser.add_argument("--img-size", type=parse_size, default=None, help="224 or HxW (default: the model's size)")
    parser.add_argument(
        "--precision",
        choices=(*PRECISIONS, AUTO),
        default="fp32",
        help="fp32, bf16, or auto: the faster on this device, as matrix products measure and, where they favour bf16, "
        "the model's own step (default fp32)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the vitkit model")
    parser.add_argument(
        "--train",
        action="store_true",
        help="time training steps (forward + backward + AdamW; a detector's with its set criterion)",
    )
    parser.add_argument(
        "--compare",
        choices=tuple(c for c in COMPARE if c is not None),
        default=None,
        help="also run another library's model: timm's of the same name for a classifier, or for a detector "
        f"({compared_detectors()}) the transformers class its exported weights load into (e.g. "
        "DeformableDetrForObjectDetection)",
    )
    parser.add_argument("--rounds", type=int, default=10, help="timed steps per candidate (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per candidate first (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_memory_option(parser)


def run(args: argparse.Namespace) -> int:
    auto = None
    if args.precision == AUTO:
        args.precision, why = auto_precision(args.device)
        if args.precision == "bf16" and torch.device(args.device).type == "cpu" and not args.compile:
            times = model_step_times(args.model, args.batch_size, args.img_size, args.train, args.device)
            step = "training step" if args.train else "forward"
            args.precision, why = times.choice(), f"{why}; {times.describe(step)}"
        auto = (args.precision, why)
        print(f"precision {args.precision} (auto: {why})", file=sys.stderr)
    slow = slow_precision(args.precision, args.device, cli_option)
    if slow is not None:
        print(f"warning: {slow}", file=sys.stderr)
    report = bench(
        args.model,
        batch=args.batch_size,
        img_size=args.img_size,
        precision=args.precision,
        compile=args.compile,
        train=args.train,
        compare=args.compare,
        rounds=args.rounds,
        warmup=args.warmup,
        device=args.device,
        optimizer=create_optimizer,
        allow_memory=args.ignore_memory_check,
        memory_names=memory_flags(batch="--batch-size", grad_checkpointing=None, strategy=None),
    )
    if auto is None:  # the products' rates (cached per machine); where they favour bf16, the model's step decides
        auto = auto_precision(args.device)
        if auto[0] == "bf16" and torch.device(args.device).type == "cpu":
            why = f"the products favour bf16, {auto[1]}; the model's own step decides: --precision auto times it"
            auto = ("bf16 or fp32", why)
    if args.json:
        print(json.dumps({**report.to_dict(), "auto_precision": {"precision": auto[0], "why": auto[1]}}, indent=2))
    else:
        print_report(report, auto)
        if args.precision == "bf16" and torch.device(args.device).type == "cpu":
            print(f"bf16 attention (auto) takes {cpu_bf16_attention().describe()}, as measured on this CPU")
    return 0


def print_report(report: Report, auto: tuple[str, str] | None = None) -> None:
    """The report as a table; `auto`: what --precision auto takes on the device, and why."""
    H, W = report.img_size
    rates = ", ".join(f"{p} {r / 1e12:.2f} TFLOP/s" for p, r in report.gemm_flops_per_second.items())
    print(
        f"{report.model}  {report.mode}  batch {report.batch}  {H}x{W}  {report.device} "
        f"({counted(report.threads, 'thread')})"
        f"  {report.flops_per_step / report.batch / 1e9:.2f} matmul GFLOPs per image"
    )
    print(f"measured GEMM rate: {rates}" + (f" ({report.processor})" if report.processor else ""))
    if auto is not None:
        print(f"precision auto takes {auto[0]} ({auto[1]})")
    baseline = next((r for r in report.results if r.name.split()[0] != "vitkit" and r.precision == "fp32"), None)
    reference = baseline.name.split()[0] if baseline else ""
    width = max(len(r.name) for r in report.results)
    header = f"{'candidate':<{width}}  {'img/s':>8}  {'ms/step':>9}  {'peak MiB':>9}  {'MFU':>6}"
    print("\n" + header + (f"  vs {reference} fp32" if baseline else ""))
    for r in report.results:
        line = (
            f"{r.name:<{width}}  {r.images_per_second:>8.2f}  {r.latency_ms:>9.1f}  "
            f"{r.peak_memory_bytes / 2**20:>9.1f}  {100 * r.mfu:>5.1f}%"
        )
        if baseline:
            line += f"  {r.images_per_second / baseline.images_per_second:>11.2f}x"
        print(line)
    if any(r.time_split for r in report.results):
        names = list(report.results[0].time_split)
        print(
            f"\nwhere a step's time goes (one profiled step, share of CPU time)\n{'candidate':<{width}}  "
            + "  ".join(names)
        )
        for r in report.results:
            cells = "  ".join(f"{100 * r.time_split.get(n, 0):>{len(n) - 1}.1f}%" for n in names)
            print(f"{r.name:<{width}}  {cells}")
