"""The atlas: what knowing the output length is worth, engine by engine (issue 34, items 1 and 2).

**Cells** (:func:`cells`): workload x (model, GPU) x deployment x load, each chosen *before any
atlas run* by a rule written here and applied to a cached regime map made under vLLM v0's policy:

* the Llama-2-70B / A100 workloads of the headroom map (``data/headroom.csv``, chapter 8: the Azure
  2023 conversation and code traces and ShareGPT, each on its **test half**, buffers fitted on the
  training half: :func:`kvdro.experiments.headroom.workload_halves`);
* the workloads of issue 33's map (``data/regimes_workloads.csv``): Mooncake conversation on
  Llama-3.1-70B, the ServeGen DeepSeek-R1 reasoning workload on R1-Distill-Llama-70B, and the Azure
  conversation trace on Llama-2-7B (no grouped-query attention), each on A100-80GB and H100-80GB,
  and the Azure conversation trace on Llama-2-70B on H100-80GB (``conversation-70b``; the map's
  ``azure-conv-70b``, added to it for the atlas: its A100 map is the headroom map above), all
  played whole as the map played them (the estimates fitted in sample, on the same trace: an
  optimistic reading of a deployable estimate, said in the ``fit`` column). The R1 hour is cut to
  its first :data:`R1_WINDOW_S` seconds (a contiguous window, played at the map's load; the map
  itself ran the whole hour).

The rule (:func:`pick_point`), per (workload, model, GPU), over every deployment and load of its
map: **"memory-bound, stable"** -- the cells where vLLM preempts with mean KV use >= 60 % and the
queue drains (:func:`kvdro.sim.regimes.memory_bound_stable`), the one with the lowest SLO violation
(ties: the lower load), chapter 8's rule for its primary point; where the map has none, **"stable,
highest KV"** -- the stable cell with the highest mean KV use (ties: the lower load): the most
memory pressure the deployment carries while its queue still drains. Around that point, on the
same deployment, the atlas also runs **every stable load from the map's highest light load up**
(rule ``"stable, from the highest light load up"``): the loads over which memory comes to bind,
none past saturation (a queue that never drains is not a serving point). ``points="primary"``
keeps only the rule's point (a reduced sweep). The rule's name is in every row (``rule``).

**Engines** :data:`ENGINES` (the presets of :mod:`kvdro.sim.engines`) and **arms** (:data:`ARMS`):

* ``default`` -- the engine as shipped, ``max_new`` unset (window - prompt);
* ``client-cap`` -- a realistic client ``max_new_tokens`` (:data:`CLIENT_CAP`: 1,000 tokens for the
  chat and code workloads; 32,768 for R1, the DeepSeek API's default ``max_tokens`` for its reasoner);
* ``saa``, ``dro``, ``p90``, ``p95``, ``p99`` -- the paper's per-class estimates (rho = 10, DRO at
  eps = 0.15 E[xi]) as ``max_new``: a cap, so a request that outgrows it ends there and is counted
  ``capped``, **not served**;
* ``saa-soft`` ... ``p99-soft`` -- the same estimates reserved against while the request may grow
  (``max_new="policy-soft"``: SGLang and LightLLM); for ``vllm-v0`` its own soft reservation
  (the policy with ``max_new`` unset);
* ``true`` -- the true output length as ``max_new`` (the in-engine reservation at the true length);
* ``vllm-v0`` only: ``look-ahead`` (the FCFS no-preemption look-ahead with the true lengths, the
  simulator's ``policy="oracle"``), ``sof-true`` (shortest-output-first on the true lengths,
  ``schedule="sof"``) and ``look-ahead+sof``; and ``sof-predicted``, shortest-output-first on a
  prediction from the prompt (the median training output of the request's class and prompt bin:
  :func:`kvdro.experiments.headroom.length_predictions`), a deployable ordering.

Per run (:func:`run_arm`): goodput (requests served within their own deadline D = 2 s + 0.1 s x xi,
per second of the run's horizon: the simulator's ``goodput_rps``) and the count it divides
(``served_in_deadline``), SLO attainment, P99 TTFT and end-to-end time, preemptions (or
retractions), capped requests, mean and peak KV use, and which implementation ran it
(``implementation``: ``fast`` compiled, ``reference`` step by step), and what the busy-time
decomposition needs (:func:`kvdro.experiments.headroom.run_stats`): ``busy_s``, the engines' summed
step time [s], ``work_tokens`` W, ``recomputed_tokens`` R and ``tokens_fed`` K = W + R [tokens] (in an
arm that caps requests, W counts the capped requests' tokens too: they were fed). Per family
(:func:`compare`): each arm's goodput against its engine's ``default`` and against ``vllm-v1``'s
``default``, paired (the same arrivals and routing draw), with 95 % moving-block bootstrap
intervals over :data:`kvdro.experiments.uncertainty.N_BLOCKS` time blocks
(:func:`kvdro.experiments.uncertainty.change`). The paired change is of ``served_in_deadline``:
the same arrivals, so it is the change of goodput over their common span, and a run's own horizon
(stretched by its last long output, shortened when a cap cuts it) does not enter; the difference
is reported in requests per second of that span (``span_s``).

**The value of length knowledge** (:func:`length_value`, item 2), per engine and cell: the best
goodput (requests served in time over the same arrivals) among that engine's arms that use the
true lengths (:data:`TRUE_LENGTH_ARMS`) minus its ``default``'s -- **a lower bound on what knowing the lengths is worth** (only the policies tried
here; another policy with the same knowledge may do better) -- with the paired interval of the
chosen arm against the default (chosen on the point estimate, so the interval is optimistic), and
the share of it each deployable estimate recovers, (g_estimate - g_default) / (g_best_true -
g_default), reported only where the bound is positive.

**The decomposition across the cells** (:func:`decomposition`, item 3): per (cell, engine), the
default against the ``true`` arm, busy_ratio = cost_ratio x tokens_ratio
(:func:`kvdro.experiments.decomposition.ratios`, the function chapter 8's table at the presets'
point uses too).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.experiments import uncertainty as unc
from kvdro.sim.engines import READS_MAX_NEW

__all__ = ["ENGINES", "FAMILIES", "ARMS", "Arm", "Cell", "TRUE_LENGTH_ARMS", "ESTIMATE_ARMS", "CLIENT_CAP",
           "R1_WINDOW_S", "RHO", "pick_point", "cells", "arms_for", "tasks", "cell_inputs", "run_arm", "compare",
           "length_value", "check_families", "check_engines", "VERDICT_ARMS", "ENGINE_FAMILIES", "MAX_NEW_UNREAD",
           "read", "sign", "describe", "point_name", "change_text", "verdict", "verdict_sentences", "value_summary", "size",
           "MAX_NEW_READERS", "decomposition"]

DATA = Path(__file__).resolve().parents[2] / "data"
#: The engine presets of the atlas, vllm-v0 first (:data:`kvdro.sim.engines.ENGINES`).
ENGINES: tuple[str, ...] = ("vllm-v0", "vllm-v1", "sglang", "trtllm-gne", "trtllm-maxutil", "lightllm")
#: The reservation policies' cost ratio rho = c_p / c_w (the paper's 10).
RHO = 10.0
#: The R1 workload: the first seconds of ServeGen's hour the atlas plays (a contiguous window).
R1_WINDOW_S = 300.0
#: A realistic client ``max_new_tokens`` per workload [tokens] (module docstring).
CLIENT_CAP: dict[str, int] = {"conversation": 1000, "code": 1000, "sharegpt": 1000, "mooncake": 1000,
                              "conversation-7b": 1000, "conversation-70b": 1000, "r1": 32768}

#: Atlas workload -> (family, map, the map's workload name, model, GPUs).
_WORKLOADS: dict[str, tuple[str, str, str, str, tuple[str, ...]]] = {
    "conversation": ("conversation", "headroom", "conversation", "llama-2-70b", ("a100-80gb",)),
    "conversation-70b": ("conversation", "regimes_workloads", "azure-conv-70b", "llama-2-70b", ("h100-80gb",)),
    "conversation-7b": ("conversation", "regimes_workloads", "azure-conv-7b", "llama-2-7b", ("a100-80gb", "h100-80gb")),
    "code": ("code", "headroom", "code", "llama-2-70b", ("a100-80gb",)),
    "sharegpt": ("sharegpt", "headroom", "sharegpt", "llama-2-70b", ("a100-80gb",)),
    "mooncake": ("mooncake", "regimes_workloads", "mooncake-conv", "llama-3.1-70b", ("a100-80gb", "h100-80gb")),
    "r1": ("r1", "regimes_workloads", "r1", "deepseek-r1-distill-llama-70b", ("a100-80gb", "h100-80gb")),
}
#: Family -> its atlas workloads (one cached CSV per family).
FAMILIES: dict[str, tuple[str, ...]] = {}
for _w, (_f, *_rest) in _WORKLOADS.items():
    FAMILIES.setdefault(_f, ())
    FAMILIES[_f] += (_w,)

RULE_MEMORY = "memory-bound, stable: lowest SLO violation"
RULE_EDGE = "stable, highest KV (no memory-bound stable cell)"
RULE_RANGE = "stable, from the highest light load up"
#: Which loads :func:`cells` takes per (workload, model, GPU): all of the range, or the rule's point.
POINTS: tuple[str, ...] = ("all", "primary")


@dataclass(frozen=True)
class Arm:
    """One arm: what ``simulate`` is given (``policy``, ``max_new``, ``schedule``), which engines
    take it, and whether it reads the true lengths (``uses_true``) or is a deployable estimate."""

    name: str
    policy: str = "vllm"
    max_new: str = "unset"
    schedule: str = "fcfs"
    engines: tuple[str, ...] = ENGINES
    uses_true: bool = False
    estimate: bool = False
    hint: str | None = None


_SOFT = ("vllm-v0", "sglang", "lightllm")
_ESTIMATES = ("saa", "dro", "p90", "p95", "p99")
#: The arms (module docstring), in the tables' order; ``client-cap``'s max_new is :data:`CLIENT_CAP`.
ARMS: tuple[Arm, ...] = (
    Arm("default"),
    Arm("client-cap", max_new="cap"),
    *(Arm(p, policy=p, max_new="policy", estimate=True) for p in _ESTIMATES),
    *(Arm(f"{p}-soft", policy=p, max_new="policy-soft", engines=_SOFT, estimate=True) for p in _ESTIMATES),
    Arm("true", max_new="true", uses_true=True),
    Arm("look-ahead", policy="oracle", engines=("vllm-v0",), uses_true=True),
    Arm("sof-true", schedule="sof", engines=("vllm-v0",), uses_true=True),
    Arm("look-ahead+sof", policy="oracle", schedule="sof", engines=("vllm-v0",), uses_true=True),
    Arm("sof-predicted", schedule="sof", engines=("vllm-v0",), estimate=True, hint="prompt-bins"),
)
_ARM = {a.name: a for a in ARMS}
#: The arms that read each request's true output length.
TRUE_LENGTH_ARMS: tuple[str, ...] = tuple(a.name for a in ARMS if a.uses_true)
#: The deployable estimates whose recovered share :func:`length_value` reports.
ESTIMATE_ARMS: tuple[str, ...] = tuple(a.name for a in ARMS if a.estimate)


@dataclass(frozen=True)
class Cell:
    """One atlas cell (module docstring); ``load`` multiplies the trace's own arrival rate."""

    family: str
    workload: str
    model: str
    gpu: str
    deployment: str
    load: float
    rule: str
    map_regime: str
    fit: str
    window_s: float = float("nan")

    @property
    def key(self) -> str:
        """A short, unique name: workload, GPU, deployment and load."""
        return f"{self.workload} {self.gpu.split('-')[0]} {self.deployment} @ {self.load:g}"


