"""The engines' envelope: what every engine checks before it serves a request, so that the reference
and the compiled engine complete or refuse the same runs, with the same error.

The simulator's integers are exact only inside int64 (the compiled engine,
:mod:`kvdro.sim._engine_kernels`) and its clock only up to :data:`kvdro.sim.timing.MAX_CLOCK_PS`.
:func:`check_envelope` is called first by :func:`~kvdro.sim.engine_reference.run_reference` and
:func:`~kvdro.sim.engine_compiled.run_compiled`:

* **token counts**: prompts >= 1 and outputs >= 1 token, each at most :data:`MAX_TOKENS` = 2**53
  (the largest integer a float64 holds exactly; :func:`kvdro.sim.check_trace` refuses larger
  trace values by column and row);
* **step durations**: the longest decode step the engine can run (``max_num_seqs`` sequences
  whose caches fill the KV pool) is below :data:`MAX_DECODE_PS` (2**43 ps = 8.8 s) and the
  per-step growth ``slope x max_num_seqs`` below :data:`MAX_GROWTH_PS` (2**28 ps), so one jump of
  the compiled engine (at most 2**16 decode steps) lasts less than 2**60 ps; the longest prefill
  step (:func:`prefill_tokens_bound` tokens, every pair of them attending) is below 2**60 ps and
  its attention pairs below 2**62;
* **the drain**: a lower bound of the time the engine needs to serve its requests
  (:func:`drain_lower_bound_ps`) is below the drain limit. The exact condition -- the clock passing
  :data:`~kvdro.sim.timing.MAX_CLOCK_PS` -- is checked again by every engine while it runs, and
  raises the same :class:`~kvdro.sim.timing.ClockLimitError`; the bound only refuses at once a run
  that cannot drain, instead of after hours of simulation.

Every failure is a ``ValueError`` naming what is too large (bad input, never a wrapped integer).
"""

from __future__ import annotations

import numpy as np

from kvdro.sim.scheduler import BLOCK_TOKENS, EngineInput, EngineSpec
from kvdro.sim.timing import MAX_CLOCK_PS, PS_PER_S, ClockLimitError, StepClock

__all__ = ["MAX_DECODE_PS", "MAX_GROWTH_PS", "MAX_PREFILL_PS", "MAX_TOKENS", "check_envelope", "check_inputs", "drain_lower_bound_ps",
           "prefill_tokens_bound"]

#: The largest prompt or output length [tokens] a trace may hold: 2**53, the last integer a float64
#: represents exactly (pandas reads token columns with NaN as float64).
MAX_TOKENS = 2**53
#: The longest decode step an engine may run [ps] (2**43 ps = 8.8 s).
MAX_DECODE_PS = 1 << 43
#: The largest growth of a decode step per decode step, ``slope x max_num_seqs`` [ps].
MAX_GROWTH_PS = 1 << 28
#: The longest prefill step an engine may run [ps] (2**60 ps).
MAX_PREFILL_PS = 1 << 60


def prefill_tokens_bound(spec: EngineSpec, inp: EngineInput) -> int:
    """The most prompt tokens one prefill step of this engine can hold [tokens]: the token budget, or
    less -- the sum of the ``max_num_seqs`` largest ``L_in + xi - 1`` (a request re-admitted after a
    preemption is prefilled again with its prompt plus the tokens it generated, at most xi - 1).
    This sizes the compiled engine's table of prefill times by the trace, not by the budget."""
    n = len(inp)
    if n == 0:
        return 1
    longest = np.asarray(inp.prompt, dtype=float) + np.asarray(inp.output, dtype=float) - 1.0
    k = min(int(spec.max_num_seqs), n)
    top = np.partition(longest, n - k)[n - k:]
    return max(1, int(min(float(spec.token_budget), float(top.sum()))))


def _base_range(spec: EngineSpec, clock: StepClock) -> tuple[int, int]:
    """(a lower, an upper) bound of the decode step's batch term base(n) [ps] over n = 1 .. max_num_seqs.

    base(n) = step_time(0, n, n) - slope n is the step without its context reads: linear operators
    on n rows, element-wise kernels, all-reduces and the LM head, each non-decreasing in n
    (:func:`kvdro.hardware.step_time`); the two roundings to the picosecond move it by less than
    ``1 + n/2`` ps, which the margin of ``max_num_seqs`` ps covers."""
    m = int(spec.max_num_seqs)
    return clock.decode_base_ps(1) - m, clock.decode_base_ps(m) + m


def _prefill_floor_per_token(clock: StepClock, t_max: int) -> float:
    """A lower bound of ``S0(T) / T`` [ps per token] over T = 1 .. ``t_max``, S0 the prefill floor.

    S0 is non-decreasing in T (more rows are never faster) but ``S0(T)/T`` is not monotone (the
    linear operators' tiles), so on a grid T_0 = 1 < T_1 < ... (ratio <= 1.1) it uses
    ``S0(T) / T >= S0(T_k) / T_(k+1)`` for T in [T_k, T_(k+1)]: ~100 evaluations for 16,384 tokens."""
    best = float("inf")
    lo = 1
    while lo <= t_max:
        hi = min(t_max, max(lo + 1, int(lo * 1.1)))
        best = min(best, clock.prefill_ps(lo, 0) / hi)
        if hi == t_max:
            break
        lo = hi
    return best


