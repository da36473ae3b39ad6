"""COCO-format detection datasets: an instances JSON and its images (`CocoDetection`), read from a folder in one of
the layouts annotation tools write (`load_coco_folder`). Every entry is checked: one that cannot be used is skipped
and reported with its id and why (`CocoReport`, `Skipped`, SKIP_REASONS), and a split that keeps no box is refused
with what its file holds. Samples and targets are as `vitkit.data.detection` describes them.

Images are resized so the shorter side is `short_side` and the longer at most `max_size` (DETR's evaluation
transform, 800 and 1333 by default); a training split may also be augmented as DETR trains (`DetectionAugment`:
flips, random crops and multi-scale resizing, `vitkit.data.transforms.detection_train_transform`), each sample under
its own seed.

Letters: C channels, H, W image size, n objects of an image.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.ops import box_convert
from torchvision.transforms.v2 import functional as F_v2

from vitkit.data.detection import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DetectionAugment,
    DetectionInfo,
    detection_target,
    resized,
    sample_index,
)
from vitkit.data.loader import Unreadable
from vitkit.data.sources import UnreadableImageError, open_image
from vitkit.data.transforms import channel_stats, detection_train_transform, image_mode
from vitkit.util import counted, listed

COCO_AUGMENT = DetectionAugment(hflip=0.5, scale_jitter=0.25, crop=0.5)  # a COCO folder's training split

SKIP_REASONS = (
    "bad image entry",  # no integer id or file name, a width or height that is not a positive integer, a repeated id
    "missing file",  # the image file does not exist
    "unreadable file",  # the image file cannot be decoded (found at load with check_images, else when read)
    "bad annotation entry",  # no image_id, category_id or 4-number bbox, or non-finite numbers
    "unknown image",  # image_id names no image of the file
    "unknown category",  # category_id names no category of the file
    "empty box",  # zero or negative width or height
    "outside image",  # no part of the box lies inside the image
    "bad segmentation",  # neither polygons of 3 or more (x, y) points nor RLE of the image's size
    "mask outside image",  # every point of its polygons lies outside the image
    "empty mask",  # its segmentation covers no pixel
)


CLIPPED_SHOWN = 10  # ids of clipped annotations a report lists before "... N more"


@dataclass(frozen=True)
class Skipped:
    """An image or annotation of a COCO file left out, and why."""

    kind: str  # "image" or "annotation"
    id: Any  # its id in the file (the list position as "#i" when it has none)
    reason: str  # one of SKIP_REASONS
    detail: str = ""  # what was found


@dataclass
class CocoReport:
    """What loading a COCO file kept and left out."""

    path: str  # the instances JSON
    images: int = 0  # images kept
    annotations: int = 0  # annotations kept
    listed_images: int = 0  # image entries the file lists, kept or not
    listed_annotations: int = 0  # annotation entries the file lists, kept or not
    skipped: list[Skipped] = field(default_factory=list)  # images and annotations left out
    clipped: list[Any] = field(default_factory=list)  # ids of annotations whose box was clipped to the image
    crowd: int = 0  # crowd regions (iscrowd 1): out of training, as DETR's; evaluation ignores detections on them
    crowd_as_objects: int = 0  # crowd annotations read as objects: every annotation of the file is marked crowd
    sized_from_files: int = 0  # images whose entry gives no width and height: read from the file's header
    masks: int = 0  # kept annotations with a segmentation (polygons or RLE)

    def counts(self) -> dict[str, int]:
        """Number of skipped entries per reason."""
        return dict(Counter(s.reason for s in self.skipped))

    def __str__(self) -> str:
        lines = [f"{self.path}: {counted(self.images, 'image')}, {counted(self.annotations, 'annotation')}"]
        lines += [f"  skipped {n} ({reason})" for reason, n in self.counts().items()]
        if self.clipped:
            shown = ", ".join(str(i) for i in self.clipped[:CLIPPED_SHOWN])
            more = f", ... {len(self.clipped) - CLIPPED_SHOWN} more" if len(self.clipped) > CLIPPED_SHOWN else ""
            if len(self.clipped) == 1:
                lines.append(f"  clipped 1 box to its image: annotation {shown}")
            else:
                lines.append(f"  clipped {len(self.clipped)} boxes to their images: annotations {shown}{more}")
        if self.crowd:
            lines.append(f"  {crowd_words(self.crowd)}")
        if self.crowd_as_objects:
            lines.append(f"  {crowd_objects_words(self.crowd_as_objects)}")
        if 0 < self.masks < self.annotations:
            lines.append(
                f"  masks not used: {self.annotations - self.masks} of {counted(self.annotations, 'annotation')} "
                "have no segmentation"
            )
        if self.sized_from_files:
            sized = counted(self.sized_from_files, "image")
            lines.append(f"  read the size of {sized} from the file (the JSON gives none)")
        lines += [f"  {s.kind} {s.id}: {s.reason}" + (f" ({s.detail})" if s.detail else "") for s in self.skipped]
        return "\n".join(lines)


def crowd_words(n: int) -> str:
    """What becomes of `n` crowd annotations (iscrowd 1) of a file, in words."""
    return (
        f"{counted(n, 'crowd annotation')} (iscrowd 1) kept as regions, not objects: training leaves them out, "
        "evaluation ignores the detections that cover them, as COCO's does (set iscrowd 0 to have one learnt)"
    )


def crowd_objects_words(n: int) -> str:
    """Why `n` crowd annotations were read as objects, in words."""
    return (
        f"read {counted(n, 'crowd annotation')} as objects: every annotation of the file is marked iscrowd 1, as "
        "CVAT's COCO export marks its mask annotations (a file of crowd regions alone has no object to learn)"
    )


@dataclass(frozen=True)
class CocoImage:
    image_id: int
    path: Path
    size: tuple[int, int]  # (height, width) the file says
    boxes: np.ndarray  # (n, 4) float32 (x0, y0, x1, y1) pixels, clipped to the image
    labels: np.ndarray  # (n,) int64 class indices
    areas: np.ndarray  # (n,) float32 object areas in pixels
    masks: tuple[dict | None, ...] = ()  # per object its segmentation as pycocotools' compressed RLE (None: none)
    # crowd regions (iscrowd 1), left out of the objects: boxes (c, 4) float32 (x0, y0, x1, y1) pixels, their class
    # indices (c,), and when the objects have masks, each region's (its box's where it has no segmentation)
    crowd_boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.float32))
    crowd_labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    crowd_masks: tuple[dict, ...] = ()

    def decoded_masks(self) -> np.ndarray:
        """The objects' masks at the stored size: (n, H, W) uint8, 1 inside."""
        height, width = self.size
        if not self.masks:
            return np.zeros((0, height, width), dtype=np.uint8)
        return np.ascontiguousarray(mask_utils.decode(list(self.masks)).transpose(2, 0, 1))  # (H, W, n) -> (n, H, W)

    def decoded_crowd_masks(self) -> np.ndarray:
        """The crowd regions' masks at the stored size: (c, H, W) uint8, 1 inside."""
        if not self.crowd_masks:
            return np.zeros((0, *self.size), dtype=np.uint8)
        return np.ascontiguousarray(mask_utils.decode(list(self.crowd_masks)).transpose(2, 0, 1))

    def window_masks(self, kept: np.ndarray, window: tuple[int, int, int, int]) -> tuple[dict, ...]:
        """The masks of the objects `kept` as seen in `window` (x0, y0, x1, y1) of the image, as compressed RLE of
        the window's size; () when the objects have none."""
        if not self.masks or len(kept) == 0:
            return ()
        x0, y0, x1, y1 = window
        decoded = mask_utils.decode([self.masks[i] for i in kept])  # (H, W, k)
        return tuple(mask_utils.encode(np.asfortranarray(decoded[y0:y1, x0:x1, j])) for j in range(len(kept)))


