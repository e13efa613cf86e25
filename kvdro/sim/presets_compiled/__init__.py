"""The compiled implementation of the engine presets (:mod:`kvdro.sim.engines`).

The reference engine (:mod:`kvdro.sim.engine_presets`) is the readable specification: every rule
a small function, run step by step. This package is the one fast implementation of the same
rules: one numba kernel per engine family over flat arrays (the waiting queue a ring buffer, the
running batch an array in admission order), timed by the same cost model to the picosecond
(:mod:`~kvdro.sim.presets_compiled.clock`). Its source runs as plain Python under
``NUMBA_DISABLE_JIT=1`` (slowly, with the same results) for debugging. Property tests
(``tests/test_presets_compiled_*.py``) run both implementations on random traces and knobs and
require every output to be identical.

:func:`run_compiled_preset` has :func:`kvdro.sim.engine_presets.run_preset`'s signature and result;
:data:`COMPILED` names the presets it runs (``vllm-v0`` has its own compiled engine,
:mod:`kvdro.sim.engine_compiled`).
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["COMPILED", "MODULES", "run_compiled_preset", "has_compiled", "warm_up", "warm_up_case"]

#: preset -> the module of this package that runs it (its ``run(engine, cfg, spec, inp, max_new, clock, *, window)``).
MODULES: dict[str, str] = {
    "vllm-v1": "vllm_v1",
    "sglang": "sglang",
    "trtllm-gne": "trtllm",
    "trtllm-maxutil": "trtllm",
    "lightllm": "lightllm",
}


def has_compiled(engine: str) -> bool:
    """True if ``engine`` has a compiled implementation here (its module exists)."""
    name = MODULES.get(engine)
    if name is None:
        return False
    return importlib.util.find_spec(f"{__name__}.{name}") is not None


#: The presets with a compiled implementation.
COMPILED: tuple[str, ...] = tuple(e for e in MODULES if has_compiled(e))


def run_compiled_preset(engine: str, cfg, spec, inp, max_new, clock, *, window: int):
    """:func:`kvdro.sim.engine_presets.run_preset` (without ``record``/``progress``), compiled:
    the same :class:`~kvdro.sim.scheduler.EngineOutput`, integer for integer."""
    if engine not in COMPILED:
        raise ValueError(f"implementation: the preset {engine!r} has no compiled implementation (it has: {COMPILED})")
    module = importlib.import_module(f"{__name__}.{MODULES[engine]}")
    return module.run(engine, cfg, spec, inp, max_new, clock, window=window)


def warm_up() -> None:
    """Compile every compiled preset into numba's on-disk cache (``make install`` calls it once through
    :func:`kvdro.sim.engine_compiled.warm_up`): 20 tiny requests through each, so that no test worker
    or chapter pays the ~10 CPU s per engine family, or compiles it at the same time as another."""
    import numpy as np

    from kvdro.sim.engines import make_config

    clock, spec, inp = warm_up_case(watermark_blocks=0)
    for engine in COMPILED:
        run_compiled_preset(engine, make_config(engine), spec, inp, np.array(inp.output, copy=True), clock, window=4096)


def warm_up_case(*, watermark_blocks: int):
    """The tiny run that compiles a kernel (:func:`warm_up`, :func:`kvdro.sim.engine_compiled.warm_up`):
    (clock, spec, input) of 20 requests of 30 prompt and 40 output tokens at time 0 on a 40-block pool
    (Llama-2-70B, A100, TP4)."""
    import numpy as np

    from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig
    from kvdro.sim.scheduler import EngineInput, EngineSpec
    from kvdro.sim.timing import StepClock

    clock = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))
    spec = EngineSpec(blocks=40, watermark_blocks=watermark_blocks, max_num_seqs=8, token_budget=400,
                      free_block_rule=True)
    n = 20
    zeros = np.zeros(n, dtype=np.int64)
    inp = EngineInput(arrival_ps=zeros, prompt=np.full(n, 30, dtype=np.int64), output=np.full(n, 40, dtype=np.int64),
                      reserve_blocks=zeros, prefix_key=np.full(n, -1, dtype=np.int64), shared_blocks=zeros)
    return clock, spec, inp
