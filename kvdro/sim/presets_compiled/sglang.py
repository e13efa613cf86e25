"""The ``sglang`` preset compiled: :mod:`kvdro.sim.engines.sglang`'s rules over flat arrays.

The same engine as :func:`kvdro.sim.engine_presets.run_preset` with ``engine="sglang"`` -- the
same loop, the same rules, the same integers and the same float operations in the same order --
so every admission, chunk, retraction and step duration is the reference's, integer for integer
(``tests/test_presets_compiled_sglang.py``). Each rule function of the reference has one numba
counterpart here with its name; the data structures are flat:

* the per-request state of :class:`~kvdro.sim.engines.state.EngineState` (prompt, limit,
  max_new, generated, computed, pages held, preemptions, recomputed tokens, in the running batch)
  is one int64 array ``R`` of rows (``R[GEN, j]``); the engine's scalars (free pages, the queues'
  heads and lengths, the chunked request, ``batch_is_full``, the knobs, the ``PrefillAdder``'s
  integer budgets) an int64 vector ``s``, its floats (``new_token_ratio``, its constants, the
  adder's ``rem_total_token_offset``) a float64 vector ``f``;
* the queues are the rows of one int64 array ``Q``: the waiting queue a ring buffer (arrivals and
  retracted requests join its tail, admission takes its head: what ``PrefillAdder`` admits is
  always a prefix of the queue), the running batch in admission order, a step's ``scheduled`` map
  (requests, new tokens) in insertion order. Few arrays, because every array passed to a numba
  function that is not inlined costs an atomic reference-count increment and decrement per call,
  which dominated the run when the queues were seven arrays;
* the new-token ratio's float arithmetic is the reference's: ``rem_total_token_offset`` is Python's
  built-in ``sum`` of ``remaining x ratio`` over the running batch in its order (:func:`python_sum`:
  plain left-to-right addition up to Python 3.11, CPython's Neumaier-compensated sum from 3.12),
  then each admitted request's ``extend + max_new`` added to it; the budgets are compared as the
  reference compares them (every token count below 2**53, so int-to-float conversions are exact);
* the integrals that can outgrow int64 (resident and decode-batch request x ps, KV tokens x ps) are
  accumulated exactly in three 30-bit limbs (:func:`kvdro.sim._engine_kernels._addmul`) and returned
  as Python ints; the step clock is :func:`kvdro.sim.presets_compiled.clock.step_ps`.

The kernel runs as plain Python under ``NUMBA_DISABLE_JIT=1`` (same results, slowly).
"""

from __future__ import annotations

import math
import sys

import numpy as np
from numba import njit

from kvdro.hardware import BLOCK_TOKENS
from kvdro.sim._engine_kernels import _addmul
from kvdro.sim.envelope import check_inputs
from kvdro.sim.invariants import InvariantError
from kvdro.sim.presets_compiled.clock import clock_constants, step_ps
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock

__all__ = ["run"]

# rows of the per-request array R
PROMPT, LIMIT, MAX_NEW, GEN, COMP, HELD, PREEMPT, RECOMP, RUNNING = range(9)
N_ROWS = 9
# the integer scalars s: the pool, the queues, the engine's flags, the knobs, the PrefillAdder's budgets
(FREE, PAGE, W_HEAD, W_LEN, N_RUN, CHUNKED, FULL, N_SCHED, CLIP, CHUNK_SIZE, MAX_PREFILL, MAX_RUNNING,
 RETRACT_STEPS, COMPENSATED, CUR_OFF, REM_INPUT, REM_CHUNK, NEW_CHUNKED, POOL, SHRANK, LAST_PREFILL) = range(21)
