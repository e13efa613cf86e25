"""The engines' answer at the primary point, read for the book (chapter 8 and the intro).

One reader for the two pages that quote it: :func:`read` loads ``data/engine_presets.csv`` (written by
``python -m kvdro.bench presets --write``, :mod:`kvdro.bench.presets`; never re-run by a page), and
:func:`lookahead` runs the one arm that table does not hold, vLLM v0's FCFS no-preemption look-ahead
(``simulate(..., policy="oracle")``, the compiled engine: under a second), at the same point and with
the same paired interval (:func:`kvdro.bench.presets.paired_interval`). The point: the whole Azure
2023 conversation trace at 0.7 times its rate on 4 x TP2-PP1 (Llama-2-70B, eight A100-80GB), every
run seeded with ``numpy.random.default_rng(0)``.

Every change is goodput [requests served within their own deadline per second] against an engine's
default, in percent of that baseline's goodput, with a 95 % paired bootstrap interval over the
requests: the interval of the ratio of the two goodputs, minus one (never below -100 %).
:func:`decomposition` splits each engine's default against its true-length arm into the recompute
avoided and the per-token efficiency (chapter 8's identity), engine by engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdro.bench import presets
from kvdro.experiments.uncertainty import Interval
from kvdro.sim.engines import ADMISSION

#: The columns of the book's table: max_new arms of the cache, then the look-ahead (vLLM v0 only).
ARMS: dict[str, str] = {"unset": "default (max_new unset)", "1000": "client cap 1,000", "policy": "DRO estimate as max_new",
                        "policy-soft": "DRO estimate, may grow", "true": "true length", "lookahead": "look-ahead"}
#: What each preset sets aside at admission: its family (:data:`kvdro.sim.engines.ADMISSION`).
FAMILY: dict[str, str] = ADMISSION
LOOKAHEAD_ENGINE = "vllm-v0"  # the look-ahead is an admission rule of vLLM v0's scheduler (kvdro.sim.scheduler)


def read() -> pd.DataFrame:
    """``data/engine_presets.csv`` checked against its manifest, ``max_new`` as text, one row per
    (engine, arm), with ``change``: the :class:`Interval` (fractions) of goodput against ``vllm-v1``
    unset."""
    from kvdro.cachefile import read_csv_checked

    table = read_csv_checked(presets.CACHE, key=list(presets.KEY), dtype={"max_new": str})
    table["change"] = [Interval(p / 100, lo / 100, hi / 100) for p, lo, hi in
                       zip(table["goodput_vs_v1_pct"], table["ci_low_pct"], table["ci_high_pct"])]
    return table


@dataclass(frozen=True)
class LookAhead:
    """The look-ahead's run at the presets' point: goodput [req/s], preemptions, and its paired change
    against each baseline engine's default (``against``: engine -> :class:`Interval`, fractions)."""

    goodput_rps: float
    preemptions: int
    against: dict[str, Interval]
    baseline_goodput_rps: dict[str, float]


def lookahead(against: tuple[str, ...] = (LOOKAHEAD_ENGINE,)) -> LookAhead:
    """Run the look-ahead (vLLM v0 with ``policy="oracle"``) and each engine of ``against`` with
    ``max_new`` unset at the presets' point, and pair them as the cached table pairs its arms
    (:func:`kvdro.bench.presets.paired_interval`). ``vllm-v0`` is compiled (~1 s); the other presets run
    on their step-by-step engines (``vllm-v1``: ~10 s here)."""
    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate
    from kvdro.sim.engines import ENGINES
    from kvdro.sim.regimes import at_load

    bad = [e for e in against if e not in ENGINES]
    if bad:
        raise ValueError(f"against: unknown engine(s) {bad}; choose from {ENGINES}")
    trace = at_load(load_trace(presets.TRACE), presets.LOAD)
    dep = default_deployment(config=presets.CONFIG)
    r = simulate(trace, policy="oracle", deployment=dep, rng=np.random.default_rng(0))
    q = r.requests
    ok = q["outcome"].isin(["completed", "truncated"]).to_numpy() & (q["e2e_s"].to_numpy() <= q["deadline_s"].to_numpy())
    horizon = float(r.cost["horizon_s"])
    out, base = {}, {}
    for engine in against:
        row, ok_b, h_b = presets._arm(trace, dep, engine, "unset")  # the cache's own run of that arm
        out[engine] = Interval(*(v / 100 for v in presets.paired_interval(ok, horizon, ok_b, h_b)))
        base[engine] = row["goodput_rps"]
    return LookAhead(float(r.metrics["goodput_rps"]), int(r.metrics["preemptions"]), out, base)


