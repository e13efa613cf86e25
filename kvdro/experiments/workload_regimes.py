"""The regime map on long-context and reasoning workloads (issue 33, item 4; chapter 9).

Chapter 9's regime rules (:mod:`kvdro.sim.regimes`: **stable** by the queue -- drain within 5 % of
the arrival span and a backlog that does not grow; **memory-bound** -- mean KV use >= 60 % with
vLLM preempting) applied, unchanged, to three workloads on the models they stand for, on A100-80GB
and H100-80GB, on every 8-GPU deployment of one configuration that fits the model with its whole
context window, under today's engine (vLLM v0's scheduler, ``policy="vllm"``):

* ``mooncake-conv``: Mooncake's conversation trace, whole (12,031 requests over its 3,537 s: one
  hour) on Llama-3.1-70B;
* ``r1``: the first :data:`R1_DURATION_S` seconds of ServeGen's DeepSeek-R1 day at production rate
  (:func:`kvdro.workload.servegen_r1`, seed 0) on DeepSeek-R1-Distill-Llama-70B;
* ``azure-conv-7b``: the Azure 2023 conversation trace, whole (19,366 requests, 58 min) on
  Llama-2-7B, which has no grouped-query attention (512 KiB of KV per token);
* ``azure-conv-70b``: the same trace, whole, on Llama-2-70B, on **H100-80GB only**
  (:data:`WORKLOAD_GPUS`): its A100 map is chapter 8's headroom map (``data/headroom.csv``, the test
  half). The H100 step times are the hardware model's fit to Vidur's H100 profiles of Llama-2-70B
  (``h100-llama2-70b-mlp.csv``, ``all_reduce_h100_dgx.csv``: :mod:`kvdro.hardware`).

``max_model_len`` is the model's window (:attr:`kvdro.hardware.Model.max_context`: 131,072 tokens for
Llama-3.1-70B and R1-Distill, 4,096 for Llama-2-7B), except Llama-2-70B, served as on its A100 map
with the book's 16,384-token window (:func:`max_model_len`). vLLM ignores a prompt longer than the window and caps
an output at it (:mod:`kvdro.sim.simulate`); both are counted per cell (``ignored``, ``truncated``).

**The deployments** (:func:`deployments`): for each PP = 1 configuration of
:func:`kvdro.hardware.deployments_that_fit` on 8 GPUs (its KV pool holds one window-long sequence:
vLLM's start-up check), 8 / TP groups of it, requests routed uniformly.

**The loads, fixed before the run** (:data:`LOADS`): per workload, ten multipliers of the trace's
own arrival rate in steps of sqrt(2) (a 22.6x range), replayed by :func:`kvdro.sim.regimes.at_load`.
Each range starts well inside the light region by chapter 4's capacity arithmetic and ends past
saturation: the R1 hour arrives at 19 requests/s of ~1,500-token outputs, several times what 8 GPUs
decode, so its grid starts at 1/64 of it; Mooncake's long prompts saturate 8 GPUs near its own rate
(from 1/16); Llama-2-7B serves the short Azure requests many times faster than a 70B model (from 1x);
Llama-2-70B on eight A100s saturates near the Azure trace's own rate (chapter 9's map), and an H100
decodes a few times faster, so its grid runs from 1/4 to 5.7x.

Per cell (one row; :func:`regime_cell`): vLLM's mean and peak KV use, preemptions, the share of
served requests it preempts at least once (``preempted_share``), its **recompute share**
R / (W + R) of the tokens it feeds the model (:func:`kvdro.experiments.headroom.run_stats`: W the
work any policy must feed, R the recomputed tokens), SLO violation (each request's own deadline),
P99, drain share and the backlog over each half; :func:`kvdro.sim.regimes.classify` labels it.

**The operating points** (:func:`operating_points`): for each (workload, GPU, deployment), the
memory-bound, stable cell with the lowest vLLM SLO violation (ties: the lower load) -- chapter 9's
rule for its primary point, applied per deployment; ``exact`` is False when no cell is both, and
the nearest is reported instead (among stable cells where vLLM preempts, the highest mean KV use;
else none).

``python -m kvdro.bench regimes-new`` writes ``data/regimes_workloads.csv`` (joblib, ``n_jobs``
capped at the CPUs); :func:`load_map` reads it back, classified. ``--workloads`` reruns only some
workloads and :func:`merge_map` puts their rows into the cached map in the grid's order, the other
rows kept as they are (the bench checks their lines are byte-identical after the write).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kvdro.sim import regimes

if TYPE_CHECKING:
    from kvdro.sim import Deployment

__all__ = ["WORKLOADS", "GPUS", "WORKLOAD_GPUS", "LOADS", "R1_DURATION_S", "CSV", "COMMAND", "workload_trace",
           "deployments", "max_model_len", "gpus_of", "check_workloads", "cells", "regime_cell", "regime_map", "classify",
           "operating_points", "merge_map", "write_map", "load_map"]

#: Workload key -> (trace, registry model name, what it is).
WORKLOADS: dict[str, tuple[str, str, str]] = {
    "mooncake-conv": ("mooncake-conversation", "llama-3.1-70b", "Mooncake conversation on Llama-3.1-70B"),
    "r1": ("servegen-r1", "deepseek-r1-distill-llama-70b", "ServeGen R1 reasoning on R1-Distill-Llama-70B"),
    "azure-conv-7b": ("azure-2023-conv", "llama-2-7b", "Azure 2023 conversation on Llama-2-7B (no GQA)"),
    "azure-conv-70b": ("azure-2023-conv", "llama-2-70b", "Azure 2023 conversation on Llama-2-70B (H100)"),
}
#: GPUs of the map (registry names of :data:`kvdro.hardware.GPUS`).
GPUS: tuple[str, ...] = ("a100-80gb", "h100-80gb")
#: Workloads mapped on some of :data:`GPUS` only (Llama-2-70B on A100: the headroom map).
WORKLOAD_GPUS: dict[str, tuple[str, ...]] = {"azure-conv-70b": ("h100-80gb",)}
#: GPUs per deployment.
TOTAL_GPUS = 8
#: The R1 trace: the first hour of ServeGen's day at production rate [s].
R1_DURATION_S = 3600.0
#: Ten loads per workload (multipliers of the trace's own rate), sqrt(2) apart, fixed before the run.
LOADS: dict[str, tuple[float, ...]] = {
    w: tuple(float(np.round(start * 2 ** (k / 2), 6)) for k in range(10))
    for w, start in (("mooncake-conv", 1 / 16), ("r1", 1 / 64), ("azure-conv-7b", 1.0), ("azure-conv-70b", 1 / 4))
}
CSV = Path(__file__).resolve().parents[2] / "data" / "regimes_workloads.csv"
COMMAND = "python -m kvdro.bench regimes-new"
#: The columns that identify a cell.
KEY = ("workload", "gpu", "deployment", "load")


@functools.lru_cache(maxsize=None)
def workload_trace(workload: str, r1_duration_s: float = R1_DURATION_S) -> pd.DataFrame:
    """The tidy trace of ``workload`` (module docstring), cached per process."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload: must be one of {list(WORKLOADS)}, got {workload!r}")
    name = WORKLOADS[workload][0]
    if name == "servegen-r1":
        from kvdro.workload import servegen_r1

        trace = servegen_r1(float(r1_duration_s), rate_scale=1.0, rng=np.random.default_rng(0))
    else:
        from kvdro.datasets import load_trace

        trace = load_trace(name)
    return trace[["arrival_s", "input_tokens", "output_tokens", "request_class"]].reset_index(drop=True)


