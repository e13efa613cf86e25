"""Routing draws near thresholds: do the atlas's verdicts survive another routing draw? (issue 34, item 1)

Every atlas run (:func:`kvdro.experiments.atlas.run_arm`) routes its requests to the serving
groups with **one** draw, ``simulate(..., rng=numpy.random.default_rng(0))``: the router picks each
request's group at random from its class's routing probabilities (:mod:`kvdro.sim.simulate`,
``_route``). The paired intervals of the verdict table (:func:`kvdro.experiments.atlas.verdict`)
are over the time blocks of that one draw; another draw sends other requests to other engines, and
a verdict whose interval sits near zero may change class.

**The rule** (written, with :data:`NEAR_HALF_WIDTHS`, before any draw below was run). A verdict is
one (primary point, engine, arm) of the verdict table with arm in :data:`ARMS` (DRO as ``max_new``,
DRO reserved softly, the true length), against the engine's ``default``; its class is the atlas's
(beats / within noise / loses: the paired 95 % interval wholly above zero, across it, wholly
below). Take its interval [lo, hi] of the **difference** in goodput (requests served within their
deadline per second, ``vs_default_diff_lo`` / ``_hi`` of the cached atlas): the atlas stores it for
every verdict, it comes from the same resamples as the ratio (so its sign, and the class, are the
ratio's: :func:`near` checks it), and unlike the ratio it is not skewed by a small baseline. The
class changes when an endpoint crosses zero, so the distance to the threshold is
d = min(|lo|, |hi|). The verdict is **near a threshold** when

    d <= NEAR_HALF_WIDTHS x (hi - lo) / 2,

i.e. zero is within one half-width of the interval's nearer end: a verdict "within noise" is
always near (zero is inside its interval), except one whose interval has no width and excludes
zero; a tie in every time block (lo = hi = 0) sits *at* the threshold and is near. Why one
half-width: the half-width is the block-to-block noise of that very comparison, and in the only
measurement of what a routing draw does, the headroom map's seed study (``data/headroom_seeds.csv``,
chapter 9: 20 cells x 4 policies x 8 routing draws over the same arrivals), the largest move of a
gain from draw 0 over the seven other draws was a median 0.68 of its draw-0 half-width (90th
percentile 1.47), and every class change it saw (27 of 80 pairs) happened where d was at most 1.0
half-width (:func:`calibration` recomputes these from the cached file). A fixed margin in
points would not do: the atlas's intervals run from a tenth of a point to hundreds of points wide.

One kind of verdict is left out, said per row (``reason``): a ``true`` arm on an engine whose
admission never reads ``max_new`` (:data:`UNREAD`: the cap at the true length changes nothing, the
run is the default's bit for bit under every draw). The cell's load is not used:
every primary point is a stable point of its regime map by the atlas's rule, and a draw that moves
the regime shows up in the verdict's change, which is what is rerun.

**A control** (added after the first rerun): the far verdicts nearest the margin, zero within
:data:`CONTROL_HALF_WIDTHS` half-widths, are rerun too (``role == "control"``), to see whether the
rule misses changes just beyond its margin; they are reported apart and never counted as selected.

**The rerun** (:func:`tasks`, :func:`run`, ``python -m kvdro.bench atlas-draws``): for each
(primary point, engine) with a selected or control verdict, the engine's ``default`` and each such arm
under the routing draws :data:`DRAWS` (seed 0, the atlas's own, reproduced as a check of the hook,
then K = ``len(DRAWS) - 1`` new draws), the arrivals and the fitted estimates fixed;
:func:`compare` pairs each arm with its own draw's default (:func:`kvdro.experiments.atlas.compare`),
and :func:`stability` says per verdict whether its class holds in every draw and the range of its
point estimate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.experiments import atlas
from kvdro.experiments.headroom import ROUTING_SEEDS

__all__ = ["NEAR_HALF_WIDTHS", "CONTROL_HALF_WIDTHS", "ARMS", "UNREAD", "DRAWS", "KEY", "near", "calibration", "tasks", "run",
           "compare", "read", "stability", "engine_counts", "changes"]

#: The rule's margin: a verdict is near a threshold when zero is within this many half-widths of its
#: paired interval's nearer end (module docstring; chosen from the headroom map's seed study before any run).
NEAR_HALF_WIDTHS: float = 1.0
#: The control band: far verdicts with zero within this many half-widths are rerun as a control
#: (module docstring).
CONTROL_HALF_WIDTHS: float = 2.0
#: The verdict arms rerun (against the engine's ``default``).
ARMS: tuple[str, ...] = ("dro", "dro-soft", "true")
#: Engines whose admission never reads ``max_new``, so that the ``true`` arm is the default's run
#: under every draw: :func:`kvdro.sim.engine_choice.generation_limits` gives it each request's own
#: window cap as ``max_new`` (no request is capped, every limit is the default's), and the admission
#: does not look at it -- vLLM v0 (:mod:`kvdro.sim.scheduler`, after vLLM v0.6
#: ``vllm/core/block_manager.py``: blocks allocated as tokens arrive) and
#: :data:`kvdro.experiments.atlas.MAX_NEW_UNREAD`.
UNREAD: tuple[str, ...] = ("vllm-v0", *atlas.MAX_NEW_UNREAD)
#: The routing seeds of the rerun, the seed study's (:data:`kvdro.experiments.headroom.ROUTING_SEEDS`,
#: 0 to 7): 0 is the atlas's own draw, reproduced (a check that the seed enters where
#: ``run_arm(..., routing_seed=)`` puts it), and K = 7 new draws: the whole rerun (784 runs with the control)
#: takes 56 to 78 s wall with 2 workers on this shared 2-core machine (three runs; 568 to 600 runs
#: without the control, 68 to 106 s), within the 3 minutes it was given.
DRAWS: tuple[int, ...] = ROUTING_SEEDS
#: The columns that identify a row of ``data/atlas_draws.csv``.
KEY: tuple[str, ...] = ("cell", "engine", "arm", "draw")
DATA = atlas.DATA


def _need(frame: pd.DataFrame, cols, name: str) -> None:
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(f"{name}: missing column(s) {missing}")


_VERDICT_COLS = ("cell", "engine", "arm", "vs_default_lo", "vs_default_hi", "vs_default_diff_lo", "vs_default_diff_hi",
                 "vs_default_base_near_zero")


def near(frame: pd.DataFrame, primary: list[str] | None = None, margin: float = NEAR_HALF_WIDTHS) -> pd.DataFrame:
    """The rule (module docstring) on ``frame`` (rows of :func:`kvdro.experiments.atlas.compare`, e.g.
    the cached atlas :func:`kvdro.experiments.atlas.read`): one row per verdict of the ``primary``
    cells (cell keys; default the atlas's primary points) and :data:`ARMS`, with its class
    (``cls``: +1 beats, 0 within noise, -1 loses), the interval of the difference [req/s]
    (``diff_lo``, ``diff_hi``), the distance to the threshold in half-widths (``nearness``; 0 for a
    tie at zero, inf for a zero-width interval away from zero), ``selected``, ``reason`` and ``role``
    (``"near"``: selected; ``"control"``: not selected, zero within :data:`CONTROL_HALF_WIDTHS`
    half-widths; ``""``: not rerun).
    ValueError names a bad ``frame`` or ``margin``."""
    _need(frame, _VERDICT_COLS, "frame")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not np.isfinite(margin) or margin < 0:
        raise ValueError(f"margin: must be a finite number of half-widths >= 0, got {margin!r}")
    keys = [c.key for c in atlas.cells(points="primary")] if primary is None else list(primary)
    v = frame[frame["cell"].isin(keys) & frame["arm"].isin(ARMS)].copy()
    if not len(v):
        raise ValueError("frame: no verdict (arms dro, dro-soft, true) at the primary cells")
    v["cls"] = [atlas.sign(r) for _, r in v.iterrows()]
    lo, hi = v["vs_default_diff_lo"].astype(float).to_numpy(), v["vs_default_diff_hi"].astype(float).to_numpy()
    by_diff = np.where(lo > 0, 1, np.where(hi < 0, -1, 0))
    if (by_diff != v["cls"].to_numpy()).any():
        bad = v.loc[by_diff != v["cls"].to_numpy(), ["cell", "engine", "arm"]].to_dict("records")
        raise ValueError(f"frame: the difference's interval and the ratio's disagree in sign at {bad}")
    d, half = np.minimum(np.abs(lo), np.abs(hi)), (hi - lo) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        v["nearness"] = np.where(d == 0, 0.0, np.where(half > 0, d / np.where(half > 0, half, 1.0), np.inf))
    v["diff_lo"], v["diff_hi"] = lo, hi
    unread = (v["arm"] == "true") & v["engine"].isin(UNREAD)
    v["selected"] = ~unread & (v["nearness"] <= margin)
    v["reason"] = np.where(unread, "the default's run by construction (max_new unread)",
                           np.where(v["selected"], "near: zero within the margin", "far: zero beyond the margin"))
    v["role"] = np.where(v["selected"], "near", np.where(~unread & (v["nearness"] <= CONTROL_HALF_WIDTHS), "control", ""))
    order = {k: i for i, k in enumerate(keys)}
    v = v.assign(_c=v["cell"].map(order), _e=v["engine"].map({e: i for i, e in enumerate(atlas.ENGINES)}),
                 _a=v["arm"].map({a: i for i, a in enumerate(ARMS)}))
    v = v.sort_values(["_c", "_e", "_a"], kind="stable")
    cols = ["cell", "engine", "arm", "cls", "diff_lo", "diff_hi", "nearness", "selected", "reason", "role"]
    return v[cols].reset_index(drop=True)


def calibration(seeds: pd.DataFrame | None = None) -> dict[str, float]:
    """What a routing draw did in the headroom map's seed study (``seeds``: the rows ``kind == "seed"`` of
    :func:`kvdro.experiments.headroom.headroom_seeds`, the cached ``data/headroom_seeds.csv`` by
    default), in half-widths of each (cell, policy)'s draw-0 interval of its goodput gain:
    ``pairs`` (cell, policy) compared over ``draws`` routing draws, ``move_median`` and ``move_p90`` (the largest move of the gain
    from draw 0 over the other draws, median and 90th percentile over the pairs), ``flips`` (pairs
    whose class differs in some draw) and ``flip_nearness_max`` (the largest distance from zero to the
    nearer end of draw 0's interval, in half-widths, among the pairs that flip): the figures behind
    :data:`NEAR_HALF_WIDTHS`."""
    if seeds is None:
        from kvdro.experiments.headroom import load_seeds

        seeds = load_seeds()
    _need(seeds, ("kind", "workload", "deployment", "load", "policy", "routing_seed", "gain", "lo", "hi"), "seeds")
    s = seeds[seeds["kind"] == "seed"].copy()
    if not len(s) or 0 not in set(s["routing_seed"]) or s["routing_seed"].nunique() < 2:
        raise ValueError("seeds: need the rows of at least two routing draws, draw 0 among them")
    s["cls"] = np.where(s["lo"] > 0, 1, np.where(s["hi"] < 0, -1, 0))
    k = ["workload", "deployment", "load", "policy"]
    base = s[s["routing_seed"] == 0].set_index(k)
    half = (base["hi"] - base["lo"]) / 2
    gain = s.pivot_table(index=k, columns="routing_seed", values="gain")
    move = gain.drop(columns=0).sub(gain[0], axis=0).abs().max(axis=1)
    ok = half > 0
    rel = (move[ok] / half[ok]).to_numpy()
    flip = s.groupby(k)["cls"].nunique() > 1
    d = np.minimum(base["lo"].abs(), base["hi"].abs())
    near_rel = (d / half.where(half > 0)).where(d > 0, 0.0)
    return {"pairs": int(len(base)), "draws": int(s["routing_seed"].nunique()), "move_median": float(np.median(rel)), "move_p90": float(np.quantile(rel, 0.9)),
            "flips": int(flip.sum()), "flip_nearness_max": float(near_rel[flip[flip].index].max())}


# --- The rerun under other routing draws ---

def tasks(selection: pd.DataFrame, draws=DRAWS) -> list[tuple[atlas.Cell, str, str, int]]:
    """(cell, engine, arm, draw) of the rerun: for each (primary cell, engine) with a verdict of
    ``selection`` (:func:`near`) in the role ``near`` or ``control``, its ``default`` and those arms, under each of ``draws``
    (in the selection's order, the draws of one cell together: a worker keeps its trace loaded)."""
    _need(selection, ("cell", "engine", "arm", "role"), "selection")
    draws = _check_draws(draws)
    by_key = {c.key: c for c in atlas.cells(points="primary")}
    sel = selection[selection["role"].isin(["near", "control"])]
    missing = sorted(set(sel["cell"]) - set(by_key))
    if missing:
        raise ValueError(f"selection: cells {missing} are not primary points of the atlas")
    out: list[tuple[atlas.Cell, str, str, int]] = []
    for (cell, engine), part in sel.groupby(["cell", "engine"], sort=False):
        out += [(by_key[cell], engine, a, d) for d in draws for a in ("default", *part["arm"])]
    return out


def _check_draws(draws) -> tuple[int, ...]:
    out = tuple(draws) if not isinstance(draws, (int, str)) else ()
    if (len(out) < 2 or len(set(out)) != len(out) or 0 not in out
            or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in out)):
        raise ValueError(f"draws: need distinct routing seeds >= 0, seed 0 (the atlas's) and at least one more, got {draws!r}")
    return tuple(int(d) for d in out)


def run(cell: atlas.Cell, engine: str, arm: str, draw: int) -> dict:
    """:func:`kvdro.experiments.atlas.run_arm` under routing seed ``draw``, with the draw in the row."""
    return {"draw": int(draw), **atlas.run_arm(cell, engine, arm, routing_seed=draw)}


def compare(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (rows of :func:`run`) with each arm's paired change against its engine's ``default``
    under the same draw (:func:`kvdro.experiments.atlas.compare`, draw by draw: the same arrivals,
    the same routing) and its class ``cls`` (+1 beats, 0 within noise, -1 loses); the comparison
    with ``vllm-v1``'s default is left out (not rerun) and so are the per-block counts."""
    _need(runs, ("draw", "cell", "engine", "arm", "served_blocks", "span_s"), "runs")
    parts = []
    for _, part in runs.groupby("draw", sort=False):
        c = atlas.compare(part.reset_index(drop=True))
        c["cls"] = [atlas.sign(r) for _, r in c.iterrows()]
        parts.append(c)
    out = pd.concat(parts, ignore_index=True)
    return out.drop(columns=["served_blocks", *[c for c in out.columns if c.startswith("vs_v1_")]])


def read(data_dir: Path | None = None) -> pd.DataFrame:
    """The cached rerun ``data/atlas_draws.csv`` (rows of :func:`compare`), checked against its
    manifest; written by ``python -m kvdro.bench atlas-draws``."""
    from kvdro.cachefile import read_csv_checked

    base = DATA if data_dir is None else Path(data_dir)
    return read_csv_checked(base / "atlas_draws.csv", key=KEY, remake="python -m kvdro.bench atlas-draws")


def _point(row: pd.Series, diff: bool) -> float:
    return float(row["vs_default_diff_rps"] if diff else row["vs_default_pct"])


def stability(draws: pd.DataFrame, frame: pd.DataFrame, margin: float = NEAR_HALF_WIDTHS) -> pd.DataFrame:
    """Per verdict the rule selects on the atlas ``frame`` (:func:`near`): its class in the atlas
    (``cls``), its class under each draw of ``draws`` (rows of :func:`compare`; ``classes``, in draw
    order), whether it ``holds`` in every draw, the number of draws, and the range of the point
    estimate over the draws (``point_min``, ``point_max``) in the verdict's unit (``unit``: % of the
    default's goodput, or req/s where the atlas reads the difference because the default's goodput
    comes near zero in resamples), and its ``role`` (``near``: selected; ``control``: the far verdicts
    rerun as a control). ValueError if ``draws`` is stale: a verdict to rerun missing, one not to
    rerun present, or draw 0 not the atlas's own run (another ``served_in_deadline``)."""
    _need(draws, (*KEY, "served_in_deadline", "cls", "vs_default_pct", "vs_default_diff_rps"), "draws")
    sel = near(frame, margin=margin)
    sel = sel[sel["role"].isin(["near", "control"])]
    arms = draws[draws["arm"] != "default"]
    have = set(zip(arms["cell"], arms["engine"], arms["arm"]))
    want = set(zip(sel["cell"], sel["engine"], sel["arm"]))
    if have != want:
        raise ValueError(f"draws: stale -- verdicts {sorted(want - have)} missing, {sorted(have - want)} not to rerun "
                         "(rerun python -m kvdro.bench atlas-draws)")
    base = frame.set_index(["cell", "engine", "arm"])
    zero = draws[draws["draw"] == 0].set_index(["cell", "engine", "arm"])
    diff0 = base.loc[zero.index, "served_in_deadline"].astype(int) != zero["served_in_deadline"].astype(int)
    if len(zero) == 0 or diff0.any():
        raise ValueError(f"draws: draw 0 is not the atlas's run at {list(diff0[diff0].index)[:3]} "
                         "(rerun python -m kvdro.bench atlas-draws)")
    idx = arms.set_index(["cell", "engine", "arm"]).sort_values("draw", kind="stable")
    rows = []
    for r in sel.itertuples():
        k = (r.cell, r.engine, r.arm)
        d = idx.loc[[k]]
        diff = bool(base.loc[k, "vs_default_base_near_zero"])
        pts = [_point(x, diff) for _, x in d.iterrows()]
        cls = d["cls"].astype(int).tolist()
        rows.append({"cell": r.cell, "engine": r.engine, "arm": r.arm, "role": r.role, "cls": int(r.cls),
                     "nearness": r.nearness,
                     "classes": " ".join(f"{c:+d}" for c in cls), "draws": len(cls), "holds": all(c == r.cls for c in cls),
                     "point_min": min(pts), "point_max": max(pts), "unit": "req/s" if diff else "%"})
    return pd.DataFrame(rows)


_CLASS = {1: "beats", 0: "noise", -1: "loses"}


def _role(table: pd.DataFrame, role: str) -> pd.DataFrame:
    if role not in ("near", "control"):
        raise ValueError(f"role: must be 'near' or 'control', got {role!r}")
    _need(table, ("role",), "table")
    return table[table["role"] == role]


def engine_counts(table: pd.DataFrame, role: str = "near") -> dict[str, str]:
    """Per engine of :func:`stability`'s ``table``: how many of its verdicts in ``role`` (``near``: the
    selected ones; ``control``) keep their class in every draw, as "n of m" (the verdicts that do
    not: :func:`changes`)."""
    _need(table, ("engine", "holds"), "table")
    table = _role(table, role)
    if not len(table):
        raise ValueError(f"table: no verdict in the role {role!r}")
    return {e: f"{int(sub['holds'].sum())} of {len(sub)}" for e in atlas.ENGINES if len(sub := table[table["engine"] == e])}


def changes(table: pd.DataFrame, role: str = "near") -> pd.DataFrame:
    """The verdicts of :func:`stability`'s ``table`` in ``role`` whose class does not hold: the primary point, engine
    and arm, the atlas's class, how many draws give each class, and the range of the change over the
    draws (in % of the default's goodput, or req/s where the atlas reads the difference)."""
    _need(table, ("cell", "engine", "arm", "cls", "classes", "holds", "point_min", "point_max", "unit"), "table")
    table = _role(table, role)
    rows = []
    for r in table[~table["holds"].astype(bool)].itertuples():
        got = [int(c) for c in r.classes.split()]
        rows.append({"point": atlas.point_name(_cell(r.cell)), "engine": r.engine, "arm": r.arm,
                     "atlas (draw 0)": _CLASS[r.cls],
                     "classes over the draws": ", ".join(f"{_CLASS[k]} {got.count(k)}" for k in (1, 0, -1) if k in got),
                     "change over the draws": f"{_num(r.point_min, r.unit)} to {_num(r.point_max, r.unit)}"})
    return pd.DataFrame(rows, columns=["point", "engine", "arm", "atlas (draw 0)", "classes over the draws",
                                       "change over the draws"])


def _num(x: float, unit: str) -> str:
    return f"{x:+.1f}%" if unit == "%" else f"{x:+.3f} {unit}"


def _cell(key: str) -> atlas.Cell:
    return next(c for c in atlas.cells(points="primary") if c.key == key)
