"""Execute each chapter once in ``make test``: nbval's run also feeds the book build.

A pytest plugin (``pytest -p nbval_record``, with ``tests/`` on ``sys.path``): while nbval runs the
chapters' notebooks (``_build/nbval/*.ipynb``, made from ``book/*.md`` by jupytext), it records the
outputs that each cell produced in nbval's kernel. A notebook every cell of which passed is written,
with those outputs, to the folder ``KVDRO_NBVAL_EXECUTED`` names. Nothing is written for a notebook
with a failed, skipped or unrun cell, so a failing chapter is never cached: the book build executes it
itself (and fails on it).

``python tests/nbval_record.py FOLDER CACHE`` then stores those notebooks in the book's jupyter-cache
(``_build/.jupyter_cache``); jupyter-cache keys a notebook by the hash of its code cells and kernel, so
the book build (``execute_notebooks: cache``) uses the outputs of nbval's run for a chapter whose
code is the same, and executes any other chapter as usual. It prints which chapters it stored.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

_NOTEBOOKS: dict[Path, dict] = {}  # notebook path -> {"nb": parsed notebook, "passed": {cell index}, "cells": n}


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "cell") and hasattr(item.parent, "nb")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "call" or not _is_nbval_cell(item):
        return
    report = outcome.get_result()
    path = Path(str(item.parent.fspath))
    entry = _NOTEBOOKS.setdefault(path, {"nb": item.parent.nb, "passed": set(),
                                         "cells": sum(c.cell_type == "code" for c in item.parent.nb.cells)})
    if report.passed and item.test_outputs is not None:
        entry["passed"].add(id(item.cell))
        entry["count"] = entry.get("count", 0) + 1
        item.cell.outputs = [nbformat.from_dict(dict(o)) for o in item.test_outputs]
        item.cell.execution_count = entry["count"]
        for out in item.cell.outputs:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = entry["count"]


def pytest_sessionfinish(session):
    folder = os.environ.get("KVDRO_NBVAL_EXECUTED")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for path, entry in _NOTEBOOKS.items():
        if len(entry["passed"]) != entry["cells"]:
            continue  # a cell failed, was skipped or did not run: the book build executes this chapter itself
        tmp = Path(folder) / (path.name + ".tmp")
        nbformat.write(entry["nb"], tmp)
        tmp.replace(Path(folder) / path.name)


def store(folder: Path, cache_path: Path) -> list[str]:
    """Store every executed notebook of ``folder`` in the jupyter-cache at ``cache_path``."""
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_path))
    stored = []
    for nb_path in sorted(folder.glob("*.ipynb")):
        cache.cache_notebook_file(str(nb_path), check_validity=False, overwrite=True)
        stored.append(nb_path.stem)
    return stored


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/nbval_record.py EXECUTED_FOLDER JUPYTER_CACHE")
    names = store(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"jupyter-cache {sys.argv[2]}: {len(names)} chapters executed by nbval ({', '.join(names) or 'none'})")