def check_families(families) -> tuple[str, ...]:
    """``families`` as a tuple (``None``: all); ValueError naming ``families`` for an unknown one."""
    if families is None:
        return tuple(FAMILIES)
    if isinstance(families, str):
        families = (families,)
    out = tuple(families)
    bad = [f for f in out if f not in FAMILIES]
    if bad or not out:
        raise ValueError(f"families: must be among {list(FAMILIES)}, got {list(out)!r}")
    return out


def check_engines(engines) -> tuple[str, ...]:
    """``engines`` as a tuple in :data:`ENGINES` order (``None``: all); ValueError naming ``engines``."""
    if engines is None:
        return ENGINES
    if isinstance(engines, str):
        engines = (engines,)
    out = tuple(engines)
    bad = [e for e in out if e not in ENGINES]
    if bad or not out:
        raise ValueError(f"engines: must be among {list(ENGINES)}, got {list(out)!r}")
    return tuple(e for e in ENGINES if e in out)


def pick_point(rows: pd.DataFrame) -> tuple[pd.Series, str]:
    """The map row the atlas runs for one (workload, model, GPU) and the rule's name (module
    docstring). ``rows``: a classified regime map's rows (columns ``stable``, ``memory_bound``,
    ``slo_violation``, ``kv_mean``, ``load``); ValueError if none is stable."""
    need = ("stable", "memory_bound", "slo_violation", "kv_mean", "load")
    missing = [c for c in need if c not in rows.columns]
    if missing:
        raise ValueError(f"rows: missing column(s) {missing}")
    both = rows[rows["stable"].astype(bool) & rows["memory_bound"].astype(bool)]
    if len(both):
        return both.sort_values(["slo_violation", "load"], kind="stable").iloc[0], RULE_MEMORY
    stable = rows[rows["stable"].astype(bool)]
    if not len(stable):
        raise ValueError("rows: no stable cell in the map")
    return stable.sort_values(["kv_mean", "load"], ascending=[False, True], kind="stable").iloc[0], RULE_EDGE


