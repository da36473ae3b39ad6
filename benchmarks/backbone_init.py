"""A ViT detector on the shapes folder, its backbone from scratch or pre-trained by vitkit itself, beside the default
ResNet detector: AP at 5 and 10 minutes on this machine.

The backbone's pre-training is a classifier on crops of other shapes images (`vitkit example-data shapes --seed`,
never the detector's folder): each box cut square at 1.25x its longer side, and as many crops of background (no
box inside) as a fifth class, 64 px; `vitkit train` trains `vit_tiny_patch16_224` on them (random crops keep at least
80% of a crop's area, so the shape stays in view). The detectors then train one after another, each alone on the
machine, on `vitkit example-data shapes` (its default seed): `deformable_detr_vit_tiny` from scratch, the same with
`--init` the classifier's best directory, and `deformable_detr_small` (the default detector, a half-width ResNet). AP
is COCO's on the folder's val/ after each epoch; minutes count the epochs' own seconds (metrics.jsonl) from the start
of training.

    python benchmarks/backbone_init.py --work /tmp/backbone_init
    python benchmarks/backbone_init.py --work /tmp/backbone_init --epochs 16 --pretrain-epochs 12

The figures behind BENCHMARKS.md's "A pre-trained ViT backbone against one from scratch".
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from PIL import Image

CLASSIFIER = "vit_tiny_patch16_224"
CROP = 64


def vitkit(*args: str) -> None:
    command = [sys.executable, "-m", "vitkit", *args]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)


def overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def write_crops(folder: Path, split: str, out: Path, rng: random.Random) -> int:
    """Square crops of every box of `folder`'s `split`, and as many of background, as class folders under out/split."""
    coco = json.loads((folder / "annotations" / f"instances_{split}.json").read_text())
    names = {c["id"]: c["name"] for c in coco["categories"]}
    boxes: dict[int, list[tuple[float, ...]]] = {}
    for a in coco["annotations"]:
        boxes.setdefault(a["image_id"], []).append((*a["bbox"], a["category_id"]))
    count = 0
    for info in coco["images"]:
        image = Image.open(folder / split / info["file_name"]).convert("RGB")
        W, H = image.size
        own = boxes.get(info["id"], [])
        for x, y, w, h, category in own:
            side = 1.25 * max(w, h)
            cx, cy = x + w / 2, y + h / 2
            crop = image.crop((cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)).resize((CROP, CROP))
            target = out / split / names[category] / f"{info['id']}_{count}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            crop.save(target)
            count += 1
            for _ in range(20):  # a background crop of the same size, touching no box
                side_b = min(side, W - 1, H - 1)
                bx, by = rng.uniform(0, W - side_b), rng.uniform(0, H - side_b)
                if not any(overlaps((bx, by, side_b, side_b), b[:4]) for b in own):
                    crop = image.crop((bx, by, bx + side_b, by + side_b)).resize((CROP, CROP))
                    target = out / split / "background" / f"{info['id']}_{count}.png"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    crop.save(target)
                    break
    return count


def at_minutes(metrics: Path, minutes: float) -> tuple[float | None, float | None, int, float]:
    """(AP, AP50, epoch, minutes) of the last epoch that ended within `minutes`."""
    best: tuple[float | None, float | None, int, float] = (None, None, 0, 0.0)
    elapsed = 0.0
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        elapsed += row["seconds"] / 60
        if elapsed <= minutes:
            best = (row.get("ap"), row.get("ap50"), row["epoch"], elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="a folder for the data and the runs")
    parser.add_argument("--epochs", type=int, default=16, help="each detector's epochs (about ten minutes' worth)")
    parser.add_argument("--default-epochs", type=int, default=None, help="the default detector's (default: --epochs)")
    parser.add_argument("--pretrain-epochs", type=int, default=16)
    parser.add_argument("--pretrain-lr", type=float, default=1e-3)
    parser.add_argument("--pretrain-images", type=int, default=1500)
    parser.add_argument("--pretrain-only", action="store_true", help="stop after the classifier")
    args = parser.parse_args()
    work = args.work
    if not (work / "shapes").exists():
        vitkit("example-data", "shapes", "--out", str(work / "shapes"))
    if not (work / "pretrain").exists():
        vitkit("example-data", "shapes", "--out", str(work / "pretrain"), "--seed", "7",
               "--train", str(args.pretrain_images), "--val", "200")  # fmt: skip
    crops = work / "crops"
    if not crops.exists():
        rng = random.Random(0)
        n = {split: write_crops(work / "pretrain", split, crops, rng) for split in ("train", "val")}
        print(f"crops: {n}", flush=True)
    classifier = work / "classifier"
    if not (classifier / "best").exists():
        vitkit("train", "--model", CLASSIFIER, "--data", str(crops), "--img-size", str(CROP),
               "--epochs", str(args.pretrain_epochs), "--lr", str(args.pretrain_lr), "--min-scale", "0.8",
               "--out", str(classifier), "--force")  # fmt: skip
    if args.pretrain_only:
        return
    runs = {
        "deformable_detr_vit_tiny, from scratch": ("deformable_detr_vit_tiny", None, args.epochs),
        "deformable_detr_vit_tiny, backbone pre-trained on crops": (
            "deformable_detr_vit_tiny", classifier / "best", args.epochs,
        ),
        "deformable_detr_small (ResNet, the default)": (
            "deformable_detr_small", None, args.default_epochs or args.epochs,
        ),
    }  # fmt: skip
    results = {}
    for label, (model, init, epochs) in runs.items():
        out = work / model.replace("deformable_detr_", "") / ("init" if init else "scratch")
        if not (out / "final").exists():
            extra = ["--init", str(init)] if init else []
            vitkit("train", "--model", model, "--data", str(work / "shapes"), "--epochs", str(epochs),
                   "--out", str(out), "--force", *extra)  # fmt: skip
        results[label] = [at_minutes(out / "metrics.jsonl", m) for m in (5, 10)]
    print(f"\n{'run':56} {'AP@5min':>8} {'AP50':>6} {'ep':>3} {'AP@10min':>9} {'AP50':>6} {'ep':>3}")
    for label, rows in results.items():
        cells = [f"{r[0] or 0:8.3f} {r[1] or 0:6.3f} {r[2]:3d}" for r in rows]
        print(f"{label:56} {cells[0]} {cells[1]:>21}")


if __name__ == "__main__":
    main()
