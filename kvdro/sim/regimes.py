"""The regime map: where memory binds, where the queue grows, where nothing binds (chapters 7-9).

Every cell is one 8-GPU deployment serving the **second half** of a real trace (by arrival, the
part the experiments test on; its arrival times re-zeroed and divided by ``load``, so the trace's
burstiness is kept) under vLLM's own policy, and, beside it, the soft DRO reservation at rho = 10.
Goodput and SLO violation use each request's own deadline, D = 2 s + 0.1 s x its xi
(``simulate``'s default ``deadline="request"``). Each cell is classified by rules written here,
before the sweep (:func:`classify`), all on ``vllm``'s run:

* **stable** (judged by the queue, not by latency): the engines drain within
  :data:`DRAIN_SATURATED` (5 %) of the arrival span after the last arrival, **and** the backlog does
  not grow between the two halves of the trace -- the time-average number of requests waiting for
  their first admission over the second half of the arrival span is at most the first half's plus
  :data:`BACKLOG_SLACK` (one request). A cell that is not stable is **saturated** (its queue
  outgrows the trace, whatever binds);
* **memory-bound**: mean KV use >= :data:`KV_MEMORY_BOUND` (60 %) and ``vllm`` preempts (the
  paper's premise: the reservation decides who waits and who is thrown out);
* **light** (nothing binds): stable, no preemption, mean KV use < :data:`KV_LIGHT` (50 %), and
  latency has not grown with load: ``vllm``'s SLO violation is within
  :data:`SLO_EXCESS_SATURATED` (10 points) of the deployment's own at the map's lowest load (bigger
  batches slow every step: compute binds before the queue grows);
* regime labels: ``"memory-bound"`` (memory-bound and stable), ``"memory-bound, saturated"``,
  ``"compute-saturated"`` (saturated, memory not binding), ``"light"``, otherwise ``"between"``.

:func:`choose_operating_points` applies a rule to the map to name the operating points the paper is
tested in; :data:`NAMED_POINTS` names the cells it picked, and :data:`OPERATING_POINTS` (read lazily
from ``data/sim_regimes.csv``, checked against its manifest) holds those named rows -- refusing a map
that lacks them or where the rule now picks others:

* ``"memory"`` (the primary point): among the memory-bound, stable cells of the conversation trace
  on a deployment of one configuration (the experiments' deployments), the one with the lowest
  ``vllm`` SLO violation (ties: the lower load). If no cell is both, the nearest: among stable
  cells where ``vllm`` preempts, the highest mean KV use (``exact=False`` says so).
* ``"light"``: on the paper's default 2 x TP4-PP1, the highest load at which nothing binds.

:func:`memory_bound_stable` lists every memory-bound, stable cell (the headroom study reports them
all). ``python -m kvdro.bench sim --regimes`` regenerates the CSV.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.sim.deployment import Deployment

__all__ = [
    "DEPLOYMENTS",
    "LOADS",
    "TRACES",
    "KV_MEMORY_BOUND",
    "KV_LIGHT",
    "DRAIN_SATURATED",
    "BACKLOG_SLACK",
    "backlog_halves",
    "memory_bound_stable",
    "SLO_EXCESS_SATURATED",
    "OperatingPoint",
    "deployment",
    "at_load",
    "regime_map",
    "classify",
    "choose_operating_points",
    "load_regime_map",
    "MAP_KEY",
    "NAMED_POINTS",
    "named_operating_points",
    "OPERATING_POINTS",
]

#: Deployments of the paper's J = 8 A100-80GB: label -> serving groups.
DEPLOYMENTS: dict[str, tuple[str, ...]] = {
    "2 x TP4-PP1": ("TP4-PP1",) * 2,
    "4 x TP2-PP1": ("TP2-PP1",) * 4,
    "TP4-PP1 + 2 x TP2-PP1": ("TP4-PP1", "TP2-PP1", "TP2-PP1"),
    "1 x TP4-PP2": ("TP4-PP2",),
}
#: Loads: multipliers of the trace's own arrival rate.
LOADS: tuple[float, ...] = (0.2, 0.35, 0.5, 0.6, 0.65, 0.7, 0.75, 0.85, 1.0, 1.25, 1.5)
#: Trace label -> dataset name (:data:`kvdro.datasets.REGISTRY`).
TRACES: dict[str, str] = {"conversation": "azure-2023-conv", "code": "azure-2023-code"}
#: Mean KV use from which a cell is memory-bound (if ``vllm`` also preempts there).
KV_MEMORY_BOUND = 0.60
#: Mean KV use below which (with no preemption) nothing binds.
KV_LIGHT = 0.50
#: Drain time after the last arrival, as a share of the arrival span, above which queues grow.
DRAIN_SATURATED = 0.05
#: A backlog "grows" if its second-half mean exceeds the first half's by more than this [requests].
BACKLOG_SLACK = 1.0
#: SLO violation above the deployment's own at the lowest load from which latency has grown (a
#: cell that is stable but above it is not light).
SLO_EXCESS_SATURATED = 0.10
#: The reservation policy simulated beside ``vllm`` in every cell, and its cost ratio.
RESERVATION_POLICY, RESERVATION_RHO = "dro", 10.0


def deployment(label: str, **settings) -> Deployment:
    """The deployment ``label`` of :data:`DEPLOYMENTS`; requests are routed in proportion to the GPUs
    of each group (a TP4 group gets twice a TP2 group's share), nothing rejected."""
    if label not in DEPLOYMENTS:
        raise ValueError(f"deployment: must be one of {list(DEPLOYMENTS)}, got {label!r}")
    groups = DEPLOYMENTS[label]
    gpus = np.array([int(g.split("-")[0][2:]) * int(g.split("-")[1][2:]) for g in groups], dtype=float)
    return Deployment(groups=groups, default_routing=tuple(gpus / gpus.sum()), name=label, **settings)


def at_load(test: pd.DataFrame, load: float) -> pd.DataFrame:
    """A trace part re-zeroed in time and replayed at ``load`` times its own rate."""
    if not (np.isfinite(load) and load > 0):
        raise ValueError(f"load: must be a positive number, got {load!r}")
    return test.assign(arrival_s=(test["arrival_s"] - test["arrival_s"].min()) / load)


def _cell(test: pd.DataFrame, train: pd.DataFrame, dep: Deployment, policy: str, seed: int) -> dict:
    from kvdro.sim.policies import policy_buffers
    from kvdro.sim.simulate import simulate

    buffers = None if policy == "vllm" else policy_buffers(policy, train, rho=RESERVATION_RHO)
    r = simulate(test, policy=policy, buffers=buffers, deployment=dep, rho=RESERVATION_RHO, rng=np.random.default_rng(seed))
    m = r.metrics
    span = float(test["arrival_s"].max() - test["arrival_s"].min())
    end = max(o.end_ps for o in r.outputs) / 1e12
    return {
        "kv_mean": m["kv_utilisation_mean"],
        "kv_peak": float((r.engines["kv_use_peak"]).max()),
        "preemptions": m["preemptions"],
        "slo_violation": m["slo_violation_rate"],
        "e2e_p99_s": m["e2e_p99_s"],
        "ttft_p99_s": m["ttft_p99_s"],
        "goodput_rps": m["goodput_rps"],
        "mean_batch": m["mean_batch"],
        "drain_share": max(0.0, end - span) / span,
        **dict(zip(("backlog_first", "backlog_second"), backlog_halves(r.requests))),
        "wait_share": float(r.requests["wait_s"].mean() / r.requests["e2e_s"].mean()),
    }


def backlog_halves(requests: pd.DataFrame) -> tuple[float, float]:
    """Time-average number of requests waiting for their first admission over the first and the
    second half of the arrival span [requests] (a request waits from ``arrival_s`` to ``admit_s``;
    rejected and ignored requests never wait). From :attr:`SimResult.requests`."""
    a = requests["arrival_s"].to_numpy(dtype=float)
    if a.size == 0:
        raise ValueError("requests: empty")
    b = requests["admit_s"].to_numpy(dtype=float)
    t0, span = float(a.min()), float(a.max() - a.min())
    if span <= 0:
        return 0.0, 0.0
    a, b = a - t0, b - t0
    waiting = np.isfinite(b)
    a, b = a[waiting], b[waiting]
    half = span / 2
    out = []
    for lo, hi in ((0.0, half), (half, span)):
        out.append(float(np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0.0, None).sum() / half))
    return out[0], out[1]


