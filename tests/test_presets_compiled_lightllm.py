"""The compiled ``lightllm`` preset equals its reference engine, integer for integer, error for error.

Random traces and knobs (seeded): batch and prefill limits, the busy threshold and the estimate
used when not busy, ``ADDED_OUTPUT_LEN``; pools from half to five times the largest request (so
the future-peak admission holds requests back and, with a "soft" max_new below the true length,
decodes run out of slots and pause the newest); max_new unset, a client cap, per request or soft;
PP > 1 clocks; the conversation trace through ``simulate``; the kernel as plain Python under
``NUMBA_DISABLE_JIT=1``.
"""

import json
import os

import numpy as np
import pytest

from kvdro.sim.engine_presets import run_preset
from kvdro.sim.engines.lightllm import Config
from kvdro.sim.invariants import InvariantError
from kvdro.sim.presets_compiled import lightllm as compiled
from kvdro.sim.presets_compiled.checks import clock, engine_input, run_without_jit, simulate_both, spec
from kvdro.sim.presets_compiled.checks import outcome as run_outcome
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError

_clock, _inp, _spec = clock, engine_input, spec


def random_case(rng: np.random.Generator) -> dict:
    """One engine: 1..200 requests, random LightLLM knobs, a pool from half to five times the largest
    request's prompt + max(max_new, limit), max_new unset / a client cap / soft (below the true length)
    / per request."""
    n = int(rng.integers(1, 201))
    prompt = rng.integers(1, int(rng.choice([40, 400, 1500])), n)
    true = rng.integers(1, int(rng.choice([10, 60, 250])), n)
    window = int(prompt.max() + true.max() + rng.integers(1, 300))
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
    cfg = Config(running_max_req_size=int(rng.choice([1, 4, 32, 1000])),
                 batch_max_tokens=None if rng.random() < 0.5 else int(prompt.max() * rng.uniform(1.0, 4.0)),
                 router_token_ratio=float(rng.choice([0.0, rng.uniform(0.0, 1.0)])),
                 router_max_new_token_len=int(rng.choice([1, 30, 1024])), added_output_len=int(rng.integers(0, 10)))
    largest = int((prompt + np.maximum(max_new, limit)).max())
    blocks = max(1, int(largest * rng.uniform(0.5, 5.0)) // 16)
    spread = int(rng.choice([0, 10**9, 10**11, 10**12]))
    arrival = np.sort(rng.integers(0, spread + 1, n))
    model, tp, pp = [("llama-2-70b", 2, 1), ("llama-2-70b", 4, 2), ("llama-3-8b", 1, 1), ("llama-3-8b", 2, 4)][
        int(rng.integers(4))]
    return {"cfg": cfg, "spec": _spec(blocks), "inp": _inp(arrival, prompt, limit), "max_new": np.asarray(max_new),
            "clock": _clock(model, tp, pp), "window": window, "arm": arm, "true": true}


def outcome(fn, case: dict):
    """:func:`kvdro.sim.presets_compiled.checks.outcome` of ``fn`` on ``case``."""
    return run_outcome(fn, "lightllm", case)


@pytest.mark.parametrize("block", range(3))
def test_compiled_equals_reference_on_random_traces(block):
    seen = {"ok": 0, "errors": 0, "capped": 0, "past_soft_max_new": 0, "waited": 0, "paused": 0, "not_busy": 0}
    for seed in range(30 * block, 30 * block + 30):
        case = random_case(np.random.default_rng(seed))
        ref = outcome(run_preset, case)
        got = outcome(compiled.run, case)
        assert got == ref, f"seed {seed}"
        if ref[0] == "error":
            seen["errors"] += 1
            continue
        seen["ok"] += 1
        per, inp = ref[1], case["inp"]
        gen = np.array(per["generated"])
        seen["capped"] += bool(np.any(gen < case["true"]))
        seen["past_soft_max_new"] += case["arm"] == "soft" and bool(np.any(gen > case["max_new"]))
        seen["waited"] += bool(np.any(np.array(per["admit_ps"]) > inp.arrival_ps))
        seen["paused"] += sum(per["preemptions"]) > 0
        seen["not_busy"] += case["cfg"].router_token_ratio > 0
    # every block exercises the paths: caps, soft max_new, admission holding requests back, pauses, the
    # estimate used when the pool is not busy, and mostly successful runs
    assert seen["ok"] >= 15 and min(seen.values()) >= 1, seen


def _case(arrival, prompt, limit, max_new, *, blocks=1000, **knobs) -> dict:
    return {"cfg": Config(**knobs), "spec": _spec(blocks), "inp": _inp(arrival, prompt, limit),
            "max_new": np.asarray(max_new), "clock": _clock("llama-2-70b", 2, 1), "window": 4096}


@pytest.mark.parametrize("name, case", [
    # the clock passes MAX_CLOCK_PS during the first step
    ("ClockLimitError", _case([MAX_CLOCK_PS - 1], [10], [3], [3])),
    # a request whose future peak (prompt + max_new + 6 tokens) is above the pool: nothing admissible
    ("InvariantError", _case([0], [100], [3], [3000], blocks=100)),
    # prompts above batch_max_tokens never join a batch
    ("InvariantError", _case([0, 0], [10, 500], [3, 3], [3, 3], batch_max_tokens=256)),
])
def test_the_same_errors(name, case):
    ref, got = outcome(run_preset, case), outcome(compiled.run, case)
    assert ref[:2] == ("error", name) and got == ref


def test_bad_input_is_refused_first():
    case = _case([0], [5], [3], [3])
    with pytest.raises(ValueError, match="prompt"):
        compiled.run("lightllm", case["cfg"], case["spec"], _inp([0], [0], [3]), np.array([3]), case["clock"],
                     window=4096)
    with pytest.raises(ValueError, match="max_new"):
        compiled.run("lightllm", case["cfg"], case["spec"], case["inp"], np.array([3, 4]), case["clock"], window=4096)
    with pytest.raises(ValueError, match="engine"):
        compiled.run("trtllm-gne", case["cfg"], case["spec"], case["inp"], np.array([3]), case["clock"], window=4096)


def test_an_empty_trace():
    case = _case([], [], [], [])
    ref, got = outcome(run_preset, case), outcome(compiled.run, case)
    assert got == ref and ref[0] == "ok"


def test_simulate_on_the_conversation_trace(data_dir):
    """300 requests of the conversation trace, compressed 6x in time: the same per-request frame, metrics
    and engine totals as the reference, with max_new unset / a cap / the true lengths / the mean policy's
    estimate as a soft reservation (requests outgrow it: decodes run out of slots and pause the newest)."""
    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate

    head = load_trace("azure-2023-conv").head(300)
    trace = head.assign(arrival_s=head["arrival_s"] / 6)
    dep = default_deployment(config="TP2-PP1", groups=1)
    paused = 0
    for policy, max_new in (("vllm", "unset"), ("vllm", 200), ("vllm", "true"), ("mean", "policy-soft")):
        ref = simulate_both(trace, "lightllm", policy=policy, deployment=dep, max_new=max_new)
        paused += ref.metrics["preemptions"]
    assert paused > 0
    default = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="lightllm",
                       max_new=200)
    assert default.implementation == "fast"  # the default once the preset has a compiled implementation


_JIT_OFF = """
import json, numpy as np
from kvdro.sim.presets_compiled import lightllm
from tests.test_presets_compiled_lightllm import random_case, outcome
print(json.dumps([outcome(lightllm.run, random_case(np.random.default_rng(s))) for s in {seeds}]))
"""


def test_plain_python_under_numba_disable_jit():
    seeds = [s for s in range(200) if len(random_case(np.random.default_rng(s))["inp"]) <= 25][:3]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = run_without_jit(_JIT_OFF.format(seeds=seeds), cwd=root)
    want = [outcome(run_preset, random_case(np.random.default_rng(s))) for s in seeds]
    assert got == json.loads(json.dumps(want))
