"""A detection folder seen as the model will see it, before training: per split its images, boxes, classes (and the
rare ones), box sizes in COCO's small / medium / large, objects per image, images without boxes, what loading
skipped or clipped, the category ids as found and the class each becomes, files shared by train and val; and a
warning, with its fix, for each pattern behind "mAP stays at 0" (`check_detection_folder`, `vitkit check-data`).

Only the annotations are read, each image file's header (whether it opens as an image, and of the size its entry
says), the bytes of image files of equal size in train and val, for their hashes, and a few images of each split
(`DEPTH_SAMPLE`, evenly spaced) for their bit depth: 16-bit images whose values fill a small part of their range
(microscopy's 8-bit values stored in 16 bits) are nearly black once scaled to 8 bits.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from vitkit.data.coco import CocoDetection, crowd_objects_words, crowd_words, header_problem, load_coco_folder
from vitkit.data.detection_stats import SMALL_OBJECT, DetectionStats, detection_stats
from vitkit.data.shapes import EXAMPLE_DATA
from vitkit.data.sources import BUILTIN_PREFIX, UnreadableImageError, open_image
from vitkit.data.transforms import integer_depth
from vitkit.util import counted, listed

LARGE_OBJECT = 96  # COCO's large objects: area above 96 * 96 pixels
RARE = 10  # a class with fewer training boxes than this is rare: its AP is a few boxes' luck
BACKGROUND_SHARE = 0.5  # more than this share of images without a box is mostly background
CLIPPED_SHARE = 0.05  # more than this share of boxes clipped or outside their image: boxes in other coordinates?
DEPTH_SAMPLE = 8  # images of a split decoded for their bit depth
DIM = 16  # a high-depth image whose largest value scales to below this 8-bit value is nearly black


@dataclass(frozen=True)
class SplitCheck:
    """What one split holds."""

    split: str  # "train" or "val"
    path: str  # its instances JSON
    stats: DetectionStats  # images, boxes per class, objects per image, sides and box sizes
    sizes: tuple[int, int, int]  # boxes COCO calls small (< 32^2 px), medium, large (> 96^2 px)
    empty_images: int  # images without a box
    skipped: dict[str, int]  # entries left out, per reason (`vitkit.data.coco.SKIP_REASONS`)
    clipped: int  # boxes clipped to their image
    outside: int  # boxes with no part inside their image (skipped)
    crowd: int  # crowd regions, out of training and ignored by evaluation
    dim: tuple[int, int, int, int] = (0, 0, 0, 0)  # of the images decoded for their depth: (how many are 16- or
    # 32-bit and nearly black once scaled to 8 bits, how many were decoded, their bits, their largest value)
    unreadable: tuple[str, ...] = ()  # "file: why" for each image file training will skip, as its header shows
    area_over_box: tuple[int, str] = (0, "")  # objects whose annotated area exceeds their box's, and the first one
    segmented: int = 0  # objects with a segmentation (masks train when every object has one)
    crowd_as_objects: int = 0  # crowd annotations read as objects (every annotation of the file is marked crowd)
    masks_off_boxes: tuple[int, str] = (0, "")  # objects whose mask's own box overlaps their annotated box by less
    # than MASK_BOX_IOU, and the first one
    shared_files: tuple[tuple[str, tuple[int, ...]], ...] = ()  # files that several image entries name: (file, ids)
    left_out: tuple[str, ...] = ()  # "image 5: missing file (path)" for each entry left out, in the file's order


@dataclass(frozen=True)
class DataCheck:
    """`check_detection_folder`'s findings: each split, the categories, the files both splits hold, the warnings."""

    root: str
    category_ids: tuple[int, ...]  # the file's category ids, in the order they become classes 0, 1, ...
    classes: tuple[str, ...]  # their names
    splits: tuple[SplitCheck, ...]
    duplicates: tuple[tuple[str, str], ...]  # (train file, val file) pairs of identical content
    warnings: tuple[str, ...] = field(default=())  # what to look at, each with its fix

    def summary(self) -> str:
        """One line: images, boxes and classes of each split, and how many warnings."""
        parts = [f"{s.split} {counted(s.stats.images, 'image')}, {_boxes(s.stats.boxes)}" for s in self.splits]
        warned = f"; {counted(len(self.warnings), 'warning')} (vitkit check-data)" if self.warnings else ""
        classes = len(self.classes)
        return f"{', '.join(parts)}; {classes} class{'' if classes == 1 else 'es'}{warned}"

    def report(self) -> str:
        """The whole check, as `vitkit check-data` prints it."""
        mapping = ", ".join(
            f"{i} -> {k} {name}" for k, (i, name) in enumerate(zip(self.category_ids, self.classes, strict=True))
        )
        lines = [f"{self.root}", f"categories (file id -> class index, name): {mapping}"]
        for s in self.splits:
            st = s.stats
            small, medium, large = s.sizes
            lines.append(f"{s.split} ({s.path}): {counted(st.images, 'image')}, {_boxes(st.boxes)}")
            width = max(len(name) for name in st.classes)
            for name, n in zip(st.classes, st.boxes_per_class, strict=True):
                rare = "  (rare)" if s.split == "train" and n < RARE else ""
                lines.append(f"    {name:<{width}}  {n:>6}{rare}")
            lines.append(
                f"  box sizes: {small} small (< {SMALL_OBJECT} px), {medium} medium, {large} large "
                f"(> {LARGE_OBJECT} px); median {st.box_size_median:.0f} px"
            )
            lines.append(
                f"  objects per image: median {st.median_objects:g}, at most {st.max_objects}; "
                f"{counted(s.empty_images, 'image')} without a box"
            )
            if s.skipped or s.clipped or s.crowd or s.crowd_as_objects:
                left = ", ".join(f"{reason}: {n}" for reason, n in s.skipped.items())
                lines.append(
                    "  loading: "
                    + "; ".join(
                        part
                        for part in (
                            f"skipped {sum(s.skipped.values())} ({left})" if left else "",
                            f"clipped {_boxes(s.clipped)}" if s.clipped else "",
                            crowd_words(s.crowd) if s.crowd else "",
                            crowd_objects_words(s.crowd_as_objects) if s.crowd_as_objects else "",
                        )
                        if part
                    )
                )
        if self.duplicates:
            lines.append(f"files in both train and val: {len(self.duplicates)}")
        lines += [f"warning: {w}" for w in self.warnings] or ["no warnings"]
        return "\n".join(lines)


