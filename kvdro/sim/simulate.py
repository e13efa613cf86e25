"""``simulate``: a trace through a deployment under one admission policy -> :class:`SimResult`.

What happens to each request of the trace (every one ends in exactly one outcome, each counted):

1. **Routing** (seeded by the caller's ``rng``): its class's probabilities pick a serving group, or
   reject it (the share pi_i0) -> ``rejected``. Within a pipeline-parallel group, requests go
   round-robin to its ``pp`` micro-batch engines (:mod:`kvdro.sim.deployment`).
2. **Context limit** (``Deployment.max_model_len``, vLLM's behaviour): a prompt longer than the
   limit is never scheduled -> ``ignored`` (vLLM's ``FINISHED_IGNORED``); generation stops once
   prompt + output exceeds the limit (vLLM's length cap), i.e. after ``max_model_len - L_in + 1``
   tokens -> ``truncated`` (completed, with fewer tokens than the trace's). With the default
   16,384-token window no Azure 2023 request is affected; with Llama-2's 4,096 many are.
3. The engine serves it (:mod:`kvdro.sim.scheduler`) -> ``completed``. A trace output of 0 tokens is
   served as 1 (a prefill always samples one token). A request whose ``max_new`` (``simulate``'s
   keyword) is below its true length ends there -> ``capped`` (not served; :mod:`kvdro.sim.engine_choice`).

``engine=`` picks the rules: a preset of :mod:`kvdro.sim.engines` (``"vllm-v0"`` by default, the
rules of :mod:`kvdro.sim.scheduler`; the others run on :mod:`kvdro.sim.engine_presets`, with their
own window and prompt limits). ``implementation=`` picks the code that runs them, two
implementations with the same semantics: ``"reference"`` (step by step, the specification:
:mod:`kvdro.sim.engine_reference`) and ``"fast"`` (compiled with numba; for ``vllm-v0`` jumps between
events, :mod:`kvdro.sim.engine_compiled`); ``kvdro.bench sim`` and the tests check that they agree
exactly. Invariants
(:mod:`kvdro.sim.invariants`) are checked at the end of every run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvdro.sim.deployment import Deployment, _real, default_deployment
from kvdro.sim.envelope import MAX_TOKENS
from kvdro.sim.invariants import check_accounting, check_engine
from kvdro.sim.metrics import compute_metrics, default_costs
from kvdro.sim.engine_choice import (IMPLEMENTATIONS, check_max_new, check_preset_arguments, generation_limits,
                                     resolve_engine)
from kvdro.sim.engines import DEFAULT_ENGINE, ENGINES, make_config
from kvdro.sim.policies import ALL_POLICIES, Buffers, policy_buffers, request_buffers
from kvdro.sim.prefix_keys import check_prefix_keys, keys_for_rows
from kvdro.sim.scheduler import BLOCK_TOKENS, EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import MAX_HORIZON_S, PS_PER_S, StepClock

__all__ = ["DEADLINES", "ENGINES", "IMPLEMENTATIONS", "READINGS", "SCHEDULES", "SimResult", "simulate", "check_trace"]

#: ``engine=``: the presets (:mod:`kvdro.sim.engines`); ``implementation=``: the code running vllm-v0.
ENGINES, IMPLEMENTATIONS = ENGINES, IMPLEMENTATIONS
#: The two readings of a reservation (:mod:`kvdro.sim.scheduler`): admission control, or a cap.
READINGS = ("soft", "hard")
#: The waiting queue's orders: vLLM's FCFS, or shortest-output-first with aging (``simulate``).
SCHEDULES = ("fcfs", "sof")
#: The deadlines of goodput and SLO violation: each request's own (default), or its class's (6f).
DEADLINES = ("request", "class")
_TIDY = ("arrival_s", "input_tokens", "output_tokens", "request_class")


@dataclass
class SimResult:
    """The outcome of :func:`simulate`.

    Attributes:
        metrics: exactly :data:`kvdro.sim.metrics.METRIC_KEYS` (the CLI's JSON).
        cost: the cost breakdown (:mod:`kvdro.sim.metrics`): terms, total, per second, token counts.
        requests: one row per trace request, in trace order: ``request_class``, ``arrival_s``,
            ``input_tokens``, ``output_tokens`` (trace), ``generated_tokens``, ``group``, ``engine``
            (-1 if not served), ``outcome`` (completed / truncated / rejected / ignored), ``buffer_tokens``
            (eta; NaN for ``vllm``), ``reserved_blocks``, ``admit_s``, ``first_token_s``, ``finish_s``,
            ``wait_s`` (arrival to first admission), ``ttft_s``, ``tpot_s``, ``e2e_s``, ``slo_s``
            (the class deadline D_i of (6f), priced by the cost), ``deadline_s`` (the deadline of
            goodput and SLO violation, ``simulate``'s ``deadline``),
            ``preemptions``, ``recomputed_tokens``, ``waste_tokens``, ``overflow_tokens``.
        engines: one row per micro-batch engine: group, config, blocks, requests, steps, busy share,
            mean running sequences, mean decode batch, mean KV use, peak KV use.
        policy, buffers, deployment, engine, reservation, safety_rules: what was run; ``engine`` is
            the preset (``"vllm-v0"``, ...), ``implementation`` the code that ran it, ``max_new`` and
            ``engine_options`` what the requests carried and the preset's overridden knobs.
        clipped_buffers: how many served requests of a reservation policy had a buffer eta larger
            than the context window leaves (``eta > max_model_len - L_in``): their reservation was
            clipped to the window, ``max_model_len`` tokens, before any integer cast (0 for ``vllm``
            and ``oracle``; the ``buffer_tokens`` column keeps the unclipped eta).
        outputs: the raw :class:`~kvdro.sim.scheduler.EngineOutput` of each engine (with a per-step
            trace when ``record=True``), aligned with ``specs``.
    """

    metrics: dict
    cost: dict
    requests: pd.DataFrame
    engines: pd.DataFrame
    policy: str
    buffers: dict
    deployment: Deployment
    engine: str
    specs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    reservation: str = "soft"
    safety_rules: bool = True
    schedule: str = "fcfs"
    clipped_buffers: int = 0
    implementation: str = "fast"
    max_new: str | int = "unset"
    engine_options: dict = field(default_factory=dict)


def _plain(value):
    """A cell as a plain Python value for a message (``0``, not ``np.int64(0)``)."""
    return value.item() if isinstance(value, np.generic) else value


def _numeric_column(trace: pd.DataFrame, col: str, argument: str, unit: str) -> np.ndarray:
    """Column ``col`` as float64; ValueError naming it for a repeated column, booleans, datetimes or
    text (a number that arrives as ``"10"`` or ``True`` is a bug upstream, not a number)."""
    names = [str(c) for c in trace.columns]
    twins = [c for c in names if c == col or (c.startswith(col + ".") and c[len(col) + 1:].isdigit())]
    if len(twins) > 1:
        raise ValueError(f"{argument}: column {col!r} appears {len(twins)} times ({twins}; pandas renames a repeated "
                         "CSV header 'x' to 'x.1'): keep one, it is ambiguous which to use")
    s = trace[col]
    kind = s.dtype.kind
    if kind == "b":
        raise ValueError(f"{argument}: column {col!r} must hold numbers [{unit}], not True/False")
    if kind in "mM":
        raise ValueError(f"{argument}: column {col!r} must hold numbers [{unit}], got {s.dtype} values "
                         f"(convert them, e.g. (t - t.min()).dt.total_seconds() for times)")
    if kind not in "iuf":
        v = s.to_numpy(dtype=object)
        bad = np.array([isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating))
                        for x in v], dtype=bool)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{argument}: column {col!r} must hold numbers [{unit}], not text, booleans or other "
                             f"objects; row {i} has {_plain(v[i])!r}")
    return s.to_numpy(dtype=float, na_value=np.nan)


def check_trace(trace: pd.DataFrame, argument: str = "trace") -> pd.DataFrame:
    """Validate a tidy trace; ValueError names the column and the first bad row.

    Each tidy column appears once; arrivals are numbers [s] (not datetimes), finite and >= 0, and
    span at most :data:`kvdro.sim.timing.MAX_HORIZON_S` (53 days: the int64 picosecond clock);
    every request names its class; token counts are integer numbers (not text or booleans),
    prompts >= 1 token, each at most :data:`kvdro.sim.envelope.MAX_TOKENS` = 2**53 (float64's
    exact integers: a larger count would be rounded or wrap in an int64 cast)."""
    if not isinstance(trace, pd.DataFrame):
        raise ValueError(f"{argument}: must be a pandas DataFrame with columns {list(_TIDY)}")
    missing = [c for c in _TIDY if c not in trace.columns]
    if missing:
        raise ValueError(f"{argument}: missing column(s) {missing}")
    if len(trace) == 0:
        raise ValueError(f"{argument}: empty trace")
    if list(trace.columns).count("request_class") > 1:
        raise ValueError(f"{argument}: column 'request_class' appears more than once: keep one")
    t = _numeric_column(trace, "arrival_s", argument, "s")
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{argument}: column 'arrival_s' must hold finite times >= 0 [s]; row {i} has {_plain(trace['arrival_s'].iloc[i])!r}")
    first, last = int(np.argmin(t)), int(np.argmax(t))
    if t[last] - t[first] > MAX_HORIZON_S:  # the int64 picosecond clock would wrap (kvdro.sim.timing)
        raise ValueError(f"{argument}: column 'arrival_s' spans {t[last] - t[first]:.3g} s, from row {first} "
                         f"({_plain(t[first])!r} s) to row {last} ({_plain(t[last])!r} s): more than the "
                         f"{MAX_HORIZON_S:.3g} s ({MAX_HORIZON_S / 86400:.1f} days) of arrivals the simulator's "
                         "int64 picosecond clock holds")
    cls = trace["request_class"]
    codes, uniques = pd.factorize(cls)  # each class's name checked once, not once per request
    blank = (pd.Series(uniques).astype(str).str.strip() == "").to_numpy()
    bad = (codes < 0) | np.append(blank, False)[codes]
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{argument}: column 'request_class' must name each request's class; row {i} has "
                         f"{_plain(cls.iloc[i])!r}")
    for col in ("input_tokens", "output_tokens"):
        v = _numeric_column(trace, col, argument, "tokens")
        bad = ~np.isfinite(v) | (v < 0) | (v != np.round(v))
        if col == "input_tokens":
            bad |= v < 1
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{argument}: column {col!r} must hold {'positive' if col == 'input_tokens' else 'non-negative'} "
                             f"integer token counts; row {i} has {_plain(trace[col].iloc[i])!r}")
        big = v > MAX_TOKENS
        if big.any():
            i = int(np.flatnonzero(big)[0])
            raise ValueError(f"{argument}: column {col!r} holds {_plain(trace[col].iloc[i])!r} tokens in row {i}, more "
                             "than the 2**53 (9.0e15) the simulator counts exactly")
    return trace


def _route(classes: np.ndarray, names: list[str], deployment: Deployment, rng: np.random.Generator) -> np.ndarray:
    """Group index per request (-1 = rejected), drawn from the routing probabilities with ``rng``."""
    probs = deployment.routing_matrix(names)
    cum = np.cumsum(probs, axis=1)
    cum[:, -1] = np.maximum(cum[:, -1], 1.0)  # guard the last edge against rounding
    u = rng.random(classes.size)
    col = np.empty(classes.size, dtype=np.int64)
    for i in range(len(names)):
        m = classes == i
        col[m] = np.searchsorted(cum[i], u[m], side="right")
    return col - 1


@dataclass(frozen=True, eq=False)
class _Run:
    """``simulate``'s arguments, checked and resolved: the preset ``engine``, the ``implementation`` that
    runs it, ``max_new``, the preset's config, the trace's prefix keys (CSR), the deployment, the costs."""

    policy: str
    buffers: Mapping[str, float] | None
    dep: Deployment
    rho: float
    cost_params: dict
    engine: str
    implementation: str
    max_new: str | int
    preset_cfg: object
    engine_options: Mapping | None
    prefix_csr: tuple[np.ndarray, np.ndarray] | None
    progress: bool
    record: bool
    eps_fraction: float
    reservation: str
    safety_rules: bool
    deadline: str
    schedule: str
    length_hint: np.ndarray | None
    aging_s_per_token: float


@dataclass(frozen=True, eq=False)
class _Requests:
    """The trace's columns in arrival order, as arrays: ``order`` (trace row of each), ``arrival_s`` [s],
    ``arrival_ps`` [ps from the first arrival], prompts ``L`` and trace outputs ``xi`` [tokens], the
    classes as codes ``cls`` into their sorted ``names`` and ``cls_raw`` (one shared str per class)."""

    order: np.ndarray
    arrival_s: np.ndarray
    arrival_ps: np.ndarray
    L: np.ndarray
    xi: np.ndarray
    cls: np.ndarray
    cls_raw: np.ndarray
    names: list[str]

    @property
    def n(self) -> int:
        return self.L.size


@dataclass(frozen=True, eq=False)
class _Limits:
    """What the policy and the limits make of each request (arrival order): the buffers ``buf`` and
    eta [tokens], the served length ``X`` [tokens], the ``ignored``/``truncated``/``capped`` masks,
    the preset's ``max_new_tokens``, whether vLLM v0's admission ``reserves``, the "sof" ``queue_key`` [ps]."""

    buf: Mapping[str, float]
    eta: np.ndarray
    X: np.ndarray
    ignored: np.ndarray
    truncated: np.ndarray
    capped: np.ndarray
    max_new_tokens: np.ndarray | None
    reserves: bool
    queue_key: np.ndarray | None


@dataclass(frozen=True, eq=False)
class _Routing:
    """Each request's serving ``group`` (-1 = ``rejected``), whether it is ``served`` (routed and not
    ignored), its ``reserve_blocks``, and how many served buffers were ``clipped`` to the window."""

    group: np.ndarray
    rejected: np.ndarray
    served: np.ndarray
    reserve_blocks: np.ndarray
    clipped: int


@dataclass(frozen=True, eq=False)
class _Engines:
    """Per micro-batch engine: its (EngineSpec, StepClock), EngineInput, members (request indices in
    arrival order) and the start of its row of ``SimResult.engines``."""

    specs: list
    inputs: list
    members: list
    rows: list


def simulate(
    trace: pd.DataFrame,
    *,
    policy: str,
    buffers: Mapping[str, float] | None = None,
    deployment: Deployment | None = None,
    rho: float = 10.0,
    costs: Mapping[str, float] | None = None,
    rng: np.random.Generator,
    engine: str = "vllm-v0",
    implementation: str | None = None,
    max_new: str | int = "unset",
    engine_options: Mapping | None = None,
    progress: bool = False,
    record: bool = False,
    eps_fraction: float = 0.15,
    reservation: str = "soft",
    safety_rules: bool = True,
    deadline: str = "request",
    schedule: str = "fcfs",
    length_hint: np.ndarray | None = None,
    aging_s_per_token: float = 0.1,
    prefix_keys=None,
) -> SimResult:
    """Serve ``trace`` (tidy schema: arrival_s, input_tokens, output_tokens, request_class) on
    ``deployment`` (default :func:`default_deployment`: 2 x TP4-PP1) under ``policy``.

    Args:
        policy: one of :data:`kvdro.sim.policies.ALL_POLICIES`: :data:`POLICIES`, or an oracle
            that knows each request's true output length xi (after the context cap): ``oracle``
            (vLLM's admission plus a look-ahead on the known trajectories; never preempts) or
            ``exact`` (reserve exactly L_in + xi).
        buffers: class -> eta [tokens] for a reservation policy; ``None`` -> :func:`policy_buffers`
            fitted **in sample**, on ``trace`` itself (pass buffers fitted on a training part for an
            out-of-sample run). Ignored for ``vllm``, ``oracle`` and ``exact``.
        rho: c_p / c_w (sets c_p of the cost, and the ``saa``/``dro`` buffers when fitted here).
        costs: overrides of ``c_p, c_w, c_slo, c_rej, c_gpu`` (:func:`kvdro.sim.metrics.default_costs`).
        rng: the seeded generator that draws the routing.
        engine: the engine's rules, a preset of :data:`kvdro.sim.engines.ENGINES`: ``"vllm-v0"``
            (default: today's engine, :mod:`kvdro.sim.scheduler`), ``"vllm-v1"``, ``"sglang"``,
            ``"trtllm-gne"``, ``"trtllm-maxutil"``, ``"lightllm"`` (:mod:`kvdro.sim.engines`). The
            old values ``"fast"`` and ``"reference"`` still work: they mean ``engine="vllm-v0"``
            with that ``implementation``.
        implementation: ``"fast"`` (compiled; the default, but with the trace's ``prefix_keys``) or
            ``"reference"`` (step by step) (:mod:`kvdro.sim.engine_choice`). ``"fast-python"`` (a
            pure-Python event engine) was retired: a ValueError says what to use instead.
        max_new: each request's ``max_new_tokens``: ``"unset"`` (window - prompt), an integer
            client cap >= 1, ``"policy"`` (``policy``'s estimate eta_i) or ``"true"`` (the true
            length); a request longer than its max_new ends there, outcome ``capped`` (not served;
            ``metrics["capped"]`` whenever a preset or a max_new is given) -- see
            :mod:`kvdro.sim.engine_choice`. With a preset other than ``vllm-v0``, a reservation
            ``policy`` enters only through ``max_new="policy"`` (a cap) or ``"policy-soft"`` (the
            estimate reserved against, no cap: ``sglang``, ``lightllm``).
        engine_options: the preset's knobs overriding its defaults (its module's ``Config``, e.g.
            ``{"max_num_batched_tokens": 8192}`` for ``vllm-v1``, ``{"schedule_conservativeness":
            0.5}`` for ``sglang``); ValueError names a bad one.
        progress: a tqdm bar on stderr (requests finished).
        record: keep a per-step trace in each engine output (reference engine only; small runs).
        reservation: ``"soft"`` (default; admission control, overflow grows block by block and is
            preempted only when memory is short) or ``"hard"`` (a cap: a request reaching its
            reservation is preempted and re-admitted with a doubled buffer); see
            :mod:`kvdro.sim.scheduler`. Ignored for ``vllm``, which reserves nothing.
        safety_rules: ``True`` (default): every policy keeps vLLM's 1% watermark at admission and
            its free-block rule before every decode. ``False`` drops both for the reservation
            policies -- the package's behaviour before issue 15, kept **only** for chapter 7's
            before/after table; ``vllm`` always keeps them.
        deadline: which deadline judges a request for ``goodput_rps`` and ``slo_violation_rate``
            (:data:`DEADLINES`): ``"request"`` (default) D = 2 s + 0.1 s x that request's xi
            (:func:`kvdro.workload.default_slo_s` of its own output length); ``"class"`` the
            paper's per-class D_i of (6f) (``deployment.slo_s``, else the class's mean output),
            kept as a sensitivity reading. The cost's SLO term always prices lateness against
            the class D_i (:mod:`kvdro.sim.metrics`).
        schedule: the waiting queue's order inside vLLM's admission (:data:`SCHEDULES`):
            ``"fcfs"`` (default, vLLM's) or ``"sof"``, shortest-output-first with aging: requests
            never admitted wait in the order of the static key arrival_s + aging_s_per_token x hint
            [s]. With the default 0.1 s/token -- the slope of the per-request deadline
            D = 2 s + 0.1 s x xi -- "sof" is earliest-deadline-first on predicted deadlines. **No
            starvation:** a request arriving at time t has key >= t, so once the clock passes a
            waiting request's key, no later arrival is ordered before it; it waits at most until
            then plus the time to serve the finitely many requests already ahead. Head-of-line
            blocking, the token budget and the batch cap stay vLLM's (the walk follows the key
            order and stops at the first request that does not fit); preempted requests go back to
            the front, as with FCFS.
        length_hint: the output lengths [tokens] "sof" orders by, aligned with the rows of
            ``trace`` (a prediction, e.g. a class quantile of a training half); ``None`` = the true
            lengths xi after the context cap (the oracle scheduler). Ignored for ``"fcfs"``.
        aging_s_per_token: the key's slope [s per token], >= 0 (0 is FCFS).
        prefix_keys: prefix sharing across requests (``vllm-v1``'s automatic prefix caching,
            ``sglang``'s radix cache): ``None`` (default: off, results as before), ``"hash_ids"``
            (from a Mooncake trace's ``hash_ids``) or ``kvdro.datasets.prefix_block_keys(trace)``
            (16-token block keys per row; :mod:`kvdro.sim.prefix_keys`). Runs on the reference
            engine (``implementation="fast"`` is refused); ``metrics`` then also carry
            ``prefix_hit_tokens`` and ``prefill_tokens``.

    Raises:
        ValueError: naming the argument (or trace column and row) for bad input; a reservation
            buffer larger than the context window is not an error: it is clipped to the window before
            any integer cast and counted in ``SimResult.clipped_buffers``.
        ClockLimitError: (a ValueError, :mod:`kvdro.sim.timing`) the trace does not drain on the
            deployment within the simulator's clock; every implementation refuses the same runs
            (:mod:`kvdro.sim.envelope`).
    """
    start = time.perf_counter()
    run = _validate(trace, rng=rng, policy=policy, buffers=buffers, deployment=deployment, rho=rho, costs=costs,
                    engine=engine, implementation=implementation, max_new=max_new, engine_options=engine_options,
                    progress=progress, record=record, eps_fraction=eps_fraction, reservation=reservation,
                    safety_rules=safety_rules, deadline=deadline, schedule=schedule, length_hint=length_hint,
                    aging_s_per_token=aging_s_per_token, prefix_keys=prefix_keys)
    req = _sort_requests(trace)
    lim = _limits(run, trace, req)
    routed = _route_requests(run, req, lim, rng)
    engines = _engine_inputs(run, req, lim, routed)
    outputs = _run_engines(run, req, lim, routed, engines)
    requests = _requests_frame(run, trace, req, lim, routed, engines, outputs)
    return _measure(run, req, lim, routed, engines, outputs, requests, start)


def _validate(trace: pd.DataFrame, *, rng, policy, buffers, deployment, rho, costs, engine, implementation, max_new,
              engine_options, progress, record, eps_fraction, reservation, safety_rules, deadline, schedule,
              length_hint, aging_s_per_token, prefix_keys) -> _Run:
    """Check ``simulate``'s arguments and the trace (ValueError naming the argument, or the trace's column and
    row) and resolve the engine, implementation, max_new, deployment and costs."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng: pass a seeded numpy.random.Generator")
    if policy not in ALL_POLICIES:
        raise ValueError(f"policy: must be one of {ALL_POLICIES}, got {policy!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: must be one of {SCHEDULES}, got {schedule!r}")
    if (isinstance(aging_s_per_token, bool) or not isinstance(aging_s_per_token, (int, float, np.integer, np.floating))
            or not (np.isfinite(aging_s_per_token) and aging_s_per_token >= 0)):
        raise ValueError(f"aging_s_per_token: must be a finite number >= 0 [s per token], got {aging_s_per_token!r}")
    if record and implementation is None and engine != "fast":
        implementation = "reference"  # a per-step trace is the reference engine's
    engine, implementation = resolve_engine(engine, implementation, prefix_keys=prefix_keys is not None)
    max_new = check_max_new(max_new)
    if engine == DEFAULT_ENGINE and engine_options:
        raise ValueError("engine_options: vllm-v0's knobs are the deployment's (max_num_seqs, max_num_batched_tokens, watermark)")
    preset_cfg = None if engine == DEFAULT_ENGINE else make_config(engine, engine_options)
    if reservation not in READINGS:
        raise ValueError(f"reservation: must be one of {READINGS}, got {reservation!r}")
    if not isinstance(safety_rules, bool):
        raise ValueError(f"safety_rules: must be True or False, got {safety_rules!r}")
    if deadline not in DEADLINES:
        raise ValueError(f"deadline: must be one of {DEADLINES}, got {deadline!r}")
    if record and implementation != "reference":
        raise ValueError("record: a per-step trace needs implementation='reference'")
    if not (_real("eps_fraction", eps_fraction) >= 0):
        raise ValueError(f"eps_fraction: must be a finite number >= 0, got {eps_fraction!r}")
    check_trace(trace)
    prefix_csr = check_prefix_keys(prefix_keys, trace)
    dep = default_deployment(trace) if deployment is None else deployment
    if not isinstance(dep, Deployment):
        raise ValueError("deployment: must be a kvdro.sim.Deployment")
    cost_params = default_costs(rho, costs)
    check_preset_arguments(engine, policy=policy, max_new=max_new, reservation=reservation, safety_rules=safety_rules,
                           schedule=schedule, prefix=any(any(f) for f in dep.prefix_caching.values()))
    return _Run(policy=policy, buffers=buffers, dep=dep, rho=rho, cost_params=cost_params, engine=engine,
                implementation=implementation, max_new=max_new, preset_cfg=preset_cfg, engine_options=engine_options,
                prefix_csr=prefix_csr, progress=progress, record=record, eps_fraction=eps_fraction,
                reservation=reservation, safety_rules=safety_rules, deadline=deadline, schedule=schedule,
                length_hint=length_hint, aging_s_per_token=aging_s_per_token)


def _sort_requests(trace: pd.DataFrame) -> _Requests:
    """The columns in arrival order, as arrays; the classes as codes into their sorted names (the names
    converted once per class, never one Python string per request: traces of 10^7 requests)."""
    order = np.argsort(trace["arrival_s"].to_numpy(dtype=float), kind="stable")
    arrival_s = trace["arrival_s"].to_numpy(dtype=float)[order]
    arrival_ps = np.round((arrival_s - arrival_s.min()) * PS_PER_S).astype(np.int64)
    L = trace["input_tokens"].to_numpy()[order].astype(np.int64)
    xi = trace["output_tokens"].to_numpy()[order].astype(np.int64)
    codes, uniques = pd.factorize(trace["request_class"])
    labels = pd.Series(uniques).astype(str).to_numpy(dtype=object)
    names = sorted(set(labels.tolist()))
    cls = np.searchsorted(np.array(names), labels)[codes[order]]
    cls_raw = np.array(names, dtype=object)[cls]  # one shared str object per class
    return _Requests(order=order, arrival_s=arrival_s, arrival_ps=arrival_ps, L=L, xi=xi, cls=cls, cls_raw=cls_raw,
                     names=names)


def _limits(run: _Run, trace: pd.DataFrame, req: _Requests) -> _Limits:
    """The policy's buffers (fitted on ``trace`` when not given), the context limit (ignored prompts,
    capped generation), a preset's window and max_new, and the "sof" queue key."""
    policy, L, xi, n = run.policy, req.L, req.xi, req.n
    reserves = policy not in ("vllm", "oracle")
    if policy == "exact":
        buf = Buffers()
        eta = None  # the true output length after the context cap, set below
    elif reserves:
        buf = (policy_buffers(policy, trace, rho=run.rho, c_w=run.cost_params["c_w"], eps_fraction=run.eps_fraction)
               if run.buffers is None else run.buffers)
        eta = request_buffers(buf, req.cls_raw, L)
    else:
        buf = Buffers()
        eta = np.full(n, np.nan)

    # context limit: ignored prompts, capped generation
    limit = run.dep.max_model_len
    ignored = L > run.dep.prompt_limit
    X = np.maximum(1, np.minimum(xi, limit - L + 1))
    truncated = ~ignored & (xi > X)
    if policy == "exact":
        eta = X.astype(float)
    capped = np.zeros(n, dtype=bool)
    max_new_tokens = None
    if run.engine != DEFAULT_ENGINE or run.max_new != "unset":  # a preset's window, max_new and generation cap
        X, max_new_tokens, ignored, truncated, capped = generation_limits(
            run.engine, run.preset_cfg, run.max_new, L=L, xi=xi, window=limit, v0_limit=X, v0_ignored=ignored, eta=eta)
    if run.engine != DEFAULT_ENGINE:
        reserves = False  # a preset reserves through max_new, not through vLLM v0's admission rule
    return _Limits(buf=buf, eta=eta, X=X, ignored=ignored, truncated=truncated, capped=capped,
                   max_new_tokens=max_new_tokens, reserves=reserves, queue_key=_queue_key(run, trace, req, X))


def _queue_key(run: _Run, trace: pd.DataFrame, req: _Requests, X: np.ndarray) -> np.ndarray | None:
    """"sof"'s static waiting-queue key [ps]: arrival + aging_s_per_token x the length hint (``None`` for "fcfs")."""
    if run.schedule != "sof":
        return None
    length_hint, aging_s_per_token = run.length_hint, run.aging_s_per_token
    if length_hint is None:
        hint = X.astype(float)
    else:
        if np.asarray(length_hint).dtype.kind not in "iuf":  # text ("5") and booleans refused, not converted
            raise ValueError(f"length_hint: must hold numbers [tokens], got dtype {np.asarray(length_hint).dtype}")
        hint = np.asarray(length_hint, dtype=float).ravel()
        if hint.size != len(trace):
            raise ValueError(f"length_hint: needs one length per trace row ({len(trace)}), got {hint.size}")
        if not np.all(np.isfinite(hint)) or np.any(hint < 0):
            i = int(np.flatnonzero(~np.isfinite(hint) | (hint < 0))[0])
            raise ValueError(f"length_hint: must hold finite lengths >= 0 [tokens]; row {i} has {_plain(hint[i])!r}")
        hint = hint[req.order]
    if aging_s_per_token * float(hint.max()) > MAX_HORIZON_S:
        raise ValueError(f"length_hint: aging_s_per_token x the largest hint exceeds {MAX_HORIZON_S:.3g} s")
    if float(req.arrival_ps.max()) + aging_s_per_token * float(hint.max()) * PS_PER_S >= 2.0**63 - 2.0**12:
        raise ValueError("length_hint: the last arrival plus aging_s_per_token x the largest hint passes the "
                         "int64 picosecond clock")
    return req.arrival_ps + np.round(aging_s_per_token * hint * PS_PER_S).astype(np.int64)


def _route_requests(run: _Run, req: _Requests, lim: _Limits, rng: np.random.Generator) -> _Routing:
    """Route each request to a group (or reject it) and size its reservation [blocks]."""
    group = _route(req.cls, req.names, run.dep, rng)
    rejected = group < 0
    served = ~rejected & ~lim.ignored
    reserve_blocks = np.zeros(req.n, dtype=np.int64)
    clipped = 0
    if lim.reserves:
        # the buffer clipped to the window before the integer cast (a buffer >= 2**63 - L_in would wrap)
        limit, L, eta = run.dep.max_model_len, req.L, lim.eta
        room = np.maximum(limit - L, 0).astype(float)
        clipped = int(np.count_nonzero(served & (eta > room)))
        tokens = np.minimum(L + np.ceil(np.minimum(eta, room)).astype(np.int64), limit)
        reserve_blocks = -(-tokens // BLOCK_TOKENS)
    return _Routing(group=group, rejected=rejected, served=served, reserve_blocks=reserve_blocks, clipped=clipped)


def _engine_inputs(run: _Run, req: _Requests, lim: _Limits, routed: _Routing) -> _Engines:
    """Each micro-batch engine's spec, clock and input: a group's served requests round-robin over its
    ``pp`` engines, with the prefix blocks shared per class and per request (prefix caching)."""
    dep, names, cls, L = run.dep, req.names, req.cls, req.L
    reserves, limit, policy = lim.reserves, dep.max_model_len, run.policy
    class_prefix_blocks = np.array([int(dep.prefix_tokens.get(c, 0.0)) // BLOCK_TOKENS for c in names], dtype=np.int64)
    usable = np.minimum(class_prefix_blocks[cls], (L - 1) // BLOCK_TOKENS)

    specs, inputs, members, engine_rows = [], [], [], []
    for gi, cfg in enumerate(dep.groups):
        idx_g = np.flatnonzero(routed.served & (routed.group == gi))
        cached = np.array([bool(dep.prefix_caching.get(c, [False] * len(dep.groups))[gi]) for c in names])
        pblocks = tuple(int(b) if cached[i] else 0 for i, b in enumerate(class_prefix_blocks))
        blocks = dep.engine_blocks(cfg)
        safe = run.safety_rules or not reserves
        spec = EngineSpec(
            blocks=blocks,
            watermark_blocks=(max(dep.watermark_blocks(cfg), 1) if policy == "oracle"  # keeps >= 1 block free
                              else dep.watermark_blocks(cfg) if safe else 0),
            max_num_seqs=dep.max_num_seqs,
            token_budget=dep.token_budget,
            free_block_rule=safe,
            prefix_blocks=pblocks,
            hard=reserves and run.reservation == "hard",
            window_blocks=-(-limit // BLOCK_TOKENS),
            lookahead=policy == "oracle",
        )
        clock = StepClock.shared(dep.model, dep.gpu, cfg)
        for e in range(cfg.pp):
            idx = idx_g[e::cfg.pp]
            key = np.where(cached[cls[idx]] & (usable[idx] > 0), cls[idx], -1).astype(np.int64)
            inp = EngineInput(
                arrival_ps=req.arrival_ps[idx],
                prompt=L[idx],
                output=lim.X[idx],
                reserve_blocks=routed.reserve_blocks[idx],
                prefix_key=key,
                shared_blocks=np.where(key >= 0, usable[idx], 0).astype(np.int64),
                queue_key=None if lim.queue_key is None else lim.queue_key[idx],
            )
            specs.append((spec, clock))
            inputs.append(inp)
            members.append(idx)
            engine_rows.append({"group": gi, "config": cfg.name, "engine": e})
    return _Engines(specs=specs, inputs=inputs, members=members, rows=engine_rows)


def _run_engines(run: _Run, req: _Requests, lim: _Limits, routed: _Routing, engines: _Engines) -> list[EngineOutput]:
    """Run each engine on the implementation chosen: compiled (``"fast"``) or step by step
    (``"reference"``; a preset's with the prefix keys); invariants checked."""
    from kvdro.sim.engine_reference import run_reference

    engine, implementation, preset_cfg = run.engine, run.implementation, run.preset_cfg
    limit = run.dep.max_model_len

    bar = None
    if run.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=int(routed.served.sum()), desc=f"simulate {run.policy}", unit="req", file=None, leave=False)
    outputs: list[EngineOutput] = []
    try:
        for (spec, clock), inp, idx in zip(engines.specs, engines.inputs, engines.members):
            if engine != DEFAULT_ENGINE and implementation == "fast":
                from kvdro.sim.presets_compiled import run_compiled_preset

                out = run_compiled_preset(engine, preset_cfg, spec, inp, lim.max_new_tokens[idx], clock, window=limit)
                if bar is not None:
                    bar.update(int(len(inp)))
            elif engine != DEFAULT_ENGINE:
                from kvdro.sim.engine_presets import run_preset

                keys = None if run.prefix_csr is None else keys_for_rows(run.prefix_csr, req.order[idx])
                out = run_preset(engine, preset_cfg, spec, inp, lim.max_new_tokens[idx], clock, window=limit,
                                 record=run.record, progress=bar, prefix_keys=keys)
            elif implementation == "reference":
                out = run_reference(spec, inp, clock, record=run.record, progress=bar)
            else:
                from kvdro.sim.engine_compiled import run_compiled

                out = run_compiled(spec, inp, clock, progress=bar)
            check_engine(spec, inp, out)
            outputs.append(out)
    finally:
        if bar is not None:
            bar.close()
    return outputs


def _requests_frame(run: _Run, trace: pd.DataFrame, req: _Requests, lim: _Limits, routed: _Routing,
                    engines: _Engines, outputs: list[EngineOutput]) -> pd.DataFrame:
    """``SimResult.requests``: one row per request, built in arrival order, returned in trace order."""
    n, names, cls, L, xi, dep = req.n, req.names, req.cls, req.L, req.xi, run.dep
    rejected, reserve_blocks, reserves = routed.rejected, routed.reserve_blocks, lim.reserves
    admit = np.full(n, -1, dtype=np.int64)
    first = np.full(n, -1, dtype=np.int64)
    finish = np.full(n, -1, dtype=np.int64)
    pre = np.zeros(n, dtype=np.int64)
    rec = np.zeros(n, dtype=np.int64)
    capf = np.zeros(n, dtype=np.int64)
    gen = np.zeros(n, dtype=np.int64)
    eng = np.full(n, -1, dtype=np.int64)
    for e, (idx, out) in enumerate(zip(engines.members, outputs)):
        admit[idx], first[idx], finish[idx] = out.admit_ps, out.first_token_ps, out.finish_ps
        pre[idx], rec[idx], capf[idx], gen[idx] = out.preemptions, out.recomputed_tokens, out.final_cap_tokens, out.generated
        eng[idx] = e
    outcome = np.array(["completed", "truncated", "ignored", "rejected"], dtype=object)[
        np.where(rejected, 3, np.where(lim.ignored, 2, np.where(lim.truncated, 1, 0)))]
    outcome[lim.capped & ~rejected] = "capped"  # ended at its max_new, below its true length: not served
    done = routed.served
    sec = lambda a: np.where(a >= 0, a / PS_PER_S, np.nan)  # noqa: E731
    a_s = req.arrival_ps / PS_PER_S
    slo_map = {}
    for i, c in enumerate(names):
        if c in dep.slo_s:
            slo_map[c] = float(dep.slo_s[c])
        else:
            from kvdro.workload import default_slo_s

            slo_map[c] = default_slo_s(float(xi[cls == i].mean()))
    slo = np.array([slo_map[c] for c in names])[cls]
    if run.deadline == "request":
        from kvdro.workload import DEFAULT_TPOT_SLO_S, DEFAULT_TTFT_SLO_S

        due = DEFAULT_TTFT_SLO_S + DEFAULT_TPOT_SLO_S * xi.astype(float)
    else:
        due = slo
    finish_s = sec(finish)
    first_s = sec(first)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(done & (gen > 1), (finish_s - first_s) / np.maximum(gen - 1, 1), np.nan)
    reserved_tokens = BLOCK_TOKENS * reserve_blocks
    columns = {
        "request_class": req.cls_raw,
        "arrival_s": req.arrival_s,
        "input_tokens": L,
        "output_tokens": xi,
        "generated_tokens": gen,
        "group": np.where(rejected, -1, routed.group),
        "engine": eng,
        "outcome": outcome,
        "buffer_tokens": lim.eta,
        "reserved_blocks": reserve_blocks,
        "admit_s": sec(admit),
        "first_token_s": first_s,
        "finish_s": finish_s,
        "wait_s": sec(admit) - np.where(done, a_s, np.nan),
        "ttft_s": first_s - np.where(done, a_s, np.nan),
        "tpot_s": tpot,
        "e2e_s": finish_s - np.where(done, a_s, np.nan),
        "slo_s": slo,
        "deadline_s": due,
        "preemptions": pre,
        "recomputed_tokens": rec,
        "waste_tokens": np.where(done, np.maximum(0, capf - L - gen), 0),
        "overflow_tokens": np.where(done & reserves, np.maximum(0, L + gen - reserved_tokens), 0),
    }
    order = req.order
    if not np.array_equal(order, np.arange(n)):  # back to trace order: row j is sorted row inv[j]
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n)
        columns = {k: v[inv] for k, v in columns.items()}
    # the frame keeps these fresh arrays as its columns (no consolidating copy)
    return pd.DataFrame(columns, index=trace.index, copy=False)


def _measure(run: _Run, req: _Requests, lim: _Limits, routed: _Routing, engines: _Engines,
             outputs: list[EngineOutput], requests: pd.DataFrame, start: float) -> SimResult:
    """The metrics and cost (:mod:`kvdro.sim.metrics`), the accounting check, the engines' rows, the
    :class:`SimResult`; ``start`` is the run's ``time.perf_counter()`` at entry (``metrics["wall_s"]``)."""
    n, specs = req.n, engines.specs
    horizon_ps = int(max([int(req.arrival_ps.max())] + [o.end_ps for o in outputs]))
    engine_pairs = [(s[0], o) for s, o in zip(specs, outputs)]
    metrics, breakdown = compute_metrics(requests, engine_pairs, run.cost_params, gpus=run.dep.total_gpus,
                                         horizon_ps=horizon_ps, wall_s=0.0, reservation=lim.reserves)
    n_capped = int(np.count_nonzero(lim.capped & ~routed.rejected))
    check_accounting(n, metrics["completed"] + n_capped, metrics["rejected"], metrics["ignored"])
    if run.engine != DEFAULT_ENGINE or run.max_new != "unset":
        metrics["capped"] = n_capped
    if run.prefix_csr is not None:
        metrics["prefix_hit_tokens"] = int(sum(int(o.prefix_hit_tokens.sum()) for o in outputs))
        metrics["prefill_tokens"] = int(sum(o.prefill_tokens for o in outputs))
    engine_rows = []
    for row, (spec, _), out, idx in zip(engines.rows, specs, outputs, engines.members):
        engine_rows.append({
            **row,
            "blocks": spec.blocks,
            "requests": int(idx.size),
            "steps": out.steps,
            "busy_share": out.busy_ps / horizon_ps if horizon_ps else 0.0,
            "mean_running": out.resident_integral / horizon_ps if horizon_ps else 0.0,
            "mean_decode_batch": out.decode_batch_integral / out.decode_ps if out.decode_ps else 0.0,
            "kv_use_mean": out.kv_integral / (spec.blocks * horizon_ps) if horizon_ps else 0.0,
            "kv_use_peak": out.peak_blocks / spec.blocks,
        })
    metrics["wall_s"] = float(time.perf_counter() - start)
    return SimResult(
        metrics=metrics, cost=breakdown, requests=requests, engines=pd.DataFrame(engine_rows),
        policy=run.policy, buffers=dict(lim.buf), deployment=run.dep, engine=run.engine,
        specs=[s for s, _ in specs], outputs=outputs, inputs=engines.inputs,
        reservation=run.reservation, safety_rules=run.safety_rules, schedule=run.schedule,
        clipped_buffers=routed.clipped, implementation=run.implementation, max_new=run.max_new,
        engine_options=dict(run.engine_options or {}),
    )
