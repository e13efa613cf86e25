"""Other ambiguity sets for the newsvendor of (2)-(3), and choosing the radius from data.

The paper's set (5) is a 1-Wasserstein ball (:mod:`kvdro.wasserstein`). This module adds three
classical alternatives for the same per-request cost ``Q(eta, xi) = c_p (xi - eta)^+ + c_w (eta - xi)^+``
(tokens in, cost units out), each with its worst case in closed form or by a 1-D search **and** as a
CVXPY model that agrees with it:

``"scarf"``
    Scarf's moment set: every distribution on ``[0, inf)`` with the samples' mean ``mu`` and variance
    ``sigma^2`` (no radius). Closed form (Scarf 1958, Gallego and Moon 1993); CVXPY: the moment
    problem's dual, two 2x2 semidefinite constraints (:func:`scarf_problem`).
``"kl"``
    a Kullback-Leibler ball ``KL(P || P_N) <= radius`` [nats] around the empirical distribution.
    1-D search: ``min_{alpha > 0} alpha log E_N exp(Q / alpha) + alpha radius`` (Hu and Hong 2013);
    CVXPY: the same dual with exponential cones (Clarabel) (:func:`kl_problem`).
``"ks"``
    a Kolmogorov-Smirnov band ``sup_t |F(t) - F_N(t)| <= radius`` (a probability; the DKW band) of
    distributions on ``[0, L_max]``. Closed form: a 1-D search over the CDF's level at ``eta``; the
    robust buffer interpolates two empirical quantiles (chapter 11); CVXPY: an LP over the CDF
    (:func:`ks_problem`).
``"wasserstein"``
    the paper's ball (5), delegated to :mod:`kvdro.wasserstein` (radius in tokens).

Radii from data (:func:`guarantee_radius`, :func:`bootstrap_radius`, :func:`cv_radius`,
:func:`holdout_radius`) and prompt-conditional buffers (:func:`bucket_reservations`). Lengths are
tokens; costs are per request in the units of ``c_p``, ``c_w`` (per token).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvdro import wasserstein
from kvdro.newsvendor import (
    SolverError,
    _buffer,
    _finite_scalar,
    as_samples,
    check_costs,
    critical_fractile,
    expected_cost,
    loss,
    saa_reservation,
    solve_lp,
    support_bound,
)

__all__ = [
    "SETS",
    "Buckets",
    "CVResult",
    "KSProblem",
    "KLProblem",
    "Robust",
    "ScarfProblem",
    "bootstrap_radius",
    "bucket_reservations",
    "cv_radius",
    "distance",
    "guarantee_radius",
    "holdout_radius",
    "kl_coverage",
    "kl_problem",
    "kl_worst_case_cost",
    "kl_reservation",
    "ks_problem",
    "ks_reservation",
    "ks_worst_case_cost",
    "ks_worst_case_distribution",
    "robust_solution",
    "two_point_w1_coverage",
    "scarf_problem",
    "scarf_reservation",
    "scarf_worst_case_cost",
    "worst_case_cost",
]

#: The ambiguity sets this module knows (``radius`` units: tokens, nats, probability, none).
SETS: tuple[str, ...] = ("wasserstein", "kl", "ks", "scarf")
#: Sets with a radius (Scarf's moment set has none).
RADIUS_SETS: tuple[str, ...] = ("wasserstein", "kl", "ks")
METHODS = ("closed_form", "cvxpy")


@dataclass(frozen=True)
class Robust:
    """A robust buffer ``eta`` [tokens] and its robust value (worst-case expected cost) ``value``."""

    eta: float
    value: float


# --------------------------------------------------------------------------- validation
def _radius(radius: float, name: str = "radius") -> float:
    r = _finite_scalar(radius, name)
    if r < 0:
        raise ValueError(f"{name} must be non-negative, got {radius!r}")
    return r


def _kind(kind: str) -> str:
    if kind not in SETS:
        raise ValueError(f"kind must be one of {SETS}, got {kind!r}")
    return kind


def _method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def _weights(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    values, counts = np.unique(x, return_counts=True)
    return values, counts / x.size


def _solve_conic(problem, what: str) -> float:
    """Solve an exponential-cone or semidefinite model with Clarabel at its default tolerances
    (the LP settings of :mod:`kvdro.newsvendor` are tighter than these cones reach); a model that
    ends ``optimal_inaccurate`` there is solved once more with tolerances of 1e-7 (Clarabel's default
    stopping rule can stall just short of them on a small KL radius); raise
    :class:`kvdro.errors.SolverError` with the status unless it is ``optimal``."""
    import cvxpy as cp

    try:
        with warnings.catch_warnings():  # an inaccurate first solve is handled here, not reported
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(solver="CLARABEL")
        if problem.status == cp.OPTIMAL_INACCURATE:
            problem.solve(solver="CLARABEL", tol_gap_abs=1e-7, tol_gap_rel=1e-7, tol_feas=1e-7)
    except cp.error.SolverError as exc:
        raise SolverError(what, f"solver failure: {exc}") from exc
    if problem.status != cp.OPTIMAL or not math.isfinite(float(problem.value)):
        raise SolverError(what, problem.status)
    return float(problem.value)


# =========================================================================== Scarf's moment set
def _moments(x: NDArray[np.float64]) -> tuple[float, float]:
    """Mean and second moment (population: ``ddof = 0``, the empirical distribution's own)."""
    mu = float(np.mean(x))
    m2 = float(np.mean(x * x))
    return mu, max(m2, mu * mu)


def _scarf_upper_tail(mu: float, m2: float, eta: float) -> float:
    """``sup E(xi - eta)^+`` over distributions on [0, inf) with mean ``mu``, second moment ``m2``."""
    if eta <= 0 or mu == 0:
        return mu - eta if eta <= 0 else 0.0
    var = m2 - mu * mu
    h = m2 / (2 * mu)
    if eta < h:  # two points {0, m2/mu}
        return mu - eta * mu * mu / m2
    d = eta - mu
    return 0.5 * (math.sqrt(var + d * d) - d)  # two points eta -/+ sqrt(var + d^2)


def scarf_worst_case_cost(samples: ArrayLike, eta: float, c_p: float, c_w: float) -> float:
    """Worst-case expected cost (2)+(3) at buffer ``eta`` over Scarf's moment set, closed form.

    The set: distributions on ``[0, inf)`` with the samples' mean ``mu`` and variance ``sigma^2``.
    With ``Q = (c_p + c_w)(xi - eta)^+ + c_w (eta - xi)`` the worst case is
    ``(c_p + c_w) S(eta) + c_w (eta - mu)`` with ``S`` the largest ``E(xi - eta)^+``:
    ``(sqrt(sigma^2 + (eta - mu)^2) - (eta - mu)) / 2`` for ``eta >= (mu^2 + sigma^2)/(2 mu)``, else
    ``mu - eta mu^2 / (mu^2 + sigma^2)`` (chapter 11, Scarf's theorem).
    """
    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w)
    b = _buffer(eta)
    mu, m2 = _moments(x)
    return float((c_p + c_w) * _scarf_upper_tail(mu, m2, b) + c_w * (b - mu))


