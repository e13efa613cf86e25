"""Chapter 7's and chapter 12's charts, built from the simulator's study frames (:mod:`kvdro.sim.studies`,
:mod:`kvdro.sim.regimes`) and the calibration caches, with the book's Altair theme (:mod:`kvdro.plotting`)."""

from __future__ import annotations

import pandas as pd

__all__ = ["agreement_scatter", "blocks_chart", "regime_chart"]


def blocks_chart(timelines: dict[str, pd.DataFrame], *, blocks: int):
    """One panel per :func:`~kvdro.sim.studies.blocks_timeline` frame: each engine step a column of
    ``blocks`` blocks split into blocks holding cached tokens, reserved but unused, and free; a
    vertical rule at each preemption."""
    import altair as alt

    from kvdro.plotting import PALETTE, WIDTH
    from kvdro.sim.studies import preemption_times, timeline_layers

    t_end = max(float(f["t_s"].max() + f["dur_s"].max()) for f in timelines.values())
    kinds = ["holding cached tokens", "reserved, unused", "free"]
    charts = []
    for label, frame in timelines.items():
        bars = alt.Chart(timeline_layers(frame)).mark_bar(width=2.5).encode(
            x=alt.X("t_s:Q", title="time (s)", scale=alt.Scale(domain=[0, round(t_end, 1)], nice=False)),
            y=alt.Y("n:Q", title="blocks", scale=alt.Scale(domain=[0, blocks])),
            color=alt.Color("blocks are:N", scale=alt.Scale(domain=kinds, range=[PALETTE[0], PALETTE[1], "#dddddd"]),
                            legend=alt.Legend(orient="bottom", title=None)),
            order=alt.Order("layer:Q", sort="ascending"),
            tooltip=["step", alt.Tooltip("t_s:Q", format=".3f"), "blocks are", "n"])
        rules = alt.Chart(preemption_times(frame)).mark_rule(color=PALETTE[3], strokeWidth=2).encode(
            x="t_s:Q", tooltip=["request", alt.Tooltip("t_s:Q", format=".3f")])
        charts.append((bars + rules).properties(width=WIDTH - 112, height=120, title=label))
    return alt.vconcat(*charts).resolve_scale(color="shared")


REGIME_COLOURS = {"light": "#dddddd", "between": "#9ecae1", "memory-bound": "#2ca02c",
                  "memory-bound, saturated": "#ff7f0e", "compute-saturated": "#d62728"}


