"""Refusals whose ways out name options of the call, worded for whoever made it: with the library's argument names
for Python callers, with a command's flags where `vitkit <command>` reports them (`vitkit.cli.main`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Namer = Callable[..., str]  # name(option) or name(option, value): how a message names an option (set to a value)


def python_option(option: str, value: Any = None) -> str:
    """An option as a library argument: ``force`` alone, ``force=True``, ``compare='transformers'``."""
    return option if value is None else f"{option}={value!r}"


def cli_option(option: str, value: Any = None) -> str:
    """An option as a command's flag: the argument's name with `_` written `-` (``--scale-jitter``), followed by its
    value (``--compare transformers``; a sequence comma-separated, ``--layers 0,-1``; True: the flag alone)."""
    flag = "--" + option.replace("_", "-")
    if value is None or value is True:
        return flag
    shown = ",".join(map(str, value)) if isinstance(value, Sequence) and not isinstance(value, str) else value
    return f"{flag} {shown}"


class OptionMessage:
    """A refusal (mixed into an exception class) whose ways out name options. `str()` names them as the library's
    arguments (`python_option`); `cli_message()` as a command's flags (`cli_option`).

    Args:
        words: the message, given a `Namer`: ``lambda name: f"... ({name('compare', 'transformers')})"``; or a
            message already worded (how an exception copied from its text, e.g. out of a loader worker, is made).
    """

    def __init__(self, words: Callable[[Namer], str] | str) -> None:
        self.words = words
        super().__init__(self.message())

    def message(self, cli: bool = False) -> str:
        if isinstance(self.words, str):
            return self.words
        return self.words(cli_option if cli else python_option)

    def __reduce__(self) -> tuple:
        return type(self), (self.message(),)  # copied as its text: the function does not travel between processes

    def cli_message(self) -> str:
        """The message with the command's flags for the options."""
        return self.message(cli=True)


class OptionError(OptionMessage, ValueError):
    """A ValueError whose ways out name options of the call (`OptionMessage`)."""


class OptionFileExistsError(OptionMessage, FileExistsError):
    """A FileExistsError whose ways out name options of the call (`OptionMessage`)."""
