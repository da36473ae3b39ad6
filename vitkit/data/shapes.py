"""`shapes`: a generated detection dataset that looks like a user's own photos of a few kinds of objects, written as
a COCO-format folder; and `write_example_data`, the folder of `shapes` or digits-detect that `vitkit example-data`
writes.

Four classes, told apart by their outline only: circle (round or slightly flattened), triangle (near equilateral),
square (or a rectangle, sides up to 1.4 to 1) and cross (a plus sign, arms of varied thickness), each at any
rotation. An object's colour is drawn from PALETTE whatever its class (and redrawn only when it would not stand out
from the background beneath it), so colour does not give the class away; FILLED_SHARE of the objects are filled,
the others drawn as a thick outline, and each is shaded by a soft light gradient.

An object's size, sqrt(w * h) of its box, is drawn as 10 + 50 * u ** SIZE_POWER (u uniform in [0, 1)): from 10 to
60 pixels, a third of them below 32 (COCO's small objects, the AP_small of the evaluation). Backgrounds are textured
as photographs are: blotches of muted colours, a light gradient, sometimes stripes or a few thin lines (clutter);
sensor noise covers the whole image. Images come in a few sizes (IMAGE_SIZES, 120 to 160 pixels a side) and hold 1
to MAX_OBJECTS objects whose pixels never touch and whose boxes overlap little (`overlap_ok`); an object that finds
no free place in PLACEMENT_TRIES tries is left out.

A box is the tight box of the pixels its shape covers: coverage is antialiased, pixels covered less than
MIN_COVERAGE are not drawn, and the box holds exactly the drawn ones. Image `i` of a split is drawn from
`numpy.random.default_rng((seed, SPLIT_CODES[split], i))`, with numpy and PIL only: the same seed writes a
byte-identical folder.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

from vitkit.data.coco import rle_json
from vitkit.data.digits_detect import DIGITS_DETECT, VAL_SEED, DigitsDetection, overlap_ok, write_coco_folder
from vitkit.data.sources import load_builtin
from vitkit.errors import OptionFileExistsError

SHAPES = "shapes"
SHAPES_LARGE = "shapes-large"  # the same objects, many and small, on large images: for training in tiles
EXAMPLE_DATA = (SHAPES, SHAPES_LARGE, DIGITS_DETECT)  # the datasets `write_example_data` (`vitkit example-data`) writes
CLASSES = ("circle", "triangle", "square", "cross")  # category ids 1 to 4, in this order
IMAGE_SIZES = ((128, 128), (160, 120), (144, 128), (120, 160))  # (width, height) of the images, drawn uniformly
MAX_OBJECTS = 5  # objects tried per image: 1 to this many, uniformly
SIZE_RANGE = (10, 60)  # an object's size sqrt(w * h) in pixels: from the first to the second ...
SIZE_POWER = 0.75  # ... as low + (high - low) * u ** SIZE_POWER: P(size < 32) = (22 / 50) ** (1 / 0.75), a third
FILLED_SHARE = 0.7  # share of objects filled; the others are drawn as an outline
OUTLINE_WIDTH = (0.1, 0.16)  # outline width as a share of the object's size (at least MIN_OUTLINE pixels)
MIN_OUTLINE = 2.0  # thinnest outline, in pixels
MIN_COVERAGE = 0.25  # pixels a shape covers less than this are left undrawn, so its box is that of visible pixels
GAP = 2  # pixels kept free between two objects' drawn pixels
PLACEMENT_TRIES = 50  # random places tried for an object before it is left out of its image
MIN_CONTRAST = 90.0  # least RGB distance between an object's colour and the mean background beneath it
COLOUR_JITTER = 20  # each channel of a palette colour moves by up to this much, per object
SHADING = 0.18  # an object's brightness varies by up to this share across it (a light from one side)
STRIPES_SHARE = 0.35  # share of backgrounds with stripes
CLUTTER_SHARE = 0.5  # share of backgrounds with a few thin lines
NOISE_SIGMA = (2.0, 7.0)  # range of the sensor noise's standard deviation, per image, in 0..255 levels
SPLIT_CODES = {"train": 0, "val": 1}  # the second number of an image's seed


@dataclass(frozen=True)
class Layout:
    """The images of a shapes dataset: their sizes (width, height), drawn uniformly, the objects tried per image
    (uniformly in a range) and the range of their sizes (drawn as `SIZE_POWER` says)."""

    image_sizes: tuple[tuple[int, int], ...] = IMAGE_SIZES
    objects: tuple[int, int] = (1, MAX_OBJECTS)
    size_range: tuple[int, int] = SIZE_RANGE


# shapes-large: aerial-like images of 1.5 to 2.5 megapixels, each of 120 to 240 objects of 10 to 40 pixels, which
# shrunk to a detector's few hundred pixels would be a few pixels each
LAYOUTS = {SHAPES: Layout(), SHAPES_LARGE: Layout(((1600, 1200), (1200, 1600), (1792, 1344)), (120, 240), (10, 40))}
EXAMPLE_SIZES = {SHAPES: (300, 100), SHAPES_LARGE: (24, 6), DIGITS_DETECT: (300, 100)}  # default (train, val) images
EXAMPLE_BYTES = {SHAPES: 36_000, SHAPES_LARGE: 4_100_000, DIGITS_DETECT: 4_300}  # on disk an image, its annotations
# with it (measured: the default sizes' folders over their images)

# Object colours, chosen whatever the class.
PALETTE = {
    "red": (205, 45, 40),
    "orange": (235, 135, 30),
    "yellow": (235, 210, 55),
    "green": (55, 155, 65),
    "teal": (35, 150, 150),
    "blue": (40, 80, 195),
    "purple": (125, 60, 165),
    "pink": (230, 120, 170),
    "white": (240, 240, 235),
    "black": (25, 25, 30),
}


@dataclass(frozen=True)
class Shape:
    """One object of a `shapes` image."""

    label: int  # class index: CLASSES[label] is its class
    box: tuple[int, int, int, int]  # tight box of its drawn pixels: (x0, y0, x1, y1), x1 and y1 exclusive
    colour: str  # the PALETTE colour it was drawn in (jittered)
    filled: bool  # filled, or only its outline drawn
    # (y1 - y0, x1 - x0) float32 in [0, 1]: how much of each pixel of its box the shape covers (0: not drawn)
    coverage: np.ndarray = field(compare=False, repr=False)
    # a filled object's outline (m, 2) as (x, y) in the image's pixel coordinates (pixel (i, j) spans x in [j, j + 1)
    # and y in [i, i + 1), as COCO's polygons): the coverage's half level; None for an outline (a ring: no polygon)
    polygon: np.ndarray | None = field(default=None, compare=False, repr=False)

    def mask(self, height: int, width: int) -> np.ndarray:
        """The object's mask in an image of (height, width): (height, width) bool, the pixels it covers at least
        half of."""
        full = np.zeros((height, width), dtype=bool)
        x0, y0, x1, y1 = self.box
        full[y0:y1, x0:x1] = self.coverage >= 0.5
        return full

    def segmentation(self, height: int, width: int) -> list[list[float]] | dict:
        """The object as COCO writes a segmentation: a filled one's polygon [[x0, y0, x1, y1, ...]] (rounded to
        hundredths of a pixel), an outline's mask as compressed RLE ({"size": [h, w], "counts": str})."""
        if self.polygon is not None:
            return [[round(float(v), 2) for v in self.polygon.reshape(-1)]]
        return rle_json(mask_utils.encode(np.asfortranarray(self.mask(height, width).astype(np.uint8))))

    @property
    def kind(self) -> str:
        return CLASSES[self.label]


