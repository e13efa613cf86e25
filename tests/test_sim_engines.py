"""The fast engine (compiled, :mod:`kvdro.sim.engine_compiled`) equals the reference engine, bit for
bit, on many small random traces (hypothesis), including tiny KV pools with heavy preemption, soft and
hard reservations, the safety rules on and off, shared prefixes, the oracle's look-ahead, exact
reservations and a waiting queue ordered by a static key (shortest-output-first); and the two
implementations equal through the whole of ``simulate`` on seeded random traces
(:func:`test_both_implementations_agree_on_random_traces`)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig
from kvdro.sim.engine_compiled import run_compiled
from kvdro.sim.engine_reference import run_reference
from kvdro.sim.envelope import drain_lower_bound_ps
from kvdro.sim.invariants import check_engine
from kvdro.sim.scheduler import EngineInput, EngineSpec, ceil_blocks
from kvdro.sim.timing import StepClock

CLOCK = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))
#: The per-request fields of an EngineOutput that two engines must agree on.
PER_REQUEST = ("admit_ps", "first_token_ps", "finish_ps", "preemptions", "recomputed_tokens", "final_cap_tokens", "generated")


@st.composite
def engine_case(draw):
    n = draw(st.integers(1, 25))
    mode = draw(st.sampled_from(["vllm", "reserve", "oracle", "exact"]))
    reactive = mode in ("vllm", "oracle")  # no reservation
    lookahead = mode == "oracle"
    safety = reactive or draw(st.booleans())  # watermark + free-block rule (always, but for the old behaviour)
    hard = not reactive and draw(st.booleans())
    n_keys = draw(st.integers(0, 2))
    prefix_blocks = tuple(draw(st.integers(0, 3)) for _ in range(n_keys))
    prompt = np.array(draw(st.lists(st.integers(1, 70), min_size=n, max_size=n)), dtype=np.int64)
    output = np.array(draw(st.lists(st.integers(1, 90), min_size=n, max_size=n)), dtype=np.int64)
    gaps = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n))  # ms between arrivals
    arrival = np.cumsum(np.array(gaps, dtype=np.int64) * 10**9)
    if reactive:
        reserve = np.zeros(n, dtype=np.int64)
    elif mode == "exact":  # the true length: never outgrows
        reserve = -(-(prompt + output) // 16)
    else:
        eta = np.array(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)), dtype=np.int64)
        reserve = -(-(prompt + eta) // 16)
    if n_keys:
        key = np.array(draw(st.lists(st.integers(-1, n_keys - 1), min_size=n, max_size=n)), dtype=np.int64)
    else:
        key = np.full(n, -1, dtype=np.int64)
    pb = np.array(prefix_blocks + (0,))
    shared = np.where(key >= 0, np.minimum(pb[key], (prompt - 1) // 16), 0)
    key = np.where(shared > 0, key, -1)
    shared = np.where(key >= 0, shared, 0).astype(np.int64)
    longest = int(max(ceil_blocks(int(p + o)) for p, o in zip(prompt, output)))
    longest = max(longest, int(reserve.max()) if reserve.size else 0)
    wm = draw(st.integers(1 if lookahead else 0, 2)) if safety else 0
    window = longest + draw(st.integers(0, 3))
    blocks = draw(st.integers(window + sum(prefix_blocks) + wm + 1, window + sum(prefix_blocks) + wm + 40))
    spec = EngineSpec(
        blocks=blocks, watermark_blocks=wm, max_num_seqs=draw(st.integers(1, 10)),
        token_budget=draw(st.integers(int(prompt.max() + output.max()), 400)), free_block_rule=safety,
        prefix_blocks=prefix_blocks, hard=hard, window_blocks=window, lookahead=lookahead,
    )
    queue_key = None
    if draw(st.booleans()):  # shortest-output-first with aging: arrival + aging x a hint (true or noisy)
        hint = output + np.array(draw(st.lists(st.integers(-30, 30), min_size=n, max_size=n)), dtype=np.int64) * draw(st.integers(0, 1))
        queue_key = arrival + draw(st.sampled_from([0, 10**9, 10**10, 10**11])) * np.maximum(hint, 0)
    inp = EngineInput(arrival_ps=arrival, prompt=prompt, output=output, reserve_blocks=reserve,
                      prefix_key=key, shared_blocks=shared, queue_key=queue_key)
    return spec, inp


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_case())
def test_fast_engine_equals_reference(case):
    spec, inp = case
    a = run_reference(spec, inp, CLOCK)
    b = run_compiled(spec, inp, CLOCK)
    check_engine(spec, inp, a)
    check_engine(spec, inp, b)
    if spec.lookahead:
        assert a.preemptions.sum() == 0  # the oracle never preempts
    assert drain_lower_bound_ps(spec, inp, CLOCK) <= a.end_ps  # the envelope's bound is a bound
    assert a.totals() == b.totals()
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_property_cases_include_heavy_preemption():
    """The strategy above does reach the regime it is meant to test: many preemptions per run."""
    rng = np.random.default_rng(3)
    n = 30
    prompt = rng.integers(20, 60, n)
    output = rng.integers(40, 90, n)
    spec = EngineSpec(blocks=20, watermark_blocks=0, max_num_seqs=8, token_budget=400, free_block_rule=True)
    inp = EngineInput(arrival_ps=np.zeros(n, dtype=np.int64), prompt=prompt, output=output,
                      reserve_blocks=np.zeros(n, dtype=np.int64), prefix_key=np.full(n, -1), shared_blocks=np.zeros(n, dtype=np.int64))
    a, b = run_reference(spec, inp, CLOCK), run_compiled(spec, inp, CLOCK)
    assert a.preemptions.sum() >= 20
    assert a.totals() == b.totals()
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_prefill_clock_equals_step_time_to_the_picosecond():
    """The clock's two-piece prefill formula (timing.py) is step_time itself, rounded, for any token mix."""
    from kvdro.hardware import step_time
    from kvdro.sim.timing import seconds_to_ps

    rng = np.random.default_rng(0)
    for tp, pp in ((2, 1), (4, 1), (2, 2), (4, 2)):
        cfg = ParallelConfig(tp, pp)
        clock = StepClock(LLAMA2_70B, A100_80GB, cfg)
        for _ in range(300):
            tokens = int(rng.integers(1, 16_385))
            parts = rng.multinomial(tokens, np.ones(3) / 3)
            pairs = int((parts.astype(np.int64) ** 2).sum()) if rng.random() < 0.7 else int(rng.integers(0, tokens))
            exact = seconds_to_ps(step_time(LLAMA2_70B, A100_80GB, cfg, tokens, 0, 0, prefill_attention_tokens2=pairs))
            assert abs(clock.prefill_ps(tokens, pairs) - exact) <= 1
    assert StepClock.shared(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1)) is StepClock.shared(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))


