"""The exact solver: the joint problem (6)/(8) as one MILP, solved by HiGHS through CVXPY.

**Why a MILP is exact.** Reservations are block granular (r_i = L_in^i + 16 c), so r_i takes finitely
many values and, for each value, the inner supremum of (8a) -- (8c)-(8g) minimised over gamma_i and
theta_i -- is a number R_ic computed once by the closed form. With x_ic one-hot, delta binary and z
bounded integer, every product left in (6)/(8) has a binary factor and is linearised exactly
(:mod:`kvdro.joint.formulations`).

**How the waiting time W_k is treated.** W_k (7) would depend on the routing non-linearly. The model
we solve (and :func:`kvdro.joint.objective.evaluate` scores) uses Kingman's formula with the whole
workload's service and arrival variability, evaluated at the upper edge of the utilisation band that
contains u_k (:func:`kvdro.joint.serving.waiting_model`): W_k is then a step function of u_k that
bounds the smooth formula from above, and the MILP represents it exactly (one binary per (z_k, band) state in
the ``"disaggregated"`` formulation; a band binary and an integer group count per band in the default
``"counts"``). "Proven optimal" below means optimal for exactly that model.

An earlier design -- hold W fixed in the MILP, recompute it from the solution, repeat -- cycled on the
small instance (seeds 0-4 at load 0.5): with W frozen, routing between two groups is a tie, the
solver's pick moves the bursty code traffic (inter-arrival CV 7.6) to one group, its W jumps, and the
next solve moves it back. Chapter 5 tells that story.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from kvdro.errors import SolverError
from kvdro.joint.formulations import DEFAULT_FORMULATION, FORMULATIONS, SPECS, Formulation, Spec, build_milp
from kvdro.joint.instance import Instance, Solution
from kvdro.joint.serving import BAND_TOLERANCE, group_state

__all__ = ["DEFAULT_FORMULATION", "MilpResult", "solve_milp", "solve_relaxation", "solve_exact"]

#: Largest (objective - dual bound) / |objective| at which :func:`solve_exact` accepts HiGHS's
#: "optimal" (it stops at ``mip_rel_gap``; the slack covers its feasibility tolerances).
PROOF_GAP = 1e-7

#: HiGHS relative MIP gap at which a MILP counts as solved (its default, 1e-4, is too loose for
#: "proven optimal" comparisons at 1e-6).
MIP_REL_GAP = 1e-9

#: HiGHS feasibility tolerances (its defaults, set explicitly because
#: :data:`kvdro.joint.serving.BAND_TOLERANCE` is chosen against them): a point HiGHS accepts violates a
#: row by at most about this much, so its utilisation is at most this far above the band edge it chose.
HIGHS_TOLERANCES = {"primal_feasibility_tolerance": 1e-7, "mip_feasibility_tolerance": 1e-6}
assert BAND_TOLERANCE >= 10 * max(HIGHS_TOLERANCES.values()), "evaluate must accept every HiGHS-feasible band"


@dataclass(frozen=True)
class MilpResult:
    """Outcome of one MILP (or LP relaxation) solve with fixed W.

    status: CVXPY status (``"optimal"``, ``"user_limit"`` for a time limit, ...);
    objective: best objective found [cost / s] (``nan`` if none); bound: HiGHS's proven lower bound;
    mip_gap: (objective - bound) / |objective|; time_s: HiGHS run time [s]; build_s: CVXPY model
    build + compile time [s]; nodes: branch-and-bound nodes; decision: (z, r, pi, delta) or None;
    n_variables, n_constraints: size of the model HiGHS received.
    """

    formulation: str
    status: str
    objective: float
    bound: float
    mip_gap: float
    time_s: float
    build_s: float
    nodes: int
    decision: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None
    n_variables: int
    n_constraints: int


def _check_solver_args(formulation, time_limit, mip_rel_gap) -> None:
    if not isinstance(formulation, Spec) and (not isinstance(formulation, str) or formulation not in SPECS):
        raise ValueError(f"formulation: must be one of {FORMULATIONS} or a Spec, got {formulation!r}")
    for value, name in ((time_limit, "time_limit"), (mip_rel_gap, "mip_rel_gap")):
        if isinstance(value, (bool, np.bool_, str, bytes)) or value is None or np.ndim(value) != 0:
            raise ValueError(f"{name}: must be a number, got {value!r}")
    if not (np.isfinite(time_limit) and time_limit > 0):
        raise ValueError(f"time_limit: must be a positive number of seconds, got {time_limit!r}")
    if not (0 <= mip_rel_gap < 1):
        raise ValueError(f"mip_rel_gap: must be in [0, 1), got {mip_rel_gap!r}")


def _highs_info(problem: cp.Problem):
    stats = problem.solver_stats
    return None if stats is None else stats.extra_stats


def solve_milp(
    instance: Instance,
    *,
    formulation: Formulation = DEFAULT_FORMULATION,
    time_limit: float = 60.0,
    mip_rel_gap: float = MIP_REL_GAP,
    prune: bool = True,
    relax: bool = False,
    verbose: bool = False,
    node_limit: int | None = None,
    highs_options: dict | None = None,
) -> MilpResult:
    """Solve the MILP of (6)/(8) with HiGHS; report status, bound and gap (never raises on a limit).

    ``formulation`` is a name of :data:`kvdro.joint.FORMULATIONS` or a
    :class:`kvdro.joint.formulations.Spec`. ``relax=True`` solves the LP relaxation instead (its
    optimum is the root bound of the formulation before HiGHS's presolve and cuts). ``time_limit`` [s]
    is HiGHS's wall-clock limit; ``node_limit`` caps branch-and-bound nodes, a limit that (unlike
    time) gives the same result on every machine. ``highs_options`` are passed to HiGHS as they are
    (e.g. ``{"log_file": path}``); do not pass ``threads`` (HiGHS fixes its thread pool at the first
    solve of a process and fails later solves that ask for another count).
    """
    _check_solver_args(formulation, time_limit, mip_rel_gap)
    for flag, name in ((prune, "prune"), (relax, "relax"), (verbose, "verbose")):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name}: must be True or False, got {flag!r}")
    if highs_options is not None and not isinstance(highs_options, dict):
        raise ValueError(f"highs_options: must be a dict of HiGHS options, got {highs_options!r}")
    if highs_options and "threads" in highs_options:
        raise ValueError("highs_options: 'threads' cannot be changed after HiGHS's first solve in a process")
    t0 = time.perf_counter()
    model = build_milp(instance, formulation=formulation, relax=relax, prune=prune)
    data = model.problem.get_problem_data(cp.HIGHS)[0]
    n_var = int(data["c"].size)
    n_con = int(data["A"].shape[0])
    build_s = time.perf_counter() - t0
    opts = {"time_limit": float(time_limit), "random_seed": 0, **HIGHS_TOLERANCES}
    if node_limit is not None:
        if isinstance(node_limit, (bool, np.bool_)) or not isinstance(node_limit, (int, np.integer)) or node_limit < 1:
            raise ValueError(f"node_limit: must be a positive number of nodes, got {node_limit!r}")
        opts["mip_max_nodes"] = int(node_limit)
    opts.update(highs_options or {})
    if not relax:
        opts["mip_rel_gap"] = float(mip_rel_gap)
    t1 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # a time limit is reported through ``status``, not a warning
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            model.problem.solve(solver=cp.HIGHS, verbose=verbose, **opts)
    except cp.error.SolverError as exc:
        raise SolverError(f"HiGHS on the {formulation} MILP", f"solver_error: {exc}") from None
    wall = time.perf_counter() - t1
    status = model.problem.status
    info = _highs_info(model.problem)
    objective = float(model.problem.value) if status == cp.OPTIMAL else float("nan")
    bound = objective if relax else float("nan")
    gap = 0.0 if (relax and status == cp.OPTIMAL) else float("nan")
    nodes = 0
    if info is not None and not relax:
        nodes = int(getattr(info, "mip_node_count", 0))
        # HiGHS's objective and bound leave out CVXPY's constant offset; the gap is taken on HiGHS's own
        # numbers and the bound reported with the offset put back
        incumbent = float(getattr(info, "objective_function_value", np.nan))
        bound = float(getattr(info, "mip_dual_bound", np.nan))
        offset = objective - incumbent if np.isfinite(objective) and np.isfinite(incumbent) else 0.0
        if not np.isfinite(objective) and np.isfinite(incumbent) and abs(incumbent) < 1e300:
            objective = incumbent
        if np.isfinite(incumbent) and abs(incumbent) < 1e300 and np.isfinite(bound) and abs(bound) < 1e300:
            gap = max(0.0, (incumbent - bound) / max(abs(incumbent + offset), 1e-12))
            bound = bound + offset
        else:
            bound = float("nan")
    run_time = model.problem.solver_stats.solve_time if model.problem.solver_stats is not None else None
    decision = model.decision() if (status == cp.OPTIMAL and not relax) else None
    return MilpResult(
        formulation=model.formulation,
        status=str(status),
        objective=objective,
        bound=bound,
        mip_gap=gap,
        time_s=float(run_time) if run_time is not None else wall,
        build_s=build_s,
        nodes=nodes,
        decision=decision,
        n_variables=n_var,
        n_constraints=n_con,
    )


def solve_relaxation(instance: Instance, *, formulation: Formulation = DEFAULT_FORMULATION, prune: bool = True) -> float:
    """Optimum of the LP relaxation of a formulation [cost / s] (raises SolverError if not optimal)."""
    res = solve_milp(instance, formulation=formulation, relax=True, prune=prune)
    if res.status != cp.OPTIMAL:
        raise SolverError(f"LP relaxation of the {formulation} MILP", res.status)
    return res.objective


def solve_exact(
    instance: Instance,
    *,
    formulation: Formulation = DEFAULT_FORMULATION,
    time_limit: float = 60.0,
    mip_rel_gap: float = MIP_REL_GAP,
    prune: bool = True,
) -> Solution:
    """The proven optimum of the joint problem (6)/(8) with the banded waiting time (module doc).

    Args:
        instance: the problem.
        formulation: a name of :data:`kvdro.joint.FORMULATIONS` (same optimum, different relaxations
            and trees): :data:`DEFAULT_FORMULATION` (``"counts"``: integer group counts per band, a
            model whose size does not grow with J), ``"disaggregated"`` (one binary per (groups, band)
            state: a model that grows with J), down the ladder of chapter 5 to ``"mccormick"`` (the
            textbook one, weak); or a :class:`kvdro.joint.formulations.Spec`.
        time_limit: HiGHS time limit [s]; hitting it raises SolverError.
        mip_rel_gap: relative gap at which HiGHS declares optimality.
        prune: drop dominated candidate buffers (exact).

    Returns:
        A :class:`Solution` with status ``"optimal"``, ``objective`` (8a) [cost / s], HiGHS's proven
        ``lower_bound`` and ``mip_gap``, and ``waiting_s`` = W_k of the model at the decision.

    Raises:
        SolverError: HiGHS ends without proven optimality (time limit, numerical trouble, ...).
    """
    _check_solver_args(formulation, time_limit, mip_rel_gap)
    t0 = time.perf_counter()
    res = solve_milp(instance, formulation=formulation, time_limit=time_limit, mip_rel_gap=mip_rel_gap, prune=prune)
    if res.status != cp.OPTIMAL or res.decision is None:
        raise SolverError(f"exact {formulation} MILP (gap {res.mip_gap:.3g} after {res.time_s:.1f} s)", res.status)
    if not res.mip_gap <= max(PROOF_GAP, mip_rel_gap):  # "optimal" is trusted only with its bound
        raise SolverError(f"exact {formulation} MILP (bound {res.bound:.10g}, objective {res.objective:.10g})",
                          f"optimal without proof (gap {res.mip_gap:.3g})")
    z, r, pi, delta = res.decision
    return Solution(
        z=z,
        r=r,
        pi=pi,
        delta=delta,
        objective=res.objective,
        status="optimal",
        solve_time_s=time.perf_counter() - t0,
        mip_gap=res.mip_gap,
        lower_bound=min(res.bound, res.objective) if np.isfinite(res.bound) else res.objective,
        waiting_s=group_state(instance, z, pi, delta).waiting_s,
        method=f"exact-{res.formulation}",
    )
