"""The newsvendor view of one request class: loss (2)-(3), SAA, the critical fractile (9)-(10).

A class-i request with known input length ``L_in`` reserves ``r`` tokens of KV cache before its
output length ``xi`` (tokens) is known. Writing the *buffer* ``eta = r - L_in`` (tokens of output
reserved), the stochastic cost of the paper's (2)-(3) is

    loss(xi, eta) = c_p (xi - eta)^+  +  c_w (eta - xi)^+        (cost units per request)

with ``c_p`` the preemption cost and ``c_w`` the waste cost, both per token. Under the empirical
distribution of samples ``xi_1..xi_N`` (sample average approximation, SAA) the expected cost is
piecewise linear and convex in ``eta``; its slope is (10b), ``(c_p + c_w) F_N(eta) - c_p``, so the
minimiser is the lower ``q* = rho/(rho+1)`` quantile of the samples, ``rho = c_p/c_w`` (9).

The same optimum as an LP in CVXPY (:func:`saa_problem`) lets a reader inspect the model.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvdro.errors import SolverError

if TYPE_CHECKING:  # CVXPY is imported where a model is built: `import kvdro.sim` stays light
    import cvxpy as cp

__all__ = [
    "BUFFER_ROUNDOFF",
    "SAAProblem",
    "as_samples",
    "check_costs",
    "critical_fractile",
    "expected_cost",
    "loss",
    "saa_problem",
    "saa_reservation",
    "solve_lp",
    "support_bound",
]

#: Solver used for every LP in the book; tolerances tight enough for 1e-6 relative agreement.
LP_SOLVER = "CLARABEL"
LP_OPTIONS: dict[str, float] = {"tol_gap_abs": 1e-8, "tol_gap_rel": 1e-9, "tol_feas": 1e-9}


# --------------------------------------------------------------------------- validation helpers
def _is_real_number(value: object) -> bool:
    """True for an int/float/numpy number (or a 0-d numeric array), False for bool, str, None, ..."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, numbers.Real):
        return True
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"


def _finite_scalar(value: float, name: str) -> float:
    """``value`` as a finite float; ``ValueError`` naming ``name`` for anything else.

    Strings (``"5"``), booleans and ``None`` are rejected rather than converted: a token count or a
    cost that arrives as text is a bug upstream, not a number.
    """
    if not _is_real_number(value):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return x


def _buffer(eta: float, name: str = "eta") -> float:
    """A buffer ``eta = r - L_in`` [tokens of output reserved] as a finite float >= 0; ``ValueError``
    naming ``name`` otherwise (a negative buffer would reserve less than the prompt). Solver
    round-off down to ``-BUFFER_ROUNDOFF`` is read as 0."""
    b = _finite_scalar(eta, name)
    if b < 0:
        if b < -BUFFER_ROUNDOFF:
            raise ValueError(f"{name} must be >= 0 (a buffer of output tokens, r - L_in), got {eta!r}")
        b = 0.0
    return b


#: Tokens below 0 that a buffer may carry from a solver's round-off (read as 0, not refused).
BUFFER_ROUNDOFF = 1e-9


def _real_array(values: ArrayLike, name: str) -> NDArray[np.float64]:
    """``values`` as a float array of any shape, rejecting strings, booleans and non-numbers."""
    try:
        a = np.asarray(values)
    except (TypeError, ValueError):  # ragged nested sequences
        raise ValueError(f"{name} must be an array of numbers") from None
    if a.dtype.kind == "O":
        if not all(_is_real_number(v) for v in a.ravel()):
            raise ValueError(f"{name} must be an array of numbers (found a non-number)")
    elif a.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be an array of numbers, got dtype {a.dtype} (strings and booleans are not)")
    return a.astype(np.float64)


