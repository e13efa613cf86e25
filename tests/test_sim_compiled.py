"""The compiled engine (numba) equals the reference engine and the pure-Python fast engine, bit for
bit: on the property-test generator of ``test_sim_engines.py`` (tiny pools, heavy preemption, soft
and hard reservations, safety rules on and off, shared prefixes), with jumps cut short (``kmax``),
on the conversation trace under vLLM and a reservation policy in both readings with prefix caching,
and with the JIT disabled (the same source run as Python)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_engines import CLOCK, engine_case

from kvdro.sim.engine_compiled import HAVE_NUMBA, run_compiled
from kvdro.sim.engine_fast import run_fast
from kvdro.sim.engine_reference import run_reference
from kvdro.sim.invariants import check_engine
from kvdro.sim.scheduler import EngineInput, EngineSpec

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (engine='fast' falls back to Python)")

PER_REQUEST = ("admit_ps", "first_token_ps", "finish_ps", "preemptions", "recomputed_tokens", "final_cap_tokens", "generated")


def assert_same(a, b, what=""):
    assert a.totals() == b.totals(), what
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{what} {name}")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_case(), st.sampled_from([1, 2, 3, 5, 17, 1 << 16]))
def test_compiled_equals_reference_and_python_fast(case, kmax):
    spec, inp = case
    ref = run_reference(spec, inp, CLOCK)
    out = run_compiled(spec, inp, CLOCK, kmax=kmax)
    check_engine(spec, inp, out)
    assert_same(ref, out, "reference vs compiled")
    assert_same(run_fast(spec, inp, CLOCK), out, "python fast vs compiled")


def test_heavy_preemption_case():
    """A tiny pool under vLLM's reactive growth: many preemptions, still identical."""
    rng = np.random.default_rng(3)
    n = 30
    spec = EngineSpec(blocks=20, watermark_blocks=0, max_num_seqs=8, token_budget=400, free_block_rule=True)
    inp = EngineInput(arrival_ps=np.zeros(n, dtype=np.int64), prompt=rng.integers(20, 60, n), output=rng.integers(40, 90, n),
                      reserve_blocks=np.zeros(n, dtype=np.int64), prefix_key=np.full(n, -1),
                      shared_blocks=np.zeros(n, dtype=np.int64))
    ref, out = run_reference(spec, inp, CLOCK), run_compiled(spec, inp, CLOCK)
    assert ref.preemptions.sum() >= 20
    assert_same(ref, out)


def test_integrals_beyond_int64_are_exact():
    """Long idle-free runs push kv_integral past 2**63; the compiled engine's limbs keep it exact."""
    n = 400
    rng = np.random.default_rng(1)
    spec = EngineSpec(blocks=60_000, watermark_blocks=600, max_num_seqs=256, token_budget=16_384, free_block_rule=True)
    inp = EngineInput(arrival_ps=np.zeros(n, dtype=np.int64), prompt=rng.integers(1000, 4000, n),
                      output=rng.integers(8000, 12_000, n), reserve_blocks=np.zeros(n, dtype=np.int64),
                      prefix_key=np.full(n, -1), shared_blocks=np.zeros(n, dtype=np.int64))
    fast, out = run_fast(spec, inp, CLOCK), run_compiled(spec, inp, CLOCK)
    assert fast.kv_integral > 2**63
    assert_same(fast, out)


@pytest.fixture(scope="module")
def conv(data_dir):
    from kvdro.datasets import load_trace

    return load_trace("azure-2023-conv")


@pytest.mark.parametrize("policy, reading, scale, prefix", [
    ("vllm", "soft", 1.0, False),
    ("dro", "soft", 1.0, True),
    ("mean", "hard", 0.6, True),
    ("vllm", "soft", 0.6, True),
])
def test_conversation_trace_three_engines(conv, policy, reading, scale, prefix):
    """The whole conversation trace, TP2 groups (some runs overloaded, with preemptions): the
    compiled engine, the Python fast engine and (for one case) the reference engine agree."""
    from kvdro.sim import Deployment, default_deployment, simulate

    if prefix:  # the conversation class's first 160 tokens shared and cached on every group
        dep = Deployment(groups=("TP2-PP1",) * 4, prefix_tokens={"conversation": 160.0},
                         prefix_caching={"conversation": [True] * 4})
    else:
        dep = default_deployment(config="TP2-PP1")
    tr = conv.assign(arrival_s=conv["arrival_s"] / scale)
    kw = dict(policy=policy, deployment=dep, reservation=reading)
    python = simulate(tr, rng=np.random.default_rng(0), engine="fast-python", **kw)
    configs = [g for g in dep.groups for _ in range(g.pp)]
    compiled = [run_compiled(spec, inp, CLOCK.shared(dep.model, dep.gpu, cfg))
                for spec, inp, cfg in zip(python.specs, python.inputs, configs)]
    for a, b in zip(python.outputs, compiled):
        assert_same(a, b, policy)
    fast = simulate(tr, rng=np.random.default_rng(0), engine="fast", **kw)  # whichever engine run_auto picks
    assert fast.requests.equals(python.requests)
    if policy == "mean":  # the slow engine once, on an overloaded hard-capped run
        ref = simulate(tr, rng=np.random.default_rng(0), engine="reference", **kw)
        assert ref.requests.equals(python.requests)
        assert sum(o.preemptions.sum() for o in ref.outputs) > 0
        for a, b in zip(ref.outputs, compiled):
            assert_same(a, b, "reference")


