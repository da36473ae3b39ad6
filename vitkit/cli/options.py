"""Option parsing shared by several commands (not a command itself)."""

from __future__ import annotations

import json
from typing import Any

_PYTHON_WORDS = {"True": True, "False": False, "None": None}


def parse_assignment(text: str) -> tuple[str, Any]:
    """'FIELD=VALUE' -> (field, value): the value as JSON (2, 0.1, true, [224, 320]), Python's True / False / None,
    or else the bare string (attn_backend=math). Lists become tuples, as configs hold them."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expects FIELD=VALUE, got {text!r}")
    if raw in _PYTHON_WORDS:
        return key, _PYTHON_WORDS[raw]
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return key, raw
    return key, tuple(value) if isinstance(value, list) else value
