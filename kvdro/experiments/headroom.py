"""What knowing the output length is worth: the oracle's headroom over vLLM, and a decomposition (chapters 8 and 9).

The **headroom map** (:func:`headroom`, cached in ``data/headroom.csv`` by
``python -m kvdro.bench headroom``) runs, on every cell of deployments (:data:`DEPLOYMENTS`) x load
(:data:`LOADS`) x workload (:data:`WORKLOADS`), the same test half under

* ``vllm`` -- vLLM's reactive admission (the reference of every gain);
* ``oracle`` -- vLLM's admission plus a look-ahead with the **true** output lengths (never preempts;
  :mod:`kvdro.sim.scheduler`);
* ``exact`` -- a soft reservation of exactly L_in + xi (the true length);
* the soft reservations eta = f x (the class's P90 buffer) for f in :data:`BUFFER_FRACTIONS`, of
  which the one with the highest goodput is reported as **best soft** (chosen on the test half: an
  upper bound for the family, and its interval is optimistic);
* ``dro`` -- the soft Wasserstein-DRO buffer at rho = 10 (the paper's policy).

Buffers are fitted on the training half and simulated on the test half, as everywhere; the
routing is drawn with ``numpy.random.default_rng(seed)``, as in the regime map
(:mod:`kvdro.sim.regimes`), so a cell that is on both maps has the same vLLM run. Per cell:
vLLM's **recompute share** (recomputed tokens / tokens computed) and preemptions; and the gains over
vLLM of oracle, best soft, DRO and exact in goodput (requests served within their own deadline,
D = 2 s + 0.1 s x xi; the ratio of counts over the same arrivals), SLO attainment (points) and
TTFT P99 (1 - P99 / vLLM's P99), each with a paired moving-block bootstrap interval over the time
blocks of the test half (:mod:`kvdro.experiments.uncertainty`). Each cell is classified by the
regime rules of :mod:`kvdro.sim.regimes` on vLLM's run (stable; memory-bound).

Every interval above is over the time blocks of **one routing draw**. The **seed study**
(:func:`headroom_seeds`, cached in ``data/headroom_seeds.csv`` by ``python -m kvdro.bench headroom
--parts seeds``) reruns the primary memory point and every cell near the 5 % line under
:data:`ROUTING_SEEDS`, the arrivals fixed: per draw the gains and their intervals, per cell the
range over draws and a gain pooled over draws with a two-way interval (:func:`pooled_gain`).

The **bound** (:func:`admission_gain_bound`) says what any admission or reservation policy can gain
over vLLM; :func:`check_bound` checks it against the oracle on every cell.

Load. A multiple of the workload's own arrival rate, divided by k for a twin whose outputs are
scaled by k: every workload at load 1 asks for about the output tokens per second the conversation
trace asks for at its own rate (the pre-check of issue 26, outputs x4 at 0.2 and 0.3 of the rate,
are loads 0.8 and 1.2 here).
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np
import pandas as pd

from kvdro.experiments import uncertainty as unc

__all__ = [
    "BUFFER_FRACTIONS",
    "DEPLOYMENTS",
    "LOADS",
    "WORKLOADS",
    "admission_gain_bound",
    "check_bound",
    "gain_interval",
    "length_predictions",
    "scheduling",
    "scheduling_cell",
    "scheduling_points",
    "SCHEDULE_ARMS",
    "headroom",
    "headroom_cell",
    "headroom_seeds",
    "load_seeds",
    "pooled_gain",
    "seed_cells",
    "seed_counts",
    "seed_phrase",
    "seed_sentences",
    "seed_summary",
    "ROUTING_SEEDS",
    "load_headroom",
    "load_scheduling",
    "tidy",
    "run_stats",
    "summary",
    "workload_halves",
]

#: Deployments of the paper's J = 8 A100-80GB (:data:`kvdro.sim.regimes.DEPLOYMENTS`).
DEPLOYMENTS = ("4 x TP2-PP1", "2 x TP4-PP1", "TP4-PP1 + 2 x TP2-PP1")
#: Loads (see the module docstring): from light to past saturation.
LOADS = (0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2)
#: Workload -> (source, output scale k). Twins: the conversation trace with outputs x k, each capped
#: so that prompt + output fits the context window (``Deployment.max_model_len``).
WORKLOADS: dict[str, tuple[str, int]] = {
    "conversation": ("azure-2023-conv", 1),
    "code": ("azure-2023-code", 1),
    "sharegpt": ("sharegpt", 1),
    "conversation x2": ("azure-2023-conv", 2),
    "conversation x4": ("azure-2023-conv", 4),
    "conversation x8": ("azure-2023-conv", 8),
}
#: The soft-reservation family: eta = f x the class's P90 buffer (f = 0 is vLLM itself).
BUFFER_FRACTIONS = (0.25, 0.5, 1.0)
#: The DRO policy's cost ratio rho = c_p / c_w.
DRO_RHO = 10.0
#: Histogram edges [s] for the bootstrapped TTFT P99.
TTFT_BINS = unc.LATENCY_BINS


def _context_window() -> int:
    from kvdro.sim.deployment import MAX_MODEL_LEN

    return int(MAX_MODEL_LEN)


@lru_cache(maxsize=8)
def workload_halves(workload: str, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test) of ``workload`` (:data:`WORKLOADS`), the test half re-zeroed at its own rate.

    Azure traces and their twins: the halves by arrival time (:func:`kvdro.sim.studies.split_half`);
    a twin's outputs (both halves) are ``min(k xi, window - L_in)``. ShareGPT has no arrival
    times: its pairs (cl100k tokens, every two-turn conversation, vLLM's length filter) are shuffled
    with ``seed`` and cut in two; the training half is the first, and the test half's pairs are drawn
    (with replacement, seeded) at the arrival times of the conversation trace's test half.
    """
    from kvdro.sim.studies import split_half

    if workload not in WORKLOADS:
        raise ValueError(f"workload: must be one of {list(WORKLOADS)}, got {workload!r}")
    source, k = WORKLOADS[workload]
    if source == "sharegpt":
        from kvdro.datasets import load_sharegpt, load_trace

        pairs = load_sharegpt(first_turn="any", rng=np.random.default_rng([int(seed), 26]))
        mid = len(pairs) // 2
        train = pairs.iloc[:mid].reset_index(drop=True)
        _, conv_test = split_half(load_trace("azure-2023-conv"))
        pool = pairs.iloc[mid:].reset_index(drop=True)
        pick = np.random.default_rng([int(seed), 27]).integers(0, len(pool), size=len(conv_test))
        test = pd.DataFrame({"arrival_s": conv_test["arrival_s"].to_numpy(), "input_tokens": pool["input_tokens"].to_numpy()[pick],
                             "output_tokens": pool["output_tokens"].to_numpy()[pick], "request_class": "sharegpt"})
    else:
        from kvdro.datasets import load_trace

        train, test = split_half(load_trace(source))
        if k != 1:
            window = _context_window()
            scale = lambda d: d.assign(output_tokens=np.minimum(int(k) * d["output_tokens"].to_numpy(),  # noqa: E731
                                                                np.maximum(window - d["input_tokens"].to_numpy(), 1)))
            train, test = scale(train), scale(test)
    test = test.assign(arrival_s=test["arrival_s"] - test["arrival_s"].min()).reset_index(drop=True)
    return train.reset_index(drop=True), test


