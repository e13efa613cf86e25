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
   waits under 1 s, the residence line ``H = a + b L_in + c xi`` [s] (least squares over the served
   requests, H = finish - first admission), and the KV occupancy per Little's-law token m_kj
   (simulated mean KV tokens / sum_i lambda_i H_i (L_in^i + eta_i)).

:func:`calibration_loop` -- plan -> simulate -> recalibrate: solve with the calibrated model,
simulate the plan on the *training* half, replace the rows of the bands the plan visits by what the
plan's simulation measured (W, the residence line and m of each deployed configuration, at the band
of its planned utilisation), set each configuration's operating band (where H and m are read) to that
band, and re-solve, until the plan repeats or the predictions move by less than ``tol``.

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
from kvdro.joint.serving import CALIBRATION_COLUMNS, CALIBRATION_FILE, RATIO_LEVELS, CalibrationTable, band_edges, band_of
from kvdro.sim import Deployment, buffers_from_solution, policy_buffers, simulate
from kvdro.sim.plan import observed, simulate_solution

__all__ = [
    "SATURATION_REQUESTS",
    "MIN_REQUESTS",
    "SHORT_WAIT_S",
    "SOURCES",
    "training_trace",
    "measure_bands",
    "write_calibration",
    "measured_rows",
    "calibration_loop",
    "at_rate",
    "realised_rates",
    "AGREEMENT_CELLS",
    "plan_for",
    "agreement",
]

#: Requests of the closed-loop saturation run.
SATURATION_REQUESTS = 4000
#: Fewest requests in a band run (thinning below this stretches time instead).
MIN_REQUESTS = 3000
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


def _residence_line(req: pd.DataFrame) -> np.ndarray:
    """Least-squares (a, b, c) of finish - admit = a + b L_in + c xi over served requests [s]."""
    done = req[req["outcome"].isin(("completed", "truncated"))]
    h = (done["finish_s"] - done["admit_s"]).to_numpy(dtype=float)
    X = np.column_stack([np.ones(len(done)), done["input_tokens"].to_numpy(dtype=float), done["generated_tokens"].to_numpy(dtype=float)])
    coef, *_ = np.linalg.lstsq(X, h, rcond=None)
    return coef


