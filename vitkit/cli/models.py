"""`vitkit models [PATTERN]`: list the registered variants with their parameter counts."""

from __future__ import annotations

import argparse

import torch

from vitkit.models.registry import create_model, list_models, model_entry

HELP = "list registered models (shell-style PATTERN, e.g. 'vit_*') with parameter counts"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style name pattern (default: all)")


def run(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no model matches {args.pattern!r}; run 'vitkit models' for the full list")
    width = max(len(n) for n in names)
    print(f"{'model':<{width}}  {'params':>12}  {'img_size':>9}")
    for name in names:
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model = create_model(name)
        params = sum(p.numel() for p in model.parameters())
        size = model_entry(name).config.img_size
        size = f"{size}" if isinstance(size, int) else f"{size[0]}x{size[1]}"
        print(f"{name:<{width}}  {params:>12,}  {size:>9}")
    return 0
