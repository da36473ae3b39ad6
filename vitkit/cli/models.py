"""`vitkit models [PATTERN]`: list the registered variants with their parameter counts and GFLOPs."""

from __future__ import annotations

import argparse

from vitkit.analysis.profile import profile
from vitkit.models.registry import list_models

HELP = "list registered models (shell-style PATTERN, e.g. 'vit_*') with parameters and GFLOPs at their size"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style name pattern (default: all)")


def run(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no model matches {args.pattern!r}; run 'vitkit models' for the full list")
    width = max(len(n) for n in names)
    print(f"{'model':<{width}}  {'params':>12}  {'img_size':>9}  {'GFLOPs':>8}")
    for name in names:
        report = profile(name)  # analytic, on the meta device: no memory, no forward pass
        H, W = report.img_size
        size = f"{H}" if H == W else f"{H}x{W}"
        print(f"{name:<{width}}  {report.params:>12,}  {size:>9}  {report.flops / 1e9:>8.2f}")
    return 0
