"""Part 5 of ``python -m kvdro.bench sim --scale``: the compiled engine at the scale of issue 33.

Each run is ``simulate`` end to end (``engine="fast"``, the compiled engine: numba's kernels are
loaded before the trace is built) in a **fresh process**, so that its peak resident memory
(``VmHWM`` of ``/proc/self/status``, else ``ru_maxrss``) is that run's alone. A run reports

* CPU seconds of ``simulate`` (``time.process_time``; the machine is shared, wall time is not the
  engine's) and requests per CPU second;
* the peak RSS of the process and its **baseline** (RSS after imports and numba's warm-up, before
  the trace is built): the scaling exponent of memory is fitted to peak - baseline, which holds
  the trace, ``simulate``'s columns and its result.

The workloads (:data:`WORKLOADS`):

* ``azure-tiled``: the Azure 2023 conversation trace (19,366 requests, 3,502 s) tiled to ``size``
  requests -- copies one after another, each shifted by the trace's span + 1 s, so the load is the
  trace's own (Llama-2-70B, 2 x TP4-PP1 on A100-80GB, ``vllm``). 10**7 requests span 21 days of
  arrivals. Built column by column (numpy ``tile``, a categorical class column), never row by row.
* ``r1-day``: :func:`kvdro.workload.servegen_r1` at production rate (``rate_scale=1``, about 1.39 M
  requests a day) over the first ``size`` seconds of ServeGen's day, on DeepSeek-R1-Distill-Llama-70B
  served by :data:`R1_GROUPS` x TP4-PP1 on H100-80GB with ``max_model_len`` = the model's
  131,072-token window (``vllm``).
* ``mooncake-conversation`` / ``mooncake-synthetic``: the whole Mooncake traces on Llama-3.1-70B,
  2 x TP4-PP1 on H100-80GB, ``max_model_len`` = 131,072 (longer prompts are ignored and counted).

The exponent of a log-log fit of CPU time and of memory against the number of requests is the
linearity check (<= :data:`LINEAR_EXPONENT`).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import numpy as np

__all__ = ["WORKLOADS", "SCALE_REQUESTS", "SCALE_FRACTIONS", "R1_DAY_S", "R1_FRACTIONS", "R1_GROUPS",
           "LINEAR_EXPONENT", "workload", "measure", "run_in_subprocess", "exponent", "report"]

WORKLOADS = ("azure-tiled", "r1-day", "mooncake-conversation", "mooncake-synthetic")
#: The large trace [requests] and the fractions of it run to fit the exponents.
SCALE_REQUESTS = 10_000_000
SCALE_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
#: ServeGen's day [s] and the fractions of it (from midnight) run to fit the exponents.
R1_DAY_S = 86_400
R1_FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1.0)
#: TP4-PP1 groups of H100-80GB serving the R1 day (64 GPUs; the drain share says whether they keep up).
R1_GROUPS = 16
#: The largest log-log exponent of time or memory in the number of requests still called linear.
LINEAR_EXPONENT = 1.15


def _status_mb(field: str) -> float | None:
    """A ``/proc/self/status`` memory field of this process [MB] (Linux), None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _rss_mb() -> float:
    """Current resident set size of this process [MB] (Linux ``VmRSS``; 0 elsewhere)."""
    return _status_mb("VmRSS") or 0.0