def _boxes(n: int) -> str:
    return f"{n} box" + ("" if n == 1 else "es")


def _sizes(data: CocoDetection) -> tuple[int, int, int]:
    """Boxes COCO's evaluation calls small, medium and large, by their annotation's area (as it does)."""
    area = np.concatenate([s.areas for s in data.samples]) if data.samples else np.zeros(0)
    small = int((area < SMALL_OBJECT**2).sum())
    large = int((area > LARGE_OBJECT**2).sum())
    return small, len(area) - small - large, large


AREA_MARGIN = 1.5  # an object's area above this many times its box's area is not the object's (a mask fills its box)


def _area_over_box(data: CocoDetection) -> tuple[int, str]:
    """`SplitCheck.area_over_box`: objects of `data` whose annotated area is above `AREA_MARGIN` times their box's
    (an export writing the image's area, or a wrong unit), and the first as "AREA px for a WxH box". A box on the
    image's border is left out: it may have been clipped to the image, and its area be that of the whole object."""
    count, first = 0, ""
    for sample in data.samples:
        sides = sample.boxes[:, 2:] - sample.boxes[:, :2]  # (n, 2) width, height of the (clipped) boxes
        height, width = sample.size
        inside = (sample.boxes[:, :2] > 0).all(1) & (sample.boxes[:, 2] < width) & (sample.boxes[:, 3] < height)
        over = inside & (sample.areas > AREA_MARGIN * sides.prod(1))
        if over.any() and not first:
            k = int(over.argmax())
            first = f"{sample.areas[k]:.0f} px for a {sides[k, 0]:.0f}x{sides[k, 1]:.0f} box in {sample.path.name}"
        count += int(over.sum())
    return count, first


