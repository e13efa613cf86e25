"""The regime map on long-context and reasoning workloads: ``python -m kvdro.bench regimes-new``.

Runs :func:`kvdro.experiments.workload_regimes.regime_map` -- Mooncake conversation on Llama-3.1-70B,
ServeGen R1 (the first hour at production rate) on R1-Distill-Llama-70B, Azure conversation on
Llama-2-7B, each on A100-80GB and H100-80GB, every 8-GPU deployment of one configuration that fits
the model with its window, ten loads fixed before the run -- under vLLM v0's policy, writes
``data/regimes_workloads.csv`` (atomically) and prints the prompts refused by the window, the
regimes per deployment and each (workload, GPU, deployment)'s memory-bound, stable operating point
with vLLM's recompute share and the share of requests it preempts there. Quality bar (issue 33):
the whole map in <= 5 minutes of wall time with ``--n-jobs 2`` here.

``--workloads W1,W2`` runs only those workloads (e.g. ``azure-conv-70b``, Llama-2-70B on H100, added
after the map) and merges their rows into the cached map
(:func:`kvdro.experiments.workload_regimes.merge_map`); it checks that every line of the other
workloads is byte-identical after the write (exit 1 if not). The 5-minute bar is the whole map's.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

BUDGET_S = 300.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench regimes-new", description=__doc__.splitlines()[0])
    parser.add_argument("--n-jobs", type=int, default=2, help="worker processes (capped at the CPUs; default 2)")
    parser.add_argument("--no-write", action="store_true", help="do not write data/regimes_workloads.csv")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated workloads to (re)run and merge into the cached map (default: the whole map)")
    args = parser.parse_args(argv)
    if args.n_jobs < 1:
        parser.error(f"--n-jobs: must be >= 1, got {args.n_jobs}")

    from kvdro.experiments import workload_regimes as wr
    from kvdro.experiments.runner import available_cpus

    try:
        subset = None if args.workloads is None else wr.check_workloads(tuple(w for w in args.workloads.split(",") if w))
    except ValueError as exc:
        parser.error(str(exc))
    grid = wr.cells() if subset is None else wr.cells(subset)
    start = time.perf_counter()
    frame = wr.regime_map(grid, n_jobs=args.n_jobs)
    wall = time.perf_counter() - start
    same = True
    if not args.no_write:
        if subset is None:
            print(f"wrote {wr.write_map(frame)}")
        else:
            same = _merge_and_check(wr, frame)
    print(f"{len(grid)} cells in {wall:.0f} s wall with {min(args.n_jobs, len(grid), available_cpus())} job(s)")

    print("\nRequests refused by the window (vLLM ignores a longer prompt) and outputs capped at it, per trace:")
    for w, part in frame.groupby("workload", sort=False):
        r = part.iloc[0]
        print(f"  {wr.WORKLOADS[w][2]}: {int(r['requests']):,} requests, {int(r['ignored']):,} ignored "
              f"({r['ignored'] / r['requests']:.2%}), {int(r['truncated']):,} truncated")

    print("\nRegimes by load (M memory-bound & stable, m memory-bound & saturated, c compute-saturated, "
          "l light, . between):")
    code = {"memory-bound": "M", "memory-bound, saturated": "m", "compute-saturated": "c", "light": "l", "between": "."}
    for (w, g, d), part in frame.groupby(["workload", "gpu", "deployment"], sort=False):
        marks = "".join(code[x] for x in part.sort_values("load")["regime"])
        print(f"  {w:>14} {g:>10} {d:>12}  {marks}   loads {part['load'].min():g}-{part['load'].max():g}")

    points = wr.operating_points(frame)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print("\nOperating points (exact = memory-bound and stable; otherwise the nearest stable cell where vLLM preempts):")
        print(points.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    found = int(points["exact"].sum())
    print(f"\n{found} of {len(points)} (workload, GPU, deployment) have a memory-bound, stable operating point")
    if subset is not None:
        return 0 if same else 1
    ok = wall <= BUDGET_S
    print(f"[{'PASS' if ok else 'FAIL'}] the whole map in <= {BUDGET_S:.0f} s wall ({wall:.0f} s)")
    return 0 if ok else 1


def _merge_and_check(wr, frame: pd.DataFrame) -> bool:
    """Merge ``frame``'s workloads into the cached map, write it, and check that the lines of the other
    workloads are byte-identical before and after (printed PASS / FAIL)."""
    from kvdro.cachefile import read_csv_checked

    labels = ("slo_floor", "slo_excess", "backlog_growing", "stable", "saturated", "memory_bound", "light", "regime")
    measured = frame.drop(columns=[c for c in labels if c in frame.columns])
    before = wr.CSV.read_text().splitlines() if wr.CSV.is_file() else []
    old = read_csv_checked(wr.CSV, key=wr.KEY, remake=wr.COMMAND) if before else pd.DataFrame()
    print(f"wrote {wr.write_map(wr.merge_map(measured, old))} ({len(measured)} rows of {sorted(set(measured['workload']))})")
    after = wr.CSV.read_text().splitlines()
    rerun = set(measured["workload"])
    kept = [ln for ln in before[1:] if ln.split(",", 1)[0] not in rerun]
    ok = (not before or before[0] == after[0]) and kept == [ln for ln in after[1:] if ln.split(",", 1)[0] not in rerun]
    print(f"[{'PASS' if ok else 'FAIL'}] the {len(kept)} rows of the other workloads are byte-identical after the merge")
    return ok
