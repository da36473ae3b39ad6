"""The mask head on a microscope image: stardist's `img2d.tif` and its label image `mask2d.tif` (512x512, 16-bit,
125 nuclei; BSD-3), as a COCO folder of 256-px quarters (three to train, the fourth held out), each nucleus a
compressed-RLE segmentation; each quarter stretched from its 1st to 99.8th percentile to 8 bits, as `vitkit
check-data` advises for 16-bit files that would be nearly black; then the bare `vitkit train` on it.

    pip download --no-deps stardist -d /tmp/stardist      # the wheel holds the two images
    python benchmarks/microscope_masks.py --wheel /tmp/stardist/stardist-*.whl --work /tmp/nuclei

The figures behind BENCHMARKS.md's "A microscope image" in "Instance masks".
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

QUARTERS = {"train": [(0, 0), (0, 256), (256, 0)], "val": [(256, 256)]}  # (row, column) of each 256-px quarter


def stretched(pixels: np.ndarray) -> np.ndarray:
    """The 1st to 99.8th percentile to 0..255, as 8 bits."""
    low, high = np.percentile(pixels, (1, 99.8))
    return np.rint(np.clip((pixels - low) / (high - low), 0, 1) * 255).astype(np.uint8)


def write_folder(wheel: Path, root: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        image, labels = (
            np.asarray(Image.open(io.BytesIO(archive.read(f"stardist/data/images/{name}.tif"))))
            for name in ("img2d", "mask2d")
        )
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for split, corners in QUARTERS.items():
        (root / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for i, (y, x) in enumerate(corners):
            name = f"{split}_{i}.png"
            Image.fromarray(stretched(image[y : y + 256, x : x + 256].astype(np.float64))).save(root / split / name)
            images.append({"id": i + 1, "file_name": name, "height": 256, "width": 256})
            part = labels[y : y + 256, x : x + 256]
            for k in np.unique(part)[1:]:  # 0 is the background
                rle = mask_utils.encode(np.asfortranarray((part == k).astype(np.uint8)))
                annotations.append({
                    "id": len(annotations) + 1, "image_id": i + 1, "category_id": 1, "iscrowd": 0,
                    "bbox": mask_utils.toBbox(rle).tolist(), "area": float(mask_utils.area(rle)),
                    "segmentation": {"size": rle["size"], "counts": rle["counts"].decode("ascii")},
                })  # fmt: skip
        listing = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "nucleus"}]}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(listing))
        print(f"{split}: {len(images)} images, {len(annotations)} nuclei", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="stardist's wheel (pip download --no-deps stardist)")
    parser.add_argument("--work", type=Path, required=True, help="a folder for the data and the run")
    args = parser.parse_args()
    data = args.work / "nuclei"
    if not (data / "annotations" / "instances_val.json").exists():
        write_folder(args.wheel, data)
    command = [sys.executable, "-m", "vitkit", "train", "--data", str(data), "--out", str(args.work / "run"), "--force"]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
