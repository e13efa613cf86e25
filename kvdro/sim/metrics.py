"""Metrics of a run and its realised cost, in the paper's terms.

**Cost** (totals over the run, cost units; divide by ``horizon_s`` for the per-second cost of (8a)):

* ``preemption`` = c_p x recomputed tokens -- the cached tokens preemption threw away and the engine
  computed again (the realised counterpart of (2));
* ``waste`` = c_w x sum over completed requests of (16 x blocks held at the end - L_in - xi)^+ --
  reserved-but-unused tokens, exactly chapter 2's waste term (3), c_w (eta - xi)^+, with the
  reservation in whole blocks (for ``vllm`` only the last block's empty slots);
* ``slo`` = c_slo x sum over completed requests of (e2e - D_i)^+ [s] -- the realised lateness s_i of (6f),
  against the **class** deadline D_i (the ``slo_s`` column: the deployment's per-class SLO, by
  default 2 s + 0.1 s x the class's mean output). This is a decision: the cost is the paper's
  objective (8a) realised, and (6f) defines s_i against D_i, so the cost's SLO term does not move
  with ``simulate(..., deadline=...)`` -- both accountings of chapter 10 price the same lateness;
* ``rejection`` = c_rej x (rejected + ignored) requests;
* ``gpu`` = c_gpu x GPUs x horizon [s], the GPU term of (8a).

``cost_total`` is their sum. Beside them (not in the total): ``overflow_tokens`` = sum of
(L_in + xi - 16 x reserved blocks)^+ over completed requests of a reservation policy -- the shortage
(2) charges -- and ``newsvendor`` = c_p x overflow + c_w x waste tokens, chapter 2's loss realised on
the trace (what the reservation itself costs, whether or not the shortage caused a preemption);
both are NaN for ``vllm``, which reserves nothing.

**Metrics** (the JSON keys of ``python -m kvdro simulate --json``): counts; time to first token
(TTFT), time per output token (TPOT = (finish - first token)/(xi - 1), for xi > 1) and end-to-end
latency percentiles over completed requests [s]; ``slo_violation_rate`` = share of completed
requests with e2e > their deadline; ``goodput_rps`` = completed within their deadline per second of
horizon. The deadline (the ``deadline_s`` column) is by default **each request's own**,
D = 2 s + 0.1 s x its xi (:data:`kvdro.workload.DEFAULT_TTFT_SLO_S`, ``DEFAULT_TPOT_SLO_S``: a
user's contract, which an empty engine meets for nearly every request, since a decode step takes
well under 0.1 s); ``simulate(..., deadline="class")`` judges by the class D_i instead, the
paper's reading kept as a sensitivity (one deadline per class meets a heavy-tailed xi: the long
requests of a class miss it even alone on an engine);
``throughput_tok_s`` = output tokens of completed requests per second (recomputation not counted);
``mean_batch`` = time-average number of running (KV-holding) sequences per engine over the horizon
(Little's law's L); ``kv_utilisation_mean`` = time-average share of KV blocks in use; ``wall_s``.
The horizon runs from the first arrival to the last step end (or last arrival).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

__all__ = ["METRIC_KEYS", "COST_TERMS", "default_costs", "compute_metrics"]

#: The exact keys of :attr:`SimResult.metrics` (issue 9 / DESIGN.md).
METRIC_KEYS: tuple[str, ...] = (
    "completed", "rejected", "ignored", "truncated", "preemptions", "recomputed_tokens",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "e2e_p99_s", "slo_violation_rate",
    "goodput_rps", "throughput_tok_s", "mean_batch", "kv_utilisation_mean", "cost_total", "wall_s",
    "e2e_mean_s",
)
#: Terms of ``cost_total``.
COST_TERMS: tuple[str, ...] = ("preemption", "waste", "slo", "rejection", "gpu")


def default_costs(rho: float, costs: Mapping[str, float] | None = None) -> dict[str, float]:
    """c_p = rho c_w and the paper's c_w = 1, c_slo = 5, c_rej = 5000, with our c_gpu (chapter 5),
    overridden by ``costs``. ValueError names a bad key or value."""
    from kvdro.costs import DEFAULT_C_GPU, PAPER_COSTS  # not kvdro.joint: it would import CVXPY

    from kvdro.sim.deployment import _real

    if not (_real("rho", rho) > 0):  # strings ("10") and booleans (True) refused, not converted
        raise ValueError(f"rho: must be a positive finite number, got {rho!r}")
    out = {"c_w": PAPER_COSTS["c_w"], "c_slo": PAPER_COSTS["c_slo"], "c_rej": PAPER_COSTS["c_rej"], "c_gpu": DEFAULT_C_GPU}
    given = dict(costs or {})
    for k, v in given.items():
        if k not in ("c_p", "c_w", "c_slo", "c_rej", "c_gpu"):
            raise ValueError(f"costs: unknown key {k!r} (use c_p, c_w, c_slo, c_rej, c_gpu)")
        if not (_real(f"costs[{k!r}]", v) >= 0):
            raise ValueError(f"costs: {k} must be a non-negative finite number, got {v!r}")
    out.update({k: float(v) for k, v in given.items() if k != "c_p"})
    out["c_p"] = float(given["c_p"]) if "c_p" in given else float(rho) * out["c_w"]
    return out


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else float("nan")


def compute_metrics(requests: pd.DataFrame, engines: list, costs: Mapping[str, float], *, gpus: int,
                    horizon_ps: int, wall_s: float, reservation: bool) -> tuple[dict, dict]:
    """(metrics with :data:`METRIC_KEYS`, cost breakdown) from the per-request frame and engine outputs.

    ``engines`` is a list of (EngineSpec, EngineOutput) pairs.
    """
    outcome = requests["outcome"].to_numpy()
    done = (outcome == "completed") | (outcome == "truncated")

    def d(column: str) -> np.ndarray:  # one column over the completed requests (not a copy of the frame)
        return requests[column].to_numpy()[done]

    e2e = d("e2e_s")
    ttft = d("ttft_s")
    tpot = d("tpot_s")
    tpot = tpot[np.isfinite(tpot)]
    late = np.maximum(0.0, e2e - d("slo_s"))  # the cost: class D_i of (6f)
    ok = e2e <= d("deadline_s" if "deadline_s" in requests.columns else "slo_s")  # goodput: the run's deadline
    horizon_s = horizon_ps / 1e12
    waste_tok = int(d("waste_tokens").sum())
    overflow_tok = int(d("overflow_tokens").sum()) if reservation else 0
    recomputed = int(requests["recomputed_tokens"].sum())
    rejected = int((outcome == "rejected").sum())
    ignored = int((outcome == "ignored").sum())
    cost = {
        "preemption": costs["c_p"] * recomputed,
        "waste": costs["c_w"] * waste_tok,
        "slo": costs["c_slo"] * float(late.sum()),
        "rejection": costs["c_rej"] * (rejected + ignored),
        "gpu": costs["c_gpu"] * gpus * horizon_s,
    }
    total = float(sum(cost.values()))
    blocks = sum(spec.blocks for spec, _ in engines)
    resident = sum(o.resident_integral for _, o in engines)
    kvi = sum(o.kv_integral for _, o in engines)
    metrics = {
        "completed": int(done.sum()),
        "rejected": rejected,
        "ignored": ignored,
        "truncated": int((outcome == "truncated").sum()),
        "preemptions": int(requests["preemptions"].sum()),
        "recomputed_tokens": recomputed,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "slo_violation_rate": float(1.0 - ok.mean()) if ok.size else float("nan"),
        "goodput_rps": float(ok.sum() / horizon_s) if horizon_s > 0 else 0.0,
        "throughput_tok_s": float(d("generated_tokens").sum() / horizon_s) if horizon_s > 0 else 0.0,
        "mean_batch": float(resident / (len(engines) * horizon_ps)) if horizon_ps > 0 else 0.0,
        "kv_utilisation_mean": float(kvi / (blocks * horizon_ps)) if horizon_ps > 0 and blocks else 0.0,
        "cost_total": total,
        "wall_s": float(wall_s),
        "e2e_mean_s": float(e2e.mean()) if e2e.size else float("nan"),
    }
    breakdown = dict(cost)
    breakdown.update({
        "total": total,
        "per_second": total / horizon_s if horizon_s > 0 else float("nan"),
        "horizon_s": horizon_s,
        "recomputed_tokens": recomputed,
        "waste_tokens": waste_tok,
        "overflow_tokens": overflow_tok if reservation else float("nan"),
        "newsvendor": costs["c_p"] * overflow_tok + costs["c_w"] * waste_tok if reservation else float("nan"),
        "lateness_s": float(late.sum()),
        **{k: float(v) for k, v in costs.items()},
    })
    return metrics, breakdown
