"""Benchmark: the simulator on the whole Azure 2023 conversation trace, ``python -m kvdro.bench sim``.

Quality bar (DESIGN.md, issue 9): the fast engine simulates the whole trace (19,366 requests, the
default deployment 2 x TP4-PP1) in <= 2 s here, with metrics identical to the step-by-step reference
engine's; the speed ratio between the two is measured in the same run (timings are noisy on a
shared machine: only the ratio and the bar are reported). Cases: vLLM's reactive policy and DRO on
the default deployment at the trace's rate, and under memory pressure (4 x TP2-PP1, where requests
are preempted).

``--sweeps`` also writes the cached results chapter 7 reads (several minutes):
``data/sim_referee.csv`` (simulated vs analytic batch, memory, waiting, latency by load),
``data/sim_saturation.csv`` (closed-loop throughput vs the lmdeploy figures) and
``data/sim_policies.csv`` (every policy on both Azure traces at rho in {2, 10, 100}).
"""

from __future__ import annotations

import argparse

import numpy as np

from kvdro.bench._common import timed

SPEED_GOAL_S = 2.0
N_CONV = 19_366




def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine (median; default 3)")
    parser.add_argument("--sweeps", action="store_true", help="also regenerate the cached sweeps of chapter 7 under data/")
    args = parser.parse_args(argv)

    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate

    trace = load_trace("azure-2023-conv")
    if len(trace) != N_CONV:
        print(f"[FAIL] the conversation trace has {len(trace):,} requests, expected {N_CONV:,}")
        return 1
    cases = [
        ("vllm", "2 x TP4-PP1", None),
        ("dro", "2 x TP4-PP1", None),
        ("vllm", "4 x TP2-PP1", default_deployment(config="TP2-PP1")),
        ("dro", "4 x TP2-PP1", default_deployment(config="TP2-PP1")),
    ]
    print(f"Azure 2023 conversation trace: {len(trace):,} requests over {trace['arrival_s'].max():,.0f} s; "
          f"median of {args.repeats} runs per engine")
    print(f"{'policy':>6} {'deployment':>12} {'fast [s]':>9} {'reference [s]':>14} {'ratio':>6} {'identical':>10} "
          f"{'completed':>10} {'preemptions':>12}")
    ok_speed = ok_same = True
    for policy, name, dep in cases:
        run = lambda engine: simulate(trace, policy=policy, deployment=dep, rng=np.random.default_rng(0), engine=engine)  # noqa: E731
        t_fast, fast = timed(lambda: run("fast"), args.repeats)
        t_ref, ref = timed(lambda: run("reference"), args.repeats)
        same = ({k: v for k, v in fast.metrics.items() if k != "wall_s"} == {k: v for k, v in ref.metrics.items() if k != "wall_s"}
                and fast.requests.equals(ref.requests)
                and all(a.totals() == b.totals() for a, b in zip(fast.outputs, ref.outputs)))
        m = fast.metrics
        ok_speed &= t_fast <= SPEED_GOAL_S if name == "2 x TP4-PP1" else True
        ok_same &= same and m["completed"] + m["rejected"] + m["ignored"] == N_CONV
        print(f"{policy:>6} {name:>12} {t_fast:9.2f} {t_ref:14.2f} {t_ref / t_fast:6.1f} {str(same):>10} "
              f"{m['completed']:>10,} {m['preemptions']:>12,}")
    print(f"[{'PASS' if ok_speed else 'FAIL'}] speed: the whole conversation trace by the fast engine in <= {SPEED_GOAL_S:g} s "
          "on the default deployment")
    print(f"[{'PASS' if ok_same else 'FAIL'}] identical metrics and per-request outcomes in both engines; "
          f"completed + rejected + ignored = {N_CONV:,}")
    if args.sweeps:
        from kvdro.sim.studies import write_all

        for path in write_all():
            print(f"wrote {path}")
    return 0 if ok_speed and ok_same else 1
