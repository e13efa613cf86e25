"""Score a decision: the objective (8a) term by term, and every constraint violation of (6b)-(6f).

:func:`evaluate` is the one function every solver and chapter uses to score a solution. It recomputes
everything from (z, r, pi, delta) alone:

* the worst-case expected preemption + waste cost per admitted request at the *given* r_i, by the
  closed form of (8c)-(8g) (:func:`kvdro.wasserstein.worst_case_cost`);
* the waiting times W_k from the decision itself (Kingman (7), :func:`kvdro.joint.serving.group_state`),
  the SLO excess s_i = max(0, sum_k pi_ik (W_k + H_ik) - a_i D_i) (6f), with W_k + H_ik read in
  k's utilisation band, per class where the calibrated model has the class's own row
  (:func:`kvdro.joint.serving.response_at`);
* GPU and rejection costs.

All costs are per second of operation (see :mod:`kvdro.joint.instance`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdro.joint.instance import Instance, Solution
from kvdro.joint.serving import BAND_TOLERANCE, group_state, response_at

__all__ = ["Evaluation", "evaluate", "TERMS", "predict_serving"]

#: Names of the objective's terms, in the order of (8a).
TERMS = ("preempt_waste", "gpu", "slo", "rejection")


@dataclass(frozen=True)
class Evaluation:
    """The objective (8a) of a decision, term by term, with the state that produced it.

    Attributes:
        terms: cost per second of each term of :data:`TERMS`.
        total: their sum [cost / s] (``inf`` if some group is overloaded, u_k >= 1).
        class_worst_case: R_i(r_i), worst-case cost per admitted class-i request.
        slo_excess_s: s_i [s] (6f).
        waiting_s: W_k [s] of the model (:func:`kvdro.joint.serving.waiting_model`; in the calibrated
            model a class with its own calibration row waits its own W_ik instead, which the SLO
            term reads through :func:`kvdro.joint.serving.response_at`);
            waiting_mix_s: diagnostic Kingman W with each group's own class mix [s]; utilisation: u_k; memory_tokens: KV tokens one group of k needs
            (left side of (6e) divided by z_k) [tokens]; memory_fraction: that over M_k.
        violations: name -> amount (0 = satisfied); see :func:`evaluate`.
    """

    terms: dict[str, float]
    total: float
    class_worst_case: np.ndarray
    slo_excess_s: np.ndarray
    waiting_s: np.ndarray
    waiting_mix_s: np.ndarray
    utilisation: np.ndarray
    memory_tokens: np.ndarray
    memory_fraction: np.ndarray
    violations: dict[str, float]

    @property
    def feasible(self) -> bool:
        """True if every violation is within 1e-6 (relative to its scale)."""
        return all(v <= 1e-6 for v in self.violations.values())

    def to_dict(self) -> dict:
        """JSON-serialisable summary."""

        def num(v: float) -> float | None:
            return float(v) if np.isfinite(v) else None

        return {
            "total": num(self.total),
            "terms": {k: num(v) for k, v in self.terms.items()},
            "class_worst_case": [num(v) for v in self.class_worst_case],
            "slo_excess_s": [num(v) for v in self.slo_excess_s],
            "waiting_s": [num(v) for v in self.waiting_s],
            "waiting_mix_s": [num(v) for v in self.waiting_mix_s],
            "utilisation": [num(v) for v in self.utilisation],
            "memory_fraction": [num(v) for v in self.memory_fraction],
            "violations": {k: num(v) for k, v in self.violations.items()},
            "feasible": self.feasible,
        }


def evaluate(instance: Instance, solution: Solution) -> Evaluation:
    """The objective (8a) and constraint violations of ``solution`` on ``instance``.

    Violations (all >= 0; 0 means satisfied):

    * ``gpu_budget`` -- GPUs over J (6b);
    * ``routing_undeployed`` -- traffic routed to a configuration with z_k = 0 (6c);
    * ``routing_sum`` -- amount by which sum_k pi_ik exceeds 1, or pi < 0 (6d);
    * ``memory`` -- largest excess of one group's KV demand over M_k, as a fraction of M_k (6e);
    * ``utilisation`` -- largest u_k - u_max beyond :data:`kvdro.joint.serving.BAND_TOLERANCE`;
    * ``reservation`` -- tokens by which some r_i falls outside [L_in^i, L_in^i + 16 ceil(L_max^i/16)].

    Raises:
        ValueError: if the solution's shapes do not match the instance.
    """
    if not isinstance(instance, Instance):
        raise ValueError(f"instance: must be a kvdro.joint.Instance, got {type(instance).__name__}")
    if not isinstance(solution, Solution):
        raise ValueError(f"solution: must be a kvdro.joint.Solution, got {type(solution).__name__}")
    I, K = instance.n_classes, instance.n_configs
    if solution.z.shape != (K,) or solution.r.shape != (I,):
        raise ValueError(f"solution: shapes z {solution.z.shape}, r {solution.r.shape} do not match K={K}, I={I}")
    z, r, pi, d = solution.z, solution.r, solution.pi, solution.delta
    lam = instance.rates
    L_in, L_pre, D = instance.input_tokens, instance.prefix_tokens, instance.slo_s
    eta = r - L_in
    top = np.array([c[-1] for c in instance.candidates])
    Rw = np.array([instance.worst_case_cost(i, min(max(eta[i], 0.0), top[i])) for i in range(I)])
    a = pi.sum(axis=1)
    state = group_state(instance, z, pi, d)
    H = np.where(d, instance.residence_s[:, :, 1], instance.residence_s[:, :, 0])  # (6e): the slowest band's
    # (6f): W + H in k's band (for the calibrated model per class where the class has its own row)
    response = response_at(instance, state.utilisation, d)
    with np.errstate(invalid="ignore"):
        resp = np.where(pi > 0, pi * response, 0.0).sum(axis=1)
    s = np.maximum(0.0, resp - a * D)
    terms = {
        "preempt_waste": float(lam @ (a * Rw)),
        "gpu": float(instance.c_gpu * (instance.gpus @ z)),
        "slo": float(instance.c_slo * (lam @ s)) if instance.c_slo > 0 else 0.0,  # no 0 * inf
        "rejection": float(instance.c_rej * (lam @ np.clip(1.0 - a, 0.0, None))),
    }
    total = float(sum(terms.values()))

    # memory per group (6e): (1+kappa) sum_i lambda_i pi_ik H_ik (r_i - delta L_pre) / z_k + sum_i delta L_pre
    mem = np.zeros(K)
    for k in range(K):
        if z[k] > 0:
            mem[k] = (1 + instance.kappa) * float(lam @ (pi[:, k] * H[:, k] * (r - d[:, k] * L_pre))) / z[k]
            mem[k] += float(d[:, k] @ L_pre)
        else:
            mem[k] = float((1 + instance.kappa) * lam @ (pi[:, k] * H[:, k] * r))  # nowhere to put it
    M = instance.capacity_tokens
    frac = mem / M
    undeployed = z == 0
    violations = {
        "gpu_budget": float(max(0, instance.gpus @ z - instance.total_gpus)),
        "routing_undeployed": float(pi[:, undeployed].sum()) if undeployed.any() else 0.0,
        "routing_sum": float(max(0.0, np.max(a - 1.0), -np.min(pi))),
        "memory": float(max(0.0, np.max(np.where(undeployed, np.where(mem > 0, np.inf, 0.0), frac - 1.0)))),
        # within BAND_TOLERANCE of u_max counts as in the last band, as in the MILP (serving.BAND_TOLERANCE)
        "utilisation": float(max(0.0, np.max(state.utilisation - instance.u_max - BAND_TOLERANCE))),
        "reservation": float(max(0.0, np.max(-eta), np.max(eta - top))),
        "negative_groups": float(max(0, -np.min(z))),
    }
    return Evaluation(
        terms=terms,
        total=total,
        class_worst_case=Rw,
        slo_excess_s=s,
        waiting_s=state.waiting_s,
        waiting_mix_s=state.waiting_mix_s,
        utilisation=state.utilisation,
        memory_tokens=mem,
        memory_fraction=frac,
        violations=violations,
    )


def predict_serving(instance: Instance, solution: Solution) -> dict:
    """What the planner's serving model predicts the engine will deliver for ``solution``.

    Returns a JSON-serialisable dict:

    * ``e2e_mean_s`` -- mean end-to-end time of admitted requests, sum_k pi_ik (W_k + H_ik) per class
      (the response time of (6f); for the calibrated model W_ik and H_ik interpolated between the
      measured band edges at k's utilisation, :func:`kvdro.joint.serving.interpolated_at`, where
      (6f) charges the band's upper edge), weighted by the admitted rates lambda_i a_i [s];
    * ``per_class_e2e_mean_s`` -- class name -> that class's mean [s] (``per_class_goodput_rps`` likewise);
    * ``goodput_rps`` -- admitted requests per second that finish within D_i: per class, configuration
      and output sample xi_n, P(W_k <= D_i - H_ik(xi_n)) with the wait an atom at 0 of mass p_k plus an
      exponential of mean W_k / (1 - p_k), and H linear in xi [req/s], with p_k = 1 - u_k (M/G/1's
      idle share) and the residence slope in xi from (1) (analytic model); calibrated model:
      for a class with its own calibration row, P(R (W_ik + H_ik) <= D_i) with R the class's measured
      end-to-end time over its mean at k's band (:func:`kvdro.joint.serving.ratio_cdf`); otherwise
      P(wait + R H_ik(xi_n) <= D_i) with the wait and the residence ratio R drawn independently
      from the quantiles the simulator measured at k's band, the wait's scaled to mean W_k
      (:func:`kvdro.joint.serving.on_time_share`);
    * ``kv_utilisation_mean`` -- KV tokens in use over the deployed capacity M_k: analytic model,
      per group the Little's-law tokens of (6e) without the headroom kappa (reserved tokens r_i held
      for H_ik); calibrated model, what a soft-reading engine holds, per request its prompt for the
      residence plus its output as it grows (:func:`kvdro.joint.serving.kv_token_seconds`, with
      E[xi^2] of the class's samples) times the occupancy ratio m_kj of k's band;
    * ``serving`` -- which serving model produced them.
    """
    from kvdro.joint.serving import (
        band_kv_ratio,
        band_of,
        calibration_for,
        interpolated_at,
        kv_token_seconds,
        on_time_share,
        ratio_cdf,
    )

    ev = evaluate(instance, solution)
    z, r, pi, d = solution.z, solution.r, solution.pi, solution.delta
    lam = instance.rates
    u = ev.utilisation
    Wik, H = interpolated_at(instance, u, d)  # (I, K) each: between the measured band edges
    W = ev.waiting_s
    response = Wik + H
    a = pi.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(a > 0, np.where(pi > 0, pi * response, 0.0).sum(axis=1) / np.where(a > 0, a, 1.0), np.nan)
    flow = lam * a
    e2e = float(np.nansum(flow * per_class) / flow.sum()) if flow.sum() > 0 else float("nan")

    K = instance.n_configs
    calibrated = instance.serving == "calibrated"
    if calibrated:
        cal = calibration_for(instance)
        j = band_of(instance, u)
        j = np.where(j < 0, instance.waiting_bands - 1, np.minimum(j, instance.waiting_bands - 1))
        slope = np.broadcast_to(cal.residence[np.arange(K), j, 2][None, :], pi.shape)
        wait_q = cal.wait_quantiles[np.arange(K), j]  # (K, 10) [s]
        measured = cal.wait_measured_s[np.arange(K), j]
        with np.errstate(invalid="ignore"):  # scaled from the band's measured mean to the model's W_k (its running maximum)
            wait_q = wait_q * np.where(np.isfinite(W), W / np.maximum(measured, 1e-9), 0.0)[:, None]
        res_q = cal.residence_quantiles[np.arange(K), j]
        class_ratio = cal.class_e2e_ratio[:, np.arange(K), j]  # (I, K, 10), nan without a class row
    else:
        p0 = np.clip(1.0 - u, 0.0, 1.0)
        slope = np.zeros(pi.shape)
        from kvdro.queueing import residence_time

        for i, c in enumerate(instance.classes):
            for k, perf in enumerate(instance.configs):
                if pi[i, k] > 0:
                    args = (c.mean_input_tokens, float(c.prefix_tokens), bool(d[i, k]))
                    h1 = residence_time(instance.model, perf, args[0], c.mean_output_tokens + 1.0, args[1], args[2])
                    slope[i, k] = h1 - H[i, k]
    good = np.zeros(instance.n_classes)
    for i, c in enumerate(instance.classes):
        xi = np.asarray(c.output_tokens, dtype=float)
        for k in range(K):
            if pi[i, k] <= 0:
                continue
            h = H[i, k] + slope[i, k] * (xi - c.mean_output_tokens)
            slack = float(c.slo_s) - h
            Wk = W[k]
            if not np.isfinite(Wk):
                continue
            if calibrated and np.all(np.isfinite(class_ratio[i, k])):  # the class's own measured spread
                ok = np.array(ratio_cdf(class_ratio[i, k], float(c.slo_s) / max(float(response[i, k]), 1e-6)))
            elif calibrated:  # the measured spreads of the wait and of the residence around its line
                ok = np.array(on_time_share(wait_q[k], res_q[k], xi, h, float(c.slo_s)))
            else:
                tail = Wk / max(1.0 - p0[k], 1e-9)
                ok = np.where(slack < 0, 0.0, p0[k] + (1 - p0[k]) * (1 - np.exp(-slack / tail)) if tail > 0 else 1.0)
            good[i] += lam[i] * pi[i, k] * float(ok.mean())

    L_pre = instance.prefix_tokens
    used = 0.0
    cap = 0.0
    if calibrated:
        m = band_kv_ratio(instance, u)
        xi2 = np.array([float(np.mean(np.square(np.asarray(c.output_tokens, dtype=float)))) for c in instance.classes])
    for k, cfg in enumerate(instance.configs):
        if z[k] <= 0:
            continue
        prefix = z[k] * float(d[:, k] @ L_pre)
        if calibrated:  # what a soft-reading engine holds: prompts for the residence, outputs as they grow
            held = kv_token_seconds(instance.input_tokens - d[:, k] * L_pre, H[:, k], slope[:, k], xi2)
            used += m[k] * (float(lam @ (pi[:, k] * held)) + prefix)
        else:  # Little's law on the reserved tokens, as (6e) without the headroom kappa
            used += float(lam @ (pi[:, k] * H[:, k] * (r - d[:, k] * L_pre))) + prefix
        cap += z[k] * cfg.kv_capacity_tokens
    return {
        "serving": instance.serving,
        "e2e_mean_s": e2e if np.isfinite(e2e) else None,  # None: some group is overloaded (u_k > u_max)
        "goodput_rps": float(good.sum()),
        "kv_utilisation_mean": float(used / cap) if cap > 0 else float("nan"),
        "per_class_e2e_mean_s": {c.name: (float(v) if np.isfinite(v) else None) for c, v in zip(instance.classes, per_class)},
        "per_class_goodput_rps": {c.name: float(v) for c, v in zip(instance.classes, good)},
    }