def decomposition(engines: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Chapter 8's decomposition, engine by engine, at the presets' point: each engine with ``max_new``
    unset (its default, d) against the same engine given the true lengths (t), both run here (compiled,
    ~1 s each). Per engine: ``busy_ratio`` = busy_d / busy_t (the engines' summed step time),
    ``tokens_ratio`` = K_d / K_t (tokens fed, K = W + R: the work every policy feeds plus the
    recomputed tokens, :func:`kvdro.experiments.headroom.run_stats`), ``cost_ratio`` = c_d / c_t
    (seconds of step time per token fed, c = busy / K), so that busy_ratio = cost_ratio x tokens_ratio
    exactly (:func:`kvdro.experiments.decomposition.ratios`, which the atlas's
    :func:`kvdro.experiments.atlas.decomposition` shares); ``reads_max_new``: False where the engine's rules never read max_new (the two runs are
    the same run and every ratio is 1 by construction)."""
    from kvdro.datasets import load_trace
    from kvdro.experiments.decomposition import ratios
    from kvdro.experiments.headroom import run_stats
    from kvdro.sim import default_deployment, simulate
    from kvdro.sim.engines import ENGINES
    from kvdro.sim.regimes import at_load

    engines = tuple(ENGINES) if engines is None else tuple(engines)
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise ValueError(f"engines: unknown engine(s) {bad}; choose from {ENGINES}")
    trace = at_load(load_trace(presets.TRACE), presets.LOAD)
    dep = default_deployment(config=presets.CONFIG)
    rows = []
    for engine in engines:
        runs = {arm: simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine=engine,
                              max_new=arm) for arm in ("unset", "true")}
        d, t = (run_stats(runs[arm]) for arm in ("unset", "true"))
        r = ratios(d["busy_s"], d["work_tokens"] + d["recomputed"], t["busy_s"], t["work_tokens"] + t["recomputed"])
        rows.append({"engine": engine, "busy_ratio": r["busy_ratio"], "tokens_ratio": r["tokens_ratio"],
                     "cost_ratio": r["cost_ratio"],
                     "recomputed_default": d["recomputed"], "recomputed_true": t["recomputed"],
                     "reads_max_new": not runs["unset"].requests.equals(runs["true"].requests)})
    return pd.DataFrame(rows)


def change_text(iv: Interval, digits: int = 1) -> str:
    """``-13.8 % [-14.6, -13.0]``; a run identical to the baseline's (a zero-width interval at 0) as
    ``±0 (the same run)``."""
    if iv.point == iv.lo == iv.hi == 0:
        return "±0 (the same run)"
    return iv.pct(digits).replace("%", " %")


def point_text(iv: Interval, digits: int = 1) -> str:
    """The point alone, ``-13.8%`` (the table beside it gives the interval)."""
    return f"{100 * iv.point:+.{digits}f}%"


def cell(table: pd.DataFrame, engine: str, arm: str) -> pd.Series:
    """One (engine, max_new) row of :func:`read`'s table (ValueError naming what is missing)."""
    hit = table[(table["engine"] == engine) & (table["max_new"] == arm)]
    if len(hit) != 1:
        raise ValueError(f"engine, arm: ({engine!r}, {arm!r}) is not one row of {presets.CACHE.name}")
    return hit.iloc[0]


def length_unused(table: pd.DataFrame, engine: str) -> bool:
    """True where the engine serves exactly the same with max_new unset, capped at 1,000 and set to the
    true length: it reserves nothing from max_new, so the length is worth nothing through it."""
    g = [cell(table, engine, a)["goodput_rps"] for a in ("unset", "1000", "true")]
    return bool(np.isclose(g[0], g[1], rtol=0, atol=1e-9) and np.isclose(g[0], g[2], rtol=0, atol=1e-9))


def recovered(table: pd.DataFrame, engine: str, arm: str = "policy") -> float:
    """The share of the true length's gain over the default that ``arm`` recovers:
    (goodput[arm] - goodput[unset]) / (goodput[true] - goodput[unset]) (NaN where the true length gains nothing)."""
    g = {a: float(cell(table, engine, a)["goodput_rps"]) for a in ("unset", arm, "true")}
    gain = g["true"] - g["unset"]
    return float("nan") if abs(gain) < 1e-9 else (g[arm] - g["unset"]) / gain


def beats(a: Interval, b: Interval) -> bool:
    """``a``'s interval lies wholly above ``b``'s (two intervals against the same baseline; conservative)."""
    return a.lo > b.hi


def grid(table: pd.DataFrame, la: LookAhead | None = None, *, digits: int = 1) -> pd.DataFrame:
    """Engine x arm, each cell the change against ``vllm-v1`` unset with its interval ("–" where the
    engine has no such arm); the look-ahead's cell from ``la.against['vllm-v1']`` when given."""
    from kvdro.sim.engines import ENGINES

    cells = table.assign(text=[change_text(c, digits) for c in table["change"]]).pivot(index="engine", columns="max_new", values="text")
    if la is not None and "vllm-v1" in la.against:
        cells["lookahead"] = pd.Series({LOOKAHEAD_ENGINE: change_text(la.against["vllm-v1"], digits)})
    cells.loc["vllm-v1", "unset"] = "baseline"
    cells = cells.reindex(index=list(ENGINES), columns=[a for a in ARMS if a in cells.columns]).fillna("–")
    return cells.rename(columns=ARMS).rename_axis(index="engine", columns=None)


def figure(table: pd.DataFrame, la: LookAhead | None = None):
    """Goodput [req/s] of every engine and arm, with its paired 95 % interval (drawn in req/s around
    ``vllm-v1`` unset's point), and a rule at ``vllm-v1``'s default."""
    import altair as alt

    v1 = float(table.set_index(["engine", "max_new"]).loc[("vllm-v1", "unset"), "goodput_rps"])
    rows = [{"engine": r.engine, "arm": ARMS[r.max_new], "goodput": r.goodput_rps,
             "lo": v1 * (1 + r.change.lo), "hi": v1 * (1 + r.change.hi)} for r in table.itertuples()]
    if la is not None and "vllm-v1" in la.against:
        iv = la.against["vllm-v1"]
        rows.append({"engine": LOOKAHEAD_ENGINE, "arm": ARMS["lookahead"], "goodput": la.goodput_rps,
                     "lo": v1 * (1 + iv.lo), "hi": v1 * (1 + iv.hi)})
    data = pd.DataFrame(rows)
    data["lo"] = data["lo"].clip(lower=0)
    order = [ARMS[a] for a in ARMS]
    y = alt.Y("engine:N", sort=list(FAMILY), title=None)
    off = alt.YOffset("arm:N", sort=order)
    base = alt.Chart(data)
    dots = base.mark_point(filled=True, size=45).encode(
        x=alt.X("goodput:Q", title="goodput [requests within their deadline / s]"), y=y, yOffset=off,
        color=alt.Color("arm:N", sort=order, title="max_new / policy", legend=alt.Legend(orient="bottom", columns=3)),
        tooltip=["engine", "arm", alt.Tooltip("goodput:Q", format=".3f")])
    bars = base.mark_rule().encode(x="lo:Q", x2="hi:Q", y=y, yOffset=off, color=alt.Color("arm:N", sort=order, legend=None))
    rule = alt.Chart(pd.DataFrame({"v1": [v1]})).mark_rule(strokeDash=[4, 3], color="gray").encode(x="v1:Q")
    return (bars + dots + rule).properties(width=560, height=alt.Step(7))