def _at(test: pd.DataFrame, workload: str, load: float) -> pd.DataFrame:
    k = WORKLOADS[workload][1]
    return test.assign(arrival_s=test["arrival_s"] * k / float(load))


def run_stats(res) -> dict:
    """The quantities of one run the bound needs, per engine and in total.

    ``work_tokens`` W = sum over served requests of (L_in + generated - 1): the tokens any policy
    must feed the model (each prompt prefilled once, each output token after the first decoded
    once); ``recomputed_tokens`` R; ``busy_s`` the engines' summed step time; ``cost_per_token_s``
    c = busy / (W + R), the mean step time per token fed (:func:`admission_gain_bound`).
    ``engine_bound`` = max over engines of R_e / W_e."""
    req = res.requests
    served = req["outcome"].isin(["completed", "truncated"]).to_numpy()
    if any(np.any(inp.shared_blocks) for inp in res.inputs):
        raise ValueError("res: the bound's work count assumes no prefix caching")
    W = R = busy = 0
    ratios = []
    for inp, out in zip(res.inputs, res.outputs):
        w = int(np.sum(inp.prompt + out.generated - 1))
        r = int(np.sum(out.recomputed_tokens))
        W, R, busy = W + w, R + r, busy + int(out.busy_ps)
        ratios.append(r / w if w else 0.0)
    assert W == int(np.sum(req["input_tokens"].to_numpy()[served] + req["generated_tokens"].to_numpy()[served] - 1))
    return {"work_tokens": W, "recomputed": R, "busy_s": busy / 1e12, "cost_per_token_s": busy / 1e12 / max(W + R, 1),
            "engine_bound": max(ratios) if ratios else 0.0,
            "mean_decode_batch": float(np.average(res.engines["mean_decode_batch"], weights=np.maximum(res.engines["requests"], 1))),
            "horizon_s": float(res.cost["horizon_s"])}


def admission_gain_bound(vllm: dict, policy: dict | None = None) -> dict:
    """What any admission or reservation policy can gain over vLLM: the bound and its assumption.

    **Setting.** One engine (a serving group's micro-batch engine), the same requests routed to it
    under both policies, the same token budget, batch cap (``max_num_seqs``), KV pool, watermark and
    step-time model. The *family*: vLLM's admission plus extra admission conditions (a reservation,
    the oracle's look-ahead), FCFS, preemption by recompute as in vLLM. No prefix caching.

    **Work.** Let W = sum_j (L_in,j + xi_j - 1) over the requests served. Every policy feeds the
    model at least W tokens: each prompt is prefilled at least once (L_in,j tokens, which produce
    the first output token) and each later output token is fed once by a decode step. A preemption
    by recompute of a request that holds L_in,j + g - 1 cached tokens after g output tokens discards
    them and re-prefills L_in,j + g tokens, which produce token g + 1 -- the token a decode step
    feeding one token would have produced. So it adds exactly the discarded tokens, and vLLM feeds
    exactly W + R_v tokens, R_v its recomputed tokens (``recomputed_tokens``).

    **Assumption (A).** The policy's mean step time per token fed, c_pi = busy_pi / K_pi, is no
    lower than vLLM's, c_v = busy_v / (W + R_v). It is measured, not assumed: ``cost_per_token_s``
    of :func:`run_stats`. It is plausible for the family -- an extra admission condition holds
    fewer sequences, so decode batches are no larger and a step's weight reads are shared by
    fewer tokens, while vLLM's extra tokens are prefill tokens, the cheapest kind -- but it is not
    a theorem: a policy that avoids thrashing can run larger batches than a thrashing vLLM.

    **Theorem.** Under (A), busy_v / busy_pi <= 1 + R_v / W, i.e. the policy serves the same
    requests at most R_v / W faster per second of engine time. If the engine is saturated (busy from
    the first arrival to its last completion under both policies: a closed batch, or the overloaded
    cells of the map), busy time is the makespan and the completion rate of any policy in the family
    exceeds vLLM's by at most R_v / W. Over several engines of a deployment the makespan is the
    slowest engine's, and the gain is at most max_e R_e / W_e.

    *Proof.* busy_pi = c_pi K_pi >= c_pi W >= c_v W = busy_v W / (W + R_v), the first inequality by
    the work count, the second by (A). Hence busy_v / busy_pi <= (W + R_v) / W. With several engines,
    let e* be the engine at which vLLM finishes last: T_v = busy_v,e* <= (1 + R_e*/W_e*) busy_pi,e*
    <= (1 + max_e R_e/W_e) T_pi. QED.

    Without (A) the identity busy_v / busy_pi = (c_v / c_pi)(1 + R_v / W) (for a policy that never
    preempts) splits any gain into the recompute avoided and the per-token efficiency.

    **What it does not bound.** Goodput and tail latency in a *stable* cell: there every policy
    serves every request at the arrival rate, and the gain is in who waits. :func:`check_bound`
    compares the oracle's goodput gain with R_v / W too, as an empirical check that can fail.

    Args:
        vllm: :func:`run_stats` of vLLM's run; ``policy``: of the policy's run (optional).

    Returns:
        ``bound`` (R_v / W), ``engine_bound`` (max_e R_e / W_e) and, with ``policy``, the measured
        ``service_gain`` busy_v / busy_pi - 1, ``cost_ratio`` c_pi / c_v and ``assumption_holds``.
    """
    for name, s in (("vllm", vllm), ("policy", policy)):
        if s is not None and not all(k in s for k in ("work_tokens", "recomputed", "busy_s", "cost_per_token_s")):
            raise ValueError(f"{name}: need run_stats(...) of a run")
    if vllm["work_tokens"] <= 0:
        raise ValueError("vllm: no work served")
    out = {"bound": vllm["recomputed"] / vllm["work_tokens"], "engine_bound": float(vllm["engine_bound"])}
    if policy is not None:
        out["service_gain"] = vllm["busy_s"] / policy["busy_s"] - 1.0
        out["cost_ratio"] = policy["cost_per_token_s"] / vllm["cost_per_token_s"]
        out["assumption_holds"] = bool(out["cost_ratio"] >= 1.0 - 1e-12)
    return out


