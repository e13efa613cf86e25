"""Benchmark: every engine preset at the primary memory point, with each ``max_new`` (``kvdro.bench presets``).

The whole Azure 2023 conversation trace at 0.7 times its rate on 4 x TP2-PP1 (the paper's 8 A100s;
``default_deployment(config="TP2-PP1")``), served by each preset of :mod:`kvdro.sim.engines` with
``max_new`` unset, a client cap of 1,000 tokens, the DRO estimate (rho = 10, fitted in sample) as a
cap and, for the engines that take it, as a soft estimate (``"policy-soft"``), and the true lengths.
Per arm: goodput, its paired bootstrap interval against ``vllm-v1`` unset (the same 1,000 resamples of
requests for both arms, 95 %), P99 TTFT and end-to-end latency, preemptions or retractions, requests
capped at max_new, mean and peak KV use, and the wall time of the run (every preset but ``vllm-v0``
runs on its step-by-step reference engine: ~0.5-2.5 min per arm here, ~25 min in all).

``--write`` stores the table in ``data/engine_presets.csv`` with its manifest; ``--engines`` and
``--max-new`` restrict the grid (a restricted run is printed as such and never written).

``--cell long-output`` runs the same arms at the **long-output cell** (issue 32's second Must-show
point), the atlas's R1 cell on A100 (:func:`kvdro.experiments.atlas.cells`): ServeGen's DeepSeek-R1
reasoning workload on R1-Distill-Llama-70B, 2 x TP4-PP1 of A100-80GB (a deployment that fits its
131,072-token window), at the load the regime rule picks from ``data/regimes_workloads.csv``
(no memory-bound stable cell there, so the stable cell with the highest KV use: 1/16 of the
production rate). The reference engines are too slow for the hour at that load (69,333 requests
over 16 h of serving), so it plays a **contiguous window**, the hour's first
:data:`kvdro.experiments.atlas.R1_WINDOW_S` seconds, at that load (the CSV's ``window_s``). Its
client cap is the DeepSeek API's default ``max_tokens`` for its reasoner, 32,768 (1,000 would cut
half the reasoning outputs). DRO is fitted in sample, as at the primary point. Goodput divides by each run's own horizon (first
arrival to last completion), which a few 30,000-token reasoning outputs stretch: an arm that caps
them ends sooner, so its goodput can rise while it serves fewer requests. This cell therefore also
reports ``served_in_deadline`` and its paired change against ``vllm-v1`` (``served_vs_v1_pct``, the
same arrivals: a change of goodput over the common arrival span). ``--write`` stores it
in ``data/engine_presets_long.csv`` (a file of its own: chapter 7 reads ``engine_presets.csv`` keyed
by (engine, max_new)), with the implementation that ran each arm.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
CACHE = DATA / "engine_presets.csv"
LONG_CACHE = DATA / "engine_presets_long.csv"
KEY = ("engine", "max_new")
CELLS = ("primary", "long-output")
#: The max_new arms, in the table's order.
ARMS: tuple[str, ...] = ("unset", "1000", "policy", "policy-soft", "true")
BASELINE = ("vllm-v1", "unset")
LOAD, CONFIG, TRACE, RHO = 0.7, "TP2-PP1", "azure-2023-conv", 10.0


def _arm(trace: pd.DataFrame, dep, engine: str, max_new: str, cap: int = 1000) -> tuple[dict, np.ndarray, float]:
    from kvdro.sim import simulate

    mn: str | int = cap if max_new == "1000" else max_new
    policy = "dro" if max_new.startswith("policy") else "vllm"
    start = time.perf_counter()
    r = simulate(trace, policy=policy, deployment=dep, rng=np.random.default_rng(0), engine=engine, max_new=mn, rho=RHO)
    q = r.requests
    ok = q["outcome"].isin(["completed", "truncated"]).to_numpy() & (q["e2e_s"].to_numpy() <= q["deadline_s"].to_numpy())
    m = r.metrics
    row = {"engine": engine, "max_new": str(mn), "implementation": r.implementation, "goodput_rps": m["goodput_rps"], "ttft_p99_s": m["ttft_p99_s"],
           "e2e_p99_s": m["e2e_p99_s"], "preemptions": m["preemptions"], "capped": m.get("capped", 0),
           "completed": m["completed"], "ignored": m["ignored"], "kv_use_mean": m["kv_utilisation_mean"],
           "kv_use_peak": float(r.engines["kv_use_peak"].max()), "wall_s": time.perf_counter() - start}
    return row, ok, float(r.cost["horizon_s"])


def paired_interval(ok: np.ndarray, horizon: float, ok_base: np.ndarray, horizon_base: float, *,
                    resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Goodput of an arm relative to the baseline [%], with a 95 % paired bootstrap interval: the same
    resampled requests (indices) in both arms, and in each resample the ratio of the two goodputs
    minus one (so the interval, like the change itself, never passes -100 %); goodput = requests
    served within their deadline per second of the run's horizon. Resamples in which the baseline
    serves nothing have no ratio and are left out."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ok.size, size=(resamples, ok.size))
    arm = ok[idx].sum(axis=1) / horizon
    base = ok_base[idx].sum(axis=1) / horizon_base
    change = np.divide(arm, base, out=np.full(resamples, np.nan), where=base > 0) * 100 - 100
    if not np.isfinite(change).any():
        raise ValueError("ok_base: the baseline serves no request, a change against it is undefined")
    lo, hi = np.nanpercentile(change, [2.5, 97.5])
    return float((ok.sum() / horizon / (ok_base.sum() / horizon_base) - 1) * 100), float(lo), float(hi)


def long_output_cell():
    """The long-output cell (module docstring): the atlas's R1 cell on A100."""
    from kvdro.experiments import atlas

    return next(c for c in atlas.cells(["r1"]) if c.gpu == "a100-80gb")


