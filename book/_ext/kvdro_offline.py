"""Sphinx extension: serve the book's JavaScript locally so every page works with no network.

* Vega, Vega-Lite and Vega-Embed: one bundle made by ``vl-convert`` (the same library versions
  Altair targets), written to ``_static/kvdro-vega.js``. It draws every chart that
  :func:`kvdro.plotting.chart_html` put on the page and removes the static SVG fallback.
* MathJax: the MathJax 2.7 tree shipped by the ``jupyter-server-mathjax`` wheel, copied to
  ``_static/mathjax`` and used instead of the CDN default.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.application import Sphinx

VEGA_FILE = "kvdro-vega.js"
CSS_FILE = "kvdro-layout.css"
# MathJax 2 puts class "math" on its own inner spans; pydata-sphinx-theme's rule for MathJax 3
# (``div.math, span.math {max-width: 100%; overflow: hidden}``) clips them: a display equation wider
# than a phone's column was cut off and could not be scrolled, and accents such as \hat were cut at
# every width. Let inline math and MathJax's spans overflow as MathJax intends, make the display box
# the scroll container, and let long inline code (file paths) wrap (tests/test_browser.py checks that
# nothing is clipped at a phone width). Charts are drawn at a fixed width (kvdro.plotting.WIDTH, to
# fit a laptop's column); on a narrower screen their SVG (which has a viewBox) scales down with the
# column instead of losing its right-hand panel. Output tables (pandas and Styler) get cell padding,
# right-aligned tabular figures and a rule under the header, so that numbers never run together.
# Theorem, proof, exercise and solution boxes (overflow: hidden in the theme) scroll sideways instead
# of cutting off a long inline formula at a phone's width (MathJax 2 does not break inline math).
LAYOUT_CSS = """
span.math, div.math span.math { overflow: visible; max-width: none; }
div.math > .MathJax_Display { overflow-x: auto; overflow-y: hidden; min-width: 0; }
.bd-article p code.literal, .bd-article p code.literal span.pre { white-space: normal; overflow-wrap: anywhere; }
div.kvdro-chart, div.kvdro-vega { max-width: 100%; }
div.kvdro-vega > svg, div.kvdro-fallback > svg { max-width: 100%; height: auto; }
div.kvdro-vega .vega-bindings { max-width: 100%; overflow-wrap: anywhere; }
.bd-article div.cell_output table { border-collapse: collapse; margin: 0.4em 0; }
.bd-article div.cell_output table td, .bd-article div.cell_output table th {
  font-variant-numeric: tabular-nums; padding: 0.15em 0.45em; text-align: right; vertical-align: top; }
.bd-article div.cell_output table thead th { border-bottom: 1px solid var(--pst-color-border); }
.bd-article div.cell_output table tbody th { text-align: left; }
.bd-article div.cell_output table caption { caption-side: top; text-align: left; font-size: 0.9em; }
.bd-article div.admonition, .bd-article div.proof, .bd-article div.solution, .bd-article div.exercise { overflow-x: auto; }
"""
MATHJAX_DIR = "mathjax"
MATHJAX_PATH = f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"

# Runs after the bundle defines vegaEmbed: draw the queued charts, mark each one as rendered.
RENDER_SNIPPET = """
window.vegaEmbed = vegaEmbed;
window.kvdroRender = function () {
  const queue = window.kvdroCharts || [];
  while (queue.length) {
    const id = queue.shift();
    const box = document.getElementById(id);
    if (!box || box.dataset.kvdroRendered) { continue; }
    const spec = JSON.parse(box.querySelector("script.kvdro-spec").textContent);
    vegaEmbed(box.querySelector(".kvdro-vega"), spec, {renderer: "svg", actions: false})
      .then(function () {
        box.dataset.kvdroRendered = "vega";
        const fallback = box.querySelector(".kvdro-fallback");
        if (fallback) { fallback.remove(); }
      })
      .catch(function (err) { box.dataset.kvdroError = String(err); });
  }
};
if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", window.kvdroRender);
} else {
  window.kvdroRender();
}
"""


def _mathjax_source() -> Path:
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def _write_assets(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    import vl_convert

    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    bundle = vl_convert.javascript_bundle(RENDER_SNIPPET)
    (static / VEGA_FILE).write_text("(function () {\n" + bundle + "\n})();\n", encoding="utf-8")
    (static / CSS_FILE).write_text(LAYOUT_CSS.lstrip(), encoding="utf-8")
    target = static / MATHJAX_DIR
    if not target.exists():
        shutil.copytree(_mathjax_source(), target, ignore=shutil.ignore_patterns("*.md", "LICENSE"))


def _use_local_mathjax(app: Sphinx, config) -> None:
    config.mathjax_path = MATHJAX_PATH
    config.mathjax3_config = None
    config.mathjax2_config = {
        "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                    "processEscapes": True, "processClass": "math|output_area", "ignoreClass": "document"},
        # The wheel ships the STIX-Web web fonts only (as Jupyter's classic notebook used them).
        "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None},
        "messageStyle": "none",
    }


def _drop_duplicate_inline_scripts(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """sphinx-thebe registers its inline configuration twice; the second copy is a SyntaxError."""
    seen: set[str] = set()
    unique = []
    for script in context.get("script_files", []):
        body = getattr(script, "attributes", {}).get("body", "") if not isinstance(script, str) else ""
        if body and body in seen:
            continue
        seen.add(body)
        unique.append(script)
    context["script_files"] = unique


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _use_local_mathjax, priority=900)
    app.connect("html-page-context", _drop_duplicate_inline_scripts, priority=1000)
    app.connect("build-finished", _write_assets)
    app.add_js_file(VEGA_FILE)
    app.add_css_file(CSS_FILE)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