def _per_block(res, blk: np.ndarray) -> np.ndarray:
    """(N_BLOCKS, 3 + bins): served, good (own deadline), good (class deadline), TTFT histogram."""
    req = res.requests
    served = req["outcome"].isin(["completed", "truncated"]).to_numpy()
    e2e = np.nan_to_num(req["e2e_s"].to_numpy(dtype=float), nan=np.inf)
    good = served & (e2e <= req["deadline_s"].to_numpy(dtype=float))
    good_c = served & (e2e <= req["slo_s"].to_numpy(dtype=float))
    cols = [unc.block_sums(blk, x.astype(float)) for x in (served, good, good_c)]
    h = np.zeros((unc.N_BLOCKS, len(TTFT_BINS) - 1))
    ttft = req["ttft_s"].to_numpy(dtype=float)[served]
    k = np.clip(np.searchsorted(TTFT_BINS, ttft, side="right") - 1, 0, h.shape[1] - 1)
    np.add.at(h, (blk[served], k), 1.0)
    return np.column_stack(cols + [h])


def _gains(units: np.ndarray, prefix: str) -> dict:
    """Paired gains of arm 1 over arm 0 (vLLM) from per-block units (blocks, 2, 3 + bins)."""
    out = {}
    g = unc.bootstrap(lambda s: s[:, 1, 1] / np.maximum(s[:, 0, 1], 1.0) - 1.0, units)
    a = unc.bootstrap(lambda s: s[:, 1, 1] / np.maximum(s[:, 1, 0], 1.0) - s[:, 0, 1] / np.maximum(s[:, 0, 0], 1.0), units)
    t = unc.bootstrap(lambda s: 1.0 - unc.quantile_from_hist(s[:, 1, 3:], 0.99) / unc.quantile_from_hist(s[:, 0, 3:], 0.99), units)
    for name, iv in (("goodput_gain", g), ("slo_gain", a), ("ttft_p99_gain", t)):
        out[f"{prefix}_{name}"], out[f"{prefix}_{name}_lo"], out[f"{prefix}_{name}_hi"] = iv.point, iv.lo, iv.hi
    return out


def headroom_cell(*, workload: str, deployment: str, load: float, seed: int = 0, fractions: tuple = BUFFER_FRACTIONS,
                  routing_seed: int | None = None, blocks: bool = False) -> dict:
    """One cell of the map: every policy of the module docstring on ``workload``'s test half at
    ``load`` on ``deployment``; vLLM's metrics, each policy's gains with intervals, the bound.

    ``seed`` draws the workload (:func:`workload_halves`) and, unless ``routing_seed`` is given,
    the routing (``numpy.random.default_rng(seed)``, every policy the same draw); ``routing_seed``
    redraws the routing alone over the same arrivals (:func:`headroom_seeds`). ``blocks`` adds,
    per policy (and ``vllm``), its requests served within their own deadline in each of the
    :data:`~kvdro.experiments.uncertainty.N_BLOCKS` time blocks (``*_good_blocks``, encoded by
    :func:`kvdro.experiments.uncertainty.encode`)."""
    from kvdro.sim import policy_buffers, simulate
    from kvdro.sim.regimes import backlog_halves
    from kvdro.sim.regimes import deployment as make_deployment

    t0 = time.process_time()
    train, test = workload_halves(workload, seed)
    test = _at(test, workload, load)
    dep = make_deployment(deployment)
    span = float(test["arrival_s"].max())
    blk = unc.block_index(test["arrival_s"].to_numpy())

    route = int(seed if routing_seed is None else routing_seed)
    if route < 0:
        raise ValueError(f"routing_seed: must be a non-negative integer, got {routing_seed!r}")

    def run(policy: str, buffers=None):
        return simulate(test, policy=policy, buffers=buffers, deployment=dep, rho=DRO_RHO, rng=np.random.default_rng(route))

    v = run("vllm")
    sv = run_stats(v)
    m = v.metrics
    end = max(o.end_ps for o in v.outputs) / 1e12
    b1, b2 = backlog_halves(v.requests)
    out = {
        "rate_rps": (len(test) - 1) / span, "requests": len(test),
        "kv_mean": m["kv_utilisation_mean"], "preemptions": m["preemptions"], "recomputed_tokens": m["recomputed_tokens"],
        "recompute_share": sv["recomputed"] / max(sv["work_tokens"] + sv["recomputed"], 1),
        "preempted_share": float((v.requests["preemptions"] > 0).mean()),
        "slo_violation": m["slo_violation_rate"], "goodput_rps": m["goodput_rps"], "ttft_p99_s": m["ttft_p99_s"],
        "e2e_p99_s": m["e2e_p99_s"], "e2e_p50_s": m["e2e_p50_s"], "mean_batch": m["mean_batch"],
        "mean_decode_batch": sv["mean_decode_batch"], "drain_share": max(0.0, end - span) / span,
        "backlog_first": b1, "backlog_second": b2, "work_tokens": sv["work_tokens"], "busy_s": sv["busy_s"],
    }
    bound = admission_gain_bound(sv)
    out.update(bound)
    base = _per_block(v, blk)
    if blocks:
        out["vllm_good_blocks"] = unc.encode(base[:, 1])
    p90 = policy_buffers("p90", train, rho=DRO_RHO)
    arms = {"oracle": ("oracle", None), "exact": ("exact", None), "dro": ("dro", policy_buffers("dro", train, rho=DRO_RHO))}
    for f in fractions:
        arms[f"soft{f:g}"] = ("p90", {c: f * float(b) for c, b in p90.items()})
    best, best_good = None, -np.inf
    for name, (policy, buffers) in arms.items():
        r = run(policy, buffers)
        s = run_stats(r)
        units = np.stack([base, _per_block(r, blk)], axis=1)
        row = {f"{name}_goodput_rps": r.metrics["goodput_rps"], f"{name}_preemptions": r.metrics["preemptions"],
               f"{name}_ttft_p99_s": r.metrics["ttft_p99_s"], f"{name}_slo_violation": r.metrics["slo_violation_rate"],
               f"{name}_kv_mean": r.metrics["kv_utilisation_mean"]}
        if name in ("oracle", "exact"):
            chk = admission_gain_bound(sv, s)
            row.update({f"{name}_service_gain": chk["service_gain"], f"{name}_cost_ratio": chk["cost_ratio"],
                        f"{name}_throughput_gain": (r.metrics["completed"] / s["horizon_s"]) / (m["completed"] / sv["horizon_s"]) - 1.0,
                        f"{name}_mean_decode_batch": s["mean_decode_batch"]})
        row.update(_gains(units, name))
        if blocks:
            row[f"{name}_good_blocks"] = unc.encode(units[:, 1, 1])
        out.update(row)
        if name.startswith("soft") and r.metrics["goodput_rps"] > best_good:
            best, best_good = name, r.metrics["goodput_rps"]
    out["best_soft"] = best
    for key in ("goodput_gain", "goodput_gain_lo", "goodput_gain_hi", "slo_gain", "slo_gain_lo", "slo_gain_hi",
                "ttft_p99_gain", "ttft_p99_gain_lo", "ttft_p99_gain_hi", "preemptions"):
        out[f"best_{key}"] = out[f"{best}_{key}"]
    if blocks:
        out["best_good_blocks"] = out[f"{best}_good_blocks"]
    out["cpu_s"] = time.process_time() - t0
    return out


