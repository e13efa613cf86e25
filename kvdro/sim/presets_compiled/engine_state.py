"""What the compiled presets share: :class:`~kvdro.sim.engines.state.EngineState` over flat arrays,
:func:`kvdro.sim.engine_presets._loop`'s step after ``schedule()`` and :func:`~kvdro.sim.engine_presets.run_preset`'s
accounting, and the Python wrapper around an engine's kernel.

The state of one engine, as numba functions read it:

* ``rq``: int64 table ``(N_FIELDS, n)``, one column per request (arrival order), rows named below:
  the inputs (``PROMPT``, ``LIMIT``, ``MAX_NEW``), the state of :class:`EngineState` (``GENERATED``,
  ``COMPUTED``, ``HELD`` pages, ``PREEMPTIONS``, ``RECOMPUTED``, ``RUNNING`` = in the running batch)
  and :class:`~kvdro.sim.scheduler.EngineOutput`'s per-request fields (``ADMIT`` ... ``GEN_OUT``);
* ``sc``: int64 scalars, entries named below: the pool (``FREE``, ``PAGES``, ``PAGE_SIZE`` [tokens]),
  the waiting queue's ring (``QHEAD``, ``QLEN``), the running batch's size (``NRUN``), the step just
  formed (``NSCHED`` requests in ``sj``/``sk``, ``NPRE`` preempted), the loop (``T`` [ps], ``NXT``
  next arrival, ``LEFT`` unfinished, ``EMPTY`` empty steps in a row), the totals, an error code
  (an engine keeps its own scalars apart);
* ``q``: the waiting queue, a ring buffer of request indices (a deque: push at either end, pop at the
  front, and a sorted insert for TensorRT-LLM's paused requests); ``run``: the running batch, an
  array in the engine's order (admission order, or arrival order for TensorRT-LLM);
* ``wide``: the integrals that can pass int64 (resident, decode batch, KV tokens x ps), three 30-bit
  limbs each (:func:`kvdro.sim._engine_kernels._addmul`).

Every function here and in the engines' modules is ``@njit(cache=True, _nrt=False)``, the small ones
``inline="always"``: the kernels allocate nothing (the wrapper makes every array), so they run
without numba's reference counting, whose atomic increments and decrements on the arrays handed
from function to function took ~80 % of the time (0.34 us of a ``trtllm-gne`` step of the
conversation trace; 0.07 us without). Numba's on-disk cache of an engine's module checks only that
module's own source: after editing this one, touch the engines' modules (or clear ``__pycache__``)
so that they compile again with it.

Units: tokens, pages, integer picoseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvdro.hardware import BLOCK_TOKENS
from kvdro.sim._engine_kernels import _addmul
from kvdro.sim.envelope import check_inputs
from kvdro.sim.invariants import InvariantError
from kvdro.sim.presets_compiled.clock import clock_constants, step_ps
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock

__all__ = ["Kernel", "allocate", "evict", "end_step", "idle", "pages_for", "pages_needed", "num_tokens"]

# rows of rq
(PROMPT, LIMIT, MAX_NEW, GENERATED, COMPUTED, HELD, PREEMPTIONS, RECOMPUTED, RUNNING,
 ADMIT, FIRST, FINISH, FINAL_CAP, GEN_OUT, N_FIELDS) = range(15)
# entries of sc
(FREE, PAGES, PAGE_SIZE, QHEAD, QLEN, NRUN, NSCHED, NPRE, T, NXT, LEFT, EMPTY, STEPS, PREFILL_STEPS, BUSY,
 DECODE_PS, PEAK, ERR, ERR_J, N_SCALARS) = range(20)
# error codes (sc[ERR])
OK, STUCK, CLOCK, RANGE, OVERADMIT = range(5)
# wide integrals (limbs at 3 x index)
W_RESIDENT, W_DBATCH, W_KV = 0, 3, 6
_PAIRS_MAX = 1 << 62  # causal pairs of one step (and (computed + new)^2 of one request) stay below it


# -- the request and the pool (EngineState) ----------------------------------------------------
@njit(cache=True, inline="always", _nrt=False)
def num_tokens(rq, j):
    """:meth:`EngineState.num_tokens`."""
    return rq[PROMPT, j] + rq[GENERATED, j]


@njit(cache=True, inline="always", _nrt=False)
def pages_for(sc, tokens):
    """:meth:`EngineState.pages_for`."""
    return -(-tokens // sc[PAGE_SIZE])


@njit(cache=True, inline="always", _nrt=False)
def pages_needed(rq, sc, j, tokens):
    """:meth:`EngineState.pages_needed`."""
    return max(0, pages_for(sc, tokens) - rq[HELD, j])


@njit(cache=True, inline="always", _nrt=False)
def allocate(rq, sc, j, tokens):
    """:meth:`EngineState.allocate` (no prefix cache)."""
    need = pages_needed(rq, sc, j, tokens)
    if need > sc[FREE]:
        return False
    sc[FREE] -= need
    rq[HELD, j] += need
    return True


@njit(cache=True, inline="always", _nrt=False)
def release(rq, sc, j):
    """:meth:`EngineState.release`."""
    sc[FREE] += rq[HELD, j]
    rq[HELD, j] = 0


@njit(cache=True, inline="always", _nrt=False)
def evict(rq, sc, j):
    """:meth:`EngineState.evict` (no prefix cache)."""
    rq[PREEMPTIONS, j] += 1
    rq[RECOMPUTED, j] += rq[COMPUTED, j]
    release(rq, sc, j)
    rq[COMPUTED, j] = 0


# -- the waiting queue (a deque of request indices in a ring) ----------------------------------------
@njit(cache=True, inline="always", _nrt=False)
def queue_at(q, sc, i):
    """The ``i``-th waiting request (``st.waiting[i]``)."""
    return q[(sc[QHEAD] + i) % q.size]


@njit(cache=True, inline="always", _nrt=False)
def push_back(q, sc, j):
    """``st.waiting.append(j)``."""
    q[(sc[QHEAD] + sc[QLEN]) % q.size] = j
    sc[QLEN] += 1


@njit(cache=True, inline="always", _nrt=False)
def push_front(q, sc, j):
    """``st.waiting.appendleft(j)``."""
    sc[QHEAD] = (sc[QHEAD] - 1) % q.size
    q[sc[QHEAD]] = j
    sc[QLEN] += 1


@njit(cache=True, inline="always", _nrt=False)
def pop_front(q, sc):
    """``st.waiting.popleft()``."""
    j = q[sc[QHEAD]]
    sc[QHEAD] = (sc[QHEAD] + 1) % q.size
    sc[QLEN] -= 1
    return j


@njit(cache=True, inline="always", _nrt=False)
def queue_insort(q, sc, j):
    """``bisect.insort(st.waiting, j)`` on a queue sorted by index: the ``p`` requests before ``j``
    move one place towards the front."""
    p = 0
    while p < sc[QLEN] and queue_at(q, sc, p) < j:
        p += 1
    head = sc[QHEAD]
    new = (head - 1) % q.size
    for i in range(p):
        q[(new + i) % q.size] = q[(head + i) % q.size]
    q[(new + p) % q.size] = j
    sc[QHEAD] = new
    sc[QLEN] += 1


# -- the running batch -----------------------------------------------------------------------------
@njit(cache=True, inline="always", _nrt=False)
def run_append(rq, sc, run, j):
    """``st.running.append(j)``."""
    run[sc[NRUN]] = j
    sc[NRUN] += 1
    rq[RUNNING, j] = 1


@njit(cache=True, inline="always", _nrt=False)
def run_insort(rq, sc, run, j):
    """``bisect.insort(st.running, j)``: the running batch in arrival (index) order."""
    i = sc[NRUN]
    while i > 0 and run[i - 1] > j:
        run[i] = run[i - 1]
        i -= 1
    run[i] = j
    sc[NRUN] += 1
    rq[RUNNING, j] = 1


@njit(cache=True, inline="always", _nrt=False)
def run_pop(rq, sc, run):
    """``st.running.pop()``: the last of the running batch."""
    sc[NRUN] -= 1
    j = run[sc[NRUN]]
    rq[RUNNING, j] = 0
    return j


# -- the loop ----------------------------------------------------------------------------------------
@njit(cache=True, inline="always", _nrt=False)
def idle(arrival, sc):
    """``_loop`` with nothing waiting or running: the clock jumps to the next arrival."""
    if sc[NXT] >= arrival.size:
        sc[ERR] = STUCK
        return
    sc[T] = max(sc[T], arrival[sc[NXT]])


@njit(cache=True, inline="always", _nrt=False)
def _empty_step(arrival, sc):
    """``_loop`` after a step that scheduled nothing (it lasts 0 ps): a step that preempted is followed
    by another at once; the second empty step in a row waits for the next arrival (none: stuck)."""
    if sc[NPRE] > 0:
        return
    sc[EMPTY] += 1
    if sc[EMPTY] < 2:
        return
    if sc[NXT] >= arrival.size:
        sc[ERR] = STUCK
        return
    sc[T] = max(sc[T], arrival[sc[NXT]])
    sc[EMPTY] = 0


@njit(cache=True, inline="always", _nrt=False)
def end_step(arrival, rq, sc, run, sj, sk, c, wide):
    """``_loop`` after ``schedule()``: the step's batch (prefill tokens, causal pairs, chunks, K/V read;
    decodes and the context they read) timed by the clock, each request's computed and generated
    tokens, ``run_preset``'s ``on_step`` accounting, then the finished requests leave and free their pages."""
    ns = sc[NSCHED]
    if ns == 0:
        _empty_step(arrival, sc)
        return
    sc[EMPTY] = 0
    pre = 0
    pairs = 0
    dec = 0
    ctx = 0
    chunks = 0
    kv = 0
    for i in range(ns):
        j = sj[i]
        k = sk[i]
        cj = rq[COMPUTED, j]
        if k == 1 and rq[GENERATED, j] >= 1 and cj + 1 == num_tokens(rq, j):
            dec += 1
            ctx += cj + 1
        else:
            if cj + k >= 3_000_000_000:  # (cj + k)**2 must stay below 2**63
                sc[ERR] = RANGE
                return
            pre += k
            pairs += (cj + k) * (cj + k) - cj * cj
            if pairs >= _PAIRS_MAX:
                sc[ERR] = RANGE
                return
            chunks += 1
            kv += cj + k
    dur = step_ps(c, pre, pairs, dec, ctx, chunks, kv)
    t0 = sc[T]
    ndone = 0
    for i in range(ns):
        j = sj[i]
        rq[COMPUTED, j] += sk[i]
        if rq[COMPUTED, j] == num_tokens(rq, j):
            rq[GENERATED, j] += 1
            if rq[GENERATED, j] == rq[LIMIT, j]:
                ndone += 1
    if dur != 0:
        if dur < 0 or dur >= MAX_CLOCK_PS - t0:  # t0 + dur reaches the drain limit (or the step overflows)
            sc[ERR] = CLOCK
            return
        on_step(rq, sc, run, sj, t0, dur, pre == 0, wide)
    sc[T] = t0 + dur
    if ndone:
        _finish(rq, sc, run, sj, ns, t0 + dur, dur != 0)


