"""Benchmark: the atlas, ``python -m kvdro.bench atlas`` (issue 34, items 1 and 2).

Runs every (cell, engine, arm) of :mod:`kvdro.experiments.atlas` family by family (a family is a
workload: ``conversation``, ``code``, ``sharegpt``, ``mooncake``, ``r1``) with joblib -- processes
(``--backend loky``, the default) or a local Dask cluster (``--backend dask``, the same code on a
``distributed`` client) -- on ``--n-jobs`` workers, and caches per family

* ``data/atlas_<family>.csv``: one row per run (the metrics, the implementation that ran it, the
  paired goodput changes against the engine's default and against ``vllm-v1``), and
* ``data/atlas_value_<family>.csv``: per cell and engine, the lower bound on what knowing the
  lengths is worth and the share of it each estimate recovers,

each written atomically with its manifest (:mod:`kvdro.cachefile`). **Resumable**: every finished
run is kept in ``data/atlas_<family>.partial.csv`` (atomic too); a rerun after an interruption
computes only the missing runs. The tables are computed from the runs as read back from that file,
so an interrupted-and-resumed sweep writes the same bytes as an uninterrupted one, and a rerun from
an empty cache is byte-identical (routing seed 0, seeded bootstrap; no wall time in the files).

It prints the cells it runs (with the rule that chose each) and the wall time of each family.
``python -m kvdro.bench all`` skips it while a preset lacks its compiled implementation
(:func:`skip_reason`).
``--list`` prints the cells and the number of runs and stops.

**Reduced sweeps.** ``--quick N`` (the first N requests of each cell's trace), ``--engines`` or
``--workloads`` (a subset) or ``--points primary`` (each rule's point only) give a reduced sweep:
it is printed as REDUCED, its files are named
``atlas_reduced_<family>.csv`` with a ``sweep`` column saying what was cut, and it is refused in
``data/`` (``--out DIR`` is required): a reduced sweep is never written over, or beside, the full cache.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.experiments import atlas

DATA = Path(__file__).resolve().parents[2] / "data"
KEY = ("cell", "engine", "arm")
BACKENDS = ("loky", "dask")
DECIMALS = 6


def skip_reason() -> str | None:
    """Why ``python -m kvdro.bench all`` skips the atlas: without every preset's compiled
    implementation it runs on the step-by-step reference engines, hours instead of minutes
    (run ``python -m kvdro.bench atlas`` explicitly to do it anyway)."""
    from kvdro.sim.presets_compiled import COMPILED

    missing = [e for e in atlas.ENGINES if e != "vllm-v0" and e not in COMPILED]
    if missing:
        return (f"no compiled implementation of {missing}: the full atlas would run them on the reference engine "
                "(hours); run `python -m kvdro.bench atlas` to do it anyway")
    return None


def run_one(cell: atlas.Cell, engine: str, arm: str, quick: int | None, routing_seed: int = 0) -> dict:
    """One run in a worker (module-level: picklable), under routing seed ``routing_seed``."""
    if engine == "vllm-v0":
        from kvdro.sim.engine_compiled import warm_up

        warm_up()
    return atlas.run_arm(cell, engine, arm, quick_requests=quick, routing_seed=routing_seed)


def check_jobs(n_jobs) -> int:
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs < 1:
        raise ValueError(f"n_jobs: must be an integer >= 1, got {n_jobs!r}")
    return int(n_jobs)


@contextlib.contextmanager
def _backend(backend: str, n_jobs: int):
    """joblib's backend for the sweep: processes, or a local Dask cluster on loopback."""
    import joblib

    if backend == "loky" or n_jobs == 1:
        yield
        return
    from distributed import Client

    with Client(n_workers=n_jobs, threads_per_worker=1, processes=True, protocol="tcp", host="127.0.0.1",
                dashboard_address=None) as _client, joblib.parallel_config(backend="dask"):
        yield


