"""Traces for the experiments: real and synthetic, split in time, scaled, shifted, drifting.

Train/test discipline. Every buffer (and every BCD plan) is fitted on the *earlier* part of a trace
and scored on the *later* part (:func:`train_test`): the first ``train_fraction`` of the trace's time
span is the training part, the rest the test part, never the same requests. A result computed on
the training part is *in-sample* and labelled so.

Trace names (:data:`TRACES`):

* ``"azure-2023-conv"``, ``"azure-2023-code"`` -- the real Azure LLM inference traces of 2023
  (:mod:`kvdro.datasets`; 19,366 and 8,819 requests over about an hour);
* ``"synthetic-conv"``, ``"synthetic-code"`` -- their calibrated *synthetic twins*: an hour sampled
  from the fitted class models of ``data/azure2023_class_models.json`` (the trace's three
  input-length sub-classes, Gamma inter-arrivals with the fitted CV), one independent realisation
  per ``seed``; the class label is the real trace's (``"conversation"``, ``"code"``).

Operators: :func:`scale_load` (arrival rate x factor, Figure 3(a)), :func:`shift`
(:func:`kvdro.workload.shift_trace`, output lengths x ``s``, Figures 5(b) and 6) and :func:`drift`
(a shift growing over time windows, Figure 5(a)).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from kvdro import workload

__all__ = [
    "CLASS_MODELS",
    "REAL",
    "SYNTHETIC",
    "TRACES",
    "TrainTest",
    "drift",
    "head",
    "load",
    "scale_load",
    "shift",
    "train_test",
]

REAL = ("azure-2023-conv", "azure-2023-code")
SYNTHETIC = ("synthetic-conv", "synthetic-code")
TRACES = REAL + SYNTHETIC

#: The fitted class models (made by ``data/make_synthetic.py``).
CLASS_MODELS = Path(__file__).resolve().parents[2] / "data" / "azure2023_class_models.json"
_TWIN = {"synthetic-conv": "conversation", "synthetic-code": "code"}
#: Length of a synthetic twin [s] (the real traces span about an hour).
TWIN_DURATION_S = 3600.0


@lru_cache(maxsize=4)
def _real(name: str) -> pd.DataFrame:
    from kvdro.datasets import load_trace

    return load_trace(name)


def load(name: str, *, seed: int = 0) -> pd.DataFrame:
    """The trace ``name`` (:data:`TRACES`) in the tidy schema, arrivals from 0 [s].

    ``seed`` selects the realisation of a synthetic twin (ignored for a real trace). A copy is
    returned: callers may modify it.
    """
    if name in REAL:
        return _real(name).copy()
    if name in SYNTHETIC:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
        parent = _TWIN[name]
        models = [m for m in workload.load_class_models(CLASS_MODELS) if m.name.startswith(parent + "-")]
        if len(models) != 3:
            raise ValueError(f"{CLASS_MODELS}: expected 3 sub-class models of {parent!r}, found {len(models)}")
        df = workload.synthesize_trace(models, TWIN_DURATION_S, np.random.default_rng([int(seed), 8]))
        df["request_class"] = pd.Series([parent] * len(df), dtype=object, index=df.index)
        df["arrival_s"] = df["arrival_s"] - df["arrival_s"].min()
        df.attrs["source"] = f"{name} (seed {seed})"
        return df
    raise ValueError(f"name: unknown trace {name!r}; choose from {TRACES}")


class TrainTest(NamedTuple):
    """A trace cut in time: ``train`` (earlier) and ``test`` (later, arrivals re-based to 0 s)."""

    train: pd.DataFrame
    test: pd.DataFrame


def train_test(df: pd.DataFrame, train_fraction: float = 0.5) -> TrainTest:
    """Cut a tidy trace at ``train_fraction`` of its time span: earlier requests train, later test.

    The test part's arrivals are shifted to start at 0 s; ``test.attrs["offset_s"]`` records by
    how much. Both parts must hold at least 3 requests of each class.
    """
    if not isinstance(df, pd.DataFrame) or "arrival_s" not in df.columns or len(df) == 0:
        raise ValueError("df: must be a non-empty tidy trace with an arrival_s column")
    f = float(train_fraction)
    if not (0 < f < 1):
        raise ValueError(f"train_fraction: must be in (0, 1), got {train_fraction!r}")
    t0, t1 = float(df["arrival_s"].min()), float(df["arrival_s"].max())
    cut = t0 + f * (t1 - t0)
    early = df["arrival_s"].to_numpy() < cut
    train = df[early].reset_index(drop=True)
    test = df[~early].reset_index(drop=True)
    for part, label in ((train, "train"), (test, "test")):
        counts = part["request_class"].value_counts()
        missing = set(df["request_class"].unique()) - set(counts.index)
        if missing or (counts < 3).any():
            raise ValueError(f"train_fraction: the {label} part has fewer than 3 requests of some class")
    offset = float(test["arrival_s"].min())
    test["arrival_s"] = test["arrival_s"] - offset
    train.attrs = {**df.attrs, "part": "train"}
    test.attrs = {**df.attrs, "part": "test", "offset_s": offset}
    return TrainTest(train, test)


def head(df: pd.DataFrame, duration_s: float) -> pd.DataFrame:
    """The first ``duration_s`` seconds of a trace (for reduced, ``--quick`` sweeps)."""
    d = float(duration_s)
    if not (math.isfinite(d) and d > 0):
        raise ValueError(f"duration_s: must be a positive number, got {duration_s!r}")
    t0 = float(df["arrival_s"].min())
    out = df[df["arrival_s"].to_numpy() < t0 + d].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out


def scale_load(df: pd.DataFrame, factor: float) -> pd.DataFrame:
    """Arrival rate x ``factor``: inter-arrival gaps divided by it (same requests, same order)."""
    f = float(factor)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"factor: must be a positive number, got {factor!r}")
    out = df.copy()
    t0 = float(df["arrival_s"].min())
    out["arrival_s"] = t0 + (df["arrival_s"] - t0) / f
    out.attrs = {**df.attrs, "load": f}
    return out


def shift(df: pd.DataFrame, s: float, *, max_output_tokens: int | None = None) -> pd.DataFrame:
    """Output lengths x ``s`` (:func:`kvdro.workload.shift_trace`; clipped at ``max_output_tokens``)."""
    return workload.shift_trace(df, s, max_output_tokens=max_output_tokens)


def drift(df: pd.DataFrame, s_end: float, n_windows: int, *, max_output_tokens: int | None = None) -> pd.DataFrame:
    """A drifting trace: the time span cut into ``n_windows`` equal windows, window ``w`` shifted by
    ``s_w = 1 + (s_end - 1) w / (n_windows - 1)`` (so the first window is unshifted and the last is
    shifted by ``s_end``). Adds an integer column ``window``; ``attrs["shifts"]`` lists the ``s_w``.
    """
    if isinstance(n_windows, bool) or not isinstance(n_windows, (int, np.integer)) or n_windows < 2:
        raise ValueError(f"n_windows: must be an integer >= 2, got {n_windows!r}")
    s_end = float(s_end)
    if not (math.isfinite(s_end) and s_end > 0):
        raise ValueError(f"s_end: must be a positive number, got {s_end!r}")
    t = df["arrival_s"].to_numpy(dtype=float)
    t0, t1 = float(t.min()), float(t.max())
    edges = np.linspace(t0, t1, int(n_windows) + 1)
    window = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, int(n_windows) - 1)
    shifts = 1.0 + (s_end - 1.0) * np.arange(int(n_windows)) / (int(n_windows) - 1)
    out = df.copy()
    x = df["output_tokens"].to_numpy()
    y = np.empty_like(x, dtype=np.int64)
    for w, s in enumerate(shifts):
        m = window == w
        if m.any():
            y[m] = workload.shift_outputs(x[m], float(s), max_output_tokens=max_output_tokens)
    out["output_tokens"] = y
    out["window"] = window.astype(np.int64)
    out.attrs = {**df.attrs, "shifts": [float(s) for s in shifts], "window_edges_s": [float(e) for e in edges]}
    return out