@njit(cache=True, inline="always", _nrt=False)
def on_step(rq, sc, run, sj, t0, dur, decode_only, wide):
    """``run_preset``'s ``on_step`` for a step of ``dur`` > 0 ps from ``t0`` (before its finished
    requests leave): admission and first-token times, the engine's totals and integrals."""
    t_end = t0 + dur
    ns = sc[NSCHED]
    for i in range(ns):
        j = sj[i]
        if rq[ADMIT, j] < 0:
            rq[ADMIT, j] = t0
        if rq[GENERATED, j] >= 1 and rq[FIRST, j] < 0:
            rq[FIRST, j] = t_end
    used = (sc[PAGES] - sc[FREE]) * sc[PAGE_SIZE]
    sc[STEPS] += 1
    sc[BUSY] += dur
    ok = _addmul(wide, W_RESIDENT, sc[NRUN], dur)
    ok &= _addmul(wide, W_KV, used, dur)
    if used > sc[PEAK]:
        sc[PEAK] = used
    if decode_only:
        ok &= _addmul(wide, W_DBATCH, ns, dur)
        sc[DECODE_PS] += dur
    else:
        sc[PREFILL_STEPS] += 1
    if not ok:
        sc[ERR] = RANGE


@njit(cache=True, inline="always", _nrt=False)
def _finish(rq, sc, run, sj, ns, t_end, timed):
    """The requests that sampled their last token leave the running batch (its order kept) and free
    their pages; ``on_step`` records their finish time, pages held and tokens (when the step was timed)."""
    for i in range(ns):
        j = sj[i]
        if rq[GENERATED, j] == rq[LIMIT, j] and rq[RUNNING, j] == 1:
            if timed:
                rq[FINISH, j] = t_end
                rq[FINAL_CAP, j] = rq[HELD, j] * sc[PAGE_SIZE]
                rq[GEN_OUT, j] = rq[GENERATED, j]
            rq[RUNNING, j] = 0
            release(rq, sc, j)
            sc[LEFT] -= 1
    m = 0
    for i in range(sc[NRUN]):
        j = run[i]
        if rq[RUNNING, j] == 1:
            run[m] = j
            m += 1
    sc[NRUN] = m


