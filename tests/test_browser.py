"""The built book works in a real browser with no network.

Each chapter page of ``_build/html`` is opened from disk in headless Chromium with networking
disabled (a dead proxy and a resolver that finds nothing), once: a copy of the page that measures
itself (below) is loaded in a frame 1280 px wide, measured, then the frame is resized to 400 px and
measured again. In the DOM after the page's own scripts have run:

* every chart container placed by :mod:`kvdro.plotting` was drawn by the local Vega bundle (marked
  ``data-kvdro-rendered="vega"``, an ``<svg>`` inside, the static fallback gone);
* every piece of mathematics was typeset by the local MathJax, with no TeX errors.

The static HTML is also checked: no script is loaded from another host, and no cell output is a
traceback (IPython prints, rather than raises, an exception thrown while *displaying* a chart).

Layout, measured in the browser (the copy of the page measures itself once charts and MathJax are
done, with every collapsed block opened -- a reader can open a hidden output or a solution, so it
must fit too):

* at a laptop window (1280 px) no display equation and no chart reaches outside the article's text
  column (a cut-off equation or a chart whose legend hides behind a scrollbar fails), and no table,
  printed output line or output image is wider than the column, nor does a table's box (or the
  scroll container around it) scroll sideways (no sideways scrolling to read a result);
* no table cell and no printed output shows NaN (write "–", or leave a missing value out);
* at a phone width (400 px) nothing inside the article is clipped (an element that hides overflow
  while its content is wider, or content sticking out of the screen with no scroll container to
  reach it); a wide display equation or table may scroll inside its own box; every chart shrinks to
  the column (a fixed-width chart loses its right-hand panel); no table is squeezed to less than half
  the width its content needs (a sliver of one-word lines).

Each failure names the page, the element (table by its header row and section, output by its longest
line, chart by id and section) and by how many px it is too wide. Self-tests inject each kind of
fault (a wide equation, chart, table, printed line; a fixed-width chart and a squeezed table at
400 px), all at once, into a copy of a built page and check that the measurement reports each, and
that the frame really was resized, so the layout tests cannot pass by measuring nothing.

Run by ``make test`` after ``make book``. Without a built book the tests skip, unless
``KVDRO_REQUIRE_BOOK=1`` (set by the Makefile), when they fail. ``KVDRO_BOOK_HTML`` points the tests
at another build (e.g. ``jupyter-book build --path-output /tmp/jb`` -> ``/tmp/jb/_build/html``);
``KVDRO_BOOK_PAGES=01_,04_`` checks only the pages whose name contains one of these (for one chapter).
Without Chromium they skip with the reason; ``.ci/run`` installs it.
"""

from __future__ import annotations

import functools
import html as html_lib
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

bs4 = pytest.importorskip("bs4")

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("KVDRO_BOOK_HTML") or ROOT / "_build" / "html")
LAPTOP_PX = 1280
PHONE_PX = 400
#: Headless Chromiums at once (each page load renders in its own browser and profile).
BROWSER_WORKERS = 2
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
    docs = toc_chapters()
    only = [s.strip() for s in os.environ.get("KVDRO_BOOK_PAGES", "").split(",") if s.strip()]
    if only:  # e.g. KVDRO_BOOK_PAGES=01_,02_ : the pages whose doc name contains one of these
        docs = [d for d in docs if any(s in d for s in only)]
        assert docs, f"KVDRO_BOOK_PAGES={only} matches no page of _toc.yml"
    pages = [HTML / f"{doc}.html" for doc in docs]
    missing = [p for p in pages if not p.exists()]
    assert not missing, f"chapters in _toc.yml without a built page: {missing}"
    return pages


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")


@functools.lru_cache(maxsize=None)
def static_dom(page: Path) -> bs4.BeautifulSoup:
    """The page as built (parsed once; read, never changed, by the tests)."""
    return bs4.BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")


@pytest.fixture(scope="module")
def pages() -> list[Path]:
    return built_pages()


