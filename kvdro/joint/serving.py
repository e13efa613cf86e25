"""Serving-side coefficients of the joint problem: work, residence time and waiting time per group.

Which time goes where (the reading of :mod:`kvdro.queueing`, chapter 4):

* the **work** ``T_ik`` of (1) (:func:`kvdro.queueing.service_time`, seconds of group time per request)
  sets the utilisation ``u_k = sum_i lambda_i pi_ik T_ik / z_k`` and is the service time of the
  queue in (7);
* the **residence time** ``H_ik`` (:func:`kvdro.queueing.residence_time`, how long a request holds
  its KV blocks: its prefill plus E[xi] steps of a full decode batch) is what Little's law needs in
  the memory constraint (6e), and what a request experiences, so the response time in (6f) is
  ``W_k + H_ik``.

Both are tabulated with and without the cached prefix (delta_ik = 1 shortens the prefill to
``L_in - L_pre``).

**Waiting time W_k (7) -- the model the exact solver optimises.** Kingman's G/G/1 approximation
(:func:`kvdro.queueing.waiting_time`) for one group of configuration k,

    W_k = phi_k(u_k),   phi_k(u) = (c_a^2 + c_s^2) / 2 * u / (1 - u) * Tbar_k,

with the service-time moments (Tbar_k, c_s^2) and the arrival SCV c_a^2 of the **whole workload
mix** (every class, weighted by its rate; the within-class variance of the work comes from the
output length, ``Var_ik = (dT/dxi)^2 Var(xi_i)``; c_a^2 is the rate-weighted mean of the classes'
inter-arrival SCVs, Whitt's QNA superposition rule), so that W_k depends on the decision only
through the group's utilisation u_k = sum_i lambda_i pi_ik T_ik / z_k. Then phi_k is evaluated at
the **upper edge of the utilisation band** containing u_k (:func:`band_edges`): a step
function that bounds phi_k from above and that a MILP represents exactly (one binary per
(z_k, band) pair). :func:`waiting_model` is that function; the exact solver and
:func:`kvdro.joint.objective.evaluate` both use it, so "proven optimal" is optimal for this model.

:func:`group_state` also reports, as a diagnostic, Kingman's W with the group's *own* class mix and
QNA-thinned arrival SCV (``p c_i^2 + 1 - p`` for a random share p = pi_ik / z_k of class i), which
is closer to what the simulator sees but depends on the routing non-linearly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdro.queueing import (
    decode_time_per_token,
    mixture_service_moments,
    residence_time,
    service_time,
    waiting_time,
)

__all__ = [
    "service_table",
    "residence_table",
    "service_variance_table",
    "mix_waiting_coefficients",
    "band_edges",
    "band_waiting_s",
    "waiting_model",
    "band_of",
    "BAND_TOLERANCE",
    "GroupState",
    "group_state",
]


def _table(instance, fn) -> np.ndarray:
    out = np.empty((instance.n_classes, instance.n_configs, 2))
    for i, c in enumerate(instance.classes):
        for k, perf in enumerate(instance.configs):
            for cached in (0, 1):
                out[i, k, cached] = fn(
                    instance.model,
                    perf,
                    c.mean_input_tokens,
                    c.mean_output_tokens,
                    float(c.prefix_tokens),
                    bool(cached),
                )
    return out


def service_table(instance) -> np.ndarray:
    """Work T_ik of (1) [s], shape (I, K, 2): index 1 = with the cached prefix."""
    return _table(instance, service_time)


def residence_table(instance) -> np.ndarray:
    """Residence time H_ik [s] (KV blocks held; response time without queueing), shape (I, K, 2)."""
    return _table(instance, residence_time)


def service_variance_table(instance) -> np.ndarray:
    """Within-class variance of the work, (dT/dxi)^2 Var(xi_i) [s^2], shape (I, K)."""
    out = np.empty((instance.n_classes, instance.n_configs))
    for i, c in enumerate(instance.classes):
        var_xi = float(np.var(c.output_tokens))
        for k, perf in enumerate(instance.configs):
            per_token = decode_time_per_token(instance.model, perf, c.mean_input_tokens + c.mean_output_tokens / 2)
            out[i, k] = per_token**2 * var_xi
    return out


def mix_waiting_coefficients(instance) -> np.ndarray:
    """(c_a^2 + c_s^2) / 2 * Tbar_k [s] per configuration, for the whole workload mix (module doc):
    W_k = coefficient_k * u / (1 - u)."""
    lam = instance.rates
    cv2 = np.array([c.interarrival_cv**2 for c in instance.classes])
    ca2 = float(lam @ cv2 / lam.sum())
    out = np.empty(instance.n_configs)
    for k in range(instance.n_configs):
        mean, cs2 = mixture_service_moments(lam, instance.service_s[:, k, 0], instance.service_variance_s2[:, k])
        out[k] = (ca2 + cs2) / 2.0 * mean
    return out


def band_edges(instance) -> np.ndarray:
    """Upper edges u_j of the utilisation bands, equally spaced in log(1 - u):
    ``1 - u_j = (1 - u_max)^(j/B)``, j = 1..B (B = instance.waiting_bands), so u_B = u_max.

    Within band j the step bound over-estimates the factor 1/(1 - u) of (7) by at most
    ``(1 - u_max)^(-1/B)`` (1.26 for u_max = 0.9, B = 10): bands are narrow where W is steep.
    """
    B = instance.waiting_bands
    return 1.0 - (1.0 - instance.u_max) ** (np.arange(1, B + 1) / B)


def band_waiting_s(instance) -> np.ndarray:
    """W at each band's upper edge [s], shape (K, B): the constants the MILP multiplies pi by."""
    edges = band_edges(instance)
    return instance.mix_waiting_coefficients[:, None] * (edges / (1.0 - edges))[None, :]


