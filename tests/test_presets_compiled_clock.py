"""The compiled presets' step clock equals the reference engine's ``step_ps`` to the picosecond."""

import zlib

import numpy as np
import pytest

from kvdro.hardware import MODELS, ParallelConfig, gpu_by_name, model_by_name
from kvdro.sim.engine_presets import step_ps as reference_step_ps
from kvdro.sim.presets_compiled.clock import clock_constants, step_ps
from kvdro.sim.timing import StepClock


def _batches(rng, count):
    for _ in range(count):
        kind = rng.integers(3)  # 0 decode only, 1 prefill only, 2 mixed
        dec = int(rng.integers(1, 257)) if kind != 1 else 0
        ctx = int(rng.integers(dec, dec * 4000 + 1)) if dec else 0
        pre = int(rng.integers(1, 20000)) if kind != 0 else 0
        chunks = int(rng.integers(1, 5)) if pre else 0
        kv = (pre if rng.random() < 0.5 else pre + int(rng.integers(1, 30000))) if pre else 0
        pairs = pre * pre + int(rng.integers(0, 10**8)) if pre else 0
        yield pre, pairs, dec, ctx, chunks, kv


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-80gb"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 2)])
def test_compiled_clock_equals_reference(model, gpu, tp, pp):
    clock = StepClock(model_by_name(model), gpu_by_name(gpu), ParallelConfig(tp=tp, pp=pp))
    c = clock_constants(clock)
    rng = np.random.default_rng(zlib.crc32(f"{model}{gpu}{tp}{pp}".encode()))
    seen = set()
    for pre, pairs, dec, ctx, chunks, kv in _batches(rng, 120):
        want = reference_step_ps(clock, pre, pairs, dec, ctx, chunks=chunks, prefill_kv_tokens=kv)
        got = int(step_ps(c, pre, pairs, dec, ctx, chunks, kv))
        assert got == want, (pre, pairs, dec, ctx, chunks, kv)
        seen.add((pre == 0, dec == 0))
    assert seen == {(True, False), (False, True), (False, False)}  # every branch was exercised
    assert int(step_ps(c, 0, 0, 0, 0, 0, 0)) == 0
