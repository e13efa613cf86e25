"""Benchmark of BCD-DRO against the exact solver: ``python -m kvdro.bench bcd [PART ...]``.

Parts (default ``core``; ``all`` runs every part); each writes a small CSV under ``data/`` that
chapter 6 reads:

* ``core`` -> ``data/bcd_gap.csv``, ``data/bcd_trace.csv``, ``data/bcd_large.csv``:
  the gap of BCD (both Block-2 rules) to the proven optimum on 20 seeded small instances (and 10 at
  ``load=1.0``, where memory binds), the objective after every block of every run, and the large
  instance (15 classes, J = 48, 1,000 samples, seed 0) solved by BCD and by the exact MILP in the
  same run (quality bar: BCD <= 10 s).
* ``table3`` -> ``data/bcd_table3.csv``: the paper's Table III redone, classes {3, 6, 10, 15} x
  J {8, 16, 48}: exact (the default formulation, proven optimal or its gap at the limit) and BCD.
* ``scaling`` -> ``data/bcd_scaling.csv``: the crossover, classes {15, 50, 100} x J {48, 256, 1024},
  every cell: BCD (time, objective, peak RSS), a second BCD start (multi-start), the LP relaxation of
  the default formulation (a certificate for BCD's answer), the MILP stopped at BCD's time (incumbent,
  gap) and the exact MILP to proven optimality (time, variables, peak RSS, gap) -- in one run.
* ``rolling`` -> ``data/bcd_rolling.csv``: rolling-horizon re-optimisation of the large instance on
  windows whose output lengths drift; BCD warm- and cold-started, exact, and the static decision.
* ``stale`` -> ``data/bcd_stale.csv``: the stale-warm-start bug (issue 17) before and after, on 64
  random tight instances x 2 starts: BCD with the old re-solve (CVXPY's warm start, status checked
  only) and with the fixed one, each re-solve of the old path checked against a fresh model, and
  the gaps to the proven optimum.

Every exact solve runs in a child process with a wall-clock limit (HiGHS's own limit does not cover
building a very large CVXPY model); the peak resident memory (RSS) of a child is the memory of its
solver. Run under ``nice -n 10``; the machine is shared. Times are wall clock on a shared machine: compare them only
within one run, as ratios. Needs the Azure 2023 traces (``KVDRO_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.bench._common import quiet_fd1
from kvdro.cachefile import write_csv_atomic

DATA = Path(__file__).resolve().parents[2] / "data"
GOAL_S = 10.0  # BCD on the large instance
GAP_GOAL = 0.01  # median gap on the small seeds
SMALL_SEEDS = 20
STRESS_SEEDS = 10  # small seeds at load 1.0
TABLE3 = [(n, j) for n in (3, 6, 10, 15) for j in (8, 16, 48)]
TABLE3_LIMIT = 120.0
SCALING = [(n, j) for n in (15, 50, 100) for j in (48, 256, 1024)]
SCALING_GOAL_S, SCALING_GOAL_GB = 60.0, 4.0  # every cell proven optimal within these, here
SCALING_LIMIT = 600.0  # HiGHS limit of the full exact solve: past the goal, to see where it lands
STALE_INSTANCES = 64
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


def _peak_rss_gb() -> float:
    """Peak resident memory of this process so far [GB] (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _exact_child(spec: tuple, time_limit: float, queue, stop_at: float | None = None) -> None:
    from kvdro.joint import Solution, evaluate, solve_milp

    out: dict = {}
    try:
        with quiet_fd1():
            inst = _instance(spec)
            _warm(inst)
            if stop_at is not None:  # the MILP stopped at BCD's time: its incumbent and gap then
                early = solve_milp(inst, time_limit=max(float(stop_at), 0.05))
                out |= {"stopped_status": early.status, "stopped_incumbent": early.objective,
                        "stopped_bound": early.bound, "stopped_mip_gap": early.mip_gap}
            t0 = time.perf_counter()
            res = solve_milp(inst, time_limit=time_limit)
            wall = time.perf_counter() - t0
    except Exception as exc:  # reported, not hidden: the row says what went wrong
        queue.put(out | {"exact_status": f"error: {type(exc).__name__}: {exc}"[:200]})
        return
    out |= {
        "exact_formulation": res.formulation,
        "exact_status": res.status,
        "exact_time_s": wall,
        "exact_highs_s": res.time_s,
        "exact_build_s": res.build_s,
        "exact_incumbent": res.objective,
        "exact_bound": res.bound,
        "exact_mip_gap": res.mip_gap,
        "exact_variables": res.n_variables,
        "exact_constraints": res.n_constraints,
        "exact_objective": math.nan,
        "exact_peak_rss_gb": _peak_rss_gb(),
    }
    if res.decision is not None:
        z, r, pi, d = res.decision
        out["exact_objective"] = evaluate(inst, Solution(z=z, r=r, pi=pi, delta=d)).total
        out["exact_z"] = " ".join(map(str, z))
    queue.put(out)


def run_exact(spec: tuple, time_limit: float, wall_limit: float, stop_at: float | None = None) -> dict:
    """The exact MILP on ``spec`` in a child process; killed after ``wall_limit`` seconds."""
    return _in_child(_exact_child, (spec, time_limit), wall_limit, "exact_status", stop_at=stop_at)


def _in_child(target, args: tuple, wall_limit: float, status_key: str, **kwargs) -> dict:
    ctx = mp.get_context("spawn")  # not fork: a forked HiGHS would inherit a dead thread pool
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue), kwargs=kwargs)
    t0 = time.perf_counter()
    proc.start()
    try:
        out = queue.get(timeout=wall_limit)
    except Exception:  # queue.Empty: the wall limit passed
        out = {status_key: "wall_limit", "exact_time_s": time.perf_counter() - t0}
    proc.join(timeout=5)
    if proc.is_alive():
        proc.terminate()  # our own child, by its handle
        proc.join()
    return out