def main(argv: list[str] | None = None) -> int:
    from kvdro.sim.engine_choice import SOFT_ENGINES
    from kvdro.sim.engines import ENGINES

    ap = argparse.ArgumentParser(prog="python -m kvdro.bench presets", description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated presets (default: all)")
    ap.add_argument("--max-new", default=",".join(ARMS), help=f"comma-separated arms (default: {','.join(ARMS)})")
    ap.add_argument("--cell", default="primary", choices=CELLS, help="the primary memory point or the long-output cell")
    ap.add_argument("--write", action="store_true", help="write the cell's table under data/ (full grid only)")
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    arms = [a for a in args.max_new.split(",") if a]
    bad = [e for e in engines if e not in ENGINES] + [a for a in arms if a not in ARMS]
    if bad:
        print(f"kvdro.bench presets: unknown engine or arm {bad} (engines {ENGINES}, arms {ARMS})")
        return 2
    full = set(engines) == set(ENGINES) and set(arms) == set(ARMS)
    pairs = [(e, a) for e in engines for a in arms if a != "policy-soft" or e in SOFT_ENGINES]
    if BASELINE not in pairs:  # the intervals are against it
        pairs.insert(0, BASELINE)
    if args.cell == "primary":
        from kvdro.datasets import load_trace
        from kvdro.sim import default_deployment
        from kvdro.sim.regimes import at_load

        trace, dep, cap, extra = at_load(load_trace(TRACE), LOAD), default_deployment(config=CONFIG), 1000, {}
        where = f"{TRACE} ({len(trace):,} requests) at load {LOAD}, {dep.describe()}"
    else:
        from kvdro.experiments import atlas

        cell = long_output_cell()
        trace, _, dep = atlas.cell_inputs(cell)
        cap = atlas.CLIENT_CAP[cell.workload]
        extra = {"cell": "long-output", "workload": "servegen-r1", "model": cell.model, "gpu": cell.gpu,
                 "deployment": cell.deployment, "load": cell.load, "rule": cell.rule, "window_s": cell.window_s}
        where = (f"servegen-r1, the first {cell.window_s:g} s of the hour (a contiguous window; {len(trace):,} requests) "
                 f"at load {cell.load:g} (rule: {cell.rule}), {cell.model}, {dep.describe()} of {cell.gpu}; client cap {cap:,}")
    print(where + ("" if full else "  [REDUCED grid: not the full table]"))
    rows, oks = [], {}
    for engine, arm in pairs:
        row, ok, horizon = _arm(trace, dep, engine, arm, cap)
        oks[(engine, row["max_new"])] = (ok, horizon)
        rows.append(row)
        print(f"  {engine:<15} {row['max_new']:<12} goodput {row['goodput_rps']:.3f} req/s, preemptions {row['preemptions']:,}, "
              f"capped {row['capped']:,} [{row['implementation']}] ({row['wall_s']:.0f} s)", flush=True)
    ok_b, h_b = oks[BASELINE]
    for row in rows:
        ok, h = oks[(row["engine"], row["max_new"])]
        row["goodput_vs_v1_pct"], row["ci_low_pct"], row["ci_high_pct"] = paired_interval(ok, h, ok_b, h_b)
        if args.cell != "primary":  # the same arrivals: the count served in time, without each run's own horizon
            row["served_in_deadline"] = int(ok.sum())
            row["served_vs_v1_pct"], row["served_ci_low_pct"], row["served_ci_high_pct"] = paired_interval(ok, 1.0, ok_b, 1.0)
    frame = pd.DataFrame(rows)
    print(frame.drop(columns=["completed", "ignored"]).to_string(index=False, float_format=lambda v: f"{v:,.3g}"))
    if args.write:
        if not full:
            print("kvdro.bench presets: --write needs the full grid (no --engines/--max-new)")
            return 2
        from kvdro.cachefile import ensure_writable, write_csv_atomic

        ensure_writable(DATA, f"{DATA} (where this benchmark writes its table)")
        if args.cell == "primary":
            path = write_csv_atomic(frame.drop(columns=["wall_s"]), CACHE, key=KEY, decimals=6)
        else:
            out = frame.drop(columns=["wall_s"]).assign(**extra)
            out = out[list(extra) + [c for c in out.columns if c not in extra]]
            path = write_csv_atomic(out, LONG_CACHE, key=KEY, decimals=6)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