def check_costs(c_p: float, c_w: float, *, positive: bool = False) -> tuple[float, float]:
    """Validate the per-token preemption and waste costs of (2)-(3); return them as floats.

    Raises ``ValueError`` naming ``c_p`` or ``c_w`` if a cost is not a real number, non-finite or
    negative (or, with ``positive=True``, zero: a reservation needs both costs to pin down the
    fractile (9)).
    """
    out = []
    for value, name in ((c_p, "c_p"), (c_w, "c_w")):
        x = _finite_scalar(value, name)
        if x < 0 or (positive and x == 0):
            need = "positive" if positive else "non-negative"
            raise ValueError(f"{name} must be {need}, got {value!r}")
        out.append(x)
    return out[0], out[1]


def support_bound(L_max: float) -> float:
    """Validate the support bound ``L_max`` (tokens) of the ambiguity set (5): a positive finite number."""
    upper = _finite_scalar(L_max, "L_max")
    if upper <= 0:
        raise ValueError(f"L_max must be positive, got {L_max!r}")
    return upper


def as_samples(samples: ArrayLike, L_max: float | None = None) -> NDArray[np.float64]:
    """Validate output-length samples (tokens) and return them as a 1-D float array.

    Samples must be a non-empty 1-D array of finite, non-negative numbers (not strings, booleans or a
    2-D table: nothing is flattened silently); with ``L_max`` given they must also lie in the support
    ``[0, L_max]`` of the ambiguity set (5). Raises ``ValueError`` naming ``samples`` (or ``L_max``
    if it is not a positive finite number).
    """
    x = _real_array(samples, "samples")
    if x.ndim != 1:
        raise ValueError(f"samples must be a 1-D array of output lengths, got shape {x.shape}")
    if x.size == 0:
        raise ValueError("samples must not be empty")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples must be finite (found NaN or inf)")
    if np.any(x < 0):
        raise ValueError(f"samples must be non-negative output lengths (min is {x.min()!r})")
    if L_max is not None:
        upper = support_bound(L_max)
        if np.any(x > upper):
            raise ValueError(f"samples must lie in [0, L_max] = [0, {upper!r}] (max is {x.max()!r})")
    return x


# --------------------------------------------------------------------------- the newsvendor
def critical_fractile(rho: float) -> float:
    """The critical fractile ``q* = rho / (rho + 1)`` of Remark 3, with ``rho = c_p / c_w`` (9).

    Raises ``ValueError`` naming ``rho`` if it is not a positive finite number.
    """
    r = _finite_scalar(rho, "rho")
    if r <= 0:
        raise ValueError(f"rho must be positive, got {rho!r}")
    return r / (r + 1.0)


def loss(xi: ArrayLike, eta: ArrayLike, c_p: float, c_w: float) -> NDArray[np.float64]:
    """Per-request stochastic cost (2)+(3): ``c_p (xi - eta)^+ + c_w (eta - xi)^+``.

    ``xi`` (output length, tokens) and ``eta`` (buffer ``r - L_in``, tokens, >= 0) broadcast against each
    other; the result is in cost units (``c_p``, ``c_w`` are per token).
    """
    c_p, c_w = check_costs(c_p, c_w)
    x, e = _real_array(xi, "xi"), _real_array(eta, "eta")
    for arr, name in ((x, "xi"), (e, "eta")):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite (found NaN or inf)")
    if np.any(e < -BUFFER_ROUNDOFF):
        raise ValueError(f"eta must be >= 0 (a buffer of output tokens, r - L_in), got {e[e < -BUFFER_ROUNDOFF].ravel()[0]!r}")
    diff = x - e
    return c_p * np.maximum(diff, 0.0) + c_w * np.maximum(-diff, 0.0)


def expected_cost(samples: ArrayLike, eta: float, c_p: float, c_w: float) -> float:
    """Empirical (SAA) expected cost of buffer ``eta`` (tokens): the mean of (2)+(3) over samples."""
    x = as_samples(samples)
    e = _buffer(eta)
    return float(np.mean(loss(x, e, c_p, c_w)))


