"""book/_ext/kvdro_xref.py: chapter and section references render as "chapter N" / "§N.M" (issue 34).

A three-page book is built with Jupyter Book (no execution, strict), and the rendered links are read back.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[1] / "book" / "_ext" / "kvdro_xref.py"

PAGES = {
    "_toc.yml": "format: jb-book\nroot: intro\nparts:\n  - caption: A\n    numbered: true\n    chapters:\n"
                "      - file: a1\n  - caption: B\n    numbered: true\n    chapters:\n      - file: b1\n"
                "  - caption: Back\n    chapters:\n      - file: notes\n",
    "_config.yml": "title: t\nexecute:\n  execute_notebooks: 'off'\nsphinx:\n  local_extensions:\n    kvdro_xref: _ext\n",
    "intro.md": "# Intro\n\n{doc}`b1` opens. See {doc}`b1`, {ref}`chap-b`, {ref}`sec-b`, {doc}`the b <b1>` "
                "and {doc}`notes`.\n\n| x | y |\n|---|---|\n| 1 | {doc}`b1` |\n",
    "a1.md": "# A one\n\n## Sub\n",
    "b1.md": "(chap-b)=\n# B one\n\n## First\n\n(sec-b)=\n## Second\n",
    "notes.md": "# Notes\n",
}


@pytest.fixture(scope="module")
def intro_html(tmp_path_factory) -> str:
    book = tmp_path_factory.mktemp("xref")
    for name, text in PAGES.items():
        (book / name).write_text(text, encoding="utf-8")
    (book / "_ext").mkdir()
    shutil.copy(EXT, book / "_ext" / EXT.name)
    jb = Path(sys.executable).with_name("jupyter-book")
    done = subprocess.run([str(jb), "build", "-W", "-n", "--keep-going", str(book)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return (book / "_build" / "html" / "intro.html").read_text(encoding="utf-8")


def link_texts(html: str) -> list[str]:
    return re.findall(r'<a class="reference internal" href="[^"]*"><span class="[^"]*">([^<]*)</span></a>', html)


def test_chapters_and_sections_render_as_numbers(intro_html):
    assert link_texts(intro_html)[:5] == ["Chapter 2", "chapter 2", "chapter 2", "§2.2", "the b"]


def test_unnumbered_pages_and_table_cells_keep_their_titles(intro_html):
    texts = link_texts(intro_html)
    assert texts[5] == "Notes" and texts[6] == "B one"
