"""`vitkit models [PATTERN]`: list the registered variants with their parameter counts and GFLOPs; with
`--pretrained`, the weights published for them (`vitkit.list_pretrained`), each with its download size, licence,
what it was trained on and where it lives."""

from __future__ import annotations

import argparse

from vitkit.analysis.profile import profile
from vitkit.models.registry import closest_models, list_models, list_pretrained, model_entry, published_weights
from vitkit.weights.pretrained import download_mb

HELP = (
    "list registered models (shell-style PATTERN, e.g. 'vit_*') with parameters and GFLOPs at their size, or with "
    "--pretrained the weights published for them"
)


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style name pattern (default: all)")
    parser.add_argument(
        "--pretrained",
        action="store_true",
        help="list the published weights instead, as NAME.TAG (each model's default first), with their download "
        "size, licence, what they were trained on and where they live",
    )


def run(args: argparse.Namespace) -> int:
    if args.pretrained:
        return _list_pretrained(args.pattern)
    names = list_models(args.pattern)
    if not names:
        raise ValueError(_no_match(args.pattern, "vitkit models"))
    width = max(len(n) for n in names)
    print(f"{'model':<{width}}  {'params':>12}  {'img_size':>9}  {'GFLOPs':>8}")
    for name in names:
        report = profile(name)  # analytic, on the meta device: no memory, no forward pass
        H, W = report.img_size
        size = f"{H}" if H == W else f"{H}x{W}"
        print(f"{name:<{width}}  {report.params:>12,}  {size:>9}  {report.flops / 1e9:>8.2f}")
    return 0


def _list_pretrained(pattern: str) -> int:
    names = list_pretrained(pattern)
    without = [n for n in list_models(pattern) if not model_entry(n).pretrained]
    if not names and not without:
        raise ValueError(_no_match(pattern, "vitkit models --pretrained"))
    if names:
        width = max(len(n) for n in names)
        print(f"{'weights (model.tag)':<{width}}  {'MB':>7}  {'licence':<12}  trained on; source")
        for name in names:
            _, weights = published_weights(name)
            print(
                f"{name:<{width}}  {download_mb(name):>7.1f}  {weights.licence:<12}  {weights.data}; {weights.source}"
            )
        print("load: vitkit.create_model(NAME, pretrained=True | TAG); vitkit predict --model NAME[.TAG] --pretrained")
    if without:
        print("without published weights:")
        for name in without:
            print(f"  {name}: {model_entry(name).unpublished or 'none published'}")
    return 0


GLOB = "*?["  # the characters that make a shell-style pattern of a name


def _no_match(pattern: str, command: str) -> str:
    """Why `command PATTERN` lists nothing, with the registered names closest to the pattern and, for a name
    without wildcards, the pattern of every name that holds it."""
    close = closest_models(pattern)
    holding = f"*{pattern}*"
    wider = not any(c in pattern for c in GLOB) and len(list_models(holding)) > len(close)
    hint = f"; closest: {', '.join(close)}" if close else ""
    hint += f" (every name holding it: {command} '{holding}')" if wider else ""
    return f"no model matches {pattern!r}{hint}; run '{command}' for the full list"
