"""Detection data by name, as `vitkit train --data` and `vitkit eval --data` give it: the bundled
`builtin:digits-detect` (`vitkit.data.digits_detect`) or a COCO-format folder (`vitkit.data.coco`), with the
augmentation each one's training split takes by default."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from vitkit.data.coco import COCO_AUGMENT, CocoDetection, load_coco_folder
from vitkit.data.detection import DetectionAugment, DetectionInfo
from vitkit.data.digits_detect import DIGITS_AUGMENT, DIGITS_DETECT, DigitsDetection, load_digits_detect
from vitkit.data.sources import BUILTIN_PREFIX
from vitkit.errors import OptionError


def detection_augment_defaults(source: str) -> DetectionAugment:
    """The default augmentation of a detection source's training split (`TrainConfig.data`)."""
    return DIGITS_AUGMENT if source.startswith(BUILTIN_PREFIX) else COCO_AUGMENT


def load_detection(
    source: str,
    seed: int = 0,
    channels: int = 3,
    img_size: int | None = None,
    val_only: bool = False,
    augment: DetectionAugment | None = None,
    **options: Any,
) -> tuple[DigitsDetection | CocoDetection | None, DigitsDetection | CocoDetection, DetectionInfo]:
    """(train, val, info) of ``"builtin:digits-detect"`` or a COCO-format folder (`load_coco_folder`).

    `img_size` is the canvas side for digits-detect and the shorter side (`short_side`) for COCO images; `seed`
    draws the digits-detect training canvases; `val_only` leaves a COCO folder's training annotations unread
    (train None); `augment` augments a COCO folder's training split (digits-detect takes none: its canvases are
    drawn afresh every epoch); `options` go to `CocoDetection`.
    """
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name != DIGITS_DETECT:
            raise ValueError(f"unknown builtin detection dataset {name!r}; the bundled one is {DIGITS_DETECT!r}")
        if augment:
            given = ", ".join(f"{k} {v:g}" for k, v in asdict(augment).items() if v)
            raise OptionError(
                lambda name: (
                    f"{source} draws fresh training canvases every epoch and is not augmented (a flipped "
                    f"digit is another glyph): leave out {name('hflip')}, {name('scale_jitter')} and {name('crop')} or "
                    f"set them to 0; got {given}"
                )
            )
        return load_digits_detect(seed, channels, img_size)
    if img_size is not None:
        options["short_side"] = img_size
    return load_coco_folder(source, val_only=val_only, channels=channels, augment=augment, **options)