def _peak_mb() -> float:
    """Peak resident set size of this process [MB]: Linux ``VmHWM``, which the kernel reports as the
    larger of its high-water mark and the current RSS (``ru_maxrss`` is updated lazily and can read
    a few KiB below a ``VmRSS`` taken just before); elsewhere ``ru_maxrss`` (bytes on macOS)."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _azure_tiled(n: int):
    import pandas as pd

    from kvdro.datasets import load_trace

    base = load_trace("azure-2023-conv")
    copies = -(-n // len(base))
    span = float(base["arrival_s"].max() - base["arrival_s"].min()) + 1.0
    a = base["arrival_s"].to_numpy(dtype=float)
    return pd.DataFrame({
        "arrival_s": (a[None, :] + span * np.arange(copies)[:, None]).ravel()[:n],
        "input_tokens": np.tile(base["input_tokens"].to_numpy(), copies)[:n],
        "output_tokens": np.tile(base["output_tokens"].to_numpy(), copies)[:n],
        "request_class": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), ["conversation"]),
    })


def workload(kind: str, size: float):
    """(trace, deployment) of workload ``kind`` (module docstring) at ``size`` (requests for
    ``azure-tiled``, seconds of the day for ``r1-day``, ignored for the Mooncake traces)."""
    from kvdro.hardware import H100_80GB, LLAMA31_70B, R1_DISTILL_LLAMA_70B
    from kvdro.sim import Deployment, default_deployment

    if kind == "azure-tiled":
        return _azure_tiled(int(size)), default_deployment()
    if kind == "r1-day":
        from kvdro.workload import servegen_r1

        trace = servegen_r1(float(size), rate_scale=1.0, rng=np.random.default_rng(0))
        dep = Deployment(groups=("TP4-PP1",) * R1_GROUPS, model=R1_DISTILL_LLAMA_70B, gpu=H100_80GB,
                         max_model_len=R1_DISTILL_LLAMA_70B.max_context, name=f"{R1_GROUPS} x TP4-PP1")
        return trace, dep
    if kind in ("mooncake-conversation", "mooncake-synthetic"):
        from kvdro.datasets import load_trace

        trace = load_trace(kind)[["arrival_s", "input_tokens", "output_tokens", "request_class"]]
        return trace, default_deployment(model=LLAMA31_70B, gpu=H100_80GB, max_model_len=LLAMA31_70B.max_context)
    raise ValueError(f"kind: must be one of {WORKLOADS}, got {kind!r}")


def measure(kind: str, size: float) -> dict:
    """One run of ``simulate`` on workload ``kind`` in this process (call it in a fresh one: the peak
    RSS is the process's): requests, CPU and wall seconds, RSS baseline / after the trace / peak [MB],
    outcomes, preemptions and the drain share (time past the last arrival / arrival span)."""
    from kvdro.sim import simulate
    from kvdro.sim.engine_compiled import warm_up

    warm_up()  # load the compiled kernels: engine="fast" is then the compiled engine for every size
    base = _rss_mb()
    trace, dep = workload(kind, size)
    built = _rss_mb()
    cpu, wall = time.process_time(), time.perf_counter()
    r = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="fast")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    m = r.metrics
    span = float(trace["arrival_s"].max() - trace["arrival_s"].min())
    end = max(o.end_ps for o in r.outputs) / 1e12
    return {"kind": kind, "size": float(size), "requests": len(trace), "cpu_s": cpu, "wall_s": wall,
            # the peak is at least every RSS this process was seen at: the kernel syncs its per-thread RSS
            # counters lazily, and VmHWM once read 20 KiB below a VmRSS sampled earlier (423.20 < 423.22 MB)
            "rss_base_mb": base, "rss_trace_mb": built, "rss_peak_mb": max(_peak_mb(), _rss_mb(), built),
            "completed": m["completed"], "ignored": m["ignored"], "truncated": m["truncated"],
            "preemptions": m["preemptions"], "kv_mean": m["kv_utilisation_mean"],
            "drain_share": max(0.0, end - span) / span if span > 0 else 0.0, "deployment": dep.describe()}


def run_in_subprocess(kind: str, size: float, timeout_s: float = 3600) -> dict:
    """:func:`measure` in a fresh Python process (its own peak RSS); the child's JSON line."""
    code = f"import json; from kvdro.bench._sim_scale import measure; print(json.dumps(measure({kind!r}, {float(size)!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} at {size:g}: the child process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(n, y) -> float:
    """Slope of log y against log n (least squares): 1 = linear."""
    return float(np.polyfit(np.log(np.asarray(n, float)), np.log(np.asarray(y, float)), 1)[0])


def _table(rows: list[dict]) -> None:
    print(f"{'requests':>11} {'CPU s':>7} {'k req/s':>8} {'base MB':>8} {'peak MB':>8} {'B/request':>10} "
          f"{'ignored':>8} {'preempt':>8} {'KV mean':>8} {'drain':>6}")
    for r in rows:
        grown = r["rss_peak_mb"] - r["rss_base_mb"]
        print(f"{r['requests']:>11,} {r['cpu_s']:7.1f} {r['requests'] / r['cpu_s'] / 1e3:8.0f} {r['rss_base_mb']:8.0f} "
              f"{r['rss_peak_mb']:8.0f} {grown * 2**20 / r['requests']:10.0f} {r['ignored']:>8,} {r['preemptions']:>8,} "
              f"{r['kv_mean']:8.1%} {r['drain_share']:6.1%}")


def report(requests: int = SCALE_REQUESTS, *, r1: bool = True, mooncake: bool = True) -> bool:
    """Print part 5 (module docstring); True when time and memory are linear in the trace length."""
    ok = True
    fits = []
    parts = [("azure-tiled", [requests * f for f in SCALE_FRACTIONS],
              f"the Azure conversation trace tiled to {requests:,} requests (Llama-2-70B, 2 x TP4-PP1, A100)")]
    if r1:
        parts.append(("r1-day", [R1_DAY_S * f for f in R1_FRACTIONS],
                      f"ServeGen R1 at production rate, 3 h to one day (R1-Distill-Llama-70B, {R1_GROUPS} x TP4-PP1, H100)"))
    for kind, sizes, title in parts:
        print(f"\n{kind}: {title}; one fresh process per size")
        rows = [run_in_subprocess(kind, s) for s in sizes]
        _table(rows)
        n = [r["requests"] for r in rows]
        e_t = exponent(n, [r["cpu_s"] for r in rows])
        e_m = exponent(n, [r["rss_peak_mb"] - r["rss_base_mb"] for r in rows])
        fits.append((kind, rows[-1], e_t, e_m))
        good = e_t <= LINEAR_EXPONENT and e_m <= LINEAR_EXPONENT
        ok &= good
        print(f"log-log exponent in the number of requests: CPU time {e_t:.2f}, peak RSS above the baseline {e_m:.2f}")
        print(f"[{'PASS' if good else 'FAIL'}] {kind}: time and memory linear in the trace length (exponents <= {LINEAR_EXPONENT:g})")
    if mooncake:
        print("\nMooncake traces, whole (Llama-3.1-70B, 2 x TP4-PP1, H100, max_model_len 131,072)")
        _table([run_in_subprocess(k, 0) for k in ("mooncake-conversation", "mooncake-synthetic")])
    return ok
