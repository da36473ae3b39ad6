"""Large images of small objects: the default detector trained in tiles (the recipe's choice for such data) against
the same detector trained on the whole images resized (`--tile 0`), at the recipe's equal pixel budget; then
predict's throughput on the large images.

The data is `vitkit example-data shapes-large` (24 training and 6 validation images of 1.4 to 2.4 megapixels, 120 to
240 objects of 10 to 40 px each). Both runs train one after the other, alone on the machine, each as the recipe
sizes it: in tiles, 384-px tiles at full resolution; whole, the images resized to a shorter side of 800 px. AP is
COCO's on the 6 validation images, whole, as each run validates (the tiled run in tiles, merged); minutes are the
epochs' own seconds (metrics.jsonl). Predict times `vitkit predict` of the tiled model on the validation images.

    python benchmarks/tiles.py --work /tmp/tiles

The figures behind BENCHMARKS.md's "Large images in tiles".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def vitkit(*args: str) -> float:
    """Run a vitkit command; its wall-clock seconds."""
    command = [sys.executable, "-m", "vitkit", *args]
    print("$", " ".join(command[2:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def summary(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((run / "config.json").read_text())
    best = max(rows, key=lambda r: r["ap"] or 0)
    return {
        "tile": config.get("tile"),
        "img_size": config["img_size"],
        "epochs": len(rows),
        "minutes": sum(r["seconds"] for r in rows) / 60,
        "ap": best["ap"],
        "ap50": best["ap50"],
        "ap_small": best["ap_small"],
        "best_epoch": best["epoch"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="a folder for the data, the runs and the results")
    args = parser.parse_args()
    data = args.work / "shapes-large"
    if not data.is_dir():
        vitkit("example-data", "shapes-large", "--out", str(data))
    results = {}
    for name, extra in (("tiles", []), ("whole", ["--tile", "0"])):
        run = args.work / name
        if not (run / "final").is_dir():
            vitkit("train", "--data", str(data), "--out", str(run), "--force", *extra)
        results[name] = summary(run)
    images = sorted((data / "val").glob("*.png"))
    seconds = vitkit("predict", "--model-dir", str(args.work / "tiles" / "best"), *map(str, images),
                     "--out", str(args.work / "found"))  # fmt: skip
    found = json.loads((args.work / "found" / "detections.json").read_text())
    pixels = sum(item["height"] * item["width"] for item in found)
    results["predict"] = {"images": len(found), "seconds": seconds, "megapixels": pixels / 1e6}
    print(json.dumps(results, indent=2))
    (args.work / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
