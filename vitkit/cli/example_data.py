"""`vitkit example-data NAME --out DIR`: write an example detection dataset as a COCO-format folder (see
`vitkit.data.write_example_data`), say what it holds and how to train on it."""

from __future__ import annotations

import argparse
import shlex

from vitkit.cli.options import add_out_option, out_path
from vitkit.data import EXAMPLE_DATA, detection_stats, load_coco_folder, write_example_data
from vitkit.data.shapes import EXAMPLE_SIZES

HELP = (
    "write an example detection dataset as a COCO-format folder: shapes (photo-like images of circles, triangles, "
    "squares and crosses), shapes-large (the same, many and small, on images of 2 megapixels: for training in tiles) "
    "or digits-detect (MNIST digits on canvases)"
)


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", choices=EXAMPLE_DATA, help=f"one of: {', '.join(EXAMPLE_DATA)}")
    add_out_option(parser, "DIR", "the folder to write; new or empty unless --force")
    sizes = {split: ", ".join(f"{name} {n[i]}" for name, n in EXAMPLE_SIZES.items()) for i, split in enumerate("tv")}
    parser.add_argument("--train", type=int, metavar="N", help=f"training images (default: {sizes['t']})")
    parser.add_argument("--val", type=int, metavar="N", help=f"validation images (default: {sizes['v']})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the images; the same seed writes the same files")
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into DIR even if it holds files (files of the same names are replaced, others kept)",
    )


def run(args: argparse.Namespace) -> int:
    root = write_example_data(
        args.name, out_path(args), train=args.train, val=args.val, seed=args.seed, force=args.force
    )
    train, val, _ = load_coco_folder(root, short_side=None, max_size=None)
    print(f"wrote {args.name} to {root}")
    for split, data in (("train", train), ("val", val)):
        lines = detection_stats(data).summary().splitlines()
        print(f"{split}: {lines[0]}", *(f"  {line}" for line in lines[1:]), sep="\n")
    print(f"next: vitkit train --data {shlex.quote(str(root))}")
    return 0
