"""`vitkit check-data DIR`: a detection folder as the model will see it, with a warning and its fix for each pattern
behind "mAP stays at 0" (`vitkit.data.check`); `--plot` draws sample images with their boxes (and masks),
`--augmented` as training's augmentation shows them."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.ops import box_convert

from vitkit.data import load_coco_folder
from vitkit.data.check import check_detection_folder
from vitkit.data.coco import COCO_AUGMENT, open_annotated
from vitkit.viz.attention import check_keeps_inputs, check_picture_path
from vitkit.viz.detection import draw_detections, labelled_grid

HELP = (
    "check a COCO-format detection folder before training: images, boxes and classes per split, rare classes, box "
    "sizes, images without boxes, files in both splits, with a warning and its fix for each problem"
)
SAMPLES = 12  # images a --plot grid shows
CROWD = "crowd: "  # before a crowd region's class name in a --plot


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DIR", help="a COCO-format folder, as vitkit train --data takes it")
    parser.add_argument(
        "--plot", metavar="PNG", default=None, help=f"draw {SAMPLES} training images with their boxes (and masks)"
    )
    parser.add_argument(
        "--augmented",
        action="store_true",
        help="--plot the images as training's augmentation gives them to the model (flips, crops, sizes)",
    )
    parser.add_argument("--json", action="store_true", help="print the check as JSON")


def _panels(root: str, augmented: bool, short_side: int, classes: tuple[str, ...]) -> list[tuple[str, Image.Image]]:
    """Evenly spaced training images with their boxes (and masks, a folder whose objects all have one): as stored,
    crowd regions drawn too and named "crowd: CLASS", or through a COCO folder's training augmentation (flip, crop,
    a shorter side jittered around `short_side`; crowd regions are not part of a training sample)."""
    if augmented:
        train, _, _ = load_coco_folder(root, augment=COCO_AUGMENT, short_side=short_side, max_size=None)
    else:
        train, _, _ = load_coco_folder(root, short_side=None)
    picks = np.linspace(0, len(train) - 1, min(SAMPLES, len(train))).round().astype(int).tolist()
    panels = []
    for index in dict.fromkeys(picks):
        sample = train.samples[index]
        if augmented:
            item = train[(index, 1000 + index)]
            if not isinstance(item, tuple):
                continue
            pixels, target = item
            mean, std = torch.tensor(train.mean)[:, None, None], torch.tensor(train.std)[:, None, None]
            array = ((pixels * std + mean).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
            image = Image.fromarray(array.squeeze(-1) if array.shape[-1] == 1 else array)
            h, w = target["size"].tolist()
            boxes = box_convert(target["boxes"], "cxcywh", "xyxy") * torch.tensor([w, h, w, h])
            names = [classes[k] for k in target["labels"].tolist()]
            masks = list(target["masks"].bool().numpy()) if "masks" in target else None
        else:
            try:
                image = open_annotated(sample.path, *sample.size).convert("RGB")
            except OSError:
                continue
            # crowd regions (iscrowd 1) too, named apart: evaluation ignores detections on them, training skips them
            boxes = torch.cat([torch.as_tensor(sample.boxes), torch.as_tensor(sample.crowd_boxes)]).reshape(-1, 4)
            names = [classes[k] for k in sample.labels.tolist()]
            names += [CROWD + classes[k] for k in sample.crowd_labels.tolist()]
            masks = None
            if train.with_masks:
                masks = [*sample.decoded_masks().astype(bool), *sample.decoded_crowd_masks().astype(bool)]
        palette = [*classes, *(CROWD + name for name in classes)]  # a crowd region's colour differs from its class's
        picture = draw_detections(image, boxes.tolist(), names, None, palette, "no boxes", masks)
        panels.append((Path(sample.path).name, picture))
    return panels


def run(args: argparse.Namespace) -> int:
    if args.augmented and not args.plot:
        raise ValueError("--augmented changes what --plot draws: give --plot PNG")
    if args.plot:
        check_picture_path(args.plot)
        check_keeps_inputs(args.plot, [args.data], "--plot")
    check = check_detection_folder(args.data)
    if args.json:
        print(json.dumps(asdict(check), indent=2, default=str))
    else:
        print(check.report())
    if args.plot:
        what = "as training's augmentation gives them" if args.augmented else "as stored"
        short_side = round(check.splits[0].stats.short_side_median)
        panels = _panels(args.data, args.augmented, short_side, check.classes)
        grid = labelled_grid(panels, title=f"{args.data}: train, {what}")
        plot = Path(args.plot)
        plot.parent.mkdir(parents=True, exist_ok=True)
        grid.save(plot)
        print(f"sample images written to {plot}")
    return 0
