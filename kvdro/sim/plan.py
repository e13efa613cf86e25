"""Simulate a plan of the joint problem directly: ``python -m kvdro simulate --plan plan.json``.

A *plan document* is what ``python -m kvdro solve ... --json`` prints: ``instance`` (size, seed,
load, serving), ``solution`` (z, r, pi, delta, ...), ``cost`` (8a) and ``predicted`` (what the
planner's serving model expects: :func:`kvdro.joint.objective.predict_serving`).
:func:`simulate_plan` rebuilds the instance (:func:`kvdro.joint.paper_instance`) and the decision,
and serves a trace with the plan's deployment, routing, prefix caching and buffers
(:func:`deployment_from_solution`, :func:`buffers_from_solution`; policy ``dro`` with the plan's
buffers, the instance's costs). The trace is the instance's own **test half**
(:func:`kvdro.joint.paper.paper_trace`) unless another is given.

A plan carries the **fingerprint** of its instance (:func:`instance_fingerprint`: name, size,
classes, J, seed, load, serving model, configurations and a digest of the class samples), written
by ``solve``. :func:`simulate_plan` rebuilds the instance from ``instance`` and refuses a plan whose
fingerprint differs (a ValueError naming both), or warns (:class:`PlanMismatchWarning`, naming
both) when the caller serves another trace on purpose; the decision must match the instance's
shapes, with z >= 0 and pi > 0 only where z > 0 (:meth:`kvdro.joint.Solution.check`).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvdro.sim.deployment import buffers_from_solution, deployment_from_solution
from kvdro.sim.simulate import SimResult, simulate

__all__ = ["FINGERPRINT_KEYS", "PlanMismatchWarning", "instance_fingerprint", "simulate_solution", "observed",
           "solution_from_dict", "simulate_plan"]

#: What a plan's ``fingerprint`` holds (:func:`instance_fingerprint`).
FINGERPRINT_KEYS = ("name", "size", "classes", "J", "seed", "load", "serving", "configs", "samples_sha256")


class PlanMismatchWarning(UserWarning):
    """A plan served on purpose (another trace given) although it was made for another instance."""


def instance_fingerprint(instance, *, size: str, seed: int, load: float) -> dict:
    """What identifies the instance a plan was made for: its name, size, number of classes, J,
    seed, load, serving model, configuration names and ``samples_sha256`` (16 hex digits of the
    SHA-256 of the class names and their integer prompt and output samples [tokens] -- integers,
    so the digest is the same on every machine; it tells two seeds' draws apart)."""
    h = hashlib.sha256()
    for c in instance.classes:
        h.update(c.name.encode() + b"\0")
        for arr in (c.input_tokens, c.output_tokens):
            h.update(np.ascontiguousarray(np.round(np.asarray(arr, dtype=float)), dtype="<i8").tobytes())
    return {"name": instance.name, "size": str(size), "classes": int(instance.n_classes),
            "J": int(instance.total_gpus), "seed": int(seed), "load": float(load), "serving": str(instance.serving),
            "configs": [cfg.config.name for cfg in instance.configs], "samples_sha256": h.hexdigest()[:16]}


def _describe(fp: Mapping) -> str:
    return (f"{fp.get('name')} ({fp.get('classes')} classes, J = {fp.get('J')}, seed {fp.get('seed')}, "
            f"load {fp.get('load')}, serving {fp.get('serving')}, samples {fp.get('samples_sha256')})")


def simulate_solution(instance, solution, trace: pd.DataFrame, *, seed: int = 0) -> SimResult:
    """Serve ``trace`` with the plan ``solution`` of ``instance``: its deployment, routing, caching
    and buffers (policy ``dro`` with the plan's buffers) and the instance's costs.

    Raises:
        ValueError: a decision that does not fit ``instance`` (:meth:`kvdro.joint.Solution.check`).
    """
    solution.check(instance)
    costs = {"c_p": instance.c_p, "c_w": instance.c_w, "c_slo": instance.c_slo, "c_rej": instance.c_rej,
             "c_gpu": instance.c_gpu}
    # deadline="class": the plan's own goodput prediction (and the SLO term (6f) it priced) judges a
    # request by its class's D_i, so the engine's goodput is read the same way here (chapter 11).
    return simulate(trace, policy="dro", buffers=buffers_from_solution(instance, solution),
                    deployment=deployment_from_solution(instance, solution), rho=instance.c_p / instance.c_w,
                    costs=costs, rng=np.random.default_rng([int(seed), 4]), deadline="class")


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
    try:
        return Solution(z=d["z"], r=d["r"], pi=d["pi"], delta=d["delta"], method=str(d.get("method", "plan")),
                        status=str(d.get("status", "unknown")))
    except ValueError as exc:
        raise ValueError(f"plan: 'solution': {exc}") from None


def simulate_plan(plan: Mapping, trace: pd.DataFrame | None = None, *, seed: int = 0) -> tuple[SimResult, dict]:
    """Simulate a plan document (module docstring) on ``trace`` (default: the instance's test half).

    Returns (result, summary): ``summary`` holds ``observed`` beside the plan's ``predicted``.

    Raises:
        ValueError: a malformed plan (naming the missing key), a plan without a fingerprint (made
            before plans carried one: regenerate it with ``solve --json``), a fingerprint that does
            not match the instance rebuilt from ``instance`` (both named) when ``trace`` is None, a
            decision that does not fit the instance, or a bad trace.

    Warns:
        PlanMismatchWarning: the fingerprint does not match but ``trace`` was given on purpose.
    """
    from kvdro.joint import paper_instance
    from kvdro.joint.paper import paper_trace

    if not isinstance(plan, Mapping) or "instance" not in plan or "solution" not in plan:
        raise ValueError("plan: need the 'instance' and 'solution' of `python -m kvdro solve --json`")
    info = plan["instance"]
    try:
        size, iseed, load = str(info["size"]), int(info["seed"]), float(info["load"])
        serving = str(info.get("serving", "analytic"))
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ValueError("plan: 'instance' needs size, seed and load") from None
    regenerate = f"python -m kvdro solve --instance {size} --seed {iseed} --load {load:g} --serving {serving} --json > plan.json"
    fp = plan.get("fingerprint")
    if not isinstance(fp, Mapping):
        raise ValueError("plan: no 'fingerprint' of the instance it was made for (plans written before issue 29 "
                         f"lack it); regenerate the plan: `{regenerate}`")
    if size not in ("small", "large"):
        raise ValueError(f"plan: instance size {size!r} cannot be rebuilt here (small or large)")
    instance = paper_instance(size, iseed, load=load, serving=serving)
    now = instance_fingerprint(instance, size=size, seed=iseed, load=load)
    differ = [k for k in FINGERPRINT_KEYS if fp.get(k) != now[k]]
    if differ:
        msg = (f"plan: made for instance {_describe(fp)}, but its 'instance' block rebuilds {_describe(now)} "
               f"(differ: {', '.join(differ)})")
        if trace is None:
            raise ValueError(f"{msg}; regenerate the plan: `{regenerate}`")
        warnings.warn(f"{msg}; serving it on the trace given anyway", PlanMismatchWarning, stacklevel=2)
    solution = solution_from_dict(plan["solution"])
    solution.check(instance, argument="plan: 'solution'")
    names = plan["solution"].get("classes")
    if names is not None and list(names) != [c.name for c in instance.classes]:
        raise ValueError(f"plan: 'solution' is for classes {list(names)}, the instance {instance.name} has "
                         f"{[c.name for c in instance.classes]}")
    if trace is None:
        trace = paper_trace(size, iseed, load=load, part="test")
    result = simulate_solution(instance, solution, trace, seed=seed)
    summary = {"observed": observed(instance, result), "predicted": plan.get("predicted"),
               "deployment": result.deployment.describe()}
    return result, summary
