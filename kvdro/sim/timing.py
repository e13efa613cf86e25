"""Step durations of one engine, in integer picoseconds, from :func:`kvdro.hardware.step_time`.

Simulated time is an integer number of picoseconds (``PS_PER_S = 10**12``): both engines add the
same integers, so "identical metrics" means bit-identical, and an arrival compared with a step
boundary is decided exactly.

* A **decode step** of ``n`` sequences whose caches hold ``ctx`` tokens in total (after this step's
  append) lasts ``base(n) + slope * ctx``. :func:`kvdro.hardware.step_time` is affine in the context
  for a fixed batch (attention reads every cached K/V byte once), so this is that function with its
  two coefficients rounded to the picosecond: ``slope`` = seconds per cached token read, ``base(n)`` =
  ``step_time(0, n, n) - slope * n``.
* A **prefill step** of prompts with ``tokens`` new tokens in total and ``pairs`` = sum of
  ``L_j^2 - c_j^2`` causal-attention token pairs is ``step_time(tokens, 0, 0, pairs)``, rounded.
  Prefill attention in ``step_time`` is a roofline max of its FLOPs (linear in ``pairs``) and its
  K/V traffic (linear in ``tokens``), so ``step_time(tokens, 0, 0, pairs) = S0(tokens) +
  max(0, a * pairs - m * tokens)`` with ``S0(tokens) = step_time(tokens, 0, 0, 0)``; the clock
  computes ``a`` and ``m`` once from ``step_time`` and ``S0`` once per token count (a test checks
  the result equals ``step_time`` to the picosecond).

:meth:`StepClock.shared` returns one clock per (model, GPU, configuration) and process, so the
memoised step durations are reused by every run of a sweep.

For a pipeline-parallel group the step is the latency of one micro-batch through all ``pp`` stages
(``step_time`` counts the stages one after another); the group runs ``pp`` such micro-batch engines
at once (:mod:`kvdro.sim.deployment`).
"""

from __future__ import annotations

from kvdro.hardware import GPU, Model, ParallelConfig, step_time

__all__ = ["MAX_CLOCK_PS", "MAX_CLOCK_S", "MAX_HORIZON_PS", "MAX_HORIZON_S", "PS_PER_S", "ClockLimitError", "StepClock",
           "seconds_to_ps"]

_SHARED: dict = {}

#: Picoseconds per second: the simulator's unit of time.
PS_PER_S = 10**12

#: The longest span of arrivals (last minus first) a trace may have [ps]: half of the int64 range
#: (2**63 - 1 ps = 9.22e6 s = 106.8 days), so the clock keeps as much again -- 53 days -- for the
#: queue to drain after the last arrival. The margin is generous: serving the whole 19,366-request
#: conversation trace one request at a time (batch 1, nothing overlapped) takes 1.7 days of
#: simulated time on one TP4-PP1 group (2.7 on TP2-PP1), a twentieth of the margin or less. Past it,
#: the cast to int64 wraps and every time is silently wrong (:func:`kvdro.sim.check_trace`).
MAX_HORIZON_PS = 2**62
#: :data:`MAX_HORIZON_PS` in seconds (4.61e6 s, 53.4 days).
MAX_HORIZON_S = MAX_HORIZON_PS / PS_PER_S
#: The **drain limit**: no step of any engine may end at or after this time [ps] (3 x 2**61 =
#: 6.92e18 ps, 80.1 days after the first arrival). It leaves 2**61 ps below 2**63 - 1, more than the
#: longest jump of the compiled engine (:mod:`kvdro.sim.envelope` bounds it), so the clock itself
#: never wraps. All three engines refuse a run that passes it with the same :class:`ClockLimitError`
#: (checked up front with a lower bound of the drain, and exactly while the run goes): which engine
#: ran never changes whether a run completes.
MAX_CLOCK_PS = 3 << 61
#: :data:`MAX_CLOCK_PS` in seconds (6.92e6 s, 80.1 days).
MAX_CLOCK_S = MAX_CLOCK_PS / PS_PER_S


