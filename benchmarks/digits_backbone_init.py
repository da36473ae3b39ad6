"""A ViT detector on the digit canvases, its backbone from scratch or from the classifier the bare `vitkit train`
trains on the bundled digits, beside the default ResNet detector: AP after each epoch and at fixed minutes.

The backbone is `vit_digits_patch7_28` (4 blocks of width 128, 7x7 patches: the demo's classifier). Its pre-training
is the bare `vitkit train` (mnist5k's 28x28 digits, the demo's recipe); the detectors then train on
`builtin:digits-detect` (96-px canvases of 1-4 digits of 20-40 px, drawn afresh every epoch), one after another, each
alone on the machine: `deformable_detr_vit_tiny`'s detector on that ViT through its simple feature pyramid (2x, 1x
and 1/2x the 7-px patch grid: strides 3.5, 7 and 14; `--model-arg backbone=vit_digits_patch7_28`), from scratch
and with `--init` the classifier's best directory, and `deformable_detr_small` (the default). AP is COCO's on the
500 fixed validation canvases after each epoch; minutes add up the epochs' own seconds (metrics.jsonl).

    python benchmarks/digits_backbone_init.py --work /tmp/digits_init --epochs 4 --stop-after 2 --skip-default

`--stop-after N` ends each detector's run after N of its epochs (the same schedule for every run, cut where the
time allows: an epoch of 4,000 canvases takes 5-6 minutes on 2 cores).

Scarce data, where a pre-trained backbone should pay: `--train-images N` writes `vitkit example-data digits-detect
--train N` (N fixed canvases and 100 for validation) into the work folder and trains every detector on that folder
with the folder's augmentation but no flips (`--hflip 0`: a flipped digit is another glyph), sized by its recipe
unless `--epochs` is given; `--minutes M` ends each run once its epochs' own seconds pass M minutes.

    python benchmarks/digits_backbone_init.py --work /tmp/digits_scarce --train-images 300 --epochs 16 --minutes 10.5

The figures behind BENCHMARKS.md's "A pre-trained ViT backbone against one from scratch".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BACKBONE = ["--model-arg", "backbone=vit_digits_patch7_28"]


def vitkit(
    *args: str, metrics: Path | None = None, stop_after: int | None = None, minutes: float | None = None
) -> None:
    """`vitkit ARGS`; ended once `metrics` holds `stop_after` epochs or epochs of `minutes` in all, when given."""
    command = [sys.executable, "-m", "vitkit", *args]
    print("$", " ".join(command[2:]), flush=True)
    if stop_after is None and minutes is None:
        subprocess.run(command, check=True)
        return
    with subprocess.Popen(command) as run:
        while run.poll() is None:
            rows = epochs_of(metrics) if metrics.exists() else []
            if (stop_after and len(rows) >= stop_after) or (minutes and rows and rows[-1][1] >= minutes):
                run.terminate()
                break
            time.sleep(2)


def epochs_of(metrics: Path) -> list[tuple[int, float, float, float]]:
    """(epoch, minutes so far, AP, AP50) after each epoch."""
    rows, elapsed = [], 0.0
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        elapsed += row["seconds"] / 60
        rows.append((row["epoch"], elapsed, row.get("ap") or 0.0, row.get("ap50") or 0.0))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="a folder for the runs")
    parser.add_argument("--epochs", type=int, default=None, help="each detector's epochs (default: 4 on the canvases "
                        "drawn afresh, the recipe's on --train-images)")
    parser.add_argument("--train-images", type=int, default=None, help="train on a folder of this many fixed canvases")
    parser.add_argument("--minutes", type=float, default=None, help="end each detector's run after this many minutes")
    parser.add_argument("--stop-after", type=int, default=None, help="end each detector's run after this many epochs")
    parser.add_argument("--skip-default", action="store_true", help="leave out the default ResNet detector")
    args = parser.parse_args()
    work = args.work
    data, run_args = "builtin:digits-detect", ["--epochs", str(args.epochs or 4)]
    if args.train_images:
        data = str(work / f"digits-detect-{args.train_images}")
        if not Path(data, "train").exists():
            vitkit("example-data", "digits-detect", "--out", data, "--train", str(args.train_images), "--force")
        run_args = ["--epochs", str(args.epochs)] if args.epochs else []
        run_args += ["--hflip", "0"]  # a flipped digit is another glyph (the builtin canvases are never flipped)
    classifier = work / "classifier"
    if not (classifier / "best").exists():
        vitkit("train", "--out", str(classifier), "--force")  # the bare command: the demo's digit classifier
    runs = {
        "ViT digits backbone, from scratch": ("deformable_detr_vit_tiny", BACKBONE, work / "vit_scratch"),
        "ViT digits backbone, from the classifier": (
            "deformable_detr_vit_tiny", [*BACKBONE, "--init", str(classifier / "best")], work / "vit_init",
        ),
    }  # fmt: skip
    if not args.skip_default:
        runs["deformable_detr_small (ResNet, the default)"] = ("deformable_detr_small", [], work / "resnet")
    for model, extra, out in runs.values():
        metrics = out / "metrics.jsonl"
        rows = epochs_of(metrics) if metrics.exists() else []
        done = (out / "final").exists() or rows and (
            (args.stop_after and len(rows) >= args.stop_after) or (args.minutes and rows[-1][1] >= args.minutes)
        )
        if not done:
            vitkit("train", "--model", model, "--data", data, *run_args, "--out", str(out), "--force", *extra,
                   metrics=metrics, stop_after=args.stop_after, minutes=args.minutes)  # fmt: skip
    print(f"\n{'run':46} {'epoch':>5} {'minutes':>7} {'AP':>6} {'AP50':>6}")
    for label, (_, _, out) in runs.items():
        for epoch, minutes, ap, ap50 in epochs_of(out / "metrics.jsonl"):
            print(f"{label:46} {epoch:5d} {minutes:7.2f} {ap:6.3f} {ap50:6.3f}")


if __name__ == "__main__":
    main()
