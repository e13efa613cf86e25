"""The full sweeps of chapter 10: ``python -m kvdro.bench experiments [--n-jobs N] [--only NAME ...] [--regime R ...]``.

Runs every sweep of :mod:`kvdro.experiments` at full size in both regimes
(:mod:`kvdro.experiments.regimes`: ``memory``, the primary test, and ``light``, the contrast; the real
traces and ten seeds of each synthetic twin in both) and
writes the cached results the chapter reads, ``data/experiments_<name>_<regime>.csv``
(``data/experiments_eps_joint.csv`` has no simulator and no regime):

========== ======================================================================================
table2     4 policies x rho in {2,5,10,20,50,100} x (2 real traces + 2 synthetic twins x 10 seeds)
table4     10 policies x rho in {2,10,100} x the same 22 trace realisations
fig3       8 policies x 3 loads (0.5, 1, 1.5 x the regime's) x the same, rho = 10
fig5a      SAA, DRO x static, rolling x the same, drift s = 1 -> 3 over 6 windows, rho = 10
fig5b      SAA, DRO x rho in {2,10,100} x shift s in {1, 2, 3} x the same
table5     the BCD-DRO plan and 3 ablations x (real heterogeneous trace + 10 synthetic seeds)
fig6       the BCD-DRO and SAA plans x 3 shifts x (real + 10 synthetic seeds)
eps_joint  exact plans of the small instance, seed 0, rho in {2,10,100} x 6 radii x 2 units of eps
\*_hard    Tables II and IV, memory regime, real traces, *hard* reading of a reservation (sensitivity)
========== ======================================================================================

Prints the wall time of each sweep, its number of cells and the CPU seconds its cells took (measured
in the workers, so a shared machine's contention does not inflate it), and the totals (the budget:
<= 20 minutes on 2 cores with ``--n-jobs 2``). Cache hits cost nothing: run with an empty
``$KVDRO_CACHE_DIR`` to time from scratch. Needs the Azure 2023 traces (``KVDRO_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import sys
import time

NAMES = ("table2", "table4", "fig3", "fig5a", "fig5b", "table5", "fig6", "eps_joint", "table2_hard", "table4_hard")


def _run(name: str, regime: str | None, funcs: dict, n_jobs: int):
    """The rows of one sweep (``name``) in ``regime``."""
    from kvdro.experiments import analytic
    from kvdro.experiments.traces import REAL

    if name == "eps_joint":
        return analytic.eps_premium_joint(eps_units=("mean", "tokens"), n_jobs=n_jobs, progress=True)
    if name.endswith("_hard"):
        return funcs[name[:-5]](regime=regime, reservation="hard", traces=REAL, n_jobs=n_jobs, progress=True)
    return funcs[name](regime=regime, n_jobs=n_jobs, progress=True)


def main(argv: list[str]) -> int:
    from kvdro.experiments.regimes import REGIMES

    parser = argparse.ArgumentParser(prog="python -m kvdro.bench experiments")
    parser.add_argument("--n-jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--only", nargs="*", choices=NAMES, help="run only these sweeps")
    parser.add_argument("--regime", nargs="*", choices=REGIMES, help="run only these regimes (default both)")
    args = parser.parse_args(argv)
    from kvdro.bench._common import at_least

    at_least(parser, "--n-jobs", args.n_jobs, 1, "a number of worker processes >= 1")
    for flag, value in (("--only", args.only), ("--regime", args.regime)):
        if value is not None and not value:
            parser.error(f"{flag}: names nothing (give at least one name, or drop the flag)")
    from kvdro.cachefile import ensure_writable

    from kvdro.experiments.results import DATA

    ensure_writable(DATA, f"{DATA} (where this benchmark writes its tables)")

    from kvdro import experiments as ex
    from kvdro.bench._common import quiet_fd1
    from kvdro.experiments import results
    from kvdro.experiments.regimes import operating_point

    funcs = {
        "table2": ex.table2,
        "table4": ex.table4,
        "fig3": ex.fig3,
        "fig5a": ex.fig5a,
        "fig5b": ex.fig5b,
        "table5": ex.table5,
        "fig6": ex.fig6,
    }
    print(f"chapter 10 sweeps (cache: {ex.cache_dir()}, code {ex.code_fingerprint()})")
    for regime in args.regime or REGIMES:
        print(f"  {regime}: {operating_point(regime).describe()} ({operating_point(regime).source})")
    print(f"{'sweep':>10} {'regime':>7} {'cells':>6} {'time s':>8} {'s/cell':>7} {'cpu s':>8}  file")
    total = cpu_total = 0.0
    jobs = []  # regime-major: the primary (memory) sweeps first
    for r in args.regime or REGIMES:
        for n in args.only or NAMES:
            if n.endswith("_hard"):
                jobs += [(n, r)] if r == "memory" else []
            elif n != "eps_joint":
                jobs.append((n, r))
    if "eps_joint" in (args.only or NAMES):
        jobs.append(("eps_joint", None))
    for name, regime in jobs:
        t0 = time.perf_counter()
        with quiet_fd1():  # HiGHS banners (also from the worker processes, which inherit fd 1)
            df = _run(name, regime, funcs, args.n_jobs)
        dt = time.perf_counter() - t0
        total += dt
        if "lost" in df.columns and int(df["lost"].sum()) != 0:
            print(f"{name}: {int(df['lost'].sum())} requests lost", file=sys.stderr)
            return 1
        cpu = float(df.pop("cpu_s").sum()) if "cpu_s" in df.columns else dt  # eps_joint: its wall time
        cpu_total += cpu
        key = name if regime is None else f"{name[:-5]}_{regime}_hard" if name.endswith("_hard") else f"{name}_{regime}"
        path = results.path(key)
        from kvdro.cachefile import write_csv_atomic

        write_csv_atomic(df, path, float_format="%.6g")  # atomic: a killed run leaves the old file
        print(f"{name:>10} {regime or '-':>7} {len(df):>6} {dt:>8.1f} {dt / max(len(df), 1):>7.2f} {cpu:>8.1f}  {path.name}", flush=True)
    print(f"{'all':>10} {'':>7} {'':>6} {total:>8.1f} {'':>7} {cpu_total:>8.1f}")
    from kvdro.experiments.runner import available_cpus

    workers = min(args.n_jobs, available_cpus())  # run_sweep caps the workers at the CPUs (and the cells)
    print(f"CPU seconds of the cells (computed, not cached) / n_jobs = {cpu_total / workers:.0f} s: the wall time on "
          f"{workers} otherwise idle cores (cache hits report the CPU of the run that computed them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
