"""One function per table or figure of the paper's evaluation, each a thin layer over :mod:`kvdro.sim`
and :mod:`kvdro.bcd`, returning a tidy DataFrame (one row per simulation).

Two kinds of sweep cell, both module-level functions run by :func:`kvdro.experiments.runner.run_sweep`
(parallel, cached):

* :func:`policy_cell` -- a reservation *policy* (:data:`kvdro.sim.POLICIES`) on the deployment of a
  regime (on J = 8 A100-80GB): buffers fitted on the training part of a trace, the test part served
  (Tables II and IV, Figures 3(a) and 5(b)).
* :func:`plan_cell` -- a *plan* of the joint problem (z, r, pi, delta) by BCD-DRO (or a variant of
  the ablation) fitted on the training part of the heterogeneous trace (code + conversation, three
  input-length sub-classes each: 6 classes), deployed as it is (Table V, Figure 6).
* :func:`drift_cell` -- static vs rolling-horizon buffers on a drifting trace (Figure 5(a)).

Costs. Two accountings, both reported (the chapter explains why they differ):

* ``cost_paper`` -- the paper's (4): the newsvendor loss (2)+(3) of each served request's
  reservation, c_p (L_in + xi - r)^+ + c_w (r - L_in - xi)^+, plus the SLO, rejection and GPU terms
  of the run. A shortage is charged whether or not the engine had to preempt. For ``vllm`` (no
  reservation) r is the prompt's blocks.
* ``cost_realised`` -- the simulator's ``cost_total``: preemption is charged on the tokens the engine
  actually recomputed; an output that outgrows its reservation while free blocks remain costs nothing.

Both are also given per served request (``*_per_req``), the unit of the tables. Units: cost units
with c_w = 1 per token (c_p = rho, c_slo = 5 per second late, c_rej = 5000, c_gpu = 100 per GPU-second).

Operating point. Every sweep runs in one *regime* (:mod:`kvdro.experiments.regimes`): ``"memory"``
(the regime map's memory-bound, stable point: 4 x TP2-PP1 at 0.7 of the trace's rate; the primary test) or ``"light"`` (2 x TP4-PP1
at 0.6, nothing binds; the contrast), both chosen by :mod:`kvdro.sim.regimes`' rules. ``load`` multiplies the trace's arrival rate (default: the
regime's). Plans (Table V, Figure 6) are made at the regime's load and deploy what the planner
chooses. The SLO D_i of a class (the cost's lateness, (6f)) is fixed from its *training* outputs
(:func:`kvdro.workload.default_slo_s`), so a shifted test trace is priced against the contract;
goodput and SLO violation judge each request by its own deadline, 2 s + 0.1 s x its xi
(``simulate``'s default; ``goodput_class_rps`` and ``slo_violation_class`` give the class reading).

Uncertainty. Each run also stores per-time-block sums (``blk_nv``, ``blk_total``, ``blk_served``,
``blk_realised`` -- the realised cost --, ``blk_good`` -- requests served within their own deadline
--, ``blk_good_class`` -- within the class deadline --, ``blk_arrived``; plans also a latency
histogram ``blk_e2e_hist``) for the paired block bootstrap of
:mod:`kvdro.experiments.uncertainty`, and ``cpu_s``, the CPU seconds the cell took (the benchmark's
budget; not written to the cached CSVs). Synthetic twins run :data:`TWIN_SEEDS` seeds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pandas as pd

from kvdro.experiments import traces as tr
from kvdro.experiments import uncertainty as unc
from kvdro.experiments.regimes import operating_point
from kvdro.hardware import BLOCK_TOKENS
from kvdro.experiments.runner import run_sweep

__all__ = [
    "ABLATION",
    "DEFAULT_LOAD",
    "LOAD_FACTORS",
    "TWIN_SEEDS",
    "QUICK_TEST_S",
    "RHOS_TABLE2",
    "RHOS_TABLE4",
    "SHIFTS",
    "TABLE4_POLICIES",
    "drift_cell",
    "fig3",
    "fig5a",
    "fig5b",
    "fig6",
    "plan_cell",
    "policy_cell",
    "run_summary",
    "slo_by_class",
    "table2",
    "table4",
    "table5",
]

DEFAULT_LOAD = 0.5
#: A ``quick`` cell serves only the first QUICK_TEST_S seconds of the test part [s].
QUICK_TEST_S = 300.0
RHOS_TABLE2 = (2, 5, 10, 20, 50, 100)
RHOS_TABLE4 = (2, 10, 100)
#: Table IV's policies: vLLM and the paper's reservation rules (the oracles of chapter 9 are not rules).
TABLE4_POLICIES = ("vllm", "max", "mean", "p90", "p95", "p99", "saa", "dro", "lp1", "lp2")
#: Figure 3(a)'s arrival rates, as multiples of the regime's load.
LOAD_FACTORS = (0.5, 1.0, 1.5)
#: Synthetic-twin seeds of a full sweep (>= 10: the interval over twins is a bootstrap over seeds).
TWIN_SEEDS = tuple(range(10))
SHIFTS = (1.0, 2.0, 3.0)
#: Table V's variants: the full plan and three ablations.
ABLATION = ("bcd-dro", "no-routing", "no-dro", "no-prefix")
#: Output-length cap of a shifted trace [tokens] (a generation limit; None = no cap).
SHIFT_CAP = None


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def slo_by_class(train: pd.DataFrame) -> dict[str, float]:
    """Class name -> SLO D_i [s] of :func:`kvdro.workload.default_slo_s` at the class's mean output
    length in ``train`` (the deadline every sweep's deployment uses)."""
    from kvdro.workload import default_slo_s

    return {str(c): default_slo_s(float(g["output_tokens"].mean())) for c, g in train.groupby("request_class", sort=True)}


def _test_part(trace: str, seed: int, *, quick: bool, load: float, shift: float, train_fraction: float = 0.5):
    parts = tr.train_test(tr.load(trace, seed=seed), train_fraction)
    test = tr.head(parts.test, QUICK_TEST_S) if quick else parts.test
    test = tr.scale_load(test, load)
    if shift != 1.0:
        test = tr.shift(test, shift, max_output_tokens=SHIFT_CAP)
    return parts.train, test


def _blocks(res, *, hist: bool = False) -> dict[str, str]:
    """Per time block of the served trace (:mod:`kvdro.experiments.uncertainty`): the newsvendor term,
    the paper's total (newsvendor + SLO + rejection + GPU; the GPU term shared by arrivals), the
    requests served and, with ``hist``, a latency histogram of the served requests."""
    c = res.cost
    req = res.requests
    blk = unc.block_index(req["arrival_s"].to_numpy())
    outcome = req["outcome"].to_numpy()
    served = np.isin(outcome, ["completed", "truncated"])
    L = req["input_tokens"].to_numpy()
    gen = req["generated_tokens"].to_numpy()
    if res.policy == "vllm":
        over = np.maximum(0, L + gen - (-(-L // BLOCK_TOKENS) * BLOCK_TOKENS))
    else:
        over = req["overflow_tokens"].to_numpy(dtype=float)
    waste = req["waste_tokens"].to_numpy(dtype=float)
    nv = np.where(served, c["c_p"] * over + c["c_w"] * waste, 0.0)
    e2e = req["e2e_s"].to_numpy(dtype=float)
    late = np.where(served, np.maximum(0.0, np.nan_to_num(e2e - req["slo_s"].to_numpy(dtype=float))), 0.0)
    rej = np.where(np.isin(outcome, ["rejected", "ignored"]), c["c_rej"], 0.0)
    total = nv + c["c_slo"] * late + rej + c["gpu"] / len(req)
    realised = (c["c_p"] * req["recomputed_tokens"].to_numpy(dtype=float) + np.where(served, c["c_w"] * waste, 0.0)
                + c["c_slo"] * late + rej + c["gpu"] / len(req))
    good = served & (np.nan_to_num(e2e, nan=np.inf) <= req["deadline_s"].to_numpy(dtype=float))
    good_class = served & (np.nan_to_num(e2e, nan=np.inf) <= req["slo_s"].to_numpy(dtype=float))
    out = {
        "blk_nv": unc.encode(unc.block_sums(blk, nv)),
        "blk_total": unc.encode(unc.block_sums(blk, total)),
        "blk_served": unc.encode(unc.block_sums(blk, served.astype(float))),
        "blk_realised": unc.encode(unc.block_sums(blk, realised)),
        "blk_good": unc.encode(unc.block_sums(blk, good.astype(float))),
        "blk_good_class": unc.encode(unc.block_sums(blk, good_class.astype(float))),
        "blk_arrived": unc.encode(unc.block_sums(blk, np.ones(len(req)))),
    }
    if hist:
        h = np.zeros((unc.N_BLOCKS, len(unc.LATENCY_BINS) - 1))
        k = np.clip(np.searchsorted(unc.LATENCY_BINS, e2e[served], side="right") - 1, 0, h.shape[1] - 1)
        np.add.at(h, (blk[served], k), 1.0)
        out["blk_e2e_hist"] = unc.encode(h)
    return out


def _simulate(test, *, reservation: str | None = None, **kw):
    """:func:`kvdro.sim.simulate`, with ``reservation=`` passed only when asked (the simulator's
    soft/hard switch; ``None`` keeps its default)."""
    from kvdro.sim import simulate

    if reservation is not None:
        kw["reservation"] = reservation
    return simulate(test, **kw)


def run_summary(res, n_requests: int, *, hist: bool = False) -> dict:
    """Metrics + both cost accountings of one simulation (see module docstring), and the per-block
    sums the bootstrap needs."""
    m = {k: v for k, v in res.metrics.items() if k != "wall_s"}
    c = res.cost
    req = res.requests
    served = req["outcome"].isin(["completed", "truncated"]).to_numpy()
    n_served = int(served.sum())
    if res.policy == "vllm":
        L = req["input_tokens"].to_numpy()
        gen = req["generated_tokens"].to_numpy()
        prompt_blocks = -(-L // BLOCK_TOKENS) * BLOCK_TOKENS
        overflow = float(np.maximum(0, L + gen - prompt_blocks)[served].sum())
        waste = float(c["waste_tokens"])
    else:
        overflow = float(c["overflow_tokens"])
        waste = float(c["waste_tokens"])
    newsvendor = c["c_p"] * overflow + c["c_w"] * waste
    det = c["slo"] + c["rejection"] + c["gpu"]
    from kvdro.sim.regimes import backlog_halves

    arrivals = req["arrival_s"].to_numpy(dtype=float)
    span = float(arrivals.max() - arrivals.min())
    end = max(o.end_ps for o in res.outputs) / 1e12 if res.outputs else span
    backlog = backlog_halves(req)
    out = dict(m)
    out.update(
        {
            "span_s": span,
            "drain_share": max(0.0, end - span) / span if span > 0 else 0.0,
            "backlog_first": backlog[0],
            "backlog_second": backlog[1],
            "n_requests": int(n_requests),
            "lost": int(n_requests - m["completed"] - m["rejected"] - m["ignored"]),
            "horizon_s": float(c["horizon_s"]),
            "cost_preemption": float(c["preemption"]),
            "cost_waste": float(c["waste"]),
            "cost_slo": float(c["slo"]),
            "cost_rejection": float(c["rejection"]),
            "cost_gpu": float(c["gpu"]),
            "overflow_tokens": overflow,
            "waste_tokens": waste,
            "cost_newsvendor": float(newsvendor),
            "cost_paper": float(newsvendor + det),
            "cost_realised": float(m["cost_total"]),
            "newsvendor_per_req": float(newsvendor / max(n_served, 1)),
            "cost_paper_per_req": float((newsvendor + det) / max(n_served, 1)),
            "cost_realised_per_req": float(m["cost_total"] / max(n_served, 1)),
            "goodput_class_rps": float(np.sum(served & (req["e2e_s"].to_numpy() <= req["slo_s"].to_numpy())) / c["horizon_s"])
            if c["horizon_s"] > 0 else 0.0,
            "slo_violation_class": float(np.mean(req["e2e_s"].to_numpy()[served] > req["slo_s"].to_numpy()[served]))
            if n_served else float("nan"),
            "buffer_mean": float(np.nanmean(req["buffer_tokens"].to_numpy(dtype=float)[served])) if res.policy != "vllm" else 0.0,
        }
    )
    out.update(_blocks(res, hist=hist))
    return out


# ------------------------------------------------------------------------------------------------
# policy cells: Tables II, IV, Figures 3(a), 5(b)
# ------------------------------------------------------------------------------------------------
def policy_cell(
    *,
    trace: str,
    seed: int,
    policy: str,
    rho: float,
    regime: str = "light",
    load: float | None = None,
    shift: float = 1.0,
    quick: bool = False,
    eps_fraction: float = 0.15,
    max_num_seqs: int = 256,
    reservation: str | None = None,
) -> dict:
    """Fit ``policy``'s buffers on the training part of ``trace``, serve the test part (arrival rate x
    ``load``, default the regime's; outputs x ``shift``) on the deployment of ``regime``
    (:func:`kvdro.experiments.regimes.operating_point`; vLLM's ``max_num_seqs`` sequences per
    engine); metrics, costs and per-block sums. ``reservation`` is the simulator's reading of a
    reservation (soft/hard; ``None``: its default)."""
    from kvdro.sim import default_deployment, policy_buffers

    t0 = time.process_time()
    point = operating_point(regime)
    load = point.load if load is None else load
    train, test = _test_part(trace, seed, quick=quick, load=load, shift=shift)
    buffers = policy_buffers(policy, train, rho=rho, eps_fraction=eps_fraction)
    dep = default_deployment(config=point.config, groups=point.groups, slo_s=slo_by_class(train), max_num_seqs=int(max_num_seqs))
    res = _simulate(test, reservation=reservation, policy=policy, buffers=buffers, deployment=dep, rho=rho,
                    rng=np.random.default_rng([int(seed), 1]))
    return run_summary(res, len(test)) | {"cpu_s": time.process_time() - t0}


def _policy_sweep(cells: list[dict], n_jobs, progress, desc) -> pd.DataFrame:
    return run_sweep(policy_cell, cells, n_jobs=n_jobs, progress=progress, desc=desc)


def _traces(quick: bool, traces: Sequence[str] | None) -> tuple[str, ...]:
    if traces is not None:
        return tuple(traces)
    return ("azure-2023-conv",) if quick else tr.REAL + tr.SYNTHETIC


def _seeds(quick: bool, seeds: Sequence[int] | None) -> tuple[int, ...]:
    if seeds is not None:
        return tuple(int(s) for s in seeds)
    return (0,) if quick else TWIN_SEEDS


def _expand(traces, seeds, **axes) -> list[dict]:
    """Cells: real traces get seed 0 only (one realisation; the seed then only draws the routing)."""
    import itertools

    keys = list(axes)
    cells = []
    for trace in traces:
        for seed in (seeds if trace in tr.SYNTHETIC else seeds[:1]):
            for values in itertools.product(*(axes[k] for k in keys)):
                cells.append({"trace": trace, "seed": int(seed), **dict(zip(keys, values))})
    return cells


def table2(*, regime: str = "memory", reservation: str = "soft", quick: bool = False, traces=None, seeds=None, n_jobs=None, progress=True) -> pd.DataFrame:
    """Table II: DRO vs P90 and P95 (and SAA) at rho in {2, 5, 10, 20, 50, 100}, in ``regime``."""
    cells = _expand(_traces(quick, traces), _seeds(quick, seeds), policy=("dro", "p90", "p95", "saa"),
                    rho=RHOS_TABLE2, regime=(regime,), load=(operating_point(regime).load,), quick=(quick,),
                    reservation=(reservation,))
    return _policy_sweep(cells, n_jobs, progress, "table2")


def table4(*, regime: str = "memory", reservation: str = "soft", quick: bool = False, traces=None, seeds=None, n_jobs=None, progress=True) -> pd.DataFrame:
    """Table IV: vLLM and every reservation policy of the paper (:data:`TABLE4_POLICIES`; not the
    oracles, which know the true lengths) at rho in {2, 10, 100}, in ``regime``."""
    cells = _expand(_traces(quick, traces), _seeds(quick, seeds), policy=TABLE4_POLICIES, rho=RHOS_TABLE4,
                    regime=(regime,), load=(operating_point(regime).load,), quick=(quick,),
                    reservation=(reservation,))
    return _policy_sweep(cells, n_jobs, progress, "table4")


def fig3(*, regime: str = "memory", reservation: str = "soft", quick: bool = False, traces=None, seeds=None, n_jobs=None, progress=True) -> pd.DataFrame:
    """Figure 3(a): cost against the arrival rate (:data:`LOAD_FACTORS` x the regime's load), rho = 10."""
    policies = ("vllm", "mean", "p90", "p95", "p99", "max", "saa", "dro")
    base = operating_point(regime).load
    loads = tuple(round(base * f, 6) for f in ((1.0, 2.0) if quick else LOAD_FACTORS))
    cells = _expand(_traces(quick, traces), _seeds(quick, seeds), policy=policies, rho=(10,), regime=(regime,), load=loads,
                    quick=(quick,), reservation=(reservation,))
    return _policy_sweep(cells, n_jobs, progress, "fig3a")


def fig5b(*, regime: str = "memory", reservation: str = "soft", quick: bool = False, traces=None, seeds=None, n_jobs=None, progress=True) -> pd.DataFrame:
    """Figure 5(b): SAA vs DRO as the test outputs are scaled by s, rho in {2, 10, 100}, in ``regime``."""
    shifts = (1.0, 2.0, 3.0) if quick else SHIFTS
    cells = _expand(_traces(quick, traces), _seeds(quick, seeds), policy=("saa", "dro"), rho=RHOS_TABLE4,
                    shift=shifts, regime=(regime,), load=(operating_point(regime).load,), quick=(quick,),
                    reservation=(reservation,))
    return _policy_sweep(cells, n_jobs, progress, "fig5b")


# ------------------------------------------------------------------------------------------------
# drift: static vs rolling horizon (Figure 5(a))
# ------------------------------------------------------------------------------------------------
N_WINDOWS = 6


def drift_cell(
    *,
    trace: str,
    seed: int,
    policy: str,
    mode: str,
    rho: float,
    s_end: float,
    regime: str = "light",
    load: float | None = None,
    quick: bool = False,
    n_windows: int = N_WINDOWS,
    reservation: str | None = None,
) -> dict:
    """Static vs rolling-horizon buffers on a drifting test part (outputs x 1 ... x ``s_end``).

    ``mode="static"``: buffers fitted once on the training part. ``mode="rolling"``: the buffers of
    window w are re-fitted on the requests of window w - 1 (observed outputs; window 0 uses the
    training part) -- re-optimisation at each tick of the rolling horizon. One continuous
    simulation: the requests of window w carry the class label ``"<class>@w"`` so that each window
    has its own buffer; the SLO stays the training one. Per-window metrics are in the columns
    ``w<k>_p99_s`` and ``w<k>_cost_per_req``.
    """
    from kvdro.sim import default_deployment, policy_buffers

    t0 = time.process_time()
    point = operating_point(regime)
    load = point.load if load is None else load
    if mode not in ("static", "rolling"):
        raise ValueError(f"mode: must be 'static' or 'rolling', got {mode!r}")
    parts = tr.train_test(tr.load(trace, seed=seed))
    test = tr.head(parts.test, QUICK_TEST_S) if quick else parts.test
    test = tr.drift(tr.scale_load(test, load), s_end, n_windows, max_output_tokens=SHIFT_CAP)
    base = policy_buffers(policy, parts.train, rho=rho)
    slo = slo_by_class(parts.train)
    labelled = test.copy()
    labelled["request_class"] = [f"{c}@{w}" for c, w in zip(test["request_class"], test["window"])]
    buffers: dict[str, float] = {}
    for w in range(n_windows):
        if mode == "static" or w == 0:
            src = base
        else:
            prev = test[test["window"] == w - 1]
            src = policy_buffers(policy, prev, rho=rho) if len(prev) >= 3 else base
        for c in test["request_class"].unique():
            buffers[f"{c}@{w}"] = float(src.get(str(c), base[str(c)]))
    slo_w = {f"{c}@{w}": slo[str(c)] for c in test["request_class"].unique() for w in range(n_windows)}
    dep = default_deployment(config=point.config, groups=point.groups, slo_s=slo_w)
    labelled = labelled.drop(columns="window")
    present = set(labelled["request_class"])
    res = _simulate(labelled, reservation=reservation, policy=policy, buffers={k: v for k, v in buffers.items() if k in present},
                   deployment=dep, rho=rho, rng=np.random.default_rng([int(seed), 2]))
    out = run_summary(res, len(test))
    req = res.requests
    served = req["outcome"].isin(["completed", "truncated"]).to_numpy()
    L = req["input_tokens"].to_numpy()
    gen = req["generated_tokens"].to_numpy()
    reserved = BLOCK_TOKENS * req["reserved_blocks"].to_numpy()
    c_p = res.cost["c_p"]
    loss = np.where(served, c_p * np.maximum(0, L + gen - reserved) + np.maximum(0, reserved - L - gen), 0.0)
    windows = test["window"].to_numpy()
    for w in range(n_windows):
        m = (windows == w) & served
        e2e = req["e2e_s"].to_numpy()[m]
        out[f"w{w}_p99_s"] = float(np.percentile(e2e, 99)) if e2e.size else float("nan")
        out[f"w{w}_cost_per_req"] = float(loss[m].mean()) if m.any() else float("nan")
    out["cpu_s"] = time.process_time() - t0
    return out


def fig5a(*, regime: str = "memory", reservation: str = "soft", quick: bool = False, traces=None, seeds=None, n_jobs=None, progress=True) -> pd.DataFrame:
    """Figure 5(a): static vs rolling horizon under drift (s from 1 to 3 over the test part), rho = 10."""
    cells = _expand(_traces(quick, traces), _seeds(quick, seeds), policy=("saa", "dro"), mode=("static", "rolling"),
                    rho=(10,), s_end=(3.0,), regime=(regime,), load=(operating_point(regime).load,), quick=(quick,),
                    reservation=(reservation,))
    return run_sweep(drift_cell, cells, n_jobs=n_jobs, progress=progress, desc="fig5a")


# ------------------------------------------------------------------------------------------------
# plan cells: Table V, Figure 6
# ------------------------------------------------------------------------------------------------
HETERO = {"real": tr.REAL, "synthetic": tr.SYNTHETIC}
PLAN_SAMPLES = 1000


@lru_cache(maxsize=8)
def _hetero(source: str, seed: int):
    """The heterogeneous trace (code + conversation) of ``source``, split in time and into six
    input-length sub-classes with the *training* part's bucket edges."""
    from kvdro.workload import split_by_input_quantile

    if source not in HETERO:
        raise ValueError(f"source: must be one of {sorted(HETERO)}, got {source!r}")
    df = pd.concat([tr.load(name, seed=seed) for name in HETERO[source]], ignore_index=True)
    df = df.sort_values("arrival_s", kind="stable", ignore_index=True)
    parts = tr.train_test(df)
    train = split_by_input_quantile(parts.train, 3)
    edges = train.attrs["input_edges"]
    test = parts.test.copy()
    labels = ["short", "medium", "long"]
    new = test["request_class"].astype(object).to_numpy(copy=True)
    for name, e in edges.items():
        m = (test["request_class"] == name).to_numpy()
        b = np.clip(np.searchsorted(np.asarray(e)[1:-1], test["input_tokens"].to_numpy()[m], side="left"), 0, 2)
        new[m] = [f"{name}-{labels[k]}" for k in b]
    test["request_class"] = pd.Series(new, index=test.index, dtype=object)
    return train, test


def _instance(train: pd.DataFrame, seed: int, *, rho: float, load: float, eps_fraction: float, serving: str = "analytic"):
    from kvdro.hardware import A100_80GB, LLAMA2_70B, PAPER_CONFIGS, config_performance
    from kvdro.joint import Instance
    from kvdro.workload import classes_from_trace

    rng = np.random.default_rng([int(seed), 3])
    classes = tuple(
        replace(c.subsample(min(PLAN_SAMPLES, c.n_samples), rng), arrival_rate=c.arrival_rate * load)
        for c in classes_from_trace(train)
    )
    configs = tuple(config_performance(LLAMA2_70B, A100_80GB, c) for c in PAPER_CONFIGS)
    eps = tuple(eps_fraction * c.mean_output_tokens for c in classes)
    return Instance(classes=classes, configs=configs, total_gpus=8, c_p=float(rho), eps=eps, name=f"hetero-seed{seed}",
                    serving=serving, calibration_source="real")


@lru_cache(maxsize=16)  # the plans of Figure 6's shifts and Table V's variants repeat within a worker
def _plan(source: str, seed: int, rho: float, load: float, eps_fraction: float, planner: str, serving: str = "analytic"):
    from kvdro.bcd import solve_bcd
    from kvdro.joint import solve_exact

    train, _ = _hetero(source, seed)
    inst = _instance(train, seed, rho=rho, load=load, eps_fraction=eps_fraction, serving=serving)
    if planner == "bcd":
        return inst, solve_bcd(inst)
    if planner == "exact":
        return inst, solve_exact(inst)
    raise ValueError(f"planner: must be 'bcd' or 'exact', got {planner!r}")


def plan_cell(
    *,
    source: str,
    seed: int,
    variant: str,
    rho: float = 10.0,
    regime: str = "light",
    load: float | None = None,
    shift: float = 1.0,
    quick: bool = False,
    planner: str = "bcd",
    eps_fraction: float = 0.15,
    reservation: str | None = None,
    serving: str = "analytic",
) -> dict:
    """A plan of the joint problem fitted on the training part, served on the test part.

    Variants (:data:`ABLATION`): ``"bcd-dro"`` the full plan; ``"no-routing"`` the same z, r, delta
    with each class's admitted share spread uniformly over the deployed groups; ``"no-dro"`` the
    plan of the same problem with eps = 0 (SAA); ``"no-prefix"`` the full plan with delta = 0.
    ``serving`` is the planner's serving model (:class:`kvdro.joint.Instance`: ``"analytic"`` or
    ``"calibrated"``, the simulator-calibrated bands of the real training half).
    """
    from kvdro.joint import Solution, evaluate
    from kvdro.sim import buffers_from_solution, deployment_from_solution

    t0 = time.process_time()
    load = operating_point(regime).load if load is None else load
    if variant not in ABLATION:
        raise ValueError(f"variant: must be one of {ABLATION}, got {variant!r}")
    inst, sol = _plan(source, seed, rho, load, 0.0 if variant == "no-dro" else eps_fraction, planner, serving)
    if variant == "no-routing":
        share = sol.z / sol.z.sum()
        sol = Solution(z=sol.z, r=sol.r, pi=sol.admitted[:, None] * share[None, :], delta=sol.delta, method="no-routing")
    elif variant == "no-prefix":
        sol = Solution(z=sol.z, r=sol.r, pi=sol.pi, delta=np.zeros_like(sol.delta), method="no-prefix")
    model = evaluate(inst, sol)
    _, test = _hetero(source, seed)
    test = tr.head(test, QUICK_TEST_S) if quick else test
    test = tr.scale_load(test, load)
    if shift != 1.0:
        test = tr.shift(test, shift, max_output_tokens=SHIFT_CAP)
    dep = deployment_from_solution(inst, sol)
    res = _simulate(test, reservation=reservation, policy="saa" if variant == "no-dro" else "dro", buffers=buffers_from_solution(inst, sol),
                    deployment=dep, rho=rho, rng=np.random.default_rng([int(seed), 4]))
    out = run_summary(res, len(test), hist=True)
    out.update(
        {
            "plan": dep.describe(),
            "model_objective": float(model.total),
            "model_preempt_waste": float(model.terms["preempt_waste"]),
            "rejected_share_plan": float(np.average(sol.rejected, weights=inst.rates)),
            "cached_pairs": int(sol.delta.sum()),
            "cpu_s": time.process_time() - t0,
            "plan_key": unc.encode(np.concatenate([sol.z.ravel(), np.round(sol.r.ravel()), np.round(sol.pi.ravel(), 4), sol.delta.ravel()])),
        }
    )
    return out


def table5(*, regime: str = "memory", quick: bool = False, seeds=None, n_jobs=None, progress=True, planner: str = "bcd",
           serving: str = "calibrated") -> pd.DataFrame:
    """Table V: the BCD-DRO plan and its ablations, planned at the regime's load and simulated (real
    trace seed 0; synthetic twins for the spread over seeds)."""
    seeds = _seeds(quick, seeds)
    load = operating_point(regime).load
    base = {"regime": regime, "load": load, "quick": quick, "planner": planner, "reservation": "soft",
            "serving": serving}
    cells = [{"source": "real", "seed": 0, "variant": v, **base} for v in ABLATION]
    if not quick:
        cells += [{"source": "synthetic", "seed": s, "variant": v, **base} for s in seeds for v in ABLATION]
    return run_sweep(plan_cell, cells, n_jobs=n_jobs, progress=progress, desc="table5")


def fig6(*, regime: str = "memory", quick: bool = False, seeds=None, n_jobs=None, progress=True, planner: str = "bcd",
         serving: str = "calibrated") -> pd.DataFrame:
    """Figure 6: the BCD-DRO plan vs the SAA plan (eps = 0) as the test outputs are scaled by s."""
    seeds = _seeds(quick, seeds)
    shifts = (1.0, 2.0, 3.0) if quick else SHIFTS
    base = {"regime": regime, "load": operating_point(regime).load, "quick": quick, "planner": planner, "reservation": "soft",
            "serving": serving}
    cells = [{"source": "real", "seed": 0, "variant": v, "shift": s, **base} for v in ("bcd-dro", "no-dro") for s in shifts]
    if not quick:
        cells += [{"source": "synthetic", "seed": sd, "variant": v, "shift": s, **base}
                  for sd in seeds for v in ("bcd-dro", "no-dro") for s in shifts]
    return run_sweep(plan_cell, cells, n_jobs=n_jobs, progress=progress, desc="fig6")
