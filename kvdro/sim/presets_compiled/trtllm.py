"""``trtllm-gne`` and ``trtllm-maxutil`` compiled: the rules of :mod:`kvdro.sim.engines.trtllm` as numba functions.

One njit function per rule of the reference module, under its name, over the arrays of
:mod:`kvdro.sim.presets_compiled.engine_state`; :func:`_loop` is :func:`kvdro.sim.engine_presets._loop`
with these rules, :func:`run` the wrapper with :func:`~kvdro.sim.engine_presets.run_preset`'s
signature and result. The waiting queue and the running batch are both kept in arrival (index)
order, as the reference keeps them (``bisect.insort``); the requests a step admits are always the
front of the waiting queue (both capacity policies walk it in order and stop at the first that does
not fit, and the micro batch is a prefix of their candidates).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvdro.sim.presets_compiled.engine_state import (
    COMPUTED, ERR, ERR_J, FREE, HELD, MAX_NEW, NPRE, NRUN, NSCHED, NXT, LEFT, OK, OVERADMIT, PROMPT, QLEN, RUNNING, T,
    Kernel, allocate, end_step, evict, idle, num_tokens, pages_for, pages_needed, pop_front, push_back, queue_at,
    queue_insort, run_insort, run_pop)
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import StepClock

__all__ = ["run", "PRESETS"]

#: The presets this module runs.
PRESETS = ("trtllm-gne", "trtllm-maxutil")

_GNE, _MAX_UTILIZATION = 0, 1  # capacity_scheduler_policy


@njit(cache=True, inline="always", _nrt=False)
def on_arrival(q, sc, j):
    """:func:`kvdro.sim.engines.trtllm.on_arrival`."""
    push_back(q, sc, j)


@njit(cache=True, inline="always", _nrt=False)
def _remaining_blocks_to_completion(rq, sc, j):
    """:func:`kvdro.sim.engines.trtllm._remaining_blocks_to_completion`."""
    return max(0, pages_for(sc, rq[PROMPT, j] + rq[MAX_NEW, j]) - rq[HELD, j])


@njit(cache=True, inline="always", _nrt=False)
def _needed_blocks_one_step(rq, sc, j):
    """:func:`kvdro.sim.engines.trtllm._needed_blocks_one_step`."""
    return pages_needed(rq, sc, j, num_tokens(rq, j))


@njit(cache=True, inline="always", _nrt=False)
def guaranteed_no_evict(rq, sc, q, run, cand, max_batch_size):
    """:func:`kvdro.sim.engines.trtllm.guaranteed_no_evict`: the candidates in ``cand``; returns their count."""
    nrun = sc[NRUN]
    m = min(nrun, max_batch_size)
    for i in range(m):
        cand[i] = run[i]
    available = sc[FREE]
    for i in range(nrun):
        available -= _remaining_blocks_to_completion(rq, sc, run[i])
    for i in range(sc[QLEN]):
        if m >= max_batch_size:
            break
        j = queue_at(q, sc, i)
        needed = _remaining_blocks_to_completion(rq, sc, j)
        if needed > available:
            break
        cand[m] = j
        m += 1
        available -= needed
    return m


@njit(cache=True, inline="always", _nrt=False)
def _pause(rq, sc, q, run):
    """:func:`kvdro.sim.engines.trtllm._pause` of the last started request; returns it."""
    j = run_pop(rq, sc, run)
    evict(rq, sc, j)
    queue_insort(q, sc, j)
    return j


@njit(cache=True, inline="always", _nrt=False)
def max_utilization(rq, sc, q, run, cand, max_batch_size):
    """:func:`kvdro.sim.engines.trtllm.max_utilization`: the candidates in ``cand`` (the running batch
    is the reference's ``started``: both lose the paused from their end); returns their count."""
    m = 0
    blocks = 0
    i = 0
    while i < sc[NRUN] and m < max_batch_size:
        j = run[i]
        need = _needed_blocks_one_step(rq, sc, j)
        if blocks + need <= sc[FREE]:
            cand[m] = j
            m += 1
            blocks += need
            i += 1
            continue
        _pause(rq, sc, q, run)
        sc[NPRE] += 1
    if sc[NPRE] == 0:
        for i in range(sc[QLEN]):
            if m >= max_batch_size:
                break
            j = queue_at(q, sc, i)
            need = _needed_blocks_one_step(rq, sc, j)
            if blocks + need > sc[FREE]:
                break
            cand[m] = j
            m += 1
            blocks += need
    return m


@njit(cache=True, inline="always", _nrt=False)
def micro_batch(rq, cand, m, sj, sk, max_num_tokens, tokens_per_block, chunked):
    """:func:`kvdro.sim.engines.trtllm.micro_batch`: request ``sj[i]`` gets ``sk[i]`` tokens; returns the count."""
    budget = max_num_tokens
    ns = 0
    for i in range(m):
        j = cand[i]
        n = num_tokens(rq, j) - rq[COMPUTED, j]
        if n > budget:
            if not chunked or rq[COMPUTED, j] + 1 == num_tokens(rq, j):
                break
            n = budget // tokens_per_block * tokens_per_block
            if n <= 0:
                break
        sj[ns] = j
        sk[ns] = n
        ns += 1
        budget -= n
    return ns


@njit(cache=True, inline="always", _nrt=False)
def schedule(rq, sc, q, run, cand, sj, sk, policy, max_batch_size, max_num_tokens, tokens_per_block, chunked):
    """:func:`kvdro.sim.engines.trtllm.schedule`: the step in ``sj``/``sk`` (``sc[NSCHED]`` entries)."""
    sc[NPRE] = 0
    if policy == _GNE:
        m = guaranteed_no_evict(rq, sc, q, run, cand, max_batch_size)
    else:
        m = max_utilization(rq, sc, q, run, cand, max_batch_size)
    ns = micro_batch(rq, cand, m, sj, sk, max_num_tokens, tokens_per_block, chunked)
    sc[NSCHED] = ns
    for i in range(ns):
        j = sj[i]
        if not allocate(rq, sc, j, rq[COMPUTED, j] + sk[i]):
            sc[ERR] = OVERADMIT
            sc[ERR_J] = j
            return
        if rq[RUNNING, j] == 0:
            pop_front(q, sc)  # == j: the admitted are the front of the queue (module docstring)
            run_insort(rq, sc, run, j)


@njit(cache=True, _nrt=False)
def _loop(arrival, rq, sc, q, run, cand, sj, sk, c, wide, policy, max_batch_size, max_num_tokens, tokens_per_block,
          chunked):
    """:func:`kvdro.sim.engine_presets._loop` with TensorRT-LLM's rules; ``sc[ERR]`` says how it ended."""
    n = arrival.size
    while sc[LEFT] > 0 and sc[ERR] == OK:
        while sc[NXT] < n and arrival[sc[NXT]] <= sc[T]:
            on_arrival(q, sc, sc[NXT])
            sc[NXT] += 1
        if sc[QLEN] == 0 and sc[NRUN] == 0:
            idle(arrival, sc)
            continue
        schedule(rq, sc, q, run, cand, sj, sk, policy, max_batch_size, max_num_tokens, tokens_per_block, chunked)
        if sc[ERR] != OK:
            break
        end_step(arrival, rq, sc, run, sj, sk, c, wide)


def run(engine: str, cfg, spec: EngineSpec, inp: EngineInput, max_new: np.ndarray, clock: StepClock, *,
        window: int) -> EngineOutput:
    """:func:`kvdro.sim.engine_presets.run_preset` for ``trtllm-gne`` / ``trtllm-maxutil`` (the policy is
    ``cfg.capacity_scheduler_policy``), compiled: the same :class:`EngineOutput` (``trace`` None) and errors."""
    k = Kernel(engine, PRESETS, cfg, spec, inp, max_new, clock)
    policy = _GNE if cfg.capacity_scheduler_policy == "GUARANTEED_NO_EVICT" else _MAX_UTILIZATION
    cand = np.zeros_like(k.run)
    _loop(k.arrival, k.rq, k.sc, k.q, k.run, cand, k.sj, k.sk, k.c, k.wide, policy, int(cfg.max_batch_size),
          int(cfg.max_num_tokens), int(cfg.tokens_per_block), bool(cfg.enable_chunked_prefill))
    return k.output(engine, "trtllm: the capacity scheduler admitted request {j} beyond the free blocks")