def drain_lower_bound_ps(spec: EngineSpec, inp: EngineInput, clock: StepClock) -> float:
    """A lower bound of the time at which this engine has served all its requests [ps].

    Request j produces tokens 2 .. xi_j after its first prefill, the g-th with a cache of
    ``c = L_in + g - 1`` tokens, either in a decode step or, after a preemption, in a re-prefill of
    those c tokens (tokens generated are kept by recompute). A decode step of n sequences whose
    caches hold ``ctx`` tokens lasts ``base(n) + slope x ctx`` with ``ctx`` at most the pool's
    ``cap`` tokens (16 x (blocks + max_num_seqs x the largest shared prefix)), so a sequence's share
    ``c / ctx`` of it is at least ``c (min base / cap + slope)``; a prefill step of T tokens lasts at
    least ``T x f`` with ``f`` = :func:`_prefill_floor_per_token`, and a re-prefill computes at least
    ``c - 16 S_j`` tokens (a resident shared prefix of ``S_j`` blocks is not computed again). So every
    token costs at least ``(c - 16 S_j) x min(min base / cap + slope, f)``, and the sum over all
    tokens, added to the first arrival, bounds the drain from below -- whatever the preemptions,
    the batch sizes or the order (``tests/test_sim_engines.py`` checks it against every engine run
    of its property test; ``tests/test_bad_inputs_engine.py`` finds it within 10 % of the drain of
    3,000 long requests on one TP2 engine).
    """
    n = len(inp)
    if n == 0:
        return 0.0
    keyed = np.asarray(inp.prefix_key) >= 0
    # the prompt less a shared prefix, which a re-prefill with a prefix hit does not compute again
    L = np.asarray(inp.prompt, dtype=float) - BLOCK_TOKENS * np.where(keyed, np.asarray(inp.shared_blocks), 0)
    X = np.asarray(inp.output, dtype=float)
    work = float(np.sum((X - 1.0) * L + X * (X - 1.0) / 2.0))  # sum over tokens of c - 16 S_j [tokens]
    shared = np.asarray(inp.shared_blocks)[keyed]
    cap = BLOCK_TOKENS * (spec.blocks + spec.max_num_seqs * (int(shared.max()) if shared.size else 0))
    bmin, _ = _base_range(spec, clock)
    t_max = prefill_tokens_bound(spec, inp)
    per_token = min(max(bmin, 0) / cap + clock.slope_ps, _prefill_floor_per_token(clock, t_max))
    return float(np.min(inp.arrival_ps)) + work * per_token


def check_inputs(inp: EngineInput) -> None:
    """The part of the envelope every engine checks, the presets' too: token counts integers in
    [1, 2**53] (:data:`MAX_TOKENS`) and arrivals inside the picosecond clock; ValueError naming them."""
    n = len(inp)
    for name in ("prompt", "output"):
        v = np.asarray(getattr(inp, name))
        if n and v.dtype.kind not in "iu":
            raise ValueError(f"{name}: token counts must be integers in [1, 2**53], got dtype {v.dtype}")
        bad = np.flatnonzero((v < 1) | (v > MAX_TOKENS)) if n else []
        if len(bad):
            raise ValueError(f"{name}: token counts must be integers in [1, 2**53]; request {int(bad[0])} has "
                             f"{int(v[bad[0]])}")
    if n and (int(np.min(inp.arrival_ps)) < 0 or int(np.max(inp.arrival_ps)) >= MAX_CLOCK_PS):
        raise ValueError(f"arrival_ps: arrivals must lie in [0, {MAX_CLOCK_PS}) ps")


def check_envelope(spec: EngineSpec, inp: EngineInput, clock: StepClock) -> None:
    """Refuse, before the first step, a run outside the engines' envelope (module docstring).

    Raises:
        ValueError: naming the input (``prompt``/``output``) or the setting (``spec``/``clock``) out of range.
        ClockLimitError: the run cannot drain before :data:`~kvdro.sim.timing.MAX_CLOCK_PS`.
    """
    check_inputs(inp)
    n = len(inp)
    where = f"one {clock.config.name} engine of {clock.model.name} on {clock.gpu.name}"
    _, bmax = _base_range(spec, clock)
    L = np.asarray(inp.prompt, dtype=float)
    X = np.asarray(inp.output, dtype=float)
    longest = float(np.sort(L + X)[-min(int(spec.max_num_seqs), n):].sum()) if n else 0.0
    shared = int(np.max(inp.shared_blocks)) if n else 0
    ctx = min(longest, float(BLOCK_TOKENS * (spec.blocks + spec.max_num_seqs * shared)))
    decode = bmax + clock.slope_ps * ctx
    if decode >= MAX_DECODE_PS or clock.slope_ps * spec.max_num_seqs >= MAX_GROWTH_PS:
        raise ValueError(f"spec/clock: a decode step of {where} could last {decode / PS_PER_S:.3g} s "
                         f"(max_num_seqs {spec.max_num_seqs}, {spec.blocks} blocks), beyond the "
                         f"{MAX_DECODE_PS / PS_PER_S:.3g} s the engines' int64 arithmetic is checked for")
    t_max = prefill_tokens_bound(spec, inp)
    if t_max >= 1 << 31 or clock.prefill_ps(t_max, t_max * t_max) >= MAX_PREFILL_PS:
        raise ValueError(f"spec/clock: a prefill step of {t_max:,} tokens on {where} is beyond the engines' "
                         "int64 arithmetic (lower max_num_batched_tokens)")
    bound = drain_lower_bound_ps(spec, inp, clock)
    if bound >= MAX_CLOCK_PS:
        raise ClockLimitError(clock.config.name, n, f"serving them takes at least {bound / PS_PER_S:.3g} s (a lower "
                              "bound: every generated token's share of its step, whatever the batching)")
