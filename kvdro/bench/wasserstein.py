"""Benchmark: closed-form worst-case cost against the dual LP (8c)-(8g), ``python -m kvdro.bench wasserstein``.

Quality bar (DESIGN.md): at N = 10,000 samples the closed form equals the dual LP to 1e-6
(relative) and is at least 100x faster. Both are timed in this run on the same samples (a seeded
synthetic log-normal sample of output lengths, so no data file is needed and no two samples tie:
the LP keeps all N of its ``theta`` variables). The LP time is what a user pays: build + solve.
As information (no bar), the robust buffer by its closed form against the joint LP.
"""

from __future__ import annotations

import argparse

import numpy as np

from kvdro.bench._common import timed
from kvdro import wasserstein as ws
from kvdro.newsvendor import saa_reservation

SPEED_GOAL = 100.0
AGREEMENT_GOAL = 1e-6




def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench wasserstein", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="number of samples (default 10,000)")
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--rho", type=float, default=10.0, help="c_p / c_w (default 10, the paper's)")
    args = parser.parse_args(argv)
    from kvdro.bench._common import at_least

    at_least(parser, "--n", args.n, 1, "a number of samples >= 1")
    at_least(parser, "--seed", args.seed, 0, "a non-negative integer")
    at_least(parser, "--rho", args.rho, 1e-300, "a positive cost ratio")

    rng = np.random.default_rng(args.seed)
    samples = np.minimum(rng.lognormal(mean=5.0, sigma=1.0, size=args.n), 4000.0)  # tokens
    L_max = 2.0 * float(samples.max())
    c_p, c_w = args.rho, 1.0
    eps = 0.15 * float(samples.mean())  # the paper's radius, 0.15 E[xi]
    etas = [0.0, *np.quantile(samples, [0.5, 0.9, 0.99]).tolist(), L_max]

    print(f"W1 worst case at N = {args.n:,} samples, rho = {args.rho:g}, eps = {eps:.1f} tokens, "
          f"L_max = {L_max:.0f} tokens")
    print(f"{'buffer eta':>12} {'closed form':>14} {'dual LP':>14} {'rel. diff':>10} "
          f"{'t_closed [ms]':>14} {'t_LP [ms]':>10} {'ratio':>8}")
    ratios, diffs = [], []
    for eta in etas:
        t_closed, closed = timed(lambda: ws.worst_case_cost(samples, eta, c_p, c_w, eps, L_max), 15)
        t_lp, lp = timed(
            lambda: ws.worst_case_cost(samples, eta, c_p, c_w, eps, L_max, method="dual_lp"), 1
        )
        diff = abs(closed - lp) / max(abs(lp), 1e-12)
        ratios.append(t_lp / t_closed)
        diffs.append(diff)
        print(f"{eta:12.1f} {closed:14.6f} {lp:14.6f} {diff:10.1e} {1e3 * t_closed:14.2f} "
              f"{1e3 * t_lp:10.1f} {t_lp / t_closed:8.0f}")

    t_fast, fast = timed(lambda: ws.dro_solution(samples, c_p, c_w, eps, L_max), 5)
    t_joint, joint = timed(lambda: ws.dro_solution(samples, c_p, c_w, eps, L_max, method="lp"), 1)
    print(f"robust buffer: closed form eta = {fast.eta:.2f} (SAA {saa_reservation(samples, c_p, c_w):.2f}),"
          f" cost {fast.cost:.6f} in {1e3 * t_fast:.2f} ms; joint LP eta = {joint.eta:.2f},"
          f" cost {joint.cost:.6f} in {1e3 * t_joint:.0f} ms (ratio {t_joint / t_fast:.0f}x)")

    speed, worst = min(ratios), max(diffs)
    ok_speed, ok_agree = speed >= SPEED_GOAL, worst <= AGREEMENT_GOAL
    print(f"[{'PASS' if ok_speed else 'FAIL'}] speed: closed form is {speed:.0f}x faster than the dual LP"
          f" (slowest of {len(etas)} buffers; goal >= {SPEED_GOAL:.0f}x)")
    print(f"[{'PASS' if ok_agree else 'FAIL'}] agreement: largest relative difference {worst:.1e}"
          f" (goal <= {AGREEMENT_GOAL:.0e})")
    return 0 if ok_speed and ok_agree else 1
