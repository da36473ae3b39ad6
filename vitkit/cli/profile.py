"""`vitkit profile MODEL`: analytic FLOPs, parameters, activation memory and shape flow of a registered model; with
--train --strategy/--world, the memory each process of a training run needs."""

from __future__ import annotations

import argparse
import json

from vitkit.analysis.estimate import STRATEGIES, MemoryEstimate, estimate_memory
from vitkit.analysis.precision import PRECISIONS
from vitkit.analysis.preflight import check_memory
from vitkit.analysis.profile import Report, profile
from vitkit.analysis.report import check_scalable, crossover, grouped, scaling, shape_flow, shares
from vitkit.cli.options import add_memory_option, add_renamed_option, memory_flags, parse_size
from vitkit.layers import BACKENDS
from vitkit.models.registry import backend_overrides
from vitkit.viz import plot_scaling
from vitkit.viz.attention import check_picture_path

HELP = "cost of a model: FLOPs per operator (attention included), parameters, activation memory, shape flow"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="registered model name (see `vitkit models`)")
    parser.add_argument("--img-size", type=parse_size, default=None, help="224 or HxW (default: the model's size)")
    add_renamed_option(parser, "--batch-size", "--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="attention backend to assume (default auto; gather and levelwise name deformable attention's)",
    )
    add_renamed_option(
        parser,
        "--precision",
        "--dtype",
        choices=tuple(PRECISIONS),
        default="fp32",
        help="activation dtype to assume (default fp32)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device to assume (default cpu)")
    parser.add_argument("--by", choices=("block", "op", "layer"), default="block", help="group rows (default block)")
    parser.add_argument("--train", action="store_true", help="also show forward+backward FLOPs and saved activations")
    parser.add_argument("--measure", action="store_true", help="run one forward pass and report the measured FLOPs")
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=None,
        help="with --train: also estimate the training memory of each process under ddp or fsdp (default: not shown)",
    )
    parser.add_argument(
        "--world",
        type=int,
        default=None,
        metavar="N",
        help="with --train: processes of the run, which fsdp shards over (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--plot", metavar="PNG", help="draw cost and activation memory against image size")
    add_memory_option(parser)


def run(args: argparse.Namespace) -> int:
    overrides = backend_overrides(args.model, args.backend)
    dtype = PRECISIONS[args.precision]
    memory = None
    if args.strategy is not None or args.world is not None:
        if not args.train:
            raise ValueError("--strategy and --world estimate a training run's memory: add --train")
        memory = estimate_memory(
            args.model,
            args.img_size,
            args.batch_size,
            training=True,
            precision=args.precision,
            device=args.device,
            overrides=overrides,
            strategy=args.strategy or "ddp",
            world=1 if args.world is None else args.world,
        )
    if args.measure:  # the forward pass runs for real: refuse it if it would not fit
        check_memory(
            args.model,
            args.img_size,
            args.batch_size,
            training=False,
            precision=args.precision,
            device=args.device,
            allow=args.ignore_memory_check,
            names=memory_flags(batch="--batch-size", grad_checkpointing=None),
            overrides=overrides,
        )
    if args.plot:  # before any work: a model of one size has no sweep, a name no picture can take
        check_scalable(args.model)
        check_picture_path(args.plot, figure=True)
    report = profile(args.model, args.img_size, args.batch_size, args.measure, dtype, args.device, overrides)
    if args.json:
        data = report.to_dict()
        if memory is not None:
            data["training_memory"] = training_memory(memory)
        print(json.dumps(data, indent=2))
    else:
        print_report(report, args.by, args.train)
        if memory is not None:
            print_training_memory(memory)
    if args.plot:
        sides = list(range(64, 2048 + 1, 64))
        points = scaling(args.model, sides, args.batch_size, dtype, args.device)
        plot_scaling(points, args.plot, args.model)
        cross = crossover(points)
        where = f"from {cross.side}px ({cross.tokens} tokens)" if cross else f"not below {sides[-1]}px"
        if not args.json:
            print(f"\nscaling plot written to {args.plot}; attention's N^2 terms dominate {where}")
    return 0


