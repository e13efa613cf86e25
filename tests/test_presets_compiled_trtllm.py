"""The compiled ``trtllm-gne`` / ``trtllm-maxutil`` presets equal their reference engine, integer for integer,
error for error.

Random traces and knobs (seeded): block sizes from 1 to 32 tokens, token budgets from one block,
batch-size limits, chunked prefill on and off, pools from half to five times the largest request
(MAX_UTILIZATION pauses; GUARANTEED_NO_EVICT waits head-of-line, or is stuck on a request whose
reservation exceeds the pool), max_new unset, a client cap or per request, PP > 1 clocks; the
conversation trace through ``simulate``; the kernel as plain Python under ``NUMBA_DISABLE_JIT=1``.
"""

import json
import os

import numpy as np
import pytest

from kvdro.sim.engine_presets import run_preset
from kvdro.sim.engines import make_config
from kvdro.sim.invariants import InvariantError
from kvdro.sim.presets_compiled import trtllm as compiled
from kvdro.sim.presets_compiled.checks import clock, engine_input, run_without_jit, simulate_both, spec
from kvdro.sim.presets_compiled.checks import outcome as run_outcome
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError

ENGINES = ("trtllm-gne", "trtllm-maxutil")
_clock, _inp, _spec = clock, engine_input, spec


