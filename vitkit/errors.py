"""Refusals whose ways out name options of the call, worded for whoever made it: with the library's argument names
for Python callers (`str()`), with a command's flags where `vitkit <command>` reports them (`vitkit.cli.messages`
words them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Namer = Callable[..., str]  # name(option) or name(option, value): how a message names an option (set to a value)


def python_option(option: str, value: Any = None) -> str:
    """An option as a library argument: ``force`` alone, ``force=True``, ``compare='transformers'``."""
    return option if value is None else f"{option}={value!r}"


class OptionMessage:
    """A refusal (mixed into an exception class) whose ways out name options: `str()` names them as the library's
    arguments (`python_option`), `message(name)` as `name` does (the command line's flags: `vitkit.cli.messages`).

    Args:
        words: the message, given a `Namer`: ``lambda name: f"... ({name('compare', 'transformers')})"``; or a
            message already worded (how an exception copied from its text, e.g. out of a loader worker, is made).
    """

    def __init__(self, words: Callable[[Namer], str] | str) -> None:
        self.words = words
        super().__init__(self.message())

    def message(self, name: Namer = python_option) -> str:
        if isinstance(self.words, str):
            return self.words
        return self.words(name)

    def __reduce__(self) -> tuple:
        return type(self), (self.message(),)  # copied as its text: the function does not travel between processes


class OptionError(OptionMessage, ValueError):
    """A ValueError whose ways out name options of the call (`OptionMessage`)."""


class OptionFileExistsError(OptionMessage, FileExistsError):
    """A FileExistsError whose ways out name options of the call (`OptionMessage`)."""
