"""Simulate a plan of the joint problem directly: ``python -m kvdro simulate --plan plan.json``.

A *plan document* is what ``python -m kvdro solve ... --json`` prints: ``instance`` (size, seed,
load, serving), ``solution`` (z, r, pi, delta, ...), ``cost`` (8a) and ``predicted`` (what the
planner's serving model expects: :func:`kvdro.joint.objective.predict_serving`).
:func:`simulate_plan` rebuilds the instance (:func:`kvdro.joint.paper_instance`) and the decision,
and serves a trace with the plan's deployment, routing, prefix caching and buffers
(:func:`deployment_from_solution`, :func:`buffers_from_solution`; policy ``dro`` with the plan's
buffers, the instance's costs). The trace is the instance's own **test half**
(:func:`kvdro.joint.paper.paper_trace`) unless another is given.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvdro.sim.deployment import buffers_from_solution, deployment_from_solution
from kvdro.sim.simulate import SimResult, simulate

__all__ = ["simulate_solution", "observed", "solution_from_dict", "simulate_plan"]


def simulate_solution(instance, solution, trace: pd.DataFrame, *, seed: int = 0) -> SimResult:
    """Serve ``trace`` with the plan ``solution`` of ``instance``: its deployment, routing, caching
    and buffers (policy ``dro`` with the plan's buffers) and the instance's costs."""
    costs = {"c_p": instance.c_p, "c_w": instance.c_w, "c_slo": instance.c_slo, "c_rej": instance.c_rej,
             "c_gpu": instance.c_gpu}
    return simulate(trace, policy="dro", buffers=buffers_from_solution(instance, solution),
                    deployment=deployment_from_solution(instance, solution), rho=instance.c_p / instance.c_w,
                    costs=costs, rng=np.random.default_rng([int(seed), 4]))


def observed(instance, result: SimResult) -> dict:
    """The simulator's counterparts of ``predicted``: mean end-to-end time of served requests [s],
    goodput [req/s], mean KV use (share), per-class mean end-to-end time [s], and the cost per second
    realised (what the engine paid) and in the paper's accounting (every overflow token charged c_p)."""
    req = result.requests
    done = req[req["outcome"].isin(("completed", "truncated"))]
    per = done.groupby("request_class")["e2e_s"].mean()
    ok = done[done["e2e_s"] <= done["slo_s"]].groupby("request_class").size()
    c = result.cost
    paper = (c["newsvendor"] + c["slo"] + c["rejection"] + c["gpu"]) / c["horizon_s"]
    return {
        "e2e_mean_s": float(done["e2e_s"].mean()),
        "goodput_rps": float(result.metrics["goodput_rps"]),
        "kv_utilisation_mean": float(result.metrics["kv_utilisation_mean"]),
        "per_class_e2e_mean_s": {ci.name: (float(per[ci.name]) if ci.name in per.index else None) for ci in instance.classes},
        "per_class_goodput_rps": {ci.name: float(ok.get(ci.name, 0)) / c["horizon_s"] for ci in instance.classes},
        "cost_realised_per_s": float(c["per_second"]),
        "cost_paper_per_s": float(paper),
    }


def solution_from_dict(d: Mapping):
    """A :class:`kvdro.joint.Solution` from ``solve --json``'s ``solution`` (ValueError names a missing key)."""
    from kvdro.joint import Solution

    if not isinstance(d, Mapping):
        raise ValueError("plan: 'solution' must be an object")
    missing = [k for k in ("z", "r", "pi", "delta") if k not in d]
    if missing:
        raise ValueError(f"plan: 'solution' lacks {missing}")
    return Solution(z=d["z"], r=d["r"], pi=d["pi"], delta=d["delta"], method=str(d.get("method", "plan")),
                    status=str(d.get("status", "unknown")))


def simulate_plan(plan: Mapping, trace: pd.DataFrame | None = None, *, seed: int = 0) -> tuple[SimResult, dict]:
    """Simulate a plan document (module docstring) on ``trace`` (default: the instance's test half).

    Returns (result, summary): ``summary`` holds ``observed`` beside the plan's ``predicted``.

    Raises:
        ValueError: a malformed plan (naming the missing key) or trace.
    """
    from kvdro.joint import paper_instance
    from kvdro.joint.paper import paper_trace

    if not isinstance(plan, Mapping) or "instance" not in plan or "solution" not in plan:
        raise ValueError("plan: need the 'instance' and 'solution' of `python -m kvdro solve --json`")
    info = plan["instance"]
    try:
        size, iseed, load = str(info["size"]), int(info["seed"]), float(info["load"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("plan: 'instance' needs size, seed and load") from None
    instance = paper_instance(size, iseed, load=load)
    solution = solution_from_dict(plan["solution"])
    if trace is None:
        trace = paper_trace(size, iseed, load=load, part="test")
    result = simulate_solution(instance, solution, trace, seed=seed)
    summary = {"observed": observed(instance, result), "predicted": plan.get("predicted"),
               "deployment": result.deployment.describe()}
    return result, summary
