"""Where images come from: the datasets bundled with vitkit, and folders of image files (ImageFolder layout).

A source is a list of (image, label) samples whose images open as PIL images; transforms and batching live in
`vitkit.data.transforms` and `vitkit.data.loader`. Nothing is downloaded: bundled data ships inside the package.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from vitkit.data.transforms import EIGHT_BIT_MODES, ImageModeError, to_8bit

BUILTIN_PREFIX = "builtin:"
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".pgm", ".png", ".ppm", ".tif", ".tiff", ".webp")
DEFAULT_VAL_FRACTION = 0.1  # share of each class held out from a folder without val/, when none is given
SPLITS = ("train", "val")  # the split folders of an ImageFolder tree

EXIF_ORIENTATION = 0x0112  # the EXIF tag of how to turn the stored pixels upright
# Errors PIL raises for files it cannot decode (truncated, not an image, corrupt headers, too large).
UNREADABLE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)

log = logging.getLogger("vitkit.data")


def _is_number_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_number(v) for v in value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_normalisation(
    mean: Any, std: Any, source: str, in_chans: int | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel normalisation read from a file (a model's config.json) as float tuples; ValueError naming
    `source` and what is wrong otherwise: each a non-empty list of finite numbers, as many of each, every std above
    zero (a zero std divides by zero: every output NaN), and for a model of `in_chans` channels 1, `in_chans` or 3
    values."""
    for name, values in (("mean", mean), ("std", std)):
        numbers = isinstance(values, list | tuple) and _is_number_list(list(values))
        if not numbers or not all(math.isfinite(v) for v in values):
            raise ValueError(f"{source}: {name} must be a non-empty list of finite numbers, got {values!r}")
    if len(mean) != len(std):
        raise ValueError(f"{source}: mean has {len(mean)} values but std {len(std)}")
    if in_chans is not None and len(mean) not in (1, in_chans, 3):
        raise ValueError(f"{source}: {len(mean)} mean / std values for a model of {in_chans} channels")
    if min(std) <= 0:
        raise ValueError(f"{source}: std must be > 0 for every channel (images are divided by it), got {list(std)}")
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about the data it is trained on (`vitkit train` saves it with the model, in its
    config.json: `vitkit.weights.ModelInfo`)."""

    source: str  # "builtin:NAME" or the folder path given for training
    classes: tuple[str, ...]  # class names, in label order
    mean: tuple[float, ...]  # per-channel normalisation mean of images scaled to [0, 1] (the data's own channels)
    std: tuple[float, ...]  # per-channel normalisation std, same channels as `mean`
    val_fraction: float  # fraction held out per class when the source has no fixed split (0 when it has one)
    split_seed: int  # seed of that held-out split


class UnreadableImageError(OSError):
    """An image file that cannot be used: not decodable, or a mode or values vitkit does not convert."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"cannot read image {path}: {reason}")
        self.path = os.fspath(path)
        self.reason = reason  # why, without the path


def _upright(image: Image.Image) -> Image.Image:
    """`image` turned as its EXIF orientation says; itself when it has none (a copy would lose what `to_8bit` reads
    of a TIFF's header) or when the EXIF block is damaged (the pixels are still good)."""
    try:
        if image.getexif().get(EXIF_ORIENTATION, 1) in (0, 1):
            return image
        return ImageOps.exif_transpose(image)
    except Exception:  # Pillow raises many kinds for a damaged EXIF block
        return image


def open_image(path: str | os.PathLike, upright: bool = True) -> Image.Image:
    """Open and decode an image file now, so a damaged file fails here, as 8 bits per sample (16-bit and float
    images scaled by `vitkit.data.transforms.to_8bit`), turned upright by its EXIF orientation as image viewers and
    labelling tools show it (a phone's portrait photo is stored sideways with a tag saying so; `upright=False`
    keeps the stored pixels). UnreadableImageError (an OSError) naming the file and the reason if it cannot be read
    or is of a mode vitkit does not convert."""
    try:
        with Image.open(path) as image:
            image.load()
            if upright:
                image = _upright(image)
    except UNREADABLE_ERRORS as err:
        raise UnreadableImageError(path, str(err) or type(err).__name__) from err
    try:
        image = to_8bit(image)
    except ImageModeError as err:
        raise UnreadableImageError(path, str(err)) from err
    if image.mode not in EIGHT_BIT_MODES:
        raise UnreadableImageError(path, f"image mode {image.mode} is not supported")
    return image