class ClockLimitError(ValueError):
    """A run's simulated clock would pass :data:`MAX_CLOCK_PS`: the trace does not drain on this
    deployment within the int64 picosecond clock (bad input, named: too many or too long requests
    for the serving groups). Every engine raises it, with the same condition."""

    def __init__(self, config: str, requests: int, detail: str):
        super().__init__(
            f"trace/deployment: the {requests:,} requests sent to one {config} engine do not drain within the "
            f"simulator's clock ({MAX_CLOCK_S:.3g} s = {MAX_CLOCK_S / 86400:.1f} days of simulated time, int64 "
            f"picoseconds): {detail}; send fewer or shorter requests to each engine (more groups, a shorter "
            "trace) or simulate the trace in parts")


def seconds_to_ps(seconds: float) -> int:
    """Round seconds to integer picoseconds."""
    return int(round(float(seconds) * PS_PER_S))


class StepClock:
    """Integer step durations [ps] of one engine (a (TP, PP) group's micro-batch engine)."""

    def __init__(self, model: Model, gpu: GPU, config: ParallelConfig):
        self.model, self.gpu, self.config = model, gpu, config
        # seconds per cached token read in a decode step (all layers): the slope of step_time in ctx
        one = step_time(model, gpu, config, 0, 1, 1)
        two = step_time(model, gpu, config, 0, 1, 1 + 1_000_000)
        self.slope_ps = seconds_to_ps((two - one) / 1_000_000)
        self._base: dict[int, int] = {}
        # prefill attention: seconds per causal token pair (a) and per prompt token of its memory floor (m)
        pairs = 1_000_000
        p1 = step_time(model, gpu, config, 1, 0, 0, prefill_attention_tokens2=pairs)
        p2 = step_time(model, gpu, config, 1, 0, 0, prefill_attention_tokens2=2 * pairs)
        self._pair_s = (p2 - p1) / pairs
        self._token_s = step_time(model, gpu, config, 1, 0, 0, prefill_attention_tokens2=0) - (p1 - self._pair_s * pairs)
        self._s0: dict[int, float] = {}
        self._prefill: dict[tuple[int, int], int] = {}

    @classmethod
    def shared(cls, model: Model, gpu: GPU, config: ParallelConfig) -> StepClock:
        """The process's one clock of (model, gpu, config): its memoised durations serve every run."""
        key = (model, gpu, config)
        clock = _SHARED.get(key)
        if clock is None:
            clock = _SHARED[key] = cls(model, gpu, config)
        return clock

    def decode_base_ps(self, n: int) -> int:
        """``base(n)`` [ps]: decode step of ``n`` sequences minus the context-proportional part."""
        b = self._base.get(n)
        if b is None:
            b = seconds_to_ps(step_time(self.model, self.gpu, self.config, 0, n, n)) - self.slope_ps * n
            self._base[n] = b
        return b

    def decode_ps(self, n: int, ctx: int) -> int:
        """Decode step of ``n`` sequences reading ``ctx`` cached tokens in total [ps]."""
        return self.decode_base_ps(n) + self.slope_ps * ctx

    def prefill_ps(self, tokens: int, pairs: int) -> int:
        """Prefill step of ``tokens`` new prompt tokens with ``pairs`` attention pairs [ps]."""
        key = (tokens, pairs)
        ps = self._prefill.get(key)
        if ps is None:
            s0 = self._s0.get(tokens)
            if s0 is None:
                s0 = self._s0[tokens] = step_time(self.model, self.gpu, self.config, int(tokens), 0, 0, prefill_attention_tokens2=0)
            extra = self._pair_s * pairs - self._token_s * tokens
            ps = self._prefill[key] = seconds_to_ps(s0 + extra if extra > 0 else s0)
        return ps