def _bcd_child(spec: tuple, queue, baselines: bool = True) -> None:
    """BCD (descent, one start) with its peak RSS; then a second start and the LP relaxation of the
    default formulation (a lower bound on the optimum, so a certificate for BCD's answer)."""
    from kvdro.joint import solve_milp

    try:
        inst = _instance(spec)
        _warm(inst)
        row = run_bcd_spec(inst)
        row.pop("_run")
        row["bcd_peak_rss_gb"] = _peak_rss_gb()
        row["samples"] = inst.classes[0].n_samples
        if not baselines:
            queue.put(row)
            return
        second = run_bcd_spec(inst, init="cached")
        second.pop("_run")
        row |= {"bcd2_objective": second["bcd_objective"], "bcd2_time_s": second["bcd_time_s"]}
        with quiet_fd1():
            t0 = time.perf_counter()
            lp = solve_milp(inst, relax=True)
            row |= {"lp_status": lp.status, "lp_bound": lp.objective, "lp_time_s": time.perf_counter() - t0}
    except Exception as exc:
        queue.put({"bcd_status": f"error: {type(exc).__name__}: {exc}"[:200]})
        return
    queue.put(row)


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
    write_csv_atomic(gap, DATA / "bcd_gap.csv", float_format="%.10g")

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
    write_csv_atomic(pd.DataFrame([large]), DATA / "bcd_large.csv", float_format="%.10g")
    write_csv_atomic(pd.DataFrame(trace_rows), DATA / "bcd_trace.csv", float_format="%.10g")

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


def _grid(cells, limit: float, out_name: str, desc: str, baselines: bool, resume: bool = True) -> pd.DataFrame:
    """One BCD run and one exact solve per (classes, J) cell. Finished cells are kept in
    ``<out_name stem>.partial.csv`` beside the table and a rerun resumes from them
    (:func:`kvdro.cachefile.run_grid`); the table itself is replaced only when the grid is complete."""
    from kvdro.cachefile import run_grid

    def compute(cell):
        spec = ("scaled", cell["classes"], cell["J"], 0)
        row = {"classes": cell["classes"], "J": cell["J"]} | _in_child(_bcd_child, (spec,), 1800.0, "bcd_status",
                                                                      baselines=baselines)
        stop_at = row.get("bcd_time_s") if baselines else None
        row |= run_exact(spec, limit, limit + 900.0, stop_at=stop_at)
        row["exact_limit_s"] = limit
        return row

    with _progress(len(cells), desc) as bar:
        def report(row, resumed):
            bar.update(1)
            print(f"  classes {row['classes']:>3} J {row['J']:>5}{' (resumed)' if resumed else ''}: "
                  f"BCD {row.get('bcd_time_s', math.nan):6.2f} s obj {row.get('bcd_objective', math.nan):.8g}"
                  f" | exact {row.get('exact_status')} {row.get('exact_time_s', math.nan):6.1f} s "
                  f"obj {row.get('exact_objective', math.nan):.8g} gap {row.get('exact_mip_gap', math.nan):.1e} "
                  f"{row.get('exact_variables', 0):,} vars {row.get('exact_peak_rss_gb', math.nan):.2f} GB", flush=True)

        return run_grid([{"classes": n, "J": j, "exact_limit_s": limit} for n, j in cells], compute, DATA / out_name,
                        key=("classes", "J", "exact_limit_s"), resume=resume, on_row=report, float_format="%.10g")


