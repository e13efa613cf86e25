"""The step clock of the compiled presets: :func:`kvdro.sim.engine_presets.step_ps` as a numba function.

The reference engine of the presets times a step with :func:`kvdro.sim.engine_presets.step_ps`:
a decode-only step with the :class:`~kvdro.sim.timing.StepClock`'s ``decode_ps``, a prefill-only
step of whole prompts with its ``prefill_ps``, any other (mixed) step with
:func:`kvdro.hardware.mixed_step_times`. :func:`step_ps` below does the same three things with the
same float operations in the same order -- the cost model of :func:`kvdro.hardware._mixed_step_core`,
term by term, on the constants :func:`clock_constants` reads once from the clock -- and the same
round-half-to-even to picoseconds, so the compiled presets time every step to the picosecond as
the reference does (``tests/test_presets_compiled_clock.py`` checks it on random batches).

A pure decode step is ``round(T(0, n, n)) - slope x n + slope x ctx`` (``StepClock.decode_ps``:
the decode base of ``n`` sequences plus ``slope`` ps per context token read) and a pure prefill
step of whole prompts ``round(S0 + max(0, a x pairs - m x tokens))`` with ``S0 = T(tokens, 0, 0)``
(``StepClock.prefill_ps``), where ``T`` is the mixed-step cost model; both equal
:func:`kvdro.hardware.step_time` bit for bit (``tests/test_hardware_models.py``).

Units: tokens, seconds inside the cost model, integer picoseconds out.
"""

from __future__ import annotations

import math

import numpy as np

from kvdro.hardware import kv_bytes_per_token, linear_operators
from kvdro.sim.timing import StepClock

__all__ = ["clock_constants", "step_seconds", "step_ps", "N_CONSTANTS"]

# indices into the constants vector
(_EFF_FLOPS, _EFF_BW, _EFF_NV, _BYTES, _TILE, _OVERHEAD, _HIDDEN, _FFN, _TP, _PP, _LAYERS, _KV_LAYER_TOKEN,
 _ATTN_BW, _HEADS, _HEAD_DIM, _AR_LATENCY, _VOCAB_TP, _K0, _N0, _K1, _N1, _K2, _N2, _K3, _N3, _SLOPE_PS, _PAIR_S,
 _TOKEN_S) = range(28)
#: Length of :func:`clock_constants`' vector.
N_CONSTANTS = 28


def clock_constants(clock: StepClock) -> np.ndarray:
    """The float64 constants :func:`step_ps` reads: the GPU's and model's numbers of the cost model
    (efficiencies x peaks, bytes per element, GEMM tile, kernel overhead [s], shapes, the four linear
    operators' (k, n) under the clock's tensor parallelism) and the clock's decode slope [ps per
    context token], prefill pair cost [s per pair] and prefill token floor [s per token]."""
    model, gpu, cfg = clock.model, clock.gpu, clock.config
    tp, pp = cfg.tp, cfg.pp
    ops = list(linear_operators(model, tp).values())
    c = np.zeros(N_CONSTANTS)
    c[_EFF_FLOPS] = gpu.compute_efficiency * gpu.peak_flops
    c[_EFF_BW] = gpu.hbm_efficiency * gpu.hbm_bandwidth
    c[_EFF_NV] = gpu.nvlink_efficiency * gpu.nvlink_bandwidth
    c[_BYTES] = model.dtype_bytes
    c[_TILE] = gpu.gemm_tile
    c[_OVERHEAD] = gpu.kernel_overhead_s
    c[_HIDDEN] = model.hidden
    c[_FFN] = model.ffn
    c[_TP] = tp
    c[_PP] = pp
    c[_LAYERS] = model.n_layers
    c[_KV_LAYER_TOKEN] = kv_bytes_per_token(model) / model.n_layers / tp
    c[_ATTN_BW] = gpu.attention_bandwidth
    c[_HEADS] = model.n_heads
    c[_HEAD_DIM] = model.head_dim
    c[_AR_LATENCY] = gpu.allreduce_latency_s
    c[_VOCAB_TP] = math.ceil(model.vocab / tp)
    for i, (k, n) in enumerate(ops):
        c[_K0 + 2 * i] = k
        c[_N0 + 2 * i] = n
    c[_SLOPE_PS] = clock.slope_ps
    c[_PAIR_S] = clock._pair_s
    c[_TOKEN_S] = clock._token_s
    return c


def _gemm(c, m, k, n):
    """:func:`kvdro.hardware.linear_op_time` as in the mixed-step cost model [s]."""
    if m <= 0:
        return 0.0
    flops = 2.0 * (math.ceil(m / c[_TILE]) * c[_TILE]) * k * n
    moved = c[_BYTES] * (k * n + m * k + m * n)
    return c[_OVERHEAD] + max(flops / c[_EFF_FLOPS], moved / c[_EFF_BW])