def max_model_len(workload: str) -> int:
    """vLLM's ``max_model_len`` for ``workload`` [tokens]: the model's window, except for Llama-2-70B
    (``azure-conv-70b``), served as on its A100 map with the book's 16,384-token window
    (:data:`kvdro.sim.deployment.MAX_MODEL_LEN`), so that every Azure request fits (module docstring)."""
    from kvdro.hardware import model_by_name
    from kvdro.sim.deployment import MAX_MODEL_LEN

    check_workloads((workload,))
    return MAX_MODEL_LEN if workload == "azure-conv-70b" else int(model_by_name(WORKLOADS[workload][1]).max_context)


def deployments(workload: str, gpu: str) -> dict[str, Deployment]:
    """Label -> :class:`~kvdro.sim.Deployment`: 8 / TP groups of each PP = 1 configuration that fits
    ``workload``'s model on ``gpu`` with :func:`max_model_len` (module docstring)."""
    from kvdro.hardware import deployments_that_fit, gpu_by_name, model_by_name
    from kvdro.sim import Deployment

    if workload not in WORKLOADS:
        raise ValueError(f"workload: must be one of {list(WORKLOADS)}, got {workload!r}")
    model, g = model_by_name(WORKLOADS[workload][1]), gpu_by_name(gpu)
    out = {}
    window = max_model_len(workload)
    for cfg in deployments_that_fit(model, g, TOTAL_GPUS, max_model_len=window):
        if cfg.pp != 1:
            continue
        z = TOTAL_GPUS // cfg.gpus
        label = f"{z} x {cfg.name}"
        out[label] = Deployment(groups=(cfg,) * z, model=model, gpu=g, max_model_len=window, name=label)
    if not out:
        raise ValueError(f"gpu: {model.name} with its {window:,}-token window fits no PP = 1 deployment "
                         f"of {TOTAL_GPUS} x {g.name}")
    return out