def _polygon_sdf(points: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Signed distance (negative inside) from the points (x, y) to the simple polygon `points` (m, 2), as in
    Inigo Quilez's sdPolygon: the nearest edge for the distance, crossings of a ray for the sign."""
    d2 = np.full(x.shape, np.inf)
    inside = np.zeros(x.shape, dtype=bool)
    for (xi, yi), (xj, yj) in zip(points, np.roll(points, 1, axis=0), strict=True):  # edge from vertex i-1 to i
        ex, ey, wx, wy = xj - xi, yj - yi, x - xi, y - yi
        t = np.clip((wx * ex + wy * ey) / (ex * ex + ey * ey), 0, 1)
        d2 = np.minimum(d2, (wx - ex * t) ** 2 + (wy - ey * t) ** 2)
        above, below, left = y >= yi, y < yj, ex * wy > ey * wx
        inside ^= (above & below & left) | (~above & ~below & ~left)
    return np.where(inside, -1.0, 1.0) * np.sqrt(d2)


def _ellipse_sdf(a: float, b: float, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Signed distance (negative inside) from the points (u, v) to the ellipse of semi-axes a (along u) and b,
    to first order: f(f - 1) / |grad f| for f = |(u / a, v / b)| (exact for a circle; near for flattened ones)."""
    f = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    grad = np.sqrt((u / a**2) ** 2 + (v / b**2) ** 2)
    return np.where(grad > 0, f * (f - 1) / np.maximum(grad, 1e-12), -min(a, b))


def _unit_shape(label: int, rng: np.random.Generator) -> tuple[np.ndarray | None, tuple[float, float]]:
    """A class's shape at unit scale, centred on 0: (polygon vertices (m, 2), None for an ellipse) and the
    ellipse's semi-axes (a, b)."""
    squash = rng.uniform(0.72, 1.0) if rng.random() < 0.5 else 1.0  # half of circles and squares are flattened
    if CLASSES[label] == "circle":
        return None, (1.0, squash)
    if CLASSES[label] == "triangle":
        angles = np.radians([-90.0, 30.0, 150.0] + rng.uniform(-8, 8, 3))
        radii = rng.uniform(0.9, 1.1, 3)
        return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1), (0.0, 0.0)
    if CLASSES[label] == "square":
        return np.array([[-1, -squash], [1, -squash], [1, squash], [-1, squash]], dtype=np.float64), (0.0, 0.0)
    t = rng.uniform(0.22, 0.38)  # the cross's half arm thickness, arms of half length 1
    corners = [(t, -1), (t, -t), (1, -t), (1, t), (t, t), (t, 1), (-t, 1), (-t, t), (-1, t), (-1, -t), (-t, -t)]
    return np.array([(-t, -1), *corners], dtype=np.float64), (0.0, 0.0)


ELLIPSE_VERTICES = 48  # a circle's (or ellipse's) polygon in the annotations: 48 vertices, within 0.2% of its radius


def _draw_coverage(
    label: int, size: float, filled: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """The coverage of one object, cropped to the pixels it draws: (h, w) float32 in [0, 1], h and w about `size`
    for a square one; at a random rotation and a random sub-pixel position. With it, a filled object's outline
    (m, 2) as (x, y) in the coverage's pixel coordinates (the coverage's half level), None for an outlined one."""
    polygon, (a, b) = _unit_shape(label, rng)
    angle = rng.uniform(0, 2 * math.pi)
    cos, sin = math.cos(angle), math.sin(angle)
    if polygon is None:  # the rotated ellipse's half extents
        half_w, half_h = math.hypot(a * cos, b * sin), math.hypot(a * sin, b * cos)
    else:
        polygon = polygon @ np.array([[cos, sin], [-sin, cos]])  # rotated by `angle`
        half_w, half_h = (polygon.max(axis=0) - polygon.min(axis=0)).tolist()
        half_w, half_h = half_w / 2, half_h / 2  # of its box (a triangle's is not centred on 0)
    scale = size / (2 * math.sqrt(half_w * half_h))  # so that sqrt(w * h) of the box is `size`
    reach = math.ceil(scale * (max(a, b) if polygon is None else np.abs(polygon).max())) + 2  # the window's half side
    offset = np.arange(-reach, reach + 1, dtype=np.float64)
    dy, dx = rng.random(), rng.random()  # the sub-pixel position
    y, x = np.meshgrid(offset + 0.5 - dy, offset + 0.5 - dx, indexing="ij")  # pixel centres
    if polygon is None:
        u, v = x * cos + y * sin, -x * sin + y * cos  # in the ellipse's axes
        sdf = _ellipse_sdf(a * scale, b * scale, u, v)
        t = np.linspace(0, 2 * math.pi, ELLIPSE_VERTICES, endpoint=False)
        u, v = a * scale * np.cos(t), b * scale * np.sin(t)
        outline = np.stack([u * cos - v * sin, u * sin + v * cos], axis=1)  # back from the ellipse's axes
    else:
        sdf = _polygon_sdf(polygon * scale, x, y)
        outline = polygon * scale
    coverage = np.clip(0.5 - sdf, 0, 1)  # antialiased: the share of a pixel inside, to first order
    if not filled:
        width = max(MIN_OUTLINE, size * rng.uniform(*OUTLINE_WIDTH))
        coverage *= np.clip(sdf + width + 0.5, 0, 1)
    coverage[coverage < MIN_COVERAGE] = 0
    rows, cols = np.nonzero(coverage)
    # the window's pixel j has its centre, j + 0.5, at the shape's x = j - reach + 0.5 - dx: x + reach + dx in
    # the window's pixel coordinates, less the columns and rows cropped away
    outline = outline + np.array([reach + dx - cols.min(), reach + dy - rows.min()]) if filled else None
    return coverage[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].astype(np.float32), outline


def _grow(mask: np.ndarray, by: int) -> np.ndarray:
    """`mask` (h, w) bool grown by `by` pixels on every side (a square dilation): (h + 2 by, w + 2 by)."""
    h, w = mask.shape
    grown = np.zeros((h + 2 * by, w + 2 * by), dtype=bool)
    for dy in range(2 * by + 1):
        for dx in range(2 * by + 1):
            grown[dy : dy + h, dx : dx + w] |= mask
    return grown


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A textured background: (height, width, 3) float64 in about 0..255."""
    grid = int(rng.integers(2, 6))  # blotches: a coarse grid of muted colours, smoothly enlarged
    grey = rng.uniform(60, 200, (grid, grid, 1))
    coarse = grey + rng.uniform(0.15, 0.6) * (rng.uniform(0, 255, (grid, grid, 3)) - grey)
    coarse_image = Image.fromarray(np.clip(coarse, 0, 255).astype(np.uint8))
    image = np.asarray(coarse_image.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float64)
    fine = rng.normal(0, 1, (height // 6, width // 6))  # a grain of about 6 pixels (surface, fabric, paper)
    fine_image = Image.fromarray(np.clip(128 + 40 * fine, 0, 255).astype(np.uint8))
    grain = np.asarray(fine_image.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float64) - 128
    image = image + rng.uniform(0.1, 0.4) * grain[..., None]
    y, x = np.mgrid[0:height, 0:width]
    angle = rng.uniform(0, 2 * math.pi)
    ramp = ((x - width / 2) * math.cos(angle) + (y - height / 2) * math.sin(angle)) / max(width, height)
    image = image * (1 + rng.uniform(0, 0.5) * ramp)[..., None]  # a light from one side
    if rng.random() < STRIPES_SHARE:
        angle, period = rng.uniform(0, math.pi), rng.uniform(5, 18)
        phase = (x * math.cos(angle) + y * math.sin(angle)) / period + rng.random()
        tint = rng.uniform(0.5, 1.0, 3)  # stripes of a colour, not only brighter and darker
        image = image + rng.uniform(8, 25) * np.sin(2 * math.pi * phase)[..., None] * tint
    if rng.random() < CLUTTER_SHARE:
        lines = Image.new("L", (width, height))
        draw = ImageDraw.Draw(lines)
        for _ in range(int(rng.integers(1, 5))):
            ends = rng.uniform(0, [width, height, width, height]).tolist()
            draw.line(ends, fill=int(rng.integers(140, 230)), width=int(rng.integers(1, 3)))
        alpha = np.asarray(lines, dtype=np.float64)[..., None] / 255
        image = image * (1 - alpha) + rng.uniform(20, 235, 3) * alpha
    return image


def _colour(rng: np.random.Generator, beneath: np.ndarray) -> tuple[str, np.ndarray]:
    """An object colour (palette name, jittered RGB) far enough from `beneath` (3,), the mean background under it:
    the first of the palette in a random order that is, else the farthest."""
    names = list(PALETTE)
    candidates = []
    for i in rng.permutation(len(names)).tolist():
        rgb = np.clip(
            np.array(PALETTE[names[i]], dtype=np.float64) + rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, 3), 0, 255
        )
        distance = float(np.linalg.norm(rgb - beneath))
        if distance >= MIN_CONTRAST:
            return names[i], rgb
        candidates.append((distance, names[i], rgb))
    _, name, rgb = max(candidates, key=lambda c: c[0])
    return name, rgb


def draw_shapes_image(
    index: int, split: str = "train", seed: int = 0, layout: Layout = LAYOUTS[SHAPES]
) -> tuple[np.ndarray, list[Shape]]:
    """Image `index` of a `shapes` split: (H, W, 3) uint8 RGB and its objects, in drawing order.

    Args:
        index: the image's number in its split (0 and up).
        split: "train" or "val"; the splits draw different images.
        seed: the seed of the whole dataset.
        layout: the images' sizes and objects (`LAYOUTS`).
    """
    if split not in SPLIT_CODES:
        raise ValueError(f"split must be one of {list(SPLIT_CODES)}, got {split!r}")
    if index < 0:
        raise ValueError(f"index must be 0 or more, got {index}")
    rng = np.random.default_rng((seed, SPLIT_CODES[split], index))
    width, height = layout.image_sizes[int(rng.integers(len(layout.image_sizes)))]
    image = _background(rng, width, height)
    taken = np.zeros(
        (height + 2 * GAP, width + 2 * GAP), dtype=bool
    )  # pixels drawn: pixel (y, x) at [y + GAP, x + GAP]
    shapes: list[Shape] = []
    low, high = layout.size_range
    for _ in range(int(rng.integers(layout.objects[0], layout.objects[1] + 1))):
        label = int(rng.integers(len(CLASSES)))
        filled = bool(rng.random() < FILLED_SHARE)
        coverage, outline = _draw_coverage(label, low + (high - low) * rng.random() ** SIZE_POWER, filled, rng)
        h, w = coverage.shape
        grown = _grow(coverage > 0, GAP)  # (h + 2 GAP, w + 2 GAP): the pixels that must be free
        corners = np.stack(
            [rng.integers(0, width - w + 1, PLACEMENT_TRIES), rng.integers(0, height - h + 1, PLACEMENT_TRIES)], axis=1
        )
        for x, y in corners.tolist():
            box = (x, y, x + w, y + h)
            free = not (taken[y : y + h + 2 * GAP, x : x + w + 2 * GAP] & grown).any()
            if free and overlap_ok(box, [s.box for s in shapes]):
                break
        else:
            continue  # no free place: left out
        region = image[y : y + h, x : x + w]  # (h, w, 3), a view
        alpha = coverage[..., None].astype(np.float64)  # (h, w, 1)
        name, rgb = _colour(rng, (region * alpha).sum(axis=(0, 1)) / alpha.sum())
        rows, cols = np.mgrid[0:h, 0:w]
        light = rng.uniform(0, 2 * math.pi)
        shade = ((cols - w / 2) * math.cos(light) + (rows - h / 2) * math.sin(light)) / max(w, h)  # in [-0.71, 0.71]
        colour = np.clip(rgb * (1 + SHADING * shade)[..., None], 0, 255)  # (h, w, 3)
        region[:] = region * (1 - alpha) + colour * alpha
        taken[y + GAP : y + GAP + h, x + GAP : x + GAP + w] |= coverage > 0
        shapes.append(Shape(label, box, name, filled, coverage, None if outline is None else outline + (x, y)))
    image = image + rng.normal(0, rng.uniform(*NOISE_SIGMA), image.shape)  # sensor noise
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), shapes


def _write_split(root: Path, split: str, count: int, seed: int, layout: Layout = LAYOUTS[SHAPES]) -> Path:
    """Images 0..count-1 of a `shapes` split as root/<split>/<NNNNNN>.png and root/annotations/instances_<split>.json
    (image ids and annotation ids from 1, category ids 1 to len(CLASSES)); returns the JSON's path."""
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(count):
        pixels, shapes = draw_shapes_image(index, split, seed, layout)
        file_name = f"{index:06d}.png"
        Image.fromarray(pixels).save(root / split / file_name)
        height, width = pixels.shape[:2]
        images.append({"id": index + 1, "file_name": file_name, "width": width, "height": height})
        for shape in shapes:
            x0, y0, x1, y1 = shape.box
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": index + 1,
                    "category_id": shape.label + 1,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),  # the box's: COCO's small / medium / large follow box sizes
                    "iscrowd": 0,
                    "segmentation": shape.segmentation(height, width),
                }
            )
    categories = [{"id": label + 1, "name": name, "supercategory": "shape"} for label, name in enumerate(CLASSES)]
    path = root / "annotations" / f"instances_{split}.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def write_shapes_folder(
    root: str | os.PathLike, train: int = 300, val: int = 100, seed: int = 0, layout: Layout = LAYOUTS[SHAPES]
) -> Path:
    """Write a `shapes` dataset as a COCO-format folder, the layout `load_coco_folder` reads: root/train/*.png,
    root/val/*.png, root/annotations/instances_train.json and instances_val.json. Files already there with the
    same names are replaced. Returns `root`.

    Args:
        root: the folder to write (created if missing).
        train, val: images of each split (at least 1).
        seed: the seed of all images; the same seed writes the same bytes.
        layout: the images' sizes and objects (`LAYOUTS`: shapes' small photos, or shapes-large's).
    """
    if train < 1 or val < 1:
        raise ValueError(f"expected at least 1 train and 1 val image, got train={train} and val={val}")
    root = Path(root)
    _write_split(root, "train", train, seed, layout)
    _write_split(root, "val", val, seed, layout)
    return root