@functools.lru_cache(maxsize=2)
def _map(name: str) -> pd.DataFrame:
    from kvdro.cachefile import read_csv_checked

    if name == "headroom":
        return read_csv_checked(DATA / "headroom.csv", key=("workload", "deployment", "load"),
                                remake="python -m kvdro.bench headroom")
    from kvdro.experiments.workload_regimes import load_map

    return load_map(DATA / "regimes_workloads.csv")


def load_range(rows: pd.DataFrame, row: pd.Series) -> list[float]:
    """The loads the atlas runs around ``row`` (:func:`pick_point`'s choice) on its deployment: every
    stable load from the deployment's highest light load up (its lowest load if none is light),
    with ``row``'s own load, ascending."""
    on = rows[rows["deployment"] == row["deployment"]]
    light = on[on["regime"] == "light"]
    lo = float(light["load"].max()) if len(light) else float(on["load"].min())
    loads = set(on.loc[on["stable"].astype(bool) & (on["load"] >= lo), "load"].astype(float)) | {float(row["load"])}
    return sorted(loads)


def cells(families=None, points: str = "all") -> list[Cell]:
    """The atlas's cells of ``families`` (default: all), in a fixed order, each picked by
    :func:`pick_point` (and, with ``points="all"``, :func:`load_range`) from its cached regime map
    (module docstring)."""
    if points not in POINTS:
        raise ValueError(f"points: must be one of {POINTS}, got {points!r}")
    out = []
    for fam in check_families(families):
        for w in FAMILIES[fam]:
            _, map_name, mw, model, gpus = _WORKLOADS[w]
            frame = _map(map_name)
            for gpu in gpus:
                rows = frame[frame["workload"] == mw]
                if map_name == "regimes_workloads":
                    rows = rows[rows["gpu"] == gpu]
                row, rule = pick_point(rows)
                on = rows[rows["deployment"] == row["deployment"]].set_index("load")
                for load in (load_range(rows, row) if points == "all" else [float(row["load"])]):
                    out.append(Cell(family=fam, workload=w, model=model, gpu=gpu, deployment=str(row["deployment"]),
                                    load=load, rule=rule if load == float(row["load"]) else RULE_RANGE,
                                    map_regime=str(on.loc[load, "regime"]),
                                    fit="training half" if map_name == "headroom" else "in sample",
                                    window_s=R1_WINDOW_S if w == "r1" else float("nan")))
    return out


