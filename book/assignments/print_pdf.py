"""Print built HTML pages of the book to one PDF with headless Chromium (no LaTeX, no network).

``make pdf`` prints every page of the built HTML book (``make book``) in the order of ``_toc.yml``
and joins them into one file with poppler's ``pdfunite``::

    python book/assignments/print_pdf.py --html _build/html --out _build/pdf/kvdro.pdf

(Jupyter Book's one-page ``singlehtml`` builder cannot render MyST-NB's hidden-code cells, so the book is
printed page by page.) ``python book/assignments/print_pdf.py PAGE.html --out X.pdf`` prints one page.

The page's MathJax and Vega are the local copies the book ships (``book/_ext``), so math and charts
are typeset before printing; Chromium runs with networking disabled, as in ``tests/test_browser.py``.
``tests/test_pdf.py`` prints built pages the same way and checks the result.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
OFFLINE_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--allow-file-access-from-files",
    "--no-pdf-header-footer",
]


PRINT_CSS = """<style>
@media print {
  pre, pre code, .highlight pre { white-space: pre-wrap !important; word-break: break-word; overflow: visible !important; }
  .bd-sidebar-primary, .bd-sidebar-secondary, .bd-header, .bd-header-article, .prev-next-area, footer { display: none !important; }
  .cell_output, .output { overflow: visible !important; }
}
</style>"""


def chromium() -> str | None:
    """The path of a Chromium-like browser on PATH, or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def print_page(page: Path, pdf: Path, *, browser: str | None = None, budget_ms: int = 60000, timeout_s: float = 600) -> Path:
    """Print one HTML page to ``pdf``; ``budget_ms`` of virtual time lets MathJax and Vega finish first."""
    browser = browser or chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium on PATH: apt-get install chromium (make pdf prints with it)")
    if not page.is_file():
        raise FileNotFoundError(f"page: {page} does not exist (build the book first)")
    pdf.parent.mkdir(parents=True, exist_ok=True)
    pdf.unlink(missing_ok=True)
    # a copy of the page beside it (so its relative assets resolve) with print rules: code wraps
    # instead of scrolling, and collapsed cells and the sidebars are left out
    printable = page.with_name(page.stem + ".kvdro-print.html")
    printable.write_text(page.read_text(encoding="utf-8").replace("</head>", PRINT_CSS + "</head>", 1), encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            cmd = [browser, *OFFLINE_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
                   f"--print-to-pdf={pdf}", printable.resolve().as_uri()]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    finally:
        printable.unlink(missing_ok=True)
    if run.returncode != 0 or not pdf.is_file() or not pdf.read_bytes().startswith(b"%PDF"):
        raise RuntimeError(f"Chromium did not print {page} to {pdf} (exit {run.returncode}):\n{run.stderr[-2000:]}")
    return pdf


def page_count(pdf: Path) -> int:
    """Pages of a PDF written by Chromium (Skia writes one ``/Type /Page`` dictionary per page)."""
    import re

    return len(re.findall(rb"/Type\s*/Page\b", pdf.read_bytes()))


def toc_pages(root: Path) -> list[str]:
    """The book's pages in reading order (``root``, then every chapter and section of ``_toc.yml``)."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for e in entries or ():
            if "file" in e:
                pages.append(e["file"])
            walk(e.get("sections"))

    for part in toc.get("parts", ()):
        walk(part.get("chapters"))
    return pages


def print_book(html: Path, out: Path, root: Path = Path(__file__).resolve().parents[2], *, jobs: int = 2) -> Path:
    """Print every page of the built book ``html`` (in ``_toc.yml`` order) and join them into ``out``."""
    from concurrent.futures import ThreadPoolExecutor

    unite = shutil.which("pdfunite")
    if unite is None:
        raise FileNotFoundError("no pdfunite on PATH: apt-get install poppler-utils (make pdf joins the pages with it)")
    pages = [html / f"{p}.html" for p in toc_pages(root)]
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"html: {', '.join(missing[:3])} missing (build the book first: make book)")
    with tempfile.TemporaryDirectory() as tmp:
        parts = [Path(tmp) / f"{n:03d}.pdf" for n in range(len(pages))]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda pair: print_page(*pair), zip(pages, parts)))
        out.parent.mkdir(parents=True, exist_ok=True)
        run = subprocess.run([unite, *map(str, parts), str(out)], capture_output=True, text=True)
        if run.returncode != 0 or not out.is_file():
            raise RuntimeError(f"pdfunite could not join {len(parts)} pages into {out}:\n{run.stderr[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, nargs="?", help="one built HTML page (default: the whole book, see --html)")
    parser.add_argument("--html", type=Path, default=Path("_build/html"), help="the built book (make book)")
    parser.add_argument("--out", type=Path, default=Path("_build/pdf/kvdro.pdf"))
    args = parser.parse_args(argv)
    try:
        pdf = print_page(args.page, args.out) if args.page else print_book(args.html, args.out)
    except (FileNotFoundError, RuntimeError) as exc:
        sys.exit(str(exc))
    print(f"{pdf}: {page_count(pdf)} pages, {pdf.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
