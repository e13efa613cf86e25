"""`make pdf`: the book printed to PDF by headless Chromium from the built HTML (no LaTeX).

``make pdf`` builds the book as one page (``jupyter-book build --builder singlehtml``) and prints it
with ``book/assignments/print_pdf.py``. To keep CI cheap this test prints pages that ``make book``
already built — the one-page build when ``make pdf`` has run, else a chapter with mathematics and
charts — through the same function, and checks the PDF: whole, several pages, and (where
``pdftotext`` is installed) the chapter's text present and its TeX typeset rather than printed raw.

Without a built book the test skips, unless ``KVDRO_REQUIRE_BOOK=1`` (set by the Makefile), when it
fails. Without Chromium it skips with the reason (``.ci/run`` installs it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
HTML = Path(os.environ.get("KVDRO_BOOK_HTML") or BUILD / "html")

_spec = importlib.util.spec_from_file_location("kvdro_print_pdf", ROOT / "book" / "assignments" / "print_pdf.py")
print_pdf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(print_pdf)


def _page() -> Path:
    single = BUILD / "singlehtml" / "index.html"
    if single.exists():
        return single
    page = HTML / "book" / "02_newsvendor.html"
    if not page.exists():
        if os.environ.get("KVDRO_REQUIRE_BOOK") == "1":
            pytest.fail(f"no built book at {HTML}: run `make book` first")
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    return page


def test_makefile_pdf_target_prints_the_one_page_build():
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\npdf:"):]
    target = target[: target.index("\n\n")]
    assert "--builder singlehtml" in target and "print_pdf.py _build/singlehtml/index.html" in target, target


def test_missing_page_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="build the book first"):
        print_pdf.print_page(tmp_path / "none.html", tmp_path / "x.pdf", browser="chromium")


def test_built_book_prints_to_pdf(tmp_path):
    page = _page()
    if print_pdf.chromium() is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    pdf = print_pdf.print_page(page, tmp_path / "book.pdf")
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF") and b"%%EOF" in data[-2048:], "not a whole PDF"
    pages = print_pdf.page_count(pdf)
    assert pages >= 3, f"{page.name} printed to {pages} page(s)"
    if shutil.which("pdftotext") is None:
        return  # the text checks need poppler-utils
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "critical fractile" in text.lower(), "the chapter's text is not in the PDF"
    raw_tex = [s for s in ("\\frac", "\\begin{", "\\mathbb", "$$") if s in text]
    assert not raw_tex, f"TeX printed raw (MathJax did not typeset before printing): {raw_tex}"