def rle_json(rle: dict) -> dict:
    """pycocotools' compressed RLE ({"size", "counts": bytes}) as COCO's JSON writes it: counts a string."""
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def rle_mask(rle: dict) -> np.ndarray:
    """A mask as (height, width) bool from compressed RLE, its counts a string (JSON) or bytes (pycocotools)."""
    counts = rle["counts"]
    return mask_utils.decode({**rle, "counts": counts.encode("ascii") if isinstance(counts, str) else counts}) > 0


def segmentation_rle(segmentation: Any, height: int, width: int) -> tuple[dict | None, str, str]:
    """(an annotation's segmentation as compressed RLE, or None; the skip reason, "" when none; what was found): COCO
    polygons ([[x0, y0, x1, y1, ...], ...]) or RLE ({"size": [height, width], "counts": a string or run lengths})
    of an image of (height, width). No segmentation (absent, None or []) is None without a reason."""
    if segmentation is None or segmentation == []:
        return None, "", ""
    if isinstance(segmentation, list):
        if not all(
            isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 and all(_is_number(v) for v in p)
            for p in segmentation
        ):
            return None, "bad segmentation", "polygons must be lists of 3 or more x, y number pairs"
        points = np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in segmentation])
        inside = (points[:, 0] >= 0) & (points[:, 0] <= width) & (points[:, 1] >= 0) & (points[:, 1] <= height)
        if not inside.any():
            return None, "mask outside image", f"no polygon point inside the {width}x{height} image"
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation, dict):
        size, counts = segmentation.get("size"), segmentation.get("counts")
        if size != [height, width]:
            return None, "bad segmentation", f"RLE size {size!r} is not the image's [{height}, {width}]"
        if isinstance(counts, list) and all(_is_int(c) and c >= 0 for c in counts):
            rle = mask_utils.frPyObjects(segmentation, height, width)  # uncompressed run lengths
        elif isinstance(counts, str):
            rle = {"size": [height, width], "counts": counts.encode("ascii")}
        else:
            return None, "bad segmentation", "RLE counts must be a string or a list of run lengths"
        try:
            mask_utils.area(rle)
        except Exception as err:  # pycocotools' own error for counts that do not decode
            return None, "bad segmentation", f"RLE counts do not decode: {err}"
    else:
        return None, "bad segmentation", f"a segmentation is polygons or RLE, got {type(segmentation).__name__}"
    if int(mask_utils.area(rle)) == 0:
        return None, "empty mask", "its segmentation covers no pixel"
    return rle, "", ""


