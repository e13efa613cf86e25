"""Book sources: no control characters in prose or math.

A ``\\t`` typed inside a Python string that writes Markdown, or pasted from a terminal, becomes a
literal TAB: MathJax and LaTeX then read ``$\\tau$`` as TAB + "au" and print "au". Every C0 control
character except the newline is refused outside code blocks (``` fences), in every ``book/**/*.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
SOURCES = sorted(p for p in BOOK.rglob("*.md") if "_build" not in p.parts)
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # C0 (TAB and CR included) and DEL; not \n


def control_characters(text: str) -> list[tuple[int, str]]:
    """(line number, repr of the line) of every prose or math line holding a control character."""
    found, fence = [], None
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.strip(" ")
        if fence is None:
            mark = re.match(r"`{3,}|~{3,}", stripped)
            if mark:  # a code block opens: its content is code, not prose
                fence = mark.group(0)
                continue
            if CONTROL.search(line):
                found.append((number, repr(line)[:100]))
        elif re.fullmatch(re.escape(fence[0]) + "{%d,}" % len(fence), stripped.rstrip()):
            fence = None
    return found


def test_the_detector_sees_a_tab_in_math_and_ignores_code():
    assert control_characters("a TAB in math: $\tau$\n") == [(1, repr("a TAB in math: $\tau$")[:100])]
    assert control_characters("x\r\ny\n")  # a carriage return is a control character too
    assert control_characters("```python\nprint('a\tb')\n```\nprose\n") == []
    assert control_characters("```{code-cell} ipython3\nx = 1\n```\nlater $\x0b$\n") == [(4, repr("later $\x0b$"))]
    assert control_characters("plain prose with $\\tau$ written out\n") == []


def test_the_book_has_sources():
    assert len(SOURCES) >= 12, SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(BOOK)))
def test_no_control_characters_outside_code(path: Path):
    bad = control_characters(path.read_text(encoding="utf-8"))
    assert not bad, f"{path.relative_to(BOOK.parent)}: control characters on lines {bad[:5]}"
