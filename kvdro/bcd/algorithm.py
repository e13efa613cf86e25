"""BCD-DRO, the paper's Algorithm 1, on the joint problem (6)/(8) of :mod:`kvdro.joint`.

::

    0  init: delta <- 0, r_i <- L_in^i + E[xi_i] (rounded up to a block), z <- Block 3 at (r, delta)
    1  for t = 1, ..., max_iter:
    2      Block 1: repeat LP1 (pi | z, r, delta, bands) and LP2 (r | z, pi, delta) until neither moves
    3      Block 2: delta <- 1[lambda_i pi_ik H_ik / z_k > 1]            (delta_rule="paper")
                    or cache every routed pair that fits (delta_rule="descent", the default)
    4      Block 3: (z, pi) <- argmin over z in the GPU budget, pi re-optimised, for fixed (r, delta)
    5      if the pass left (z, r, pi, delta) unchanged: stop
    6  return the best iterate

Every block's answer (LP1, LP2, Block 3, and Block 2 with the descent rule) replaces the incumbent
only if it lowers the evaluated objective by more than ``tol * max(1, |F|)``; a tie keeps the
incumbent. A pass that changes nothing therefore ran every block at the returned point, which is
what "blockwise optimal" means here (chapter 6, the termination theorem).

Every objective value in the trace is :func:`kvdro.joint.evaluate` of the iterate -- the same scorer
as the exact solver's, so gaps are like for like. Where our model differs from the paper's printed
algorithm, and why (chapter 6 tells the whole story):

* **LP1 and the banded waiting time.** W_k is a step function of the utilisation (band upper edges),
  so LP1 holds each busy configuration's band fixed and caps its utilisation at the band's edge;
  the true W at LP1's answer is then no larger than the W it was charged, and the evaluated
  objective cannot rise (:class:`kvdro.bcd.blocks.RoutingLP`). LP1 alone never moves a
  configuration *up* a band; Block 3 can.
* **LP2** is exact on block-granular reservations: the closed form per class when memory is slack,
  a small knapsack otherwise (:class:`kvdro.bcd.blocks.ReservationStep`). The dual variables
  (gamma, theta) of (8c)-(8g) are not needed: their optimum is R_i(r_i) by the closed form.
* **Block 3** re-optimises the routing with z: with pi held, (6c) forbids closing a configuration in
  use and opening one gains nothing, so z could never leave its initial support.
* **Block 2** is the paper's rule with ``delta_rule="paper"`` (it can raise the objective), or by
  default a descent variant that cannot (:func:`kvdro.bcd.blocks.prefix_descent`), whose change is
  kept only on a strict improvement. With tol > 0 every change of the iterate then lowers the
  objective by more than tol, except dropping caches of pairs with no traffic, which only shrinks
  delta; so the loop stops after finitely many passes (chapter 6, the termination theorem). That
  bound (F_0 / tol passes) proves termination, not speed: ``max_iter`` is what bounds the run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvdro.bcd.blocks import (
    ConfigIP,
    ReservationStep,
    RoutingLP,
    prefix_descent,
    prefix_rule,
    repair_routing,
    utilisation,
)
from kvdro.joint import Instance, Solution, evaluate
from kvdro.joint.serving import group_state

__all__ = ["BLOCKS", "BcdRun", "BlockRecord", "DELTA_RULES", "block_pass", "run_bcd", "solve_bcd"]

#: Names of the steps recorded in a trace, in the order they run.
BLOCKS = ("init", "LP1", "LP2", "delta", "z")
DELTA_RULES = ("paper", "descent")


@dataclass(frozen=True)
class BlockRecord:
    """The iterate after one step: iteration t (0 for the initial point), the step's name
    (:data:`BLOCKS`), the evaluated objective (8a) [cost / s], feasibility, and (z, delta)."""

    iteration: int
    block: str
    objective: float
    feasible: bool
    z: tuple[int, ...]
    cached: int  # number of (i, k) pairs with delta_ik = 1


@dataclass(frozen=True)
class BcdRun:
    """Result of :func:`run_bcd`: the best iterate as a :class:`~kvdro.joint.Solution`, the trace of
    every step, the number of outer iterations, whether a pass left (z, r, pi, delta) unchanged (else
    ``max_iter`` was hit), and counts of the LP / MILP solves."""

    solution: Solution
    trace: tuple[BlockRecord, ...]
    iterations: int
    converged: bool
    solves: dict[str, int]

    def objectives(self) -> np.ndarray:
        """The evaluated objective after every step, in order."""
        return np.array([rec.objective for rec in self.trace])


def _check(max_iter: int, tol: float, inner_iter: int, delta_rule: str) -> None:
    for name, value in (("max_iter", max_iter), ("inner_iter", inner_iter)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating)) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tol: must be a finite number >= 0, got {tol!r}")
    if delta_rule not in DELTA_RULES:
        raise ValueError(f"delta_rule: must be one of {DELTA_RULES}, got {delta_rule!r}")


def _snap(instance: Instance, r: np.ndarray) -> np.ndarray:
    """Reservations rounded to the nearest candidate buffer of each class [tokens]."""
    out = np.empty(instance.n_classes)
    for i, etas in enumerate(instance.candidates):
        eta = float(r[i]) - instance.input_tokens[i]
        out[i] = instance.input_tokens[i] + etas[int(np.argmin(np.abs(etas - eta)))]
    return out


def _paper_reservations(instance: Instance) -> np.ndarray:
    """r_i^(0) = L_in^i + E[xi_i], rounded up to a whole block and capped at the top candidate."""
    out = np.empty(instance.n_classes)
    for i, (c, etas) in enumerate(zip(instance.classes, instance.candidates)):
        k = int(np.searchsorted(etas, c.mean_output_tokens - 1e-9))
        out[i] = instance.input_tokens[i] + etas[min(k, etas.size - 1)]
    return out


def run_bcd(
    instance: Instance,
    *,
    max_iter: int = 20,
    tol: float = 1e-9,
    init: Literal["paper", "cached"] | Solution = "paper",
    delta_rule: Literal["paper", "descent"] = "descent",
    inner_iter: int = 10,
    time_limit: float = 60.0,
) -> BcdRun:
    """Run BCD-DRO (module docstring) and return the best iterate with the full trace.

    Args:
        instance: the joint problem.
        max_iter: outer iterations T_max (>= 1).
        tol: relative improvement below which a block's answer does not replace the incumbent
            (>= 0; with tol > 0 the number of changes is finite, chapter 6).
        init: ``"paper"`` (delta = 0, r = L_in + E[xi] rounded up to a block, z from Block 3),
            ``"cached"`` (the same with every prefix cached, delta = 1: a second start), or a
            :class:`~kvdro.joint.Solution` to warm-start from (reservations snapped to whole blocks,
            routing projected onto this instance's constraints).
        delta_rule: ``"paper"`` (Block 2 as printed) or ``"descent"`` (never raises the objective).
        inner_iter: LP1/LP2 alternations per Block 1 (>= 1).
        time_limit: HiGHS time limit of each Block 3 integer program [s].

    Raises:
        ValueError: a bad argument (named in the message).
        SolverError: an LP or integer program ends with a status other than optimal.
    """
    _check(max_iter, tol, inner_iter, delta_rule)
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise ValueError(f"time_limit: must be a positive number of seconds, got {time_limit!r}")
    t0 = time.perf_counter()
    I, K = instance.n_classes, instance.n_configs
    lp1, lp2, ip = RoutingLP(instance), ReservationStep(instance), ConfigIP(instance)
    trace: list[BlockRecord] = []
    best: dict = {}
    block3: dict = {}

    def score(it: int, block: str, z, r, pi, d) -> float:
        ev = evaluate(instance, Solution(z=z, r=r, pi=pi, delta=d))
        f = ev.total if ev.feasible else math.inf
        trace.append(BlockRecord(it, block, f, ev.feasible, tuple(int(v) for v in z), int(np.sum(d))))
        if ev.feasible and f <= best.get("f", math.inf):  # the latest of equal iterates
            best.update(f=f, z=np.array(z), r=np.array(r), pi=np.array(pi), d=np.array(d))
        return f

    if isinstance(init, Solution):
        if init.z.shape != (K,) or init.r.shape != (I,):
            raise ValueError(f"init: shapes z {init.z.shape}, r {init.r.shape} do not match K={K}, I={I}")
        if instance.gpus @ init.z > instance.total_gpus or np.any(init.z < 0):
            raise ValueError("init: its z does not fit the GPU budget J of this instance")
        z, d = init.z.copy(), init.delta.copy() & (init.z[None, :] >= 1)
        r = _snap(instance, init.r)
        pi = repair_routing(instance, z, r, init.pi, d)
    elif init in ("paper", "cached"):
        d = np.zeros((I, K), dtype=bool) if init == "paper" else np.ones((I, K), dtype=bool)
        r = _paper_reservations(instance)
        z, pi, _ = ip.solve(r, d, time_limit)
        block3[(r.tobytes(), d.tobytes())] = (z.copy(), pi.copy())
    else:
        raise ValueError(f"init: must be 'paper', 'cached' or a kvdro.joint.Solution, got {init!r}")
    f = score(0, "init", z, r, pi, d)

    def improves(f_new: float, f_old: float) -> bool:
        return f_new < f_old - tol * max(1.0, abs(f_old))

    def objective(z_, r_, pi_, d_) -> float:
        ev = evaluate(instance, Solution(z=z_, r=r_, pi=pi_, delta=d_))
        return ev.total if ev.feasible else math.inf

    converged = False
    it = 0
    for it in range(1, max_iter + 1):
        start = (z.copy(), r.copy(), pi.copy(), d.copy())
        # Block 1: LP1 / LP2 alternation; each answer is taken only if it lowers the objective by more
        # than tol (a tie keeps the incumbent, so an unchanged pass means every block saw this point)
        for _ in range(inner_iter):
            moved = False
            bands = lp1.bands_for(z, utilisation(instance, z, pi, d))
            pi_new, _ = lp1.solve(z, r, d, bands)
            f_new = objective(z, r, pi_new, d)
            if improves(f_new, f):
                pi, moved = pi_new, True
            f = score(it, "LP1", z, r, pi, d)
            r_new = lp2.solve(z, r, pi, d)
            f_new = objective(z, r_new, pi, d)
            if improves(f_new, f):
                r, moved = r_new, True
            f = score(it, "LP2", z, r, pi, d)
            if not moved:
                break
        # Block 2: prefix caching
        if delta_rule == "paper":
            d = prefix_rule(instance, z, pi)
            pi = repair_routing(instance, z, r, pi, d)
        else:  # the new caching only on a strict improvement; else just drop caches nobody uses
            proposal = prefix_descent(instance, z, r, pi, d)
            routed = (pi > 0) & (z[None, :] >= 1)
            d = proposal if improves(objective(z, r, pi, proposal), f) else d & routed
        f = score(it, "delta", z, r, pi, d)
        # Block 3: configurations (with routing), kept only on a strict improvement. Its optimum
        # depends on (r, delta) alone, so an unchanged (r, delta) needs no new solve.
        key = (r.tobytes(), d.tobytes())
        if key not in block3:
            block3[key] = ip.solve(r, d, time_limit)[:2]
        z_new, pi_new = block3[key]
        if improves(objective(z_new, r, pi_new, d), f):
            z, pi = z_new.copy(), pi_new.copy()
        f = score(it, "z", z, r, pi, d)
        # stop when a whole pass left (z, r, pi, delta) as it found them: every block was then run at
        # this very point and none lowered the objective by more than tol (blockwise optimal, chapter 6)
        if all(np.array_equal(a, b) for a, b in zip((z, r, pi, d), start)):
            converged = True
            break

    if not best:  # every iterate infeasible: cannot happen (rejecting everything is feasible)
        raise RuntimeError("BCD found no feasible iterate")
    zb, rb, pib, db = best["z"], best["r"], best["pi"], best["d"]
    solution = Solution(
        z=zb,
        r=rb,
        pi=pib,
        delta=db,
        objective=best["f"],
        status="converged" if converged else "max_iter",
        solve_time_s=time.perf_counter() - t0,
        waiting_s=group_state(instance, zb, pib, db).waiting_s,
        method=f"bcd-{delta_rule}",
    )
    solves = {"LP1": lp1.solves, "LP2": lp2.solves, "LP2 knapsack": lp2.knapsacks, "Block 3 IP": ip.solves}
    return BcdRun(solution=solution, trace=tuple(trace), iterations=it, converged=converged, solves=solves)


def solve_bcd(
    instance: Instance,
    *,
    max_iter: int = 20,
    tol: float = 1e-9,
    init: Literal["paper", "cached"] | Solution = "paper",
    delta_rule: Literal["paper", "descent"] = "descent",
    inner_iter: int = 10,
    time_limit: float = 60.0,
) -> Solution:
    """BCD-DRO's decision for ``instance`` (:func:`run_bcd` without the trace)."""
    return run_bcd(
        instance, max_iter=max_iter, tol=tol, init=init, delta_rule=delta_rule,
        inner_iter=inner_iter, time_limit=time_limit,
    ).solution


def block_pass(instance: Instance, solution: Solution, delta_rule: Literal["paper", "descent"] = "descent") -> dict[str, float]:
    """Every block run once at ``solution`` with models built afresh, each answer scored by
    :func:`~kvdro.joint.evaluate` [cost / s] (inf if infeasible): ``"LP1"`` (at the solution's own
    bands), ``"LP2"``, ``"delta"`` (Block 2's proposal; the rule's output with ``delta_rule="paper"``)
    and ``"z"`` (Block 3). A point is blockwise optimal (chapter 6) when none of these is below its
    own objective by more than the tolerance -- a check that does not trust the run that produced it.
    """
    if delta_rule not in DELTA_RULES:
        raise ValueError(f"delta_rule: must be one of {DELTA_RULES}, got {delta_rule!r}")
    z, r, pi, d = solution.z, solution.r, solution.pi, solution.delta

    def f(z_, r_, pi_, d_) -> float:
        ev = evaluate(instance, Solution(z=z_, r=r_, pi=pi_, delta=d_))
        return ev.total if ev.feasible else math.inf

    lp1 = RoutingLP(instance)
    pi1, _ = lp1.solve(z, r, d, lp1.bands_for(z, utilisation(instance, z, pi, d)))
    proposal = prefix_descent(instance, z, r, pi, d) if delta_rule == "descent" else prefix_rule(instance, z, pi)
    z3, pi3, _ = ConfigIP(instance).solve(r, d)
    return {
        "LP1": f(z, r, pi1, d),
        "LP2": f(z, ReservationStep(instance).solve(z, r, pi, d), pi, d),
        "delta": f(z, r, pi, proposal),
        "z": f(z3, r, pi3, d),
    }
