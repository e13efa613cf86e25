"""Where the sweeps keep their results on disk, and what a cached result is keyed by.

A sweep cell (one simulation, one plan) is cached with :class:`joblib.Memory` keyed by

* the function and its keyword arguments (trace name, split, policy, rho, seed, load, shift, ...),
* a *code fingerprint*: the SHA-256 of the source of every module the result depends on
  (``kvdro.sim``, ``kvdro.bcd``, ``kvdro.joint``, ``kvdro.workload``, ``kvdro.datasets``,
  ``kvdro.servegen``, ``kvdro.hardware``, ``kvdro.queueing``, ``kvdro.newsvendor``, ``kvdro.wasserstein``,
  ``kvdro.ambiguity``, ``kvdro.costs`` and the cell code of ``kvdro.experiments``: traces, sweeps,
  analytic, regimes, uncertainty, headroom), so that a change to the
  simulator recomputes every cell, while a rebuild of the book with nothing changed recomputes
  nothing.

The real traces are sha256-checked by :mod:`kvdro.datasets`, so a trace *name* identifies its bytes.

Folder: ``$KVDRO_CACHE_DIR`` if set; otherwise ``_build/kvdro-cache`` in the repository when the
package runs from a checkout (``make clean`` empties it), else ``~/.cache/kvdro``.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import joblib

__all__ = ["CACHE_ENV", "DEPENDENCIES", "cache_dir", "code_fingerprint", "memory"]

#: Environment variable that overrides the cache folder.
CACHE_ENV = "KVDRO_CACHE_DIR"

#: Modules (or packages) whose source keys every cached result.
DEPENDENCIES: tuple[str, ...] = (
    "sim",
    "bcd",
    "joint",
    "workload.py",
    "datasets.py",
    "servegen.py",
    "hardware.py",
    "queueing.py",
    "newsvendor.py",
    "wasserstein.py",
    "ambiguity.py",
    "costs.py",
    "experiments/traces.py",
    "experiments/headroom.py",
    "experiments/sweeps.py",
    "experiments/analytic.py",
    "experiments/regimes.py",
    "experiments/uncertainty.py",
)

_PACKAGE = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """The cache folder (module docstring); created on first use by :func:`memory`."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    repo = _PACKAGE.parent
    if (repo / "pyproject.toml").is_file():
        return repo / "_build" / "kvdro-cache"
    return Path.home() / ".cache" / "kvdro"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 (16 hex digits) of the source files of :data:`DEPENDENCIES`, in a fixed order.

    A missing module (e.g. ``kvdro.bcd`` before it exists) contributes its absence, so adding it
    changes the fingerprint.
    """
    h = hashlib.sha256()
    for name in DEPENDENCIES:
        path = _PACKAGE / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(_PACKAGE)).encode())
            h.update(f.read_bytes() if f.is_file() else b"<missing>")
    return h.hexdigest()[:16]


def memory(enabled: bool = True) -> joblib.Memory:
    """A :class:`joblib.Memory` on :func:`cache_dir` (or a no-op one when ``enabled`` is false).

    Raises:
        FolderNotWritableError: the folder is a file, or cannot be created or written (naming it
            and ``KVDRO_CACHE_DIR`` when that set it).
    """
    if not enabled:
        return joblib.Memory(location=None, verbose=0)
    path = cache_dir()
    from kvdro.cachefile import ensure_writable

    where = f"{CACHE_ENV}={path}" if os.environ.get(CACHE_ENV) else f"the cache folder {path}"
    ensure_writable(path, where, create=True)
    return joblib.Memory(location=str(path), verbose=0)