N_SCALARS = 21
# the float vector f: its scalars, then the terms of the PrefillAdder's sum (one per running request)
RATIO, INIT_RATIO, MIN_RATIO, DECAY, TOTAL_OFF, TERMS = range(6)
# rows of the queue array Q: the waiting ring buffer, the running batch, the step's requests and tokens,
# retract_decode's order, the requests finished by a step
WAITING_Q, RUNNING_Q, STEP_J, STEP_K, ORDER, DONE = range(6)
N_QUEUES = 6
# AddReqResult
CONTINUE, NO_TOKEN, OTHER = range(3)
# the kernel's return codes
OK, STUCK, CLOCK, RANGE, ADMIT_OVERDRAW, DECODE_SLOT = range(6)
# the totals vector
STEPS, PREFILL_STEPS, BUSY, DECODE_PS, END, PEAK_TOKENS = range(6)
# the wide integrals (three 30-bit limbs each)
RESIDENT, DBATCH, KVI = 0, 3, 6


#: The small helpers called per request and step are inlined into their callers (numba IR): a call
#: passing arrays costs more than such a body (the conversation trace runs 4x faster inlined).
_inline = njit(cache=True, inline="always")


# -- EngineState ------------------------------------------------------------------------------
@_inline
def num_tokens(R, j):
    """:meth:`EngineState.num_tokens`."""
    return R[PROMPT, j] + R[GEN, j]