def _box_rle(box: list[float], height: int, width: int) -> dict:
    """A box (x0, y0, x1, y1) in pixels as the compressed RLE of its mask in an image of (height, width)."""
    x0, y0, x1, y1 = box
    return mask_utils.frPyObjects([[x0, y0, x1, y0, x1, y1, x0, y1]], height, width)[0]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _image_entry_problem(entry: Any) -> str:
    """What is wrong with an `images` entry of a COCO file, in words ("" when nothing)."""
    if not isinstance(entry, dict):
        return f"an image entry must be an object, got {type(entry).__name__}"
    wrong = []
    if not _is_int(entry.get("id")):
        wrong.append(f"id must be an integer, got {entry.get('id')!r}")
    if not isinstance(entry.get("file_name"), str):
        wrong.append(f"file_name must be a string, got {entry.get('file_name')!r}")
    for key in ("width", "height"):  # absent: read from the file (some exporters leave them out)
        if key in entry and entry[key] is not None and not (_is_int(entry[key]) and entry[key] > 0):
            wrong.append(f"{key} must be a positive integer, got {entry.get(key)!r}")
    return "; ".join(wrong)


TURNED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def upright_size(path: str | os.PathLike) -> tuple[int, int]:
    """(height, width) of the image file at `path` upright by its EXIF orientation, from its header (no pixel is
    decoded); OSError when it cannot be read."""
    with Image.open(path) as image:
        width, height = image.size
        turned = image.getexif().get(0x0112) in TURNED  # the Orientation tag
    return (width, height) if turned else (height, width)


def _annotation_problem(ann: Any) -> str:
    """What is wrong with an `annotations` entry of a COCO file, in words."""
    if not isinstance(ann, dict):
        return f"an annotation must be an object, got {type(ann).__name__}"
    wrong = [
        f"{key} must be an integer, got {ann.get(key)!r}"
        for key in ("image_id", "category_id")
        if not _is_int(ann.get(key))
    ]
    bbox = ann.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
        wrong.append(f"bbox must be [x, y, width, height] numbers, got {bbox!r}")
    return "; ".join(wrong)


def read_coco_json(path: str | os.PathLike) -> dict:
    """The instances JSON at `path`: OSError if it cannot be read, ValueError if it is not COCO's format."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise OSError(f"cannot read COCO annotations {path}: {err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a COCO instances file: not JSON ({err})") from err
    expected = ("images", "annotations", "categories")
    if not isinstance(data, dict) or not all(isinstance(data.get(key), list) for key in expected):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"{path} is not a COCO instances file: expected an object with lists {list(expected)}, found {found}"
        )
    return data


def _categories(data: dict, path: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(category ids sorted, their names): class index i is category_ids[i]. The categories define the model's
    classes, so a malformed one is an error, not a skip."""
    names: dict[int, str] = {}
    for i, category in enumerate(data["categories"]):
        if not isinstance(category, dict) or not _is_int(category.get("id")):
            raise ValueError(f"{path}: category #{i} needs an integer 'id', got {category!r}")
        if category["id"] in names:
            raise ValueError(f"{path}: category id {category['id']} appears twice")
        names[category["id"]] = str(category.get("name", category["id"]))
    if not names:
        raise ValueError(f"{path}: the file lists no categories")
    ids = tuple(sorted(names))
    return ids, tuple(names[i] for i in ids)


def open_annotated(path: str | os.PathLike, height: int, width: int) -> Image.Image:
    """The image file at `path` as its annotations of `width` x `height` saw it: upright by its EXIF orientation
    (as labelling tools show a photo), or as stored when only the stored pixels have that size (annotations of the
    raw pixels of a rotated photo). UnreadableImageError when it cannot be read or neither has the size."""
    image = open_image(path)
    if image.size == (width, height):
        return image
    stored = open_image(path, upright=False)
    if stored.size == (width, height):
        return stored
    raise UnreadableImageError(path, _other_size(stored.size, image.size, width, height))


