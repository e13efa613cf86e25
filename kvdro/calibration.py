"""The calibrated serving model: coefficients measured by the simulator, and the plan loop.

The planner (chapters 5-6) and the engine (chapter 7) disagree about where the system operates when
the planner uses chapter 4's analytic model (Kingman's stationary wait misses the traces' drift; H is
one constant per configuration). This module measures the planner's serving coefficients with the
simulator instead, so that both read one model (:mod:`kvdro.joint.serving`, ``serving="calibrated"``):

:func:`measure_bands` -- per configuration k (one serving group, :func:`kvdro.sim.simulate`, DRO
buffers at rho = 10 fitted on the same training half):

1. the saturation throughput mu_k [req/s]: the first :data:`SATURATION_REQUESTS` training requests
   all queued at once; ``work_scale_k = 1 / (mu_k Tbar_k)`` with Tbar_k the analytic work (1) of the
   training mix, so that ``u = lambda T`` is the share of the simulated saturation throughput;
2. for each utilisation band j (upper edge u_j of :func:`kvdro.joint.serving.band_edges`), the
   training half thinned at random to rate ``u_j mu_k`` (kept at >= :data:`MIN_REQUESTS` requests by
   stretching time instead when thinning would leave fewer): the mean wait W_kj [s], the share of
   waits under 1 s, the residence line ``H = a_j + b L_in + c_j xi`` [s] (:func:`fit_residence`: least
   squares over the served requests of all bands of k, H = finish - first admission, one prompt slope
   b per configuration), and the KV occupancy ratio m_kj: simulated mean KV tokens over what
   :func:`kvdro.joint.serving.kv_token_seconds` says the served requests hold (prompt for the
   residence, output as it grows: sum_i lambda_i (L_in^i H_ij + c_j E[xi_i^2] / 2)).

:func:`calibration_loop` -- plan -> simulate -> recalibrate: solve with the calibrated model,
simulate the plan on the *training* half, replace the rows of the bands the plan visits by what the
plan's simulation measured (W, the residence line with b_k fixed and m of each deployed
configuration, at the band of its planned utilisation; a row measured by several plans is their
mean, the method of successive averages), and re-solve, until the plan repeats or the predictions
move by less than ``tol``.

:func:`measure_mixes` and :func:`plan_groups` -- what the table cannot see: a group that routing gives
one family of classes (code, conversation) waits unlike a group serving the whole mix at the same
utilisation; these measure that, for chapter 7's section on the group's mix (the model itself still
reads the whole-mix table).

Imports point down: this module sits above :mod:`kvdro.sim` and :mod:`kvdro.joint`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro import queueing
from kvdro.joint import Instance, Solution, evaluate, solve_exact
from kvdro.joint.objective import predict_serving
from kvdro.joint.paper import paper_trace
from kvdro.joint.serving import (
    CALIBRATION_COLUMNS,
    CALIBRATION_FILE,
    CLASS_CALIBRATION_FILE,
    CLASS_COLUMNS,
    QUANTILE_LEVELS,
    RESIDENCE_QUANTILE_COLUMNS,
    WAIT_QUANTILE_COLUMNS,
    band_edges,
    band_of,
    residence_bin,
)
from kvdro.sim import Deployment, policy_buffers, simulate
from kvdro.sim.plan import observed, simulate_solution

__all__ = [
    "SATURATION_REQUESTS",
    "MIN_REQUESTS",
    "SHORT_WAIT_S",
    "SOURCES",
    "training_trace",
    "measure_bands",
    "measure_source",
    "write_calibration",
    "measured_rows",
    "calibration_loop",
    "at_rate",
    "realised_rates",
    "AGREEMENT_CELLS",
    "plan_for",
    "agreement",
    "MIX_BANDS",
    "family_of",
    "measure_mixes",
    "plan_groups",
    "first_plan_groups",
]

#: Requests of the closed-loop saturation run.
SATURATION_REQUESTS = 4000
#: Fewest requests in a band run (thinning below this stretches time instead).
MIN_REQUESTS = 3000
#: Fewest requests in an output-length bin whose residence spread is measured on its own.
MIN_BIN_REQUESTS = 20
#: A wait shorter than this counts as "no wait" in the goodput prediction [s].
SHORT_WAIT_S = 1.0
#: Calibration sources: the training half each family's table is measured on.
SOURCES = {"real": ("small", 0), "synthetic": ("large", 0)}


def training_trace(source: str) -> pd.DataFrame:
    """The training half of ``source`` (:data:`SOURCES`) at the trace's own rate (load 1)."""
    if source not in SOURCES:
        raise ValueError(f"source: must be one of {sorted(SOURCES)}, got {source!r}")
    size, seed = SOURCES[source]
    return paper_trace(size, seed, load=1.0, part="train")


