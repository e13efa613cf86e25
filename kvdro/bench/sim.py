"""Benchmark: the simulator on the whole Azure 2023 conversation trace, ``python -m kvdro.bench sim``.

Quality bar (DESIGN.md, issues 9 and 15): the fast engine simulates the whole trace (19,366
requests, the default deployment 2 x TP4-PP1) in <= 2 s here, with metrics identical to the
step-by-step reference engine's, for ``vllm``, a soft and a hard reservation; the speed ratio
between the two is measured in the same run. Issue 15 made the fast engine faster where the profile
said: the same engine inputs are run by today's engine and by the engine of commit 67d1755
(:mod:`kvdro.bench._sim_engine_v1`, kept for this ratio only) -- "cold" with a fresh step clock
per run (one run alone), "warm" with today's shared clock (a sweep: every run after the first) --
and their results are checked equal. Timings are noisy on a shared machine: only ratios and the
bar are reported.

``--sweeps`` also writes the cached results chapter 7 reads (:func:`kvdro.sim.studies.write_all`,
several minutes): ``data/sim_referee.csv``, ``data/sim_saturation.csv``, ``data/sim_regimes.csv``
(the regime map), ``data/sim_policies.csv`` (every policy, both readings, at each trace's operating
points) and ``data/sim_safety.csv`` (before/after vLLM's safety rules). ``--regimes`` writes only
the regime map.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvdro.bench._common import timed

SPEED_GOAL_S = 2.0
N_CONV = 19_366


def _engine_ratio(trace, repeats: int) -> list[tuple[str, float, float, float, bool]]:
    """(case, old cold s, new cold s, new warm s, identical) for the engine-only comparison."""
    from kvdro.bench._sim_engine_v1 import run_fast as run_v1
    from kvdro.sim import default_deployment, simulate
    from kvdro.sim.engine_fast import run_fast
    from kvdro.sim.timing import StepClock

    cases = [("vllm, 2 x TP4-PP1", "vllm", default_deployment(), 1.0, True),
             ("vllm, 4 x TP2-PP1 at 0.6", "vllm", default_deployment(config="TP2-PP1"), 0.6, True),
             ("dro (rules off), 2 x TP4-PP1", "dro", default_deployment(), 1.0, False),
             ("mean (rules off), 4 x TP2-PP1 at 0.6", "mean", default_deployment(config="TP2-PP1"), 0.6, False)]
    rows = []
    for label, policy, dep, scale, safe in cases:
        r = simulate(trace.assign(arrival_s=trace["arrival_s"] / scale), policy=policy, deployment=dep,
                     rng=np.random.default_rng(0), safety_rules=safe)
        configs = [g for g in dep.groups for _ in range(g.pp)]

        def run(fn, clock):
            return [fn(spec, inp, clock(cfg)) for spec, inp, cfg in zip(r.specs, r.inputs, configs)]

        fresh = lambda cfg: StepClock(dep.model, dep.gpu, cfg)  # noqa: E731
        shared = lambda cfg: StepClock.shared(dep.model, dep.gpu, cfg)  # noqa: E731
        t_old, old = timed(lambda: run(run_v1, fresh), repeats)
        t_cold, new = timed(lambda: run(run_fast, fresh), repeats)
        t_warm, _ = timed(lambda: run(run_fast, shared), repeats)
        same = all(a.totals() == b.totals() and np.array_equal(a.finish_ps, b.finish_ps)
                   and np.array_equal(a.preemptions, b.preemptions) for a, b in zip(old, new))
        rows.append((label, t_old, t_cold, t_warm, same))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine (median; default 3)")
    parser.add_argument("--sweeps", action="store_true", help="also regenerate every cached sweep of chapter 7 under data/")
    parser.add_argument("--regimes", action="store_true", help="also regenerate the regime map (data/sim_regimes.csv)")
    args = parser.parse_args(argv)

    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate

    trace = load_trace("azure-2023-conv")
    if len(trace) != N_CONV:
        print(f"[FAIL] the conversation trace has {len(trace):,} requests, expected {N_CONV:,}")
        return 1
    tp2 = default_deployment(config="TP2-PP1")
    cases = [
        ("vllm", "soft", "2 x TP4-PP1", None, 1.0),
        ("dro", "soft", "2 x TP4-PP1", None, 1.0),
        ("vllm", "soft", "4 x TP2 @0.6", tp2, 0.6),
        ("dro", "soft", "4 x TP2 @0.6", tp2, 0.6),
        ("mean", "hard", "4 x TP2 @0.6", tp2, 0.6),
    ]
    print(f"Azure 2023 conversation trace: {len(trace):,} requests over {trace['arrival_s'].max():,.0f} s; "
          f"median of {args.repeats} runs per engine")
    print(f"{'policy':>6} {'reading':>7} {'deployment':>13} {'fast [s]':>9} {'reference [s]':>14} {'ratio':>6} "
          f"{'identical':>10} {'preemptions':>12}")
    ok_speed = ok_same = True
    for policy, reading, name, dep, scale in cases:
        tr = trace.assign(arrival_s=trace["arrival_s"] / scale)
        run = lambda engine: simulate(tr, policy=policy, deployment=dep, rng=np.random.default_rng(0),  # noqa: E731
                                      engine=engine, reservation=reading)
        t_fast, fast = timed(lambda: run("fast"), args.repeats)
        t_ref, ref = timed(lambda: run("reference"), args.repeats)
        same = ({k: v for k, v in fast.metrics.items() if k != "wall_s"} == {k: v for k, v in ref.metrics.items() if k != "wall_s"}
                and fast.requests.equals(ref.requests)
                and all(a.totals() == b.totals() for a, b in zip(fast.outputs, ref.outputs)))
        m = fast.metrics
        ok_speed &= t_fast <= SPEED_GOAL_S if name == "2 x TP4-PP1" else True
        ok_same &= same and m["completed"] + m["rejected"] + m["ignored"] == N_CONV
        print(f"{policy:>6} {reading:>7} {name:>13} {t_fast:9.2f} {t_ref:14.2f} {t_ref / t_fast:6.1f} {str(same):>10} "
              f"{m['preemptions']:>12,}")
    print(f"[{'PASS' if ok_speed else 'FAIL'}] speed: the whole conversation trace by the fast engine in <= {SPEED_GOAL_S:g} s "
          "on the default deployment")
    print(f"[{'PASS' if ok_same else 'FAIL'}] identical metrics and per-request outcomes in both engines; "
          f"completed + rejected + ignored = {N_CONV:,}")

    print("\nToday's fast engine against the engine of commit 67d1755 (engine only, same inputs):")
    print(f"{'case':>38} {'old [s]':>8} {'cold [s]':>9} {'warm [s]':>9} {'cold x':>7} {'warm x':>7} {'identical':>10}")
    rows = _engine_ratio(trace, args.repeats)
    for label, t_old, t_cold, t_warm, same in rows:
        ok_same &= same
        print(f"{label:>38} {t_old:8.2f} {t_cold:9.2f} {t_warm:9.2f} {t_old / t_cold:7.2f} {t_old / t_warm:7.2f} {str(same):>10}")
    old, cold, warm = (sum(r[i] for r in rows) for i in (1, 2, 3))
    print(f"speed-up over the old engine, all cases: {old / cold:.2f}x cold (one run alone), {old / warm:.2f}x warm (in a sweep)")
    print(f"[{'PASS' if all(r[4] for r in rows) else 'FAIL'}] the old and today's engines agree on these inputs")

    if args.sweeps or args.regimes:
        from kvdro.sim.studies import PARTS, write_all

        start = time.perf_counter()
        for path in write_all(parts=PARTS if args.sweeps else ("regimes",)):
            print(f"wrote {path}")
        print(f"sweeps regenerated in {time.perf_counter() - start:,.0f} s (one process)")
    return 0 if ok_speed and ok_same else 1
