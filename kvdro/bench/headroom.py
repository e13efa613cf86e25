"""The oracle headroom map and the scheduling contrast of chapter 9: ``python -m kvdro.bench headroom``.

``--parts map`` writes ``data/headroom.csv`` (one row per workload x deployment x load:
:func:`kvdro.experiments.headroom.headroom`), ``data/headroom_bound.csv`` (the bound checked against
the oracle on every cell, :func:`kvdro.experiments.headroom.check_bound`) and
``data/headroom_summary.csv`` (per workload and deployment: the largest goodput gain of each
policy, in any cell and in stable cells). ``--parts scheduling`` writes
``data/headroom_scheduling.csv`` (FCFS vs shortest-output-first at the memory-bound, stable points
and the light point). ``--parts seeds`` writes ``data/headroom_seeds.csv``: the primary memory
point and every cell of the cached map where some policy gains >= 2.5 % of goodput, rerun under
8 routing draws over the same arrivals (:func:`kvdro.experiments.headroom.headroom_seeds`: per
draw, each policy's gain and block interval; per cell, the range over draws and the pooled gain
with its two-way interval). Prints each part's wall time, its cells and the CPU seconds of its cells (the
budget: <= 20 minutes with ``--n-jobs 2`` on 2 quiet cores), then the answer: the largest headroom
and where, whether a stable cell has >= 5 % goodput, and the bound's check on every cell (a failure
is printed with its cell, and the exit status is still 0: it is a result, not an error).
Cells are cached on disk (``$KVDRO_CACHE_DIR``); run with an empty one to time from scratch.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

PARTS = ("map", "scheduling", "seeds")
DATA = Path(__file__).resolve().parents[2] / "data"


def _write(frame: pd.DataFrame, name: str) -> Path:
    from kvdro.cachefile import write_csv_atomic

    return write_csv_atomic(frame, DATA / name, float_format="%.6g")  # atomic: a killed run leaves the old file


def per_workload(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, deployment): the largest goodput gain of oracle, best soft, DRO and exact over
    all loads, over the stable loads, and over the loads where its interval lies above 0 (0 if
    none: a point estimate on a cell with almost no goodput is noise); vLLM's largest recompute
    share and bound."""
    rows = []
    for (w, d), g in frame.groupby(["workload", "deployment"], sort=False):
        row = {"workload": w, "deployment": d, "max_recompute_share": float(g["recompute_share"].max()),
               "max_bound": float(g["bound"].max()), "stable_loads": int(g["stable"].sum())}
        for arm in ("oracle", "best", "dro", "exact"):
            row[f"{arm}_max_gain"] = float(g[f"{arm}_goodput_gain"].max())
            s = g[g["stable"]]
            row[f"{arm}_max_gain_stable"] = float(s[f"{arm}_goodput_gain"].max()) if len(s) else float("nan")
            sig = g[g[f"{arm}_goodput_gain_lo"] > 0]
            row[f"{arm}_max_gain_significant"] = float(sig[f"{arm}_goodput_gain"].max()) if len(sig) else 0.0
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench headroom", description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS))
    parser.add_argument("--n-jobs", type=int, default=1, help="worker processes (default 1)")
    args = parser.parse_args(argv)
    from kvdro.bench._common import at_least

    if not args.parts:
        parser.error(f"--parts: names no part; choose from {list(PARTS)}")
    at_least(parser, "--n-jobs", args.n_jobs, 1, "a number of worker processes >= 1")
    from kvdro.cachefile import ensure_writable

    ensure_writable(DATA, f"{DATA} (where this benchmark writes its tables)")
    from kvdro.experiments import headroom as h

    cpu_total = wall_total = 0.0
    if "map" in args.parts:
        t0 = time.perf_counter()
        df = h.headroom(n_jobs=args.n_jobs)
        dt = time.perf_counter() - t0
        cpu = float(df.pop("cpu_s").sum())
        chk = h.check_bound(df)
        paths = [_write(df, "headroom.csv"), _write(chk, "headroom_bound.csv"), _write(per_workload(df), "headroom_summary.csv")]
        wall_total, cpu_total = wall_total + dt, cpu_total + cpu
        print(f"map: {len(df)} cells in {dt:,.0f} s (cpu {cpu:,.0f} s): " + ", ".join(p.name for p in paths))
        s = h.summary(df)
        top = s["largest"]
        print(f"largest goodput gain of any reservation: {top['policy']} {top['gain']:+.1%} [{top['lo']:+.1%}, {top['hi']:+.1%}] "
              f"on {top['workload']}, {top['deployment']}, load {top['load']:g} ({'stable' if top['stable'] else 'not stable'})")
        dep = s["largest_deployable"]
        print(f"largest of a deployable reservation (best soft, DRO): {dep['policy']} {dep['gain']:+.1%} [{dep['lo']:+.1%}, "
              f"{dep['hi']:+.1%}] on {dep['workload']}, {dep['deployment']}, load {dep['load']:g}")
        sig = s["largest_deployable_significant"]
        print("largest deployable gain with its interval above 0: " + (
            f"{sig['policy']} {sig['gain']:+.2%} [{sig['lo']:+.2%}, {sig['hi']:+.2%}] on {sig['workload']}, {sig['deployment']}, "
            f"load {sig['load']:g}" if sig else "none"))
        print(f"cells with >= 5 % goodput (interval above 0): {len(s['cells_with_5pct'])}; stable ones: {len(s['stable_cells_with_5pct'])}")
        for r in s["cells_with_5pct"].itertuples():
            print(f"  {r.policy} {r.gain:+.1%} [{r.lo:+.1%}, {r.hi:+.1%}] {r.workload}, {r.deployment}, load {r.load:g}"
                  f" ({'stable' if r.stable else 'not stable'})")
        bad = s["bound_failures"]
        print(f"[{'PASS' if bad.empty else 'FAIL'}] bound (service rate; completion rate where saturated) "
              f"against the oracle on all {len(chk)} cells")
        for r in bad.itertuples():
            print(f"  {r.workload}, {r.deployment}, load {r.load:g}: bound {r.bound:.2%} (engines {r.engine_bound:.2%}), "
                  f"oracle service {r.oracle_service_gain:+.2%}, completion {r.oracle_throughput_gain:+.2%}, "
                  f"c_oracle / c_vllm {r.oracle_cost_ratio:.3f}")
        above = s["goodput_above_bound"]
        print(f"oracle goodput gain above the bound (not covered by the theorem) in {len(above)} cells")
        for r in above.itertuples():
            print(f"  {r.workload}, {r.deployment}, load {r.load:g}: goodput {r.oracle_goodput_gain:+.2%} vs bound "
                  f"{max(r.bound, r.engine_bound):.2%} ({'stable' if r.stable else 'not stable'})")
    if "scheduling" in args.parts:
        t0 = time.perf_counter()
        df = h.scheduling(n_jobs=args.n_jobs)
        dt = time.perf_counter() - t0
        cpu = float(df.pop("cpu_s").sum())
        path = _write(df, "headroom_scheduling.csv")
        wall_total, cpu_total = wall_total + dt, cpu_total + cpu
        print(f"scheduling: {len(df)} cells in {dt:,.0f} s (cpu {cpu:,.0f} s): {path.name}")
        cols = ["point", "deployment", "load", "arm", "goodput_gain", "e2e_mean_change", "e2e_p99_change", "ttft_mean_change",
                "ttft_p99_change"]
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(df[cols].round(3).to_string(index=False))
    if "seeds" in args.parts:
        t0 = time.perf_counter()
        df = h.headroom_seeds(frame=h.load_headroom(DATA / "headroom.csv"), n_jobs=args.n_jobs)
        dt = time.perf_counter() - t0
        cpu = float(df.attrs["cpu_s"])
        path = _write(df, "headroom_seeds.csv")
        wall_total, cpu_total = wall_total + dt, cpu_total + cpu
        cells = df[df["kind"] == "summary"][["workload", "deployment", "load"]].drop_duplicates()
        print(f"seeds: {len(cells)} cells x {len(h.ROUTING_SEEDS)} routing draws in {dt:,.0f} s (cpu {cpu:,.0f} s): {path.name}")
        for r in df[df["kind"] == "summary"].itertuples():
            if r.policy == "oracle" or r.seeds_counted > 0 or r.gain_max >= 0.05:
                print(f"  {r.policy:6s} {r.workload}, {r.deployment}, load {r.load:g}: {100 * r.gain_min:+.1f}% to "
                      f"{100 * r.gain_max:+.1f}% (median {100 * r.gain_median:+.1f}%); >= 5 % beyond noise in "
                      f"{r.seeds_counted:.0f}/{r.n_seeds:.0f}, stable in {r.seeds_stable:.0f}/{r.n_seeds:.0f}; pooled {100 * r.gain:+.1f}% "
                      f"[{100 * r.lo:+.1f}, {100 * r.hi:+.1f}]")
    from kvdro.experiments.runner import available_cpus

    workers = min(args.n_jobs, available_cpus())  # run_sweep caps the workers at the CPUs (and the cells)
    print(f"all: {wall_total:,.0f} s wall, {cpu_total:,.0f} CPU s of the cells; CPU / n_jobs = "
          f"{cpu_total / workers:,.0f} s (the wall time on {workers} quiet cores)")
    return 0