def test_every_chapter_page_renders_charts_and_math_offline(pages):
    problems = []
    charts_seen = 0
    expected = {}
    for page in pages:
        before = static_dom(page)
        n_charts, n_math = len(before.select("div.kvdro-chart")), len(before.select(".math"))
        if n_charts or n_math:
            expected[page] = (n_charts, n_math)
    measure_all(list(expected))
    for page, (n_charts, n_math) in expected.items():
        render = measured_layout(page, LAPTOP_PX)["render"]
        charts = render["charts"]
        if len(charts) != n_charts:
            problems.append(f"{page.name}: {n_charts} charts in the HTML, {len(charts)} after scripts ran")
        for chart in charts:
            if chart["rendered"] != "vega" or not chart["svg"]:
                problems.append(f"{page.name}: chart {chart['id']} not drawn ({chart['error']})")
            if chart["fallback"]:
                problems.append(f"{page.name}: chart {chart['id']} still shows its static fallback")
        charts_seen += len(charts)
        if n_math:
            if not render["typeset"]:
                problems.append(f"{page.name}: {n_math} math elements, none typeset by MathJax")
            if render["tex_errors"]:
                problems.append(f"{page.name}: MathJax reported a TeX error")
    assert problems == [], "\n".join(problems)
    tested = {p.relative_to(HTML).with_suffix("").as_posix() for p in pages}
    code_chapters = [d for d in tested if "{code-cell}" in (ROOT / f"{d}.md").read_text()]
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


#: What a reader must never see in a page: our shell (a developer's interpreter path, the data folder
#: of our checkout on a command line) or an absolute path of the machine that built the book. (Setting
#: ``KVDRO_DATA_DIR`` to a placeholder such as ``/path/to/traces`` is an instruction to the reader.)
DEVELOPER_STRINGS = re.compile(r"\.venv/bin/python|KVDRO_DATA_DIR=\.\./\S*|/work/main/|/work/shared/")


def developer_strings(text: str) -> list[str]:
    """Each match of :data:`DEVELOPER_STRINGS` in a page's visible text (scripts and styles left out)."""
    soup = bs4.BeautifulSoup(text, "html.parser")
    for tag in soup(["script", "style"]):
        tag.decompose()
    return DEVELOPER_STRINGS.findall(soup.get_text(" "))


def test_the_developer_string_guard_sees_a_command_line():
    assert developer_strings("<pre>KVDRO_DATA_DIR=../shared/data .venv/bin/python -m kvdro.bench</pre>") == [
        "KVDRO_DATA_DIR=../shared/data", ".venv/bin/python"]
    assert developer_strings("<pre>export KVDRO_DATA_DIR=/path/to/traces</pre>") == []
    assert developer_strings("<p>python -m kvdro.bench exact</p><script>'/work/main/'</script>") == []


def test_no_page_prints_a_developer_command_line_or_path(pages):
    """Outputs and prose show results and the commands a reader types, not our shell (issue 34)."""
    bad = {p.name: found for p in pages if (found := developer_strings(p.read_text(encoding="utf-8")))}
    assert bad == {}, f"pages showing a developer command line or path: {bad}"


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


# ------------------------------------------------------------------------------------ layout