def _elementwise(c, moved):
    """:func:`kvdro.hardware.elementwise_op_time` [s]."""
    if moved <= 0:
        return 0.0
    return c[_OVERHEAD] + moved / c[_EFF_BW]


def step_seconds(c, pf, n_dec, ctx, chunks, pairs, kv_read):
    """Seconds of one step: ``pf`` prefill tokens in ``chunks`` chunks with ``pairs`` causal pairs
    reading ``kv_read`` K/V tokens, beside ``n_dec`` decodes reading ``ctx`` cached tokens
    (:func:`kvdro.hardware._mixed_step_core`, operation by operation)."""
    pf = float(pf)
    n_dec = float(n_dec)
    ctx = float(ctx)
    rows = pf + n_dec
    if rows <= 0:
        return 0.0
    b = c[_BYTES]
    tp = c[_TP]
    act = b * rows * c[_HIDDEN]
    per_layer = 0.0
    per_layer = per_layer + _gemm(c, rows, c[_K0], c[_N0])
    per_layer = per_layer + _gemm(c, rows, c[_K1], c[_N1])
    per_layer = per_layer + _gemm(c, rows, c[_K2], c[_N2])
    per_layer = per_layer + _gemm(c, rows, c[_K3], c[_N3])
    per_layer = per_layer + 4 * _elementwise(c, 2 * act)
    per_layer = per_layer + _elementwise(c, 3 * b * rows * c[_FFN] / tp)
    if n_dec > 0 and ctx > 0:
        per_layer = per_layer + (c[_OVERHEAD] + ctx * c[_KV_LAYER_TOKEN] / c[_ATTN_BW])
    else:
        per_layer = per_layer + 0.0
    attn_flops = 2.0 * float(pairs) * c[_HEADS] * c[_HEAD_DIM] / tp
    prefill_attn = c[_OVERHEAD] + max(attn_flops / c[_EFF_FLOPS], float(kv_read) * c[_KV_LAYER_TOKEN] / c[_EFF_BW])
    per_layer = per_layer + (prefill_attn if pf > 0 else 0.0)
    if tp > 1:
        per_layer = per_layer + 2 * ((c[_AR_LATENCY] + 2.0 * (tp - 1) / tp * act / c[_EFF_NV]) if act > 0 else 0.0)
    total = c[_LAYERS] * per_layer + _gemm(c, n_dec + float(chunks), c[_HIDDEN], c[_VOCAB_TP])
    if c[_PP] > 1:
        total = total + (c[_PP] - 1) * ((c[_AR_LATENCY] + act / tp / c[_EFF_NV]) if act > 0 else 0.0)
    return total


def _to_ps(seconds):
    """``timing.seconds_to_ps``: round half to even to integer picoseconds."""
    return np.int64(np.rint(seconds * 1e12))


def step_ps(c, pre, pairs, dec, ctx, chunks, kv):
    """Duration [ps] of a step, as :func:`kvdro.sim.engine_presets.step_ps` (module docstring):
    ``pre`` prefill tokens in ``chunks`` chunks (``pairs`` causal pairs, ``kv`` K/V tokens read
    with their prefixes) beside ``dec`` decodes reading ``ctx`` tokens. 0 for an empty step."""
    if pre == 0 and dec == 0:
        return np.int64(0)
    slope = np.int64(c[_SLOPE_PS])
    if dec == 0 and kv == pre:  # prefill-only step of whole prompts: StepClock.prefill_ps
        s0 = step_seconds(c, pre, 0, 0, 1, 0, pre)
        extra = c[_PAIR_S] * pairs - c[_TOKEN_S] * pre
        return _to_ps(s0 + extra if extra > 0 else s0)
    if pre == 0:  # decode-only step: StepClock.decode_ps
        base = _to_ps(step_seconds(c, 0, dec, dec, 0, 0, 0)) - slope * dec
        return base + slope * ctx
    return _to_ps(step_seconds(c, pre, dec, ctx, chunks, pairs, kv))


try:  # compiled when numba is installed; plain Python under NUMBA_DISABLE_JIT=1 or without numba
    from numba import njit

    _gemm = njit(cache=True)(_gemm)
    _elementwise = njit(cache=True)(_elementwise)
    step_seconds = njit(cache=True)(step_seconds)
    _to_ps = njit(cache=True)(_to_ps)
    step_ps = njit(cache=True)(step_ps)
except ImportError:  # pragma: no cover - numba is a dependency
    pass
