"""The sweep runner: every table and figure of chapter 10 is a list of *cells* run through here.

A cell is a small dict of inputs (``{"trace": "azure-2023-conv", "policy": "dro", "rho": 10, ...}``)
and a module-level function maps it to a dict of results (metrics). :func:`run_sweep`

* runs the cells with :class:`joblib.Parallel` (processes by default: joblib's ``loky`` backend),
* shows one progress bar (tqdm, on stderr),
* caches each cell on disk with :class:`joblib.Memory` keyed by the function, the cell and the code
  fingerprint of :mod:`kvdro.experiments.cache` -- a rebuild recomputes only what changed,
* returns a tidy :class:`pandas.DataFrame`, one row per cell (inputs, then results), in cell order.

Scaling out changes a backend, not the code. joblib's backends include Dask; with a
``distributed`` client (a local one here, a cluster's scheduler address in production) the same
call runs on the cluster's workers::

    import joblib
    from distributed import Client
    from kvdro import experiments

    with Client(processes=False, dashboard_address=None) as client:   # or Client("tcp://scheduler:8786")
        with joblib.parallel_config(backend="dask"):
            df = experiments.table4(quick=True)

A local client binds to the host's network address; on a machine without a network route pass
``protocol="tcp", host="127.0.0.1"`` to keep it on loopback (the test suite does).
``n_jobs=None`` (the default) lets :func:`joblib.parallel_config` choose; an explicit ``n_jobs``
sets the number of workers of the default (process) backend. The test suite runs this example.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import joblib
import numpy as np
import pandas as pd
from tqdm import tqdm

from kvdro.experiments.cache import code_fingerprint, memory

__all__ = ["available_cpus", "run_sweep"]


def _call(func: Callable[..., Mapping[str, Any]], cell: Mapping[str, Any], code: str) -> dict[str, Any]:
    """Run one cell. ``code`` (the code fingerprint) is only part of the cache key."""
    del code
    out = func(**cell)
    if not isinstance(out, Mapping):
        raise TypeError(f"{func.__name__} must return a dict of results, got {type(out).__name__}")
    return dict(out)


def _check_cells(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(cells, Mapping) or not isinstance(cells, Sequence):
        raise ValueError("cells: must be a sequence of dicts (one per sweep cell)")
    out = []
    for j, cell in enumerate(cells):
        if not isinstance(cell, Mapping) or not all(isinstance(k, str) for k in cell):
            raise ValueError(f"cells[{j}]: must be a dict with string keys")
        for k, v in cell.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"cells[{j}]: {k} = {v!r} is not finite")
            if not isinstance(v, (str, int, float, bool, type(None), np.integer, np.floating)):
                raise ValueError(f"cells[{j}]: {k} must be a scalar (str, number, bool or None), got {type(v).__name__}")
        out.append(dict(cell))
    return out


def available_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def _capped(n_jobs: int | None, cells: int, desc: str) -> int | None:
    """``n_jobs`` capped at min(cells, CPUs) -- more workers than cells or CPUs only costs memory
    (~100 MB each) -- with a line on stderr when capped; joblib's negative counts (-1: every CPU)
    are read the same way. ``None`` (joblib's configuration) is left alone."""
    if n_jobs is None:
        return None
    cpus = available_cpus()
    asked = int(n_jobs) if n_jobs > 0 else max(cpus + 1 + int(n_jobs), 1)
    limit = min(cells, cpus)
    if asked > limit:
        print(f"{desc}: n_jobs = {int(n_jobs)} capped at {limit} = min({cells} cells, {cpus} CPUs)", file=sys.stderr)
        return limit
    return n_jobs


def run_sweep(
    func: Callable[..., Mapping[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    *,
    n_jobs: int | None = None,
    cache: bool = True,
    progress: bool = True,
    desc: str | None = None,
) -> pd.DataFrame:
    """Run ``func(**cell)`` for every cell; one row per cell (inputs then results), in cell order.

    Args:
        func: a module-level function (picklable: worker processes import it by name) returning a
            dict of scalar results. It must be deterministic in its arguments (seed included).
        cells: the sweep, a sequence of dicts of scalar inputs.
        n_jobs: worker count of the default process backend, capped at min(cells, CPUs) with a line
            on stderr; ``None`` defers to :func:`joblib.parallel_config` (1 unless configured; the
            Dask backend picks its own).
        cache: read and write the on-disk cache (:func:`kvdro.experiments.cache.cache_dir`).
        progress: show a tqdm bar on stderr.
        desc: the bar's label (default: ``func``'s name).
    """
    if not callable(func):
        raise ValueError("func: must be callable")
    rows = _check_cells(cells)
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs == 0):
        raise ValueError(f"n_jobs: must be a non-zero integer or None, got {n_jobs!r}")
    if not rows:
        return pd.DataFrame()
    n_jobs = _capped(n_jobs, len(rows), desc or func.__name__)
    call = memory(cache).cache(_call)
    fingerprint = code_fingerprint()
    jobs = (joblib.delayed(call)(func, cell, fingerprint) for cell in rows)
    results: list[dict[str, Any]] = []
    with tqdm(total=len(rows), desc=desc or func.__name__, file=sys.stderr, disable=not progress, leave=False) as bar:
        for res in joblib.Parallel(n_jobs=n_jobs, return_as="generator")(jobs):
            results.append(res)
            bar.update()
    clash = [k for k in results[0] if k in rows[0]]
    if clash:
        raise ValueError(f"func: result keys {clash} repeat input keys")
    return pd.DataFrame([cell | res for cell, res in zip(rows, results)])
