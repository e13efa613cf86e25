"""Benchmark of BCD-DRO against the exact solver: ``python -m kvdro.bench bcd [PART ...]``.

Parts (default ``core``; ``all`` runs every part); each writes a small CSV under ``data/`` that
chapter 6 reads:

* ``core`` -> ``data/bcd_gap.csv``, ``data/bcd_trace.csv``, ``data/bcd_large.csv``:
  the gap of BCD (both Block-2 rules) to the proven optimum on 20 seeded small instances (and 10 at
  ``load=1.0``, where memory binds), the objective after every block of every run, and the large
  instance (15 classes, J = 48, 1,000 samples, seed 0) solved by BCD and by the exact MILP in the
  same run (quality bar: BCD <= 10 s).
* ``table3`` -> ``data/bcd_table3.csv``: the paper's Table III redone, classes {3, 6, 10, 15} x
  J {8, 16, 48}: exact (proven optimal, or its gap at the time limit) and BCD.
* ``scaling`` -> ``data/bcd_scaling.csv``: past the paper, classes {15, 50, 100} x J {48, 256, 1024}:
  BCD on every cell, the exact MILP on the cells listed in ``EXACT_SCALING`` with a 5-minute limit.
* ``rolling`` -> ``data/bcd_rolling.csv``: rolling-horizon re-optimisation of the large instance on
  windows whose output lengths drift; BCD warm- and cold-started, exact, and the static decision.

Every exact solve runs in a child process with a wall-clock limit (HiGHS's own limit does not cover
building a very large CVXPY model). Times are wall clock on a shared machine: compare them only
within one run, as ratios. Needs the Azure 2023 traces (``KVDRO_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

import pandas as pd

from kvdro.bench._common import quiet_fd1

DATA = Path(__file__).resolve().parents[2] / "data"
GOAL_S = 10.0  # BCD on the large instance
GAP_GOAL = 0.01  # median gap on the small seeds
SMALL_SEEDS = 20
STRESS_SEEDS = 10  # small seeds at load 1.0
TABLE3 = [(n, j) for n in (3, 6, 10, 15) for j in (8, 16, 48)]
TABLE3_LIMIT = 120.0
SCALING = [(n, j) for n in (15, 50, 100) for j in (48, 256, 1024)]
EXACT_SCALING = [(15, 48), (15, 256), (50, 256), (100, 1024)]
WINDOW_S = 300.0  # the paper's 5-10 minute re-optimisation window, lower end
ROLLING_SHIFTS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
COMMAND = "KVDRO_DATA_DIR=../shared/data .venv/bin/python -m kvdro.bench bcd"




def _instance(spec: tuple):
    from kvdro.bcd.scaling import scaled_instance
    from kvdro.joint import paper_instance

    kind, *args = spec
    if kind == "paper":
        size, seed, load = args
        return paper_instance(size, seed, load=load)
    n, j, seed = args
    return scaled_instance(n, j, seed)


def _exact_child(spec: tuple, time_limit: float, queue) -> None:
    from kvdro.joint import Solution, evaluate, solve_milp

    try:
        with quiet_fd1():
            inst = _instance(spec)
            t0 = time.perf_counter()
            res = solve_milp(inst, time_limit=time_limit)
            wall = time.perf_counter() - t0
    except Exception as exc:  # reported, not hidden: the row says what went wrong
        queue.put({"exact_status": f"error: {type(exc).__name__}: {exc}"[:200]})
        return
    out = {
        "exact_status": res.status,
        "exact_time_s": wall,
        "exact_highs_s": res.time_s,
        "exact_build_s": res.build_s,
        "exact_incumbent": res.objective,
        "exact_bound": res.bound,
        "exact_mip_gap": res.mip_gap,
        "exact_variables": res.n_variables,
        "exact_objective": math.nan,
    }
    if res.decision is not None:
        z, r, pi, d = res.decision
        out["exact_objective"] = evaluate(inst, Solution(z=z, r=r, pi=pi, delta=d)).total
        out["exact_z"] = " ".join(map(str, z))
    queue.put(out)


def run_exact(spec: tuple, time_limit: float, wall_limit: float) -> dict:
    """The exact MILP on ``spec`` in a child process; killed after ``wall_limit`` seconds."""
    ctx = mp.get_context("spawn")  # not fork: a forked HiGHS would inherit a dead thread pool
    queue = ctx.Queue()
    proc = ctx.Process(target=_exact_child, args=(spec, time_limit, queue))
    t0 = time.perf_counter()
    proc.start()
    try:
        out = queue.get(timeout=wall_limit)
    except Exception:  # queue.Empty: the wall limit passed
        out = {"exact_status": "wall_limit", "exact_time_s": time.perf_counter() - t0}
    proc.join(timeout=5)
    if proc.is_alive():
        proc.terminate()  # our own child, by its handle
        proc.join()
    return out


def run_bcd_spec(inst, **kw) -> dict:
    from kvdro.bcd import run_bcd
    from kvdro.joint import evaluate

    with quiet_fd1():
        run = run_bcd(inst, **kw)
    ev = evaluate(inst, run.solution)
    return {
        "bcd_objective": ev.total,
        "bcd_feasible": ev.feasible,
        "bcd_time_s": run.solution.solve_time_s,
        "bcd_iterations": run.iterations,
        "bcd_converged": run.converged,
        "bcd_ip_solves": run.solves["Block 3 IP"],
        "bcd_knapsacks": run.solves["LP2 knapsack"],
        "bcd_z": " ".join(map(str, run.solution.z)),
        "_run": run,
    }


def _warm(inst) -> None:
    """Compute the instance's cached tables (not part of any solver's time)."""
    _ = inst.candidate_costs, inst.residence_s, inst.service_s, inst.mix_waiting_coefficients


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)


def part_core(args) -> bool:
    rows, trace_rows = [], []
    cases = [(s, 0.5) for s in range(args.seeds)] + [(s, 1.0) for s in range(args.stress)]
    with _progress(len(cases), "small seeds") as bar:
        for seed, load in cases:
            spec = ("paper", "small", seed, load)
            row = {"seed": seed, "load": load} | {k: v for k, v in run_exact(spec, 600.0, 900.0).items()}
            inst = _instance(spec)
            _warm(inst)
            for rule in ("descent", "paper"):
                res = run_bcd_spec(inst, delta_rule=rule)
                run = res.pop("_run")
                row |= {f"{k}_{rule}": v for k, v in res.items()}
                for step, rec in enumerate(run.trace):
                    trace_rows.append({"instance": "small", "seed": seed, "load": load, "rule": rule, "step": step,
                                       "iteration": rec.iteration, "block": rec.block, "objective": rec.objective})
            rows.append(row)
            bar.update(1)
    gap = pd.DataFrame(rows)
    for rule in ("descent", "paper"):
        gap[f"gap_{rule}"] = (gap[f"bcd_objective_{rule}"] - gap["exact_objective"]) / gap["exact_objective"]
    gap.to_csv(DATA / "bcd_gap.csv", index=False, float_format="%.10g")

    # the large instance: BCD (both rules) and exact, same run
    spec = ("paper", "large", 0, 0.5)
    inst = _instance(spec)
    _warm(inst)
    large = {"instance": "large", "seed": 0}
    for rule in ("descent", "paper"):
        res = run_bcd_spec(inst, delta_rule=rule)
        run = res.pop("_run")
        large |= {f"{k}_{rule}": v for k, v in res.items()}
        for step, rec in enumerate(run.trace):
            trace_rows.append({"instance": "large", "seed": 0, "load": 0.5, "rule": rule, "step": step,
                               "iteration": rec.iteration, "block": rec.block, "objective": rec.objective})
    large |= run_exact(spec, 600.0, 900.0)
    pd.DataFrame([large]).to_csv(DATA / "bcd_large.csv", index=False, float_format="%.10g")
    pd.DataFrame(trace_rows).to_csv(DATA / "bcd_trace.csv", index=False, float_format="%.10g")

    main = gap[gap["load"] == 0.5]
    print(f"BCD-DRO vs exact on {len(main)} small seeds (load 0.5) and {len(gap) - len(main)} at load 1.0")
    for rule in ("descent", "paper"):
        g = main[f"gap_{rule}"]
        print(f"  delta rule {rule:>8}: gap median {g.median():.4%}, max {g.max():.4%}, min {g.min():+.2e}; "
              f"load 1.0 median {gap.loc[gap['load'] == 1.0, f'gap_{rule}'].median():.4%}")
    below = (gap[["gap_descent", "gap_paper"]].min(axis=1) < -1e-6).sum()
    t_b, t_e = large["bcd_time_s_descent"], large.get("exact_time_s", math.nan)
    print(f"large seed 0: BCD {t_b:.2f} s (objective {large['bcd_objective_descent']:.2f}), exact {large['exact_status']} "
          f"in {t_e:.1f} s (objective {large.get('exact_objective', math.nan):.2f}); exact / BCD = {t_e / t_b:.1f}x")
    ok = below == 0 and main["gap_descent"].median() <= GAP_GOAL and t_b <= GOAL_S
    print(f"VERDICT BCD never below the optimum, median gap <= {GAP_GOAL:.0%}, large <= {GOAL_S:.0f} s: {'PASS' if ok else 'FAIL'}")
    return ok


def _grid(cells, exact_cells, limit, wall, out_name, desc) -> None:
    rows = []
    with _progress(len(cells), desc) as bar:
        for n, j in cells:
            spec = ("scaled", n, j, 0)
            inst = _instance(spec)
            _warm(inst)
            row = {"classes": n, "J": j, "samples": inst.classes[0].n_samples}
            res = run_bcd_spec(inst)
            res.pop("_run")
            row |= res
            if (n, j) in exact_cells:
                row |= run_exact(spec, limit, wall)
                row["exact_limit_s"] = limit
            rows.append(row)
            pd.DataFrame(rows).to_csv(DATA / out_name, index=False, float_format="%.10g")  # partial results survive
            bar.update(1)
            e = row.get("exact_status", "-")
            print(f"  classes {n:>3} J {j:>5}: BCD {row['bcd_time_s']:7.2f} s obj {row['bcd_objective']:.6g} | exact {e} "
                  f"{row.get('exact_time_s', math.nan):7.1f} s obj {row.get('exact_objective', math.nan):.6g} "
                  f"bound {row.get('exact_bound', math.nan):.6g}", flush=True)


def part_table3(args) -> bool:
    print(f"Table III redone (exact limit {args.table3_limit:.0f} s)")
    _grid(TABLE3, set(TABLE3), args.table3_limit, args.table3_limit + 300.0, "bcd_table3.csv", "table III")
    return True


def part_scaling(args) -> bool:
    print(f"scaling past the paper (exact limit {args.window:.0f} s on {EXACT_SCALING})")
    _grid(SCALING, set(EXACT_SCALING), args.window, args.window + 600.0, "bcd_scaling.csv", "scaling")
    return True


def part_rolling(args) -> bool:
    from kvdro.bcd.rolling import drifting_windows, reoptimise

    base = _instance(("paper", "large", 0, 0.5))
    windows = drifting_windows(base, ROLLING_SHIFTS)
    for w in windows:
        _warm(w)
    rows = []
    for method in ("bcd-warm", "bcd-cold", "static", "exact"):
        with quiet_fd1():
            for res in reoptimise(windows, ROLLING_SHIFTS, method=method, time_limit=600.0):
                rows.append({"window": res.window, "shift": res.shift, "method": method, "objective": res.objective,
                             "time_s": res.time_s, "z": " ".join(map(str, res.solution.z))})
        print(f"  {method:>9}: " + ", ".join(f"{r['time_s']:.1f}s/{r['objective']:.0f}" for r in rows if r["method"] == method),
              flush=True)
    pd.DataFrame(rows).to_csv(DATA / "bcd_rolling.csv", index=False, float_format="%.10g")
    return True


PARTS = {"core": part_core, "table3": part_table3, "scaling": part_scaling, "rolling": part_rolling}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench bcd", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["core"], help=f"any of {sorted(PARTS)} or all (default core)")
    parser.add_argument("--seeds", type=int, default=SMALL_SEEDS, help="small seeds at load 0.5 (default 20)")
    parser.add_argument("--stress", type=int, default=STRESS_SEEDS, help="small seeds at load 1.0 (default 10)")
    parser.add_argument("--table3-limit", type=float, default=TABLE3_LIMIT, help="exact time limit in Table III [s]")
    parser.add_argument("--window", type=float, default=WINDOW_S, help="exact time limit in the scaling study [s]")
    args = parser.parse_args(argv)
    parts = list(PARTS) if "all" in args.parts else args.parts
    for p in parts:
        if p not in PARTS:
            parser.error(f"unknown part {p!r}; choose from {sorted(PARTS)} or all")
    DATA.mkdir(exist_ok=True)
    ok = True
    for p in parts:
        t0 = time.perf_counter()
        ok &= PARTS[p](args)
        print(f"[{p}: {time.perf_counter() - t0:.0f} s; regenerate with `{COMMAND} {p}`]", flush=True)
    return 0 if ok else 1
