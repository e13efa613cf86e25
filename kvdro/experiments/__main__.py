"""``python -m kvdro.experiments {table2,table4,table5,fig3,fig5,fig6,verdicts} [--regime memory|light] [--quick] [--n-jobs N] [--json] [--write]``

Runs one sweep of chapter 10 in one regime (:mod:`kvdro.experiments.regimes`; default ``memory``, the
primary test) and prints its summary table beside the paper's numbers, with our verdict. ``--json``
prints ``{"experiment", "regime", "quick", "rows", "summary", "verdicts"}`` instead, where ``rows``
has one object per simulation (NaN as null; each carries ``preemptions`` and
``kv_utilisation_mean``; the per-block bootstrap strings are left out).

``verdicts`` runs nothing: it judges every claim from the cached sweeps (``data/experiments_*``) in
two readings (:mod:`kvdro.experiments.verdicts`) and, with ``--json``, prints a list of ``{claim,
regime, verdict, reason, engine_verdict, engine_reason, preemptions, kv_utilisation_mean}`` --
``verdict``/``reason`` the paper's accounting, ``engine_*`` the engine's goodput reading -- (both
regimes unless ``--regime`` is given); ``--deadline class`` judges the engine reading's goodput by
the class deadline D_i (the paper's SLO, a sensitivity reading). ``--quick`` runs a reduced sweep (one trace,
one seed, the first five minutes of the test part) fit for tests; ``--write`` (full sweeps only)
saves the rows to ``data/experiments_<name>.csv``, the cached results the chapter reads.
Results are cached on disk (``$KVDRO_CACHE_DIR``, default ``_build/kvdro-cache``); ``--no-cache``
recomputes.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from kvdro._fd import fd1_redirected
from kvdro._strict_json import dumps as strict_json

EXPERIMENTS = ("table2", "table4", "table5", "fig3", "fig5", "fig6")
COMMANDS = EXPERIMENTS + ("verdicts",)
DATA = Path(__file__).resolve().parents[2] / "data"


def csv_path(name: str) -> Path:
    """Where ``--write`` saves a full sweep: ``data/experiments_<name>.csv``."""
    return DATA / f"experiments_{name}.csv"


def run(name: str, *, quick: bool, n_jobs: int | None, progress: bool = True, regime: str = "memory") -> dict[str, pd.DataFrame]:
    """The sweep(s) of ``name`` in ``regime``: a dict of DataFrames (``fig5`` has ``fig5a`` and ``fig5b``)."""
    from kvdro import experiments as ex

    kw = {"quick": quick, "n_jobs": n_jobs, "progress": progress, "regime": regime}
    if name == "fig5":
        return {"fig5a": ex.fig5a(**kw), "fig5b": ex.fig5b(**kw)}
    funcs = {"table2": ex.table2, "table4": ex.table4, "table5": ex.table5, "fig3": ex.fig3, "fig6": ex.fig6}
    if name not in funcs:
        raise ValueError(f"experiment: must be one of {EXPERIMENTS}, got {name!r}")
    return {name: funcs[name](**kw)}


def summarise(name: str, frames: dict[str, pd.DataFrame], regime: str = "memory") -> tuple[pd.DataFrame, list]:
    """Our summary table (with the paper's numbers where it prints them, preemptions and KV use) and
    the verdicts of :mod:`kvdro.experiments.verdicts` in ``regime``."""
    from kvdro.experiments import paper, verdicts as v

    act = ["preemptions", "kv_utilisation_mean"]
    if name == "table2":
        df = frames[name]
        s = v.table2_gains(df, "nv").assign(term="newsvendor")
        s = pd.concat([s, v.table2_gains(df, "total").assign(term="total")], ignore_index=True).drop(columns="identical")
        p = paper.table2().set_index("rho")[["DRO", "P90", "P95", "gain_vs_p90", "gain_vs_p95"]].add_prefix("paper_")
        return s.join(p, on="rho"), [v.table2_verdict(df, regime)]
    if name == "table4":
        s = v.table4_summary(frames[name])
        p = paper.table4().set_index(["policy", "rho"]).add_prefix("paper_")
        return s.join(p, on=["policy", "rho"]), [v.table4_verdict(frames[name], regime)]
    if name == "table5":
        return v.table5_summary(frames[name]), v.table5_verdicts(frames[name], regime)
    if name == "fig3":
        df = frames[name]
        s = df.groupby(["trace", "load", "policy"])[[v.COST, "cost_realised_per_req", "e2e_p99_s", *act]].mean().reset_index()
        return s, [v.fig3_verdict(df, regime)]
    if name == "fig5":
        a, b = frames["fig5a"], frames["fig5b"]
        wcols = [c for c in a.columns if c.endswith("_cost_per_req") and c.startswith("w")]
        sa = a.groupby(["trace", "policy", "mode"])[wcols + act].mean().reset_index()
        sb = b.groupby(["trace", "rho", "shift", "policy"])[[v.COST, "e2e_p99_s", *act]].mean().reset_index()
        return pd.concat([sa.assign(figure="5a"), sb.assign(figure="5b")], ignore_index=True), [v.fig5a_verdict(a, regime), v.fig5b_verdict(b, regime)]
    if name == "fig6":
        df = frames[name]
        s = df.groupby(["source", "variant", "shift"])[[v.COST, "cost_realised_per_req", "e2e_p99_s", "slo_violation_rate", *act]].mean().reset_index()
        return s, [v.fig6_verdict(df, regime)]
    raise ValueError(f"experiment: must be one of {EXPERIMENTS}, got {name!r}")


def _records(df: pd.DataFrame) -> list[dict]:
    out = []
    for row in df.to_dict(orient="records"):
        clean = {}
        for k, val in row.items():
            if str(k).startswith("blk_") or k == "plan_key":
                continue
            if hasattr(val, "item"):
                val = val.item()
            if isinstance(val, float) and not math.isfinite(val):
                val = None
            clean[str(k)] = val
        out.append(clean)
    return out


def _verdicts(regime: str | None, *, as_json: bool, deadline: str = "request") -> int:
    """Every claim's verdict from the cached sweeps, in ``regime`` or both."""
    from kvdro.experiments import verdicts as v
    from kvdro.experiments.regimes import REGIMES

    try:  # a cached sweep that is missing or differs from its manifest is named, not judged
        with fd1_redirected("stderr"):
            out = [x for r in ((regime,) if regime else REGIMES) for x in v.verdicts(r, deadline=deadline)]
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m kvdro.experiments verdicts: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(strict_json(_records(pd.DataFrame([x.as_row() for x in out])), prog="python -m kvdro.experiments verdicts",
                          indent=1))
        return 0
    for x in out:
        print(f"[{x.regime}] {x.claim}\n  paper's accounting [{x.verdict}]: {x.reason}\n  engine [{x.engine_verdict}]: {x.engine_reason}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.experiments", description=__doc__.splitlines()[0])
    from kvdro.experiments.regimes import REGIMES

    parser.add_argument("experiment", choices=COMMANDS)
    parser.add_argument("--regime", choices=REGIMES, default=None,
                        help="operating point (default: memory; for verdicts: both)")
    parser.add_argument("--quick", action="store_true", help="reduced sweep for tests (one trace, one seed, 5 min)")
    parser.add_argument("--n-jobs", type=int, default=None, help="worker processes (default: joblib's configuration)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--write", action="store_true", help="save the rows to data/experiments_<name>.csv (full sweep only)")
    parser.add_argument("--no-cache", action="store_true", help="recompute every cell")
    parser.add_argument("--deadline", choices=("request", "class"), default="request",
                        help="verdicts: the engine reading's goodput by each request's deadline (default) or its class's D_i")
    args = parser.parse_args(argv)
    if args.experiment == "verdicts":
        return _verdicts(args.regime, as_json=args.json, deadline=args.deadline)
    regime = args.regime or "memory"
    if args.write and args.quick:
        parser.error("--write saves the full sweep; drop --quick")
    if args.n_jobs is not None and args.n_jobs == 0:
        parser.error("--n-jobs must be a non-zero integer")
    if args.no_cache:
        import os
        import tempfile

        os.environ["KVDRO_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvdro-nocache-")
    from kvdro.cachefile import FolderNotWritableError, ensure_writable, write_csv_atomic

    try:  # an unwritable data/ (with --write) or cache folder is named before anything runs
        if args.write:
            ensure_writable(DATA, f"{DATA} (--write)")
        with fd1_redirected("stderr"):  # solver banners (HiGHS writes to fd 1 from C) go to stderr: stdout stays JSON
            frames = run(args.experiment, quick=args.quick, n_jobs=args.n_jobs, progress=not args.json, regime=regime)
            summary, verdicts = summarise(args.experiment, frames, regime)
        if args.write:
            for key, df in frames.items():
                write_csv_atomic(df, csv_path(f"{key}_{regime}"), float_format="%.6g")
                print(f"wrote {csv_path(f'{key}_{regime}')} ({len(df)} rows)", file=sys.stderr)
    except FolderNotWritableError as exc:
        print(f"python -m kvdro.experiments {args.experiment}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        rows = [dict(r, sweep=key) for key, df in frames.items() for r in _records(df)]
        payload = {
            "experiment": args.experiment,
            "regime": regime,
            "quick": args.quick,
            "rows": rows,
            "summary": _records(summary),
            "verdicts": [x.as_row() for x in verdicts],
        }
        print(strict_json(payload, prog=f"python -m kvdro.experiments {args.experiment}", indent=1))
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_rows", 500):
        print(summary.round(3).to_string(index=False))
    print()
    for x in verdicts:
        print(f"[{x.verdict} / engine: {x.engine_verdict}] {x.claim}: {x.reason} | engine: {x.engine_reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
