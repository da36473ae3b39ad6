"""Small shared helpers for layers."""

from __future__ import annotations

from torch import nn


def to_2tuple(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An int `n` becomes (n, n); a pair stays a pair (as a tuple)."""
    if isinstance(value, int):
        return (value, value)
    pair = tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"expected an int or a pair of ints (height, width), got {value!r}")
    return pair  # type: ignore[return-value]


def take_indices(depth: int, indices: int | list[int] | tuple[int, ...] | None, unit: str = "block") -> list[int]:
    """Which of `depth` blocks (or stages: `unit`) `forward_intermediates` returns: None for all, an int n for the
    last n, or a list of indices (negative ones count from the end)."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} {unit}s of a {depth}-{unit} model")
        return list(range(depth - indices, depth))
    take = []
    for i in indices:
        if not -depth <= i < depth:
            raise ValueError(f"{unit} index {i} is out of range for a {depth}-{unit} model")
        take.append(i % depth)
    if not take:
        raise ValueError(f"indices is empty; pass None for every {unit}")
    return take


def fresh_classifier(model: nn.Module, in_features: int, num_classes: int) -> nn.Module:
    """A new classifier for `model` (on its device, in its dtype): a Linear from `in_features` to `num_classes`
    (PyTorch's initialisation, as timm's `reset_classifier`), or Identity for 0 classes."""
    if num_classes < 0:
        raise ValueError(f"num_classes must be >= 0 (0: no classifier, the pooled features out), got {num_classes}")
    if num_classes == 0:
        return nn.Identity()
    reference = next(model.parameters(), None)
    linear = nn.Linear(in_features, num_classes)
    return linear if reference is None else linear.to(reference.device, reference.dtype)
