"""Print built HTML pages of the book to one PDF with headless Chromium (no LaTeX, no network).

``make pdf`` builds the whole book as one page (``jupyter-book build --builder singlehtml``) and
prints it::

    python book/assignments/print_pdf.py _build/singlehtml/index.html --out _build/pdf/kvdro.pdf

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="built HTML page, e.g. _build/singlehtml/index.html")
    parser.add_argument("--out", type=Path, default=Path("_build/pdf/kvdro.pdf"))
    args = parser.parse_args(argv)
    try:
        pdf = print_page(args.page, args.out)
    except (FileNotFoundError, RuntimeError) as exc:
        sys.exit(str(exc))
    print(f"{pdf}: {page_count(pdf)} pages, {pdf.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
