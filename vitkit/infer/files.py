"""Many image files for inference: the files a list of names, folders and patterns means, a DataLoader that reads
them in order (an unreadable file reported, not raised), and a progress bar over them."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import DataLoader
from tqdm import tqdm

from vitkit.data import EpochSampler, ImageFiles, TransformedImages, make_loader
from vitkit.data.sources import IMAGE_EXTENSIONS

GLOB_CHARACTERS = "*?["  # an item holding one of these, and naming no existing file, is a glob pattern
PROGRESS_MIN_IMAGES = 40  # more images than this, about a screenful of results, get a progress bar


def _folder_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())


def _pattern_images(pattern: str) -> list[Path]:
    """The image files a glob pattern matches and the images of the folders it matches (sorted)."""
    found = []
    for match in map(Path, sorted(glob.glob(pattern, recursive=True))):
        if match.is_dir():
            found += _folder_images(match)
        elif match.suffix.lower() in IMAGE_EXTENSIONS and match.is_file():
            found.append(match)
    return found


def image_paths(items: Sequence[str | os.PathLike]) -> list[Path]:
    """Image files named by `items`, each once, in the order named:

    - a file as it is (whatever its name; a file that is no image is reported when read);
    - a folder as the image files below it, at any depth, by a known image extension (sorted);
    - a glob pattern (``*``, ``?``, ``[...]``; ``**`` for any depth, e.g. ``"imgs/**/*.png"``) as the image files
      it matches and the images of the folders it matches (sorted). An item naming an existing file is that file
      even when its name holds these characters.

    FileNotFoundError naming an item that does not exist, a folder without images, or a pattern matching none.
    """
    paths: list[Path] = []
    known = ", ".join(IMAGE_EXTENSIONS)
    for item in map(os.fspath, items):
        path = Path(item)
        if path.is_dir():
            found = _folder_images(path)
            if not found:
                raise FileNotFoundError(f"{item} holds no images (files ending in {known})")
        elif path.exists():
            found = [path]
        elif any(c in item for c in GLOB_CHARACTERS):
            found = _pattern_images(item)
            if not found:
                raise FileNotFoundError(f"the pattern {item!r} matches no image files (files ending in {known})")
        else:
            raise FileNotFoundError(f"{item} does not exist: expected an image file, a folder or a glob pattern")
        paths += found
    return list(dict.fromkeys(paths))


def image_loader(
    paths: Sequence[str | os.PathLike],
    transform: Callable[[Image.Image], Any] | None,
    batch_size: int | None,
    workers: int = 0,
    sizes: bool = False,
) -> DataLoader:
    """A DataLoader over image files in the order given, each sample (transform(image), its index in `paths`) or,
    for a file that cannot be read, a `vitkit.data.Unreadable` (file and reason), which does not stop the rest.

    Batches are `vitkit.data.Batch`es (the indices as labels, the unreadable files in `skipped`; with `sizes`, each
    image's (height, width) before the transform in `sizes`); `batch_size` None gives the samples one by one,
    unbatched (with `transform` None, the PIL images themselves).
    """
    if not paths:
        raise ValueError("no image files given")
    files = ImageFiles([Path(p) for p in paths], list(range(len(paths))))
    images = TransformedImages(files, transform or _as_is, sizes)
    sampler = EpochSampler(len(paths), shuffle=False, pad=False)
    if batch_size is not None:
        return make_loader(images, sampler, batch_size, workers)
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    return DataLoader(images, batch_size=None, sampler=sampler, num_workers=workers, collate_fn=_as_is)


def _as_is(sample: Any) -> Any:
    return sample


@contextmanager
def progress_bar(total: int, progress: bool | None, unit: str = "image") -> Iterator[tqdm]:
    """A tqdm bar on stderr, shown on a terminal only. `progress` None: shown for more than
    `PROGRESS_MIN_IMAGES` items."""
    show = total > PROGRESS_MIN_IMAGES if progress is None else progress
    bar = tqdm(total=total, unit=unit, leave=False, disable=None if show else True)  # None: a terminal only
    try:
        yield bar
    finally:
        bar.close()
