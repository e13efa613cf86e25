"""The parts of the paper's evaluation that need no simulator: reservation-level costs of each rule,
the DRO buffer's quantile (Figure 2(b)) and the price of robustness against eps (Figure 3(b)).

Everything is per request and in units of ``c_w`` (the newsvendor loss (2)-(3) with ``c_w = 1``,
``c_p = rho``). Buffers are fitted on the *training* part of a trace (:func:`traces.train_test`) and
scored on both parts: ``cost_train`` is in-sample, ``cost_test`` out-of-sample. The support bound
``L_max`` is the largest training output ("tight", as in chapter 3) and the radius is
``eps = eps_fraction * E[xi]`` with the training mean.

:func:`eps_premium_joint` prices robustness in the *whole* objective (8a) of the joint problem
(GPU, SLO and rejection terms included) with the exact solver of :mod:`kvdro.joint`: the
denominator question of the paper's "< 1.3%".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from kvdro import newsvendor, wasserstein
from kvdro.experiments import traces as tr

__all__ = [
    "EPS_FRACTIONS",
    "RHOS_TABLE2",
    "RULES",
    "eps_premium",
    "eps_premium_joint",
    "fig2b",
    "rule_buffers",
    "table2_analytic",
]

RHOS_TABLE2 = (2, 5, 10, 20, 50, 100)
EPS_FRACTIONS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.5)
#: Reservation rules of the analytic tables (the simulator's policies without vLLM and LP + k sigma,
#: which need a predictor of output length from prompt length, i.e. the simulator's policy code).
RULES = ("dro", "saa", "p90", "p95", "p99", "mean", "max")


def rule_buffers(samples: np.ndarray, rho: float, *, eps_fraction: float = 0.15, L_max: float | None = None) -> dict[str, float]:
    """Output buffers eta [tokens] of each rule in :data:`RULES`, fitted on ``samples``.

    DRO: :func:`kvdro.wasserstein.dro_reservation` with ``eps = eps_fraction * mean(samples)`` on
    ``[0, L_max]`` (default: the largest sample); SAA: the ``rho/(rho+1)`` quantile (9); Pq: the
    ``q`` empirical quantile (lower, ``inverted_cdf``); Mean; Max = ``L_max``.
    """
    x = newsvendor.as_samples(samples)
    L = float(x.max()) if L_max is None else float(L_max)
    eps = float(eps_fraction) * float(x.mean())
    out = {
        "dro": wasserstein.dro_reservation(x, rho, 1.0, eps, L),
        "saa": newsvendor.saa_reservation(x, rho, 1.0),
        "mean": float(x.mean()),
        "max": L,
    }
    for name, q in (("p90", 0.90), ("p95", 0.95), ("p99", 0.99)):
        out[name] = float(np.quantile(x, q, method="inverted_cdf"))
    return {k: out[k] for k in RULES}


def _split(trace: str, seed: int, train_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    parts = tr.train_test(tr.load(trace, seed=seed), train_fraction)
    return parts.train["output_tokens"].to_numpy(float), parts.test["output_tokens"].to_numpy(float)


def table2_analytic(
    traces: Sequence[str] = tr.REAL,
    rhos: Sequence[float] = RHOS_TABLE2,
    *,
    eps_fraction: float = 0.15,
    train_fraction: float = 0.5,
    seed: int = 0,
) -> pd.DataFrame:
    """Per-request cost (units of c_w) of every rule's buffer, in-sample and out-of-sample.

    One row per (trace, rho, rule): ``eta`` [tokens], ``cost_train`` (in-sample), ``cost_test``
    (out-of-sample), and ``is_saa`` (the DRO buffer equals the SAA buffer).
    """
    rows = []
    for trace in traces:
        x_train, x_test = _split(trace, seed, train_fraction)
        for rho in rhos:
            b = rule_buffers(x_train, rho, eps_fraction=eps_fraction)
            for rule, eta in b.items():
                rows.append(
                    {
                        "trace": trace,
                        "rho": rho,
                        "rule": rule,
                        "eta": eta,
                        "cost_train": newsvendor.expected_cost(x_train, eta, rho, 1.0),
                        "cost_test": newsvendor.expected_cost(x_test, eta, rho, 1.0),
                        "dro_is_saa": b["dro"] == b["saa"],
                    }
                )
    return pd.DataFrame(rows)


def fig2b(
    traces: Sequence[str] = tr.REAL,
    rhos: Sequence[float] | None = None,
    *,
    eps_fraction: float = 0.15,
    train_fraction: float = 0.5,
    seed: int = 0,
) -> pd.DataFrame:
    """Figure 2(b): the level of the DRO buffer on the data against ``q* = rho/(rho+1)``.

    Columns: ``level_train`` = F_train(eta_DRO) (in-sample, what the paper plots), ``level_below`` =
    F_train(eta_DRO-) (the level just below the atom at eta), ``level_test`` =
    F_test(eta_DRO) (out-of-sample), ``is_saa`` (DRO buffer = SAA buffer) and ``threshold`` =
    the radius eps* below which they coincide (:func:`kvdro.wasserstein.saa_threshold_radius`),
    in units of E[xi].
    """
    rhos = np.unique(np.round(np.geomspace(1, 100, 40), 2)) if rhos is None else np.asarray(rhos, dtype=float)
    rows = []
    for trace in traces:
        x_train, x_test = _split(trace, seed, train_fraction)
        L, mean = float(x_train.max()), float(x_train.mean())
        for rho in rhos:
            eta = wasserstein.dro_reservation(x_train, rho, 1.0, eps_fraction * mean, L)
            rows.append(
                {
                    "trace": trace,
                    "rho": float(rho),
                    "q_star": newsvendor.critical_fractile(rho),
                    "eta": eta,
                    "level_train": float(np.mean(x_train <= eta)),
                    "level_below": float(np.mean(x_train < eta)),
                    "level_test": float(np.mean(x_test <= eta)),
                    "is_saa": eta == newsvendor.saa_reservation(x_train, rho, 1.0),
                    "threshold": wasserstein.saa_threshold_radius(x_train, rho, 1.0, L) / mean,
                }
            )
    return pd.DataFrame(rows)


def eps_premium(
    traces: Sequence[str] = tr.REAL,
    rhos: Sequence[float] = (2, 10, 100),
    eps_fractions: Sequence[float] = EPS_FRACTIONS,
    *,
    train_fraction: float = 0.5,
    seed: int = 0,
) -> pd.DataFrame:
    """The premium of the DRO buffer over SAA per request, with three denominators.

    * ``value``: robust value min_eta WC(eta) over the SAA cost, minus 1 (what the robust model
      expects to pay in its worst case);
    * ``in_sample``: training cost of the DRO buffer over the SAA buffer's, minus 1;
    * ``out_of_sample``: the same on the test part (negative: DRO did better on later requests).
    """
    rows = []
    for trace in traces:
        x_train, x_test = _split(trace, seed, train_fraction)
        L, mean = float(x_train.max()), float(x_train.mean())
        for rho in rhos:
            eta_saa = newsvendor.saa_reservation(x_train, rho, 1.0)
            v_train = newsvendor.expected_cost(x_train, eta_saa, rho, 1.0)
            v_test = newsvendor.expected_cost(x_test, eta_saa, rho, 1.0)
            for f in eps_fractions:
                sol = wasserstein.dro_solution(x_train, rho, 1.0, f * mean, L)
                rows.append(
                    {
                        "trace": trace,
                        "rho": rho,
                        "eps_fraction": float(f),
                        "eta": sol.eta,
                        "value": sol.cost / v_train - 1,
                        "in_sample": newsvendor.expected_cost(x_train, sol.eta, rho, 1.0) / v_train - 1,
                        "out_of_sample": newsvendor.expected_cost(x_test, sol.eta, rho, 1.0) / v_test - 1,
                    }
                )
    return pd.DataFrame(rows)


def eps_premium_cell(*, seed: int, rho: float, eps_fraction: float, eps_units: str = "mean", size: str = "small") -> dict[str, float]:
    """One cell of :func:`eps_premium_joint`: exact plans at radius ``eps_fraction E[xi]`` (or, with
    ``eps_units="tokens"``, ``eps_fraction`` tokens) and at 0.

    Returns the robust objective (8a) of the robust plan (``obj_robust``), the objective of the SAA
    plan (eps = 0, ``obj_saa``), the robust plan scored with eps = 0 (``obj_robust_nominal``), each
    plan's preemption + waste term, and the robust plan's buffers changed from SAA (``changed``).
    """
    from kvdro.joint import evaluate, paper_instance, solve_exact

    base = paper_instance(size, seed, c_p=float(rho))
    nominal = replace(base, eps=0.0)
    if eps_units not in ("mean", "tokens"):
        raise ValueError(f"eps_units: must be 'mean' or 'tokens', got {eps_units!r}")
    unit = [c.mean_output_tokens if eps_units == "mean" else 1.0 for c in base.classes]
    robust = replace(base, eps=tuple(eps_fraction * u for u in unit))
    plan_saa = solve_exact(nominal)
    plan_rob = solve_exact(robust)
    e_saa = evaluate(nominal, plan_saa)
    e_rob = evaluate(robust, plan_rob)
    e_rob_nom = evaluate(nominal, plan_rob)
    return {
        "obj_saa": e_saa.total,
        "obj_robust": e_rob.total,
        "obj_robust_nominal": e_rob_nom.total,
        "pw_saa": e_saa.terms["preempt_waste"],
        "pw_robust": e_rob.terms["preempt_waste"],
        "pw_robust_nominal": e_rob_nom.terms["preempt_waste"],
        "changed": int(np.sum(np.abs(plan_rob.r - plan_saa.r) > 0.5)),
    }


def eps_premium_joint(
    seeds: Sequence[int] = (0,),
    rhos: Sequence[float] = (2, 10, 100),
    eps_fractions: Sequence[float] = EPS_FRACTIONS,
    *,
    eps_units: Sequence[str] = ("mean",),
    n_jobs: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """The premium in the joint objective (8a) (small instance, exact solver), two denominators:

    * ``total_value`` = obj_robust / obj_saa - 1 (the robust plan's robust objective);
    * ``total_in_sample`` = obj_robust_nominal / obj_saa - 1 (the robust plan priced on the data);
    * ``pw_value``, ``pw_in_sample``: the same for the preemption + waste term alone.

    ``eps_units``: ``"mean"`` reads eps_fraction in units of E[xi_i] (the paper's reading),
    ``"tokens"`` in tokens. The plans are in-sample: fitted and scored on the same 200 samples per class.
    """
    from kvdro.experiments.runner import run_sweep

    cells = [
        {"seed": int(s), "rho": float(r), "eps_fraction": float(f), "eps_units": u}
        for u in eps_units for s in seeds for r in rhos for f in eps_fractions
    ]
    df = run_sweep(eps_premium_cell, cells, n_jobs=n_jobs, progress=progress, desc="eps premium (joint)")
    df["total_value"] = df.obj_robust / df.obj_saa - 1
    df["total_in_sample"] = df.obj_robust_nominal / df.obj_saa - 1
    df["pw_value"] = df.pw_robust / df.pw_saa - 1
    df["pw_in_sample"] = df.pw_robust_nominal / df.pw_saa - 1
    return df