def write_example_data(
    name: str,
    root: str | os.PathLike,
    train: int | None = None,
    val: int | None = None,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write an example detection dataset as a COCO-format folder that `vitkit train --data root` trains on;
    returns `root`.

    `name` is "shapes" or "shapes-large" (`write_shapes_folder` with its `LAYOUTS` entry) or "digits-detect":
    canvases of `builtin:digits-detect` written by
    `write_coco_folder`, the training ones drawn with `seed` (those of its first epoch), the validation ones those
    of the builtin set (its fixed seed; the first 500 are its validation canvases).

    Args:
        name: one of EXAMPLE_DATA.
        root: the folder to write; it must be new or empty unless `force`.
        train, val: images of each split (at least 1); None: the dataset's `EXAMPLE_SIZES`.
        seed: the seed of the images (digits-detect: of its training canvases).
        force: write into a folder that holds files already (files of the same names are replaced, others kept).
    """
    if name not in EXAMPLE_DATA:
        raise ValueError(f"unknown example dataset {name!r}: expected one of {', '.join(EXAMPLE_DATA)}")
    train = EXAMPLE_SIZES[name][0] if train is None else train
    val = EXAMPLE_SIZES[name][1] if val is None else val
    if train < 1 or val < 1:
        raise ValueError(f"expected at least 1 train and 1 val image, got train={train} and val={val}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in 0 .. 2**32 - 1, got {seed}")
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"{root} is a file: expected a new or empty folder to write the dataset into")
    existing = next(p for p in (root.absolute(), *root.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"{existing} is a file, so {root} cannot be a folder: name a folder to write into")
    need, free = (train + val) * EXAMPLE_BYTES[name], shutil.disk_usage(existing).free
    if need > free:  # before the first file: a run out of disk would leave a folder without its annotations
        raise ValueError(
            f"{train + val} images of {name} take about {need / 1e9:,.1f} GB, and the disk of {existing} has "
            f"{free / 1e9:,.1f} GB free: write fewer (train and val)"
        )
    if root.is_dir() and any(root.iterdir()) and not force:
        raise OptionFileExistsError(
            lambda name: (
                f"{root} is not empty: expected a new or empty folder; write into it anyway with "
                f"{name('force', True)}, which replaces files of the same names and keeps the others"
            )
        )
    if name in LAYOUTS:
        return write_shapes_folder(root, train, val, seed, LAYOUTS[name])
    train_digits, test_digits, _ = load_builtin("mnist5k")
    train_set = DigitsDetection(train_digits.images, train_digits.labels, train, seed, False, channels=1)
    val_set = DigitsDetection(test_digits.images, test_digits.labels, val, VAL_SEED, False, channels=1)
    write_coco_folder(train_set, root, "train")
    write_coco_folder(val_set, root, "val")
    return root
