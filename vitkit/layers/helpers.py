"""Small shared helpers for layers."""

from __future__ import annotations


def to_2tuple(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An int `n` becomes (n, n); a pair stays a pair (as a tuple)."""
    if isinstance(value, int):
        return (value, value)
    pair = tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"expected an int or a pair of ints (height, width), got {value!r}")
    return pair  # type: ignore[return-value]