def regime_map(traces: dict[str, pd.DataFrame], *, deployments=tuple(DEPLOYMENTS), loads=LOADS, seed: int = 0,
               progress: bool = False) -> pd.DataFrame:
    """One row per (trace, deployment, load): ``vllm``'s KV use, preemptions, SLO violation, P99,
    drain share, and the soft DRO reservation's (columns ``dro_*``), then :func:`classify`."""
    from kvdro.sim.studies import split_half

    jobs = [(tn, dn, load) for tn in traces for dn in deployments for load in loads]
    iterator = jobs
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(jobs, desc="regime map", leave=False)
    halves = {tn: split_half(tr) for tn, tr in traces.items()}
    rows = []
    for tn, dn, load in iterator:
        train, test = halves[tn]
        test = at_load(test, load)
        dep = deployment(dn)
        row = {"trace": tn, "deployment": dn, "load": load, "rate_rps": (len(test) - 1) / float(test["arrival_s"].max())}
        row.update(_cell(test, train, dep, "vllm", seed))
        row.update({f"dro_{k}": v for k, v in _cell(test, train, dep, RESERVATION_POLICY, seed).items()})
        rows.append(row)
    return classify(pd.DataFrame(rows))


def classify(frame: pd.DataFrame) -> pd.DataFrame:
    """Add ``stable``, ``memory_bound``, ``saturated`` (= not stable), ``light`` and ``regime``
    columns by the module's rules. A frame without backlog columns is judged by its drain alone."""
    out = frame.copy()
    lowest = out.loc[out.groupby(["trace", "deployment"])["load"].idxmin()].set_index(["trace", "deployment"])["slo_violation"]
    out["slo_floor"] = [lowest[(t, d)] for t, d in zip(out["trace"], out["deployment"])]
    out["slo_excess"] = out["slo_violation"] - out["slo_floor"]
    growing = np.zeros(len(out), dtype=bool)
    if {"backlog_first", "backlog_second"} <= set(out.columns):
        growing = (out["backlog_second"] > out["backlog_first"] + BACKLOG_SLACK).to_numpy()
    out["backlog_growing"] = growing
    out["stable"] = (out["drain_share"] <= DRAIN_SATURATED) & ~out["backlog_growing"]
    out["saturated"] = ~out["stable"]
    out["memory_bound"] = (out["kv_mean"] >= KV_MEMORY_BOUND) & (out["preemptions"] > 0)
    out["light"] = (out["preemptions"] == 0) & (out["kv_mean"] < KV_LIGHT) & out["stable"] & (out["slo_excess"] <= SLO_EXCESS_SATURATED)
    out["regime"] = np.select(
        [out["memory_bound"] & out["stable"], out["memory_bound"] & out["saturated"], out["saturated"], out["light"]],
        ["memory-bound", "memory-bound, saturated", "compute-saturated", "light"], default="between")
    return out