def scarf_reservation(samples: ArrayLike, c_p: float, c_w: float) -> Robust:
    """Scarf's robust buffer and value: ``mu + (sigma/2)(sqrt(rho) - 1/sqrt(rho))`` with value
    ``sigma sqrt(c_p c_w)`` if ``sigma^2 < rho mu^2``; otherwise reserve 0 (value ``c_p mu``)."""
    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w, positive=True)
    mu, m2 = _moments(x)
    var = m2 - mu * mu
    rho = c_p / c_w
    if var >= rho * mu * mu:  # the slope at 0 is >= 0: reserving nothing is robust
        return Robust(eta=0.0, value=float(c_p * mu))
    sigma = math.sqrt(var)
    eta = mu + 0.5 * sigma * (math.sqrt(rho) - 1 / math.sqrt(rho))
    return Robust(eta=float(eta), value=float(sigma * math.sqrt(c_p * c_w)))


class ScarfProblem(NamedTuple):
    """The dual of Scarf's moment problem: ``min a + b mu + c m2`` with ``a + b xi + c xi^2 >= Q``
    on ``[0, inf)`` (lengths in units of ``scale`` tokens); ``eta`` a number or a Variable."""

    problem: object
    eta: object
    scale: float


def scarf_problem(samples: ArrayLike, eta: float | None, c_p: float, c_w: float) -> ScarfProblem:
    """Build Scarf's worst case (``eta`` given) or robust buffer (``eta=None``) as an SDP.

    Each of the two lines ``l(xi)`` of the loss must lie below the quadratic ``a + b xi + c xi^2``
    on ``[0, inf)``; by Lukacs' theorem that is ``q - l = [1 xi] S [1 xi]^T + t xi`` with ``S`` a
    positive semidefinite 2x2 matrix and ``t >= 0``. Lengths are divided by ``scale`` (the root of
    the second moment) so that the solver sees numbers of order one; the value is rescaled.
    """
    import cvxpy as cp

    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w)
    mu, m2 = _moments(x)
    if m2 - mu * mu <= 1e-9 * m2 or mu <= 0:
        raise ValueError("samples must have a positive mean and variance for the moment SDP "
                         "(with one value the set is a single point; use scarf_worst_case_cost)")
    scale = math.sqrt(m2)
    mu_s, m2_s = mu / scale, m2 / scale**2
    if eta is None:
        e = cp.Variable(name="eta", nonneg=True)
    else:
        e = _buffer(eta) / scale
    a, b, c = cp.Variable(name="a"), cp.Variable(name="b"), cp.Variable(name="c")
    constraints = []
    for alpha, beta in ((-c_p * e, c_p), (c_w * e, -c_w)):  # c_p (xi - eta) and c_w (eta - xi)
        S = cp.Variable((2, 2), PSD=True)
        t = cp.Variable(nonneg=True)
        constraints += [a - alpha == S[0, 0], b - beta == 2 * S[0, 1] + t, c == S[1, 1]]
    problem = cp.Problem(cp.Minimize(scale * (a + b * mu_s + c * m2_s)), constraints)
    return ScarfProblem(problem, e, scale)