#: Tolerance [utilisation, a fraction] with which a utilisation on a band edge counts as inside that
#: band, in :func:`waiting_model` (and so in :func:`kvdro.joint.evaluate`) and in the utilisation
#: check of ``evaluate``. The MILP states ``work <= n u_j`` exactly, but HiGHS accepts a point that
#: violates a row by up to its feasibility tolerances (``primal_feasibility_tolerance`` 1e-7 and
#: ``mip_feasibility_tolerance`` 1e-6, which :mod:`kvdro.joint.exact` sets explicitly), so a solution it
#: places in band j may sit up to ~1e-6 above u_j. A tolerance ten times the larger of the two makes
#: ``evaluate`` put every solver-feasible point in the band the solver chose; a point more than
#: 1e-5 above an edge is in the next band. (An earlier tolerance of 1e-9 sent a point 1.6e-7 above an
#: edge to the next band: W jumped by a factor 2.5 with no violation reported.)
BAND_TOLERANCE = 1e-5


def waiting_model(instance, utilisation: np.ndarray) -> np.ndarray:
    """W_k [s] of the exact model: phi_k at the upper edge of u_k's band; 0 if u_k = 0, inf if u_k > u_max.

    A utilisation up to :data:`BAND_TOLERANCE` above an edge counts as inside that band (and up to it
    above u_max as inside the last band), so that this function and the MILP agree on the band of
    every point HiGHS accepts as feasible.

    Raises:
        ValueError: ``utilisation`` is not one non-negative number (or inf) per configuration.
    """
    try:
        u = np.asarray(utilisation, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"utilisation: must be an array of numbers, got {utilisation!r}") from None
    if u.shape != (instance.n_configs,) or np.any(np.isnan(u)) or np.any(u < 0):
        raise ValueError(f"utilisation: need one non-negative number per configuration ({instance.n_configs}), got {utilisation!r}")
    edges = band_edges(instance)
    table = band_waiting_s(instance)
    out = np.zeros(u.shape)
    for k, uk in enumerate(u):
        if uk <= 1e-12:
            continue
        j = int(np.searchsorted(edges, uk - BAND_TOLERANCE, side="left"))
        out[k] = table[k, j] if j < edges.size else np.inf
    return out


def band_of(instance, utilisation: np.ndarray) -> np.ndarray:
    """Index j of the band each u_k falls in (with :data:`BAND_TOLERANCE`); -1 for u_k = 0, B above u_max."""
    u = np.asarray(utilisation, dtype=float)
    edges = band_edges(instance)
    j = np.searchsorted(edges, u - BAND_TOLERANCE, side="left")
    return np.where(u <= 1e-12, -1, j)


@dataclass(frozen=True)
class GroupState:
    """Per-configuration queueing state of one decision (arrays of shape (K,)).

    utilisation: u_k of one group; waiting_s: W_k [s] of the exact model (:func:`waiting_model`);
    waiting_mix_s: diagnostic Kingman W with the group's own mix (``inf`` when u_k >= 1);
    arrival_scv, service_mean_s, service_scv: the inputs of that diagnostic.
    """

    utilisation: np.ndarray
    waiting_s: np.ndarray
    waiting_mix_s: np.ndarray
    arrival_scv: np.ndarray
    service_mean_s: np.ndarray
    service_scv: np.ndarray


def group_state(instance, z: np.ndarray, pi: np.ndarray, delta: np.ndarray) -> GroupState:
    """Utilisation and waiting times of each configuration's groups for a decision (z, pi, delta).

    Traffic lambda_i pi_ik is split evenly over the z_k groups.
    """
    z = np.asarray(z, dtype=float)
    pi = np.asarray(pi, dtype=float)
    d = np.asarray(delta, dtype=bool)
    lam = instance.rates
    T = np.where(d, instance.service_s[:, :, 1], instance.service_s[:, :, 0])
    V = instance.service_variance_s2
    cv2 = np.array([c.interarrival_cv**2 for c in instance.classes])
    K = instance.n_configs
    u = np.zeros(K)
    Wmix = np.zeros(K)
    ca2 = np.ones(K)
    mean = np.zeros(K)
    cs2 = np.zeros(K)
    for k in range(K):
        flow = lam * np.clip(pi[:, k], 0.0, None)
        if flow.sum() <= 0:
            continue
        if z[k] <= 0:
            u[k] = np.inf
            Wmix[k] = np.inf
            continue
        share = np.minimum(np.clip(pi[:, k], 0.0, None) / z[k], 1.0)
        rate_g = flow / z[k]
        ca2[k] = float(rate_g @ (share * cv2 + 1.0 - share) / rate_g.sum())
        mean[k], cs2[k] = mixture_service_moments(rate_g, T[:, k], V[:, k])
        u[k] = float(rate_g @ T[:, k])
        Wmix[k] = waiting_time(u[k], mean[k], cs2[k], ca2[k]) if u[k] < 1 else np.inf
    return GroupState(
        utilisation=u,
        waiting_s=waiting_model(instance, u),
        waiting_mix_s=Wmix,
        arrival_scv=ca2,
        service_mean_s=mean,
        service_scv=cs2,
    )