def print_report(report: Report, by: str, train: bool) -> None:
    H, W = report.img_size
    print(
        f"{report.model}  input {report.batch}x{H}x{W}  {report.dtype} on {report.device}  "
        f"attention backend {report.backend}  params {report.params:,}"
    )
    rows = grouped(report, by)
    width = max(12, *(len(r.name) for r in rows))
    extra = f"  {'train GFLOPs':>12}" if train else ""
    print(f"\n{by:<{width}}  {'GMACs':>9}  {'GFLOPs':>9}  {'% FLOPs':>7}{extra}  {'out MiB':>8}")
    for r in rows:
        extra = f"  {r.train_flops / 1e9:>12.3f}" if train else ""
        print(
            f"{r.name:<{width}}  {r.macs / 1e9:>9.3f}  {r.flops / 1e9:>9.3f}  {100 * r.flops / report.flops:>6.1f}%"
            f"{extra}  {r.out_bytes / 2**20:>8.2f}"
        )
    extra = f"  {report.train_flops / 1e9:>12.3f}" if train else ""
    print(f"{'total':<{width}}  {report.macs / 1e9:>9.3f}  {report.flops / 1e9:>9.3f}  {100.0:>6.1f}%{extra}")
    print(
        f"\nmatmul GFLOPs {report.matmul_flops / 1e9:.3f} (= 2 x GMACs) + other GFLOPs {report.other_flops / 1e9:.3f}"
    )
    print("split: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares(report).items()))
    print(f"peak activation memory (inference): {report.activation_bytes / 2**20:.2f} MiB")
    if train:
        print(f"activations kept for backward (training): {report.train_activation_bytes / 2**20:.2f} MiB")
    if report.measured_matmul_flops is not None:
        diff = report.matmul_flops - report.measured_matmul_flops
        print(f"measured matmul GFLOPs {report.measured_matmul_flops / 1e9:.3f} (analytic - measured: {diff:,} FLOPs)")
        print(f"measured peak activation memory: {report.measured_activation_bytes / 2**20:.2f} MiB")
    flow = shape_flow(report)
    if flow:
        print("\nshape flow of one block (B batch, N tokens, C channels, h heads, d = C/h):")
        print("\n".join(f"  {line}" for line in flow))


def training_memory(e: MemoryEstimate) -> dict[str, int | str]:
    """The per-process parts of a training estimate, in bytes: the gradients, gathered units and activations as
    they stand at the step's peak (the activations with the backward's working tensors and autocast's weight
    copies)."""
    return {
        "strategy": e.strategy,
        "world": e.world,
        "weights_bytes": e.weights_bytes,
        "gradient_bytes": e.gradient_bytes,
        "optimizer_bytes": e.optimizer_bytes,
        "activation_bytes": e.step_bytes - e.gradient_bytes - e.gathered_bytes,
        "gathered_bytes": e.gathered_bytes,
        "input_bytes": e.input_bytes,
        "total_bytes": e.total_bytes,
    }


def print_training_memory(e: MemoryEstimate) -> None:
    """The per-process parts of a training estimate, one row each (`training_memory`)."""
    H, W = e.img_size
    processes = f"{e.world} process" + ("es" if e.world > 1 else "")
    print(f"\ntraining memory per process ({e.strategy} over {processes}, batch {e.batch}, {H}x{W}, {e.precision}):")
    parts = training_memory(e)
    rows = [
        ("weight shards" if e.sharded else "weights", "weights_bytes"),
        ("gradients at the step's peak", "gradient_bytes"),
        ("AdamW state shards" if e.sharded else "AdamW state", "optimizer_bytes"),
        ("activations and backward work", "activation_bytes"),
        *([("gathered units", "gathered_bytes")] if e.sharded else []),
        ("input", "input_bytes"),
        ("total", "total_bytes"),
    ]
    for label, key in rows:
        print(f"  {label:<32}{parts[key] / 2**20:>12,.1f} MiB")