def _class_means(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby("request_class", sort=True).agg(L=("input_tokens", "mean"), xi=("output_tokens", "mean"), n=("input_tokens", "size"))


def _served(req: pd.DataFrame) -> pd.DataFrame:
    return req[req["outcome"].isin(("completed", "truncated"))]


def _residence_columns(done: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h, L_in, xi) of served requests: residence finish - first admission [s], prompt and output [tokens]."""
    h = (done["finish_s"] - done["admit_s"]).to_numpy(dtype=float)
    return h, done["input_tokens"].to_numpy(dtype=float), done["generated_tokens"].to_numpy(dtype=float)


def fit_residence(runs: list[pd.DataFrame]) -> tuple[float, np.ndarray]:
    """Least squares of ``finish - admit = a_j + b L_in + c_j xi`` over the served requests of the runs
    ``runs`` (one per band j): one prompt slope b [s/token] for all of them (what keeps the banded H of
    :mod:`kvdro.joint.serving` linear in delta), an intercept a_j [s] and output slope c_j [s/token]
    per run. Returns (b, array of (a_j, c_j))."""
    cols = [_residence_columns(_served(r)) for r in runs]
    n = sum(h.size for h, _, _ in cols)
    J = len(cols)
    X = np.zeros((n, 2 * J + 1))
    y = np.empty(n)
    at = 0
    for j, (h, L, xi) in enumerate(cols):
        sl = slice(at, at + h.size)
        X[sl, j], X[sl, J + j], X[sl, -1] = 1.0, xi, L
        y[sl] = h
        at += h.size
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return float(coef[-1]), np.column_stack([coef[:J], coef[J:2 * J]])


def _fit_with_prompt_slope(req: pd.DataFrame, b: float) -> tuple[float, float]:
    """(a, c) of ``finish - admit - b L_in = a + c xi`` with the prompt slope b held fixed (the loop's refits)."""
    h, L, xi = _residence_columns(_served(req))
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones(h.size), xi]), h - b * L, rcond=None)
    return float(coef[0]), float(coef[1])


def _class_rows(req: pd.DataFrame, cached_prefix_s: dict | None = None) -> pd.DataFrame:
    """Per request class of the served requests ``req``: served count, mean wait [s], mean residence
    [s] (``cached_prefix_s``: class -> seconds its cached prefix saved, added back so that the row is
    the uncached residence), mean prompt and output [tokens], and the quantiles of end-to-end time
    over the class's mean (:data:`kvdro.joint.serving.E2E_RATIO_COLUMNS`)."""
    from kvdro.joint.serving import E2E_RATIO_COLUMNS

    saved = cached_prefix_s or {}
    rows = []
    for name, g in _served(req).groupby("request_class", sort=True):
        e2e = g["e2e_s"].to_numpy(dtype=float)
        rows.append({
            "request_class": name, "requests": int(len(g)), "wait_mean_s": float(g["wait_s"].mean()),
            "res_mean_s": float((g["finish_s"] - g["admit_s"]).mean()) + float(saved.get(name, 0.0)),
            "input_mean": float(g["input_tokens"].mean()), "output_mean": float(g["generated_tokens"].mean()),
            **dict(zip(E2E_RATIO_COLUMNS, (np.quantile(e2e, QUANTILE_LEVELS) / max(e2e.mean(), 1e-9)).astype(float))),
        })
    return pd.DataFrame(rows)


def _band_row(engines: pd.DataFrame, req: pd.DataFrame, line: tuple[float, float, float], blocks_tokens: float,
              horizon_s: float, cached_prefix: dict | None = None, groups: int = 1) -> dict:
    """Wait, residence line, KV occupancy ratio and spreads (wait and residence-ratio quantiles) of the
    requests ``req`` served by the micro-batch ``engines`` (rows of :attr:`SimResult.engines`,
    ``groups`` serving groups) holding
    ``blocks_tokens`` KV tokens in all, over ``horizon_s`` seconds, with the residence line
    ``line`` = (a, b, c). ``cached_prefix``: class -> prefix tokens it keeps in the cache (delta L_pre).

    The occupancy ratio m is the simulated mean KV tokens over :func:`kvdro.joint.serving.kv_token_seconds`
    summed over the classes at their served rates (plus the cached prefixes, one copy per group):
    what the prediction multiplies."""
    from kvdro.joint.serving import kv_token_seconds

    cached_prefix = cached_prefix or {}
    done = _served(req)
    wait = done["wait_s"].to_numpy(dtype=float)
    a, b, c = line
    means = _class_means(done.assign(output_tokens=done["generated_tokens"]))
    xi2 = done.assign(xi2=done["generated_tokens"].astype(float) ** 2).groupby("request_class", sort=True)["xi2"].mean()
    pre = pd.Series({k: float(cached_prefix.get(k, 0.0)) for k in means.index})
    H = a + b * (means["L"] - pre) + c * means["xi"]
    held = kv_token_seconds((means["L"] - pre).to_numpy(), H.to_numpy(), np.full(len(means), c), xi2.reindex(means.index).to_numpy())
    formula = float((means["n"].to_numpy() / horizon_s * held).sum()) + groups * float(pre.sum())
    kv_tokens = float(np.average(engines["kv_use_mean"], weights=engines["blocks"])) * blocks_tokens
    h, L, xi = _residence_columns(done)
    ratio = h / np.maximum(a + b * L + c * xi, 1e-3)
    bins = residence_bin(xi)
    spread = {}
    for bin_, cols in enumerate(RESIDENCE_QUANTILE_COLUMNS):
        mine = ratio[bins == bin_]
        mine = mine if mine.size >= MIN_BIN_REQUESTS else ratio  # too few in the bin: all requests' spread
        spread.update(zip(cols, np.quantile(mine, QUANTILE_LEVELS).astype(float)))
    return {
        "wait_mean_s": float(wait.mean()),
        "wait_short_share": float((wait < SHORT_WAIT_S).mean()),
        "res_a_s": float(a),
        "res_b_s": float(b),
        "res_c_s": float(c),
        "kv_ratio": kv_tokens / formula if formula > 0 else 1.0,
        "kv_use": kv_tokens / blocks_tokens,
        "requests": int(len(done)),
        **dict(zip(WAIT_QUANTILE_COLUMNS, np.quantile(wait, QUANTILE_LEVELS).astype(float))),
        **spread,
    }