def _lower_quantile_index(n: int, c_p: float, c_w: float) -> int:
    """Smallest k in 1..n with k/n >= c_p/(c_p+c_w), computed exactly (no rounding at ties)."""
    fp, fw = Fraction(c_p), Fraction(c_w)
    k = math.ceil(Fraction(n) * fp / (fp + fw))
    return min(max(k, 1), n)


def saa_reservation(samples: ArrayLike, c_p: float, c_w: float, *, method: str = "quantile") -> float:
    """SAA-optimal buffer ``eta`` (tokens): the lower ``rho/(rho+1)`` empirical quantile (9)-(10).

    ``method="quantile"`` returns ``F_N^{-1}(q*) = min{x : F_N(x) >= q*}``, a sample value. When
    ``N q*`` is an integer every buffer between two consecutive order statistics is optimal; the
    smallest is returned. ``method="lp"`` solves :func:`saa_problem` with Clarabel instead (an
    interior-point method: at such ties it may return any optimal buffer, of equal cost).
    """
    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w, positive=True)
    if method == "quantile":
        k = _lower_quantile_index(x.size, c_p, c_w)
        return float(np.partition(x, k - 1)[k - 1])
    if method == "lp":
        model = saa_problem(x, c_p, c_w)
        solve_lp(model.problem, "SAA LP")
        return max(0.0, float(model.eta.value))  # an optimal buffer is a sample (>= 0): clip solver round-off
    raise ValueError(f"method must be 'quantile' or 'lp', got {method!r}")


# --------------------------------------------------------------------------- the SAA LP
class SAAProblem(NamedTuple):
    """The SAA newsvendor LP and its variables (``eta`` in tokens, ``theta`` cost per sample)."""

    problem: cp.Problem
    eta: cp.Variable
    theta: cp.Variable


def saa_problem(samples: ArrayLike, c_p: float, c_w: float) -> SAAProblem:
    """Build (do not solve) the SAA problem as an LP in epigraph form.

        min_{eta, theta}  sum_n w_n theta_n
        s.t.  theta_n >= c_p (xi_n - eta)     (preemption, (2))
              theta_n >= c_w (eta - xi_n)     (waste, (3))

    Equal samples share one ``theta`` with weight ``w_n`` = their frequency (an exact reduction:
    output lengths are integers with many repeats). Solve with :func:`solve_lp`.
    """
    import cvxpy as cp

    x = as_samples(samples)
    c_p, c_w = check_costs(c_p, c_w)
    values, counts = np.unique(x, return_counts=True)
    weights = counts / x.size
    eta = cp.Variable(name="eta")
    theta = cp.Variable(values.size, name="theta")
    constraints = [theta >= c_p * (values - eta), theta >= c_w * (eta - values)]
    problem = cp.Problem(cp.Minimize(weights @ theta), constraints)
    return SAAProblem(problem, eta, theta)


def solve_lp(problem: cp.Problem, what: str) -> float:
    """Solve an LP built by this package with Clarabel; return its optimal value.

    Raises :class:`kvdro.errors.SolverError` carrying the solver status unless it is ``optimal``,
    and ``ValueError`` naming ``problem`` if it is not a ``cvxpy.Problem``.
    """
    import cvxpy as cp

    if not isinstance(problem, cp.Problem):
        raise ValueError(f"problem must be a cvxpy.Problem, got {type(problem).__name__}")
    try:
        problem.solve(solver=LP_SOLVER, **LP_OPTIONS)
    except cp.error.SolverError as exc:  # the solver itself failed (e.g. numerical trouble)
        raise SolverError(what, f"solver failure: {exc}") from exc
    if problem.status != cp.OPTIMAL:
        raise SolverError(what, problem.status)
    value = float(problem.value)
    if not math.isfinite(value):
        raise SolverError(what, f"{problem.status} with non-finite value {value!r}")
    return value