def regime_chart(frame: pd.DataFrame, *, trace: str, marked: dict[str, tuple[str, float]] | None = None):
    """The regime map of one trace: deployment (rows) x load (columns), each cell coloured by its
    regime and labelled with ``vllm``'s mean KV use (%) and preemptions; ``marked`` names cells
    (label -> (deployment, load)) outlined in black."""
    import altair as alt

    from kvdro.plotting import WIDTH

    f = frame[frame["trace"] == trace].copy()
    f["load "] = f["load"].map(lambda v: f"{v:g}")
    f["kv"] = (100 * f["kv_mean"]).round().astype(int).astype(str) + "%"
    f["pre"] = f["preemptions"].map(lambda v: f"{int(v):,}")
    order = list(dict.fromkeys(f["load "]))
    rows = list(dict.fromkeys(f["deployment"]))
    base = alt.Chart(f).encode(
        x=alt.X("load :O", sort=order, title="load (x the trace's rate)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("deployment:N", sort=rows, title=None))
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("regime:N", scale=alt.Scale(domain=list(REGIME_COLOURS), range=list(REGIME_COLOURS.values())),
                        legend=alt.Legend(orient="bottom", title=None, columns=3)),
        tooltip=["deployment", "load", alt.Tooltip("kv_mean:Q", format=".0%", title="KV mean"),
                 alt.Tooltip("kv_peak:Q", format=".0%", title="KV peak"), "preemptions",
                 alt.Tooltip("slo_violation:Q", format=".0%", title="SLO violation"),
                 alt.Tooltip("e2e_p99_s:Q", format=",.0f", title="P99 e2e (s)"), "regime"])
    kv = base.mark_text(dy=-6, fontSize=10).encode(text="kv:N")
    pre = base.mark_text(dy=7, fontSize=9, color="#333333").encode(text="pre:N")
    layers = [cells, kv, pre]
    if marked:
        m = pd.DataFrame([{"deployment": d, "load ": f"{v:g}", "point": k} for k, (d, v) in marked.items()])
        layers.append(alt.Chart(m).mark_rect(fill=None, stroke="black", strokeWidth=2.5).encode(
            x=alt.X("load :O", sort=order), y=alt.Y("deployment:N", sort=rows), tooltip=["point"]))
    return alt.layer(*layers).properties(width=WIDTH - 190, height=34 * len(rows),
                                         title=f"{trace} trace: regime, mean KV use, vllm preemptions")


def agreement_scatter(frame: pd.DataFrame, *, band: float = 0.15, panel_width: int = 144, height: int = 170):
    """Predicted against simulated, one panel per (``metric``, ``panel``) of ``frame``: a point per
    row (columns ``simulated``, ``predicted``, coloured by ``serving``, shaped by ``instance``), the
    diagonal and the band ``(1 +- band) x simulated`` shaded. Log axes; rows with a missing or
    non-positive prediction (an overloaded plan) are left out. ``panel_width`` is one panel's
    plot width [px]: keep ``len(panels) x (panel_width + 60)`` within :data:`kvdro.plotting.WIDTH`."""
    import altair as alt
    import numpy as np

    from kvdro.plotting import PALETTE

    for col in ("metric", "panel", "simulated", "predicted", "serving", "instance"):
        if col not in frame.columns:
            raise ValueError(f"frame: missing column {col!r}")
    if not 0 < band < 1:
        raise ValueError(f"band: must be in (0, 1), got {band}")
    f = frame[np.isfinite(frame["predicted"]) & (frame["predicted"] > 0) & (frame["simulated"] > 0)]
    servings = list(dict.fromkeys(frame["serving"]))
    colour = alt.Color("serving:N", scale=alt.Scale(domain=servings, range=list(PALETTE[:len(servings)])),
                       legend=alt.Legend(orient="bottom", title="serving model"))
    rows = []
    for metric in dict.fromkeys(frame["metric"]):
        part = f[f["metric"] == metric]
        lo = 0.8 * min(part["simulated"].min(), part["predicted"].min())
        hi = 1.25 * max(part["simulated"].max(), part["predicted"].max())
        scale = alt.Scale(type="log", domain=[lo, hi], nice=False)
        ticks = [m * 10.0 ** e for e in range(-4, 6) for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
        if len(ticks) > 5:  # a wide range: decades only, so the labels never overlap
            ticks = [t for t in ticks if np.isclose(t, 10.0 ** np.round(np.log10(t)))]
        xaxis = alt.Axis(values=ticks, format="~g", grid=False)
        yaxis = alt.Axis(values=ticks, format="~g")
        grid = np.geomspace(lo, hi, 24)
        shade = pd.DataFrame({"x": grid, "lo": (1 - band) * grid, "hi": (1 + band) * grid})
        panels = []
        for name in dict.fromkeys(frame["panel"]):
            pts = part[part["panel"] == name]
            area = alt.Chart(shade).mark_area(opacity=0.18, color="#888888").encode(
                x=alt.X("x:Q", scale=scale, title=f"simulated {metric}", axis=xaxis),
                y=alt.Y("lo:Q", scale=scale, title=f"predicted {metric}", axis=yaxis), y2="hi:Q")
            diag = alt.Chart(shade).mark_line(color="#888888", strokeWidth=1).encode(x="x:Q", y="x:Q")
            dots = alt.Chart(pts).mark_point(size=60, filled=True, opacity=0.85).encode(
                x=alt.X("simulated:Q", scale=scale, axis=xaxis), y=alt.Y("predicted:Q", scale=scale, axis=yaxis), color=colour,
                shape=alt.Shape("instance:N", legend=alt.Legend(orient="bottom", title="instance")),
                tooltip=[c for c in ("instance", "load", "serving", "realisation") if c in pts.columns]
                + [alt.Tooltip("simulated:Q", format=".3g"), alt.Tooltip("predicted:Q", format=".3g")])
            panels.append(alt.layer(area, diag, dots).properties(width=panel_width, height=height, title=str(name)))
        rows.append(alt.hconcat(*panels))
    return alt.vconcat(*rows).resolve_scale(color="shared", shape="shared")
