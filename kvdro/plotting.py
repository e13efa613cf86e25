"""One Altair theme and an offline renderer for every chart in the book.

Altair's default renderers load Vega from a CDN, which breaks a book read offline. Here a chart is
rendered as HTML that

* holds the Vega-Lite spec in a ``<script type="application/json">`` element,
* shows a static SVG (rendered by ``vl-convert``) as a fallback until JavaScript runs, and
* is drawn interactively by one local Vega bundle (``_static/kvdro-vega.js``, written into the
  built book by ``book/_ext/kvdro_offline.py`` from ``vl-convert``), so sliders and tooltips work
  with no network.

Chart ids are a hash of the spec, so outputs do not change from run to run. The mimebundle also
carries the Vega-Lite spec for JupyterLab's own renderer.

Use it once per chapter::

    import kvdro.plotting
    kvdro.plotting.enable()
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import altair as alt

THEME_NAME = "kvdro"
RENDERER_NAME = "kvdro_offline"

#: Okabe-Ito colour-blind-safe palette; the first colour is the "robust" (DRO) colour throughout.
PALETTE: tuple[str, ...] = (
    "#0072B2",  # blue   -- DRO / robust
    "#E69F00",  # orange -- SAA / empirical
    "#009E73",  # green
    "#D55E00",  # vermillion
    "#CC79A7",  # purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)
FONT = "Helvetica, Arial, sans-serif"
#: Width of the book's text column [px] at a 1280 px browser window, measured in the built HTML
#: (pydata-sphinx-theme / sphinx-book-theme: the article's content box; tests/test_browser.py).
COLUMN_PX = 676
#: Default *total* width of a chart [px], axis titles, legend and title included: the theme sizes
#: single-view charts with ``autosize: fit``, so the whole chart is WIDTH wide and leaves a margin in
#: the column. Concatenated or faceted charts are laid out by Vega-Lite ("pad"): give each panel a
#: width so that the panels together stay within WIDTH.
WIDTH = 620
HEIGHT = 300


def kvdro_theme() -> alt.theme.ThemeConfig:
    """The book's chart theme: colour-blind palette, readable fonts, a chart that fits the column.

    Single views are ``autosize: fit`` (the plot area shrinks so that axes, legend and title fit in
    WIDTH); legends sit below the plot, in rows of at most three entries, so they never widen it.
    """
    return {
        "config": {
            "autosize": {"type": "fit", "contains": "padding"},
            "padding": 5,
            "view": {"continuousWidth": WIDTH, "continuousHeight": HEIGHT, "stroke": None},
            "range": {"category": list(PALETTE)},
            "font": FONT,
            "title": {"fontSize": 15, "anchor": "start", "fontWeight": "normal", "limit": WIDTH - 10},
            "axis": {
                "labelFontSize": 12,
                "titleFontSize": 13,
                "titleFontWeight": "normal",
                "gridColor": "#e6e6e6",
                "domainColor": "#888888",
                "tickColor": "#888888",
            },
            "legend": {
                "labelFontSize": 12,
                "titleFontSize": 13,
                "titleFontWeight": "normal",
                "orient": "bottom",
                "direction": "horizontal",
                "columns": 3,
                "labelLimit": 160,
            },
            "mark": {"color": PALETTE[0]},
            "line": {"strokeWidth": 2},
            "point": {"size": 50, "filled": True},
        }
    }


alt.theme.register(THEME_NAME, enable=False)(kvdro_theme)


def rendered_width(chart: alt.TopLevelMixin | dict[str, Any]) -> float:
    """Total width [px] of a chart as drawn (axes, legend, title included), from its static SVG."""
    import re

    spec = chart if isinstance(chart, dict) else chart.to_dict()
    match = re.search(r'<svg[^>]*\swidth="([\d.]+)"', static_svg(spec))
    if match is None:
        raise ValueError("chart: the rendered SVG has no width")
    return float(match.group(1))


def chart_id(spec: dict[str, Any]) -> str:
    """A stable element id: a hash of the spec (so rebuilding the book changes nothing)."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return f"kvdro-chart-{digest[:16]}"


def static_svg(spec: dict[str, Any]) -> str:
    """The chart as an SVG string, rendered in-process by vl-convert (no browser, no network)."""
    import vl_convert

    return vl_convert.vegalite_to_svg(spec)


def chart_html(spec: dict[str, Any]) -> str:
    """HTML for one chart: static SVG fallback, the spec as JSON, and a hook for the Vega bundle."""
    cid = chart_id(spec)
    spec_json = json.dumps(spec, sort_keys=True).replace("</", "<\\/")
    return (
        f'<div class="kvdro-chart" id="{cid}">'
        f'<div class="kvdro-fallback" role="img" aria-label="static chart">{static_svg(spec)}</div>'
        f'<div class="kvdro-vega"></div>'
        f'<script type="application/json" class="kvdro-spec">{spec_json}</script>'
        f"<script>(window.kvdroCharts = window.kvdroCharts || []).push({json.dumps(cid)});"
        f" if (window.kvdroRender) {{ window.kvdroRender(); }}</script>"
        f"</div>"
    )