# ---------------------------------------------------------------------------------------------
# Differential fuzz through simulate(): seeded random traces, policies, readings, queue orders,
# windows, prefixes and deployments; the reference and the compiled engine must give
# the same per-request frame and the same engine integers. FUZZ_TRACES per test run (a few seconds);
# KVDRO_FUZZ_TRACES=1000 runs more.

FUZZ_TRACES = int(os.environ.get("KVDRO_FUZZ_TRACES", "32"))


def random_run(seed: int) -> tuple[pd.DataFrame, dict]:
    """A random trace and simulate() keywords (seeded): bursts of long requests on one or two small
    TP2 groups, so that many runs preempt."""
    from kvdro.sim import ALL_POLICIES, READINGS, SCHEDULES, Deployment

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 36))
    names = ["a", "b", "c"][: int(rng.integers(1, 4))]
    span = float(rng.choice([0.0, 0.0, 2.0, 30.0]))
    trace = pd.DataFrame({
        "arrival_s": np.round(np.sort(rng.uniform(0.0, span, n)), 3),
        "input_tokens": rng.integers(1, 6000 if rng.random() < 0.3 else 4000, n),
        "output_tokens": rng.integers(0, 3000, n),
        "request_class": rng.choice(names, n),
    })
    groups = tuple(str(g) for g in rng.choice(["TP2-PP1", "TP2-PP2"], int(rng.integers(1, 3))))
    settings = {"max_model_len": int(rng.choice([4096, 16_384]))}
    if rng.random() < 0.3:
        cached = [bool(x) for x in rng.integers(0, 2, len(groups))]
        settings |= {"prefix_tokens": {"a": 160.0}, "prefix_caching": {"a": cached}}
    if rng.random() < 0.2:
        settings["max_num_seqs"] = int(rng.integers(1, 12))
    kw = {
        "policy": str(rng.choice(ALL_POLICIES)),
        "reservation": str(rng.choice(READINGS)),
        "schedule": str(rng.choice(SCHEDULES)),
        "deployment": Deployment(groups=groups, **settings),
        "safety_rules": bool(rng.random() < 0.8),
        "rho": float(rng.choice([2.0, 10.0, 40.0])),
    }
    return trace, kw


@pytest.mark.parametrize("block", range(4))
def test_both_implementations_agree_on_random_traces(block):
    """FUZZ_TRACES seeded random traces (a quarter per block): simulate() with the reference engine and
    with the compiled one give identical results."""
    from kvdro.sim import simulate

    seeds = range(block, FUZZ_TRACES, 4)
    preempted = 0
    for seed in seeds:
        trace, kw = random_run(seed)
        ref, fast = (simulate(trace, rng=np.random.default_rng(seed), implementation=impl, **kw)
                     for impl in ("reference", "fast"))
        assert fast.requests.equals(ref.requests), (seed, kw["policy"])
        for a, b in zip(ref.outputs, fast.outputs):
            assert a.totals() == b.totals(), seed
        preempted += int(ref.requests["preemptions"].sum() > 0)
    assert preempted >= max(1, len(seeds) // 10)  # the generator reaches the regime that matters (~15 % preempt)
