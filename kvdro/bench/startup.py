"""Benchmark: start-up of the command line, ``python -m kvdro.bench startup``.

Quality bar (issue 18): ``python -m kvdro simulate --help`` starts in at most twice the time of
``python -c "import pandas"`` -- the simulator needs pandas and NumPy, but not CVXPY, SciPy's
statistics or a solver, which are imported only where a model is built or a distribution fitted.
Both commands run as fresh processes in this run, interleaved (so a busy moment of the machine hits
both), ``--repeats`` times each after one warm-up of each (the OS file cache); the ratio of medians
is the result. As information: ``import kvdro.sim`` and ``import cvxpy`` alone, whether
``import kvdro.sim`` loads CVXPY (it must not), and a one-off ``python -m kvdro simulate`` of the whole
conversation trace (19,366 requests, ``--policy vllm --json --quiet``). Since issue 32 that run always
uses the compiled engine, so it pays numba's import and the load of the cached machine code where
the retired pure-Python engine simply ran; measured with ``farm-bench`` against the commit before
(10 interleaved pairs, medians), the one-off run costs 1.71 CPU s instead of 1.17 (x1.52; wall
3.17 s instead of 2.16) and peaks at 210 MiB instead of 99 MiB -- the price of one fast
implementation; a sweep pays it once per process, and its engine time is then ~11x below the Python
engine's (the four cases of ``python -m kvdro.bench sim``, part 2, at that commit: 0.10 CPU s
against 1.14).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

RATIO_GOAL = 2.0

COMMANDS = {
    "kvdro simulate --help": [sys.executable, "-m", "kvdro", "simulate", "--help"],
    "import pandas": [sys.executable, "-c", "import pandas"],
    "import kvdro.sim": [sys.executable, "-c", "import kvdro.sim"],
    "import cvxpy": [sys.executable, "-c", "import cvxpy"],
    "kvdro simulate (conv.)": [sys.executable, "-m", "kvdro", "simulate", "--trace", "azure-2023-conv", "--policy", "vllm",
                               "--json", "--quiet"],
}


def wall_s(cmd: list[str]) -> float:
    """Wall-clock seconds of one fresh process running ``cmd`` (its output discarded; must succeed)."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def heavy_modules_after_import_sim() -> list[str]:
    """Which of CVXPY, highspy, scikit-learn and scipy.stats ``import kvdro.sim`` loads (want: none)."""
    probe = ("import sys, kvdro.sim; print(' '.join(m for m in ('cvxpy', 'highspy', 'sklearn', 'scipy.stats') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return out.split()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench startup", description=__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command (default 7)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    for cmd in COMMANDS.values():  # warm-up: the OS file cache, .pyc files
        wall_s(cmd)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, cmd in COMMANDS.items():
            times[name].append(wall_s(cmd))

    print(f"start-up of fresh processes, median of {args.repeats} (interleaved), {sys.executable}")
    print(f"{'command':<24} {'median [s]':>11} {'min [s]':>9} {'max [s]':>9}")
    for name, ts in times.items():
        print(f"{name:<24} {statistics.median(ts):11.3f} {min(ts):9.3f} {max(ts):9.3f}")
    heavy = heavy_modules_after_import_sim()
    ratio = statistics.median(times["kvdro simulate --help"]) / statistics.median(times["import pandas"])
    ok_ratio, ok_lazy = ratio <= RATIO_GOAL, not heavy
    print(f"[{'PASS' if ok_ratio else 'FAIL'}] `python -m kvdro simulate --help` takes {ratio:.2f}x "
          f"`python -c \"import pandas\"` (goal <= {RATIO_GOAL:g}x)")
    print(f"[{'PASS' if ok_lazy else 'FAIL'}] `import kvdro.sim` loads no heavy solver or fitter"
          + (f" (it loads {', '.join(heavy)})" if heavy else ""))
    return 0 if ok_ratio and ok_lazy else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
