"""Helpers shared across vitkit that belong to no layer: writing a file whole or not at all, and wording counts and
sizes in messages. Imports nothing from vitkit, so any module may use it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Write through a temporary file in the same folder, fsync it, then rename, so that a crash at any moment
    leaves either the old file or the complete new one, never half a file. The file gets the usual permissions
    (0666 less the umask), not mkstemp's owner-only ones.

    Args:
        path: the file to write; its folder must exist.
        write: writes the file's content to the temporary path it is given.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself reaches the disk
        finally:
            os.close(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def counted(n: int, noun: str) -> str:
    """ "1 epoch", "2 epochs": a count and its noun, plural unless one (nouns that take an s)."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def nearest_multiples(size: int, multiple: int) -> str:
    """The multiples of `multiple` around `size`, for a message: "28 or 35" (32, 7), "7" (3, 7)."""
    below, above = size // multiple * multiple, (size // multiple + 1) * multiple
    return f"{below} or {above}" if below > 0 else str(above)


def listed(names: Sequence[str], last: str = "and") -> str:
    """Names in a sentence: "a, b and c" ("a, b or c" with `last` "or"), "a", "" for none."""
    names = list(names)
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else "".join(names)
