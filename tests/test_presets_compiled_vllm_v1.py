"""The compiled vllm-v1 preset equals its reference engine on every output, integer for integer.

Random traces (1-200 requests) and knobs (token budget, max_num_seqs, long-prefill threshold, block
size, prefix caching on and off), pools from tight (preemption, prefix-cache hits, partial hits after
eviction) to roomy, capped requests, PP > 1 clocks; the same errors (stuck, clock limit); a slice of
the real conversation trace through ``simulate``; and the kernel's source run as plain Python.
"""

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from kvdro.hardware import A100_80GB, H100_80GB, LLAMA2_70B, ParallelConfig
from kvdro.sim.engine_presets import run_preset
from kvdro.sim.engines.free_queue import FreeBlockQueue
from kvdro.sim.engines.vllm_v1 import Config
from kvdro.sim.invariants import InvariantError
from kvdro.sim.presets_compiled import vllm_v1 as compiled
from kvdro.sim.scheduler import EngineInput, EngineSpec
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock

FIELDS = ("admit_ps", "first_token_ps", "finish_ps", "preemptions", "recomputed_tokens", "final_cap_tokens",
          "generated")
PARALLEL = [(1, 1), (2, 1), (2, 2), (4, 2), (1, 4)]


def _inputs(arrival, prompt, output):
    n = len(prompt)
    z = np.zeros(n, np.int64)
    return EngineInput(np.asarray(arrival, np.int64), np.asarray(prompt, np.int64), np.asarray(output, np.int64), z,
                       np.full(n, -1, np.int64), z)


