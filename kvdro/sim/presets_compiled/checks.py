"""What the property tests of the compiled presets share: small engine inputs and one run's outcome.

``tests/test_presets_compiled_*.py`` run each compiled preset and its reference engine
(:func:`kvdro.sim.engine_presets.run_preset`) on the same random cases and require the same
:func:`outcome` -- every per-request field and every total, or the same error with the same message.
"""

from __future__ import annotations

import numpy as np

from kvdro.hardware import ParallelConfig, gpu_by_name, model_by_name
from kvdro.sim.invariants import InvariantError
from kvdro.sim.scheduler import EngineInput, EngineSpec
from kvdro.sim.timing import ClockLimitError, StepClock

__all__ = ["FIELDS", "clock", "engine_input", "spec", "outcome", "simulate_both", "run_without_jit"]

#: The per-request fields of :class:`~kvdro.sim.scheduler.EngineOutput` a comparison reads.
FIELDS = ("admit_ps", "first_token_ps", "finish_ps", "preemptions", "recomputed_tokens", "final_cap_tokens",
          "generated")


def clock(model: str, tp: int, pp: int, gpu: str = "a100-80gb") -> StepClock:
    """The process's shared step clock of ``model`` on ``gpu`` under TP ``tp`` x PP ``pp``."""
    return StepClock.shared(model_by_name(model), gpu_by_name(gpu), ParallelConfig(tp=tp, pp=pp))


def engine_input(arrival, prompt, limit) -> EngineInput:
    """An engine input of arrival times [ps], prompts and generation limits [tokens], no reservation or prefix."""
    n = len(prompt)
    zeros = np.zeros(n, np.int64)
    return EngineInput(np.asarray(arrival, np.int64), np.asarray(prompt, np.int64), np.asarray(limit, np.int64),
                       zeros, np.full(n, -1, np.int64), zeros)


def spec(blocks: int) -> EngineSpec:
    """A pool of ``blocks`` 16-token blocks (the presets read only the pool from the spec)."""
    return EngineSpec(blocks=blocks, watermark_blocks=0, max_num_seqs=256, token_budget=16384, free_block_rule=False)


def outcome(run, engine: str, case: dict) -> tuple:
    """``('ok', per-request fields, totals)`` or ``('error', type name, message)`` of ``run`` (a compiled
    module's ``run`` or ``run_preset``) on ``case`` (keys cfg, spec, inp, max_new, clock, window)."""
    try:
        out = run(engine, case["cfg"], case["spec"], case["inp"], case["max_new"], case["clock"], window=case["window"])
    except (AssertionError, InvariantError, ClockLimitError, ValueError) as e:
        return ("error", type(e).__name__, str(e))
    assert out.trace is None
    return ("ok", {f: getattr(out, f).tolist() for f in FIELDS}, out.totals())


def simulate_both(trace, engine: str, **kwargs):
    """``simulate(trace, engine=engine, **kwargs)`` with the compiled and with the reference
    implementation (routing seed 0); AssertionError unless the per-request frames, the metrics (but
    wall time) and every engine's totals are identical. Returns the reference run's result."""
    from kvdro.sim import simulate

    fast, ref = (simulate(trace, engine=engine, implementation=impl, rng=np.random.default_rng(0), **kwargs)
                 for impl in ("fast", "reference"))
    assert fast.implementation == "fast" and ref.implementation == "reference"
    assert fast.requests.equals(ref.requests)
    strip = lambda m: {k: v for k, v in m.items() if k != "wall_s"}  # noqa: E731
    assert strip(fast.metrics) == strip(ref.metrics)
    assert [o.totals() for o in fast.outputs] == [o.totals() for o in ref.outputs]
    return ref


def run_without_jit(code: str, *, cwd: str, timeout: float = 300) -> object:
    """Run ``code`` (Python that prints one JSON document) in a fresh process with
    ``NUMBA_DISABLE_JIT=1`` -- the compiled kernels' source as plain Python -- from ``cwd``; the
    document, decoded. A failing process raises ``subprocess.CalledProcessError``."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=True)
    return json.loads(proc.stdout)
