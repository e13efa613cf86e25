"""The 1-Wasserstein worst case of the newsvendor loss: ambiguity set (5), reformulation (8c)-(8g).

For a buffer ``eta`` (tokens) the *worst-case expected cost* is

    WC(eta) = sup { E_P[loss(xi, eta)] : W_1(P, P_N) <= eps, P supported on [0, L_max] }

with ``P_N`` the empirical distribution of the samples, ``eps`` the radius (tokens: the mean
distance mass may travel) and ``loss`` the cost (2)+(3). Three ways to compute it, which agree:

``"closed_form"``
    exact, no solver. The inner maximum of the dual lives at 0, the sample, or ``L_max``, so the
    primal is a fractional (multiple-choice) knapsack: each sample may send its mass to ``L_max``
    or to 0; spend the transport budget ``eps`` on the moves with the highest gain per token moved.
    Vectorised over many buffers by :func:`worst_case_cost_many`.
``"dual_lp"``
    the finite reformulation (8c)-(8g) with ``eta`` fixed, in CVXPY (Clarabel): :func:`dual_problem`.
``"primal_lp"``
    the worst case itself as a transport LP that moves the samples' mass over a grid of the support
    (an independent check of the duality): :func:`primal_problem`.

The robust buffer ``argmin_eta WC(eta)`` (:func:`dro_reservation`) is exact too: for a fixed
multiplier ``gamma`` the dual objective is an SAA cost of affinely moved samples, so the optimal
``gamma`` is one of ``{max(c_p, c_w), min(c_p, c_w), 0}`` and the robust buffer one of three
closed-form values (:func:`regime_lines`). The joint LP over ``(eta, gamma, theta)``
(:func:`dro_problem`) checks it. All lengths are tokens; costs are per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvdro.newsvendor import (
    BUFFER_ROUNDOFF,
    _buffer,
    _finite_scalar,
    _real_array,
    as_samples,
    check_costs,
    expected_cost,
    loss,
    saa_reservation,
    solve_lp,
    support_bound,
)

if TYPE_CHECKING:  # CVXPY is imported where a model is built: `import kvdro.sim` stays light
    import cvxpy as cp

__all__ = [
    "DROProblem",
    "DualProblem",
    "PrimalProblem",
    "BufferPiece",
    "RegimeLine",
    "RobustBuffer",
    "SaddlePoint",
    "dro_problem",
    "dro_reservation",
    "dro_solution",
    "dual_problem",
    "primal_problem",
    "regime_lines",
    "robust_buffer_path",
    "saa_threshold_radius",
    "saddle_distribution",
    "transport_room",
    "worst_case_cost",
    "worst_case_cost_many",
    "worst_case_distribution",
]

METHODS = ("closed_form", "dual_lp", "primal_lp")
_CHUNK = 400_000  # buffers x distinct samples per vectorised block (bounds memory to ~100 MB)


# --------------------------------------------------------------------------- inputs
def _inputs(samples: ArrayLike, c_p: float, c_w: float, eps: float, L_max: float, *, merge: bool = True):
    """Validate; return (values, their probabilities, c_p, c_w, eps, L_max).

    With ``merge`` equal samples are merged into one value weighted by its frequency (exact for
    every formula here, and much smaller for integer token counts); without, each sample has 1/N.
    """
    L = support_bound(L_max)  # required here: the ball (5) lives on [0, L_max]
    x = as_samples(samples, L)
    c_p, c_w = check_costs(c_p, c_w)
    e = _finite_scalar(eps, "eps")
    if e < 0:
        raise ValueError(f"eps must be non-negative, got {eps!r}")
    if not merge:
        return x, np.full(x.size, 1.0 / x.size), c_p, c_w, e, L
    values, counts = np.unique(x, return_counts=True)
    return values, counts / x.size, c_p, c_w, e, L


def _eta(eta: float) -> float:
    return _buffer(eta)


# --------------------------------------------------------------------------- closed form
def _segments(values, weights, etas, c_p, c_w, L):
    """Knapsack segments of every distinct sample for every buffer.

    Each sample may move its mass to ``L`` (option A: transport ``L - x``, gain ``loss(L)-loss(x)``)
    or to 0 (option B: transport ``x``, gain ``loss(0)-loss(x)``), or stay. The upper concave hull
    of {stay, A, B} in the (transport, gain) plane has at most two segments: first to the option of
    larger gain per token, then possibly on to the other. Returns, each of shape (E, 2U):
    slopes (gain per token of transport; -inf when unused), transport per segment (weighted by the
    sample's probability), and for bookkeeping whether A is the first option (shape (E, U)).
    """
    lx = loss(values[None, :], etas[:, None], c_p, c_w)
    l0 = loss(0.0, etas, c_p, c_w)[:, None]
    lL = loss(L, etas, c_p, c_w)[:, None]
    cA = np.broadcast_to(L - values, lx.shape)
    cB = np.broadcast_to(values, lx.shape)
    gA, gB = lL - lx, l0 - lx
    with np.errstate(divide="ignore", invalid="ignore"):
        sA = np.where(cA > 0, gA / np.where(cA > 0, cA, 1.0), -np.inf)
        sB = np.where(cB > 0, gB / np.where(cB > 0, cB, 1.0), -np.inf)
    a_first = (sA > sB) | ((sA == sB) & (cA >= cB))
    s1 = np.where(a_first, sA, sB)
    c1 = np.where(a_first, cA, cB)
    g1 = np.where(a_first, gA, gB)
    cY = np.where(a_first, cB, cA)
    gY = np.where(a_first, gB, gA)
    use1 = s1 > 0
    use2 = use1 & (cY > c1) & (gY > g1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(use2, (gY - g1) / np.where(use2, cY - c1, 1.0), -np.inf)
    s1 = np.where(use1, s1, -np.inf)
    t1 = np.where(use1, c1, 0.0) * weights
    t2 = np.where(use2, cY - c1, 0.0) * weights
    saa = lx @ weights
    return np.concatenate([s1, s2], axis=1), np.concatenate([t1, t2], axis=1), a_first, saa


def _fill(slopes, transport, eps, order):
    """Greedy: spend ``eps`` on segments in ``order`` (row-wise indices); return filled transport."""
    t_sorted = np.take_along_axis(transport, order, axis=1)
    before = np.cumsum(t_sorted, axis=1) - t_sorted
    filled_sorted = np.clip(eps - before, 0.0, t_sorted)
    filled = np.empty_like(filled_sorted)
    np.put_along_axis(filled, order, filled_sorted, axis=1)
    return filled


def worst_case_cost_many(
    samples: ArrayLike, etas: ArrayLike, c_p: float, c_w: float, eps: float, L_max: float
) -> NDArray[np.float64]:
    """Worst-case expected cost (5) at many buffers ``etas`` (tokens) at once, exactly.

    Equal to (8a)'s inner term ``min_gamma gamma eps + mean_n theta_n`` under (8c)-(8g) for each
    buffer. Cost: one sort of ``2 x (distinct samples)`` knapsack segments per buffer, vectorised.
    """
    etas_arr = _real_array(etas, "etas")
    shape = etas_arr.shape
    flat = etas_arr.ravel()
    if not np.all(np.isfinite(flat)):
        raise ValueError("etas must be finite")
    if np.any(flat < -BUFFER_ROUNDOFF):
        raise ValueError(f"etas must be >= 0 (buffers of output tokens, r - L_in), got {flat[flat < -BUFFER_ROUNDOFF][0]!r}")
    flat = np.maximum(flat, 0.0)
    # merging repeats costs one sort; it pays off only when many buffers share the samples
    values, weights, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max, merge=flat.size > 1)
    out = np.empty(flat.size)
    step = max(1, _CHUNK // values.size)
    for start in range(0, flat.size, step):
        block = flat[start : start + step]
        slopes, transport, _, saa = _segments(values, weights, block, c_p, c_w, L)
        if e == 0:
            out[start : start + step] = saa
            continue
        if block.size == 1:  # one buffer: sort only the segments that can gain (about half)
            useful = np.isfinite(slopes[0])
            slopes, transport = slopes[:, useful], transport[:, useful]
        order = np.argsort(-slopes, axis=1, kind="stable")
        s_sorted = np.take_along_axis(slopes, order, axis=1)
        t_sorted = np.take_along_axis(transport, order, axis=1)
        before = np.cumsum(t_sorted, axis=1) - t_sorted
        filled = np.clip(e - before, 0.0, t_sorted)
        gain = (np.where(filled > 0, s_sorted, 0.0) * filled).sum(axis=1)
        out[start : start + step] = saa + gain
    return out.reshape(shape)


# --------------------------------------------------------------------------- the LPs
class DualProblem(NamedTuple):
    """(8c)-(8g) for a fixed buffer: ``min gamma*eps + sum_n w_n theta_n``; eta, eps are Parameters."""

    problem: cp.Problem
    gamma: cp.Variable
    theta: cp.Variable
    eta: cp.Parameter
    eps: cp.Parameter


def dual_constraints(values, eta, gamma, theta, c_p: float, c_w: float, L_max: float) -> list:
    """The constraints (8c)-(8f) for samples ``values`` and buffer ``eta`` (a number, Parameter or
    Variable): ``theta_n`` bounds the loss at the sample itself (8c)-(8d) and after moving its mass to
    ``L_max`` (8e) or to 0 (8f), each move charged ``gamma`` per token. (8g) is in the variables' signs.
    """
    return [
        theta >= c_p * (values - eta),                              # (8c)
        theta >= c_w * (eta - values),                              # (8d)
        theta >= c_p * (L_max - eta) - gamma * (L_max - values),    # (8e)
        theta >= c_w * eta - gamma * values,                        # (8f)
    ]


def dual_problem(
    samples: ArrayLike, eta: float, c_p: float, c_w: float, eps: float, L_max: float
) -> DualProblem:
    """Build the finite dual (8c)-(8g) of the worst case at a fixed buffer ``eta`` (tokens).

        min_{gamma, theta}  gamma eps + sum_n w_n theta_n
        s.t. theta_n >= c_p (xi_n - eta)                              (8c)
             theta_n >= c_w (eta - xi_n)                              (8d)
             theta_n >= c_p (L_max - eta) - gamma (L_max - xi_n)      (8e)
             theta_n >= c_w eta - gamma xi_n                          (8f)
             gamma >= 0, theta_n >= 0                                 (8g)

    (the paper writes ``r - L_in`` for ``eta``). Equal samples share one ``theta`` with weight
    ``w_n`` = frequency, an exact reduction. ``eta`` and ``eps`` are ``cp.Parameter`` s, so a sweep
    can set ``.value`` and re-solve without rebuilding.
    """
    import cvxpy as cp

    values, weights, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max)
    eta_p = cp.Parameter(name="eta", value=_eta(eta))
    eps_p = cp.Parameter(name="eps", nonneg=True, value=e)
    gamma = cp.Variable(name="gamma", nonneg=True)
    theta = cp.Variable(values.size, name="theta", nonneg=True)
    constraints = dual_constraints(values, eta_p, gamma, theta, c_p, c_w, L)
    problem = cp.Problem(cp.Minimize(gamma * eps_p + weights @ theta), constraints)
    return DualProblem(problem, gamma, theta, eta_p, eps_p)


class PrimalProblem(NamedTuple):
    """The transport LP: ``plan[n, j]`` = mass sent from distinct sample ``n`` to ``atoms[j]``."""

    problem: cp.Problem
    plan: cp.Variable
    atoms: NDArray[np.float64]
    values: NDArray[np.float64]


def primal_problem(
    samples: ArrayLike,
    eta: float,
    c_p: float,
    c_w: float,
    eps: float,
    L_max: float,
    *,
    grid_size: int = 65,
) -> PrimalProblem:
    """Build the worst case (5) itself as a transport LP over a grid of the support.

        max_{plan >= 0}  sum_{n,j} plan[n,j] loss(atom_j, eta)
        s.t. sum_j plan[n,j] = w_n                      (sample n's probability)
             sum_{n,j} plan[n,j] |atom_j - xi_n| <= eps  (W_1 budget (5))

    Atoms: ``grid_size`` evenly spaced points of [0, L_max] plus every sample and ``eta``. Since
    the loss is linear between these atoms, moving mass to any other point cannot do better, so
    the LP is exact; it is an independent check of (8c)-(8g), not derived from it.
    """
    import cvxpy as cp

    values, weights, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max)
    b = _eta(eta)
    if isinstance(grid_size, (bool, np.bool_)) or not isinstance(grid_size, (int, np.integer)) or grid_size < 2:
        raise ValueError(f"grid_size must be an integer >= 2, got {grid_size!r}")
    extra = [b] if 0.0 <= b <= L else []
    atoms = np.unique(np.concatenate([np.linspace(0.0, L, int(grid_size)), values, extra]))
    distance = np.abs(atoms[None, :] - values[:, None])
    gain = loss(atoms, b, c_p, c_w)
    plan = cp.Variable((values.size, atoms.size), name="plan", nonneg=True)
    constraints = [cp.sum(plan, axis=1) == weights, cp.sum(cp.multiply(plan, distance)) <= e]
    problem = cp.Problem(cp.Maximize(cp.sum(plan @ gain)), constraints)
    return PrimalProblem(problem, plan, atoms, values)


class DROProblem(NamedTuple):
    """The joint robust-buffer LP over ``(eta, gamma, theta)``; ``eps`` is a Parameter."""

    problem: cp.Problem
    eta: cp.Variable
    gamma: cp.Variable
    theta: cp.Variable
    eps: cp.Parameter


def dro_problem(samples: ArrayLike, c_p: float, c_w: float, eps: float, L_max: float) -> DROProblem:
    """Build ``min_{eta in [0, L_max]} WC(eta)`` as one LP: (8a)'s per-class term with (8c)-(8g).

    Same constraints as :func:`dual_problem` with the buffer a variable; ``0 <= eta <= L_max``
    mirrors ``r in [L_in, L_in + L_max]``. Linear because ``gamma`` multiplies data only.
    """
    import cvxpy as cp

    values, weights, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max)
    eps_p = cp.Parameter(name="eps", nonneg=True, value=e)
    eta = cp.Variable(name="eta")
    gamma = cp.Variable(name="gamma", nonneg=True)
    theta = cp.Variable(values.size, name="theta", nonneg=True)
    constraints = dual_constraints(values, eta, gamma, theta, c_p, c_w, L) + [
        eta >= 0,
        eta <= L,
    ]
    problem = cp.Problem(cp.Minimize(gamma * eps_p + weights @ theta), constraints)
    return DROProblem(problem, eta, gamma, theta, eps_p)


# --------------------------------------------------------------------------- public: worst case
def worst_case_cost(
    samples: ArrayLike,
    eta: float,
    c_p: float,
    c_w: float,
    eps: float,
    L_max: float,
    method: str = "closed_form",
) -> float:
    """Worst-case expected cost over the W_1 ball (5) of radius ``eps`` (tokens) at buffer ``eta``.

    ``method`` is ``"closed_form"`` (exact knapsack, no solver), ``"dual_lp"`` ((8c)-(8g) with
    Clarabel) or ``"primal_lp"`` (transport LP over a grid, Clarabel); all three agree. Raises
    ``ValueError`` naming the argument on bad input and :class:`kvdro.errors.SolverError` if an LP
    does not reach optimality.
    """
    if method == "closed_form":
        return float(worst_case_cost_many(samples, [_eta(eta)], c_p, c_w, eps, L_max)[0])
    if method == "dual_lp":
        return solve_lp(dual_problem(samples, eta, c_p, c_w, eps, L_max).problem, "dual LP (8c)-(8g)")
    if method == "primal_lp":
        return solve_lp(primal_problem(samples, eta, c_p, c_w, eps, L_max).problem, "primal transport LP")
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def worst_case_distribution(
    samples: ArrayLike, eta: float, c_p: float, c_w: float, eps: float, L_max: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """A worst-case distribution for buffer ``eta``: ``(atoms, probs)``, atoms sorted (tokens).

    Built by the greedy of the closed form: the moves of highest gain per token of transport are
    made first, each sending (part of) a sample's mass to ``L_max`` or to 0. Among moves of equal
    gain per token, mass farther from ``eta`` moves first (so ``eta`` keeps its quantile as long
    as possible). Its expected loss equals :func:`worst_case_cost` and its W_1 distance from the
    samples is at most ``eps``.
    """
    values, weights, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max)
    b = _eta(eta)
    slopes, transport, a_first, _ = _segments(values, weights, np.array([b]), c_p, c_w, L)
    scale = max(c_p, c_w, 1e-300)
    key_slope = np.where(np.isfinite(slopes[0]), np.round(slopes[0] / scale, 10), -np.inf)
    far = np.tile(np.abs(values - b), 2)
    order = np.lexsort((-far, -key_slope))[None, :]
    filled = _fill(slopes, transport, e, order)[0]
    u = values.size
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(transport[0] > 0, filled / np.where(transport[0] > 0, transport[0], 1.0), 0.0)
    t1, t2 = frac[:u], frac[u:]
    first = np.where(a_first[0], L, 0.0)
    second = np.where(a_first[0], 0.0, L)
    locations = np.concatenate([values, first, second])
    masses = np.concatenate([weights * (1 - t1), weights * (t1 - t2), weights * t2])
    atoms, inverse = np.unique(locations, return_inverse=True)
    probs = np.bincount(inverse, weights=masses, minlength=atoms.size)
    keep = probs > 1e-15
    probs = probs[keep] / probs[keep].sum()
    return atoms[keep], probs


# --------------------------------------------------------------------------- the robust buffer
@dataclass(frozen=True)
class RegimeLine:
    """One affine piece ``cost(eps) = intercept + gamma * eps`` of the robust value.

    At multiplier ``gamma`` the dual is minimised by the buffer ``eta`` (tokens); the robust value
    is the lower envelope ``min over lines`` (see :func:`regime_lines`).
    """

    gamma: float
    eta: float
    intercept: float

    def cost(self, eps: float) -> float:
        return self.intercept + self.gamma * eps


@dataclass(frozen=True)
class RobustBuffer:
    """A robust-optimal buffer ``eta`` (tokens), its multiplier ``gamma`` and worst-case cost."""

    eta: float
    gamma: float
    cost: float


def regime_lines(samples: ArrayLike, c_p: float, c_w: float, L_max: float) -> tuple[RegimeLine, ...]:
    """The (at most three) affine pieces of ``V(eps) = min_eta WC(eta)``, largest ``gamma`` first.

    Chapter 3, Lemma "at a fixed price" and Theorem "three values". For a fixed ``gamma`` the
    constraints (8c)-(8f) of sample ``x`` collapse to ``theta >= max(c_p (up - eta), c_w (eta - down))``
    with ``up = x + (1 - gamma/c_p)^+ (L_max - x)`` and ``down = x - (1 - gamma/c_w)^+ x``: the
    newsvendor loss at the moved sample ``x~ = (c_p up + c_w down)/(c_p + c_w)`` plus the constant
    ``c_p c_w (up - down)/(c_p + c_w)``. ``x~ = phi + omega x`` is increasing affine in ``x``
    (shift ``phi(gamma)`` [tokens], slope ``omega(gamma)`` in [0, 1]), so the best buffer is
    ``phi + omega eta_SAA`` (the critical fractile (9) of the moved samples) and the dual value is
    ``omega V_SAA + const``: linear in ``gamma`` between the kinks ``c_p`` and ``c_w``. Hence the
    optimal ``gamma`` is one of ``max(c_p,c_w)``, ``min(c_p,c_w)``, 0 (two values when
    ``c_p == c_w``), giving the lines, with ``q* = rho/(rho+1)``:

    * ``gamma = max(c_p, c_w)``: the SAA buffer, cost ``V_SAA + max(c_p,c_w) eps``;
    * ``gamma = min(c_p, c_w)`` (only for ``rho != 1``): for ``rho > 1`` the buffer
      ``eta_SAA + (2 q* - 1)(L_max - eta_SAA)``, for ``rho < 1`` the buffer ``2 q* eta_SAA``;
    * ``gamma = 0``: the box-robust buffer ``q* L_max``, cost ``q* c_w L_max``.
    """
    L = support_bound(L_max)
    x = as_samples(samples, L)
    c_p, c_w = check_costs(c_p, c_w, positive=True)
    eta_saa = saa_reservation(x, c_p, c_w)
    v_saa = expected_cost(x, eta_saa, c_p, c_w)
    mean = float(np.mean(x))
    total = c_p + c_w
    lines = []
    for gamma in sorted({max(c_p, c_w), min(c_p, c_w), 0.0}, reverse=True):
        up, down = max(c_p - gamma, 0.0), max(c_w - gamma, 0.0)
        omega = 1.0 - (up + down) / total
        phi = up * L / total
        eta = phi + omega * eta_saa if omega > 0 else c_p * L / total
        intercept = omega * v_saa + (c_w * up * (L - mean) + c_p * down * mean) / total
        lines.append(RegimeLine(gamma=gamma, eta=float(eta), intercept=float(intercept)))
    return tuple(lines)


def transport_room(samples: ArrayLike, c_p: float, c_w: float, L_max: float) -> tuple[float, float]:
    """The adversary's room above and below the SAA buffer, ``(room_up, room_down)`` [tokens].

    ``room_up = integral_{eta_SAA}^{L_max} (F_N(t) - q*) dt = (g_N(L_max) - V_SAA)/(c_p + c_w)`` is
    the transport that pushes the mass above the SAA buffer up to ``L_max`` while ``eta_SAA`` stays a
    ``q*``-quantile; ``room_down = integral_0^{eta_SAA} (q* - F_N(t)) dt = (g_N(0) - V_SAA)/(c_p + c_w)``
    pushes the mass below it down to 0. ``g_N`` is the SAA cost, ``V_SAA`` its minimum; both rooms
    are >= 0 and do not depend on which SAA-optimal buffer is taken (chapter 1's excess-cost formula).
    """
    L = support_bound(L_max)
    x = as_samples(samples, L)
    c_p, c_w = check_costs(c_p, c_w, positive=True)
    v_saa = expected_cost(x, saa_reservation(x, c_p, c_w), c_p, c_w)
    total = c_p + c_w
    room_up = (expected_cost(x, L, c_p, c_w) - v_saa) / total
    room_down = (expected_cost(x, 0.0, c_p, c_w) - v_saa) / total
    return max(room_up, 0.0), max(room_down, 0.0)


def saa_threshold_radius(samples: ArrayLike, c_p: float, c_w: float, L_max: float) -> float:
    """Largest radius ``eps*`` (tokens) with robust value ``V_SAA + max(c_p, c_w) eps``.

    For ``eps <= eps*`` the SAA buffer is robust-optimal; beyond, it is not (unless another regime's
    buffer happens to coincide with it). With the rooms of :func:`transport_room` (chapter 3,
    Corollary "when the robust buffer is the SAA buffer"):

    * ``rho > 1``: ``eps* = room_up`` (the other candidate, the crossing with the box-robust line
      ``(q* c_w L_max - V_SAA)/c_p = room_up + room_down/rho``, never comes first);
    * ``rho = 1``: ``eps* = room_up + room_down = L_max/2 - V_SAA/c_w`` (only two lines);
    * ``rho < 1``: ``eps* = room_down`` (the mirror image of ``rho > 1``).
    """
    c_p, c_w = check_costs(c_p, c_w, positive=True)
    room_up, room_down = transport_room(samples, c_p, c_w, L_max)
    if c_p > c_w:
        return room_up
    if c_p < c_w:
        return room_down
    return room_up + room_down


@dataclass(frozen=True)
class BufferPiece:
    """On radii ``eps_from < eps <= eps_to`` [tokens] the robust buffer is ``eta`` [tokens], with price
    ``gamma``; the first piece includes ``eps = 0`` and the last has ``eps_to = inf``."""

    eps_from: float
    eps_to: float
    gamma: float
    eta: float


def robust_buffer_path(samples: ArrayLike, c_p: float, c_w: float, L_max: float) -> tuple[BufferPiece, ...]:
    """The robust buffer as a function of the radius: the lower envelope of :func:`regime_lines`.

    Piecewise constant with at most three pieces (two for ``rho = 1``): the SAA buffer up to
    :func:`saa_threshold_radius`, then (for ``rho != 1``) the middle buffer, then the box-robust
    ``q* L_max``. At a radius where two lines cross, the piece of the larger ``gamma`` is used (as
    :func:`dro_solution` does). The first piece is always there, possibly with ``eps_to = 0``.
    """
    lines = regime_lines(samples, c_p, c_w, L_max)  # largest gamma first
    lowest = min(line.intercept for line in lines)
    # at eps = 0 the SAA line is lowest; rounding may tie it with another line: prefer the larger gamma
    current = next(j for j, line in enumerate(lines) if line.intercept <= lowest * (1 + 1e-12) + 1e-300)
    pieces: list[BufferPiece] = []
    start = 0.0
    while True:
        line = lines[current]
        crossings = [
            (max((other.intercept - line.intercept) / (line.gamma - other.gamma), start), -other.gamma, j)
            for j, other in enumerate(lines)
            if other.gamma < line.gamma
        ]
        if not crossings:
            pieces.append(BufferPiece(start, math.inf, line.gamma, line.eta))
            return tuple(pieces)
        end, _, nxt = min(crossings)
        if end - start > 1e-12 * max(abs(end), 1.0) or not pieces:  # skip pieces of zero length
            pieces.append(BufferPiece(start, float(end), line.gamma, line.eta))
            start = float(end)
        current = nxt


def dro_solution(
    samples: ArrayLike, c_p: float, c_w: float, eps: float, L_max: float, *, method: str = "closed_form"
) -> RobustBuffer:
    """The robust buffer, its multiplier and worst-case cost: ``min_eta WC(eta)`` over the ball (5).

    ``method="closed_form"`` takes the lowest of :func:`regime_lines` at ``eps`` (at a radius
    where two lines tie, the one with the larger ``gamma``, i.e. closer to SAA);
    ``method="lp"`` solves :func:`dro_problem` (an interior-point solve: at ties it may return
    another optimal buffer, of equal cost).
    """
    values, _, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max)
    check_costs(c_p, c_w, positive=True)
    if method == "closed_form":
        lines = regime_lines(samples, c_p, c_w, L)
        costs = np.array([line.cost(e) for line in lines])
        best = int(np.flatnonzero(costs <= costs.min() * (1 + 1e-12) + 1e-300)[0])
        line = lines[best]
        return RobustBuffer(eta=line.eta, gamma=line.gamma, cost=float(costs[best]))
    if method == "lp":
        model = dro_problem(samples, c_p, c_w, e, L)
        value = solve_lp(model.problem, "joint DRO LP (8c)-(8g)")
        eta = max(0.0, float(model.eta.value))  # the LP has eta in [0, L_max] (8g): clip solver round-off
        return RobustBuffer(eta=eta, gamma=float(model.gamma.value), cost=value)
    raise ValueError(f"method must be 'closed_form' or 'lp', got {method!r}")


def dro_reservation(
    samples: ArrayLike, c_p: float, c_w: float, eps: float, L_max: float, *, method: str = "closed_form"
) -> float:
    """DRO-optimal buffer ``eta = r* - L_in`` (tokens) for radius ``eps`` and support [0, L_max]."""
    return dro_solution(samples, c_p, c_w, eps, L_max, method=method).eta


@dataclass(frozen=True)
class SaddlePoint:
    """A robust buffer ``eta`` and a worst-case distribution of which it is a q*-quantile."""

    eta: float
    atoms: NDArray[np.float64]
    probs: NDArray[np.float64]
    cost: float


def saddle_distribution(
    samples: ArrayLike, c_p: float, c_w: float, eps: float, L_max: float
) -> SaddlePoint:
    """The critical fractile (9) as a saddle point: ``(eta*, P*)`` with ``eta*`` robust-optimal,
    ``P*`` worst-case for ``eta*`` and ``eta*`` a ``rho/(rho+1)``-quantile of ``P*``.

    ``P*`` is found by an LP over the moves of each sample (stay, to 0, to ``L_max``: the only
    destinations a worst case needs) that maximises the expected loss at ``eta*`` subject to the
    W_1 budget and ``P*(xi < eta*) <= q* <= P*(xi <= eta*)``. Its ``cost`` equals
    ``WC(eta*)`` when the saddle point exists (minimax theorem); the caller can check that.
    """
    import cvxpy as cp

    values, weights, c_p, c_w, e, L = _inputs(samples, c_p, c_w, eps, L_max)
    robust = dro_solution(samples, c_p, c_w, e, L)
    b = robust.eta
    q = c_p / (c_p + c_w)
    dests = np.stack([values, np.zeros_like(values), np.full_like(values, L)], axis=1)
    move = np.abs(dests - values[:, None])
    gain = loss(dests, b, c_p, c_w)
    p = cp.Variable(dests.shape, name="mass", nonneg=True)
    at_or_below = (dests <= b).astype(float)
    below = (dests < b).astype(float)
    constraints = [
        cp.sum(p, axis=1) == weights,
        cp.sum(cp.multiply(p, move)) <= e,
        cp.sum(cp.multiply(p, at_or_below)) >= q,
        cp.sum(cp.multiply(p, below)) <= q,
    ]
    problem = cp.Problem(cp.Maximize(cp.sum(cp.multiply(p, gain))), constraints)
    cost = solve_lp(problem, "saddle-point LP")
    mass = np.clip(np.asarray(p.value), 0.0, None).ravel()
    atoms, inverse = np.unique(dests.ravel(), return_inverse=True)
    probs = np.bincount(inverse, weights=mass, minlength=atoms.size)
    keep = probs > 1e-12
    return SaddlePoint(eta=b, atoms=atoms[keep], probs=probs[keep] / probs[keep].sum(), cost=cost)