def _band_row(engines: pd.DataFrame, req: pd.DataFrame, buffers: dict, blocks_tokens: float, horizon_s: float) -> dict:
    """Wait, residence line, KV occupancy ratio and e2e-ratio deciles of the requests ``req`` served by
    the micro-batch ``engines`` (rows of :attr:`SimResult.engines`) holding ``blocks_tokens`` KV tokens
    in all, over ``horizon_s`` seconds."""
    done = req[req["outcome"].isin(("completed", "truncated"))]
    wait = done["wait_s"].to_numpy(dtype=float)
    a, b, c = _residence_line(req)
    means = _class_means(done.assign(output_tokens=done["generated_tokens"]))
    H = a + b * means["L"] + c * means["xi"]
    r = means["L"] + pd.Series({k: buffers.get(k, 0.0) for k in means.index})
    formula = float((means["n"] / horizon_s * H * r).sum())
    kv_tokens = float(np.average(engines["kv_use_mean"], weights=engines["blocks"])) * blocks_tokens
    own = wait.mean() + a + b * done["input_tokens"].to_numpy(dtype=float) + c * done["generated_tokens"].to_numpy(dtype=float)
    ratio = done["e2e_s"].to_numpy(dtype=float) / np.maximum(own, 1e-3)
    deciles = np.quantile(ratio, RATIO_LEVELS)
    return {
        "wait_mean_s": float(wait.mean()),
        "wait_short_share": float((wait < SHORT_WAIT_S).mean()),
        "res_a_s": float(a),
        "res_b_s": float(b),
        "res_c_s": float(c),
        "kv_ratio": kv_tokens / formula if formula > 0 else 1.0,
        "kv_use": kv_tokens / blocks_tokens,
        "requests": int(len(done)),
        **{f"e2e_ratio_q{int(round(100 * lv))}": float(v) for lv, v in zip(RATIO_LEVELS, deciles)},
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


def measure_bands(source: str = "real", *, instance: Instance | None = None, seed: int = 0,
                  rho: float = 10.0, configs=None, bands=None, progress: bool = False) -> pd.DataFrame:
    """The calibration rows of ``source`` (module docstring): one per (configuration, band), with
    :data:`kvdro.joint.serving.CALIBRATION_COLUMNS`. ``instance`` gives the configurations and the
    bands (default the small paper instance's); ``configs`` (names) and ``bands`` (indices) restrict
    the measurement to some rows -- each row has its own seeded generator ``[seed, 15, k, j]``, so a
    row measured alone equals the same row of the full table."""
    from kvdro.joint.paper import paper_instance

    inst = paper_instance("small", 0) if instance is None else instance
    train = training_trace(source)
    buffers = dict(policy_buffers("dro", train, rho=rho))
    edges = band_edges(inst)
    rows = []
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
        for j, u in enumerate(edges):
            if bands is not None and j not in bands:
                continue
            trace = _at(train, float(u) * sat, np.random.default_rng([int(seed), 15, k, j]))
            res = simulate(trace, policy="dro", buffers=buffers, deployment=dep, rho=rho, rng=np.random.default_rng(0))
            row = _band_row(res.engines, res.requests, buffers, M, res.cost["horizon_s"])
            rows.append({"source": source, "config": cfg.name, "band": j, "u_edge": float(u), "rate_rps": float(u) * sat,
                         "sat_rps": float(sat), "work_scale": float(scale), **row})
            if progress:
                import sys

                print(f"calibration {source} {cfg.name} band {j} (u {u:.3f}): W {row['wait_mean_s']:.2f} s, "
                      f"m {row['kv_ratio']:.2f}", file=sys.stderr)
    return pd.DataFrame(rows, columns=list(CALIBRATION_COLUMNS))


def write_calibration(path: Path | str = CALIBRATION_FILE, *, sources=tuple(SOURCES), progress: bool = False) -> pd.DataFrame:
    """Measure every source and write the table to ``path`` (CSV, 6 significant digits)."""
    frame = pd.concat([measure_bands(s, progress=progress) for s in sources], ignore_index=True)
    frame.to_csv(path, index=False, float_format="%.6g")
    return frame


# ------------------------------------------------------------------------------------------------
# plan -> simulate -> recalibrate
# ------------------------------------------------------------------------------------------------


def measured_rows(instance: Instance, solution: Solution, res) -> pd.DataFrame:
    """Calibration rows measured on a plan's run: per deployed configuration, at the band of its
    planned utilisation, W, the residence line and m of the requests its groups served."""
    from kvdro.joint.serving import group_state

    u = group_state(instance, solution.z, solution.pi, solution.delta).utilisation
    bands = band_of(instance, u)
    owner = []
    for k in range(instance.n_configs):
        owner += [k] * int(solution.z[k])
    owner = np.array(owner)
    req = res.requests
    buffers = buffers_from_solution(instance, solution)
    rows = []
    for k, perf in enumerate(instance.configs):
        if solution.z[k] <= 0 or not (0 <= bands[k] < instance.waiting_bands):
            continue
        groups = np.flatnonzero(owner == k)
        mine = req[req["group"].isin(groups)]
        if (mine["outcome"].isin(("completed", "truncated"))).sum() < 30:
            continue
        engines = res.engines[res.engines["group"].isin(groups)]
        row = _band_row(engines, mine, buffers, float(perf.kv_capacity_tokens) * len(groups), res.cost["horizon_s"])
        rows.append({"config": perf.config.name, "band": int(bands[k]), "k": k, **row})
    return pd.DataFrame(rows)


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
        (iterations, final instance, final plan): one tidy row per iteration with the plan (z,
        operating bands), its objective, predicted and simulated e2e / goodput / KV, wall time [s].

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
    from kvdro.joint.serving import calibration_for, load_calibration

    table = instance.calibration or load_calibration(instance.calibration_source)
    inst = replace(instance, calibration=table)
    rows, seen, prev = [], [], None
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
        bands = calibration_for(inst).operating_bands
        rows.append({
            "iteration": it, "z": " ".join(str(int(v)) for v in sol.z), "operating_bands": " ".join(str(int(b)) for b in bands),
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
        meas = measured_rows(inst, sol, res)
        if meas.empty:
            rows[-1]["stop"] = "nothing to refit"
            break
        table = table.with_rows(meas.drop(columns=["k"]))
        new_bands = np.array(bands, dtype=int)
        new_bands[meas["k"].to_numpy(dtype=int)] = meas["band"].to_numpy(dtype=int)
        inst = replace(inst, calibration=table, operating_bands=tuple(int(b) for b in new_bands))
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

    Returns (metrics, plans, loops): ``metrics`` tidy rows (size, load, serving, trace_seed, scope =
    "all" or a class name, metric, predicted, simulated; ``trace_seed`` = ``seed`` for the instance's
    own test half, :data:`EXTRA_TRACE_SEEDS` for further realisations of the large instance's traffic,
    overall metrics only); ``plans`` one row per plan (configuration, buffers,
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
            row = {"size": size, "load": load, "serving": serving, **_describe_plan(inst, sol),
                   "objective": float(evaluate(inst, sol).total), "cost_realised_per_s": obs["cost_realised_per_s"],
                   "cost_paper_per_s": obs["cost_paper_per_s"], "plan_s": plan_s,
                   "loop_iterations": 1 if loop is None else len(loop)}
            if size == "large":
                for ts in EXTRA_TRACE_SEEDS:
                    extra = observed(inst, simulate_solution(inst, sol, paper_trace(size, seed, load=load, trace_seed=ts), seed=seed))
                    for m in ("e2e_mean_s", "goodput_rps", "kv_utilisation_mean"):
                        metrics.append({"size": size, "load": load, "serving": serving, "trace_seed": ts, "scope": "all",
                                        "metric": m, "predicted": pred[m], "simulated": extra[m]})
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
    return pd.DataFrame(metrics), pd.DataFrame(plans), pd.concat(loops, ignore_index=True) if loops else pd.DataFrame()