class ArrayImages:
    """Images held in memory: uint8 (N, H, W) grayscale or (N, H, W, 3) colour, with integer labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, name: str) -> None:
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) != len(labels):
            raise ValueError(
                f"expected uint8 images (N, H, W[, 3]) and N labels, got {images.dtype} {images.shape} "
                f"and {len(labels)} labels"
            )
        self.images = images
        self.labels = [int(y) for y in labels]
        self.name = name

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, index: int) -> Image.Image:
        return Image.fromarray(self.images[index])

    def describe(self, index: int) -> str:
        return f"{self.name}[{index}]"


class ImageFiles:
    """Image files with labels; `load` decodes one fully (`open_image`), an OSError if it cannot."""

    def __init__(self, paths: list[Path], labels: list[int]) -> None:
        self.paths = paths
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, index: int) -> Image.Image:
        return open_image(self.paths[index])

    def describe(self, index: int) -> str:
        return str(self.paths[index])


ImageSource = ArrayImages | ImageFiles


@dataclass(frozen=True)
class Builtin:
    file: str  # the .npz inside vitkit/data/builtin with train_/test_ images and labels
    classes: tuple[str, ...]  # class names in label order
    mean: tuple[float, ...]  # per-channel mean of the training images scaled to [0, 1]
    std: tuple[float, ...]  # per-channel std of the training images scaled to [0, 1]
    min_scale: float  # default smallest area fraction kept by the random resized crop
    hflip: float  # default horizontal flip probability (0 where flipping changes the meaning)
    description: str  # one line for listings


BUILTIN = {
    "mnist5k": Builtin(
        file="mnist5k.npz",
        classes=tuple(str(d) for d in range(10)),
        mean=(0.1307,),  # the usual MNIST statistics
        std=(0.3081,),
        min_scale=0.85,  # a digit must stay whole
        hflip=0.0,  # a mirrored digit is not the same digit
        description="5,000 MNIST digits, 28x28 grayscale: 4,000 train / 1,000 test, stratified (LeCun & Cortes)",
    ),
}
DEFAULT_DATA = BUILTIN_PREFIX + "mnist5k"


def data_gone(source: str | None) -> bool:
    """Whether `source`, a `--data` value recorded by a run or a model, names a folder or file that is no longer
    there (moved or deleted); a builtin dataset never is."""
    return source is not None and not source.startswith(BUILTIN_PREFIX) and not Path(source).exists()
FOLDER_AUGMENT = {"min_scale": 0.25, "hflip": 0.5}  # augmentation defaults for ImageFolder data


def augment_defaults(source: str) -> dict[str, float]:
    """Default `min_scale` and `hflip` of the training augmentation for a data source (see `load_data`)."""
    if source.startswith(BUILTIN_PREFIX) and source[len(BUILTIN_PREFIX) :] in BUILTIN:
        entry = BUILTIN[source[len(BUILTIN_PREFIX) :]]
        return {"min_scale": entry.min_scale, "hflip": entry.hflip}
    return dict(FOLDER_AUGMENT)


def write_image_folder(
    source: ArrayImages, classes: tuple[str, ...], root: str | os.PathLike, per_class: int | None = None
) -> Path:
    """Write in-memory images as PNG files root/<class>/<index>.png, the layout `load_folder` reads.

    At most `per_class` images of each class (all by default), in their stored order. Handy to see what a
    folder of your own data should look like: ``write_image_folder(load_builtin("mnist5k")[1], classes, "digits")``.
    """
    root = Path(root)
    written = dict.fromkeys(range(len(classes)), 0)
    for index, label in enumerate(source.labels):
        if per_class is not None and written[label] >= per_class:
            continue
        folder = root / classes[label]
        folder.mkdir(parents=True, exist_ok=True)
        source.load(index).save(folder / f"{index:05d}.png")
        written[label] += 1
    return root


def list_builtin() -> dict[str, str]:
    """The bundled datasets: name -> one-line description. Use them as ``"builtin:NAME"``."""
    return {name: entry.description for name, entry in BUILTIN.items()}


def load_builtin(name: str) -> tuple[ArrayImages, ArrayImages, DataInfo]:
    """The bundled dataset `name` as (train, test, info); read from the installed package, never downloaded."""
    if name not in BUILTIN:
        raise ValueError(f"unknown builtin dataset {name!r}; bundled datasets are {sorted(BUILTIN)}")
    entry = BUILTIN[name]
    with (files("vitkit.data") / "builtin" / entry.file).open("rb") as handle:
        arrays = dict(np.load(handle))
    train = ArrayImages(arrays["train_images"], arrays["train_labels"], f"{name}/train")
    test = ArrayImages(arrays["test_images"], arrays["test_labels"], f"{name}/test")
    info = DataInfo(BUILTIN_PREFIX + name, entry.classes, entry.mean, entry.std, val_fraction=0.0, split_seed=0)
    return train, test, info


def _class_folders(root: Path) -> list[str]:
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root} is not a directory: expected a folder of class folders (or, for detection, of COCO-format "
            "annotations)"
        )
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(
            f"{root} has no class folders: expected {root}/<class>/<image files> (or, for detection, COCO-format "
            "annotations: annotations/instances_train*.json, or a train*/ folder holding one .json with its images)"
        )
    return classes


def _scan(root: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    """Image files under root/<class>/ (any depth), sorted, with the class index as label. A class folder without
    image files, or none of whose files reads as an image, is a ValueError: the model could not learn it."""
    paths, labels, empty, unreadable = [], [], [], []
    for label, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not found:
            empty.append(name)
        elif (why := _none_readable(found)) is not None:
            unreadable.append((name, f"{why[0].relative_to(root)}: {why[1]}"))
        paths += found
        labels += [label] * len(found)
    if empty:
        raise ValueError(
            f"{root}: class folder(s) {empty} hold no images (expected files ending in {', '.join(IMAGE_EXTENSIONS)})"
        )
    if unreadable:
        raise ValueError(
            f"{root}: class folder(s) {[name for name, _ in unreadable]} hold no readable image, so the model could "
            f"not learn {'it' if len(unreadable) == 1 else 'them'} (for example {unreadable[0][1]}): replace the "
            "files, or remove the folder"
        )
    return paths, labels


def _none_readable(files: list[Path]) -> tuple[Path, str] | None:
    """(the first file, why it cannot be read) when none of `files` reads as an image; None as soon as one does (a
    class's first file, mostly: one decode a class)."""
    first = None
    for path in files:
        try:
            open_image(path).close()
            return None
        except UnreadableImageError as err:
            first = first or (path, err.reason)
    return first


def stratified_split(labels: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held-out) sample indices: `fraction` of every class held out, chosen by a seeded shuffle."""
    rng = np.random.default_rng(seed)
    labels_array = np.asarray(labels)
    kept, held = [], []
    for label in np.unique(labels_array):
        members = rng.permutation(np.flatnonzero(labels_array == label))
        n_held = int(round(len(members) * fraction))
        held += members[:n_held].tolist()
        kept += members[n_held:].tolist()
    return sorted(kept), sorted(held)


def _training_classes(root: Path) -> list[str]:
    """The class folders of a folder to train on: at least two."""
    classes = _class_folders(root)
    if len(classes) < 2:
        raise ValueError(
            f"{root} has {len(classes)} class folder ({classes[0]!r}): a classifier needs at least two classes, "
            f"one folder each ({root}/<class>/<image files>)"
        )
    return classes


def own_split(source: str | os.PathLike) -> str | None:
    """Why a held-out fraction does not apply to a classification source, which then has a validation split of
    its own ("builtin:mnist5k is a bundled dataset with its own test split"); None when it applies (a folder
    without val/)."""
    text = os.fspath(source)
    if text.startswith(BUILTIN_PREFIX):
        return f"{text} is a bundled dataset with its own test split"
    root = Path(text)
    if (root / "train").is_dir() and (root / "val").is_dir():
        return f"{text} has a val/ folder, which is the validation split"
    return None


def _warn_ignored_fraction(source: str | os.PathLike, val_fraction: float | None) -> None:
    why = own_split(source)
    if why is not None and val_fraction is not None and val_fraction != DEFAULT_VAL_FRACTION:
        log.warning(f"val_fraction {val_fraction} is ignored: {why}")


def load_folder(
    path: str | os.PathLike, val_fraction: float | None = None, seed: int = 0
) -> tuple[ImageFiles, ImageFiles, DataInfo]:
    """An ImageFolder tree as (train, val, info).

    `path` holds one of:
      - `train/` and `val/`, each a folder of the same class folders. `val_fraction` does not apply: a value other
        than the default is ignored with a warning (logger "vitkit.data").
      - `train/` without `val/`: train/ holds the class folders, and `val_fraction` of every class is held out for
        validation by a shuffle seeded with `seed`.
      - class folders directly, split as train/ alone.
    Folders beside train/ other than val/ (test/, validation/, ...) are not read; a warning names them. Class names
    are the sorted folder names, at least two; images are files with a known image extension at any depth below
    their class folder. `val_fraction` None means `DEFAULT_VAL_FRACTION` (0.1).
    """
    root = Path(path)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics, as for most RGB data
    if (root / "train").is_dir():
        others = sorted(
            p.name for p in root.iterdir() if p.is_dir() and p.name not in SPLITS and not p.name.startswith(".")
        )
        if others:
            log.warning(f"{root}: folder(s) {others} beside train/ are not read (vitkit reads train/ and val/)")
    if (root / "train").is_dir() and (root / "val").is_dir():
        classes = _training_classes(root / "train")
        val_classes = _class_folders(root / "val")
        if val_classes != classes:
            raise ValueError(f"{root}: train/ has classes {classes} but val/ has {val_classes}")
        _warn_ignored_fraction(path, val_fraction)
        train = ImageFiles(*_scan(root / "train", classes))
        val = ImageFiles(*_scan(root / "val", classes))
        return train, val, DataInfo(str(path), tuple(classes), mean, std, val_fraction=0.0, split_seed=0)
    fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
    if (root / "val").is_dir():
        raise ValueError(f"{root} has val/ but no train/: expected {root}/train/<class>/ beside {root}/val/<class>/")
    # train/ alone is the training split, held out from as a folder of class folders is.
    folder = root / "train" if (root / "train").is_dir() else root
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1) to split {folder} without a val/ folder, got {fraction}")
    classes = _training_classes(folder)
    paths, labels = _scan(folder, classes)
    kept, held = stratified_split(labels, fraction, seed)
    if not kept or not held:
        raise ValueError(
            f"val_fraction {fraction} of {len(labels)} images leaves {len(kept)} to train and {len(held)} to "
            f"validate; both need at least one: hold out {'more (a larger' if not held else 'less (a smaller'} "
            f"val_fraction), or split the folder yourself: {root}/train/<class>/ and {root}/val/<class>/"
        )
    train = ImageFiles([paths[i] for i in kept], [labels[i] for i in kept])
    val = ImageFiles([paths[i] for i in held], [labels[i] for i in held])
    return train, val, DataInfo(str(path), tuple(classes), mean, std, fraction, split_seed=seed)


def load_data(
    source: str, val_fraction: float | None = None, seed: int = 0
) -> tuple[ImageSource, ImageSource, DataInfo]:
    """(train, held-out, info) for ``"builtin:NAME"`` or the path of an ImageFolder tree (see `load_folder`).

    `val_fraction` (None: the default, 0.1) applies to folders without val/; a bundled dataset has its own test
    split, so a value other than the default is ignored there with a warning.
    """
    if source.startswith(BUILTIN_PREFIX):
        _warn_ignored_fraction(source, val_fraction)
        return load_builtin(source[len(BUILTIN_PREFIX) :])
    return load_folder(source, val_fraction, seed)


def eval_split(source: str) -> tuple[ImageSource, tuple[str, ...]]:
    """The images of `source` to evaluate on and their class names in label order: the test split of a bundled
    dataset, the val/ folder of a train/val tree, or every image of a folder of class folders. A folder with train/
    and no val/ is an error that says what to give instead."""
    if source.startswith(BUILTIN_PREFIX) or (Path(source) / "val").is_dir():
        _, held, found = load_data(source)
        return held, found.classes
    if (Path(source) / "train").is_dir():
        raise ValueError(
            f"{source} holds train/ but no val/: evaluate on a folder of class folders (e.g. {source}/train), or "
            "leave the data out to evaluate on the images held out in training"
        )
    classes = tuple(_class_folders(Path(source)))
    return ImageFiles(*_scan(Path(source), list(classes))), classes


def load_eval_split(source: str | None, info: DataInfo) -> ImageSource:
    """The images to evaluate a model trained on the data `info` describes.

    With `source` None: the held-out part of the training data, split as in training. Otherwise `eval_split`'s
    images of `source`, whose class names must be the model's or some of them (`eval_classes`).
    """
    if source is None:
        # A fixed split is saved as fraction 0, which means "none given" here.
        _, held, found = load_data(info.source, info.val_fraction or None, info.split_seed)
        classes = found.classes
    else:
        held, classes = eval_split(source)
    return eval_classes(source or info.source, held, classes, info.classes)


def eval_classes(source: str, held: ImageSource, found: Sequence[str], expected: Sequence[str]) -> ImageSource:
    """`held` (labelled by the class names `found` in `source`) labelled by the model's classes `expected`: as it
    is when the names are the model's, in its order; relabelled by name when they are some of them (a test set of
    a few classes); ValueError naming those the model does not know otherwise."""
    if tuple(found) == tuple(expected):
        return held
    unknown = [name for name in found if name not in expected]
    if unknown or not isinstance(held, ImageFiles):
        raise ValueError(
            f"{source} has classes {list(found)}, the model knows {list(expected)}"
            + (f": {unknown} are not among them" if unknown else "")
        )
    index = [list(expected).index(name) for name in found]  # the data's label -> the model's
    return ImageFiles(held.paths, [index[label] for label in held.labels])