def render_offline(spec: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Altair renderer: a mimebundle with offline HTML plus the raw Vega-Lite spec for JupyterLab."""
    mime = f"application/vnd.vegalite.v{alt.SCHEMA_VERSION.split('.')[0].lstrip('v')}+json"
    return {"text/html": chart_html(spec), mime: spec, "text/plain": f"<kvdro chart {chart_id(spec)}>"}


alt.renderers.register(RENDERER_NAME, render_offline)


def enable() -> None:
    """Turn on the book's theme and the offline renderer (call once at the top of a chapter)."""
    alt.theme.enable(THEME_NAME)
    alt.renderers.enable(RENDERER_NAME)
    alt.data_transformers.disable_max_rows()




#: The policies of the headroom map whose goodput gain over vLLM :func:`headroom_chart` shows.
HEADROOM_ARMS = ("oracle", "exact", "best", "dro")
#: How the chart names them: ``oracle`` is the FCFS no-preemption look-ahead (the CLI keeps the name).
ARM_LABELS = {"oracle": "look-ahead", "exact": "exact", "best": "best soft", "dro": "DRO"}


def headroom_chart(frame, *, arms: tuple[str, ...] = HEADROOM_ARMS, threshold: float = 0.05):
    """The headroom map (``data/headroom.csv``, :mod:`kvdro.experiments.headroom`): one row per
    (workload, deployment), one column per load; each cell coloured by the largest goodput gain over
    vLLM of the policies ``arms`` (``{arm}_goodput_gain``: the look-ahead, exact pre-allocation, the best
    soft reservation, DRO) that lies beyond noise (its paired interval, ``{arm}_goodput_gain_lo`` > 0;
    otherwise 0), labelled with it in %; cells whose queue grows (``stable`` False) are faded. The
    colour bins put ``threshold`` (5 %) on a boundary."""
    import numpy as np
    import pandas as pd

    need = {"workload", "deployment", "load", "stable", *(f"{a}_goodput_gain{s}" for a in arms for s in ("", "_lo"))}
    missing = need - set(frame.columns)
    if missing:
        raise ValueError(f"frame: missing columns {sorted(missing)}")
    f = pd.DataFrame(frame).copy()
    # a gain counts only beyond noise: its paired 95 % interval lies above zero (else 0)
    gains = pd.DataFrame({f"{a}_goodput_gain": f[f"{a}_goodput_gain"].where(f[f"{a}_goodput_gain_lo"] > 0, 0.0) for a in arms})
    f["best gain"] = gains.max(axis=1)
    f["by"] = gains.idxmax(axis=1).str.replace("_goodput_gain", "", regex=False).map(lambda a: ARM_LABELS.get(a, a))
    f["label"] = (100 * f["best gain"]).round().astype(int).map(lambda v: f"{v:+d}")
    f["queue"] = f["stable"].map({True: "stable", False: "growing"})
    short = f["deployment"].str.replace("-PP1", "", regex=False).str.replace(" x ", "×", regex=False).str.replace(" + ", "+", regex=False)
    f["row"] = f["workload"].str.replace("conversation", "conv.", regex=False) + " · " + short
    f["load "] = f["load"].map(lambda v: f"{v:g}")
    labels = [f"< {0.01:.0%}", f"{0.01:.0%} to {threshold:.0%}", f"{threshold:.0%} to {0.20:.0%}", f"≥ {0.20:.0%}"]
    f["gain bin"] = pd.cut(f["best gain"], [-np.inf, 0.01, threshold, 0.20, np.inf], right=False, labels=labels).astype(str)
    rows = list(dict.fromkeys(f["row"]))
    order = list(dict.fromkeys(f.sort_values("load")["load "]))
    colours = ["#f2f2f2", "#c6dbef", "#fdae6b", "#d94801"]
    base = alt.Chart(f).encode(
        x=alt.X("load :O", sort=order, title="load (x the workload's rate)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("row:N", sort=rows, title=None, axis=alt.Axis(labelLimit=200)))
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("gain bin:N", title="largest gain", scale=alt.Scale(domain=labels, range=colours),
                        legend=alt.Legend(orient="bottom", columns=4)),
        opacity=alt.Opacity("queue:N", scale=alt.Scale(domain=["stable", "growing"], range=[1.0, 0.35]),
                            legend=alt.Legend(orient="bottom", title="queue")),
        tooltip=["workload", "deployment", "load", "queue", alt.Tooltip("best gain:Q", format="+.1%"), "by",
                 *[alt.Tooltip(f"{a}_goodput_gain:Q", format="+.1%", title=ARM_LABELS.get(a, a)) for a in arms]])
    text = base.mark_text(fontSize=10).encode(text="label:N")
    return alt.layer(cells, text).properties(width=WIDTH, height=20 * len(rows),
                                             title="Largest goodput gain over vLLM beyond noise (%); faded: the queue grows")