MEASURE_JS = r"""
<script>
(function () {
  function rect(el) { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width}; }
  function describe(el) {
    let p = el, path = [];
    for (let i = 0; i < 3 && p; i++) { path.push(p.tagName.toLowerCase() + (p.id ? "#" + p.id : "") + (p.className && p.className.toString ? "." + p.className.toString().trim().split(/\s+/).slice(0, 2).join(".") : "")); p = p.parentElement; }
    return path.join(" < ") + " '" + (el.textContent || "").trim().slice(0, 50) + "'";
  }
  function squash(s, n) { s = (s || "").replace(/\s+/g, " ").trim(); return s.length > n ? s.slice(0, n - 1) + "…" : s; }
  function section(el) {
    for (let p = el; p; p = p.parentElement) {
      if (p.tagName === "SECTION" && p.id) { return "§" + p.id; }
    }
    return "§top";
  }
  function labelTable(t, n) {
    const cap = t.querySelector("caption");
    const head = t.querySelector("thead tr") || t.querySelector("tr");
    return "table " + n + " (" + section(t) + ") '" + squash((cap ? cap.textContent + " | " : "") + (head ? Array.from(head.children).map(function (c) { return c.textContent.trim(); }).join(" | ") : ""), 70) + "'";
  }
  function longestLine(text) {
    let best = "";
    text.split("\n").forEach(function (l) { if (l.length > best.length) { best = l; } });
    return best;
  }
  function scrolls(el, stop) {
    for (let p = el.parentElement; p && p !== stop; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll") { return true; }
    }
    return false;
  }
  function rendered() {  // what the page's own scripts drew: Vega charts, MathJax
    const charts = [];
    document.querySelectorAll("div.kvdro-chart").forEach(function (c) {
      charts.push({id: c.id, rendered: c.getAttribute("data-kvdro-rendered"), svg: !!c.querySelector(".kvdro-vega svg"),
                   fallback: !!c.querySelector(".kvdro-fallback"), error: c.getAttribute("data-kvdro-error")});
    });
    return {charts: charts, typeset: document.querySelectorAll(".MathJax, .MathJax_Display, .MathJax_CHTML, mjx-container").length,
            tex_errors: document.querySelectorAll(".MathJax_Error, merror").length};
  }
  function measure() {
    const art = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
    const cs = getComputedStyle(art), a = art.getBoundingClientRect();
    const column = {left: a.left + parseFloat(cs.paddingLeft), right: a.right - parseFloat(cs.paddingRight)};
    const out = {viewport: window.innerWidth, column: column, charts: [], math: [], tables: [], outputs: [], images: [], clipped: [], offscreen: [],
                 render: rendered()};
    document.querySelectorAll("div.kvdro-chart").forEach(function (c) {
      const svg = c.querySelector(".kvdro-vega svg") || c.querySelector("svg");
      out.charts.push(Object.assign({id: c.id + " (" + section(c) + ")"}, rect(svg || c)));
    });
    document.querySelectorAll("div.math").forEach(function (d) {
      let left = Infinity, right = -Infinity;
      d.querySelectorAll("*").forEach(function (e) {
        if (e.closest(".MJX_Assistive_MathML")) { return; }
        const r = e.getBoundingClientRect();
        if (r.width > 0) { left = Math.min(left, r.left); right = Math.max(right, r.right); }
      });
      out.math.push({id: d.id || describe(d), left: left, right: right, typeset: right > -Infinity});
    });
    let n = 0;
    art.querySelectorAll("table").forEach(function (t) {
      if (t.closest(".MathJax, .MathJax_Display, mjx-container, div.kvdro-chart, div.cell_input")) { return; }
      const r = t.getBoundingClientRect();
      n += 1;
      if (r.width === 0) { return; }  // inside a collapsed cell or dropdown: not on the page
      // the width its content asks for: a hidden copy laid out at max-content beside it
      const copy = t.cloneNode(true);
      copy.removeAttribute("id");
      copy.style.cssText += ";position:absolute;visibility:hidden;left:0;top:0;width:max-content;max-width:none";
      t.parentElement.appendChild(copy);
      const natural = copy.getBoundingClientRect().width;
      copy.remove();
      // a table whose own box (or the scroll container wrapped around it) scrolls sideways
      let scroll = t.scrollWidth - t.clientWidth;
      for (let p = t.parentElement; p && p !== art; p = p.parentElement) {
        const o = getComputedStyle(p).overflowX;
        if (o === "auto" || o === "scroll") { scroll = Math.max(scroll, p.scrollWidth - p.clientWidth); break; }
      }
      out.tables.push(Object.assign({id: labelTable(t, n), natural: natural, scroll: Math.max(0, scroll)}, rect(t)));
    });
    art.querySelectorAll("div.cell_output pre, div.output pre").forEach(function (pre) {
      const r = pre.getBoundingClientRect();
      if (r.width === 0) { return; }
      out.outputs.push({id: "output (" + section(pre) + ") '" + squash(longestLine(pre.textContent), 60) + "'",
                        left: r.left, right: r.right, width: r.width, scroll: pre.scrollWidth - pre.clientWidth});
    });
    art.querySelectorAll("div.cell_output img, div.output img").forEach(function (img) {
      const r = img.getBoundingClientRect();
      if (r.width === 0) { return; }
      out.images.push(Object.assign({id: "image (" + section(img) + ") " + squash(img.getAttribute("alt") || img.getAttribute("src"), 50)}, rect(img)));
    });
    const clipping = new Set(), blocks = new Set();
    art.querySelectorAll("*").forEach(function (el) {
      if (el.closest(".MJX_Assistive_MathML")) { return; }
      const s = getComputedStyle(el);
      if ((s.overflowX === "hidden" || s.overflowX === "clip") && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
        clipping.add(el);
        out.clipped.push(describe(el) + " (" + el.scrollWidth + " px in " + el.clientWidth + " px)");
      }
    });
    art.querySelectorAll("*").forEach(function (el) {
      if (el.children.length || el.closest(".MJX_Assistive_MathML")) { return; }
      if (el.getBoundingClientRect().right <= window.innerWidth + 1 || scrolls(el, document.body)) { return; }
      for (let p = el.parentElement; p; p = p.parentElement) { if (clipping.has(p)) { return; } }
      const block = el.closest("p, li, td, th, pre, table, figure, dd, dt, div.math, div.cell_output") || el;
      if (!blocks.has(block)) { blocks.add(block); out.offscreen.push(describe(block)); }
    });
    parent.postMessage(JSON.stringify(out), "*");
  }
  function openAll() {  // what a reader can open is measured open: hidden outputs, solutions
    document.querySelectorAll("article details").forEach(function (d) { d.open = true; });
    document.querySelectorAll("article .toggle-hidden").forEach(function (e) { e.classList.remove("toggle-hidden"); });
  }
  window.addEventListener("load", function () { setTimeout(function () { openAll(); setTimeout(measure, 1000); }, 7000); });
  // the wrapper resized the frame to the next width: let the layout (and any chart listening) settle, measure again
  window.addEventListener("message", function (e) { if (e.data === "kvdro-remeasure") { setTimeout(measure, 1500); } });
})();
</script>
"""

