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


def vitkit(*args: str, metrics: Path | None = None, stop_after: int | None = None) -> None:
    """`vitkit ARGS`; with `stop_after`, ended once `metrics` holds that many epochs."""
    command = [sys.executable, "-m", "vitkit", *args]
    print("$", " ".join(command[2:]), flush=True)
    if stop_after is None:
        subprocess.run(command, check=True)
        return
    with subprocess.Popen(command) as run:
        while run.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= stop_after:
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
    parser.add_argument("--epochs", type=int, default=4, help="each detector's epochs")
    parser.add_argument("--stop-after", type=int, default=None, help="end each detector's run after this many epochs")
    parser.add_argument("--skip-default", action="store_true", help="leave out the default ResNet detector")
    args = parser.parse_args()
    work = args.work
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
        done = metrics.exists() and len(metrics.read_text().splitlines()) >= (args.stop_after or args.epochs)
        if not done:
            vitkit("train", "--model", model, "--data", "builtin:digits-detect", "--epochs", str(args.epochs),
                   "--out", str(out), "--force", *extra, metrics=metrics, stop_after=args.stop_after)  # fmt: skip
    print(f"\n{'run':46} {'epoch':>5} {'minutes':>7} {'AP':>6} {'AP50':>6}")
    for label, (_, _, out) in runs.items():
        for epoch, minutes, ap, ap50 in epochs_of(out / "metrics.jsonl"):
            print(f"{label:46} {epoch:5d} {minutes:7.2f} {ap:6.3f} {ap50:6.3f}")


if __name__ == "__main__":
    main()