def part_table3(args) -> bool:
    print(f"Table III redone (exact limit {args.table3_limit:.0f} s)")
    df = _grid(TABLE3, args.table3_limit, "bcd_table3.csv", "table III", baselines=False, resume=not args.no_resume)
    return bool((df["exact_status"] == "optimal").all())


def part_scaling(args) -> bool:
    print(f"the crossover: every cell, exact to proven optimality (limit {args.window:.0f} s), BCD and baselines")
    df = _grid(SCALING, args.window, "bcd_scaling.csv", "scaling", baselines=True, resume=not args.no_resume)
    proven = df["exact_status"] == "optimal"
    within = proven & (df["exact_time_s"] <= SCALING_GOAL_S) & (df["exact_peak_rss_gb"] <= SCALING_GOAL_GB)
    gap = (df["bcd_objective"] - df["exact_objective"]) / df["exact_objective"]
    print(f"  proven optimal {int(proven.sum())}/{len(df)}; within {SCALING_GOAL_S:.0f} s and {SCALING_GOAL_GB:.0f} GB: "
          f"{int(within.sum())}/{len(df)}; exact / BCD time {', '.join(f'{v:.1f}x' for v in df['exact_time_s'] / df['bcd_time_s'])}")
    print(f"  BCD gap to the optimum: max {gap.max():.4%}; peak RSS exact max {df['exact_peak_rss_gb'].max():.2f} GB, "
          f"BCD max {df['bcd_peak_rss_gb'].max():.2f} GB")
    ok = bool(within.all() and (gap >= -1e-7).all())
    print(f"VERDICT every cell proven optimal in <= {SCALING_GOAL_S:.0f} s and <= {SCALING_GOAL_GB:.0f} GB: {'PASS' if ok else 'FAIL'}")
    return ok


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
    write_csv_atomic(pd.DataFrame(rows), DATA / "bcd_rolling.csv", float_format="%.10g")
    return True


class _OldResolve:
    """The re-solve before issue 17's fix: CVXPY's default warm start and only the status checked.
    While active, every Block 3 and LP2-knapsack re-solve is also checked against a model built
    afresh (with the fixed re-solve); ``stale`` counts the answers that differ."""

    def __init__(self) -> None:
        self.calls = {"Block 3": 0, "LP2 knapsack": 0}
        self.stale = {"Block 3": 0, "LP2 knapsack": 0}

    def __enter__(self):
        import cvxpy as cp

        from kvdro.bcd import blocks
        from kvdro.errors import SolverError

        self._saved = (blocks._solve, blocks.ConfigIP.solve, blocks.ReservationStep.solve)
        fixed_solve, ip_solve, lp2_solve = self._saved

        def old_solve(problem, what, *, mip=False, **opts):
            problem.solve(solver=cp.HIGHS, **opts)
            if problem.status != cp.OPTIMAL:
                raise SolverError(what, str(problem.status))

        def ip_checked(ip, r, delta, time_limit=60.0):
            out = ip_solve(ip, r, delta, time_limit)
            blocks._solve = fixed_solve
            try:
                fresh = ip_solve(blocks.ConfigIP(ip.instance), r, delta, time_limit)
            finally:
                blocks._solve = old_solve
            self.calls["Block 3"] += 1
            self.stale["Block 3"] += abs(out[2] - fresh[2]) > 1e-6 * max(1.0, abs(fresh[2]))
            return out

        def lp2_checked(step, z, r, pi, delta):
            before = step.knapsacks
            out = lp2_solve(step, z, r, pi, delta)
            if step.knapsacks > before:
                blocks._solve = fixed_solve
                try:
                    fresh = lp2_solve(blocks.ReservationStep(step.instance), z, r, pi, delta)
                finally:
                    blocks._solve = old_solve
                inst, w = step.instance, step.instance.rates * pi.sum(axis=1)
                cost = [sum(w[i] * inst.worst_case_cost(i, x[i] - inst.input_tokens[i]) for i in range(inst.n_classes))
                        for x in (out, fresh)]
                self.calls["LP2 knapsack"] += 1
                self.stale["LP2 knapsack"] += abs(cost[0] - cost[1]) > 1e-6 * max(1.0, abs(cost[1]))
            return out

        blocks._solve, blocks.ConfigIP.solve, blocks.ReservationStep.solve = old_solve, ip_checked, lp2_checked
        return self

    def __exit__(self, *exc) -> None:
        from kvdro.bcd import blocks

        blocks._solve, blocks.ConfigIP.solve, blocks.ReservationStep.solve = self._saved