def random_case(engine: str, rng: np.random.Generator) -> dict:
    """One engine: 1..200 requests, random TensorRT-LLM knobs, a pool from half to five times the largest
    request (its prompt + max_new for GUARANTEED_NO_EVICT, which reserves that; prompt + limit otherwise),
    max_new unset / a client cap / per request (the limit is the true length cut at max_new, as simulate
    gives it)."""
    n = int(rng.integers(1, 201))
    block = int(rng.choice([1, 4, 16, 32]))
    prompt = rng.integers(1, int(rng.choice([40, 400, 1500])), n)
    true = rng.integers(1, int(rng.choice([10, 60, 250])), n)
    window = int(prompt.max() + true.max() + rng.integers(1, 300))
    arm = ("unset", "cap", "each")[int(rng.integers(3))]
    max_new = {"unset": window - prompt, "cap": np.full(n, int(rng.integers(1, 120))),
               "each": rng.integers(1, 400, n)}[arm]
    limit = np.minimum(true, max_new)
    chunked = bool(rng.random() < 0.3)
    budget = int(prompt.max() * rng.uniform(0.3, 3.0)) if chunked else int(prompt.max() + rng.integers(0, 2000))
    cfg = make_config(engine, {"tokens_per_block": block, "max_num_tokens": max(block, budget),
                               "max_batch_size": int(rng.choice([1, 3, 16, 2048])), "enable_chunked_prefill": chunked})
    largest = int((prompt + (max_new if engine == "trtllm-gne" else limit)).max())
    blocks = max(1, int(largest * rng.uniform(0.5, 5.0)) // 16)
    spread = int(rng.choice([0, 10**9, 10**11, 10**12]))
    arrival = np.sort(rng.integers(0, spread + 1, n))
    model, tp, pp = [("llama-2-70b", 2, 1), ("llama-2-70b", 4, 2), ("llama-3-8b", 1, 1), ("llama-3-8b", 2, 4)][
        int(rng.integers(4))]
    return {"engine": engine, "cfg": cfg, "spec": _spec(blocks), "inp": _inp(arrival, prompt, limit),
            "max_new": np.asarray(max_new), "clock": _clock(model, tp, pp), "window": window, "true": true}


def outcome(fn, case: dict):
    """:func:`kvdro.sim.presets_compiled.checks.outcome` of ``fn`` on ``case``."""
    return run_outcome(fn, case["engine"], case)


@pytest.mark.parametrize("block", range(2))
@pytest.mark.parametrize("engine", ENGINES)
def test_compiled_equals_reference_on_random_traces(engine, block):
    seen = {"ok": 0, "errors": 0, "capped": 0, "chunked": 0, "waited": 0, "paused": 0, "preemptions": 0}
    for seed in range(30 * block, 30 * block + 30):
        case = random_case(engine, np.random.default_rng(seed))
        ref = outcome(run_preset, case)
        got = outcome(compiled.run, case)
        assert got == ref, f"seed {seed}"
        if ref[0] == "error":
            assert ref[1] != "AssertionError", f"seed {seed}: {ref[2]}"  # the reference's own consistency checks hold
            seen["errors"] += 1
            continue
        seen["ok"] += 1
        per, inp = ref[1], case["inp"]
        seen["capped"] += bool(np.any(np.array(per["generated"]) < case["true"]))
        seen["chunked"] += case["cfg"].enable_chunked_prefill and bool(np.any(inp.prompt > case["cfg"].max_num_tokens))
        seen["waited"] += bool(np.any(np.array(per["admit_ps"]) > inp.arrival_ps))
        seen["paused"] += sum(per["preemptions"]) > 0
        seen["preemptions"] += sum(per["preemptions"])
    assert seen["ok"] >= 12 and seen["errors"] >= 1 and seen["capped"] >= 1 and seen["chunked"] >= 1, seen
    assert seen["waited"] >= 6, seen  # admission control held requests back (the pool, the budget, the batch)
    if engine == "trtllm-gne":
        assert seen["preemptions"] == 0, seen  # never evicts
    else:
        assert seen["paused"] >= 3, seen  # MAX_UTILIZATION paused requests (and recomputed them)


def _case(engine, arrival, prompt, limit, max_new, *, blocks=1000, **knobs) -> dict:
    return {"engine": engine, "cfg": make_config(engine, {"tokens_per_block": 16, **knobs}), "spec": _spec(blocks),
            "inp": _inp(arrival, prompt, limit), "max_new": np.asarray(max_new), "clock": _clock("llama-2-70b", 2, 1),
            "window": 4096}


@pytest.mark.parametrize("name, case", [
    # the clock passes MAX_CLOCK_PS during the first step
    ("ClockLimitError", _case("trtllm-gne", [MAX_CLOCK_PS - 1], [10], [3], [3])),
    # a reservation to completion (ceil(4000/16) = 250 blocks) beyond the pool: nothing admissible
    ("InvariantError", _case("trtllm-gne", [0], [100], [3], [3900], blocks=100)),
    # a prompt above max_num_tokens without chunked prefill never fits a step
    ("InvariantError", _case("trtllm-maxutil", [0, 0], [10, 500], [3, 3], [3, 3], max_num_tokens=256)),
])
def test_the_same_errors(name, case):
    ref, got = outcome(run_preset, case), outcome(compiled.run, case)
    assert ref[:2] == ("error", name) and got == ref


def test_a_chunked_prefill_under_max_utilization_reserves_its_whole_context():
    # the case that once failed the reference's allocation (one block counted for a request in the middle
    # of its chunked prefill, then a whole chunk given): now both run it, identically, and the pool holds
    case = _case("trtllm-maxutil", [0, 0, 0], [5, 20, 62], [13, 11, 1], [13, 11, 1], blocks=5, max_num_tokens=48,
                 enable_chunked_prefill=True)
    ref, got = outcome(run_preset, case), outcome(compiled.run, case)
    assert ref[0] != "error" and got == ref


def test_bad_input_is_refused_first():
    case = _case("trtllm-gne", [0], [5], [3], [3])
    with pytest.raises(ValueError, match="prompt"):
        compiled.run("trtllm-gne", case["cfg"], case["spec"], _inp([0], [0], [3]), np.array([3]), case["clock"],
                     window=4096)
    with pytest.raises(ValueError, match="max_new"):
        compiled.run("trtllm-gne", case["cfg"], case["spec"], case["inp"], np.array([3, 4]), case["clock"], window=4096)
    with pytest.raises(ValueError, match="engine"):
        compiled.run("lightllm", case["cfg"], case["spec"], case["inp"], np.array([3]), case["clock"], window=4096)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_empty_trace(engine):
    case = _case(engine, [], [], [], [])
    ref, got = outcome(run_preset, case), outcome(compiled.run, case)
    assert got == ref and ref[0] == "ok"


def test_simulate_on_the_conversation_trace(data_dir):
    """300 requests of the conversation trace, compressed 6x in time (pauses): the same per-request frame,
    metrics and engine totals as the reference, for both policies, max_new unset / a cap / the true lengths."""
    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate

    head = load_trace("azure-2023-conv").head(300)
    trace = head.assign(arrival_s=head["arrival_s"] / 6)
    dep = default_deployment(config="TP2-PP1", groups=1)
    paused = 0
    for engine in ENGINES:
        for max_new in ("unset", 200, "true"):
            ref = simulate_both(trace, engine, policy="vllm", deployment=dep, max_new=max_new)
            paused += ref.metrics["preemptions"]
        default = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine=engine,
                           max_new=200)
        assert default.implementation == "fast"  # the default once the preset has a compiled implementation
    assert paused > 0


_JIT_OFF = """
import json, numpy as np
from kvdro.sim.presets_compiled import trtllm
from tests.test_presets_compiled_trtllm import random_case, outcome
print(json.dumps([outcome(trtllm.run, random_case(e, np.random.default_rng(s))) for e, s in {cases}]))
"""


def _tiny(engine):
    return [s for s in range(200) if len(random_case(engine, np.random.default_rng(s))["inp"]) <= 20][:2]


def test_plain_python_under_numba_disable_jit():
    cases = [(e, s) for e in ENGINES for s in _tiny(e)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = run_without_jit(_JIT_OFF.format(cases=cases), cwd=root)
    want = [outcome(run_preset, random_case(e, np.random.default_rng(s))) for e, s in cases]
    assert got == json.loads(json.dumps(want))