def gpus_of(workload: str) -> tuple[str, ...]:
    """The GPUs ``workload`` is mapped on (:data:`WORKLOAD_GPUS`, else :data:`GPUS`)."""
    check_workloads((workload,))
    return WORKLOAD_GPUS.get(workload, GPUS)


def check_workloads(workloads) -> tuple[str, ...]:
    """``workloads`` as a tuple in :data:`WORKLOADS` order; ValueError naming ``workloads`` for an
    unknown one or none."""
    workloads = (workloads,) if isinstance(workloads, str) else tuple(workloads)
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        raise ValueError(f"workloads: must be among {list(WORKLOADS)}, got {list(workloads)!r}")
    return tuple(w for w in WORKLOADS if w in workloads)


def cells(workloads: tuple[str, ...] = tuple(WORKLOADS), gpus: tuple[str, ...] = GPUS,
          loads: dict[str, tuple[float, ...]] | None = None) -> list[dict]:
    """The grid: one dict (workload, gpu, deployment, load) per cell, in a fixed order (workloads in
    :data:`WORKLOADS` order, each on its GPUs of ``gpus``: :func:`gpus_of`); ``loads`` (default
    :data:`LOADS`) are multipliers of each trace's own arrival rate."""
    loads = LOADS if loads is None else loads
    return [{"workload": w, "gpu": g, "deployment": d, "load": float(x)}
            for w in check_workloads(workloads) for g in gpus if g in gpus_of(w)
            for d in deployments(w, g) for x in loads[w]]


def regime_cell(cell: dict, *, r1_duration_s: float = R1_DURATION_S, trace: pd.DataFrame | None = None) -> dict:
    """Simulate one cell under vLLM's policy (routing seed 0) and measure it (module docstring):
    shares in [0, 1], times in seconds, rates in requests per second, backlogs in requests.

    ``trace`` overrides the workload's trace (tests use a small one)."""
    from kvdro.experiments.headroom import run_stats
    from kvdro.sim import simulate

    w, g, d, load = cell["workload"], cell["gpu"], cell["deployment"], float(cell["load"])
    base = workload_trace(w, r1_duration_s) if trace is None else trace
    test = regimes.at_load(base, load)
    dep = deployments(w, g)[d]
    r = simulate(test, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="fast")
    m, req = r.metrics, r.requests
    stats = run_stats(r)
    served = req["outcome"].isin(["completed", "truncated"]).to_numpy()
    span = float(test["arrival_s"].max() - test["arrival_s"].min())
    end = max(o.end_ps for o in r.outputs) / 1e12
    first, second = regimes.backlog_halves(req)
    return {
        "workload": w, "model": dep.model.name, "gpu": g, "deployment": d, "load": load,
        "rate_rps": (len(test) - 1) / span if span > 0 else float("nan"), "requests": len(test),
        "ignored": m["ignored"], "truncated": m["truncated"],
        "kv_mean": m["kv_utilisation_mean"], "kv_peak": float(r.engines["kv_use_peak"].max()),
        "preemptions": m["preemptions"],
        "preempted_share": float((req["preemptions"].to_numpy()[served] > 0).mean()) if served.any() else 0.0,
        "recompute_share": stats["recomputed"] / max(stats["work_tokens"] + stats["recomputed"], 1),
        "slo_violation": m["slo_violation_rate"], "e2e_p99_s": m["e2e_p99_s"], "goodput_rps": m["goodput_rps"],
        "drain_share": max(0.0, end - span) / span if span > 0 else 0.0,
        "backlog_first": first, "backlog_second": second,
    }


def _warm_cell(cell: dict, r1_duration_s: float) -> dict:
    """One cell in a worker: the compiled engine loaded first (``engine="fast"`` is then compiled)."""
    from kvdro.sim.engine_compiled import warm_up

    warm_up()
    return regime_cell(cell, r1_duration_s=r1_duration_s)