def test_jit_disabled_gives_the_same_results():
    """NUMBA_DISABLE_JIT=1 runs the same source as plain Python: same numbers on a small case."""
    code = (
        "import numpy as np\n"
        "from test_sim_engines import CLOCK\n"
        "from kvdro.sim.engine_compiled import run_compiled\n"
        "from kvdro.sim.engine_reference import run_reference\n"
        "from kvdro.sim.scheduler import EngineInput, EngineSpec\n"
        "rng = np.random.default_rng(5); n = 25\n"
        "p = rng.integers(5, 60, n); o = rng.integers(1, 80, n)\n"
        "spec = EngineSpec(blocks=40, watermark_blocks=1, max_num_seqs=6, token_budget=300, free_block_rule=True,"
        " prefix_blocks=(2,), hard=True, window_blocks=12)\n"
        "inp = EngineInput(arrival_ps=np.cumsum(rng.integers(0, 3, n)) * 10**10, prompt=p, output=o,"
        " reserve_blocks=-(-(p + 8) // 16), prefix_key=np.where(p > 40, 0, -1), shared_blocks=np.where(p > 40, 2, 0))\n"
        "a, b = run_reference(spec, inp, CLOCK), run_compiled(spec, inp, CLOCK, kmax=3)\n"
        "assert a.totals() == b.totals() and np.array_equal(a.finish_ps, b.finish_ps)\n"
        "assert np.array_equal(a.recomputed_tokens, b.recomputed_tokens) and a.preemptions.sum() > 0\n"
        "import numba; print('JIT', numba.config.DISABLE_JIT)\n"
    )
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "1"


def test_conversation_trace_oracle_and_key_order(conv):
    """The oracle's look-ahead and a shortest-output-first queue (key = arrival + 0.05 s per output
    token) on the whole conversation trace, 4 x TP2-PP1 at 0.6 (a queue forms): the compiled and
    the Python fast engines agree (the reference engine's look-ahead is too slow for this size; the
    property test above compares it on small cases)."""
    from dataclasses import replace

    from kvdro.sim import default_deployment, simulate

    r = simulate(conv.assign(arrival_s=conv["arrival_s"] / 0.6), policy="vllm", deployment=default_deployment(config="TP2-PP1"),
                 rng=np.random.default_rng(0))
    clock = CLOCK.shared(r.deployment.model, r.deployment.gpu, r.deployment.groups[0])
    for spec, inp in zip(r.specs[:2], r.inputs[:2]):
        sof = replace(inp, queue_key=inp.arrival_ps + 5 * 10**10 * inp.output)
        for s, i in ((replace(spec, lookahead=True), inp), (spec, sof), (replace(spec, lookahead=True), sof)):
            a, b = run_fast(s, i, clock), run_compiled(s, i, clock)
            assert_same(a, b, f"lookahead={s.lookahead}, sof={i.queue_key is not None}")
            assert a.preemptions.sum() == 0 or not s.lookahead
    assert sum(int(o.preemptions.sum()) for o in r.outputs) > 0  # vLLM itself preempts here


def test_fast_engine_switches_to_compiled_after_enough_requests():
    """engine='fast' (run_auto): a fresh process serves its first SWITCH_REQUESTS requests with the
    Python engine (numba not even imported), then the compiled one; the same numbers either way."""
    code = (
        "import sys, numpy as np\n"
        "from test_sim_engines import CLOCK\n"
        "from kvdro.sim import engine_compiled as ec\n"
        "from kvdro.sim.engine_reference import run_reference\n"
        "from kvdro.sim.scheduler import EngineInput, EngineSpec\n"
        "ec.SWITCH_REQUESTS = 50\n"
        "rng = np.random.default_rng(2); n = 30\n"
        "spec = EngineSpec(blocks=30, watermark_blocks=1, max_num_seqs=6, token_budget=300, free_block_rule=True)\n"
        "inp = EngineInput(arrival_ps=np.zeros(n, dtype=np.int64), prompt=rng.integers(5, 60, n), output=rng.integers(1, 80, n),"
        " reserve_blocks=np.zeros(n, dtype=np.int64), prefix_key=np.full(n, -1), shared_blocks=np.zeros(n, dtype=np.int64))\n"
        "ref = run_reference(spec, inp, CLOCK)\n"
        "seen = []\n"
        "for _ in range(3):\n"
        "    out = ec.run_auto(spec, inp, CLOCK)\n"
        "    assert out.totals() == ref.totals() and np.array_equal(out.finish_ps, ref.finish_ps)\n"
        "    seen.append(('numba' in sys.modules, ec._served_by_python))\n"
        "print(seen)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(False, 30), (True, 30), (True, 30)]"
