"""Chapter 7's charts, built from the simulator's study frames (:mod:`kvdro.sim.studies`,
:mod:`kvdro.sim.regimes`) with the book's Altair theme (:mod:`kvdro.plotting`)."""

from __future__ import annotations

import pandas as pd

__all__ = ["blocks_chart", "regime_chart"]


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