# =========================================================================== KL ball
def _logsumexp(z: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    top = float(z.max())
    return top + math.log(float(w @ np.exp(z - top)))


def _kl_tilt(q: NDArray[np.float64], w: NDArray[np.float64], alpha: float) -> tuple[float, float]:
    """(KL of the tilt ``w exp(q/alpha)`` from ``w``, the dual value without ``alpha radius``)."""
    z = q / alpha
    lse = _logsumexp(z, w)
    tilt = w * np.exp(z - lse)
    kl = float(tilt @ (z - lse))
    return max(kl, 0.0), alpha * lse


def _kl_value(q: NDArray[np.float64], w: NDArray[np.float64], radius: float) -> float:
    """``sup {E_P q : KL(P || w) <= radius}`` by the 1-D dual in ``alpha`` (a root of KL = radius)."""
    from scipy.optimize import brentq

    top = float(q.max())
    spread = top - float(q.min())
    if radius == 0 or spread == 0:
        return float(w @ q)
    p_top = float(w[q >= top].sum())
    if radius >= -math.log(p_top):  # the whole mass fits on the worst atoms
        return top
    qs = (q - top) / spread  # in [-1, 0]: alpha in units of the spread
    lo, hi = 1e-9, 1.0
    while _kl_tilt(qs, w, hi)[0] > radius:
        hi *= 10.0
    while _kl_tilt(qs, w, lo)[0] < radius:
        lo /= 10.0
        if lo < 1e-300:  # numerically at the top
            return top
    u = brentq(lambda s: _kl_tilt(qs, w, math.exp(s))[0] - radius, math.log(lo), math.log(hi), xtol=1e-13, rtol=1e-13)
    alpha = math.exp(u)
    value = _kl_tilt(qs, w, alpha)[1] + alpha * radius
    return float(top + spread * value)


def kl_worst_case_cost(samples: ArrayLike, eta: float, c_p: float, c_w: float, radius: float) -> float:
    """Worst-case expected cost at ``eta`` over ``{P : KL(P || P_N) <= radius}`` (radius in nats).

    Equal to ``min_{alpha > 0} alpha log E_N[exp(Q/alpha)] + alpha radius``; the minimiser is the
    ``alpha`` at which the exponential tilt ``P_alpha ~ P_N exp(Q/alpha)`` has ``KL = radius``, found
    by a root search in ``log alpha``. Once ``radius >= -log P_N(Q = max Q)`` all the mass fits on
    the worst samples and the value is ``max_n Q(eta, xi_n)``: a KL ball never leaves the samples.
    """
    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w)
    b = _buffer(eta)
    r = _radius(radius)
    values, w = _weights(x)
    return _kl_value(loss(values, b, c_p, c_w), w, r)


class KLProblem(NamedTuple):
    """The KL dual with exponential cones; ``eta`` a number or a Variable; costs divided by ``scale``."""

    problem: object
    eta: object
    alpha: object
    scale: float


def kl_problem(samples: ArrayLike, eta: float | None, c_p: float, c_w: float, radius: float) -> KLProblem:
    """Build the KL worst case (``eta`` given) or the KL-robust buffer (``eta=None``) in CVXPY.

        min  t + alpha radius
        s.t. sum_n w_n v_n <= alpha,   (theta_n - t, alpha, v_n) in K_exp   (alpha exp((theta_n - t)/alpha) <= v_n)
             theta_n >= c_p (xi_n - eta),  theta_n >= c_w (eta - xi_n),  alpha >= 0

    i.e. ``t >= alpha log sum_n w_n exp(theta_n / alpha)``. Lengths are divided by ``scale`` (the
    largest sample) so that the cones see numbers of order one; the value is rescaled.
    """
    import cvxpy as cp

    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w)
    r = _radius(radius)
    values, w = _weights(x)
    scale = max(float(values.max()), 1.0)
    v_s = values / scale
    e = cp.Variable(name="eta", nonneg=True) if eta is None else _buffer(eta) / scale
    t = cp.Variable(name="t")
    alpha = cp.Variable(name="alpha", nonneg=True)
    theta = cp.Variable(values.size, name="theta")
    v = cp.Variable(values.size, name="v", nonneg=True)
    constraints = [
        theta >= c_p * (v_s - e),
        theta >= c_w * (e - v_s),
        cp.constraints.ExpCone(theta - t, alpha * np.ones(values.size), v),
        w @ v <= alpha,
    ]
    problem = cp.Problem(cp.Minimize(scale * (t + alpha * r)), constraints)
    return KLProblem(problem, e, alpha, scale)


def kl_reservation(samples: ArrayLike, c_p: float, c_w: float, radius: float) -> Robust:
    """The KL-robust buffer: the minimum of the convex ``eta -> kl_worst_case_cost`` by a bounded
    1-D search over ``[min xi, max xi]`` (outside it the worst case only grows)."""
    from scipy.optimize import minimize_scalar

    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w, positive=True)
    r = _radius(radius)
    values, w = _weights(x)
    if r == 0 or values.size == 1:
        eta = saa_reservation(x, c_p, c_w)
        return Robust(eta=eta, value=expected_cost(x, eta, c_p, c_w))

    def f(b: float) -> float:
        return _kl_value(loss(values, b, c_p, c_w), w, r)

    lo, hi = float(values.min()), float(values.max())
    res = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7 * max(hi, 1.0)})
    best = min([(float(res.fun), float(res.x)), (f(lo), lo), (f(hi), hi)])
    return Robust(eta=best[1], value=best[0])