def memory_bound_stable(frame: pd.DataFrame) -> pd.DataFrame:
    """The memory-bound, stable cells of a regime map (every trace and deployment), by load."""
    f = classify(frame)
    return f[f["memory_bound"] & f["stable"]].sort_values(["trace", "deployment", "load"], kind="stable")


@dataclass(frozen=True)
class OperatingPoint:
    """A (trace, deployment, load) cell of the regime map chosen to test the paper in.

    ``scale`` multiplies the trace's arrival rate (``arrival_s / scale``, as ``--scale``) of the
    trace's second half, re-zeroed (:func:`at_load`). ``exact`` is False when no cell met the
    regime's definition and the nearest was taken. The measured columns are ``vllm``'s.
    """

    regime: str
    trace: str
    dataset: str
    deployment_label: str
    groups: tuple[str, ...]
    scale: float
    exact: bool
    kv_mean: float
    kv_peak: float
    preemptions: int
    slo_violation: float
    e2e_p99_s: float

    def deployment(self, **settings) -> Deployment:
        """The cell's :class:`~kvdro.sim.Deployment` (routing in proportion to GPUs)."""
        return deployment(self.deployment_label, **settings)


def _point(regime: str, row: pd.Series, exact: bool) -> OperatingPoint:
    return OperatingPoint(
        regime=regime, trace=str(row["trace"]), dataset=TRACES.get(str(row["trace"]), str(row["trace"])),
        deployment_label=str(row["deployment"]), groups=DEPLOYMENTS[str(row["deployment"])], scale=float(row["load"]),
        exact=exact, kv_mean=float(row["kv_mean"]), kv_peak=float(row["kv_peak"]), preemptions=int(row["preemptions"]),
        slo_violation=float(row["slo_violation"]), e2e_p99_s=float(row["e2e_p99_s"]))


