"""The compiled ``sglang`` preset equals its reference engine, integer for integer, error for error.

Random traces and knobs (seeded), tight pools that make SGLang retract, prompts longer than the
chunk, client caps and "soft" max_new below the true length, page sizes above one slot, PP > 1
clocks; the conversation trace through ``simulate``; the kernel as plain Python under
``NUMBA_DISABLE_JIT=1``.
"""

import json
import os
import sys

import numpy as np
import pytest

from kvdro.sim.engine_presets import run_preset
from kvdro.sim.engines.sglang import Config
from kvdro.sim.invariants import InvariantError
from kvdro.sim.presets_compiled import sglang as compiled
from kvdro.sim.presets_compiled.checks import clock, engine_input, run_without_jit, simulate_both, spec
from kvdro.sim.presets_compiled.checks import outcome as run_outcome
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError

_clock, _inp, _spec = clock, engine_input, spec


def random_case(rng: np.random.Generator) -> dict:
    """One engine: 1..200 requests, random SGLang knobs, a pool from half to five times the largest
    request, max_new unset / a client cap / soft (below the true length) / per-request."""
    n = int(rng.integers(1, 201))
    page = int(rng.choice([1, 1, 1, 2, 4, 16]))
    prompt = rng.integers(1, int(rng.choice([40, 400, 1500])), n)
    true = rng.integers(1, int(rng.choice([10, 60, 250])), n)
    longest = int(prompt.max())  # chunks and prefill budgets from a quarter of it: at most a few chunks a prompt
    window = int(prompt.max() + true.max() + rng.integers(0, 300))
    arm = ("unset", "cap", "soft", "each")[int(rng.integers(4))]
    if arm == "unset":
        max_new, limit = window - prompt, true
    elif arm == "cap":
        cap = int(rng.integers(1, 120))
        max_new, limit = np.full(n, cap), np.minimum(true, cap)
    elif arm == "soft":  # the engine reserves against an estimate and lets the request run to its end
        max_new, limit = np.maximum(1, (true * rng.uniform(0.1, 1.2, n)).astype(np.int64)), true
    else:
        max_new = rng.integers(1, 400, n)
        limit = np.minimum(true, max_new)
    cfg = Config(schedule_conservativeness=float(rng.uniform(0.2, 2.0)),
                 init_new_token_ratio=float(rng.uniform(0.05, 1.0)),
                 min_new_token_ratio_factor=float(rng.uniform(0.0, 1.0)),
                 new_token_ratio_decay_steps=int(rng.integers(1, 700)),
                 clip_max_new_tokens=int(rng.choice([8, 64, 4096])), retract_decode_steps=int(rng.integers(0, 40)),
                 chunked_prefill_size=page * max(1, int(longest * rng.uniform(0.25, 2.0)) // page),
                 max_prefill_tokens=page * max(1, int(longest * rng.uniform(0.25, 4.0)) // page),
                 max_running_requests=int(rng.choice([2, 8, 64, 256])), page_size=page)
    blocks = max(1, int(int((prompt + limit).max()) * rng.uniform(0.5, 5.0)) // 16)
    spread = int(rng.choice([0, 10**9, 10**11, 10**12]))
    arrival = np.sort(rng.integers(0, spread + 1, n))
    model, tp, pp = [("llama-2-70b", 2, 1), ("llama-2-70b", 4, 2), ("llama-3-8b", 1, 1), ("llama-3-8b", 2, 4)][
        int(rng.integers(4))]
    return {"cfg": cfg, "spec": _spec(blocks), "inp": _inp(arrival, prompt, limit), "max_new": np.asarray(max_new),
            "clock": _clock(model, tp, pp), "window": window, "arm": arm, "true": true}


def outcome(fn, case: dict):
    """:func:`kvdro.sim.presets_compiled.checks.outcome` of ``fn`` on ``case``."""
    return run_outcome(fn, "sglang", case)


@pytest.mark.parametrize("block", range(4))
def test_compiled_equals_reference_on_random_traces(block):
    seen = {"retracted": 0, "chunked": 0, "capped": 0, "past_soft_max_new": 0, "errors": 0, "ok": 0}
    for seed in range(25 * block, 25 * block + 25):
        case = random_case(np.random.default_rng(seed))
        ref = outcome(run_preset, case)
        got = outcome(compiled.run, case)
        assert got == ref, f"seed {seed}"
        if ref[0] == "error":
            seen["errors"] += 1
            continue
        seen["ok"] += 1
        per = ref[1]
        gen, prompt = np.array(per["generated"]), case["inp"].prompt
        seen["retracted"] += sum(per["preemptions"]) > 0
        seen["chunked"] += bool(np.any(prompt > case["cfg"].chunked_prefill_size))  # served, so prefilled in chunks
        seen["capped"] += bool(np.any(gen < case["true"]))
        seen["past_soft_max_new"] += case["arm"] == "soft" and bool(np.any(gen > case["max_new"]))
    # every block exercises the paths: retraction, chunked prefill, caps, soft max_new, mostly successful runs
    assert seen["ok"] >= 15 and min(v for k, v in seen.items() if k != "errors") >= 1, seen


def test_python_sum_is_the_interpreters_sum():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(0, 300))
        x = rng.integers(0, 5000, n) * float(rng.uniform(0.01, 1.0))
        want = sum(float(v) for v in x)
        assert compiled.python_sum(np.concatenate([[7.0], x]), 1, n, sys.version_info >= (3, 12)) == want


def _pair(case: dict):
    return outcome(run_preset, case), outcome(compiled.run, case)


def _case(arrival, prompt, limit, max_new, *, blocks=1000, **knobs) -> dict:
    return {"cfg": Config(**knobs), "spec": _spec(blocks), "inp": _inp(arrival, prompt, limit),
            "max_new": np.asarray(max_new), "clock": _clock("llama-2-70b", 2, 1), "window": 4096}


@pytest.mark.parametrize("name, case", [
    # the clock passes MAX_CLOCK_PS during the first step
    ("ClockLimitError", _case([MAX_CLOCK_PS - 1], [10], [3], [3])),
    # a request admitted alone that outgrows the pool: its next decode slot is missing
    ("AssertionError", _case([0], [100], [500], [8], blocks=20, clip_max_new_tokens=8)),
    # a prompt that can never fit: nothing admissible
    ("InvariantError", _case([0], [5000], [3], [3], blocks=100)),
])
def test_the_same_errors(name, case):
    ref, got = _pair(case)
    assert ref[:2] == ("error", name) and got == ref


def test_bad_input_is_refused_first():
    with pytest.raises(ValueError, match="prompt"):
        compiled.run("sglang", Config(), _spec(100), _inp([0], [0], [3]), np.array([3]), _clock("llama-2-70b", 2, 1),
                     window=4096)
    with pytest.raises(ValueError, match="max_new"):
        compiled.run("sglang", Config(), _spec(100), _inp([0], [5], [3]), np.array([3, 4]),
                     _clock("llama-2-70b", 2, 1), window=4096)
    with pytest.raises(ValueError, match="engine"):
        compiled.run("lightllm", Config(), _spec(100), _inp([0], [5], [3]), np.array([3]),
                     _clock("llama-2-70b", 2, 1), window=4096)


def test_an_empty_trace():
    ref, got = _pair(_case([], [], [], []))
    assert got == ref and ref[0] == "ok"


def test_simulate_on_the_conversation_trace(data_dir):
    """600 requests of the conversation trace, compressed 6x in time (retractions), unset, a client cap,
    the true lengths and the mean's estimate reserved against (soft): the same per-request frame,
    metrics and engine totals as the reference."""
    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate

    head = load_trace("azure-2023-conv").head(600)
    trace = head.assign(arrival_s=head["arrival_s"] / 6)
    dep = default_deployment(config="TP2-PP1", groups=1)
    retracted = 0
    for policy, max_new in (("vllm", "unset"), ("vllm", 200), ("vllm", "true"), ("mean", "policy-soft")):
        ref = simulate_both(trace, "sglang", policy=policy, deployment=dep, max_new=max_new)
        retracted += ref.metrics["preemptions"]
    assert retracted > 0
    default = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="sglang")
    assert default.implementation == "fast"  # the default once the preset has a compiled implementation


_JIT_OFF = """
import json, numpy as np
from kvdro.sim.presets_compiled import sglang
from tests.test_presets_compiled_sglang import random_case, outcome
print(json.dumps([outcome(sglang.run, random_case(np.random.default_rng(s))) for s in {seeds}]))
"""


def test_plain_python_under_numba_disable_jit():
    seeds = [s for s in range(200) if len(random_case(np.random.default_rng(s))["inp"]) <= 25][:3]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = run_without_jit(_JIT_OFF.format(seeds=seeds), cwd=root)
    want = [outcome(run_preset, random_case(np.random.default_rng(s))) for s in seeds]
    assert got == json.loads(json.dumps(want))