def arms_for(engine: str) -> tuple[Arm, ...]:
    """The arms ``engine`` takes (:data:`ARMS`)."""
    check_engines((engine,))
    return tuple(a for a in ARMS if engine in a.engines)


def tasks(cell_list: list[Cell], engines=None) -> list[tuple[Cell, str, str]]:
    """(cell, engine, arm) for every run of ``cell_list``, in the tables' order."""
    return [(c, e, a.name) for c in cell_list for e in check_engines(engines) for a in arms_for(e)]


@functools.lru_cache(maxsize=4)
def cell_inputs(cell: Cell, quick_requests: int | None = None):
    """(test trace at the cell's load, training trace for the estimates, deployment) of ``cell``;
    ``quick_requests`` keeps only the test trace's first requests (the reduced sweep of the tests)."""
    from kvdro.sim.regimes import at_load

    _, map_name, mw, _, _ = _WORKLOADS[cell.workload]
    if map_name == "headroom":
        from kvdro.experiments.headroom import workload_halves
        from kvdro.sim import regimes

        train, test = workload_halves(mw)
        dep = regimes.deployment(cell.deployment)
    else:
        from kvdro.experiments import workload_regimes as wr

        test = wr.workload_trace(mw)
        if np.isfinite(cell.window_s):
            test = test[test["arrival_s"] < cell.window_s].reset_index(drop=True)
        train = test
        dep = wr.deployments(mw, cell.gpu)[cell.deployment]
    test = at_load(test, cell.load)
    if quick_requests is not None:
        test = test.iloc[:int(quick_requests)].reset_index(drop=True)
    return test.reset_index(drop=True), train.reset_index(drop=True), dep


@functools.lru_cache(maxsize=64)
def _buffers(cell: Cell, policy: str):
    from kvdro.sim.policies import policy_buffers

    return policy_buffers(policy, cell_inputs(cell)[1], rho=RHO)