def choose_operating_points(frame: pd.DataFrame, trace: str = "conversation") -> dict[str, OperatingPoint]:
    """The rule of the module docstring applied to a regime map (e.g. ``data/sim_regimes.csv``)."""
    f = classify(frame[frame["trace"] == trace])
    if f.empty:
        raise ValueError(f"trace: no cell of trace {trace!r} in the regime map")
    points = {}
    uniform = f["deployment"].map(lambda d: len(set(DEPLOYMENTS.get(str(d), ("?", "!")))) == 1)
    both = f[f["memory_bound"] & f["stable"] & uniform]
    if len(both):
        row = both.sort_values(["slo_violation", "load"], kind="stable").iloc[0]
        points["memory"] = _point("memory", row, True)
    else:
        near = f[f["stable"] & uniform & (f["preemptions"] > 0)]
        if near.empty:
            near = f[f["stable"] & uniform]
        if near.empty:  # nothing stable: the lowest load of a one-configuration deployment
            near = f[uniform].sort_values("load", kind="stable").iloc[:1]
        if near.empty:
            raise ValueError("frame: no cell on a deployment of one configuration")
        row = near.sort_values(["kv_mean", "load"], ascending=[False, True], kind="stable").iloc[0]
        points["memory"] = _point("memory", row, False)
    light = f[(f["deployment"] == "2 x TP4-PP1") & f["light"]]
    if len(light):
        points["light"] = _point("light", light.sort_values("load", kind="stable").iloc[-1], True)
    else:
        row = f[f["deployment"] == "2 x TP4-PP1"].sort_values("load", kind="stable").iloc[0]
        points["light"] = _point("light", row, False)
    return points


#: The operating points chapters 8-10 and the sweeps run at, by name: regime -> (trace, deployment,
#: load), the cells :func:`choose_operating_points` picked from ``data/sim_regimes.csv`` when the
#: experiments were run. :data:`OPERATING_POINTS` reads these rows of the map (never whichever row
#: the rule finds in what remains of a damaged file) and checks that the rule still picks them.
NAMED_POINTS: dict[str, tuple[str, str, float]] = {
    "memory": ("conversation", "4 x TP2-PP1", 0.7),
    "light": ("conversation", "2 x TP4-PP1", 0.6),
}
#: The command that regenerates ``data/sim_regimes.csv``.
REGIMES_COMMAND = "python -m kvdro.bench sim --regimes"
#: The columns that identify a cell of the regime map.
MAP_KEY = ("trace", "deployment", "load")


def load_regime_map(path: Path | None = None) -> pd.DataFrame:
    """The cached regime map (``data/sim_regimes.csv``), classified, checked against its manifest
    (:func:`kvdro.cachefile.read_csv_checked`: a cut, renamed or edited file is a ValueError naming
    it and what is wrong); FileNotFoundError says how to make it."""
    from kvdro.cachefile import read_csv_checked
    from kvdro.sim.studies import DATA_DIR

    p = DATA_DIR / "sim_regimes.csv" if path is None else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no cached regime map; run `{REGIMES_COMMAND}`")
    need = ("kv_mean", "kv_peak", "preemptions", "slo_violation", "e2e_p99_s", "drain_share")
    return classify(read_csv_checked(p, columns=need, key=MAP_KEY, remake=REGIMES_COMMAND))


def named_operating_points(frame: pd.DataFrame) -> dict[str, OperatingPoint]:
    """The rows of :data:`NAMED_POINTS` in a regime map, as operating points.

    Raises:
        ValueError: a named row is missing from ``frame`` (naming it), or the rule of
            :func:`choose_operating_points` no longer picks it (the map was regenerated with other
            results: update :data:`NAMED_POINTS` and rerun the sweeps that use it).
    """
    f = classify(frame) if "stable" not in frame.columns else frame
    chosen = choose_operating_points(f, trace=NAMED_POINTS["memory"][0])
    points = {}
    for regime, (trace, dep, load) in NAMED_POINTS.items():
        rows = f[(f["trace"] == trace) & (f["deployment"] == dep) & np.isclose(f["load"].astype(float), load)]
        if len(rows) != 1:
            raise ValueError(f"frame: the {regime} operating point ({trace}, {dep}, load {load:g}) is "
                             f"{'missing from' if rows.empty else 'repeated in'} the regime map; run `{REGIMES_COMMAND}`")
        rule = chosen[regime]
        if rule.trace != trace or rule.deployment_label != dep or not np.isclose(rule.scale, load):
            raise ValueError(f"frame: the rule now picks {rule.deployment_label} at {rule.scale:g} as the {regime} point, "
                             f"not the named {dep} at {load:g}: update kvdro.sim.regimes.NAMED_POINTS and rerun "
                             "the sweeps of chapters 8-10")
        points[regime] = _point(regime, rows.iloc[0], rule.exact)
    return points


_CACHE: dict[str, dict[str, OperatingPoint]] = {}


def __getattr__(name: str):
    """``OPERATING_POINTS``: :func:`named_operating_points` of the cached map, computed on first use."""
    if name == "OPERATING_POINTS":
        if "conversation" not in _CACHE:
            _CACHE["conversation"] = named_operating_points(load_regime_map())
        return _CACHE["conversation"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