def read_partial(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame()
    try:
        return pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
        return pd.DataFrame()


def run_family(family: str, *, out_dir: str | Path = DATA, n_jobs: int = 2, backend: str = "loky", engines=None,
               workloads=None, quick: int | None = None, points: str = "all", resume: bool = True,
               verbose: bool = True):
    """Run (or resume) one family and write its two tables; returns (runs, value table, wall time [s]).

    ``quick`` (first N requests per cell), ``engines`` or ``workloads`` (subsets) or
    ``points="primary"`` (only each rule's point, not the load range) make the sweep reduced (module
    docstring): refused in ``data/``. ValueError names a bad argument."""
    from joblib import Parallel, delayed

    from kvdro.cachefile import ensure_writable, partial_path, write_csv_atomic

    (family,) = atlas.check_families((family,))
    n_jobs = check_jobs(n_jobs)
    if points not in atlas.POINTS:
        raise ValueError(f"points: must be one of {atlas.POINTS}, got {points!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
    engines = atlas.check_engines(engines)
    if workloads is not None:
        workloads = (workloads,) if isinstance(workloads, str) else tuple(workloads)
        bad = [w for w in workloads if w not in atlas.FAMILIES[family]]
        if bad or not workloads:
            raise ValueError(f"workloads: family {family!r} has {list(atlas.FAMILIES[family])}, got {list(workloads)!r}")
    if quick is not None and (isinstance(quick, bool) or not isinstance(quick, (int, np.integer)) or quick < 2):
        raise ValueError(f"quick: must be an integer >= 2 (requests per cell), got {quick!r}")
    cut = [f"first {quick} requests per cell"] if quick is not None else []
    cut += [f"engines {list(engines)}"] if engines != atlas.ENGINES else []
    cut += [f"workloads {list(workloads)}"] if workloads is not None else []
    cut += ["only the rule's point per workload and GPU"] if points == "primary" else []
    out_dir = Path(out_dir)
    if cut and out_dir.resolve() == DATA.resolve():
        raise ValueError("out_dir: a reduced sweep (" + "; ".join(cut) + ") is never written in data/, beside the full atlas")
    ensure_writable(out_dir, f"{out_dir} (where the atlas writes its tables)", create=True)
    stem = f"atlas_reduced_{family}" if cut else f"atlas_{family}"
    runs_path, value_path = out_dir / f"{stem}.csv", out_dir / f"{stem.replace('atlas_', 'atlas_value_', 1)}.csv"
    part = partial_path(runs_path)

    cell_list = [c for c in atlas.cells([family], points) if workloads is None or c.workload in workloads]
    todo = atlas.tasks(cell_list, engines)
    say = print if verbose else (lambda *a, **k: None)
    say(f"family {family}: {len(cell_list)} cells x arms = {len(todo)} runs" + (f"  [REDUCED: {'; '.join(cut)}]" if cut else ""))
    for c in cell_list:
        say(f"  {c.key:<44} {c.model}, rule: {c.rule} (map: {c.map_regime}); estimates fitted {c.fit}"
            + (f"; the first {c.window_s:g} s of the trace" if np.isfinite(c.window_s) else ""))
    start = time.perf_counter()
    old = read_partial(part) if resume else pd.DataFrame()
    done = {tuple(r[k] for k in KEY): r for r in old.to_dict("records")} if set(KEY) <= set(old.columns) else {}
    missing = [t for t in todo if (t[0].key, t[1], t[2]) not in done]
    if done:
        say(f"  resuming: {len(todo) - len(missing)} of {len(todo)} runs found in {part.name}")
    rows = [done[(c.key, e, a)] for c, e, a in todo if (c.key, e, a) in done]
    chunk = max(2 * n_jobs, 1)
    with _backend(backend, n_jobs), contextlib.ExitStack() as stack:
        # one pool for the whole family (its workers keep their traces and compiled kernels)
        pool = stack.enter_context(Parallel(n_jobs=n_jobs)) if n_jobs > 1 and missing else None
        for i in range(0, len(missing), chunk):
            batch = missing[i:i + chunk]
            if pool is None:
                new = [run_one(c, e, a, quick) for c, e, a in batch]
            else:
                new = pool(delayed(run_one)(c, e, a, quick) for c, e, a in batch)
            rows.extend(new)
            write_csv_atomic(pd.DataFrame(rows), part, decimals=DECIMALS + 3, manifest=False)
            say(f"  {len(rows)}/{len(todo)} runs ({time.perf_counter() - start:.0f} s)", flush=True)
    if not missing and not part.is_file():
        write_csv_atomic(pd.DataFrame(rows), part, decimals=DECIMALS + 3, manifest=False)
    # The tables come from the runs as stored (read back): a resumed sweep writes the same bytes.
    runs = read_partial(part).set_index(list(KEY))
    runs = runs.loc[[(c.key, e, a) for c, e, a in todo]].reset_index()
    runs = runs[["family", *KEY] + [c for c in runs.columns if c not in ("family", *KEY)]]
    table = atlas.compare(runs).drop(columns=["served_blocks"])
    value = atlas.length_value(runs)
    if cut:
        table.insert(0, "sweep", "REDUCED: " + "; ".join(cut))
        value.insert(0, "sweep", "REDUCED: " + "; ".join(cut))
    write_csv_atomic(table, runs_path, key=KEY, decimals=DECIMALS)
    write_csv_atomic(value, value_path, key=("cell", "engine"), decimals=DECIMALS)
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    wall = time.perf_counter() - start
    impl = table.groupby("engine", sort=False)["implementation"].agg(lambda s: ",".join(sorted(set(s))))
    say(f"  family {family}: {len(todo)} runs in {wall:.0f} s wall ({len(missing)} run now); implementations: "
        + ", ".join(f"{e} {i}" for e, i in impl.items()))
    say(f"  wrote {runs_path.name}, {value_path.name}")
    return table, value, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvdro.bench atlas", description=__doc__.splitlines()[0])
    ap.add_argument("--n-jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--families", default=",".join(atlas.FAMILIES), help=f"comma-separated (default: {','.join(atlas.FAMILIES)})")
    ap.add_argument("--backend", default="loky", help="joblib backend: loky (processes) or dask (a local cluster)")
    ap.add_argument("--engines", default=None, help="comma-separated presets (a subset makes the sweep REDUCED)")
    ap.add_argument("--workloads", default=None, help="comma-separated atlas workloads of one family (REDUCED)")
    ap.add_argument("--points", default="all", choices=atlas.POINTS,
                    help="all: the load range of each workload and GPU; primary: the rule's point only (REDUCED)")
    ap.add_argument("--quick", type=int, default=None, metavar="N", help="first N requests per cell (REDUCED)")
    ap.add_argument("--out", default=str(DATA), help="folder of the tables (default data/; a reduced sweep needs another)")
    ap.add_argument("--no-resume", action="store_true", help="ignore finished runs of an interrupted sweep")
    ap.add_argument("--list", action="store_true", help="print the cells and the number of runs, run nothing")
    args = ap.parse_args(argv)
    try:
        families = atlas.check_families(tuple(f for f in args.families.split(",") if f))
        engines = None if args.engines is None else tuple(e for e in args.engines.split(",") if e)
        workloads = None if args.workloads is None else tuple(w for w in args.workloads.split(",") if w)
        if args.list:
            total = 0
            for fam in families:
                cl = atlas.cells([fam], args.points)
                n = len(atlas.tasks(cl, engines))
                total += n
                print(f"family {fam}: {len(cl)} cells, {n} runs")
                for c in cl:
                    print(f"  {c.key:<44} {c.model}, rule: {c.rule}")
            print(f"atlas: {total} runs")
            return 0
        walls = {}
        for fam in families:
            walls[fam] = run_family(fam, out_dir=args.out, n_jobs=args.n_jobs, backend=args.backend, engines=engines,
                                    workloads=workloads, quick=args.quick, points=args.points,
                                    resume=not args.no_resume)[2]
    except ValueError as exc:
        print(f"python -m kvdro.bench atlas: {exc}")
        return 2
    print("wall time per family: " + ", ".join(f"{f} {w:.0f} s" for f, w in walls.items())
          + f"; total {sum(walls.values()):.0f} s with --n-jobs {args.n_jobs} ({args.backend})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