def run_arm(cell: Cell, engine: str, arm: str, *, quick_requests: int | None = None, routing_seed: int = 0) -> dict:
    """Simulate one (cell, engine, arm) under routing seed ``routing_seed`` (the atlas's is 0; other
    draws: :mod:`kvdro.experiments.atlas_draws`) and measure it (module docstring): rates
    in requests per second, times in seconds, shares in [0, 1]; ``served_blocks``: requests served
    within their deadline per time block of the test trace (:func:`kvdro.experiments.uncertainty.encode`)."""
    from kvdro.sim import simulate

    check_engines((engine,))
    if isinstance(routing_seed, bool) or not isinstance(routing_seed, (int, np.integer)) or routing_seed < 0:
        raise ValueError(f"routing_seed: must be an integer >= 0, got {routing_seed!r}")
    if arm not in _ARM or engine not in _ARM[arm].engines:
        raise ValueError(f"arm: {arm!r} is not an arm of {engine!r} ({[a.name for a in arms_for(engine)]})")
    a = _ARM[arm]
    test, _, dep = cell_inputs(cell, quick_requests)
    max_new: str | int = a.max_new
    if max_new == "cap":
        max_new = CLIENT_CAP[cell.workload]
    elif max_new == "policy-soft" and engine == "vllm-v0":
        max_new = "unset"  # vLLM v0's own soft reservation (kvdro.sim.engine_choice)
    buffers = None if a.policy in ("vllm", "oracle") else _buffers(cell, a.policy)
    hint = None
    if a.hint is not None:
        from kvdro.experiments.headroom import length_predictions

        hint = length_predictions(cell_inputs(cell)[1], test, a.hint)
    r = simulate(test, policy=a.policy, buffers=buffers, deployment=dep, rho=RHO, rng=np.random.default_rng(int(routing_seed)),
                 engine=engine, max_new=max_new, schedule=a.schedule, length_hint=hint)
    q, m = r.requests, r.metrics
    stats = _fed(r)
    ok = q["outcome"].isin(["completed", "truncated"]).to_numpy() & (q["e2e_s"].to_numpy() <= q["deadline_s"].to_numpy())
    blocks = unc.block_sums(unc.block_index(test["arrival_s"].to_numpy()), ok.astype(float))
    return {"family": cell.family, "cell": cell.key, "engine": engine, "arm": arm,
            "implementation": r.implementation, "max_new": str(max_new), "requests": int(len(test)),
            "span_s": float(test["arrival_s"].max() - test["arrival_s"].min()),
            "served_in_deadline": int(ok.sum()), "goodput_rps": m["goodput_rps"], "slo_attainment": 1.0 - m["slo_violation_rate"],
            "ttft_p99_s": m["ttft_p99_s"], "e2e_p99_s": m["e2e_p99_s"], "preemptions": int(m["preemptions"]),
            "capped": int(m.get("capped", 0)), "completed": int(m["completed"]), "truncated": int(m["truncated"]),
            "ignored": int(m["ignored"]), "kv_use_mean": m["kv_utilisation_mean"],
            "kv_use_peak": float(r.engines["kv_use_peak"].max()), "horizon_s": float(r.cost["horizon_s"]),
            "busy_s": stats["busy_s"], "work_tokens": int(stats["work_tokens"]), "recomputed_tokens": int(stats["recomputed"]),
            "tokens_fed": int(stats["work_tokens"] + stats["recomputed"]), "served_blocks": unc.encode(blocks)}


def _fed(res) -> dict:
    """Busy time and tokens fed of one run: :func:`kvdro.experiments.headroom.run_stats` (W over the
    served requests, which it checks against the engines' own count) where the run caps no request;
    where an arm caps requests at ``max_new``, the engines' own count, which includes the capped
    requests' tokens (fed, then not served): W = sum over the requests the engines ran of
    (L_in + generated - 1)."""
    from kvdro.experiments.headroom import run_stats

    if int(res.metrics.get("capped", 0)) == 0:
        return run_stats(res)
    work = sum(int(np.sum(inp.prompt + out.generated - 1)) for inp, out in zip(res.inputs, res.outputs))
    return {"work_tokens": work, "recomputed": sum(int(np.sum(out.recomputed_tokens)) for out in res.outputs),
            "busy_s": sum(int(out.busy_ps) for out in res.outputs) / 1e12}


def _pair(a: pd.Series, b: pd.Series) -> unc.Interval:
    span = float(a["span_s"])
    units = np.stack([unc.decode(a["served_blocks"]), unc.decode(b["served_blocks"])], axis=1) / span
    # floor: one request over the span (an empty baseline counts as one request, as for counts)
    return unc.change(lambda s: s[:, 0], lambda s: s[:, 1], units, unit="req/s", floor=1.0 / span)


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (rows of :func:`run_arm`) with each arm's paired goodput change [%] against its
    engine's ``default`` (``vs_default_*``) and against ``vllm-v1``'s ``default`` (``vs_v1_*``): the
    point, the 95 % moving-block interval, the difference [req/s] with its interval, and whether the
    baseline comes near zero in resamples (then read the difference: a ratio over a baseline that a
    resample can leave empty says nothing; an empty baseline counts as one request). The baseline's
    own row is 0."""
    idx = frame.set_index(["cell", "engine", "arm"])
    out = frame.copy()
    for tag, base_of in (("default", lambda c, e: (c, e, "default")), ("v1", lambda c, e: (c, "vllm-v1", "default"))):
        cols: dict[str, list] = {k: [] for k in ("pct", "lo", "hi", "diff_rps", "diff_lo", "diff_hi", "base_near_zero")}
        for _, row in frame.iterrows():
            key = base_of(row["cell"], row["engine"])
            if key == (row["cell"], row["engine"], row["arm"]):  # the baseline itself: no change
                for k, v in zip(cols, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)):
                    cols[k].append(v)
                continue
            if key not in idx.index:
                for k in cols:
                    cols[k].append(np.nan)
                continue
            iv = _pair(row, idx.loc[key])
            for k, v in zip(cols, (100 * iv.point, 100 * iv.lo, 100 * iv.hi, iv.diff.point, iv.diff.lo, iv.diff.hi,
                                   iv.base_near_zero)):
                cols[k].append(v)
        for k, v in cols.items():
            out[f"vs_{tag}_{k}"] = v
    return out


def length_value(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, engine) of ``frame`` (rows of :func:`run_arm`): the best true-length arm (most
    requests served in time; ties: the first of :data:`TRUE_LENGTH_ARMS`), the **lower bound on what
    knowing the lengths is worth** (its goodput minus the default's over the same arrivals, [req/s
    of the arrival span] and [%], with the paired interval of that arm against the default) and the share of it each
    estimate arm recovers (NaN where the bound is not positive: nothing to recover)."""
    rows = []
    for (cell, engine), part in frame.groupby(["cell", "engine"], sort=False):
        p = part.set_index("arm")
        if "default" not in p.index:
            continue
        true = p.loc[[a for a in TRUE_LENGTH_ARMS if a in p.index]]
        if not len(true):
            continue
        g0 = float(p.loc["default", "served_in_deadline"])
        best = str(true["served_in_deadline"].astype(float).idxmax())
        gb = float(true.loc[best, "served_in_deadline"])
        iv = _pair(p.loc[best], p.loc["default"])
        row = {"family": part["family"].iloc[0], "cell": cell, "engine": engine,
               "implementation": ",".join(sorted(set(part["implementation"]))),
               "default_served": int(g0), "best_true_arm": best, "best_true_served": int(gb),
               "length_value_lower_bound_rps": iv.diff.point, "lb_lo_rps": iv.diff.lo, "lb_hi_rps": iv.diff.hi,
               "length_value_lower_bound_pct": 100 * iv.point, "lb_lo_pct": 100 * iv.lo, "lb_hi_pct": 100 * iv.hi,
               "lb_base_near_zero": iv.base_near_zero}
        for est in ESTIMATE_ARMS:
            share = np.nan
            if est in p.index and gb - g0 > 0:
                share = (float(p.loc[est, "served_in_deadline"]) - g0) / (gb - g0)
            row[f"recovered_{est}"] = share
        rows.append(row)
    return pd.DataFrame(rows)