@_inline
def pages_for(s, tokens):
    """:meth:`EngineState.pages_for`: ``ceil(tokens / page_size)`` (no division for SGLang's default
    page of one token slot)."""
    page = s[PAGE]
    return tokens if page == 1 else -(-tokens // page)


@_inline
def pages_needed(R, s, j, tokens):
    """:meth:`EngineState.pages_needed`."""
    return max(0, pages_for(s, tokens) - R[HELD, j])


@_inline
def allocate(R, s, j, tokens):
    """:meth:`EngineState.allocate` (no prefix cache)."""
    need = pages_needed(R, s, j, tokens)
    if need > s[FREE]:
        return False
    s[FREE] -= need
    R[HELD, j] += need
    return True


@_inline
def release(R, s, j):
    """:meth:`EngineState.release`."""
    s[FREE] += R[HELD, j]
    R[HELD, j] = 0


@njit(cache=True)
def evict(R, s, j):
    """:meth:`EngineState.evict` (no prefix cache)."""
    R[PREEMPT, j] += 1
    R[RECOMP, j] += R[COMP, j]
    release(R, s, j)
    R[COMP, j] = 0


# -- the queues -------------------------------------------------------------------------------
@_inline
def waiting_append(s, Q, j):
    """``waiting.append(j)``: the tail of the ring buffer."""
    Q[WAITING_Q, (s[W_HEAD] + s[W_LEN]) % Q.shape[1]] = j
    s[W_LEN] += 1


@_inline
def waiting_popleft(s, Q):
    """``waiting.popleft()``."""
    j = Q[WAITING_Q, s[W_HEAD]]
    s[W_HEAD] = (s[W_HEAD] + 1) % Q.shape[1]
    s[W_LEN] -= 1
    return j


@_inline
def running_append(R, s, Q, j):
    """``running.append(j)``."""
    Q[RUNNING_Q, s[N_RUN]] = j
    s[N_RUN] += 1
    R[RUNNING, j] = 1


@njit(cache=True)
def running_keep(R, s, Q):
    """``running[:] = [j for j in running if j still runs]``: drop the requests whose RUNNING flag
    was cleared, keeping the others' order."""
    k = 0
    for i in range(s[N_RUN]):
        j = Q[RUNNING_Q, i]
        if R[RUNNING, j]:
            Q[RUNNING_Q, k] = j
            k += 1
    s[N_RUN] = k


@_inline
def schedule_push(s, Q, j, k):
    """``step.scheduled[j] = k`` (a new key: every request is scheduled once per step)."""
    Q[STEP_J, s[N_SCHED]] = j
    Q[STEP_K, s[N_SCHED]] = k
    s[N_SCHED] += 1


@njit(cache=True)
def python_sum(x, start, n, compensated):
    """Python's built-in ``sum`` of the floats ``x[start:start + n]`` from its int start 0, operation
    by operation (CPython ``builtin_sum_impl``): the first term is ``0 + x[start]``; then plain
    left-to-right addition (Python <= 3.11) or Neumaier's compensated addition with the compensation
    added at the end when nonzero and finite (Python >= 3.12). An empty sum is 0."""
    if n == 0:
        return 0.0
    total = 0.0 + x[start]
    c = 0.0
    for i in range(start + 1, start + n):
        if not compensated:
            total = total + x[i]
            continue
        t = total + x[i]
        if abs(total) >= abs(x[i]):
            c += (total - t) + x[i]
        else:
            c += (x[i] - t) + total
        total = t
    if compensated and c != 0.0 and math.isfinite(c):
        total += c
    return total


# -- PrefillAdder -----------------------------------------------------------------------------
@njit(cache=True)
def prefill_adder(R, s, f, Q):
    """:class:`~kvdro.sim.engines.sglang.PrefillAdder` ``__init__``: the pass's budgets, and
    ``rem_total_token_offset`` = sum of ``max(0, min(max_new - generated, clip)) x ratio`` over the
    running batch in its order (its terms in ``f[TERMS:]``)."""
    s[REM_INPUT] = s[MAX_PREFILL]
    s[REM_CHUNK] = s[CHUNK_SIZE]
    ratio = f[RATIO]
    for i in range(s[N_RUN]):
        j = Q[RUNNING_Q, i]
        f[TERMS + i] = max(0, min(R[MAX_NEW, j] - R[GEN, j], s[CLIP])) * ratio
    f[TOTAL_OFF] = python_sum(f, TERMS, s[N_RUN], s[COMPENSATED] != 0)
    s[CUR_OFF] = 0
    s[N_SCHED] = 0
    s[NEW_CHUNKED] = -1


@_inline
def rem_total_tokens(s, f):
    """``PrefillAdder.rem_total_tokens`` [tokens, float]: free slots minus the offset."""
    return s[FREE] * s[PAGE] - f[TOTAL_OFF]


@_inline
def cur_rem_tokens(s):
    """``PrefillAdder.cur_rem_tokens`` [tokens]."""
    return s[FREE] * s[PAGE] - s[CUR_OFF]


@_inline
def ceil_paged(s, tokens):
    """``PrefillAdder._ceil_paged``."""
    return pages_for(s, tokens) * s[PAGE]


@njit(cache=True)
def budget_state(s, f):
    """``PrefillAdder.budget_state``."""
    if rem_total_tokens(s, f) <= 0 or cur_rem_tokens(s) <= 0:
        return NO_TOKEN
    if s[REM_INPUT] <= 0 or s[REM_CHUNK] <= 0:
        return OTHER
    return CONTINUE


@njit(cache=True)
def update_prefill_budget(s, f, extend, max_new_tokens):
    """``PrefillAdder._update_prefill_budget``."""
    extend = ceil_paged(s, extend)
    f[TOTAL_OFF] += extend + max_new_tokens
    s[CUR_OFF] += extend
    s[REM_INPUT] -= extend
    s[REM_CHUNK] -= extend


@njit(cache=True)
def add_chunked_req(R, s, f, Q, j):
    """``PrefillAdder.add_chunked_req``; returns ``j`` if still chunked, else -1."""
    rest = num_tokens(R, j) - R[COMP, j]
    room = min(s[REM_CHUNK], int(rem_total_tokens(s, f)))
    truncated = rest > room
    extend = min(rest, room)
    schedule_push(s, Q, j, extend)
    update_prefill_budget(s, f, extend, 0 if truncated else min(R[MAX_NEW, j], s[CLIP]))
    return j if truncated else -1


@njit(cache=True)
def add_one_req(R, s, f, Q, j):
    """``PrefillAdder.add_one_req``: an AddReqResult."""
    extend = num_tokens(R, j)
    total_tokens = extend + min(R[MAX_NEW, j], s[CLIP])
    input_tokens = ceil_paged(s, extend)
    if total_tokens >= rem_total_tokens(s, f):
        return NO_TOKEN
    if input_tokens > s[REM_INPUT] and s[N_SCHED] > 0:
        return OTHER
    if input_tokens <= s[REM_CHUNK]:
        schedule_push(s, Q, j, extend)
        update_prefill_budget(s, f, extend, min(R[MAX_NEW, j], s[CLIP]))
    else:
        trunc = s[REM_CHUNK] // s[PAGE] * s[PAGE]
        if trunc <= 0:
            return OTHER
        schedule_push(s, Q, j, trunc)
        s[NEW_CHUNKED] = j
        update_prefill_budget(s, f, trunc, 0)
    return budget_state(s, f)


# -- the scheduler's rules --------------------------------------------------------------------
@njit(cache=True)
def on_arrival(s, Q, j):
    """:func:`kvdro.sim.engines.sglang.on_arrival`."""
    waiting_append(s, Q, j)


@njit(cache=True)
def on_idle(s, f):
    """:func:`kvdro.sim.engines.sglang.on_idle`."""
    f[RATIO] = f[INIT_RATIO]
    s[FULL] = 0


@njit(cache=True)
def on_finish(s, n_done, decode):
    """:func:`kvdro.sim.engines.sglang.on_finish`."""
    if n_done > 0:
        s[SHRANK] = 1


@njit(cache=True)
def get_new_batch_prefill(R, s, f, Q):
    """:func:`kvdro.sim.engines.sglang.get_new_batch_prefill`; the step in ``Q[STEP_J]`` and
    ``Q[STEP_K]``. Returns OK or ADMIT_OVERDRAW."""
    s[N_SCHED] = 0
    chunked = s[CHUNKED]
    if (s[FULL] != 0 or s[W_LEN] == 0) and chunked < 0:
        return OK
    if s[N_RUN] >= s[MAX_RUNNING] and chunked < 0:
        s[FULL] = 1
        return OK
    prefill_adder(R, s, f, Q)
    if chunked >= 0:
        chunked = add_chunked_req(R, s, f, Q, chunked)
    for _ in range(s[W_LEN]):  # list(waiting): what is admitted is always the queue's head
        if s[N_SCHED] >= s[MAX_RUNNING] - s[N_RUN]:
            s[FULL] = 1
            break
        j = Q[WAITING_Q, s[W_HEAD]]
        before = s[N_SCHED]
        res = add_one_req(R, s, f, Q, j)
        if s[N_SCHED] > before:  # j in adder.can_run
            waiting_popleft(s, Q)
        if res != CONTINUE:
            if res == NO_TOKEN:
                s[FULL] = 1
            break
    s[CHUNKED] = s[NEW_CHUNKED] if s[NEW_CHUNKED] >= 0 else chunked
    for i in range(s[N_SCHED]):
        j = Q[STEP_J, i]
        if not allocate(R, s, j, R[COMP, j] + Q[STEP_K, i]):
            return ADMIT_OVERDRAW
    for i in range(s[N_SCHED]):  # completed prefills join the running batch (the chunked one stays out)
        j = Q[STEP_J, i]
        if j != s[CHUNKED] and R[RUNNING, j] == 0:
            running_append(R, s, Q, j)
    return OK


@njit(cache=True)
def check_decode_mem(R, s, Q, row, n):
    """:func:`kvdro.sim.engines.sglang.check_decode_mem` over the requests ``Q[row, :n]``."""
    need = 0
    for i in range(n):
        j = Q[row, i]
        need += pages_needed(R, s, j, R[COMP, j] + 1)
    return need <= s[FREE]


@njit(cache=True)
def _retract_before(R, a, b):
    """``a`` sorts before ``b`` in ``retract_decode``'s descending order: more generated tokens, or
    as many and a shorter prompt."""
    return R[GEN, a] > R[GEN, b] or (R[GEN, a] == R[GEN, b] and R[PROMPT, a] < R[PROMPT, b])


@njit(cache=True)
def retract_decode(R, s, f, Q):
    """:func:`kvdro.sim.engines.sglang.retract_decode`: retracts (to the waiting queue's tail, in
    retraction order) and returns the number retracted; the new ratio in ``f[RATIO]``."""
    m = s[N_RUN]
    for i in range(m):  # sorted(running, key=(generated, -prompt), reverse=True): a stable insertion sort
        j = Q[RUNNING_Q, i]
        p = i
        while p > 0 and _retract_before(R, j, Q[ORDER, p - 1]):
            Q[ORDER, p] = Q[ORDER, p - 1]
            p -= 1
        Q[ORDER, p] = j
    need = 0
    for i in range(m):
        j = Q[ORDER, i]
        need += pages_needed(R, s, j, R[COMP, j] + 1)
    size = m
    first = True
    while first or not need <= s[FREE]:  # check_decode_mem(order): the evicted request's pages leave `need`
        if size == 1:
            break
        first = False
        size -= 1
        j = Q[ORDER, size]
        need -= pages_needed(R, s, j, R[COMP, j] + 1)
        evict(R, s, j)
        R[RUNNING, j] = 0
        waiting_append(s, Q, j)
    running_keep(R, s, Q)
    decoded = 0
    max_new = 0
    for i in range(s[N_RUN]):
        j = Q[RUNNING_Q, i]
        decoded += R[GEN, j]
        max_new += R[MAX_NEW, j]
    f[RATIO] = min(1.0, (decoded + s[RETRACT_STEPS] * s[N_RUN]) / max_new)
    return m - size


@njit(cache=True)
def update_running_batch(R, s, f, Q):
    """:func:`kvdro.sim.engines.sglang.update_running_batch`; the step in ``Q[STEP_J]`` and
    ``Q[STEP_K]``. Returns (code, requests retracted)."""
    s[N_SCHED] = 0
    retracted = 0
    if not check_decode_mem(R, s, Q, RUNNING_Q, s[N_RUN]):
        retracted = retract_decode(R, s, f, Q)
        s[FULL] = 0
    else:
        f[RATIO] = max(f[RATIO] - f[DECAY], f[MIN_RATIO])
    for i in range(s[N_RUN]):
        j = Q[RUNNING_Q, i]
        if not allocate(R, s, j, R[COMP, j] + 1):
            return DECODE_SLOT, retracted
        schedule_push(s, Q, j, 1)
    return OK, retracted


@njit(cache=True)
def schedule(R, s, f, Q):
    """:func:`kvdro.sim.engines.sglang.schedule`: a prefill step if anything is admitted, else a
    decode step; returns (code, requests retracted)."""
    shrank = s[SHRANK]
    last_prefill = s[LAST_PREFILL]
    s[SHRANK] = 0
    s[LAST_PREFILL] = 0
    if last_prefill != 0 and (shrank != 0 or s[CHUNKED] >= 0):
        s[FULL] = 0
    code = get_new_batch_prefill(R, s, f, Q)
    if code != OK:
        return code, 0
    if s[N_SCHED] > 0:
        s[LAST_PREFILL] = 1
        return code, 0
    if shrank != 0 and last_prefill == 0:
        s[FULL] = 0
    if s[N_RUN] == 0:
        return code, 0
    return update_running_batch(R, s, f, Q)


# -- the engine loop --------------------------------------------------------------------------
@njit(cache=True)
def _loop(arrival, R, s, f, c, admit, first, finish, final_cap, generated, totals, wide):
    """:func:`kvdro.sim.engine_presets._loop` with ``run_preset``'s per-step accounting (its
    ``on_step``); the per-request outputs, ``totals`` and ``wide`` filled in place. A return code."""
    n = arrival.size
    m = max(n, 1)
    Q = np.zeros((N_QUEUES, m), np.int64)
    t = 0
    nxt = 0
    left = n
    empty_in_a_row = 0
    ok = True
    while left:
        while nxt < n and arrival[nxt] <= t:
            on_arrival(s, Q, nxt)
            nxt += 1
        if s[W_LEN] == 0 and s[N_RUN] == 0 and s[CHUNKED] < 0:
            on_idle(s, f)
            t = max(t, arrival[nxt])
            continue
        code, retracted = schedule(R, s, f, Q)
        if code != OK:
            return code
        n_sched = s[N_SCHED]
        if n_sched == 0:  # an empty step lasts 0 ps
            if retracted > 0:
                continue
            empty_in_a_row += 1
            if empty_in_a_row < 2:
                continue
            if nxt >= n:
                return STUCK
            t = max(t, arrival[nxt])
            empty_in_a_row = 0
            continue
        empty_in_a_row = 0
        pre = pairs = dec = ctx = chunks = kv = 0
        for i in range(n_sched):
            j = Q[STEP_J, i]
            k = Q[STEP_K, i]
            cj = R[COMP, j]
            if k == 1 and R[GEN, j] >= 1 and cj + 1 == num_tokens(R, j):
                dec += 1
                ctx += cj + 1
            else:
                pre += k
                pairs += (cj + k) * (cj + k) - cj * cj
                chunks += 1
                kv += cj + k
        dur = step_ps(c, pre, pairs, dec, ctx, chunks, kv)
        t += dur
        if dur != 0 and t >= MAX_CLOCK_PS:  # run_preset's on_step: the drain limit
            return CLOCK
        n_done = 0
        for i in range(n_sched):  # the step's tokens, and on_step's admission and first-token times
            j = Q[STEP_J, i]
            R[COMP, j] += Q[STEP_K, i]
            if R[COMP, j] == num_tokens(R, j):
                R[GEN, j] += 1
                if R[GEN, j] == R[LIMIT, j]:
                    Q[DONE, n_done] = j
                    n_done += 1
            if dur != 0:
                if admit[j] < 0:
                    admit[j] = t - dur
                if R[GEN, j] >= 1 and first[j] < 0:
                    first[j] = t
        if dur != 0:  # the rest of on_step
            used = (s[POOL] - s[FREE]) * s[PAGE]  # tokens of slots in use
            totals[STEPS] += 1
            totals[BUSY] += dur
            ok &= _addmul(wide, RESIDENT, s[N_RUN], dur)
            ok &= _addmul(wide, KVI, used, dur)
            totals[PEAK_TOKENS] = max(totals[PEAK_TOKENS], used)
            if pre == 0:
                ok &= _addmul(wide, DBATCH, n_sched, dur)
                totals[DECODE_PS] += dur
            else:
                totals[PREFILL_STEPS] += 1
            for i in range(n_done):
                j = Q[DONE, i]
                finish[j] = t
                final_cap[j] = R[HELD, j] * s[PAGE]
                generated[j] = R[GEN, j]
            if not ok:
                return RANGE
        if n_done > 0:
            for i in range(n_done):
                R[RUNNING, Q[DONE, i]] = 0
            running_keep(R, s, Q)
            for i in range(n_done):
                release(R, s, Q[DONE, i])
            left -= n_done
            on_finish(s, n_done, pre == 0)
    totals[END] = t
    return OK


def _wide(limbs: np.ndarray) -> int:
    """The Python int of three 30-bit limbs (:func:`kvdro.sim._engine_kernels._addmul`)."""
    return (int(limbs[2]) << 60) + (int(limbs[1]) << 30) + int(limbs[0])


def run(engine: str, cfg, spec: EngineSpec, inp: EngineInput, max_new: np.ndarray, clock: StepClock, *,
        window: int) -> EngineOutput:
    """:func:`kvdro.sim.engine_presets.run_preset` for ``engine="sglang"`` (knobs ``cfg``, a
    :class:`kvdro.sim.engines.sglang.Config`), compiled: the same
    :class:`~kvdro.sim.scheduler.EngineOutput`, integer for integer (``trace`` None), and the same
    errors. ``window`` [tokens] is accepted for the common signature (SGLang's rules do not read it)."""
    if engine != "sglang":
        raise ValueError(f"engine: this module runs the 'sglang' preset, got {engine!r}")
    check_inputs(inp)
    n = len(inp)
    mn = np.asarray(max_new)
    if mn.shape != (n,):
        raise ValueError(f"max_new: one max_new_tokens per request expected ({n}), got shape {mn.shape}")
    page = int(cfg.page_size)
    R = np.zeros((N_ROWS, n), np.int64)
    R[PROMPT] = inp.prompt
    R[LIMIT] = inp.output
    R[MAX_NEW] = mn.astype(np.int64)
    s = np.zeros(N_SCALARS, np.int64)
    s[POOL] = s[FREE] = spec.blocks * BLOCK_TOKENS // page
    s[PAGE] = page
    s[CHUNKED] = -1
    s[NEW_CHUNKED] = -1
    s[CLIP] = cfg.clip_max_new_tokens
    s[CHUNK_SIZE] = cfg.chunked_prefill_size
    s[MAX_PREFILL] = cfg.max_prefill_tokens
    s[MAX_RUNNING] = cfg.max_running_requests
    s[RETRACT_STEPS] = cfg.retract_decode_steps
    s[COMPENSATED] = sys.version_info >= (3, 12)  # builtin sum() of floats: Neumaier's since 3.12
    f = np.zeros(TERMS + max(n, 1))
    f[RATIO] = f[INIT_RATIO] = cfg.init_ratio
    f[MIN_RATIO] = cfg.min_ratio
    f[DECAY] = cfg.decay
    out = EngineOutput.empty(n)
    totals = np.zeros(6, np.int64)
    wide = np.zeros(9, np.int64)
    code = _loop(np.ascontiguousarray(inp.arrival_ps, dtype=np.int64), R, s, f, clock_constants(clock),
                 out.admit_ps, out.first_token_ps, out.finish_ps, out.final_cap_tokens, out.generated, totals, wide)
    if code == STUCK:
        raise InvariantError(f"{engine}: waiting requests but nothing running and nothing admissible")
    if code == CLOCK:
        raise ClockLimitError(clock.config.name, n, "the clock passed it before the queue drained")
    if code == ADMIT_OVERDRAW:
        raise AssertionError("sglang: PrefillAdder admitted more tokens than the pool holds")
    if code == DECODE_SLOT:
        raise AssertionError("sglang: a decode slot is missing after check_decode_mem")
    if code == RANGE:
        raise ValueError("clock: a step longer than 2**61 ps is outside the compiled engine's exact integer range")
    out.preemptions[:] = R[PREEMPT]
    out.recomputed_tokens[:] = R[RECOMP]
    out.steps, out.prefill_steps, out.busy_ps = int(totals[STEPS]), int(totals[PREFILL_STEPS]), int(totals[BUSY])
    out.resident_integral = _wide(wide[RESIDENT:RESIDENT + 3])
    out.kv_integral = _wide(wide[KVI:KVI + 3]) // BLOCK_TOKENS  # 16-token blocks x ps
    out.decode_batch_integral, out.decode_ps = _wide(wide[DBATCH:DBATCH + 3]), int(totals[DECODE_PS])
    out.end_ps = int(totals[END])
    out.peak_blocks = -(-int(totals[PEAK_TOKENS]) // BLOCK_TOKENS)
    out.free_blocks_end = spec.blocks - (-(-(int(s[POOL]) - int(s[FREE])) * page // BLOCK_TOKENS))
    out.trace = None
    return out