def check_bound(frame: pd.DataFrame, tol: float = 1e-9) -> pd.DataFrame:
    """The bound against the oracle on every cell of a headroom map: one row per cell with the bound
    (max_e R_e / W_e), the oracle's service-rate gain (the theorem's quantity; it can exceed the
    bound only where assumption (A) fails, ``cost_ratio`` < 1), its completion-rate gain (bounded
    where the cell is saturated), and its goodput gain (not covered by the theorem: an empirical
    check). Columns ``service_ok``, ``throughput_ok`` (saturated cells; True elsewhere), ``goodput_ok``."""
    f = frame.copy()
    bound = np.maximum(f["bound"], f["engine_bound"])
    out = f[["workload", "deployment", "load", "stable", "memory_bound", "preemptions", "bound", "engine_bound",
             "oracle_service_gain", "oracle_cost_ratio", "oracle_throughput_gain", "oracle_goodput_gain",
             "oracle_goodput_gain_lo", "oracle_goodput_gain_hi"]].copy()
    out["service_ok"] = f["oracle_service_gain"] <= f["bound"] + tol
    out["throughput_ok"] = ~f["saturated"] | (f["oracle_throughput_gain"] <= bound + tol)
    out["goodput_ok"] = f["oracle_goodput_gain"] <= bound + tol
    return out


def headroom(*, workloads=tuple(WORKLOADS), deployments=DEPLOYMENTS, loads=LOADS, seed: int = 0, n_jobs=None,
             progress: bool = True) -> pd.DataFrame:
    """The headroom map: one row per (workload, deployment, load), classified by
    :func:`kvdro.sim.regimes.classify` on vLLM's run (columns ``stable``, ``memory_bound``, ``regime``)."""
    from kvdro.experiments.runner import run_sweep
    from kvdro.sim.regimes import classify

    for w in workloads:
        if w not in WORKLOADS:
            raise ValueError(f"workloads: unknown {w!r} (use {list(WORKLOADS)})")
    cells = [{"workload": w, "deployment": d, "load": float(x), "seed": int(seed)} for w in workloads for d in deployments for x in loads]
    df = run_sweep(headroom_cell, cells, n_jobs=n_jobs, progress=progress, desc="headroom")
    df = df.assign(trace=df["workload"])
    return classify(df).drop(columns=["trace"])


#: Policies that know the true lengths (bounds) and reservations a deployment could run.
KNOWING, DEPLOYABLE = ("oracle", "exact"), ("best", "dro")


def summary(frame: pd.DataFrame, threshold: float = 0.05) -> dict:
    """The map's answer: the largest goodput gain of any reservation anywhere and where -- of the
    policies that know the true lengths (``oracle``, ``exact``) and of the deployable ones (best
    soft, DRO) separately --; the cells with a gain of at least ``threshold`` (5 %) whose interval
    lies above 0, and the stable ones among them; and the bound checked on every cell."""
    rows = []
    for arm in KNOWING + DEPLOYABLE:
        for r in frame.itertuples():
            rows.append({"policy": arm, "workload": r.workload, "deployment": r.deployment, "load": r.load, "stable": bool(r.stable),
                         "memory_bound": bool(r.memory_bound), "gain": getattr(r, f"{arm}_goodput_gain"),
                         "lo": getattr(r, f"{arm}_goodput_gain_lo"), "hi": getattr(r, f"{arm}_goodput_gain_hi")})
    g = pd.DataFrame(rows)
    top = g.loc[g["gain"].idxmax()]
    dep = g[g["policy"].isin(DEPLOYABLE)]
    big = g[(g["gain"] >= threshold) & (g["lo"] > 0)]
    chk = check_bound(frame)
    return {"largest": top.to_dict(), "largest_deployable": dep.loc[dep["gain"].idxmax()].to_dict(),
            "largest_deployable_significant": (dep[dep["lo"] > 0].sort_values("gain").iloc[-1].to_dict()
                                               if (dep["lo"] > 0).any() else None),
            "cells_with_5pct": big, "stable_cells_with_5pct": big[big["stable"]],
            "bound": chk, "bound_failures": chk[~(chk["service_ok"] & chk["throughput_ok"])],
            "goodput_above_bound": chk[~chk["goodput_ok"]]}


# ------------------------------------------------------------------------------------------------ routing seeds
#: The routing draws of the seed-sensitivity study (seed 0 is the map's own draw).
ROUTING_SEEDS = tuple(range(8))
#: A map cell is rerun over the routing draws if some policy's goodput gain there is at least this
#: (half the 5 % of :func:`summary`: every cell the 5 % count could gain or lose under another draw
#: whose gain under the map's draw is not far below it), besides the primary memory point.
SEED_SCREEN = 0.025
SEED_ARMS = KNOWING + DEPLOYABLE


