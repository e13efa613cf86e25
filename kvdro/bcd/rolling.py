"""Rolling-horizon re-optimisation: re-solve on successive windows whose output lengths drift.

The paper runs BCD-DRO as a control-plane policy that re-optimises every few minutes on the latest
samples (its Fig. 5a: static versus rolling horizon). Here a *window* is the same instance with every
class's output samples scaled by a drift factor s_w (:func:`kvdro.workload.shift_outputs`, clipped at
the class's L_max: a generation limit does not drift), and the Wasserstein radius recomputed by the
paper's rule eps_i = 0.15 E[xi_i] on the window's samples. The residence time H (which depends on
E[xi]) and the worst-case costs R_i change with the window; the SLO D_i and the prefix do not.

:func:`reoptimise` solves each window, warm-starting BCD from the previous window's decision;
:func:`carry_over` scores an old decision on a new window (the "static" policy): its routing is
projected onto the new window's constraints (traffic that no longer fits is rejected).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from kvdro.bcd.algorithm import solve_bcd
from kvdro.bcd.blocks import repair_routing
from kvdro.joint import Instance, Solution, evaluate, solve_exact
from kvdro.workload import shift_outputs

__all__ = ["WindowSolve", "carry_over", "drifting_windows", "reoptimise"]


def drifting_windows(instance: Instance, shifts: Sequence[float]) -> list[Instance]:
    """One instance per drift factor s_w > 0: outputs scaled by s_w and clipped at L_max, eps by the
    paper's rule on the scaled samples. ``shifts[0] = 1`` reproduces ``instance``'s samples."""
    shifts = [float(s) for s in shifts]
    if not shifts:
        raise ValueError("shifts: need at least one window")
    for s in shifts:
        if not (np.isfinite(s) and s > 0):
            raise ValueError(f"shifts: every drift factor must be a positive number, got {s!r}")
    out = []
    for w, s in enumerate(shifts):
        classes = tuple(
            replace(c, output_tokens=shift_outputs(c.output_tokens, s, max_output_tokens=c.max_output_tokens))
            for c in instance.classes
        )
        out.append(replace(instance, classes=classes, eps=None, name=f"{instance.name}-window{w}-s{s:g}"))
    return out


def carry_over(instance: Instance, solution: Solution) -> Solution:
    """``solution``'s (z, r, delta) on ``instance``, its routing projected onto this instance's
    utilisation cap and memory (6e) (:func:`kvdro.bcd.blocks.repair_routing`)."""
    pi = repair_routing(instance, solution.z, solution.r, solution.pi, solution.delta)
    return Solution(z=solution.z, r=solution.r, pi=pi, delta=solution.delta, method=f"{solution.method}-carried",
                    status="carried")


@dataclass(frozen=True)
class WindowSolve:
    """One window's re-solve: its index, drift factor, the method, the decision, its evaluated
    objective (8a) [cost / s] and the solve time [s] (wall clock; compare only within one run)."""

    window: int
    shift: float
    method: str
    solution: Solution
    objective: float
    time_s: float


def reoptimise(
    windows: Sequence[Instance],
    shifts: Sequence[float],
    *,
    method: Literal["bcd-warm", "bcd-cold", "exact", "static"] = "bcd-warm",
    time_limit: float = 600.0,
) -> list[WindowSolve]:
    """Solve every window with ``method``.

    ``"bcd-warm"`` starts BCD from the previous window's decision (the first window cold);
    ``"bcd-cold"`` starts every window from the paper's initial point; ``"exact"`` solves every
    window to proven optimality (HiGHS has no warm start through CVXPY here); ``"static"`` solves
    the first window with BCD and carries that decision over (:func:`carry_over`).
    """
    if len(windows) != len(shifts) or not windows:
        raise ValueError("windows, shifts: need the same positive number of windows and drift factors")
    if method not in ("bcd-warm", "bcd-cold", "exact", "static"):
        raise ValueError(f"method: must be bcd-warm, bcd-cold, exact or static, got {method!r}")
    out: list[WindowSolve] = []
    prev: Solution | None = None
    for w, (inst, s) in enumerate(zip(windows, shifts)):
        t0 = time.perf_counter()
        if method == "exact":
            sol = solve_exact(inst, time_limit=time_limit)
        elif method == "static" and prev is not None:
            sol = carry_over(inst, prev)
        else:
            init = prev if (method == "bcd-warm" and prev is not None) else "paper"
            sol = solve_bcd(inst, init=init, time_limit=time_limit)
        dt = time.perf_counter() - t0
        if method != "static" or prev is None:
            prev = sol
        out.append(WindowSolve(w, float(s), method, sol, evaluate(inst, sol).total, 0.0 if method == "static" and w else dt))
    return out
