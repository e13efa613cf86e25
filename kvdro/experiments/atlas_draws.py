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
half-width: the half-width is the block-to-block noise of that very comparison, and the only
measurement of what a routing draw does, chapter 8's seed study (``data/headroom_seeds.csv``: 20
cells x 4 policies x 8 routing draws over the same arrivals), moved a gain by at most a median 0.68
of its draw-0 half-width over seven other draws, and every class change it saw happened where d was
at most 1.0 half-width (:func:`calibration` recomputes both from the cached file). A fixed margin in
points would not do: the atlas's intervals run from a tenth of a point to hundreds of points wide.

Two kinds of verdict are left out, said per row (``reason``): a ``true`` arm on an engine whose
admission never reads ``max_new`` (:data:`UNREAD`: the cap at the true length changes nothing, the
run is the default's bit for bit under every draw), and nothing else. The cell's load is not used:
every primary point is a stable point of its regime map by the atlas's rule, and a draw that moves
the regime shows up in the verdict's change, which is what is rerun.

**The rerun** (:func:`tasks`, :func:`run`, ``python -m kvdro.bench atlas-draws``): for each
(primary point, engine) with a selected verdict, the engine's ``default`` and each selected arm
under the routing draws :data:`DRAWS` (seed 0, the atlas's own, reproduced as a check of the hook,
then K = ``len(DRAWS) - 1`` new draws), the arrivals and the fitted estimates fixed;
:func:`compare` pairs each arm with its own draw's default (:func:`kvdro.experiments.atlas.compare`),
and :func:`stability` says per verdict whether its class holds in every draw and the range of its
point estimate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvdro.experiments import atlas

__all__ = ["NEAR_HALF_WIDTHS", "ARMS", "UNREAD", "near", "calibration"]

#: The rule's margin: a verdict is near a threshold when zero is within this many half-widths of its
#: paired interval's nearer end (module docstring; chosen from chapter 8's seed study before any run).
NEAR_HALF_WIDTHS: float = 1.0
#: The verdict arms rerun (against the engine's ``default``).
ARMS: tuple[str, ...] = ("dro", "dro-soft", "true")
#: Engines whose admission never reads ``max_new``, so that the ``true`` arm is the default's run
#: under every draw: :func:`kvdro.sim.engine_choice.generation_limits` gives it each request's own
#: window cap as ``max_new`` (no request is capped, every limit is the default's), and the admission
#: does not look at it -- vLLM v0 (:mod:`kvdro.sim.scheduler`, after vLLM v0.6
#: ``vllm/core/block_manager.py``: blocks allocated as tokens arrive) and
#: :data:`kvdro.experiments.atlas.MAX_NEW_UNREAD`.
UNREAD: tuple[str, ...] = ("vllm-v0", *atlas.MAX_NEW_UNREAD)


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
    tie at zero, inf for a zero-width interval away from zero), ``selected`` and ``reason``.
    ValueError names a bad ``frame`` or ``margin``."""
    _need(frame, _VERDICT_COLS, "frame")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not np.isfinite(margin) or margin < 0:
        raise ValueError(f"margin: must be a finite number of half-widths >= 0, got {margin!r}")
    keys = [c.key for c in atlas.cells(points="primary")] if primary is None else list(primary)
    v = frame[frame["cell"].isin(keys) & frame["arm"].isin(ARMS)].copy()
    if not len(v):
        raise ValueError("frame: no verdict (arms dro, dro-soft, true) at the primary cells")
    v["cls"] = [atlas._sign(r) for _, r in v.iterrows()]
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
    order = {k: i for i, k in enumerate(keys)}
    v = v.assign(_c=v["cell"].map(order), _e=v["engine"].map({e: i for i, e in enumerate(atlas.ENGINES)}),
                 _a=v["arm"].map({a: i for i, a in enumerate(ARMS)}))
    v = v.sort_values(["_c", "_e", "_a"], kind="stable")
    return v[["cell", "engine", "arm", "cls", "diff_lo", "diff_hi", "nearness", "selected", "reason"]].reset_index(drop=True)


def calibration(seeds: pd.DataFrame | None = None) -> dict[str, float]:
    """What a routing draw did in chapter 8's seed study (``seeds``: the rows ``kind == "seed"`` of
    :func:`kvdro.experiments.headroom.headroom_seeds`, the cached ``data/headroom_seeds.csv`` by
    default), in half-widths of each (cell, policy)'s draw-0 interval of its goodput gain:
    ``pairs`` (cell, policy) compared, ``move_median`` and ``move_p90`` (the largest move of the gain
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
    return {"pairs": int(len(base)), "move_median": float(np.median(rel)), "move_p90": float(np.quantile(rel, 0.9)),
            "flips": int(flip.sum()), "flip_nearness_max": float(near_rel[flip[flip].index].max())}