WRAPPER = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="kvdro-frame" src="{src}" style="border:0;width:{first}px;height:1000px"></iframe>
<script>const widths = {widths}; let measured = 0;
window.addEventListener("message", function (e) {{
  const p = document.createElement("pre"); p.className = "kvdro-layout"; p.textContent = e.data; document.body.appendChild(p);
  measured += 1;
  if (measured < widths.length) {{
    const frame = document.getElementById("kvdro-frame");
    frame.style.width = widths[measured] + "px";
    frame.contentWindow.postMessage("kvdro-remeasure", "*");
  }}
}});</script></body></html>"""

#: The widths every page is measured at, in this order, in one page load (the frame is resized between them).
WIDTHS = (LAPTOP_PX, PHONE_PX)
_LAYOUTS: dict[tuple[Path, str], dict[int, dict]] = {}


def measured_layouts(page: Path, *, inject: str = "") -> dict[int, dict]:
    """Geometry of ``page`` at each width of :data:`WIDTHS` -- the article's text column, every chart,
    display equation, table (and the width its content asks for), printed output and output image
    (left/right edges, px), what is clipped (module docstring) -- and what its scripts drew (``render``:
    each chart's Vega state, the number of MathJax-typeset elements, TeX errors). One headless Chromium
    loads a copy of the page (``inject`` placed at the top of its article) in a frame of the first
    width, measures once charts and MathJax are done, resizes the frame to the next width and measures
    again. Memoised per (page, inject)."""
    key = (page, inject)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    text = page.read_text(encoding="utf-8")
    text = text.replace("<head>", f'<head><base href="{page.parent.as_uri()}/">', 1)
    if inject:
        text = text.replace('<article class="bd-article">', '<article class="bd-article">' + inject, 1)
    text = text.replace("</body>", MEASURE_JS + "</body>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / page.name
        copy.write_text(text, encoding="utf-8")
        wrapper = Path(tmp) / "wrapper.html"
        wrapper.write_text(WRAPPER.format(src=copy.as_uri(), first=WIDTHS[0], widths=json.dumps(list(WIDTHS))), encoding="utf-8")
        result = subprocess.run(
            [chromium(), *OFFLINE_FLAGS, "--window-size=1400,1100", "--allow-file-access-from-files",
             f"--user-data-dir={tmp}/profile", "--dump-dom", wrapper.as_uri()],
            capture_output=True,
            text=True,
            timeout=180,
        )
    found = [json.loads(html_lib.unescape(m)) for m in re.findall(r'<pre class="kvdro-layout">(.*?)</pre>', result.stdout, re.S)]
    layouts = {round(layout["viewport"]): layout for layout in found}
    missing = [w for w in WIDTHS if w not in layouts]
    assert not missing, (f"{page.name}: no layout measured at {missing} px (measured at {sorted(layouts)}; "
                         f"chromium: {result.stderr[-1000:]})")
    _LAYOUTS[key] = layouts
    return layouts


def measured_layout(page: Path, width: int, *, inject: str = "") -> dict:
    """:func:`measured_layouts` at one of :data:`WIDTHS`."""
    return measured_layouts(page, inject=inject)[width]


def measure_all(pages: list[Path]) -> None:
    """Measure ``pages`` (:data:`BROWSER_WORKERS` Chromiums at a time) into the memo."""
    with ThreadPoolExecutor(BROWSER_WORKERS) as pool:
        list(pool.map(measured_layouts, pages))


def _outside(item: dict, col: dict) -> float:
    """How far [px] an element reaches outside the column, on the worse side (<= 0: inside)."""
    return max(item["right"] - col["right"], col["left"] - item["left"])


def overflows(layout: dict, tolerance: float = 1.0) -> list[str]:
    """Charts and display equations that reach outside the text column."""
    col = layout["column"]
    bad = []
    for kind in ("charts", "math"):
        for item in layout[kind]:
            if kind == "math" and not item["typeset"]:
                bad.append(f"equation {item['id']} was not typeset")
            elif item["right"] > col["right"] + tolerance or item["left"] < col["left"] - tolerance:
                over = max(item["right"] - col["right"], col["left"] - item["left"])
                bad.append(f"{kind[:-1] if kind == 'charts' else 'equation'} {item['id']}: {over:.0f} px outside the column")
    return bad


def wide_content(layout: dict, tolerance: float = 1.0) -> list[str]:
    """Tables, printed outputs and output images wider than the text column (a laptop must not
    scroll sideways to read a result). Each line names the element and by how many px it is too wide."""
    col = layout["column"]
    width = col["right"] - col["left"]
    bad = []
    for t in layout["tables"]:
        if _outside(t, col) > tolerance:
            bad.append(f"{t['id']}: {_outside(t, col):.0f} px wider than the column ({t['width']:.0f} px in {width:.0f} px)")
        elif t.get("scroll", 0) > tolerance:
            bad.append(f"{t['id']}: its box scrolls sideways by {t['scroll']:.0f} px (content wider than the column)")
    for o in layout["outputs"]:
        over = max(o["scroll"], _outside(o, col))
        if over > tolerance:
            bad.append(f"{o['id']}: printed line {over:.0f} px wider than the column (scrolls sideways)")
    for img in layout["images"]:
        if _outside(img, col) > tolerance:
            bad.append(f"{img['id']}: {_outside(img, col):.0f} px wider than the column")
    return bad


def squeezed_at_phone_width(layout: dict, tolerance: float = 1.0) -> list[str]:
    """At a phone width: charts that do not shrink to the column (a fixed-width chart loses its
    right-hand panel), and tables squeezed to less than half the width their content needs (and
    than the column) -- a sliver of one-word lines. A wide table may scroll inside its own box."""
    col = layout["column"]
    width = col["right"] - col["left"]
    bad = []
    for c in layout["charts"]:
        if _outside(c, col) > tolerance:
            bad.append(f"chart {c['id']}: does not shrink, {_outside(c, col):.0f} px wider than the {width:.0f} px column")
    for t in layout["tables"]:
        if t["width"] < 0.5 * min(t["natural"], width):
            bad.append(f"{t['id']}: squeezed to {t['width']:.0f} px (its content needs {t['natural']:.0f} px, the column is {width:.0f} px)")
    return bad


NAN_CELL = re.compile(r"^(nan|NaN|<NA>|NaT)$")
NAN_TOKEN = re.compile(r"(?<![\w.])(nan|NaN|<NA>|NaT)(?![\w])")


def nan_cells(dom: bs4.BeautifulSoup) -> list[str]:
    """Table cells and printed outputs showing NaN (write "–" or leave the value out)."""
    article = dom.select_one("article.bd-article") or dom
    bad = []
    for i, table in enumerate(article.find_all("table"), start=1):
        if table.find_parent(class_="cell_input"):
            continue
        cells = [c.get_text(" ", strip=True) for c in table.find_all(["td", "th"])]
        hits = [c for c in cells if NAN_CELL.match(c)]
        if hits:
            head = " | ".join(c.get_text(" ", strip=True) for c in (table.find("tr") or table).find_all(["th", "td"]))[:70]
            bad.append(f"table {i} '{head}': {len(hits)} cell(s) read NaN")
    for pre in article.select("div.cell_output pre, div.output pre"):
        for line in pre.get_text().splitlines():
            if NAN_TOKEN.search(line):
                bad.append(f"output line shows NaN: '{line.strip()[:80]}'")
                break
    return bad


def layout_pages(pages: list[Path], measure: bool = False) -> list[Path]:
    """The pages with something to measure; with ``measure``, their layouts measured and memoised first."""
    chosen = [p for p in pages if static_dom(p).select("div.kvdro-chart, div.math, table, div.cell_output")]
    if measure:
        measure_all(chosen)
    return chosen


def test_no_equation_or_chart_overflows_the_column_at_laptop_width(pages):
    problems = []
    for page in layout_pages(pages, measure=True):
        layout = measured_layout(page, LAPTOP_PX)
        problems += [f"{page.name}: {p}" for p in overflows(layout)]
    assert problems == [], f"at {LAPTOP_PX} px:\n" + "\n".join(problems)


def test_no_table_or_output_is_wider_than_the_column_at_laptop_width(pages):
    problems = []
    for page in layout_pages(pages, measure=True):
        problems += [f"{page.name}: {p}" for p in wide_content(measured_layout(page, LAPTOP_PX))]
    assert problems == [], f"at {LAPTOP_PX} px ({len(problems)}):\n" + "\n".join(problems)


def test_no_table_cell_or_output_shows_nan(pages):
    problems = [f"{page.name}: {p}" for page in pages for p in nan_cells(static_dom(page))]
    assert problems == [], "\n".join(problems)


def test_nothing_is_clipped_at_phone_width(pages):
    problems = []
    for page in layout_pages(pages, measure=True):
        layout = measured_layout(page, PHONE_PX)
        problems += [f"{page.name}: clipped {c}" for c in layout["clipped"]]
        problems += [f"{page.name}: off the screen {c}" for c in layout["offscreen"]]
        problems += [f"{page.name}: {p}" for p in squeezed_at_phone_width(layout)]
    assert problems == [], f"at {PHONE_PX} px ({len(problems)}):\n" + "\n".join(problems)


WIDE_TABLE = ('<table id="kvdro-wide-table"><thead><tr>' + "".join(f"<th>column{i}</th>" for i in range(40))
              + "</tr></thead><tbody><tr>" + "".join(f"<td>{i * 1000.5}</td>" for i in range(40)) + "</tr></tbody></table>")
WIDE_OUTPUT = ('<div class="cell_output docutils container"><div class="output stream highlight-myst-ansi notranslate">'
               '<div class="highlight"><pre><span></span>kvdro-wide-output ' + "x" * 300 + "</pre></div></div></div>")
BOXED_TABLE = ('<div style="overflow-x:auto"><table id="kvdro-boxed-table" style="width:100%;table-layout:fixed"><thead><tr>'
               "<th>boxcol0</th><th>boxcol1</th></tr></thead><tbody><tr><td>" + "w" * 400 + "</td><td>x</td></tr></tbody></table></div>")
SLIVER_TABLE = ('<div style="width:60px"><table id="kvdro-sliver"><tr><td>kvdro-sliver: a long sentence in a table squeezed into a narrow box</td>'
                "<td>another cell that needs room to be read</td></tr></table></div>")


WIDE_MATH = ('<div class="math notranslate nohighlight" id="kvdro-wide-eq">\\[' + " + ".join(f"x_{{{i}}}" for i in range(120))
             + "\\]</div>")
WIDE_CHART = ('<div class="kvdro-chart" id="kvdro-chart-wide" data-kvdro-rendered="vega"><div class="kvdro-vega">'
              '<svg width="1500" height="20" style="max-width:none"></svg></div></div>')
FIXED_CHART = ('<div class="kvdro-chart" id="kvdro-chart-fixed" data-kvdro-rendered="vega"><div class="kvdro-vega" style="overflow-x:auto">'
               '<svg width="700" height="20" style="max-width:none"></svg></div></div>')
#: Every injected fault at once: one page load measures them all, at both widths.
FAULTS = WIDE_MATH + WIDE_CHART + WIDE_TABLE + WIDE_OUTPUT + BOXED_TABLE + FIXED_CHART + SLIVER_TABLE


def faulty_layout(pages: list[Path], width: int) -> dict:
    """The layout at ``width`` of a copy of the first measurable page with :data:`FAULTS` injected."""
    page = layout_pages(pages)[0] if layout_pages(pages) else pages[0]
    return measured_layout(page, width, inject=FAULTS)


def test_layout_measurement_catches_a_wide_equation_and_chart(pages):
    """An equation and a chart too wide for any column, injected into a copy of a page: both reported.
    (The book's CSS scales a chart's SVG down to the column; the injected one opts out of it.)"""
    found = overflows(faulty_layout(pages, LAPTOP_PX))
    assert any("kvdro-wide-eq" in f for f in found), found
    assert any("kvdro-chart-wide" in f for f in found), found


def test_layout_measurement_catches_a_wide_table_and_a_long_printed_line(pages):
    """The laptop-width check reports a too-wide table and a printed line that scrolls, by name and px."""
    found = wide_content(faulty_layout(pages, LAPTOP_PX))
    assert any("column0 | column1" in f and "px wider than the column" in f for f in found), found
    assert any("kvdro-wide-output" in f and "printed line" in f for f in found), found


def test_layout_measurement_catches_a_table_that_scrolls_in_its_box(pages):
    """A table that fits the column but whose content scrolls sideways inside its box is reported."""
    found = wide_content(faulty_layout(pages, LAPTOP_PX))
    assert any("boxcol0 | boxcol1" in f and "scrolls sideways" in f for f in found), found


def test_phone_measurement_catches_a_fixed_width_chart_and_a_sliver_table(pages):
    """At 400 px (the frame resized after the laptop measurement) a chart that keeps its 700 px and a
    table squeezed to a sliver are both reported."""
    found = squeezed_at_phone_width(faulty_layout(pages, PHONE_PX))
    assert any("kvdro-chart-fixed" in f and "does not shrink" in f for f in found), found
    assert any("kvdro-sliver" in f and "squeezed to" in f for f in found), found


def test_the_frame_is_really_resized_between_the_two_measurements(pages):
    """The phone measurement is not the laptop one read twice: the column is narrower, within the frame."""
    laptop, phone = faulty_layout(pages, LAPTOP_PX), faulty_layout(pages, PHONE_PX)
    assert laptop["viewport"] == LAPTOP_PX and phone["viewport"] == PHONE_PX
    assert phone["column"]["right"] - phone["column"]["left"] < PHONE_PX < laptop["column"]["right"] - laptop["column"]["left"]