# =========================================================================== KS / DKW band
def _ks_pieces(x: NDArray[np.float64], eta: float, L: float):
    """Breakpoints 0 = T_0 < ... < T_K = L (samples, eta inside), ECDF on each piece, lengths, and
    which pieces lie below ``eta``."""
    values, w = _weights(x)
    pts = [0.0, L, *values.tolist()]
    if 0.0 < eta < L:
        pts.append(eta)
    T = np.unique(np.asarray(pts))
    cdf = np.concatenate([[0.0], np.cumsum(w)])[np.searchsorted(values, T[:-1], side="right")]
    length = np.diff(T)
    below = T[1:] <= eta
    return T, np.minimum(cdf, 1.0), length, below


def _ks_inputs(samples, c_p, c_w, radius, L_max):
    L = support_bound(L_max)
    x = as_samples(samples, L)
    c_p, c_w = check_costs(c_p, c_w)
    return x, c_p, c_w, _radius(radius), L


def _ks_value(F: NDArray[np.float64], length, below, eta: float, c_p: float, c_w: float, L: float):
    """``E Q = Q(0) + int_0^L Q'(t) (1 - F(t)) dt`` for CDF values ``F`` on the pieces (any shape
    ``(..., K)``)."""
    slope = np.where(below, -c_w, c_p)
    return float(loss(0.0, eta, c_p, c_w)) + ((1.0 - F) * slope * length).sum(axis=-1)


def _ks_level_range(x, eta, delta):
    below_eta = float(np.mean(x < eta))
    at_eta = float(np.mean(x <= eta))
    return max(below_eta - delta, 0.0), min(at_eta + delta, 1.0)


def ks_worst_case_cost(samples: ArrayLike, eta: float, c_p: float, c_w: float, radius: float, L_max: float) -> float:
    """Worst-case expected cost at ``eta`` over CDFs on ``[0, L_max]`` within ``radius`` of the ECDF.

    Chapter 11's theorem: a worst case is ``F_q = min(F_N + radius, q)`` below ``eta`` and
    ``max(F_N - radius, q)`` from ``eta`` on, for a level ``q`` in
    ``[F_N(eta-) - radius, F_N(eta) + radius]``; the value is concave and piecewise linear in ``q``,
    so the best level is an end of that range or a kink ``F_N +/- radius`` of one piece.
    """
    x, c_p, c_w, d, L = _ks_inputs(samples, c_p, c_w, radius, L_max)
    b = _buffer(eta)
    F = _ks_worst_cdf(x, b, c_p, c_w, d, L)[1]
    T, cdf, length, below = _ks_pieces(x, b, L)
    return float(_ks_value(F, length, below, b, c_p, c_w, L))


def _ks_worst_cdf(x, b, c_p, c_w, d, L):
    T, cdf, length, below = _ks_pieces(x, b, L)
    up = np.minimum(cdf + d, 1.0)
    down = np.maximum(cdf - d, 0.0)
    lo, hi = _ks_level_range(x, b, d)
    q = c_p / (c_p + c_w) if c_p + c_w > 0 else 0.5
    cand = np.unique(np.clip(np.concatenate([[lo, hi, q], up[below], down[~below]]), lo, hi))
    F = np.where(below[None, :], np.minimum(up[None, :], cand[:, None]), np.maximum(down[None, :], cand[:, None]))
    vals = _ks_value(F, length, below, b, c_p, c_w, L)
    # among (numerically) tied worst cases take the level closest to q*: at the robust buffer that
    # one is the saddle point of chapter 11's theorem
    tied = np.flatnonzero(vals >= vals.max() - 1e-12 * max(1.0, abs(vals.max())))
    k = int(tied[np.argmin(np.abs(cand[tied] - q))])
    return T, F[k]