def cell_table(cell_list: list[Cell]) -> pd.DataFrame:
    """The cells as a table (one row each, the rule named)."""
    return pd.DataFrame([{"cell": c.key, **asdict(c)} for c in cell_list])


# --- Readers of the cached atlas (the chapters read these; nothing here runs the simulator) ---

#: The arms of the verdict table (:func:`verdict`), against the engine's ``default``.
VERDICT_ARMS: tuple[str, ...] = ("dro", "dro-soft", "true", "look-ahead", "sof-true")
#: Engine family -> its presets (one verdict sentence per family).
ENGINE_FAMILIES: dict[str, tuple[str, ...]] = {"vLLM": ("vllm-v0", "vllm-v1"), "SGLang": ("sglang",),
                                               "TensorRT-LLM": ("trtllm-gne", "trtllm-maxutil"),
                                               "LightLLM": ("lightllm",)}
#: Presets whose admission never reads ``max_new`` (:mod:`kvdro.sim.engines`: vLLM v1's
#: ``allocate_slots`` and TensorRT-LLM's max-utilization policy allocate as tokens arrive) and that
#: take no look-ahead or ordering arm here: their lower bound is 0 by construction.
MAX_NEW_UNREAD: tuple[str, ...] = ("vllm-v1", "trtllm-maxutil")
_WORKLOAD_NAMES = {"conversation": "Azure conversation", "conversation-7b": "Azure conversation",
                   "conversation-70b": "Azure conversation",
                   "code": "Azure code", "sharegpt": "ShareGPT", "mooncake": "Mooncake conversation",
                   "r1": "ServeGen R1 reasoning"}
_MODEL_NAMES = {"llama-2-70b": "Llama-2-70B", "llama-2-7b": "Llama-2-7B", "llama-3.1-70b": "Llama-3.1-70B",
                "deepseek-r1-distill-llama-70b": "R1-Distill-Llama-70B"}


def read(families=None, *, value: bool = False, data_dir: Path | None = None) -> pd.DataFrame:
    """The cached atlas of ``families`` (default: all), checked against its manifests: the runs
    (``data/atlas_<family>.csv``) or, with ``value=True``, the lower bounds
    (``data/atlas_value_<family>.csv``); both written by ``python -m kvdro.bench atlas``."""
    from kvdro.cachefile import read_csv_checked

    base = DATA if data_dir is None else Path(data_dir)
    stem, key = ("atlas_value", ("cell", "engine")) if value else ("atlas", ("cell", "engine", "arm"))
    return pd.concat([read_csv_checked(base / f"{stem}_{f}.csv", key=key, remake="python -m kvdro.bench atlas")
                      for f in check_families(families)], ignore_index=True)


def describe(cell: Cell) -> str:
    """``cell``'s regime in words: workload, model, GPU, deployment, load and the map's regime."""
    return (f"{_WORKLOAD_NAMES[cell.workload]}, {_MODEL_NAMES[cell.model]} on {cell.gpu.split('-')[0].upper()}, "
            f"{cell.deployment} at {cell.load:.3g} × the trace's rate ({cell.map_regime})")


#: Short workload names of :func:`point_name`: the Azure conversation trace runs on two models.
_POINT_NAMES = {"conversation": "conversation 70B", "conversation-70b": "conversation 70B",
                "conversation-7b": "conversation 7B"}