def seed_cells(frame: pd.DataFrame, screen: float = SEED_SCREEN) -> list[tuple[str, str, float]]:
    """(workload, deployment, load) of the seed study: the primary memory point
    (:data:`kvdro.sim.regimes.OPERATING_POINTS`), then every cell of the map ``frame`` where some
    policy (oracle, exact, best soft, DRO) gains at least ``screen`` of goodput (point estimate),
    in the map's order. Every cell :func:`summary` counts at 5 % is among them."""
    from kvdro.sim import regimes

    if not 0 < screen < 1:
        raise ValueError(f"screen: must be in (0, 1), got {screen!r}")
    primary = regimes.OPERATING_POINTS["memory"]
    pts = [("conversation", primary.deployment_label, float(primary.scale))]
    hit = np.zeros(len(frame), dtype=bool)
    for arm in SEED_ARMS:
        hit |= (frame[f"{arm}_goodput_gain"] >= screen).to_numpy()
    for r in frame[hit].itertuples():
        p = (str(r.workload), str(r.deployment), float(r.load))
        if not any(p[:2] == q[:2] and np.isclose(p[2], q[2]) for q in pts):
            pts.append(p)
    return pts


def pooled_gain(base: np.ndarray, arm: np.ndarray, *, run: int = unc.BLOCK_RUN, n_boot: int = unc.N_BOOT,
                seed: int = unc.SEED) -> unc.Interval:
    """The goodput gain pooled over routing draws, with a two-way bootstrap interval.

    ``base`` and ``arm``: requests served within their own deadline, shape (routing draws S, time
    blocks N), by vLLM and by the policy, every draw over the same arrivals. The estimate is the
    ratio of the pooled counts, sum(arm) / sum(base) - 1 (the gain in goodput averaged over the
    routing draw). Two sources of uncertainty: the routing draws are independent given the
    arrivals, so each replicate resamples S draws with replacement (the ordinary bootstrap); the
    time blocks are one time series shared by every draw, so each replicate resamples runs of
    ``run`` consecutive blocks (the moving-block bootstrap of :mod:`kvdro.experiments.uncertainty`)
    and applies the same blocks to every draw and both arms (paired). Resampling both factors of a
    crossed design at once is conservative (it counts the interaction twice; Owen 2007, "the
    pigeonhole bootstrap"). With S = 8 the draw part is coarse: the interval says how far the mean
    over draws is known, not what one draw gives -- that is the range over draws."""
    b, a = np.asarray(base, dtype=float), np.asarray(arm, dtype=float)
    if b.ndim != 2 or b.shape != a.shape or b.shape[0] < 2 or b.shape[1] < 2:
        raise ValueError(f"base, arm: need the same shape (draws >= 2, blocks >= 2), got {b.shape} and {a.shape}")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(a))):
        raise ValueError("base, arm: contain non-finite values")

    def ratio(x, y):
        return x / np.maximum(y, 1.0) - 1.0

    point = float(ratio(a.sum(), b.sum()))
    rng = np.random.default_rng(int(seed))
    draws = rng.integers(0, b.shape[0], size=(int(n_boot), b.shape[0]))
    blk = unc._indices(b.shape[1], run, int(n_boot), rng)
    tot_b = np.take_along_axis(b[draws].sum(axis=1), blk, axis=1).sum(axis=1)
    tot_a = np.take_along_axis(a[draws].sum(axis=1), blk, axis=1).sum(axis=1)
    lo, hi = np.quantile(ratio(tot_a, tot_b), [0.025, 0.975])
    return unc.Interval(point, float(min(lo, point)), float(max(hi, point)))


def headroom_seeds(cells=None, *, seeds=ROUTING_SEEDS, frame: pd.DataFrame | None = None, threshold: float = 0.05, n_jobs=None, progress: bool = True, cache: bool = True) -> pd.DataFrame:
    """How much the routing draw moves the map's gains: :func:`headroom_cell` at each of ``cells``
    ((workload, deployment, load); default :func:`seed_cells` of ``frame``, the cached map by
    default) under every routing seed of ``seeds``, the arrivals and the fitted buffers fixed.

    One row per (cell, policy in oracle / exact / best soft / DRO, routing seed), ``kind == "seed"``:
    the goodput gain over vLLM under that draw (``gain``) and its paired block interval (``lo``,
    ``hi``), vLLM's preemptions and its regime under that draw (``stable``, ``memory_bound``, by
    :func:`kvdro.sim.regimes.classify`), whether the gain counts (``counts``: at least
    ``threshold`` with its interval above 0). Then one row per (cell, policy), ``kind ==
    "summary"``, ``routing_seed`` -1: ``gain_min``, ``gain_median``, ``gain_max`` over the draws;
    ``seeds_positive`` (interval above 0), ``seeds_counted`` (``counts``), ``seeds_stable`` and
    ``n_seeds``; and in ``gain``, ``lo``, ``hi`` the gain pooled over the draws with its two-way
    interval (:func:`pooled_gain`)."""
    from kvdro.experiments.runner import run_sweep
    from kvdro.sim.regimes import classify

    seeds = [int(x) for x in seeds]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds: need at least two distinct non-negative routing seeds, got {seeds!r}")
    if cells is None:
        cells = seed_cells(load_headroom() if frame is None else frame)
    cells = [(str(w), str(d), float(x)) for w, d, x in cells]
    for w, _, _ in cells:
        if w not in WORKLOADS:
            raise ValueError(f"cells: unknown workload {w!r} (use {list(WORKLOADS)})")
    jobs = [{"workload": w, "deployment": d, "load": x, "seed": 0, "routing_seed": r,
             "blocks": True} for w, d, x in cells for r in seeds]
    df = run_sweep(headroom_cell, jobs, n_jobs=n_jobs, progress=progress, desc="headroom seeds", cache=cache)
    df = classify(df.assign(trace=df["workload"])).drop(columns=["trace"])
    rows = []
    for r in df.itertuples():
        for arm in SEED_ARMS:
            gain, lo, hi = (float(getattr(r, f"{arm}_goodput_gain{s}")) for s in ("", "_lo", "_hi"))
            rows.append({"kind": "seed", "workload": r.workload, "deployment": r.deployment, "load": r.load, "policy": arm,
                         "routing_seed": int(r.routing_seed), "gain": gain, "lo": lo, "hi": hi,
                         "counts": bool(gain >= threshold and lo > 0), "stable": bool(r.stable),
                         "memory_bound": bool(r.memory_bound), "preemptions": int(r.preemptions),
                         "recompute_share": float(r.recompute_share), "slo_violation": float(r.slo_violation),
                         "best_soft": r.best_soft if arm == "best" else "",
                         "_base": unc.decode(r.vllm_good_blocks), "_arm": unc.decode(getattr(r, f"{arm}_good_blocks"))})
    per = pd.DataFrame(rows)
    summ = []
    for (w, d, x, arm), g in per.groupby(["workload", "deployment", "load", "policy"], sort=False):
        iv = pooled_gain(np.stack(g["_base"].to_list()), np.stack(g["_arm"].to_list()))
        summ.append({"kind": "summary", "workload": w, "deployment": d, "load": x, "policy": arm, "routing_seed": -1,
                     "gain": iv.point, "lo": iv.lo, "hi": iv.hi, "counts": bool(g["counts"].all()),
                     "gain_min": float(g["gain"].min()), "gain_median": float(g["gain"].median()),
                     "gain_max": float(g["gain"].max()), "seeds_positive": int((g["lo"] > 0).sum()),
                     "seeds_counted": int(g["counts"].sum()), "seeds_stable": int(g["stable"].sum()), "n_seeds": len(g)})
    out = pd.concat([per.drop(columns=["_base", "_arm"]), pd.DataFrame(summ)], ignore_index=True)
    out.attrs["cpu_s"] = float(df["cpu_s"].sum())
    return out