def regime_map(grid: list[dict] | None = None, *, n_jobs: int = 2, r1_duration_s: float = R1_DURATION_S) -> pd.DataFrame:
    """Every cell of ``grid`` (default :func:`cells`) with joblib on ``min(n_jobs, cells, CPUs)``
    processes (:func:`kvdro.experiments.runner.available_cpus`), classified (:func:`classify`)."""
    from joblib import Parallel, delayed

    from kvdro.experiments.runner import available_cpus

    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs < 1:
        raise ValueError(f"n_jobs: must be a positive integer, got {n_jobs!r}")
    grid = cells() if grid is None else list(grid)
    if not grid:
        raise ValueError("grid: no cell to run")
    jobs = max(1, min(int(n_jobs), len(grid), available_cpus()))
    rows = Parallel(n_jobs=jobs)(delayed(_warm_cell)(c, r1_duration_s) for c in grid) if jobs > 1 \
        else [regime_cell(c, r1_duration_s=r1_duration_s) for c in grid]
    return classify(pd.DataFrame(rows))


def classify(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvdro.sim.regimes.classify` per (workload, GPU): its SLO floor is per (trace, deployment)."""
    parts = []
    for _, part in frame.groupby(["workload", "gpu"], sort=False):
        parts.append(regimes.classify(part.assign(trace=part["workload"])).drop(columns="trace"))
    return pd.concat(parts).loc[frame.index]


def operating_points(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, GPU, deployment): its memory-bound, stable operating point (module
    docstring) with ``exact`` True, else the nearest with ``exact`` False, else ``load`` NaN."""
    f = frame if "stable" in frame.columns else classify(frame)
    both = regimes.memory_bound_stable(f.assign(trace=f["workload"]))
    rows = []
    for (w, g, d), part in f.groupby(["workload", "gpu", "deployment"], sort=False):
        mine = both[(both["workload"] == w) & (both["gpu"] == g) & (both["deployment"] == d)]
        exact = len(mine) > 0
        if exact:
            pick = mine.sort_values(["slo_violation", "load"], kind="stable").iloc[0]
        else:
            near = part[part["stable"] & (part["preemptions"] > 0)]
            pick = near.sort_values(["kv_mean", "load"], ascending=[False, True], kind="stable").iloc[0] if len(near) else None
        row = {"workload": w, "gpu": g, "deployment": d, "exact": exact, "memory_bound_stable_loads": len(mine)}
        cols = ("load", "kv_mean", "preemptions", "preempted_share", "recompute_share", "slo_violation", "regime")
        row.update({c: (pick[c] if pick is not None else (np.nan if c != "regime" else "")) for c in cols})
        rows.append(row)
    return pd.DataFrame(rows)


def merge_map(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """The cached map ``old`` with the workloads of ``new`` (rows of :func:`regime_cell`) replaced by
    ``new``'s rows, in :func:`cells`' order of workloads (old rows first within a workload they share
    with none of ``new``); ``old``'s other rows are kept as read. ValueError if ``new`` repeats a key
    or has a workload outside :data:`WORKLOADS`."""
    check_workloads(tuple(new["workload"].unique()))
    if new.duplicated(list(KEY)).any():
        raise ValueError(f"new: repeated keys {list(KEY)}")
    keep = old[~old["workload"].isin(set(new["workload"]))]
    cols = list(old.columns) if len(old.columns) else list(new.columns)
    missing = [c for c in cols if c not in new.columns]
    if missing:
        raise ValueError(f"new: missing column(s) {missing} of the cached map")
    order = {w: i for i, w in enumerate(WORKLOADS)}
    parts = [(order.get(w, len(order)), part) for w, part in keep.groupby("workload", sort=False)]
    parts += [(order[w], part[cols]) for w, part in new.groupby("workload", sort=False)]
    return pd.concat([p for _, p in sorted(parts, key=lambda t: t[0])], ignore_index=True)


def write_map(frame: pd.DataFrame, path: str | os.PathLike[str] = CSV) -> Path:
    """Write the measured columns of a map (not the labels: :func:`load_map` classifies) atomically."""
    from kvdro.cachefile import write_csv_atomic

    labels = ("slo_floor", "slo_excess", "backlog_growing", "stable", "saturated", "memory_bound", "light", "regime")
    return write_csv_atomic(frame.drop(columns=[c for c in labels if c in frame.columns]), path, key=KEY,
                            float_format="%.6g")


def load_map(path: str | os.PathLike[str] = CSV) -> pd.DataFrame:
    """The cached map, checked against its manifest (:func:`kvdro.cachefile.read_csv_checked`: a cut,
    renamed or edited file is a ValueError naming it), classified; FileNotFoundError says how to make it."""
    from kvdro.cachefile import read_csv_checked

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no cached map; run `{COMMAND}`")
    need = ("kv_mean", "preemptions", "drain_share", "slo_violation", "backlog_first", "backlog_second",
            "preempted_share", "recompute_share", "ignored", "truncated", "requests")
    return classify(read_csv_checked(p, columns=need, key=KEY, remake=COMMAND))
