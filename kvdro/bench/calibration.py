"""Benchmark: the calibrated serving model, ``python -m kvdro.bench calibration``.

Writes the cached data of chapter 7's section "One model for planner and engine":

* ``data/calibration_bands.csv`` -- the simulator-measured serving table (:mod:`kvdro.calibration`,
  read by ``Instance(serving="calibrated")``), for the sources ``real`` (Azure 2023 training half) and
  ``synthetic`` (the large family's training half); prints its regeneration time;
* ``data/calibration_classes.csv`` -- the same runs per request class (wait, residence, spread);
* ``data/calibration_agreement.csv`` -- predicted vs simulated (test half) mean end-to-end time,
  goodput and KV use, overall and per class, for the analytic and the calibrated plan of the small
  and large instances at load 0.5 and 1.0;
* ``data/calibration_plans.csv`` -- those plans (configuration, buffers, routing distance, costs);
* ``data/calibration_loop.csv`` -- each iteration of the plan -> simulate -> recalibrate loops;
* ``data/calibration_mix.csv`` -- one group of each configuration at every band serving the real
  training half's whole mix or one family of classes alone (:func:`kvdro.calibration.measure_mixes`);
* ``data/calibration_mix_plan.csv`` -- the groups of the small instance's first calibrated plan at
  load 0.5 by family: simulated wait against what the table charges (:func:`kvdro.calibration.plan_groups`).

``--parts bands`` (or ``agreement``, ``mix``) regenerates one part; the agreement and the mix need the bands.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvdro.cachefile import write_csv_atomic

DATA = Path(__file__).resolve().parents[2] / "data"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="bands,agreement,mix", help="comma-separated: bands, agreement, mix (default all)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    from kvdro.cachefile import ensure_writable

    ensure_writable(DATA, f"{DATA} (where this benchmark writes its tables)")
    from kvdro.bench._common import split_parts

    parts = set(split_parts(parser, "--parts", args.parts, ("bands", "agreement", "mix")))

    from kvdro import calibration as cal
    from kvdro.bench._common import quiet_fd1

    if "bands" in parts:
        start = time.perf_counter()
        frame = cal.write_calibration(DATA / "calibration_bands.csv", progress=not args.quiet,
                                      classes_path=DATA / "calibration_classes.csv")
        print(f"data/calibration_bands.csv and calibration_classes.csv: {len(frame)} rows (sources "
              f"{', '.join(sorted(frame['source'].unique()))}) regenerated in {time.perf_counter() - start:.1f} s")
    if "agreement" in parts:
        start = time.perf_counter()
        with quiet_fd1():
            metrics, plans, loops = cal.agreement(progress=not args.quiet)
        write_csv_atomic(metrics, DATA / "calibration_agreement.csv", float_format="%.6g")
        write_csv_atomic(plans, DATA / "calibration_plans.csv", float_format="%.6g")
        write_csv_atomic(loops, DATA / "calibration_loop.csv", float_format="%.6g")
        print(f"data/calibration_agreement.csv, calibration_plans.csv, calibration_loop.csv regenerated in "
              f"{time.perf_counter() - start:.1f} s")
        with __import__("pandas").option_context("display.width", 200, "display.max_columns", 20):
            print(plans[["size", "load", "serving", "z", "objective", "cost_realised_per_s", "loop_iterations", "plan_s"]].round(2).to_string(index=False))
    if "mix" in parts:
        start = time.perf_counter()
        mixes = cal.measure_mixes("real", bands=range(10))
        write_csv_atomic(mixes, DATA / "calibration_mix.csv", float_format="%.6g")
        with quiet_fd1():
            groups = cal.first_plan_groups("small", 0.5)
        write_csv_atomic(groups, DATA / "calibration_mix_plan.csv", float_format="%.6g")
        print(f"data/calibration_mix.csv ({len(mixes)} rows) and calibration_mix_plan.csv regenerated in "
              f"{time.perf_counter() - start:.1f} s")
    return 0