def load_seeds(path=None) -> pd.DataFrame:
    """The cached seed study (``data/headroom_seeds.csv``, :func:`headroom_seeds`)."""
    from pathlib import Path

    p = _data_dir() / "headroom_seeds.csv" if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no cached seed study; run `python -m kvdro.bench headroom --parts seeds`")
    return _read_checked(p, "seeds")


def seed_summary(seeds: pd.DataFrame, workload: str, deployment: str, load: float, policy: str = "oracle") -> pd.Series:
    """The summary row of :func:`headroom_seeds` for one cell and policy; KeyError if the study
    did not rerun that cell."""
    s = seeds[(seeds["kind"] == "summary") & (seeds["workload"] == workload) & (seeds["deployment"] == deployment)
              & np.isclose(seeds["load"], float(load)) & (seeds["policy"] == policy)]
    if len(s) != 1:
        raise KeyError(f"no seed summary for {policy} at {workload}, {deployment}, load {load:g}")
    return s.iloc[0]


def gain_interval(row: pd.Series, arm: str, what: str = "goodput_gain") -> unc.Interval:
    """A policy's change over vLLM in one cell of the map (a row of :func:`headroom`), with its paired
    interval. The cached map keeps the ratio's point and ends, not its resamples, so a ratio whose
    baseline comes near zero is recognised by its ends (:attr:`~kvdro.experiments.uncertainty.Interval.exploded`);
    for the goodput gain its difference in req/s (the policy's goodput minus vLLM's, point only: the
    map does not store the resampled difference) is then what :meth:`~kvdro.experiments.uncertainty.Interval.pct`
    prints. ``arm``: oracle, exact, dro, best (the best soft buffer of the row) or soft<fraction>."""
    cols = [f"{arm}_{what}{s}" for s in ("", "_lo", "_hi")]
    missing = [c for c in cols if c not in row.index]
    if missing:
        raise ValueError(f"row: no column(s) {missing} (arm {arm!r}, what {what!r})")
    iv = unc.Interval(*(float(row[c]) for c in cols))
    if what != "goodput_gain" or not iv.exploded:
        return iv
    name = str(row["best_soft"]) if arm == "best" else arm
    for c in ("goodput_rps", f"{name}_goodput_rps"):
        if c not in row.index:
            raise ValueError(f"row: no column {c!r}: a goodput gain near a zero baseline is reported in req/s")
    diff = float(row[f"{name}_goodput_rps"]) - float(row["goodput_rps"])
    return unc.Interval(iv.point, iv.lo, iv.hi, diff=diff, unit="req/s", base_near_zero=True)


def seed_phrase(row: pd.Series) -> str:
    """A summary row of :func:`headroom_seeds` in words: ``+28.0% to +95.0% over 8 routing draws
    (interval above zero in all; pooled +61.0% [+20.0, +150.0])``. A pooled interval whose ends show
    a baseline near zero (:attr:`~kvdro.experiments.uncertainty.Interval.exploded`) is left out: the
    study keeps no goodput in req/s to report the difference in."""
    n, pos = int(row["n_seeds"]), int(row["seeds_positive"])
    where = "in all" if pos == n else ("in none" if pos == 0 else f"in {pos} of {n}")
    iv = unc.Interval(float(row["gain"]), float(row["lo"]), float(row["hi"]))
    pooled = (f"{100 * iv.point:+.1f}%, no interval: vLLM's pooled goodput comes near zero in resamples" if iv.exploded
              else iv.pct(1))
    return (f"{100 * row['gain_min']:+.1f}% to {100 * row['gain_max']:+.1f}% over {n} routing draws "
            f"(interval above zero {where}; pooled {pooled})")


def seed_counts(seeds: pd.DataFrame, policies=("oracle",), stable: bool | None = None) -> dict:
    """How many of the rerun cells count (gain >= 5 %, interval above 0) for any of ``policies``
    under every draw, under some draws only, and under none; with ``stable``, a cell counts under a
    draw only if vLLM's run under that draw is (``True``) or is not (``False``) stable. Returns
    ``{"all": n, "some": n, "none": n, "some_cells": frame, "per_draw": series}``: the cells whose
    count depends on the draw, with how many draws count; the number of cells that count under each
    routing seed."""
    per = seeds[(seeds["kind"] == "seed") & seeds["policy"].isin(list(policies))].copy()
    ok = per["counts"].astype(bool)
    if stable is not None:
        ok &= per["stable"].astype(bool) == bool(stable)
    per["ok"] = ok
    cell_draw = per.groupby(["workload", "deployment", "load", "routing_seed"], sort=False)["ok"].any()
    by = cell_draw.groupby(level=["workload", "deployment", "load"], sort=False).agg(["sum", "size"])
    some = by[(by["sum"] > 0) & (by["sum"] < by["size"])].reset_index().rename(columns={"sum": "draws", "size": "n_seeds"})
    return {"all": int((by["sum"] == by["size"]).sum()), "some": len(some), "none": int((by["sum"] == 0).sum()),
            "some_cells": some, "per_draw": cell_draw.groupby(level="routing_seed").sum().astype(int)}