def point_name(cell: Cell) -> str:
    """A short name of a primary point: the workload (with the model where one trace runs on two)
    and the GPU (one primary point each)."""
    return f"{_POINT_NAMES.get(cell.workload, cell.workload)} {cell.gpu.split('-')[0].upper()}"


def change_text(row: pd.Series, tag: str = "default") -> str:
    """A paired change of ``row`` (a row of :func:`compare` with ``vs_<tag>_*``) as text: the change
    in % with its interval, or, where the baseline comes near zero in resamples, the difference in
    requests per second with its interval (a ratio over a near-empty baseline says nothing)."""
    if not np.isfinite(row[f"vs_{tag}_pct"]):
        return "—"
    if bool(row[f"vs_{tag}_base_near_zero"]):
        return f"{row[f'vs_{tag}_diff_rps']:+.3f} [{row[f'vs_{tag}_diff_lo']:+.3f}, {row[f'vs_{tag}_diff_hi']:+.3f}] req/s"
    return f"{row[f'vs_{tag}_pct']:+.1f}% [{row[f'vs_{tag}_lo']:+.1f}, {row[f'vs_{tag}_hi']:+.1f}]"


def sign(row: pd.Series, tag: str = "default") -> int:
    """+1 / -1 where the paired interval lies wholly above / below zero, else 0 (read on the
    difference where the baseline comes near zero)."""
    lo, hi = (("diff_lo", "diff_hi") if bool(row[f"vs_{tag}_base_near_zero"]) else ("lo", "hi"))
    return 1 if row[f"vs_{tag}_{lo}"] > 0 else -1 if row[f"vs_{tag}_{hi}"] < 0 else 0


def verdict(frame: pd.DataFrame, primary: list[Cell] | None = None) -> pd.DataFrame:
    """The verdict table: per primary cell (:func:`cells` with ``points="primary"``) and engine of
    ``frame`` (rows of :func:`compare`), the change of each of :data:`VERDICT_ARMS` against the
    engine's ``default`` as text (:func:`change_text`; "—" where the engine takes no such arm), the
    sign of its interval (``sign_<arm>``) and the cell's regime (``regime``)."""
    primary = cells(points="primary") if primary is None else primary
    idx = frame.set_index(["cell", "engine", "arm"])
    rows = []
    for c in primary:
        for e in ENGINES:
            if (c.key, e, "default") not in idx.index:
                continue
            row = {"cell": c.key, "point": point_name(c), "regime": describe(c), "engine": e}
            for a in VERDICT_ARMS:
                r = idx.loc[(c.key, e, a)] if (c.key, e, a) in idx.index else None
                row[a] = "—" if r is None else change_text(r)
                row[f"sign_{a}"] = np.nan if r is None else sign(r)
            rows.append(row)
    if not rows:
        raise ValueError("frame: no run of a primary cell (read the atlas with read())")
    return pd.DataFrame(rows)


def verdict_sentences(table: pd.DataFrame) -> dict[str, str]:
    """One sentence per engine family of :data:`ENGINE_FAMILIES` from :func:`verdict`'s ``table``:
    where the paper's DRO estimate (as ``max_new``, or reserved softly where the engine has it, the
    better of the two) beats the engine's default beyond noise, where it loses, where it is noise."""
    out = {}
    for fam, engines in ENGINE_FAMILIES.items():
        parts = []
        for e in engines:
            sub = table[table["engine"] == e]
            best = sub[["sign_dro", "sign_dro-soft"]].max(axis=1, skipna=True)
            groups = {k: sub.loc[best == k, "point"].tolist() for k in (1, 0, -1)}
            words = {1: "beats the default at", 0: "noise at", -1: "loses at"}
            said = [f"{words[k]} {len(v)} of {len(sub)} ({', '.join(v)})" for k, v in groups.items() if v]
            parts.append(f"`{e}`: " + ", ".join(said))
        out[fam] = f"**{fam}** — " + "; ".join(parts) + "."
    return out


def value_summary(runs: pd.DataFrame, value: pd.DataFrame, cell_list: list[Cell] | None = None) -> pd.DataFrame:
    """:func:`length_value`'s ``value`` per (cell, engine) in points of the requests offered
    (best true-length arm minus default, served in time, / requests x 100, with its paired interval,
    which is in proportion), the share the DRO estimate recovers (the better of ``dro`` and
    ``dro-soft``), the cell's map regime and whether the bound is 0 by construction
    (:data:`MAX_NEW_UNREAD`)."""
    cell_list = cells() if cell_list is None else cell_list
    meta = pd.DataFrame([{"cell": c.key, "map_regime": c.map_regime, "workload": c.workload, "load": c.load}
                         for c in cell_list])
    req = runs[runs["arm"] == "default"][["cell", "engine", "requests", "span_s"]]
    out = value.merge(req, on=["cell", "engine"], how="left", validate="one_to_one").merge(meta, on="cell", how="left")
    if out["requests"].isna().any() or out["map_regime"].isna().any():
        raise ValueError("value: a (cell, engine) without its default run or its cell (read both with read())")
    scale = 100 * out["span_s"] / out["requests"]  # req/s over the span -> points of the requests offered
    out["bound_pts"] = out["length_value_lower_bound_rps"] * scale
    out["bound_lo_pts"], out["bound_hi_pts"] = out["lb_lo_rps"] * scale, out["lb_hi_rps"] * scale
    out["dro_share"] = out[["recovered_dro", "recovered_dro-soft"]].max(axis=1, skipna=True)
    out["by_construction"] = out["engine"].isin(MAX_NEW_UNREAD)
    return out[["cell", "workload", "load", "map_regime", "engine", "best_true_arm", "bound_pts", "bound_lo_pts",
                "bound_hi_pts", "dro_share", "recovered_saa", "by_construction"]]