# -- the Python side ---------------------------------------------------------------------------------
class Kernel:
    """The arrays one compiled preset engine runs on (module docstring), built from ``run_preset``'s arguments."""

    def __init__(self, engine: str, presets: tuple[str, ...], cfg, spec: EngineSpec, inp: EngineInput,
                 max_new: np.ndarray, clock: StepClock):
        if engine not in presets:
            raise ValueError(f"engine: this module runs {presets}, got {engine!r}")
        check_inputs(inp)  # the engines' common envelope, first, as run_preset
        n = len(inp)
        max_new = np.asarray(max_new)
        if max_new.shape != (n,):
            raise ValueError(f"max_new: one value per request ({n}), got shape {max_new.shape}")
        self.n, self.spec, self.clock = n, spec, clock
        self.arrival = np.ascontiguousarray(inp.arrival_ps, dtype=np.int64)
        rq = np.zeros((N_FIELDS, n), dtype=np.int64)
        rq[PROMPT] = inp.prompt
        rq[LIMIT] = inp.output
        rq[MAX_NEW] = np.asarray(max_new, dtype=np.int64)
        rq[ADMIT:FINISH + 1] = -1
        self.rq = rq
        pages = int(spec.blocks) * BLOCK_TOKENS // int(cfg.page_size)
        sc = np.zeros(N_SCALARS, dtype=np.int64)
        sc[FREE] = sc[PAGES] = pages
        sc[PAGE_SIZE] = int(cfg.page_size)
        sc[LEFT] = n
        self.sc = sc
        self.q = np.zeros(max(n, 1), dtype=np.int64)
        self.run = np.zeros(max(n, 1), dtype=np.int64)
        self.sj = np.zeros(max(n, 1), dtype=np.int64)
        self.sk = np.zeros(max(n, 1), dtype=np.int64)
        self.c = clock_constants(clock)
        self.wide = np.zeros(9, dtype=np.int64)

    def output(self, engine: str, overadmit: str) -> EngineOutput:
        """The :class:`EngineOutput` after the kernel ran, or the reference engine's error:
        ``overadmit`` is the message of the engine's AssertionError (``{j}``: the request)."""
        sc, rq = self.sc, self.rq
        err = int(sc[ERR])
        if err == STUCK:
            raise InvariantError(f"{engine}: waiting requests but nothing running and nothing admissible")
        if err == CLOCK:
            raise ClockLimitError(self.clock.config.name, self.n, "the clock passed it before the queue drained")
        if err == OVERADMIT:
            raise AssertionError(overadmit.format(j=int(sc[ERR_J])))
        if err == RANGE:
            raise ValueError("prompt/output: a step's attention pairs or an integral outside the compiled presets' "
                             "exact integer range (use implementation='reference')")
        out = EngineOutput.empty(self.n)
        out.admit_ps[:], out.first_token_ps[:], out.finish_ps[:] = rq[ADMIT], rq[FIRST], rq[FINISH]
        out.preemptions[:], out.recomputed_tokens[:] = rq[PREEMPTIONS], rq[RECOMPUTED]
        out.final_cap_tokens[:], out.generated[:] = rq[FINAL_CAP], rq[GEN_OUT]
        out.steps, out.prefill_steps, out.busy_ps = int(sc[STEPS]), int(sc[PREFILL_STEPS]), int(sc[BUSY])
        out.resident_integral = _wide(self.wide, W_RESIDENT)
        out.decode_batch_integral, out.decode_ps = _wide(self.wide, W_DBATCH), int(sc[DECODE_PS])
        out.kv_integral = _wide(self.wide, W_KV) // BLOCK_TOKENS  # 16-token blocks x ps
        out.end_ps = int(sc[T])
        out.peak_blocks = -(-int(sc[PEAK]) // BLOCK_TOKENS)
        used_tokens = (int(sc[PAGES]) - int(sc[FREE])) * int(sc[PAGE_SIZE])
        out.free_blocks_end = int(self.spec.blocks) - (-(-used_tokens // BLOCK_TOKENS))
        return out


def _wide(w: np.ndarray, base: int) -> int:
    """The exact integer in limbs ``w[base:base+3]`` (:func:`kvdro.sim._engine_kernels._addmul`)."""
    return (int(w[base + 2]) << 60) + (int(w[base + 1]) << 30) + int(w[base])