def seed_sentences(seeds: pd.DataFrame) -> dict[str, str]:
    """The seed study in words, for the sentences that count the map's cells (chapter 9, the
    introduction): ``"oracle"`` -- over how many draws, how many rerun cells the oracle's gain counts
    in (:func:`seed_counts`; in all, and stable), how many count under every draw and how many under
    some only; ``"reservations"`` -- the same for exact, best soft and DRO together; ``"scope"`` --
    which cells were rerun."""
    n = int(seeds.loc[seeds["kind"] == "seed", "routing_seed"].nunique())
    cells = seeds[seeds["kind"] == "summary"][["workload", "deployment", "load"]].drop_duplicates()
    ora, ora_st = seed_counts(seeds, ("oracle",)), seed_counts(seeds, ("oracle",), stable=True)
    res = seed_counts(seeds, ("exact", "best", "dro"))

    def span(x):
        lo, hi = int(x.min()), int(x.max())
        return f"{lo}" if lo == hi else f"{lo} to {hi}"

    out = {"oracle": (f"over {n} routing draws that count is {span(ora['per_draw'])} cells, {span(ora_st['per_draw'])} of "
                      f"them stable: {ora['all']} cells count under every draw, {ora['some']} under some draws only"
                      + (f", and only {ora_st['all']} " + ("cell is stable and counts" if ora_st["all"] == 1 else
                                                            "cells are stable and count") + " under every draw"
                         if ora_st["all"] else ", and no cell is stable and counts under every draw")),
           "reservations": ("under none of " + f"{n} routing draws does a reservation gain 5% beyond noise in any of the "
                            f"{len(cells)} cells rerun" if res["per_draw"].max() == 0 else
                            f"over {n} routing draws a reservation gains 5% beyond noise in {span(res['per_draw'])} of the "
                            f"{len(cells)} cells rerun"),
           "scope": (f"the {len(cells)} cells rerun are the primary memory point and every cell where some policy gains "
                     f"at least {SEED_SCREEN:.1%} under the map's draw; cells below that were not rerun")}
    return out


# ------------------------------------------------------------------------------------------------ scheduling
#: The waiting-queue orders compared inside vLLM's admission (item 4 of issue 26): FCFS, and
#: shortest-output-first with aging ordered by the true length, by the class median of the
#: training outputs, or by the median of the request's prompt bin (chapter 11's bins).
SCHEDULE_ARMS = ("fcfs", "sof-true", "sof-class", "sof-prompt-bins")
#: Prompt bins of the ``sof-prompt-bins`` predictor (as :func:`kvdro.ambiguity.bucket_reservations`).
PROMPT_BINS = 4


def length_predictions(train: pd.DataFrame, test: pd.DataFrame, how: str, n_bins: int = PROMPT_BINS) -> np.ndarray:
    """A predicted output length [tokens] per ``test`` row, fitted on ``train``: ``"class"`` the
    median training output of the request's class; ``"prompt-bins"`` the median training output of
    its class's prompt bin (``n_bins`` bins of about equal count at the training prompts' quantiles,
    the edges of :func:`kvdro.ambiguity.bucket_reservations`)."""
    if how not in ("class", "prompt-bins"):
        raise ValueError(f"how: must be 'class' or 'prompt-bins', got {how!r}")
    out = np.empty(len(test))
    cls = test["request_class"].astype(str).to_numpy()
    for c, part in train.groupby("request_class", sort=True):
        m = cls == str(c)
        y = part["output_tokens"].to_numpy(dtype=float)
        if how == "class":
            out[m] = float(np.median(y))
            continue
        L = part["input_tokens"].to_numpy(dtype=float)
        inner = np.unique(np.quantile(L, np.linspace(0, 1, int(n_bins) + 1)[1:-1], method="inverted_cdf"))
        edges = np.concatenate([[-np.inf], inner[inner > L.min()], [np.inf]])
        med = np.array([float(np.median(y[(np.searchsorted(edges, L, side="right") - 1) == j])) for j in range(edges.size - 1)])
        out[m] = med[np.searchsorted(edges, test["input_tokens"].to_numpy(dtype=float)[m], side="right") - 1]
    if np.isnan(out).any():
        raise ValueError("test: a request class has no training requests")
    return out


def _sched_blocks(res, blk: np.ndarray) -> np.ndarray:
    """(N_BLOCKS, 4 + 2 bins): served, good, sum e2e, sum TTFT, e2e and TTFT histograms."""
    req = res.requests
    served = req["outcome"].isin(["completed", "truncated"]).to_numpy()
    e2e = req["e2e_s"].to_numpy(dtype=float)
    ttft = req["ttft_s"].to_numpy(dtype=float)
    good = served & (np.nan_to_num(e2e, nan=np.inf) <= req["deadline_s"].to_numpy(dtype=float))
    cols = [unc.block_sums(blk, x) for x in (served.astype(float), good.astype(float), np.where(served, e2e, 0.0),
                                              np.where(served, ttft, 0.0))]
    hists = []
    for x in (e2e, ttft):
        h = np.zeros((unc.N_BLOCKS, len(TTFT_BINS) - 1))
        k = np.clip(np.searchsorted(TTFT_BINS, x[served], side="right") - 1, 0, h.shape[1] - 1)
        np.add.at(h, (blk[served], k), 1.0)
        hists.append(h)
    return np.column_stack(cols + hists)


