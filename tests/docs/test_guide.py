"""docs/guide.md runs: its ```python blocks are executed in order in one namespace, and each ```text block that
follows one directly must be exactly what that block printed (a block that prints must show its output)."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import torch

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass
class Fenced:
    lang: str  # "python", "text", ...
    code: str  # the lines between the fences, each ending in a newline
    line: int  # the guide's line of the first code line
    start: int  # character offsets of the block, fences included
    end: int


def fenced_blocks(text: str) -> list[Fenced]:
    return [
        Fenced(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2, m.start(), m.end())
        for m in FENCE.finditer(text)
    ]


def test_fence_parser_reads_blocks_and_their_lines():
    text = "intro\n```python\nprint(1)\n```\n\n```text\n1\n```\nprose\n```\nplain\n```\n"
    blocks = fenced_blocks(text)
    expected = [("python", "print(1)\n", 3), ("text", "1\n", 7), ("", "plain\n", 11)]
    assert [(b.lang, b.code, b.line) for b in blocks] == expected
    assert text.splitlines()[blocks[1].line - 1] == "1"


def test_guide_blocks_run_and_show_what_they_print():
    text = GUIDE.read_text(encoding="utf-8")
    blocks = fenced_blocks(text)
    python = [b for b in blocks if b.lang == "python"]
    assert len(python) >= 8, "the guide's code blocks were not found"
    namespace: dict = {"__name__": "guide"}
    torch.manual_seed(0)

    def adjacent(first: Fenced, second: Fenced) -> bool:
        return first.lang == "python" and not text[first.end : second.start].strip()

    for i, block in enumerate(blocks):
        if block.lang == "text":
            assert i > 0 and adjacent(blocks[i - 1], block), (
                f"guide.md:{block.line}: an output block must directly follow the python block it shows"
            )
        if block.lang != "python":
            continue
        printed = io.StringIO()
        # padded with newlines so that a traceback's line numbers are the guide's
        code = compile("\n" * (block.line - 1) + block.code, str(GUIDE), "exec")
        with contextlib.redirect_stdout(printed):
            exec(code, namespace)
        shown = blocks[i + 1] if i + 1 < len(blocks) else None
        if shown is not None and shown.lang == "text" and adjacent(block, shown):
            assert printed.getvalue() == shown.code, f"guide.md:{shown.line}: the output shown is not what it prints"
        else:
            assert printed.getvalue() == "", f"guide.md:{block.line}: the block prints, but the guide shows no output"


def test_guide_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)", GUIDE.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert "costs.md" in local
    missing = [link for link in local if not (GUIDE.parent / link).exists()]
    assert missing == []
