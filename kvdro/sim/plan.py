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

A trace given instead of the test half must name the plan's classes. A registry trace of the small
instance's families (``azure-2023-code``: class ``code``; ``azure-2023-conv``: ``conversation``) is
mapped onto them by :func:`match_plan_classes`: each request goes to its family's short / medium /
long sub-class by the input-length edges the instance was built with (the whole trace's terciles,
:func:`kvdro.workload.split_by_input_quantile`, as :func:`kvdro.joint.paper.azure_classes`). Any
other class is refused with a ValueError saying how to map it.

What the plan fixes -- the policy (``dro`` with the plan's buffers), the cost ratio rho = c_p / c_w,
the configurations and the number of groups -- cannot be changed here; the engine (and its
implementation), the ``max_new_tokens`` requests carry (``"policy"``: the plan's own eta_i, the
paper's reservation inside an engine that reserves against it), the reading of a reservation
(soft / hard), the queue order, the context window, the routing seed and a multiplier of the
arrival rate (``scale``) can (``python -m kvdro simulate --plan`` refuses the former flags
with exit 2, :data:`FIXED_BY_PLAN`).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvdro.sim.deployment import buffers_from_solution, deployment_from_solution
from kvdro.sim.simulate import SimResult, simulate

__all__ = ["FINGERPRINT_KEYS", "FIXED_BY_PLAN", "PlanMismatchWarning", "instance_fingerprint", "match_plan_classes",
           "simulate_solution", "observed", "solution_from_dict", "simulate_plan"]

#: ``simulate`` flags a plan fixes (flag -> what fixes it): refused with ``--plan``.
FIXED_BY_PLAN: dict[str, str] = {
    "--policy": "the plan is served by policy dro with its own buffers r_i",
    "--rho": "the plan's instance fixes the cost ratio c_p / c_w",
    "--config": "the plan's z fixes the configurations",
    "--groups": "the plan's z fixes the number of groups",
}

#: The registry traces the small instance's classes come from: dataset -> its class (family) name.
_FAMILIES = {"azure-2023-code": "code", "azure-2023-conv": "conversation"}

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


def match_plan_classes(trace: pd.DataFrame, instance) -> pd.DataFrame:
    """``trace`` with its classes mapped onto the instance's (module docstring).

    A trace whose classes are all the instance's is returned as is. A class ``c`` the instance
    splits into ``c-short``, ``c-medium``, ``c-long`` and that is a family of the small instance's
    registry traces is split by that trace's input-length edges [tokens] (the first sub-class whose
    upper edge is >= the request's prompt; longer prompts go to ``-long``).

    Raises:
        ValueError: a class the plan has no sub-classes for, naming it, the plan's classes and how to map.
    """
    from kvdro.datasets import load_trace
    from kvdro.workload import split_by_input_quantile

    names = [c.name for c in instance.classes]
    have = [str(c) for c in pd.unique(trace["request_class"])]
    labels = ("short", "medium", "long")
    families = {f: d for d, f in _FAMILIES.items()}
    unmatched = [c for c in have if c not in names]
    if not unmatched:
        return trace
    bad = [c for c in unmatched if c not in families or any(f"{c}-{b}" not in names for b in labels)]
    if bad:
        raise ValueError(
            f"--trace: no plan class for the trace's class(es) {bad}: the plan serves {names}. A registry trace of "
            f"{', '.join(sorted(_FAMILIES))} is split into the plan's sub-classes by prompt length; for another trace "
            "give each request one of the plan's class names (column request_class, kvdro.sim.plan.simulate_plan"
            "(plan, trace) in Python) or solve a plan for that trace")
    out = trace.copy()
    cls = out["request_class"].astype(object).to_numpy(copy=True)
    x = out["input_tokens"].to_numpy()
    for c in unmatched:
        edges = np.asarray(split_by_input_quantile(load_trace(families[c]), 3).attrs["input_edges"][c], dtype=float)
        mask = cls == c
        bucket = np.clip(np.searchsorted(edges[1:-1], x[mask], side="left"), 0, 2)
        cls[mask] = [f"{c}-{labels[b]}" for b in bucket]
    out["request_class"] = pd.Series(cls, index=out.index, dtype=object)
    return out


def simulate_solution(instance, solution, trace: pd.DataFrame, *, seed: int = 0, engine: str = "fast",
                      implementation: str | None = None, max_new: str | int = "unset", reservation: str = "soft",
                      schedule: str = "fcfs", progress: bool = False, **settings) -> SimResult:
    """Serve ``trace`` with the plan ``solution`` of ``instance``: its deployment, routing, caching
    and buffers (policy ``dro`` with the plan's buffers) and the instance's costs.

    ``engine``, ``implementation``, ``max_new``, ``reservation``, ``schedule`` and ``progress`` go to
    :func:`kvdro.sim.simulate`; ``settings`` (e.g. ``max_model_len``) to the
    :class:`~kvdro.sim.Deployment`. With ``max_new="policy"`` each request carries its class's planned
    reservation eta_i as ``max_new_tokens`` (rounded up): the plan inside an engine that reserves
    against ``max_new`` (TensorRT-LLM, LightLLM, SGLang), its under-reservations capped
    (:mod:`kvdro.sim.engine_choice`); ``"policy-soft"`` reserves eta_i without capping.

    Raises:
        ValueError: a decision that does not fit ``instance`` (:meth:`kvdro.joint.Solution.check`).
    """
    solution.check(instance)
    costs = {"c_p": instance.c_p, "c_w": instance.c_w, "c_slo": instance.c_slo, "c_rej": instance.c_rej,
             "c_gpu": instance.c_gpu}
    # deadline="class": the plan's own goodput prediction (and the SLO term (6f) it priced) judges a
    # request by its class's D_i, so the engine's goodput is read the same way here (chapter 11).
    return simulate(trace, policy="dro", buffers=buffers_from_solution(instance, solution),
                    deployment=deployment_from_solution(instance, solution, **settings), rho=instance.c_p / instance.c_w,
                    costs=costs, rng=np.random.default_rng([int(seed), 4]), deadline="class", engine=engine,
                    implementation=implementation, max_new=max_new, reservation=reservation, schedule=schedule,
                    progress=progress)


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


def simulate_plan(plan: Mapping, trace: pd.DataFrame | None = None, *, seed: int = 0, scale: float = 1.0,
                  **run) -> tuple[SimResult, dict]:
    """Simulate a plan document (module docstring) on ``trace`` (default: the instance's test half).

    ``scale`` multiplies the trace's arrival rate (``arrival_s / scale``); ``run`` goes to
    :func:`simulate_solution` (``engine``, ``implementation``, ``max_new``, ``reservation``, ``schedule``,
    ``progress``, ``max_model_len``).

    Returns (result, summary): ``summary`` holds ``observed`` beside the plan's ``predicted`` (made
    for the instance's own load: with ``scale`` != 1 or another trace they answer different traffic).

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
    else:
        trace = match_plan_classes(trace, instance)
    if scale != 1.0:
        from kvdro.sim.cli import _scaled

        trace = _scaled(trace, scale)
    result = simulate_solution(instance, solution, trace, seed=seed, **run)
    summary = {"observed": observed(instance, result), "predicted": plan.get("predicted"),
               "deployment": result.deployment.describe(), "scale": float(scale),
               "reservation": run.get("reservation", "soft"), "schedule": run.get("schedule", "fcfs"),
               "engine": result.engine, "implementation": result.implementation, "max_new": result.max_new}
    return result, summary