def _shared_files(data: CocoDetection) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`SplitCheck.shared_files`: each file of `data` that more than one image entry names, with the entries' ids
    (an export merged from several, or one entry per annotator): each entry trains with its own boxes alone."""
    ids: dict[Path, list[int]] = defaultdict(list)
    for sample in data.samples:
        ids[Path(sample.path).resolve()].append(sample.image_id)
    return tuple((path.name, tuple(found)) for path, found in ids.items() if len(found) > 1)


MASK_BOX_IOU = 0.5  # a mask whose own box overlaps its object's box by less is not that object's outline


def _masks_off_boxes(data: CocoDetection) -> tuple[int, str]:
    """`SplitCheck.masks_off_boxes`: objects of `data` whose mask's bounding box has an IoU below `MASK_BOX_IOU` with
    the annotated box (polygons in [0, 1] rather than pixels, or segmentations paired with other boxes), and the
    first as "a mask at [x0, y0, x1, y1] for the box [x0, y0, x1, y1] in FILE"."""
    count, first = 0, ""
    for sample in data.samples:
        if not sample.masks:
            continue
        xywh = np.asarray(mask_utils.toBbox(list(sample.masks)), dtype=np.float64).reshape(-1, 4)
        drawn = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)  # (n, 4) the masks' own boxes
        boxes = np.asarray(sample.boxes, dtype=np.float64)
        overlap = (np.minimum(drawn[:, 2:], boxes[:, 2:]) - np.maximum(drawn[:, :2], boxes[:, :2])).clip(0).prod(1)
        union = (drawn[:, 2:] - drawn[:, :2]).prod(1) + (boxes[:, 2:] - boxes[:, :2]).prod(1) - overlap
        off = overlap < MASK_BOX_IOU * union
        if off.any() and not first:
            k = int(off.argmax())
            first = (
                f"a mask at [{', '.join(f'{v:.0f}' for v in drawn[k])}] for the box "
                f"[{', '.join(f'{v:.0f}' for v in boxes[k])}] in {sample.path.name}"
            )
        count += int(off.sum())
    return count, first


STRETCH = (
    "stretch each file to its full range (for instance its 1st to 99.8th percentile to 0..65535, as microscopy "
    "tools normalise), or save it as 8 bits"
)  # the fix for nearly black high-depth images


def _is_dim(bits: int, largest: int) -> bool:
    """Whether an integer image of `bits` whose largest value is `largest` scales to below `DIM` in 8 bits."""
    return largest * 255 < DIM * (2**bits - 1)


def dim_image_note(path: str | Path) -> str | None:
    """For a 16- or 32-bit integer image file whose values fill a small part of their range: a note that it reads
    nearly black (images are scaled to 8 bits by their depth, `vitkit.data.open_image`), so the model sees next to
    nothing, with the fix; None for any other image, and for a file that cannot be read (its reading reports it)."""
    try:
        with Image.open(path) as image:
            depth = integer_depth(image)
    except (OSError, ValueError):
        return None
    if depth is None or not _is_dim(*depth):
        return None
    bits, largest = depth
    top = 2**bits - 1
    return (
        f"{path} is {bits}-bit with values up to {largest} of 0..{top}: scaled to 8 bits by its depth it is nearly "
        f"black (0..{round(largest * 255 / top)}), and the model sees it so; {STRETCH}"
    )


def _dim(data: CocoDetection) -> tuple[int, int, int, int]:
    """`SplitCheck.dim` of `DEPTH_SAMPLE` evenly spaced images of `data` (unreadable ones are training's to report)."""
    picks = np.linspace(0, len(data.samples) - 1, min(DEPTH_SAMPLE, len(data.samples))).round().astype(int)
    dim, decoded, bits, largest = 0, 0, 0, 0
    for i in dict.fromkeys(picks.tolist()):
        try:
            with Image.open(data.samples[i].path) as image:
                depth = integer_depth(image)
        except OSError:
            continue
        decoded += 1
        if depth is not None and _is_dim(*depth):
            dim, bits, largest = dim + 1, depth[0], max(largest, depth[1])
    return dim, decoded, bits, largest


def _unreadable(data: CocoDetection) -> tuple[str, ...]:
    """For each image of `data` that training will skip, "file: why": from every file's header
    (`vitkit.data.coco.header_problem`), and for `DEPTH_SAMPLE` evenly spaced images, from decoding them as training
    does (`vitkit.data.open_image`: a mode or values it does not convert, such as a float image beyond 0..1)."""
    found = {}
    for sample in data.samples:
        height, width = sample.size
        if (problem := header_problem(sample.path, height, width)) is not None:
            found[sample.path] = f"{sample.path}: {problem}"
    picks = np.linspace(0, len(data.samples) - 1, min(DEPTH_SAMPLE, len(data.samples))).round().astype(int)
    for i in dict.fromkeys(picks.tolist()):
        path = data.samples[i].path
        if path in found:
            continue
        try:
            open_image(path)
        except OSError as err:  # `UnreadableImageError` with its reason, or the file gone since its header was read
            found[path] = f"{path}: {err.reason if isinstance(err, UnreadableImageError) else err}"
    return tuple(found.values())


def _split(split: str, data: CocoDetection) -> SplitCheck:
    report = data.report
    skipped = report.counts()
    return SplitCheck(
        split=split,
        path=report.path,
        stats=detection_stats(data),
        sizes=_sizes(data),
        empty_images=sum(len(s.labels) == 0 for s in data.samples),
        skipped=skipped,
        clipped=len(report.clipped),
        outside=skipped.get("outside image", 0),
        crowd=report.crowd,
        crowd_as_objects=report.crowd_as_objects,
        dim=_dim(data),
        unreadable=_unreadable(data),
        area_over_box=_area_over_box(data),
        masks_off_boxes=_masks_off_boxes(data),
        shared_files=_shared_files(data),
        segmented=report.masks,
        left_out=tuple(f"{s.kind} {s.id}: {s.reason}" + (f" ({s.detail})" if s.detail else "") for s in report.skipped),
    )


def _duplicates(train: CocoDetection, val: CocoDetection) -> list[tuple[str, str]]:
    """(train file, val file) pairs of the same bytes: files of equal size are hashed (SHA-1), no other is read."""

    def sizes(data: CocoDetection) -> dict[int, list[Path]]:
        found: dict[int, list[Path]] = defaultdict(list)
        for sample in data.samples:
            try:
                found[Path(sample.path).stat().st_size].append(Path(sample.path))
            except OSError:  # a missing file is skipped by loading already
                continue
        return found

    def digest(path: Path) -> str:
        return hashlib.sha1(path.read_bytes()).hexdigest()

    train_sizes, pairs = sizes(train), []
    for size, paths in sizes(val).items():
        if size not in train_sizes:
            continue
        seen: dict[str, Path] = {}
        for path in train_sizes[size]:
            seen.setdefault(digest(path), path)
        pairs += [(str(seen[d]), str(p)) for p in paths if (d := digest(p)) in seen]
    return pairs


LEFT_OUT_SHOWN = 5  # entries left out that a split's warning names, before "... N more"


def _id_list(ids: Sequence[int]) -> str:
    """Category ids as a message shows them: "0-20" where they run in order without a gap, else the first 12."""
    ids = list(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}-{ids[-1]}"
    return f"{ids[:12]}{' ...' if len(ids) > 12 else ''}"


def _id_problems(ids: Sequence[int]) -> str:
    """What of "start at 0", "skip ..." and "are not in increasing order" holds for category ids."""
    problems = ["start at 0"] if min(ids) == 0 else []
    if missing := sorted(set(range(min(ids), max(ids) + 1)) - set(ids)):
        shown = [str(i) for i in missing[:5]] + ([f"{len(missing) - 5} more"] if len(missing) > 5 else [])
        problems.append(f"skip {listed(shown)}")
    if repeated := sorted({i for i in ids if list(ids).count(i) > 1}):
        problems.append(f"repeat {listed([str(i) for i in repeated])}")
    if list(ids) != sorted(ids):
        problems.append("are not in increasing order")
    return listed(problems)


def _warnings(check: DataCheck) -> list[str]:
    out = []
    ids = check.category_ids
    if ids and (min(ids) == 0 or list(ids) != list(range(min(ids), min(ids) + len(ids)))):
        out.append(
            f"category ids {_id_list(ids)} {_id_problems(ids)}: vitkit maps them to classes 0..K-1 in the file's "
            "order (above) and writes them back as they were; a tool that reads id 0 as background, or ids as class "
            "indices, would not: renumber them from 1, in order, for such tools"
        )
    named: dict[str, list[int]] = defaultdict(list)
    for category, name in zip(ids, check.classes, strict=True):
        named[name].append(category)
    alike = [f"{listed([str(i) for i in found])} ({name!r})" for name, found in named.items() if len(found) > 1]
    if alike:
        out.append(
            f"categories of one name: {'; '.join(alike)}: they are trained as different classes, and a prediction "
            "does not say which it means; merge them into one category, or rename them"
        )
    by_split = {s.split: s for s in check.splits}
    train, val = by_split.get("train"), by_split.get("val")
    if train is not None:
        boxes = [sum(counts) for counts in zip(*(s.stats.boxes_per_class for s in check.splits), strict=True)]
        unused = [name for name, n in zip(check.classes, boxes, strict=True) if n == 0]
        if unused:
            out.append(
                f"categories without a box in any split: {', '.join(unused)}: each is still a class the model learns "
                "to score (labelme2coco writes _background_ so); remove them from the file's categories"
            )
        rare = [
            f"{name} ({n})"
            for name, n, total in zip(check.classes, train.stats.boxes_per_class, boxes, strict=True)
            if n < RARE and total > 0
        ]
        if rare:
            out.append(
                f"rare classes in train, fewer than {RARE} boxes: {', '.join(rare)}: the model sees too few to learn "
                "them and their AP is a few boxes' luck; annotate more, or merge them into a related class"
            )
    if train is not None and val is not None:
        unseen = [
            name
            for name, n_train, n_val in zip(
                check.classes, train.stats.boxes_per_class, val.stats.boxes_per_class, strict=True
            )
            if n_train == 0 and n_val > 0
        ]
        if unseen:
            out.append(
                f"classes with boxes in val but none in train: {', '.join(unseen)}: their AP will be 0; move some of "
                "their images to train"
            )
    for s in check.splits:
        boxes = s.stats.boxes + s.outside
        if boxes and (s.clipped + s.outside) / boxes > CLIPPED_SHARE:
            out.append(
                f"{s.split}: {s.clipped + s.outside} of {boxes} boxes reach outside their image ({s.clipped} clipped, "
                f"{s.outside} wholly outside): boxes in another image's coordinates, or [x0, y0, x1, y1] where COCO "
                "writes [x, y, width, height]? Draw them (--plot) and fix the export"
            )
        if s.stats.images and s.empty_images / s.stats.images > BACKGROUND_SHARE:
            out.append(
                f"{s.split}: {s.empty_images} of {s.stats.images} images have no box: mostly background teaches "
                "mostly 'no object'; check that their annotations were exported (image ids must match)"
            )
        dim, decoded, bits, largest = s.dim
        if dim:
            top = 2**bits - 1
            out.append(
                f"{s.split}: {dim} of the {decoded} images decoded are {bits}-bit with values up to {largest} of "
                f"0..{top}: scaled to 8 bits by their depth they are nearly black (0..{round(largest * 255 / top)}); "
                f"{STRETCH} before training"
            )
        over, first = s.area_over_box
        if over:
            out.append(
                f"{s.split}: {over} of {s.stats.boxes} objects have an area larger than their box (for example "
                f"{first}): COCO's small / medium / large counts above and AP_small / medium / large read the area; "
                "set it to the object's pixels (its mask's, or its box's width x height)"
            )
        if s.shared_files:
            name, ids = s.shared_files[0]
            out.append(
                f"{s.split}: {counted(len(s.shared_files), 'image file')} named by more than one image entry (for "
                f"example {name}: ids {', '.join(map(str, ids))}): each entry trains with its own boxes only, and the "
                "objects of the others show as background; list each file once, with all its annotations"
            )
        off, first = s.masks_off_boxes
        if off:
            out.append(
                f"{s.split}: {off} of {s.stats.boxes} objects' masks lie off their boxes (for example {first}; the "
                "mask's own box overlaps the annotated one by less than half): polygons in [0, 1] of the image rather "
                "than pixels, or segmentations paired with other objects' boxes? The mask head learns them as they "
                "are; draw them (--plot) and fix the export"
            )
        if s.split == "train" and 0 < s.segmented < s.stats.boxes:
            out.append(
                f"train: {s.stats.boxes - s.segmented} of {s.stats.boxes} objects have no segmentation: the mask head "
                "trains only when every object has one, so training learns boxes only; give those objects their "
                "segmentation to train masks"
            )
        if s.unreadable:
            shown = "; ".join(s.unreadable[:3]) + (" ..." if len(s.unreadable) > 3 else "")
            files = counted(len(s.unreadable), "image file")
            out.append(
                f"{s.split}: {files} cannot be read or differ in size from their annotations, and training skips "
                f"them ({shown}): replace the files, or correct their entries' width and height"
            )
        if s.skipped:
            reasons = ", ".join(f"{reason}: {n}" for reason, n in s.skipped.items())
            shown = "; ".join(s.left_out[:LEFT_OUT_SHOWN])
            more = f"; ... {len(s.left_out) - LEFT_OUT_SHOWN} more" if len(s.left_out) > LEFT_OUT_SHOWN else ""
            out.append(f"{s.split}: entries left out ({reasons}): {shown}{more}")
    if check.duplicates:
        shown = ", ".join(f"{Path(a).name} = {Path(b).name}" for a, b in check.duplicates[:3])
        out.append(
            f"{counted(len(check.duplicates), 'image')} of val also in train ({shown}"
            f"{' ...' if len(check.duplicates) > 3 else ''}): val then scores what the model memorised; remove them "
            "from one split"
        )
    return out


def check_detection_folder(root: str | Path) -> DataCheck:
    """Check a COCO-format detection folder (the layouts `vitkit.data.load_coco_folder` reads): see the module."""
    if str(root).startswith(BUILTIN_PREFIX):  # vitkit's own, nothing a user annotated
        raise ValueError(
            f"{root} is a dataset that comes with vitkit, not a folder of annotations to check; to see its images and "
            f"boxes as files, write it as one: vitkit example-data {str(root)[len(BUILTIN_PREFIX) :]} --out DIR"
            if str(root)[len(BUILTIN_PREFIX) :] in EXAMPLE_DATA
            else f"{root} is a dataset that comes with vitkit, not a folder of annotations to check"
        )
    train, val, info = load_coco_folder(root, short_side=None)
    splits = tuple(_split(name, data) for name, data in (("train", train), ("val", val)) if data is not None)
    duplicates = _duplicates(train, val) if train is not None else []
    check = DataCheck(str(root), info.category_ids, info.classes, splits, tuple(duplicates))
    return replace(check, warnings=tuple(_warnings(check)))
