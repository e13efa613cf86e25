"""The built book works in a real browser with no network.

Each chapter page of ``_build/html`` is opened from disk in headless Chromium with networking
disabled (a dead proxy and a resolver that finds nothing). In the DOM after scripts have run:

* every chart container placed by :mod:`kvdro.plotting` was drawn by the local Vega bundle (marked
  ``data-kvdro-rendered="vega"``, an ``<svg>`` inside, the static fallback gone);
* every piece of mathematics was typeset by the local MathJax, with no TeX errors.

The static HTML is also checked: no script is loaded from another host, and no cell output is a
traceback (IPython prints, rather than raises, an exception thrown while *displaying* a chart).

Run by ``make test`` after ``make book``. Without a built book the tests skip, unless
``KVDRO_REQUIRE_BOOK=1`` (set by the Makefile), when they fail. Without Chromium they skip with the
reason; ``.ci/run`` installs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

bs4 = pytest.importorskip("bs4")

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
OFFLINE_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--virtual-time-budget=20000",
]


def toc_chapters() -> list[str]:
    """Doc names (e.g. ``book/02_newsvendor``) of every file in ``_toc.yml``."""
    return re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text())


def built_pages() -> list[Path]:
    if not (HTML / "index.html").exists():
        if os.environ.get("KVDRO_REQUIRE_BOOK") == "1":
            pytest.fail(f"no built book at {HTML}: run `make book` first")
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    pages = [HTML / f"{doc}.html" for doc in toc_chapters()]
    missing = [p for p in pages if not p.exists()]
    assert not missing, f"chapters in _toc.yml without a built page: {missing}"
    return pages


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")


def rendered_dom(page: Path) -> bs4.BeautifulSoup:
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium(), *OFFLINE_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, f"chromium failed on {page}: {result.stderr[-2000:]}"
    return bs4.BeautifulSoup(result.stdout, "html.parser")


def static_dom(page: Path) -> bs4.BeautifulSoup:
    return bs4.BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")


@pytest.fixture(scope="module")
def pages() -> list[Path]:
    return built_pages()


def test_every_chapter_page_renders_charts_and_math_offline(pages):
    problems = []
    charts_seen = 0
    for page in pages:
        before = static_dom(page)
        n_charts = len(before.select("div.kvdro-chart"))
        n_math = len(before.select(".math"))
        if n_charts == 0 and n_math == 0:
            continue
        dom = rendered_dom(page)
        charts = dom.select("div.kvdro-chart")
        if len(charts) != n_charts:
            problems.append(f"{page.name}: {n_charts} charts in the HTML, {len(charts)} after scripts ran")
        for chart in charts:
            if chart.get("data-kvdro-rendered") != "vega" or not chart.select(".kvdro-vega svg"):
                problems.append(f"{page.name}: chart {chart.get('id')} not drawn ({chart.get('data-kvdro-error')})")
            if chart.select(".kvdro-fallback"):
                problems.append(f"{page.name}: chart {chart.get('id')} still shows its static fallback")
        charts_seen += len(charts)
        if n_math:
            typeset = dom.select(".MathJax, .MathJax_Display, .MathJax_CHTML, mjx-container")
            if not typeset:
                problems.append(f"{page.name}: {n_math} math elements, none typeset by MathJax")
            if dom.select(".MathJax_Error, merror"):
                problems.append(f"{page.name}: MathJax reported a TeX error")
    assert problems == [], "\n".join(problems)
    code_chapters = [d for d in toc_chapters() if "{code-cell}" in (ROOT / f"{d}.md").read_text()]
    if code_chapters:
        assert charts_seen > 0, "the book executes code but shows no chart at all"


def test_no_script_from_another_host(pages):
    remote = []
    for page in [HTML / "index.html", *pages]:
        for script in static_dom(page).find_all("script", src=True):
            if re.match(r"^(https?:)?//", script["src"]):
                remote.append(f"{page.name}: {script['src']}")
    assert remote == []


def test_no_output_is_a_traceback(pages):
    bad = [p.name for p in pages if "Traceback (most recent call last)" in p.read_text(encoding="utf-8")]
    assert bad == [], f"pages showing a Python traceback in an output: {bad}"


def test_chart_ids_are_stable_hashes(pages):
    ids = [c.get("id") for p in pages for c in static_dom(p).select("div.kvdro-chart")]
    assert all(re.fullmatch(r"kvdro-chart-[0-9a-f]{16}", i or "") for i in ids)


def test_local_assets_exist():
    built_pages()
    assert (HTML / "_static" / "kvdro-vega.js").stat().st_size > 100_000
    assert (HTML / "_static" / "mathjax" / "MathJax.js").exists()
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["config"]["nitpicky"] is True


def test_every_solution_is_collapsed(pages):
    """Students try first: each sphinx-exercise solution renders as a closed dropdown."""
    open_solutions = []
    for page in pages:
        for sol in static_dom(page).select("div.solution"):
            if "dropdown" not in sol.get("class", []):
                open_solutions.append(f"{page.name}: {sol.get('id')}")
    assert open_solutions == []
    n_exercises = sum(len(static_dom(p).select("div.exercise")) for p in pages)
    n_solutions = sum(len(static_dom(p).select("div.solution")) for p in pages)
    assert n_solutions == n_exercises > 0