def _other_size(stored: tuple[int, int], upright: tuple[int, int], width: int, height: int) -> str:
    """Why a file of `stored` (width, height) pixels, `upright` by its EXIF orientation, is not the annotations'."""
    turned = f" ({upright[0]}x{upright[1]} upright by its EXIF orientation)" if upright != stored else ""
    return f"the file is {stored[0]}x{stored[1]}{turned}, the annotations say {width}x{height}"


def header_problem(path: str | os.PathLike, height: int, width: int) -> str | None:
    """What makes `open_annotated` refuse the image file at `path`, from its header alone (no pixel is decoded): it
    does not open as an image, or neither its stored nor its upright size is `width` x `height`; None when the
    header passes (a file damaged further in shows only when decoded). The EXIF block is read only where the stored
    size is not the annotations' (a PNG's is read to the file's end)."""
    try:
        with Image.open(path) as image:
            stored = image.size
            if stored == (width, height):
                return None
            upright = stored[::-1] if image.getexif().get(0x0112) in TURNED else stored
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        return str(err)
    return None if upright == (width, height) else _other_size(stored, upright, width, height)


def _to_model_input(image: Image.Image, channels: int, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """PIL image -> float32 (C, H, W) in the model's channels, (x / 255 - mean) / std per channel (as `normalize`,
    in numpy: cheaper for one small image)."""
    array = np.asarray(image.convert(image_mode(channels)), dtype=np.float32)  # (H, W) or (H, W, 3)
    array = array.reshape(array.shape[0], array.shape[1], -1).transpose(2, 0, 1)  # (C, H, W)
    mean_a = np.asarray(channel_stats(mean, channels), dtype=np.float32)[:, None, None]  # (C, 1, 1)
    std_a = np.asarray(channel_stats(std, channels), dtype=np.float32)[:, None, None]  # (C, 1, 1)
    return torch.from_numpy(np.ascontiguousarray((array / 255 - mean_a) / std_a))


class CocoDetection(Dataset):
    """A COCO-format detection dataset: the images of an instances JSON, with their boxes.

    Entries that cannot be used are skipped and listed in `report` (a `CocoReport`) with their id: see
    SKIP_REASONS. When every kept annotation has a segmentation (polygons or RLE, `segmentation_rle`), each
    target also holds the objects' masks, ``masks`` (n, h, w) bool at the sample's size, following the image
    through augmentation (`with_masks`). A box partly outside its image is clipped to it (as DETR does), one wholly
    outside skipped.
    Images without annotations are kept (they teach "no object"). An image file that cannot be decoded when read
    gives a `vitkit.data.Unreadable` in place of the sample, which `vitkit.detection.collate_detection` reports;
    `check_images` decodes every file at load instead, to skip them up front (slower).

    Args:
        annotations: the instances JSON.
        images: the folder the JSON's `file_name`s are relative to.
        short_side, max_size: resize so the shorter side is `short_side` and the longer at most `max_size`
            (DETR: 800 and 1333); None keeps the stored size.
        channels: image channels given to the model (1 or 3).
        mean, std: per-channel normalisation statistics (ImageNet's, as DETR).
        check_images: decode every image at load and skip those that fail.
        augment: augment each sample indexed by an (index, seed) pair or (index, seed, batch seed) triple of
            `vitkit.data.EpochSampler` (`DetectionAugment`; needs `short_side`): its size drawn under the batch
            seed, the rest under its own; a plain index gives the sample unaugmented.
    """

    def __init__(
        self,
        annotations: str | os.PathLike,
        images: str | os.PathLike,
        short_side: int | None = 800,
        max_size: int | None = 1333,
        channels: int = 3,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        check_images: bool = False,
        augment: DetectionAugment | None = None,
    ) -> None:
        if short_side is not None and short_side <= 0 or max_size is not None and max_size <= 0:
            raise ValueError(f"short_side and max_size must be positive or None, got {short_side} and {max_size}")
        image_mode(channels)
        self.transform = None
        if augment:
            if short_side is None:
                raise ValueError("augmentation resizes to a random shorter side around short_side: give short_side")
            self.transform = detection_train_transform(short_side, max_size, **asdict(augment))  # (image, batch)
        path = Path(annotations)
        data = read_coco_json(path)
        self.category_ids, self.classes = _categories(data, path)
        self.short_side, self.max_size, self.channels = short_side, max_size, channels
        self.mean, self.std = mean, std
        self.report = CocoReport(str(path))
        self.samples = self._read(data, Path(images), check_images)

    def _read_images(self, entries: list, folder: Path, check: bool) -> tuple[dict[int, tuple[Path, int, int]], set]:
        """Usable image entries: id -> (path, height, width); and the ids of all entries, usable or not."""
        kept: dict[int, tuple[Path, int, int]] = {}
        listed: set = set()
        for i, entry in enumerate(entries):
            image_id = entry.get("id", f"#{i}") if isinstance(entry, dict) else f"#{i}"
            problem = _image_entry_problem(entry)
            if problem:
                if isinstance(entry, dict) and _is_int(entry.get("id")):
                    listed.add(image_id)  # its annotations are of a skipped image, not of an unknown one
                self._skip("image", image_id, "bad image entry", problem)
                continue
            if image_id in listed:
                self._skip("image", image_id, "bad image entry", "the id appears twice")
                continue
            listed.add(image_id)
            file = folder / entry["file_name"]
            if not file.is_file() and "\\" in entry["file_name"]:  # a Windows tool's path: its parts, here
                file = folder.joinpath(*PureWindowsPath(entry["file_name"]).parts)
            if not file.is_file():
                self._skip("image", image_id, "missing file", str(file))
                continue
            height, width = entry.get("height"), entry.get("width")
            if height is None or width is None:  # the file says (the annotations are checked against it as always)
                try:
                    height, width = upright_size(file)
                except OSError as err:
                    self._skip("image", image_id, "unreadable file", str(err))
                    continue
                self.report.sized_from_files += 1
            if check:
                try:
                    open_annotated(file, height, width).close()
                except OSError as err:
                    self._skip("image", image_id, "unreadable file", str(err))
                    continue
            kept[image_id] = (file, height, width)
        return kept, listed

    def _read(self, data: dict, folder: Path, check: bool) -> list[CocoImage]:
        images, listed = self._read_images(data["images"], folder, check)
        class_of = {category: index for index, category in enumerate(self.category_ids)}
        objects: dict[int, list[tuple[list[float], int, float, dict | None]]] = {image_id: [] for image_id in images}
        regions: dict[int, list[tuple[list[float], int, dict | None]]] = {image_id: [] for image_id in images}
        entries = [ann for ann in data["annotations"] if isinstance(ann, dict)]
        all_crowd = bool(entries) and all(ann.get("iscrowd", 0) for ann in entries)  # CVAT's masks: read as objects
        for i, ann in enumerate(data["annotations"]):
            ann_id = ann.get("id", f"#{i}") if isinstance(ann, dict) else f"#{i}"
            bbox = ann.get("bbox") if isinstance(ann, dict) else None
            if not (
                isinstance(ann, dict)
                and _is_int(ann.get("image_id"))
                and _is_int(ann.get("category_id"))
                and isinstance(bbox, list)
                and len(bbox) == 4
                and all(_is_number(v) for v in bbox)
            ):
                self._skip("annotation", ann_id, "bad annotation entry", _annotation_problem(ann))
                continue
            if ann["image_id"] not in listed:
                self._skip("annotation", ann_id, "unknown image", f"image_id {ann['image_id']}")
                continue
            if ann["image_id"] not in images:
                continue  # its image was skipped, and reported
            if ann["category_id"] not in class_of:
                self._skip("annotation", ann_id, "unknown category", f"category_id {ann['category_id']}")
                continue
            x, y, w, h = bbox
            if w <= 0 or h <= 0:
                self._skip("annotation", ann_id, "empty box", f"bbox {bbox}")
                continue
            _, height, width = images[ann["image_id"]]
            box = [min(max(x, 0), width), min(max(y, 0), height), min(max(x + w, 0), width), min(max(y + h, 0), height)]
            if box[2] <= box[0] or box[3] <= box[1]:
                self._skip("annotation", ann_id, "outside image", f"bbox {bbox} in a {width}x{height} image")
                continue
            rle, reason, detail = segmentation_rle(ann.get("segmentation"), height, width)
            if ann.get("iscrowd", 0) and not all_crowd:  # a region of many objects: for evaluation only, its box
                # standing in for a segmentation that cannot be read
                regions[ann["image_id"]].append((box, class_of[ann["category_id"]], None if reason else rle))
                self.report.crowd += 1
                continue
            if reason:
                self._skip("annotation", ann_id, reason, detail)
                continue
            self.report.crowd_as_objects += bool(ann.get("iscrowd", 0))
            if box != [x, y, x + w, y + h]:
                self.report.clipped.append(ann_id)
            area = ann.get("area")
            area = area if _is_number(area) and area > 0 else (box[2] - box[0]) * (box[3] - box[1])
            objects[ann["image_id"]].append((box, class_of[ann["category_id"]], area, rle))
        masked = sum(rle is not None for found in objects.values() for *_, rle in found)
        total = sum(len(found) for found in objects.values())
        with_masks = 0 < masked == total  # masks are used when every kept object has one (`with_masks`)
        samples = []
        for image_id, (file, height, width) in images.items():
            found, crowd = objects[image_id], regions[image_id]
            samples.append(
                CocoImage(
                    image_id,
                    file,
                    (height, width),
                    np.array([box for box, *_ in found], dtype=np.float32).reshape(-1, 4),
                    np.array([label for _, label, *_ in found], dtype=np.int64),
                    np.array([area for _, _, area, _ in found], dtype=np.float32),
                    tuple(rle for *_, rle in found) if with_masks else (),
                    np.array([box for box, *_ in crowd], dtype=np.float32).reshape(-1, 4),
                    np.array([label for _, label, _ in crowd], dtype=np.int64),
                    tuple(rle or _box_rle(box, height, width) for box, _, rle in crowd) if with_masks else (),
                )
            )
        self.report.masks = masked
        self.report.images, self.report.annotations = len(samples), sum(len(s.labels) for s in samples)
        self.report.listed_images, self.report.listed_annotations = len(data["images"]), len(data["annotations"])
        return samples

    @property
    def with_masks(self) -> bool:
        """Every kept object has a segmentation: the targets hold "masks"."""
        return 0 < self.report.masks == self.report.annotations

    def _skip(self, kind: str, item_id: Any, reason: str, detail: str = "") -> None:
        self.report.skipped.append(Skipped(kind, item_id, reason, detail))

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, index: int) -> str:
        sample = self.samples[index]
        return f"image {sample.image_id} ({sample.path})"

    def model_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of this size is resized to: shorter side `short_side`, longer at most
        `max_size` (the shorter side shrinks to fit)."""
        if self.short_side is None:
            return height, width
        short, long = min(height, width), max(height, width)
        target = self.short_side
        if self.max_size is not None and long * target / short > self.max_size:
            target = self.max_size * short / long
        scale = target / short
        return max(1, round(height * scale)), max(1, round(width * scale))

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | Unreadable:
        index = sample_index(key)
        sample = self.samples[index]
        height, width = sample.size
        try:
            image = open_annotated(sample.path, height, width)
        except OSError as err:
            return Unreadable(self.describe(index), str(err))
        return self.transformed(image, sample, key)

    def transformed(
        self, image: Image.Image, sample: CocoImage, key: int | tuple[int, ...]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`image` with the annotations of `sample` as the model takes them: augmented under a training key's seeds,
        else resized (`model_size`)."""
        if self.transform is not None and isinstance(key, tuple):
            return self._augmented(image, sample, int(key[1]), int(key[-1]))
        size = self.model_size(*sample.size)
        tensor = _to_model_input(resized(image, (size[1], size[0])), self.channels, self.mean, self.std)
        target = detection_target(sample.boxes, sample.labels, sample.areas, sample.image_id, sample.size, size)
        if self.with_masks:  # at the model's size, resampled as the image is
            masks = F_v2.resize(_masks_as_image(sample.decoded_masks()), list(size), antialias=True)
            target["masks"] = _masks_from_image(masks, size)  # (n, h, w)
        if len(sample.crowd_labels):  # for evaluation, which ignores the detections that cover them
            target |= crowd_target(sample, size if self.with_masks else None)
        return tensor, target

    def orientations(self) -> list[int]:
        """1 for each image taller than wide, else 0: the groups that batch with little padding
        (`vitkit.data.EpochSampler`'s `groups`)."""
        return [int(sample.size[0] > sample.size[1]) for sample in self.samples]

    def _augmented(
        self, image: Image.Image, sample: CocoImage, seed: int, batch_seed: int
    ) -> tuple[torch.Tensor, dict]:
        """A sample through the training transform: its flip and crop drawn under `seed`, its size under
        `batch_seed` (the same for a batch, or `seed`). Its boxes follow the image, and the augmented image stands
        for the stored one (`orig_size` = `size`); `area` stays each kept object's stored area."""
        boxes = tv_tensors.BoundingBoxes(
            torch.from_numpy(np.asarray(sample.boxes, dtype=np.float32).reshape(-1, 4)),  # (n, 4) pixels
            format="XYXY",
            canvas_size=sample.size,
        )
        index = torch.arange(len(sample.labels))
        per_image, per_batch = self.transform
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)  # the CPU generator only, as `TransformedImages`
            target = {"boxes": boxes, "labels": torch.from_numpy(sample.labels), "index": index}
            if self.with_masks and len(sample.labels):  # each follows its image through every flip, crop and resize
                target["masks"] = _masks_as_image(sample.decoded_masks())
            image, found = per_image(image, target)
            torch.default_generator.manual_seed(batch_seed)
            image, found = per_batch(image, found)
        kept = found["index"].numpy()
        size = (image.size[1], image.size[0])
        tensor = _to_model_input(image, self.channels, self.mean, self.std)
        xyxy = found["boxes"].as_subclass(torch.Tensor).numpy()  # (n', 4) pixels of the augmented image
        target = detection_target(xyxy, sample.labels[kept], sample.areas[kept], sample.image_id, size, size)
        if self.with_masks:  # those of the boxes kept
            masks = found["masks"][found["index"]] if "masks" in found else None
            target["masks"] = _masks_from_image(masks, size)  # (n', h, w) as the augmented image
        return tensor, target