def _case(rng):
    """(cfg, spec, inp, max_new, clock) of one random run: every request fits the pool alone (a longer
    one is re-admitted forever, until the clock limit), the pool from just that to 4x roomier."""
    n = int(rng.integers(1, 201))
    span = int(rng.choice([0, 10**11, 10**12, 10**13])) * max(1, n // 20)  # a burst, or spread arrivals
    arrival = np.sort(rng.integers(0, span + 1, n))
    prompt = np.minimum(rng.lognormal(4.8, 1.1, n).astype(np.int64) + 1, 2000)
    true = np.minimum(rng.lognormal(4.0, 1.1, n).astype(np.int64) + 1, 1000)
    max_new = np.where(rng.random(n) < 0.3, rng.integers(1, 300, n), rng.integers(2000, 5000, n))  # some below
    limit = np.minimum(true, max_new)
    block = int(rng.choice([1, 8, 16, 16, 32]))
    small = max(block, 16)  # the smallest budget (a 1-token budget makes the reference crawl)
    cfg = Config(max_num_batched_tokens=int(rng.choice([small, int(rng.integers(small, 600)), 2048, 8192])),
                 max_num_seqs=int(rng.choice([1, int(rng.integers(2, 40)), 256])),
                 long_prefill_token_threshold=int(rng.choice([0, 0, int(rng.integers(1, 700))])), block_size=block,
                 enable_prefix_caching=bool(rng.random() < 0.75))
    need = -(-int(np.max(prompt + limit)) // 16) + 2  # 16-token blocks: + 2 for a block size of 32
    spec = EngineSpec(blocks=need + int(rng.integers(0, 3 * need + 1)), watermark_blocks=0,
                      max_num_seqs=cfg.max_num_seqs, token_budget=cfg.max_num_batched_tokens, free_block_rule=False)
    tp, pp = PARALLEL[int(rng.integers(len(PARALLEL)))]
    clock = StepClock(LLAMA2_70B, A100_80GB if rng.random() < 0.5 else H100_80GB, ParallelConfig(tp, pp))
    return cfg, spec, _inputs(arrival, prompt, limit), max_new, clock


@pytest.fixture
def hits(monkeypatch):
    """Counts of the reference's prefix-cache paths: hits, hits after a partial eviction."""
    seen = Counter()
    free_preempted, hit = FreeBlockQueue.free_preempted, FreeBlockQueue.hit

    def counting_free_preempted(self, j, blocks, full_blocks):
        free_preempted(self, j, blocks, full_blocks)
        self.extra_full = {**getattr(self, "extra_full", {}), j: full_blocks}

    def counting_hit(self, j, limit):
        h = hit(self, j, limit)
        seen["hits"] += h > 0
        seen["partial hits"] += 0 < h < getattr(self, "extra_full", {}).get(j, 0)
        return h

    monkeypatch.setattr(FreeBlockQueue, "free_preempted", counting_free_preempted)
    monkeypatch.setattr(FreeBlockQueue, "hit", counting_hit)
    return seen


def _same(ref, got):
    assert got.trace is None
    assert got.totals() == ref.totals()
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f)


@pytest.mark.parametrize("seed", range(4))
def test_compiled_equals_reference_on_random_runs(seed, hits):
    rng = np.random.default_rng([32, 6, seed])
    paths = Counter()
    for _ in range(12):
        cfg, spec, inp, max_new, clock = _case(rng)
        ref = run_preset("vllm-v1", cfg, spec, inp, max_new, clock, window=4096)
        _same(ref, compiled.run("vllm-v1", cfg, spec, inp, max_new, clock, window=4096))
        paths["preempted"] += int(ref.preemptions.sum() > 0)
        paths["capped"] += int(np.any(inp.output < np.asarray(max_new)) and np.any(inp.output == max_new))
        paths["pp > 1"] += clock.config.pp > 1
    # the paths the cases exercise (seeded: fixed counts; the bounds leave room for a changed generator)
    assert paths["preempted"] >= 3 and paths["capped"] >= 3 and paths["pp > 1"] >= 2, paths
    assert hits["hits"] >= 3 and hits["partial hits"] >= 1, hits


def test_prefix_caching_on_and_off_on_the_same_tight_run():
    rng = np.random.default_rng(7)
    n = 120
    inp = _inputs(np.sort(rng.integers(0, 10**12, n)), rng.integers(50, 600, n), rng.integers(50, 600, n))
    spec = EngineSpec(blocks=120, watermark_blocks=0, max_num_seqs=64, token_budget=512, free_block_rule=False)
    clock = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(2, 1))
    recomputed = {}
    for caching in (True, False):
        cfg = Config(max_num_batched_tokens=512, max_num_seqs=64, enable_prefix_caching=caching)
        ref = run_preset("vllm-v1", cfg, spec, inp, inp.output, clock, window=4096)
        _same(ref, compiled.run("vllm-v1", cfg, spec, inp, inp.output, clock, window=4096))
        assert ref.preemptions.sum() > 10
        recomputed[caching] = int(ref.recomputed_tokens.sum())
    assert recomputed[True] < recomputed[False]  # the hits spare recomputation


def test_same_errors_as_the_reference():
    clock = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(2, 1))
    cfg = Config()
    spec = EngineSpec(blocks=4, watermark_blocks=0, max_num_seqs=8, token_budget=2048, free_block_rule=False)
    stuck = _inputs([0, 0], [100, 10], [5, 5])  # 100 tokens in one chunk need 7 blocks of a pool of 4
    for run in (run_preset, compiled.run):
        with pytest.raises(InvariantError, match="vllm-v1: waiting requests but nothing running"):
            run("vllm-v1", cfg, spec, stuck, stuck.output, clock, window=4096)
    late = _inputs([MAX_CLOCK_PS - 10**6], [20], [3])  # the first step ends past the clock's limit
    messages = []
    for run in (run_preset, compiled.run):
        with pytest.raises(ClockLimitError) as err:
            run("vllm-v1", cfg, spec, late, late.output, clock, window=4096)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    huge = _inputs([0], [3_000_000_000], [2])  # (computed + new)**2 leaves int64: the reference engine serves it
    wide = Config(max_num_batched_tokens=4_000_000_000, enable_prefix_caching=False)
    pool = EngineSpec(blocks=200_000_000, watermark_blocks=0, max_num_seqs=8, token_budget=10, free_block_rule=False)
    for run in (run_preset, compiled.run):
        with pytest.raises(ClockLimitError):  # a 3e9-token prefill lasts longer than the clock's range
            run("vllm-v1", wide, pool, huge, huge.output, clock, window=4096)
    bad = _inputs([0], [0], [3])
    for run in (run_preset, compiled.run):
        with pytest.raises(ValueError, match="prompt"):
            run("vllm-v1", cfg, spec, bad, bad.output, clock, window=4096)