def ks_worst_case_distribution(
    samples: ArrayLike, eta: float, c_p: float, c_w: float, radius: float, L_max: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """A worst-case distribution of the KS band at ``eta``: ``(atoms, probs)`` (tokens), the jumps of
    the worst CDF ``F_q`` (mass at 0, at the samples, at ``eta`` and at ``L_max``)."""
    x, c_p, c_w, d, L = _ks_inputs(samples, c_p, c_w, radius, L_max)
    b = _buffer(eta)
    T, F = _ks_worst_cdf(x, b, c_p, c_w, d, L)
    probs = np.diff(np.concatenate([[0.0], F, [1.0]]))
    keep = probs > 1e-15
    return T[keep], probs[keep]


def ks_reservation(samples: ArrayLike, c_p: float, c_w: float, radius: float, L_max: float) -> Robust:
    """The KS-robust buffer in closed form: ``(1 - q*) a + q* b`` with ``a = inf{t : F_N(t) > q* - radius}``
    (0 if ``q* - radius < 0``) and ``b = inf{t : F_N(t) >= q* + radius}`` (``L_max`` if ``q* + radius > 1``),
    ``q* = rho/(rho+1)`` (chapter 11: a saddle point whose worst CDF crosses ``q*`` at the buffer)."""
    x, c_p, c_w, d, L = _ks_inputs(samples, c_p, c_w, radius, L_max)
    check_costs(c_p, c_w, positive=True)
    q = critical_fractile(c_p / c_w)
    s = np.sort(x)
    n = s.size
    lower, upper = q - d, q + d
    a = 0.0 if lower < 0 else float(s[min(int(math.floor(n * lower + 1e-9)), n - 1)])
    b = L if upper > 1 + 1e-12 else float(s[max(int(math.ceil(n * upper - 1e-9)) - 1, 0)])
    eta = (1 - q) * a + q * b
    return Robust(eta=float(eta), value=ks_worst_case_cost(x, eta, c_p, c_w, d, L))


class KSProblem(NamedTuple):
    """The KS worst case as an LP over the CDF value on each piece between breakpoints."""

    problem: object
    F: object
    breakpoints: NDArray[np.float64]


def ks_problem(samples: ArrayLike, eta: float, c_p: float, c_w: float, radius: float, L_max: float) -> KSProblem:
    """Build ``max E_F Q(eta, xi)`` over CDFs ``F`` on ``[0, L_max]`` with ``|F - F_N| <= radius``.

    ``F`` is constant between consecutive breakpoints (0, the samples, ``eta``, ``L_max``; a worst
    case needs no others), non-decreasing and in ``[0, 1]``; the objective is
    ``Q(0) + sum_k Q'_k (1 - F_k) length_k``, linear in ``F``.
    """
    import cvxpy as cp

    x, c_p, c_w, d, L = _ks_inputs(samples, c_p, c_w, radius, L_max)
    b = _buffer(eta)
    T, cdf, length, below = _ks_pieces(x, b, L)
    scale = max(L, 1.0)
    F = cp.Variable(cdf.size, name="F")
    slope = np.where(below, -c_w, c_p)
    constraints = [F >= cdf - d, F <= cdf + d, F >= 0, F <= 1]
    if cdf.size > 1:
        constraints.append(cp.diff(F) >= 0)
    objective = float(loss(0.0, b, c_p, c_w)) / scale + (slope * length / scale) @ (1 - F)
    problem = cp.Problem(cp.Maximize(scale * objective), constraints)
    return KSProblem(problem, F, T)


# =========================================================================== one interface
def worst_case_cost(
    kind: str,
    samples: ArrayLike,
    eta: float,
    c_p: float,
    c_w: float,
    radius: float | None,
    L_max: float | None = None,
    *,
    method: str = "closed_form",
) -> float:
    """Worst-case expected cost of buffer ``eta`` over the set ``kind`` (:data:`SETS`).

    ``radius``: tokens (``wasserstein``), nats (``kl``), probability (``ks``), ignored (``scarf``).
    ``L_max`` is the support bound of ``wasserstein`` and ``ks``. ``method="cvxpy"`` solves the
    set's CVXPY model (Clarabel) instead of the closed form / 1-D search.
    """
    _kind(kind)
    _method(method)
    if kind == "scarf":
        if method == "closed_form":
            return scarf_worst_case_cost(samples, eta, c_p, c_w)
        return _solve_conic(scarf_problem(samples, eta, c_p, c_w).problem, "Scarf moment SDP")
    if radius is None:
        raise ValueError(f"radius must be given for the {kind!r} set")
    if kind == "kl":
        if method == "closed_form":
            return kl_worst_case_cost(samples, eta, c_p, c_w, radius)
        return _solve_conic(kl_problem(samples, eta, c_p, c_w, radius).problem, "KL exponential-cone model")
    if L_max is None:
        raise ValueError(f"L_max must be given for the {kind!r} set")
    if kind == "ks":
        if method == "closed_form":
            return ks_worst_case_cost(samples, eta, c_p, c_w, radius, L_max)
        return solve_lp(ks_problem(samples, eta, c_p, c_w, radius, L_max).problem, "KS band LP")
    return wasserstein.worst_case_cost(samples, eta, c_p, c_w, _radius(radius), L_max,
                                       method="closed_form" if method == "closed_form" else "dual_lp")


def robust_solution(
    kind: str,
    samples: ArrayLike,
    c_p: float,
    c_w: float,
    radius: float | None,
    L_max: float | None = None,
    *,
    method: str = "closed_form",
) -> Robust:
    """The robust buffer and value ``min_eta max_P E_P Q`` for the set ``kind`` (:data:`SETS`).

    ``method="cvxpy"`` solves the joint model (``eta`` a variable) for ``scarf``, ``kl`` and
    ``wasserstein`` (the LP (8c)-(8g)); for ``ks`` the buffer is the closed form and only its value is
    re-computed by the LP.
    """
    _kind(kind)
    _method(method)
    if kind == "scarf":
        if method == "closed_form":
            return scarf_reservation(samples, c_p, c_w)
        model = scarf_problem(samples, None, c_p, c_w)
        value = _solve_conic(model.problem, "Scarf moment SDP")
        return Robust(eta=max(0.0, float(model.eta.value)) * model.scale, value=value)
    if radius is None:
        raise ValueError(f"radius must be given for the {kind!r} set")
    if kind == "kl":
        if method == "closed_form":
            return kl_reservation(samples, c_p, c_w, radius)
        check_costs(c_p, c_w, positive=True)
        model = kl_problem(samples, None, c_p, c_w, radius)
        value = _solve_conic(model.problem, "KL exponential-cone model")
        return Robust(eta=max(0.0, float(model.eta.value)) * model.scale, value=value)
    if L_max is None:
        raise ValueError(f"L_max must be given for the {kind!r} set")
    if kind == "ks":
        sol = ks_reservation(samples, c_p, c_w, radius, L_max)
        if method == "cvxpy":
            return Robust(sol.eta, solve_lp(ks_problem(samples, sol.eta, c_p, c_w, radius, L_max).problem, "KS band LP"))
        return sol
    sol = wasserstein.dro_solution(samples, c_p, c_w, _radius(radius), L_max, method="closed_form" if method == "closed_form" else "lp")
    return Robust(eta=sol.eta, value=sol.cost)


# =========================================================================== radii from data
def _count(n: int, name: str = "n") -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)


