"""The full sweeps of chapter 8: ``python -m kvdro.bench experiments [--n-jobs N] [--only NAME ...]``.

Runs every sweep of :mod:`kvdro.experiments` at full size and writes the cached results the chapter
reads, ``data/experiments_<name>.csv``:

========== ======================================================================================
table2     4 policies x rho in {2,5,10,20,50,100} x (2 real traces + 2 synthetic twins x 3 seeds)
table4     10 policies x rho in {2,10,100} x the same 8 trace realisations
fig3       8 policies x 6 loads (0.25 ... 1.5) x the same, rho = 10
fig5a      SAA, DRO x static, rolling x the same, drift s = 1 -> 3 over 6 windows, rho = 10
fig5b      SAA, DRO x rho in {2,10,100} x shift s in {1, 1.5, 2, 2.5, 3} x the same
table5     the BCD-DRO plan and 3 ablations x (real heterogeneous trace + 3 synthetic seeds)
fig6       the BCD-DRO and SAA plans x 5 shifts x (real + 3 synthetic seeds)
eps_joint  exact plans of the small instance, seed 0, rho in {2,10,100} x 6 radii x 2 units of eps
========== ======================================================================================

Prints the wall time of each sweep and its number of cells (cache hits cost nothing: run with an
empty ``$KVDRO_CACHE_DIR`` to time from scratch). Needs the Azure 2023 traces (``KVDRO_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import sys
import time

NAMES = ("table2", "table4", "fig3", "fig5a", "fig5b", "table5", "fig6", "eps_joint")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench experiments")
    parser.add_argument("--n-jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--only", nargs="*", choices=NAMES, help="run only these sweeps")
    args = parser.parse_args(argv)

    from kvdro import experiments as ex
    from kvdro.experiments import analytic
    from kvdro.experiments.__main__ import csv_path

    funcs = {
        "table2": ex.table2,
        "table4": ex.table4,
        "fig3": ex.fig3,
        "fig5a": ex.fig5a,
        "fig5b": ex.fig5b,
        "table5": ex.table5,
        "fig6": ex.fig6,
        "eps_joint": lambda **kw: analytic.eps_premium_joint(eps_units=("mean", "tokens"), **kw),
    }
    print(f"chapter 8 sweeps (cache: {ex.cache_dir()}, code {ex.code_fingerprint()})")
    print(f"{'sweep':>10} {'cells':>6} {'time s':>8} {'s/cell':>7}  file")
    total = 0.0
    for name in args.only or NAMES:
        t0 = time.perf_counter()
        df = funcs[name](n_jobs=args.n_jobs, progress=True)
        dt = time.perf_counter() - t0
        total += dt
        if "lost" in df.columns and int(df["lost"].sum()) != 0:
            print(f"{name}: {int(df['lost'].sum())} requests lost", file=sys.stderr)
            return 1
        path = csv_path(name)
        df.to_csv(path, index=False, float_format="%.6g")
        print(f"{name:>10} {len(df):>6} {dt:>8.1f} {dt / max(len(df), 1):>7.2f}  {path.name}")
    print(f"{'all':>10} {'':>6} {total:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