def test_empty_trace():
    clock = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(2, 1))
    spec = EngineSpec(blocks=10, watermark_blocks=0, max_num_seqs=8, token_budget=2048, free_block_rule=False)
    inp = _inputs([], [], [])
    _same(run_preset("vllm-v1", Config(), spec, inp, inp.output, clock, window=4096),
          compiled.run("vllm-v1", Config(), spec, inp, inp.output, clock, window=4096))


def test_simulate_on_the_conversation_trace():
    from kvdro.datasets import load_trace
    from kvdro.sim import default_deployment, simulate
    from kvdro.sim.regimes import at_load

    trace = at_load(load_trace("azure-2023-conv"), 0.7).iloc[:300].reset_index(drop=True)
    dep = default_deployment(config="TP2-PP1", groups=1)
    runs = {impl: simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="vllm-v1",
                           implementation=impl) for impl in ("fast", "reference")}
    fast, ref = runs["fast"], runs["reference"]
    assert fast.implementation == "fast" and ref.implementation == "reference"
    pd.testing.assert_frame_equal(fast.requests, ref.requests)
    pd.testing.assert_frame_equal(fast.engines, ref.engines)
    timeless = [{k: v for k, v in r.metrics.items() if k != "wall_s"} for r in (fast, ref)]
    assert timeless[0] == timeless[1]
    assert ref.metrics["preemptions"] > 0  # the slice on one engine preempts (93 times)


_PLAIN = """
import json, numpy as np
from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig
from kvdro.sim.engines.vllm_v1 import Config
from kvdro.sim.presets_compiled import vllm_v1 as compiled
from kvdro.sim.scheduler import EngineInput, EngineSpec
from kvdro.sim.timing import StepClock
import numba
assert numba.config.DISABLE_JIT
a = json.loads(input())
z = np.zeros(len(a["prompt"]), np.int64)
inp = EngineInput(np.array(a["arrival"]), np.array(a["prompt"]), np.array(a["output"]), z, z - 1, z)
spec = EngineSpec(blocks=a["blocks"], watermark_blocks=0, max_num_seqs=8, token_budget=64, free_block_rule=False)
out = compiled.run("vllm-v1", Config(max_num_batched_tokens=64, max_num_seqs=8), spec, inp, inp.output,
                   StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(2, 2)), window=4096)
print(json.dumps({**out.totals(), **{f: getattr(out, f).tolist() for f in a["fields"]}}))
"""


def test_the_source_runs_as_plain_python():
    rng = np.random.default_rng(11)
    n = 12
    case = {"arrival": np.sort(rng.integers(0, 10**11, n)).tolist(), "prompt": rng.integers(10, 90, n).tolist(),
            "output": rng.integers(1, 60, n).tolist(), "blocks": 12, "fields": FIELDS}
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    res = subprocess.run([sys.executable, "-c", _PLAIN], input=json.dumps(case), env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(res.stdout)
    inp = _inputs(case["arrival"], case["prompt"], case["output"])
    spec = EngineSpec(blocks=12, watermark_blocks=0, max_num_seqs=8, token_budget=64, free_block_rule=False)
    ref = run_preset("vllm-v1", Config(max_num_batched_tokens=64, max_num_seqs=8), spec, inp, inp.output,
                     StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(2, 2)), window=4096)
    assert ref.preemptions.sum() > 0  # the tiny pool preempts: the plain-Python run takes that path too
    assert got == {**ref.totals(), **{f: getattr(ref, f).tolist() for f in FIELDS}}