def _beta(beta: float) -> float:
    b = _finite_scalar(beta, "beta")
    if not 0 < b < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta!r}")
    return b


def guarantee_radius(kind: str, n: int, beta: float, L_max: float | None = None) -> float:
    """A radius whose ball contains the true distribution with probability >= ``1 - beta`` (i.i.d.).

    * ``ks``: the DKW inequality with Massart's constant, ``P(sup|F_N - F| > d) <= 2 exp(-2 n d^2)``:
      ``d = sqrt(log(2/beta) / (2 n))`` (exact for every ``n``).
    * ``wasserstein``: on ``[0, L_max]``, ``W_1(P, P_N) = int |F_N - F| <= L_max sup|F_N - F|``, so
      the DKW-Massart inequality gives ``P(W_1 >= eps) <= 2 exp(-2 n eps^2 / L_max^2)``, i.e.
      ``eps = L_max sqrt(log(2/beta) / (2 n))``. This is a bound of the *form* of Mohajerin Esfahani
      and Kuhn's (2018) light-tailed ``c_1 exp(-c_2 n eps^2)`` (one dimension), derived from DKW, not
      their theorem's constants. It is conservative (``W_1 <= L_max sup|F_N - F|`` is loose: at
      ``beta = 0.1`` the measured coverage is above 98 %, not 90 %), and ``L_max`` must be fixed
      before the data are seen (a bound read off the same samples voids the guarantee).
    * ``kl``: the asymptotic (``n -> inf``) calibration of a KL ball for one expectation,
      ``chi2_{1, 1-2 beta} / (2 n)`` [nats] (Duchi, Glynn and Namkoong 2021): the robust value is
      then a one-sided upper confidence bound of level ``1 - beta`` (the quantile ``chi2_{1, 1-beta}``
      would give a two-sided interval, one-sided level ``1 - beta/2``); needs ``beta < 1/2``. Not a
      finite-sample guarantee (a KL ball around ``P_N`` never contains a continuous ``P``).
    """
    _kind(kind)
    k = _count(n)
    b = _beta(beta)
    if kind == "scarf":
        raise ValueError("kind 'scarf' has no radius")
    if kind == "kl":
        from scipy.stats import chi2

        if not b < 0.5:
            raise ValueError(f"beta must be in (0, 0.5) for the 'kl' radius (one-sided level 1 - beta), got {beta!r}")
        return float(chi2.ppf(1 - 2 * b, 1) / (2 * k))
    d = math.sqrt(math.log(2 / b) / (2 * k))
    if kind == "ks":
        return d
    if L_max is None:
        raise ValueError("L_max must be given for the 'wasserstein' radius")
    return support_bound(L_max) * d


def two_point_w1_coverage(n: int, beta: float) -> tuple[float, float]:
    """The lowest exact coverage of the W1 guarantee ball over two-point laws, and where it is reached.

    For ``P`` with mass ``p`` at ``L_max`` and ``1 - p`` at 0, ``W_1(P, P_N) = L_max |K/n - p|`` with
    ``K ~ Binomial(n, p)``, so the coverage of :func:`guarantee_radius` (``"wasserstein"``) is
    ``P(|K/n - p| <= d)``, ``d = sqrt(log(2/beta) / (2 n))``, exactly and whatever ``L_max``. It jumps
    where ``p`` crosses ``k/n +- d``; the infimum over ``p`` is approached there, so the function
    evaluates just past every such point (and on a grid). Returns ``(coverage, p)``. This shows that
    the ``>= 1 - beta`` guarantee is the floor, and that Uniform(0, L)'s measured coverage is not
    (two-point laws reach lower).
    """
    from scipy.stats import binom

    k_n = _count(n)
    b = _beta(beta)
    d = math.sqrt(math.log(2 / b) / (2 * k_n))
    k = np.arange(k_n + 1)
    tiny = 1e-9
    p = np.concatenate([k / k_n + d + tiny, k / k_n - d - tiny, np.linspace(0.0005, 0.9995, 2000)])
    p = p[(p > 0) & (p < 1)]
    pmf = binom.pmf(k[None, :], k_n, p[:, None])  # (points, outcomes)
    cover = np.where(np.abs(k[None, :] / k_n - p[:, None]) <= d, pmf, 0.0).sum(axis=1)
    i = int(np.argmin(cover))
    return float(cover[i]), float(p[i])


