"""Benchmark: routing draws near thresholds, ``python -m kvdro.bench atlas-draws`` (issue 34, item 1).

Selects the verdicts of the atlas near a threshold by the rule of
:mod:`kvdro.experiments.atlas_draws` (from the cached ``data/atlas_<family>.csv``, no run), and the
far verdicts nearest the margin as a control, and reruns each such (primary point, engine)'s
``default`` and those arms under the routing draws
:data:`~kvdro.experiments.atlas_draws.DRAWS` (seed 0, the atlas's own, as a check, and K new ones)
with joblib on ``--n-jobs`` worker processes, and writes ``data/atlas_draws.csv`` with its manifest
(:mod:`kvdro.cachefile`): per (cell, engine, arm, draw) the run's metrics and its paired change
against the same draw's default with the 95 % moving-block interval. Resumable like the atlas
(:mod:`kvdro.bench.atlas`): finished runs are kept in ``data/atlas_draws.partial.csv`` and the table
is computed from the runs as read back from it, so a resumed rerun writes the same bytes, and a
rerun into an empty folder is byte-identical (seeded routing and bootstrap; no wall time in the
file). It prints the selection, the wall time and, per engine, whether the verdicts keep their class.

``--draws K`` other than the default count writes elsewhere only (``--out DIR``): the chapter reads
the committed count from ``data/``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import pandas as pd

from kvdro.bench import atlas as bench_atlas
from kvdro.experiments import atlas
from kvdro.experiments import atlas_draws as ad

DATA = atlas.DATA


def _run(cell: atlas.Cell, engine: str, arm: str, draw: int) -> dict:
    """One run in a worker (module-level: picklable), the atlas's worker under routing seed ``draw``."""
    return {"draw": int(draw), **bench_atlas.run_one(cell, engine, arm, None, routing_seed=draw)}


def run_draws(*, out_dir: str | Path = DATA, k: int = len(ad.DRAWS) - 1, n_jobs: int = 2, resume: bool = True,
              verbose: bool = True) -> tuple[pd.DataFrame, float]:
    """Rerun the selected verdicts under draws 0..``k`` and write ``atlas_draws.csv`` in ``out_dir``;
    returns (the table, wall time [s]). ValueError names a bad argument."""
    from joblib import Parallel, delayed

    from kvdro.cachefile import ensure_writable, partial_path, write_csv_atomic

    n_jobs = bench_atlas.check_jobs(n_jobs)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: must be an integer >= 1 (new routing draws), got {k!r}")
    out_dir = Path(out_dir)
    if k != len(ad.DRAWS) - 1 and out_dir.resolve() == DATA.resolve():
        raise ValueError(f"k: {k} draws are written elsewhere only (--out DIR); data/ keeps {len(ad.DRAWS) - 1}")
    ensure_writable(out_dir, f"{out_dir} (where the routing draws are written)", create=True)
    path = out_dir / "atlas_draws.csv"
    part = partial_path(path)
    say = print if verbose else (lambda *a, **kw: None)

    sel = ad.near(atlas.read())
    todo = ad.tasks(sel, range(k + 1))
    chosen, control = sel[sel["role"] == "near"], sel[sel["role"] == "control"]
    say(f"rule: zero within {ad.NEAR_HALF_WIDTHS:g} half-width of the paired interval's nearer end; "
        f"{len(chosen)} of {len(sel)} verdicts selected, {len(control)} more as a control (zero within "
        f"{ad.CONTROL_HALF_WIDTHS:g} half-widths), at {pd.concat([chosen, control]).groupby(['cell', 'engine']).ngroups} "
        f"(point, engine) pairs; draws 0..{k}: {len(todo)} runs")
    start = time.perf_counter()
    old = bench_atlas.read_partial(part) if resume else pd.DataFrame()
    key = ad.KEY
    done = {tuple(r[c] for c in key): r for r in old.to_dict("records")} if set(key) <= set(old.columns) else {}
    missing = [t for t in todo if (t[0].key, t[1], t[2], t[3]) not in done]
    if done:
        say(f"  resuming: {len(todo) - len(missing)} of {len(todo)} runs found in {part.name}")
    rows = [done[(c.key, e, a, d)] for c, e, a, d in todo if (c.key, e, a, d) in done]
    chunk = 4 * n_jobs
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(Parallel(n_jobs=n_jobs)) if n_jobs > 1 and missing else None
        for i in range(0, len(missing), chunk):
            batch = missing[i:i + chunk]
            new = [_run(*t) for t in batch] if pool is None else pool(delayed(_run)(*t) for t in batch)
            rows.extend(new)
            write_csv_atomic(pd.DataFrame(rows), part, decimals=bench_atlas.DECIMALS + 3, manifest=False)
            say(f"  {len(rows)}/{len(todo)} runs ({time.perf_counter() - start:.0f} s)", flush=True)
    if not missing and not part.is_file():
        write_csv_atomic(pd.DataFrame(rows), part, decimals=bench_atlas.DECIMALS + 3, manifest=False)
    # The table comes from the runs as stored (read back): a resumed rerun writes the same bytes.
    runs = bench_atlas.read_partial(part).set_index(list(key))
    runs = runs.loc[[(c.key, e, a, d) for c, e, a, d in todo]].reset_index()
    runs = runs[[*key, *[c for c in runs.columns if c not in key]]]
    table = ad.compare(runs)
    write_csv_atomic(table, path, key=key, decimals=bench_atlas.DECIMALS)
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    wall = time.perf_counter() - start
    say(f"  {len(todo)} runs in {wall:.0f} s wall with --n-jobs {n_jobs} ({len(missing)} run now); wrote {path.name}")
    return table, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvdro.bench atlas-draws", description=__doc__.splitlines()[0])
    ap.add_argument("--n-jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--draws", type=int, default=len(ad.DRAWS) - 1, metavar="K",
                    help=f"new routing draws besides the atlas's seed 0 (default {len(ad.DRAWS) - 1}; another K needs --out)")
    ap.add_argument("--out", default=str(DATA), help="folder of the table (default data/)")
    ap.add_argument("--no-resume", action="store_true", help="ignore finished runs of an interrupted rerun")
    ap.add_argument("--list", action="store_true", help="print the selected verdicts, run nothing")
    args = ap.parse_args(argv)
    try:
        if args.list:
            sel = ad.near(atlas.read())
            for r in sel[sel["role"] != ""].itertuples():
                print(f"  {r.cell:<44} {r.engine:<15} {r.arm:<9} class {r.cls:+d}, zero at {r.nearness:.2f} half-widths"
                      f" ({r.role})")
            print(f"{int(sel['selected'].sum())} of {len(sel)} verdicts near a threshold, "
                  f"{int((sel['role'] == 'control').sum())} more rerun as a control")
            return 0
        table, _ = run_draws(out_dir=args.out, k=args.draws, n_jobs=args.n_jobs, resume=not args.no_resume)
        if Path(args.out).resolve() == DATA.resolve():
            st = ad.stability(table, atlas.read())
            for role in ("near", "control"):
                print(f"  {role}: kept their class in all {len(ad.DRAWS)} draws: "
                      + ", ".join(f"{e} {n}" for e, n in ad.engine_counts(st, role).items()))
                if len(ch := ad.changes(st, role)):
                    print(ch.to_string(index=False))
    except ValueError as exc:
        print(f"python -m kvdro.bench atlas-draws: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
