"""`make pdf`: the book printed to PDF by headless Chromium from the built HTML (no LaTeX).

``make pdf`` prints every page of the built book in ``_toc.yml`` order with
``book/assignments/print_pdf.py`` and joins them with poppler's ``pdfunite``; ``make test`` runs it.
This test checks that PDF (whole, every page of the table of contents in it, the text present and TeX
typeset rather than printed raw where ``pdftotext`` is installed) and prints a chapter with
mathematics and charts through the same function.

Without a built book the test skips, unless ``KVDRO_REQUIRE_BOOK=1`` (set by the Makefile), when it
fails. Without Chromium it skips with the reason (``.ci/run`` installs it).
"""

from __future__ import annotations

import importlib.util
import os
import re
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
    page = HTML / "book" / "02_newsvendor.html"
    if not page.exists():
        if os.environ.get("KVDRO_REQUIRE_BOOK") == "1":
            pytest.fail(f"no built book at {HTML}: run `make book` first")
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    return page


def test_makefile_pdf_target_prints_the_built_book_and_make_test_builds_it():
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\npdf:"):]
    target = target[: target.index("\n\n")]
    assert "print_pdf.py --html _build/html --out _build/pdf/kvdro.pdf" in target, target
    site = makefile[makefile.index("\ntest-site:"):].splitlines()[1]
    assert " pdf" in site, site
    test = makefile[makefile.index("\ntest:"):]
    test = test[: test.index("\n\n")]
    assert "test-site" in test, test


def test_toc_pages_in_reading_order():
    pages = print_pdf.toc_pages(ROOT)
    assert pages[0] == "book/intro" and pages[-1] == "book/bibliography"
    chapters = [p for p in pages if p.split("/")[-1][:2].isdigit()]
    assert chapters == sorted(chapters) and len(chapters) == 13, chapters
    assert len(pages) == len(set(pages))


def test_the_book_pdf_is_whole_and_has_every_page():
    pdf = BUILD / "pdf" / "kvdro.pdf"
    if not pdf.is_file():
        if os.environ.get("KVDRO_REQUIRE_BOOK") == "1":
            pytest.fail(f"{pdf} missing: make test runs make pdf first")
        pytest.skip("no book PDF: run `make pdf`")
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF") and b"%%EOF" in data[-2048:], "not a whole PDF"
    pages = print_pdf.toc_pages(ROOT)
    assert print_pdf.page_count(pdf) >= 2 * len(pages), "fewer PDF pages than twice the book's pages"
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext (poppler-utils) missing: the text checks need it")
    text = " ".join(subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout.split())
    # every page's title, in reading order: each found after the one before it
    at, missing = 0, []
    for page in pages:
        h1 = re.search(r"<h1[^>]*>(.*?)</h1>", (HTML / f"{page}.html").read_text(encoding="utf-8"), re.S)
        title = " ".join(re.sub(r"<[^>]+>|#|¶", " ", h1.group(1)).split())[:24] if h1 else ""
        found = text.find(title, at) if title else -1
        if found < 0:
            missing.append(f"{page}: {title!r}")
        else:
            at = found + len(title)
    assert not missing, f"page titles missing from the PDF or out of order: {missing}"


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
        pytest.skip("pdftotext (poppler-utils) missing: the text checks need it")
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "critical fractile" in text.lower(), "the chapter's text is not in the PDF"
    raw_tex = [s for s in ("\\frac", "\\begin{", "\\mathbb", "$$") if s in text]
    assert not raw_tex, f"TeX printed raw (MathJax did not typeset before printing): {raw_tex}"