def _analytic_work(model, perf, train: pd.DataFrame) -> float:
    """Count-weighted mean analytic work (1) of the training mix on ``perf`` [s]."""
    m = _class_means(train)
    T = [queueing.service_time(model, perf, row.L, row.xi) for row in m.itertuples()]
    return float(np.average(T, weights=m["n"]))


def _at(train: pd.DataFrame, rate: float, rng: np.random.Generator) -> pd.DataFrame:
    """``train`` at ``rate`` req/s: a random thinning (keeps the trace's time scale), or -- when that
    would leave fewer than :data:`MIN_REQUESTS` -- a thinning to that many, stretched in time."""
    span = float(train["arrival_s"].max() - train["arrival_s"].min())
    own = len(train) / span
    keep = min(1.0, max(rate / own, MIN_REQUESTS / len(train)))
    part = train[rng.random(len(train)) < keep].reset_index(drop=True)
    stretch = (keep * own) / rate
    return part.assign(arrival_s=(part["arrival_s"] - part["arrival_s"].min()) * stretch)


def measure_bands(source: str = "real", **kwargs) -> pd.DataFrame:
    """The calibration rows of ``source`` (:func:`measure_source` without the per-class rows)."""
    return measure_source(source, **kwargs)[0]


def measure_source(source: str = "real", *, instance: Instance | None = None, seed: int = 0,
                   rho: float = 10.0, configs=None, bands=None, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The calibration rows of ``source`` (module docstring): one per (configuration, band), with
    :data:`kvdro.joint.serving.CALIBRATION_COLUMNS`, and the per-class rows of the same runs
    (:data:`kvdro.joint.serving.CLASS_COLUMNS`). ``instance`` gives the configurations and the
    bands (default the small paper instance's); ``configs`` (names) and ``bands`` (indices) restrict
    the rows kept -- each band run has its own seeded generator ``[seed, 15, k, j]`` and every band
    of a measured configuration is simulated (the prompt slope is fitted over all of them), so a row
    measured alone equals the same row of the full table."""
    from kvdro.joint.paper import paper_instance

    inst = paper_instance("small", 0) if instance is None else instance
    train = training_trace(source)
    buffers = dict(policy_buffers("dro", train, rho=rho))
    edges = band_edges(inst)
    rows, class_rows = [], []
    for k, perf in enumerate(inst.configs):
        cfg = perf.config
        if configs is not None and cfg.name not in configs:
            continue
        dep = Deployment(groups=(cfg,), model=inst.model)
        M = float(perf.kv_capacity_tokens)
        first = train.sort_values("arrival_s", kind="stable").head(SATURATION_REQUESTS)
        burst = first.assign(arrival_s=np.linspace(0.0, 1.0, len(first)))
        sat_res = simulate(burst, policy="dro", buffers=buffers, deployment=dep, rho=rho, rng=np.random.default_rng(0))
        sat = sat_res.metrics["completed"] / sat_res.cost["horizon_s"]
        scale = 1.0 / (sat * _analytic_work(inst.model, perf, train))
        # every band is simulated (the prompt slope is fitted over all of them); rows outside ``bands`` are not kept
        runs = []
        for j, u in enumerate(edges):
            trace = _at(train, float(u) * sat, np.random.default_rng([int(seed), 15, k, j]))
            runs.append(simulate(trace, policy="dro", buffers=buffers, deployment=dep, rho=rho, rng=np.random.default_rng(0)))
        b, lines = fit_residence([res.requests for res in runs])
        for j, (u, res) in enumerate(zip(edges, runs)):
            if bands is not None and j not in bands:
                continue
            row = _band_row(res.engines, res.requests, (lines[j, 0], b, lines[j, 1]), M, res.cost["horizon_s"])
            rows.append({"source": source, "config": cfg.name, "band": j, "u_edge": float(u), "rate_rps": float(u) * sat,
                         "sat_rps": float(sat), "work_scale": float(scale), **row})
            class_rows.append(_class_rows(res.requests).assign(source=source, config=cfg.name, band=j))
            if progress:
                import sys

                print(f"calibration {source} {cfg.name} band {j} (u {u:.3f}): W {row['wait_mean_s']:.2f} s, "
                      f"m {row['kv_ratio']:.2f}", file=sys.stderr)
    frame = pd.DataFrame(rows, columns=list(CALIBRATION_COLUMNS))
    classes = pd.concat(class_rows, ignore_index=True)[list(CLASS_COLUMNS)] if class_rows else pd.DataFrame(columns=list(CLASS_COLUMNS))
    return frame, classes


def write_calibration(path: Path | str = CALIBRATION_FILE, *, sources=tuple(SOURCES), progress: bool = False,
                      classes_path: Path | str = CLASS_CALIBRATION_FILE) -> pd.DataFrame:
    """Measure every source and write the table to ``path`` and its per-class rows to ``classes_path``
    (CSV, 6 significant digits)."""
    parts = [measure_source(s, progress=progress) for s in sources]
    frame = pd.concat([p[0] for p in parts], ignore_index=True)
    from kvdro.cachefile import write_csv_atomic

    write_csv_atomic(frame, path, float_format="%.6g")
    write_csv_atomic(pd.concat([p[1] for p in parts], ignore_index=True), classes_path, float_format="%.6g")
    return frame


# ------------------------------------------------------------------------------------------------
# plan -> simulate -> recalibrate
# ------------------------------------------------------------------------------------------------


def measured_rows(instance: Instance, solution: Solution, res) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Calibration rows measured on a plan's run: per deployed configuration, at the band of its
    planned utilisation, W, the residence line (with the table's prompt slope b_k held fixed) and m
    of the requests its groups served; and the per-class rows of the same requests
    (:func:`_class_rows`, a cached prefix's saving added back)."""
    from kvdro.joint.serving import calibration_for, group_state

    cal = calibration_for(instance)

    u = group_state(instance, solution.z, solution.pi, solution.delta).utilisation
    bands = band_of(instance, u)
    owner = []
    for k in range(instance.n_configs):
        owner += [k] * int(solution.z[k])
    owner = np.array(owner)
    req = res.requests
    rows, class_rows = [], []
    for k, perf in enumerate(instance.configs):
        if solution.z[k] <= 0 or not (0 <= bands[k] < instance.waiting_bands):
            continue
        groups = np.flatnonzero(owner == k)
        mine = req[req["group"].isin(groups)]
        if (mine["outcome"].isin(("completed", "truncated"))).sum() < 30:
            continue
        engines = res.engines[res.engines["group"].isin(groups)]
        b = float(cal.residence[k, 0, 1])
        a, c = _fit_with_prompt_slope(mine, b)
        prefix = {cl.name: float(cl.prefix_tokens) for i, cl in enumerate(instance.classes) if solution.delta[i, k]}
        row = _band_row(engines, mine, (a, b, c), float(perf.kv_capacity_tokens) * len(groups), res.cost["horizon_s"],
                        cached_prefix=prefix, groups=len(groups))
        rows.append({"config": perf.config.name, "band": int(bands[k]), "k": k, **row})
        saved = {name: b * tokens for name, tokens in prefix.items()}
        class_rows.append(_class_rows(mine, saved).assign(config=perf.config.name, band=int(bands[k])))
    return pd.DataFrame(rows), (pd.concat(class_rows, ignore_index=True) if class_rows else pd.DataFrame())


def _mean_row(measurements: list[pd.Series], keys=("config", "band")) -> pd.Series:
    """The mean of several measurements of one (config, band[, class]) row (numbers averaged,
    ``requests`` summed; the ``keys`` kept)."""
    frame = pd.DataFrame(measurements)
    out = frame.iloc[0].copy()
    for col in frame.columns:
        if col == "requests":
            out[col] = int(pd.to_numeric(frame[col]).sum())
        elif col not in keys:
            out[col] = float(pd.to_numeric(frame[col]).mean())
    return out


def _f(v) -> float:
    """A prediction as a float (``None`` -- an overloaded group -- is infinite)."""
    return float("inf") if v is None else float(v)


def _plan_key(instance: Instance, sol: Solution) -> tuple:
    """What "the plan repeats" compares: groups, buffers, caching and the band each configuration visits
    (routing fractions move continuously and are compared through the bands they produce)."""
    from kvdro.joint.serving import group_state

    u = group_state(instance, sol.z, sol.pi, sol.delta).utilisation
    return (tuple(int(v) for v in sol.z), tuple(np.round(sol.r - instance.input_tokens).astype(int)),
            tuple(sol.delta.ravel()), tuple(int(b) for b in band_of(instance, u)))


def at_rate(trace: pd.DataFrame, rate: float) -> pd.DataFrame:
    """``trace`` with its arrival times scaled so that its mean rate is ``rate`` [req/s] (order and
    burstiness kept): the loop simulates the training half at the rate the instance plans for."""
    span = float(trace["arrival_s"].max() - trace["arrival_s"].min())
    own = len(trace) / span
    return trace.assign(arrival_s=(trace["arrival_s"] - trace["arrival_s"].min()) * own / float(rate))


def realised_rates(instance: Instance, trace: pd.DataFrame) -> Instance:
    """``instance`` with each class's rate set to its rate in ``trace`` (requests / trace span): the
    prediction at the realised traffic separates the model's error from the forecast's."""
    span = float(trace["arrival_s"].max() - trace["arrival_s"].min())
    counts = trace["request_class"].value_counts()
    classes = tuple(replace(c, arrival_rate=max(float(counts.get(c.name, 0)) / span, 1e-9)) for c in instance.classes)
    return replace(instance, classes=classes)


def calibration_loop(instance: Instance, *, trace: pd.DataFrame, solver=None, max_iter: int = 6, tol: float = 0.02,
                     seed: int = 0) -> tuple[pd.DataFrame, Instance, Solution]:
    """Plan -> simulate -> recalibrate (module docstring) from a calibrated ``instance``.

    Args:
        trace: the trace each plan is simulated on (the training half: the loop is part of planning).
        solver: ``instance -> Solution`` (default :func:`kvdro.joint.solve_exact`).
        max_iter: most plans solved; tol: stop when every prediction moved by less than this share.

    Returns:
        (iterations, final instance, final plan): one tidy row per iteration with the plan (z, the
        band of each configuration), its objective, predicted and simulated e2e / goodput / KV, and
        wall time [s].

    Raises:
        ValueError: ``instance`` is not calibrated, or bad ``max_iter``/``tol``.
    """
    if not isinstance(instance, Instance) or instance.serving != "calibrated":
        raise ValueError("instance: must be an Instance with serving='calibrated'")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter: must be a positive integer, got {max_iter!r}")
    if not (np.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol: must be a non-negative number, got {tol!r}")
    solve = solver or (lambda inst: solve_exact(inst))
    from kvdro.joint.serving import load_calibration

    table = instance.calibration or load_calibration(instance.calibration_source)
    inst = replace(instance, calibration=table)
    rows, seen, prev = [], [], None
    measured: dict[tuple[str, int], list[pd.Series]] = {}
    measured_classes: dict[tuple[str, int, str], list[pd.Series]] = {}
    start = time.perf_counter()
    sol = None
    for it in range(max_iter):
        t0 = time.perf_counter()
        sol = solve(inst)
        ev = evaluate(inst, sol)
        pred = predict_serving(inst, sol)
        res = simulate_solution(inst, sol, trace, seed=seed)
        obs = observed(inst, res)
        key = _plan_key(inst, sol)
        bands = band_of(inst, ev.utilisation)
        rows.append({
            "iteration": it, "z": " ".join(str(int(v)) for v in sol.z), "bands": " ".join(str(int(b)) for b in bands),
            "objective": float(ev.total), "pred_e2e_s": pred["e2e_mean_s"], "sim_e2e_s": obs["e2e_mean_s"],
            "pred_goodput_rps": pred["goodput_rps"], "sim_goodput_rps": obs["goodput_rps"],
            "pred_kv": pred["kv_utilisation_mean"], "sim_kv": obs["kv_utilisation_mean"],
            "wall_s": time.perf_counter() - t0,
        })
        moved = None if prev is None else max(
            abs(_f(pred[m]) - _f(prev[m])) / max(abs(_f(prev[m])), 1e-9) for m in ("e2e_mean_s", "goodput_rps", "kv_utilisation_mean"))
        rows[-1]["moved"] = moved
        if key in seen or (moved is not None and moved < tol):
            rows[-1]["stop"] = "plan repeats" if key in seen else f"predictions moved < {tol:.0%}"
            break
        seen.append(key)
        prev = pred
        meas, meas_classes = measured_rows(inst, sol, res)
        if meas.empty:
            rows[-1]["stop"] = "nothing to refit"
            break
        # successive averages: a visited row becomes the mean of every plan's measurement of it so far,
        # so a row two plans alternate between settles instead of flipping (the undamped loop cycled)
        for _, row in meas.drop(columns=["k"]).iterrows():
            measured.setdefault((row["config"], int(row["band"])), []).append(row)
        for _, row in meas_classes.iterrows():
            measured_classes.setdefault((row["config"], int(row["band"]), row["request_class"]), []).append(row)
        averaged = pd.DataFrame([_mean_row(v) for v in measured.values()])
        averaged_classes = pd.DataFrame([_mean_row(v, keys=("config", "band", "request_class")) for v in measured_classes.values()])
        table = table.with_rows(averaged, averaged_classes)
        inst = replace(inst, calibration=table)
    out = pd.DataFrame(rows)
    out.attrs["wall_s"] = time.perf_counter() - start
    return out, inst, sol


# ------------------------------------------------------------------------------------------------
# agreement: predicted vs simulated, analytic vs calibrated plan (chapter 7's section)
# ------------------------------------------------------------------------------------------------

#: (size, load) cells of the agreement study.
AGREEMENT_CELLS = (("small", 0.5), ("small", 1.0), ("large", 0.5), ("large", 1.0))
#: Further test realisations of the large instance's synthetic traffic (``paper_trace(trace_seed=...)``);
#: the small instance has one test half, the Azure hour's second half.
EXTRA_TRACE_SEEDS = (1, 2, 3)


def plan_for(size: str, load: float, serving: str, *, seed: int = 0, max_iter: int = 6):
    """(instance, plan, loop iterations or None): the analytic plan (one exact solve), or the calibrated
    plan after :func:`calibration_loop` on the instance's training half."""
    from kvdro.joint import paper_instance

    inst = paper_instance(size, seed, load=load, serving=serving)
    if serving == "analytic":
        return inst, solve_exact(inst), None
    train = at_rate(paper_trace(size, seed, load=load, part="train"), float(inst.rates.sum()))
    loop, inst, sol = calibration_loop(inst, trace=train, max_iter=max_iter, seed=seed)
    return inst, sol, loop


def _describe_plan(instance: Instance, sol: Solution) -> dict:
    names = [cfg.config.name for cfg in instance.configs]
    return {
        "z": " + ".join(f"{int(n)}x{names[k]}" for k, n in enumerate(sol.z) if n > 0),
        "gpus": int(instance.gpus @ sol.z),
        "buffers": " ".join(str(int(round(v))) for v in sol.r - instance.input_tokens),
        "rejected_share": float(np.average(sol.rejected, weights=instance.rates)),
        "cached_pairs": int(sol.delta.sum()),
    }


def agreement(cells=AGREEMENT_CELLS, *, seed: int = 0, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """For each (size, load) and serving model: the plan, its prediction and its simulation on the
    instance's test half.

    Returns (metrics, plans, loops): ``metrics`` tidy rows (size, load, serving, half = "test", or
    "train" for the plan simulated in sample on the training half at the planned rate, trace_seed,
    scope = "all" or a class name, metric, predicted, simulated; ``trace_seed`` = ``seed`` for the instance's
    own test half, :data:`EXTRA_TRACE_SEEDS` for further realisations of the large instance's traffic,
    overall metrics only; ``predicted_at_test_rates`` is the same plan predicted at that test trace's
    realised class rates, :func:`realised_rates`); ``plans`` one row per plan (configuration, buffers,
    rejected share, cached pairs, model objective, realised and paper-accounting cost per second,
    routing distance to the analytic plan); ``loops`` the calibration loops' iterations.
    """
    import sys

    from kvdro.sim.plan import observed, simulate_solution

    metrics, plans, loops = [], [], []
    for size, load in cells:
        test = paper_trace(size, seed, load=load, part="test")
        base = None
        for serving in ("analytic", "calibrated"):
            t0 = time.perf_counter()
            inst, sol, loop = plan_for(size, load, serving, seed=seed)
            plan_s = time.perf_counter() - t0
            pred = predict_serving(inst, sol)
            at_test = predict_serving(realised_rates(inst, test), sol)
            res = simulate_solution(inst, sol, test, seed=seed)
            obs = observed(inst, res)
            for m in ("e2e_mean_s", "goodput_rps", "kv_utilisation_mean"):
                metrics.append({"size": size, "load": load, "serving": serving, "trace_seed": seed, "scope": "all", "metric": m,
                                "predicted": pred[m], "simulated": obs[m], "predicted_at_test_rates": at_test[m]})
            for c in inst.classes:
                metrics.append({"size": size, "load": load, "serving": serving, "trace_seed": seed, "scope": c.name, "metric": "e2e_mean_s",
                                "predicted": pred["per_class_e2e_mean_s"][c.name], "simulated": obs["per_class_e2e_mean_s"][c.name],
                                "predicted_at_test_rates": at_test["per_class_e2e_mean_s"][c.name]})
                metrics.append({"size": size, "load": load, "serving": serving, "trace_seed": seed, "scope": c.name, "metric": "goodput_rps",
                                "predicted": pred["per_class_goodput_rps"][c.name], "simulated": obs["per_class_goodput_rps"][c.name],
                                "predicted_at_test_rates": at_test["per_class_goodput_rps"][c.name]})
            # in sample: the same plan on the training half it was made for (at the planned rate)
            train = at_rate(paper_trace(size, seed, load=load, part="train"), float(inst.rates.sum()))
            own = observed(inst, simulate_solution(inst, sol, train, seed=seed))
            for m in ("e2e_mean_s", "goodput_rps", "kv_utilisation_mean"):
                metrics.append({"size": size, "load": load, "serving": serving, "half": "train", "trace_seed": seed, "scope": "all",
                                "metric": m, "predicted": pred[m], "simulated": own[m]})
            row = {"size": size, "load": load, "serving": serving, **_describe_plan(inst, sol),
                   "objective": float(evaluate(inst, sol).total), "cost_realised_per_s": obs["cost_realised_per_s"],
                   "cost_paper_per_s": obs["cost_paper_per_s"], "plan_s": plan_s,
                   "loop_iterations": 1 if loop is None else len(loop)}
            if size == "large":
                for ts in EXTRA_TRACE_SEEDS:
                    other = paper_trace(size, seed, load=load, trace_seed=ts)
                    extra = observed(inst, simulate_solution(inst, sol, other, seed=seed))
                    at_other = predict_serving(realised_rates(inst, other), sol)
                    for m in ("e2e_mean_s", "goodput_rps", "kv_utilisation_mean"):
                        metrics.append({"size": size, "load": load, "serving": serving, "trace_seed": ts, "scope": "all",
                                        "metric": m, "predicted": pred[m], "simulated": extra[m],
                                        "predicted_at_test_rates": at_other[m]})
            if base is None:
                base = sol
                row["routing_l1_vs_analytic"] = 0.0
            else:
                row["routing_l1_vs_analytic"] = float(np.abs(sol.pi - base.pi).sum(axis=1).max())
            plans.append(row)
            if loop is not None:
                loops.append(loop.assign(size=size, load=load, loop_wall_s=loop.attrs["wall_s"]))
            if progress:
                print(f"agreement {size} load {load} {serving}: {row['z']}, pred/sim e2e {pred['e2e_mean_s']:.1f}/{obs['e2e_mean_s']:.1f} s, "
                      f"KV {pred['kv_utilisation_mean']:.3f}/{obs['kv_utilisation_mean']:.3f} ({plan_s:.0f} s)", file=sys.stderr)
    metrics = pd.DataFrame(metrics)
    metrics.insert(3, "half", metrics.pop("half").fillna("test"))
    return metrics, pd.DataFrame(plans), pd.concat(loops, ignore_index=True) if loops else pd.DataFrame()


# ------------------------------------------------------------------------------------------------
# what a single group serving the whole mix cannot see: the group's mix (chapter 7, the loop)
# ------------------------------------------------------------------------------------------------

#: Bands of the mix study (0-based; upper edges u = 0.60 and 0.80 at u_max = 0.9, B = 10).
MIX_BANDS = (3, 6)
#: Families of request classes: the Azure trace a class was cut from (the start of its name).
FAMILIES = ("code", "conversation")


def family_of(names) -> np.ndarray:
    """The family of each request class name (:data:`FAMILIES`: the part before the first ``-``).

    Raises:
        ValueError: a name that starts with no known family.
    """
    fam = np.array([str(n).split("-", 1)[0] for n in names], dtype=object)
    bad = sorted({str(n) for n, f in zip(names, fam) if f not in FAMILIES})
    if bad:
        raise ValueError(f"request_class: {bad[:3]} start with no family of {FAMILIES}")
    return fam


def _family_waits(req: pd.DataFrame) -> dict[str, tuple[int, float, float]]:
    done = _served(req)
    out = {}
    for fam, g in done.groupby(family_of(done["request_class"])):
        out[str(fam)] = (int(len(g)), float(g["wait_s"].mean()), float(g["e2e_s"].mean()))
    return out


def measure_mixes(source: str = "real", *, instance: Instance | None = None, seed: int = 0, rho: float = 10.0,
                  configs=None, bands=MIX_BANDS, thin: bool = True) -> pd.DataFrame:
    """One group of each configuration k at the upper edge u_j of band j, serving the training half's
    whole mix (the table's own band run: same thinning, same generator), or one family of classes
    alone (:data:`FAMILIES`), thinned the same way (:func:`_at`) to the same utilisation
    ``u_j = lambda Tbar_f work_scale_k`` (Tbar_f: the analytic work (1) of the family's mix;
    work_scale_k: the table's). ``thin=False``: every run is the trace slowed down to its rate
    instead (:func:`at_rate`: all requests, bursts kept whole -- what a group receives when a plan
    routes a class's whole stream to it at a load below 1).

    Returns one row per (config, band, mix, family served): ``mix`` "whole" or the family alone,
    ``u_family`` the served family's part of u (its share of the mix's analytic work; u itself when
    alone), ``rate_rps`` the run's arrival rate [req/s], ``requests`` served, ``wait_mean_s`` and
    ``e2e_mean_s`` [s] -- what the calibrated table, measured
    on the whole mix only, cannot tell the planner about a group that routing gives one family.
    """
    from kvdro.joint.paper import paper_instance
    from kvdro.joint.serving import load_calibration

    inst = paper_instance("small", 0) if instance is None else instance
    train = training_trace(source)
    fam = family_of(train["request_class"])
    table = load_calibration(source).frame.set_index(["config", "band"])
    buffers = dict(policy_buffers("dro", train, rho=rho))
    edges = band_edges(inst)
    rows = []
    for k, perf in enumerate(inst.configs):
        cfg = perf.config
        if configs is not None and cfg.name not in configs:
            continue
        dep = Deployment(groups=(cfg,), model=inst.model)
        for j in bands:
            if not 0 <= int(j) < len(edges):
                raise ValueError(f"bands: {j} is not a band of this instance (0..{len(edges) - 1})")
            row = table.loc[(cfg.name, int(j))]
            u = float(edges[j])
            mixes = [("whole", train, float(row["rate_rps"]), np.random.default_rng([int(seed), 15, k, int(j)]))]
            for f, name in enumerate(FAMILIES):
                part = train[fam == name]
                rate = u / (float(row["work_scale"]) * _analytic_work(inst.model, perf, part))
                mixes.append((name, part, rate, np.random.default_rng([int(seed), 16, k, int(j), f])))
            # each family's part of u in the whole mix: its share of the mix's analytic work
            work = {name: float((fam == name).sum()) * _analytic_work(inst.model, perf, train[fam == name]) for name in FAMILIES}
            for mix, part, rate, rng in mixes:
                trace = _at(part, rate, rng) if thin else at_rate(part, rate)
                res = simulate(trace, policy="dro", buffers=buffers, deployment=dep, rho=rho,
                               rng=np.random.default_rng(0))
                for served, (n, w, e2e) in _family_waits(res.requests).items():
                    u_family = u * work[served] / sum(work.values()) if mix == "whole" else u
                    rows.append({"source": source, "config": cfg.name, "band": int(j), "u_edge": u, "mix": mix,
                                 "family": served, "u_family": u_family, "rate_rps": rate, "requests": n,
                                 "wait_mean_s": w, "e2e_mean_s": e2e})
    return pd.DataFrame(rows)


def plan_groups(instance: Instance, solution: Solution, res) -> pd.DataFrame:
    """The groups of a simulated plan (``res`` = :func:`kvdro.sim.plan.simulate_solution`) by family:
    per deployed group, its configuration, planned utilisation and band, the share of its served
    requests from the code family, and per family the served requests, the simulated mean wait
    [s] and what the calibrated table charges them (the request-weighted mean of the classes' W_ikj
    at the band's upper edge, :func:`kvdro.joint.serving.band_class_waiting_s`)."""
    from kvdro.joint.serving import band_class_waiting_s, group_state

    u = group_state(instance, solution.z, solution.pi, solution.delta).utilisation
    bands = band_of(instance, u)
    W = band_class_waiting_s(instance)
    index = {c.name: i for i, c in enumerate(instance.classes)}
    owner = np.repeat(np.arange(instance.n_configs), np.asarray(solution.z, dtype=int))
    done = _served(res.requests)
    rows = []
    for g, k in enumerate(owner):
        mine = done[done["group"] == g]
        if mine.empty:
            continue
        fam = family_of(mine["request_class"])
        j = int(min(max(bands[k], 0), instance.waiting_bands - 1))
        for name in FAMILIES:
            part = mine[fam == name]
            if part.empty:
                continue
            charged = W[[index[c] for c in part["request_class"]], k, j]
            rows.append({"group": g, "config": instance.configs[k].config.name, "u": float(u[k]), "band": int(bands[k]),
                         "code_share": float((fam == "code").mean()), "family": name, "requests": int(len(part)),
                         "wait_sim_s": float(part["wait_s"].mean()), "wait_table_s": float(charged.mean())})
    return pd.DataFrame(rows)


def first_plan_groups(size: str = "small", load: float = 0.5, *, seed: int = 0) -> pd.DataFrame:
    """:func:`plan_groups` of the first plan of :func:`calibration_loop` for the paper instance
    ``size`` at ``load`` (the exact MILP on the cached table), simulated on the training half at the
    planned rate (what the loop's first iteration simulates)."""
    from kvdro.joint import paper_instance
    from kvdro.joint.serving import load_calibration
    from kvdro.sim.plan import simulate_solution

    inst = paper_instance(size, seed, load=load, serving="calibrated")
    inst = replace(inst, calibration=load_calibration(inst.calibration_source))
    train = at_rate(paper_trace(size, seed, load=load, part="train"), float(inst.rates.sum()))
    sol = solve_exact(inst)
    return plan_groups(inst, sol, simulate_solution(inst, sol, train, seed=seed))