def scheduling_cell(*, workload: str, deployment: str, load: float, arm: str, seed: int = 0,
                    aging_s_per_token: float = 0.1) -> dict:
    """FCFS against ``arm`` (:data:`SCHEDULE_ARMS`) on ``workload``'s test half at ``load`` on
    ``deployment``, vLLM's admission in both: the arm's mean and P99 end-to-end time and TTFT and
    its goodput, with paired changes against FCFS and their intervals (``*_change`` = arm / FCFS - 1;
    ``goodput_gain`` likewise)."""
    from kvdro.sim import simulate
    from kvdro.sim.regimes import deployment as make_deployment

    if arm not in SCHEDULE_ARMS:
        raise ValueError(f"arm: must be one of {SCHEDULE_ARMS}, got {arm!r}")
    t0 = time.process_time()
    train, test = workload_halves(workload, seed)
    test = _at(test, workload, load)
    dep = make_deployment(deployment)
    blk = unc.block_index(test["arrival_s"].to_numpy())

    def run(schedule="fcfs", hint=None):
        kw = {} if schedule == "fcfs" else {"schedule": schedule, "length_hint": hint, "aging_s_per_token": aging_s_per_token}
        return simulate(test, policy="vllm", deployment=dep, rng=np.random.default_rng(int(seed)), **kw)

    base = run()
    if arm == "fcfs":
        res = base
    elif arm == "sof-true":
        res = run("sof")
    else:
        res = run("sof", length_predictions(train, test, arm[len("sof-"):]))
    units = np.stack([_sched_blocks(base, blk), _sched_blocks(res, blk)], axis=1)
    nb = len(TTFT_BINS) - 1
    m = res.metrics
    served = res.requests["outcome"].isin(["completed", "truncated"]).to_numpy()
    out = {"goodput_rps": m["goodput_rps"], "slo_violation": m["slo_violation_rate"], "e2e_mean_s": m["e2e_mean_s"],
           "e2e_p99_s": m["e2e_p99_s"], "ttft_mean_s": float(np.nanmean(res.requests["ttft_s"].to_numpy()[served])),
           "ttft_p99_s": m["ttft_p99_s"], "preemptions": m["preemptions"], "kv_mean": m["kv_utilisation_mean"]}
    stats = {
        "goodput_gain": lambda s: s[:, 1, 1] / np.maximum(s[:, 0, 1], 1.0) - 1,
        "e2e_mean_change": lambda s: (s[:, 1, 2] / s[:, 1, 0]) / (s[:, 0, 2] / s[:, 0, 0]) - 1,
        "ttft_mean_change": lambda s: (s[:, 1, 3] / s[:, 1, 0]) / (s[:, 0, 3] / s[:, 0, 0]) - 1,
        "e2e_p99_change": lambda s: unc.quantile_from_hist(s[:, 1, 4:4 + nb], 0.99) / unc.quantile_from_hist(s[:, 0, 4:4 + nb], 0.99) - 1,
        "ttft_p99_change": lambda s: unc.quantile_from_hist(s[:, 1, 4 + nb:], 0.99) / unc.quantile_from_hist(s[:, 0, 4 + nb:], 0.99) - 1,
    }
    for name, f in stats.items():
        iv = unc.bootstrap(f, units)
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = iv.point, iv.lo, iv.hi
    out["cpu_s"] = time.process_time() - t0
    return out


def scheduling_points() -> list[tuple[str, str, float]]:
    """(workload, deployment, load) of the scheduling study: every memory-bound, stable cell of the
    conversation trace on the cached regime map (the primary point among them) and the light point
    (:data:`kvdro.sim.regimes.OPERATING_POINTS`), in that order."""
    from kvdro.sim import regimes

    f = regimes.memory_bound_stable(regimes.load_regime_map())
    f = f[f["trace"] == "conversation"]
    pts = [("conversation", str(r.deployment), float(r.load)) for r in f.itertuples()]
    light = regimes.OPERATING_POINTS["light"]
    pts.append(("conversation", light.deployment_label, float(light.scale)))
    return pts


def scheduling(*, arms=SCHEDULE_ARMS, seed: int = 0, n_jobs=None, progress: bool = True) -> pd.DataFrame:
    """The scheduling contrast at :func:`scheduling_points`: one row per (point, arm)."""
    from kvdro.experiments.runner import run_sweep
    from kvdro.sim import regimes

    primary = regimes.OPERATING_POINTS["memory"]
    cells = [{"workload": w, "deployment": d, "load": x, "arm": a, "seed": int(seed)} for w, d, x in scheduling_points() for a in arms]
    df = run_sweep(scheduling_cell, cells, n_jobs=n_jobs, progress=progress, desc="scheduling")
    df.insert(3, "point", ["memory (primary)" if (d == primary.deployment_label and np.isclose(x, primary.scale)) else
                           "light" if d == regimes.OPERATING_POINTS["light"].deployment_label else "memory-bound, stable"
                           for d, x in zip(df["deployment"], df["load"])])
    return df


# ------------------------------------------------------------------------------------------------ cached results
def _read_checked(path, part: str, key: tuple[str, ...] = ()) -> pd.DataFrame:
    """A cached table checked against its manifest (:func:`kvdro.cachefile.read_csv_checked`)."""
    from kvdro.cachefile import read_csv_checked

    return read_csv_checked(path, key=key, remake=f"python -m kvdro.bench headroom --parts {part}")


def _data_dir():
    from kvdro.sim.studies import DATA_DIR

    return DATA_DIR


def load_headroom(path=None) -> pd.DataFrame:
    """The cached map (``data/headroom.csv``, one row per workload x deployment x load, the policies
    side by side); FileNotFoundError says how to make it."""
    from pathlib import Path

    p = _data_dir() / "headroom.csv" if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no cached headroom map; run `python -m kvdro.bench headroom --parts map`")
    return _read_checked(p, "map", key=("workload", "deployment", "load"))


def load_scheduling(path=None) -> pd.DataFrame:
    """The cached scheduling contrast (``data/headroom_scheduling.csv``, one row per point x arm)."""
    from pathlib import Path

    p = _data_dir() / "headroom_scheduling.csv" if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no cached scheduling study; run `python -m kvdro.bench headroom --parts scheduling`")
    return _read_checked(p, "scheduling")


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """The map in long form: one row per (workload, deployment, load, policy) with ``policy`` in
    oracle / exact / best soft / dro and, per metric (goodput, slo, ttft_p99), the gain and its
    interval (``goodput_gain``, ``goodput_lo``, ``goodput_hi``, ...), beside the cell's regime
    columns, vLLM's recompute share and the bound."""
    keep = ["workload", "deployment", "load", "stable", "memory_bound", "regime", "preemptions", "recompute_share",
            "bound", "engine_bound", "goodput_rps", "slo_violation"]
    rows = []
    for arm, label in (("oracle", "oracle"), ("exact", "exact"), ("best", "best soft"), ("dro", "dro")):
        part = frame[[c for c in keep if c in frame.columns]].copy()
        part.insert(3, "policy", label)
        for m in ("goodput", "slo", "ttft_p99"):
            part[f"{m}_gain"] = frame[f"{arm}_{m}_gain"]
            part[f"{m}_lo"] = frame[f"{arm}_{m}_gain_lo"]
            part[f"{m}_hi"] = frame[f"{arm}_{m}_gain_hi"]
        rows.append(part)
    return pd.concat(rows, ignore_index=True)