def kl_coverage(
    population: ArrayLike, n: int, beta: float, c_p: float, c_w: float, *, trials: int, rng: np.random.Generator
) -> float:
    """Monte-Carlo coverage of the KL radius ``chi2_{1, 1-2 beta} / (2 n)`` at a finite ``n``.

    Each trial draws ``n`` i.i.d. outputs [tokens] from ``population`` (its empirical law is the truth),
    takes the sample's SAA buffer and asks whether the KL-robust value at :func:`guarantee_radius`
    (``"kl"``) is at least the true expected cost of that buffer. Returns the share of trials where it
    is; the calibration is asymptotic, so at small ``n`` this falls short of ``1 - beta``.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    try:
        pop = as_samples(population)
    except ValueError as exc:
        raise ValueError(f"population: {exc}") from None
    c_p, c_w = check_costs(c_p, c_w)
    t = _count(trials, "trials")
    radius = guarantee_radius("kl", n, beta)
    hits = 0
    for _ in range(t):
        x = rng.choice(pop, int(n))
        eta = saa_reservation(x, c_p, c_w)
        hits += kl_worst_case_cost(x, eta, c_p, c_w, radius) >= expected_cost(pop, eta, c_p, c_w)
    return hits / t


def distance(kind: str, a: ArrayLike, b: ArrayLike) -> float:
    """Distance of the empirical distribution of ``a`` from that of ``b`` in the set's own measure:
    ``W_1`` [tokens], ``KL(P_a || P_b)`` [nats; inf unless a's values all occur in b] or
    ``sup |F_a - F_b|``."""
    _kind(kind)
    x, y = as_samples(a), as_samples(b)
    if kind == "scarf":
        raise ValueError("kind 'scarf' has no distance")
    grid = np.unique(np.concatenate([x, y]))
    fa = np.searchsorted(np.sort(x), grid, side="right") / x.size
    fb = np.searchsorted(np.sort(y), grid, side="right") / y.size
    if kind == "wasserstein":
        return float(np.sum(np.abs(fa - fb)[:-1] * np.diff(grid)))
    if kind == "ks":
        return float(np.max(np.abs(fa - fb)))
    pa = np.diff(np.concatenate([[0.0], fa]))
    pb = np.diff(np.concatenate([[0.0], fb]))
    if np.any((pa > 0) & (pb == 0)):
        return math.inf
    m = pa > 0
    return float(np.sum(pa[m] * np.log(pa[m] / pb[m])))


def _block_resample(x: NDArray[np.float64], block: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """A moving-block bootstrap resample of a time-ordered series (block 1 = i.i.d. bootstrap)."""
    n = x.size
    k = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=k)
    idx = (starts[:, None] + np.arange(block)[None, :]).ravel()[:n]
    return x[idx]


def bootstrap_radius(
    kind: str,
    samples: ArrayLike,
    beta: float,
    rng: np.random.Generator,
    *,
    n_boot: int = 200,
    block: int = 1,
) -> float:
    """The ``1 - beta`` quantile of ``distance(kind, resample, samples)`` over ``n_boot`` bootstrap
    resamples: the radius at which a ball around a resample contains the data ``1 - beta`` of the
    time, the bootstrap stand-in for "contains the truth". ``block > 1``: moving blocks of that many
    consecutive samples (time-ordered ``samples``), which keeps short-range dependence."""
    _kind(kind)
    x = as_samples(samples)
    b = _beta(beta)
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a seeded numpy.random.Generator")
    nb = _count(n_boot, "n_boot")
    blk = _count(block, "block")
    if blk > x.size:
        raise ValueError(f"block must be at most the number of samples ({x.size}), got {block!r}")
    d = np.array([distance(kind, _block_resample(x, blk, rng), x) for _ in range(nb)])
    return float(np.quantile(d, 1 - b))


class CVResult(NamedTuple):
    """A radius chosen by validation: the best ``radius``, the grid and its mean validation cost."""

    radius: float
    radii: NDArray[np.float64]
    cost: NDArray[np.float64]


def _validate_radii(radii: ArrayLike) -> NDArray[np.float64]:
    r = np.asarray(radii, dtype=float).ravel()
    if r.size == 0 or not np.all(np.isfinite(r)) or np.any(r < 0):
        raise ValueError("radii must be a non-empty array of non-negative finite numbers")
    return r


def _split_cost(kind, fit, check, c_p, c_w, radii, L_max):
    out = np.empty(radii.size)
    for j, r in enumerate(radii):
        eta = robust_solution(kind, fit, c_p, c_w, float(r), L_max).eta
        out[j] = expected_cost(check, eta, c_p, c_w)
    return out


def _validation_inputs(kind: str, samples: ArrayLike, c_p: float, c_w: float, radii: ArrayLike):
    """The checked (samples, radii) of a validation rule (ValueError naming the bad argument)."""
    _kind(kind)
    x = as_samples(samples)
    check_costs(c_p, c_w, positive=True)
    return x, _validate_radii(radii)


def _least_cost(radii: NDArray[np.float64], cost: NDArray[np.float64]) -> CVResult:
    """The radius of least validation cost; ties (to 1e-12 relative) go to the smaller radius."""
    best = int(np.flatnonzero(cost <= cost.min() * (1 + 1e-12))[0])
    return CVResult(float(radii[best]), radii, cost)


def cv_radius(
    kind: str,
    samples: ArrayLike,
    c_p: float,
    c_w: float,
    radii: ArrayLike,
    L_max: float | None = None,
    *,
    n_folds: int = 4,
) -> CVResult:
    """Time-series cross-validation of the radius on time-ordered ``samples``.

    The series is cut into ``n_folds + 1`` consecutive chunks; for ``k = 1..n_folds`` the buffer is
    fitted on chunks ``0..k-1`` (an expanding window) and its cost (2)+(3) measured on chunk ``k``.
    The radius of least mean validation cost (weighted by chunk size) wins; ties go to the smaller
    radius. Never fits on the future.
    """
    x, r = _validation_inputs(kind, samples, c_p, c_w, radii)
    k = _count(n_folds, "n_folds")
    if x.size < 2 * (k + 1):
        raise ValueError(f"samples must hold at least {2 * (k + 1)} values for {k} folds, got {x.size}")
    edges = np.linspace(0, x.size, k + 2).astype(int)
    total, weight = np.zeros(r.size), 0
    for j in range(1, k + 1):
        fit, check = x[: edges[j]], x[edges[j] : edges[j + 1]]
        total += check.size * _split_cost(kind, fit, check, c_p, c_w, r, L_max)
        weight += check.size
    return _least_cost(r, total / weight)


def holdout_radius(
    kind: str,
    samples: ArrayLike,
    c_p: float,
    c_w: float,
    radii: ArrayLike,
    L_max: float | None = None,
    *,
    fraction: float = 0.7,
) -> CVResult:
    """Hold-out validation: fit on the first ``fraction`` of the time-ordered ``samples``, validate
    on the rest; the radius of least validation cost (ties: the smaller)."""
    x, r = _validation_inputs(kind, samples, c_p, c_w, radii)
    f = _finite_scalar(fraction, "fraction")
    cut = int(round(f * x.size))
    if not 0 < f < 1 or cut < 1 or cut >= x.size:
        raise ValueError(f"fraction must leave samples on both sides, got {fraction!r}")
    return _least_cost(r, _split_cost(kind, x[:cut], x[cut:], c_p, c_w, r, L_max))


# =========================================================================== context
@dataclass(frozen=True)
class Buckets:
    """Prompt-length bins ``edges`` [tokens] (``len(buffers) + 1`` of them, outer ones infinite) and
    one robust buffer per bin [tokens]."""

    edges: NDArray[np.float64]
    buffers: NDArray[np.float64]

    def buffer_for(self, input_tokens: ArrayLike) -> NDArray[np.float64]:
        """The buffer of each request, by the bin its prompt length falls in."""
        L = np.asarray(input_tokens, dtype=float)
        if not np.all(np.isfinite(L)) or np.any(L < 0):
            raise ValueError("input_tokens must be non-negative finite prompt lengths")
        return self.buffers[np.clip(np.searchsorted(self.edges, L, side="right") - 1, 0, self.buffers.size - 1)]


def bucket_reservations(
    kind: str,
    input_tokens: ArrayLike,
    output_tokens: ArrayLike,
    c_p: float,
    c_w: float,
    radius: float | None,
    L_max: float | None = None,
    *,
    n_bins: int = 4,
) -> Buckets:
    """Robust buffers conditional on the prompt: cut the training prompts into ``n_bins`` bins of
    (about) equal count at their quantiles and solve the set ``kind`` on each bin's outputs.

    ``radius`` is the same for every bin; a radius that should shrink like ``1/sqrt(N)`` with the bin's
    sample count is the caller's choice (pass the per-bin radius through ``kind``'s own rule).
    """
    _kind(kind)
    L = np.asarray(input_tokens, dtype=float)
    y = as_samples(output_tokens)
    if L.shape != y.shape or not np.all(np.isfinite(L)) or np.any(L < 0):
        raise ValueError("input_tokens must be non-negative finite prompt lengths, one per output")
    k = _count(n_bins, "n_bins")
    inner = np.unique(np.quantile(L, np.linspace(0, 1, k + 1)[1:-1], method="inverted_cdf"))
    inner = inner[inner > L.min()]  # an edge at the smallest prompt would leave its bin empty
    edges = np.concatenate([[-np.inf], inner, [np.inf]])
    bins = np.searchsorted(edges, L, side="right") - 1
    buffers = [robust_solution(kind, y[bins == j], c_p, c_w, radius, L_max).eta for j in range(edges.size - 1)]
    return Buckets(edges=edges, buffers=np.asarray(buffers))