def size(runs: pd.DataFrame, cell_list: list[Cell] | None = None) -> dict[str, int]:
    """The atlas's size as cached: cells, runs, and the arms per cell (summed over engines)."""
    n_cells = runs["cell"].nunique()
    per = runs.groupby("cell").size()
    if per.nunique() != 1:
        raise ValueError("runs: cells with different numbers of arms")
    return {"cells": int(n_cells), "runs": int(len(runs)), "arms_per_cell": int(per.iloc[0])}


#: Presets whose admission reads ``max_new`` (:data:`kvdro.sim.engines.READS_MAX_NEW`: SGLang's
#: ``PrefillAdder``, TensorRT-LLM's GUARANTEED_NO_EVICT, LightLLM's peak rule); vLLM v0 and v1 and
#: TensorRT-LLM's max-utilization policy admit on the prompt alone.
MAX_NEW_READERS: tuple[str, ...] = READS_MAX_NEW
_DECOMPOSITION_COLUMNS = ("busy_s", "tokens_fed", "recomputed_tokens", "served_blocks", "preemptions", "capped",
                          "served_in_deadline", "kv_use_mean")


def decomposition(runs: pd.DataFrame, cells=None, engines=None) -> pd.DataFrame:
    """Chapter 8's decomposition in every atlas cell: per (cell, engine) of ``runs`` (rows of
    :func:`run_arm` or :func:`read`), the engine's ``default`` (d) against its ``true`` arm (t) --
    ``busy_ratio`` = busy_d / busy_t, ``tokens_ratio`` = K_d / K_t (tokens fed, W + R),
    ``cost_ratio`` = c_d / c_t (step time per token fed), so busy_ratio = cost_ratio x tokens_ratio
    (:func:`kvdro.experiments.decomposition.ratios`, shared with
    :func:`kvdro.bench.presets_table.decomposition`); ``reads_max_new`` (:data:`MAX_NEW_READERS`),
    ``same_run`` (the two rows agree on every measured column: the arm changed nothing) and each
    arm's recomputed tokens. ``cells``: cell keys or :class:`Cell` s (default: all of ``runs``);
    ``engines``: presets (default: all). ValueError naming ``cells`` / ``engines`` for a name not in
    ``runs`` or :data:`ENGINES`, or ``runs`` for a missing column."""
    from kvdro.experiments.decomposition import ratios

    missing = [c for c in ("cell", "engine", "arm", *_DECOMPOSITION_COLUMNS[:2]) if c not in runs.columns]
    if missing:
        raise ValueError(f"runs: missing column(s) {missing} (rerun `python -m kvdro.bench atlas`)")
    engines = check_engines(engines)
    known = list(dict.fromkeys(runs["cell"]))
    if cells is None:
        keys = known
    else:
        keys = [c.key if isinstance(c, Cell) else c for c in ((cells,) if isinstance(cells, (str, Cell)) else cells)]
        bad = [k for k in keys if k not in known]
        if bad or not keys:
            raise ValueError(f"cells: not cells of runs: {bad or keys!r}")
    idx = runs.set_index(["cell", "engine", "arm"])
    pairs = [(k, e) for k in keys for e in engines if (k, e, "default") in idx.index and (k, e, "true") in idx.index]
    if not pairs:
        raise ValueError("runs: no (cell, engine) with both a default and a true run")
    d = idx.loc[[(k, e, "default") for k, e in pairs]]
    t = idx.loc[[(k, e, "true") for k, e in pairs]]
    r = ratios(d["busy_s"].to_numpy(float), d["tokens_fed"].to_numpy(float), t["busy_s"].to_numpy(float),
               t["tokens_fed"].to_numpy(float))
    shared = [c for c in _DECOMPOSITION_COLUMNS if c in runs.columns]
    same = np.all([d[c].to_numpy() == t[c].to_numpy() for c in shared], axis=0)
    return pd.DataFrame({"cell": [k for k, _ in pairs], "engine": [e for _, e in pairs], **r,
                         "reads_max_new": [e in MAX_NEW_READERS for _, e in pairs], "same_run": same,
                         "recomputed_default": d["recomputed_tokens"].to_numpy() if "recomputed_tokens" in runs else np.nan,
                         "recomputed_true": t["recomputed_tokens"].to_numpy() if "recomputed_tokens" in runs else np.nan})