def part_stale(args) -> bool:
    """Issue 17's bug before and after: BCD on random tight instances (two classes, the family of
    chapter 6's trap, ``random_small_instance(default_rng(2026), n_classes=2)``), two starts each."""
    from kvdro.bcd import run_bcd
    from kvdro.bcd.scaling import random_small_instance
    from kvdro.joint import evaluate, solve_exact

    rng = np.random.default_rng(2026)
    rows, old = [], _OldResolve()
    with _progress(args.stale_instances, "stale") as bar, quiet_fd1():
        for n in range(args.stale_instances):
            inst = random_small_instance(rng, n_classes=2)
            row = {"instance": n, "exact_objective": evaluate(inst, solve_exact(inst)).total}
            for init in ("paper", "cached"):
                row[f"after_{init}"] = evaluate(inst, run_bcd(inst, init=init).solution).total
                with old:
                    row[f"before_{init}"] = evaluate(inst, run_bcd(inst, init=init).solution).total
            rows.append(row)
            bar.update(1)
    df = pd.DataFrame(rows)
    for when in ("before", "after"):
        df[f"gap_{when}_one"] = df[f"{when}_paper"] / df["exact_objective"] - 1
        df[f"gap_{when}_best2"] = df[[f"{when}_paper", f"{when}_cached"]].min(axis=1) / df["exact_objective"] - 1
    df.attrs = {}
    write_csv_atomic(df, DATA / "bcd_stale.csv", float_format="%.10g")
    counts = pd.DataFrame([{"block": b, "re_solves": old.calls[b], "stale": old.stale[b]} for b in old.calls])
    write_csv_atomic(counts, DATA / "bcd_stale_counts.csv")
    print("stale re-solves on the old path: " + ", ".join(f"{r.block} {r.stale} of {r.re_solves}" for r in counts.itertuples()))
    for when in ("before", "after"):
        print(f"  {when:>6} the fix: one start median {df[f'gap_{when}_one'].median():.3%} max {df[f'gap_{when}_one'].max():.2%}; "
              f"best of two max {df[f'gap_{when}_best2'].max():.2%}")
    ok = bool((df[["gap_after_one", "gap_before_one"]] >= -1e-7).all().all())
    return ok


PARTS = {"core": part_core, "table3": part_table3, "scaling": part_scaling, "rolling": part_rolling, "stale": part_stale}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench bcd", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["core"], help=f"any of {sorted(PARTS)} or all (default core)")
    parser.add_argument("--seeds", type=int, default=SMALL_SEEDS, help="small seeds at load 0.5 (default 20)")
    parser.add_argument("--stress", type=int, default=STRESS_SEEDS, help="small seeds at load 1.0 (default 10)")
    parser.add_argument("--table3-limit", type=float, default=TABLE3_LIMIT, help="exact time limit in Table III [s]")
    parser.add_argument("--window", type=float, default=SCALING_LIMIT, help="exact time limit in the scaling study [s]")
    parser.add_argument("--no-resume", action="store_true",
                        help="recompute every cell of table3/scaling (default: resume from <name>.partial.csv)")
    parser.add_argument("--stale-instances", type=int, default=STALE_INSTANCES, help="random instances of the stale part")
    args = parser.parse_args(argv)
    from kvdro.cachefile import ensure_writable

    ensure_writable(DATA, f"{DATA} (where this benchmark writes its tables)")
    from kvdro.bench._common import at_least

    for flag, value, minimum, what in (("--seeds", args.seeds, 1, "a number of seeds >= 1"),
                                       ("--stress", args.stress, 0, "a number of seeds >= 0"),
                                       ("--stale-instances", args.stale_instances, 1, "a number of instances >= 1"),
                                       ("--table3-limit", args.table3_limit, 1e-9, "a positive number of seconds"),
                                       ("--window", args.window, 1e-9, "a positive number of seconds")):
        at_least(parser, flag, value, minimum, what)
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