def crowd_target(sample: CocoImage, mask_size: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """A sample's crowd regions as a target's keys: `crowd_boxes` (c, 4) (cx, cy, w, h) in [0, 1] of the image and
    `crowd_labels` (c,); with `mask_size` (h, w), `crowd_masks` (c, h, w) bool, resampled as the image is."""
    height, width = sample.size
    boxes = torch.from_numpy(sample.crowd_boxes).reshape(-1, 4)
    scale = torch.tensor([width, height, width, height], dtype=torch.float32)
    target = {
        "crowd_boxes": box_convert(boxes, "xyxy", "cxcywh") / scale,
        "crowd_labels": torch.from_numpy(sample.crowd_labels),
    }
    if mask_size is not None:
        masks = F_v2.resize(_masks_as_image(sample.decoded_crowd_masks()), list(mask_size), antialias=True)
        target["crowd_masks"] = _masks_from_image(masks, mask_size)
    return target


def _masks_as_image(masks: np.ndarray) -> tv_tensors.Image:
    """Masks (n, H, W) as an n-channel image of 0 and 255, which every transform resamples as it resamples the
    image (torchvision's `Mask` is resized by nearest neighbour, which shifts a mask shrunk by a non-integer factor
    up to half a pixel off its image)."""
    return tv_tensors.Image(torch.from_numpy(masks).mul(255))


def _masks_from_image(masks: torch.Tensor | None, size: tuple[int, int]) -> torch.Tensor:
    """Masks (n, h, w) bool from `_masks_as_image`'s resampled image (a pixel at least half covered is inside);
    (0, h, w) for None (an image without objects)."""
    if masks is None:
        return torch.zeros(0, *size, dtype=torch.bool)
    return masks.as_subclass(torch.Tensor) >= 128


def _require_boxes(data: CocoDetection, split: str) -> None:
    """ValueError unless `data`, the `split` ("train" or "val") of a folder, kept a box: saying what its file lists,
    what was kept and why the rest was left out."""
    report = data.report
    if report.annotations:
        return
    purpose = "train on" if split == "train" else "evaluate on (COCO mAP is undefined without ground-truth boxes)"
    parts = [
        f"the file lists {counted(report.listed_images, 'image')} and "
        f"{counted(report.listed_annotations, 'annotation')}",
        f"kept {counted(report.images, 'image')} and 0 annotations",
    ]
    for kind in ("image", "annotation"):
        reasons = Counter(s.reason for s in report.skipped if s.kind == kind)
        if reasons:
            detail = ", ".join(f"{reason}: {n}" for reason, n in reasons.items())
            parts.append(f"skipped {counted(sum(reasons.values()), kind)} ({detail})")
    if report.crowd:
        parts.append(f"left out {counted(report.crowd, 'crowd annotation')}")
    skipped = sum(s.kind == "annotation" for s in report.skipped)
    with_skipped_images = report.listed_annotations - skipped - report.crowd  # none was kept
    if with_skipped_images:
        parts.append(f"left out {counted(with_skipped_images, 'annotation')} of skipped images")
    first = {}  # the first entry skipped for each reason, with what was found
    for s in report.skipped:
        first.setdefault((s.kind, s.reason), s)
    if first:
        shown = [f"{s.kind} {s.id}: {s.reason}" + (f" ({s.detail})" if s.detail else "") for s in first.values()]
        parts.append("for example " + "; ".join(shown[:4]))
    raise ValueError(f"{report.path}: no boxes to {purpose}: {'; '.join(parts)}")


def _find_split(root: Path, split: str) -> tuple[Path, Path]:
    """(instances JSON, image folder) of `split` ("train" or "val") under `root`; see `load_coco_folder`."""
    annotations = root / "annotations"
    found = sorted(annotations.glob(f"instances_{split}*.json"))
    if len(found) == 1:
        return found[0], root / found[0].stem[len("instances_") :]
    several = found  # one split's candidate files, where more than one would do
    if not found:
        named = sorted(annotations.glob(f"{split}*.json"))  # annotations/train.json beside train/
        if len(named) == 1 and (root / named[0].stem).is_dir():
            return named[0], root / named[0].stem
        folders = sorted(p for p in root.glob(f"{split}*") if p.is_dir())
        jsons = [j for folder in folders for j in sorted(folder.glob("*.json"))]
        if len(folders) == 1 and len(jsons) == 1:
            return jsons[0], folders[0]
        several = jsons if len(folders) == 1 and len(jsons) > 1 else []
    seen = sorted({str(p.relative_to(root)) for p in [*root.glob("*.json"), *root.glob("*/*.json")]})
    seen_text = f"found the .json files {seen[:8]}{' ...' if len(seen) > 8 else ''}" if seen else "found no .json file"
    whole, labelme = other_annotations(root)
    if labelme:  # labelme's own files, one per image
        shown = listed([str(p.relative_to(root)) for p in labelme[:3]]) + (" ..." if len(labelme) > 3 else "")
        seen_text = (
            f"found labelme's annotation files, one .json per image ({shown}), not COCO files: convert each "
            "split's into one COCO file (labelme's examples/instance_segmentation/labelme2coco.py writes one with "
            f"its images), then put them in {root / 'train'}/ and {root / 'val'}/"
        )
    elif several:  # a leftover copy beside the file, or another tool's export
        where = several[0].parent.relative_to(root)
        seen_text = (
            f"{where}/ holds {len(several)} such files ({listed([p.name for p in several])}), and vitkit does not "
            f"guess which describes the {split} images: keep that one there and move the others out"
        )
    elif whole:  # labelme2coco's and many tools' export: one file for every image, no split
        seen_text = (
            f"found {listed([p.name for p in whole])} at its top, a COCO file of the whole set without a train / val "
            f"split: put the images to train on in {root / 'train'}/ with their .json, those to score on in "
            f"{root / 'val'}/ with theirs (COCO's format, the file_name of each image relative to its folder)"
        )
    elif split == "val" and not any(root.glob("val*")):  # read after train: the training split is there
        seen_text += (
            f"; a detection folder needs a split to score on: move about a tenth of the training images to "
            f"{root / 'val'}/ with a .json of their own (vitkit does not split one: which images are held out is "
            "kept fixed in the folder, the same for every run and tool)"
        )
    raise ValueError(
        f"{root}: no COCO-format {split} split: expected one annotations/instances_{split}*.json with its images in "
        f"{split}*/ (COCO's layout), one annotations/{split}*.json with its images in the folder of the same name, "
        f"or one {split}*/ folder holding the images and one .json; {seen_text}"
    )


def other_annotations(root: Path, looked: int = 3) -> tuple[list[Path], list[Path]]:
    """Annotation files in layouts `load_coco_folder` does not read, each read once, of the first `looked` .json
    files at the top of `root` and in each of its folders: (COCO files of a whole set at its top: an object with
    "images" and "annotations", no train / val split; labelme's files: an object with "shapes" and "imagePath", one
    image's annotations each)."""
    whole, labelme = [], []
    for folder in [root, *sorted(p for p in root.iterdir() if p.is_dir())] if root.is_dir() else []:
        for path in sorted(folder.glob("*.json"))[:looked]:
            try:
                with open(path) as handle:
                    data = json.load(handle)
            except (OSError, ValueError):  # unreadable or not JSON: annotations of no layout
                continue
            if not isinstance(data, dict):
                continue
            if folder == root and "images" in data and "annotations" in data:
                whole.append(path)
            elif "shapes" in data and "imagePath" in data:
                labelme.append(path)
    return whole, labelme


def load_coco_folder(
    root: str | os.PathLike, val_only: bool = False, augment: DetectionAugment | None = None, **options: Any
) -> tuple[CocoDetection | None, CocoDetection, DetectionInfo]:
    """A COCO-format dataset folder as (train, val, info); `options` go to `CocoDetection`, `augment` to its
    training split only.

    Layouts: COCO's, ``root/annotations/instances_train2017.json`` with images in ``root/train2017/`` and the same
    for val (any suffix after ``instances_train`` / ``instances_val``, the folder named as the JSON without
    ``instances_``); ``root/annotations/train.json`` with images in ``root/train/`` (any name starting with the
    split, the folder named as the JSON); or a ``root/train*/`` folder with the images and a single JSON, and the
    same for val (as several annotation tools export). Both splits must list the same categories. With `val_only`
    the training annotations are not read (train is None; evaluation needs only val).

    A split that keeps no box (after the skips `CocoDetection` reports) is a ValueError naming its file, with what
    it lists and why nothing was kept: training would learn nothing, and COCO mAP is undefined without boxes.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: expected a COCO-format dataset folder")
    train = None
    if not val_only:
        train = CocoDetection(*_find_split(root, "train"), augment=augment, **options)
        _require_boxes(train, "train")
    val = CocoDetection(*_find_split(root, "val"), **options)
    _require_boxes(val, "val")
    if train is None:
        return None, val, DetectionInfo(str(root), val.classes, val.category_ids, tuple(val.mean), tuple(val.std))
    if (train.category_ids, train.classes) != (val.category_ids, val.classes):
        raise ValueError(
            f"{root}: the train and val annotations list different categories: "
            f"{dict(zip(train.category_ids, train.classes, strict=True))} and "
            f"{dict(zip(val.category_ids, val.classes, strict=True))}"
        )
    info = DetectionInfo(str(root), train.classes, train.category_ids, tuple(train.mean), tuple(train.std))
    return train, val, info
