"""The compiled engine (numba) equals the reference engine, bit for bit: on the property-test
generator of ``test_sim_engines.py`` (tiny pools, heavy preemption, soft and hard reservations, safety
rules on and off, shared prefixes) with jumps cut short (``kmax``), on integrals past int64, on the
conversation trace under vLLM and a reservation policy in both readings with prefix caching, with the
oracle's look-ahead and a key-ordered queue, and with the JIT disabled (the same source run as
Python, :func:`test_plain_python_under_numba_disable_jit`)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_engines import CLOCK, PER_REQUEST, engine_case, random_run

from kvdro.sim.engine_compiled import run_compiled
from kvdro.sim.engine_reference import run_reference
from kvdro.sim.invariants import check_engine
from kvdro.sim.presets_compiled.checks import run_without_jit
from kvdro.sim.scheduler import EngineInput, EngineSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_same(a, b, what=""):
    assert a.totals() == b.totals(), what
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{what} {name}")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_case(), st.sampled_from([1, 2, 3, 5, 17, 1 << 16]))
def test_compiled_equals_reference_with_jumps_cut_short(case, kmax):
    """Any bound on a jump gives the same run: a shorter jump is followed by an ordinary step."""
    spec, inp = case
    ref = run_reference(spec, inp, CLOCK)
    out = run_compiled(spec, inp, CLOCK, kmax=kmax)
    check_engine(spec, inp, out)
    assert_same(ref, out, f"reference vs compiled, kmax={kmax}")


def test_integrals_beyond_int64_are_exact():
    """32 long contexts (20,000-30,000 tokens, 1,500-2,500 decode steps) push kv_integral (blocks x ps)
    past 2**63; the compiled engine's limbs keep it exact (the reference engine's Python integers are)."""
    n = 32
    rng = np.random.default_rng(1)
    spec = EngineSpec(blocks=300_000, watermark_blocks=3000, max_num_seqs=n, token_budget=32_768, free_block_rule=True)
    inp = EngineInput(arrival_ps=np.zeros(n, dtype=np.int64), prompt=rng.integers(20_000, 30_000, n),
                      output=rng.integers(1500, 2500, n), reserve_blocks=np.zeros(n, dtype=np.int64),
                      prefix_key=np.full(n, -1), shared_blocks=np.zeros(n, dtype=np.int64))
    ref, out = run_reference(spec, inp, CLOCK), run_compiled(spec, inp, CLOCK)
    assert ref.kv_integral > 2**63
    assert_same(ref, out)


@pytest.fixture(scope="module")
def conv(data_dir):
    from kvdro.datasets import load_trace

    return load_trace("azure-2023-conv")


@pytest.mark.parametrize("policy, reading, scale, prefix, reference", [
    ("vllm", "soft", 1.0, False, True),
    ("dro", "soft", 1.0, True, False),
    ("mean", "hard", 0.6, True, True),
    ("vllm", "soft", 0.6, True, False),
])
def test_conversation_trace(conv, policy, reading, scale, prefix, reference):
    """The whole conversation trace, TP2 groups (some runs overloaded, with preemptions): simulate() with
    the compiled engine agrees with the reference engine (two cases: ~1.3 CPU s each for the reference)
    and, on every case, with the compiled engine's jumps cut to 7 steps (a different path through the
    event loop: more ordinary steps, more heap traffic; the property tests compare that path with the
    reference on small cases)."""
    from kvdro.sim import Deployment, default_deployment, simulate

    if prefix:  # the conversation class's first 160 tokens shared and cached on every group
        dep = Deployment(groups=("TP2-PP1",) * 4, prefix_tokens={"conversation": 160.0},
                         prefix_caching={"conversation": [True] * 4})
    else:
        dep = default_deployment(config="TP2-PP1")
    tr = conv.assign(arrival_s=conv["arrival_s"] / scale)
    kw = dict(policy=policy, deployment=dep, reservation=reading)
    fast = simulate(tr, rng=np.random.default_rng(0), **kw)
    configs = [g for g in dep.groups for _ in range(g.pp)]
    for spec, inp, cfg, out in zip(fast.specs, fast.inputs, configs, fast.outputs):
        assert_same(out, run_compiled(spec, inp, CLOCK.shared(dep.model, dep.gpu, cfg), kmax=7), f"{policy}, kmax=7")
    if reference:
        ref = simulate(tr, rng=np.random.default_rng(0), implementation="reference", **kw)
        assert fast.requests.equals(ref.requests)
        for a, b in zip(ref.outputs, fast.outputs):
            assert_same(a, b, policy)
    if policy == "mean":  # the overloaded hard-capped run does preempt
        assert sum(o.preemptions.sum() for o in fast.outputs) > 0


def test_conversation_trace_oracle_and_key_order(conv):
    """The oracle's look-ahead and a shortest-output-first queue (key = arrival + 0.05 s per output
    token) on the whole conversation trace, 4 x TP2-PP1 at 0.6 (a queue forms): the compiled and the
    reference engine agree on one of its engines (~0.4 CPU s each for the reference)."""
    from dataclasses import replace

    from kvdro.sim import default_deployment, simulate

    r = simulate(conv.assign(arrival_s=conv["arrival_s"] / 0.6), policy="vllm", deployment=default_deployment(config="TP2-PP1"),
                 rng=np.random.default_rng(0))
    clock = CLOCK.shared(r.deployment.model, r.deployment.gpu, r.deployment.groups[0])
    for spec, inp in zip(r.specs[:1], r.inputs[:1]):
        sof = replace(inp, queue_key=inp.arrival_ps + 5 * 10**10 * inp.output)
        for s, i in ((replace(spec, lookahead=True), inp), (spec, sof), (replace(spec, lookahead=True), sof)):
            a, b = run_reference(s, i, clock), run_compiled(s, i, clock)
            assert_same(a, b, f"lookahead={s.lookahead}, sof={i.queue_key is not None}")
            assert a.preemptions.sum() == 0 or not s.lookahead
    assert sum(int(o.preemptions.sum()) for o in r.outputs) > 0  # vLLM itself preempts here


# ---------------------------------------------------------------------------------------------
# NUMBA_DISABLE_JIT=1: the kernels' source as plain Python (how to step through it in a debugger)


def hand_case() -> tuple[EngineSpec, EngineInput]:
    """A hard-capped reservation policy with a shared prefix, a context window and preemptions."""
    rng = np.random.default_rng(5)
    n = 25
    p, o = rng.integers(5, 60, n), rng.integers(1, 80, n)
    spec = EngineSpec(blocks=40, watermark_blocks=1, max_num_seqs=6, token_budget=300, free_block_rule=True,
                      prefix_blocks=(2,), hard=True, window_blocks=12)
    inp = EngineInput(arrival_ps=np.cumsum(rng.integers(0, 3, n)) * 10**10, prompt=p, output=o,
                      reserve_blocks=-(-(p + 8) // 16), prefix_key=np.where(p > 40, 0, -1),
                      shared_blocks=np.where(p > 40, 2, 0))
    return spec, inp


def jit_off_seeds() -> list[int]:
    """Seeds of :func:`test_sim_engines.random_run` (at most 20 requests, so that plain Python is
    quick): the first with the oracle's look-ahead, with a hard reservation, with shortest-output-first
    and with prefix caching."""
    wanted = {"oracle": lambda kw: kw["policy"] == "oracle",
              "hard": lambda kw: kw["reservation"] == "hard" and kw["policy"] not in ("vllm", "oracle"),
              "sof": lambda kw: kw["schedule"] == "sof",
              "prefix": lambda kw: bool(kw["deployment"].prefix_tokens)}
    seeds = []
    for name, test in wanted.items():
        seeds.append(next(s for s in range(500) if len(random_run(s)[0]) <= 20 and test(random_run(s)[1])))
    return seeds


def outcomes(implementation: str, seeds: list[int]) -> list:
    """Per-request fields and engine totals: :func:`hand_case` (jumps of at most 3 steps), then
    ``simulate`` on each seed's random run, with ``implementation``."""
    from kvdro.sim import simulate

    spec, inp = hand_case()
    runs = [[run_reference(spec, inp, CLOCK) if implementation == "reference" else run_compiled(spec, inp, CLOCK, kmax=3)]]
    for seed in seeds:
        trace, kw = random_run(seed)
        runs.append(simulate(trace, rng=np.random.default_rng(seed), implementation=implementation, **kw).outputs)
    return [[({f: getattr(o, f).tolist() for f in PER_REQUEST}, o.totals()) for o in outs] for outs in runs]


_JIT_OFF = """
import json, sys
sys.path.insert(0, "tests")
import numba
from test_sim_compiled import outcomes
assert numba.config.DISABLE_JIT
print(json.dumps(outcomes("fast", {seeds})))
"""


def test_plain_python_under_numba_disable_jit():
    """NUMBA_DISABLE_JIT=1 runs the compiled engine's source as plain Python, with the reference
    engine's numbers: a hand-built hard-capped case with jumps cut short, and simulate() on random
    runs with the look-ahead, a hard reservation, shortest-output-first and prefix caching."""
    seeds = jit_off_seeds()
    got = run_without_jit(_JIT_OFF.format(seeds=seeds), cwd=ROOT)
    want = outcomes("reference", seeds)
    assert got == json.loads(json.dumps(want))
    spec, inp = hand_case()
    assert run_reference(spec, inp, CLOCK).preemptions.sum() > 0
