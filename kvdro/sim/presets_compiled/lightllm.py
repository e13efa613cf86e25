"""``lightllm`` compiled: the rules of :mod:`kvdro.sim.engines.lightllm` as numba functions.

One njit function per rule of the reference module, under its name, over the arrays of
:mod:`kvdro.sim.presets_compiled.engine_state`; :func:`_loop` is :func:`kvdro.sim.engine_presets._loop`
with these rules, :func:`run` the wrapper with :func:`~kvdro.sim.engine_presets.run_preset`'s
signature and result. Two things are kept instead of recomputed: the number of paused requests in
the waiting queue (``ls[PAUSED]``: a request enters the queue with tokens generated only when it is
paused, and none changes while it waits), and the order of the running batch's pairs by ``b``
(descending) from one :func:`generate_new_batch` to the next, re-sorted by insertion; each
candidate's pair is inserted in place (the peak does not depend on the order among equal ``b``).
The kernels allocate nothing (compiled without numba's reference counting, as
:mod:`~kvdro.sim.presets_compiled.engine_state` says).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvdro.sim.presets_compiled.engine_state import (
    COMPUTED, ERR, ERR_J, FREE, GENERATED, LEFT, MAX_NEW, NPRE, NRUN, NSCHED, NXT, OK, OVERADMIT, PAGE_SIZE, PAGES,
    PROMPT, QLEN, RUNNING, T, Kernel, allocate, end_step, evict, idle, num_tokens, pages_needed,
    pop_front, push_back, push_front, queue_at, run_append, run_pop)
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import StepClock

__all__ = ["run", "PRESETS"]

#: The presets this module runs.
PRESETS = ("lightllm",)

# LightLLM's own scalars (``ls``): a decode step is next; paused requests in the waiting queue; length of ``order``
DECODE_NEXT, PAUSED, NORDER = range(3)


@njit(cache=True, inline="always", _nrt=False)
def on_arrival(q, sc, j):
    """:func:`kvdro.sim.engines.lightllm.on_arrival`."""
    push_back(q, sc, j)


@njit(cache=True, inline="always", _nrt=False)
def is_busy(sc, router_token_ratio):
    """:func:`kvdro.sim.engines.lightllm.is_busy`."""
    return (sc[PAGES] - sc[FREE]) / sc[PAGES] >= router_token_ratio


@njit(cache=True, inline="always", _nrt=False)
def tuple_tokens(rq, j, busy, router_max_new_token_len, added_output_len):
    """:func:`kvdro.sim.engines.lightllm.tuple_tokens`: (a, b)."""
    out = rq[GENERATED, j]
    if busy:
        cur_max_new = rq[MAX_NEW, j]
    else:
        cur_max_new = min(rq[MAX_NEW, j], max(int(1.1 * out), router_max_new_token_len))
    a = max(rq[PROMPT, j] + out + 1, rq[COMPUTED, j] + 1)
    b = max(0, cur_max_new - out - 1) + added_output_len
    return a, b


@njit(cache=True, inline="always", _nrt=False)
def can_add_new_req(rq, sc, ca, cb, m, j, busy, prefill_tokens, paused, batch_max_tokens, running_max_req_size,
                    router_max_new_token_len, added_output_len):
    """:func:`kvdro.sim.engines.lightllm.can_add_new_req`: the cache is its ``m`` pairs ``(ca, cb)``, sorted
    by ``cb`` descending; ``j``'s pair goes in after those with ``b`` >= its own. Returns (ok, prefill tokens)."""
    a, b = tuple_tokens(rq, j, busy, router_max_new_token_len, added_output_len)
    p = m
    while p > 0 and cb[p - 1] < b:
        ca[p] = ca[p - 1]
        cb[p] = cb[p - 1]
        p -= 1
    ca[p] = a
    cb[p] = b
    size = m + 1
    need = 0
    a_cum = 0
    for k in range(size):
        a_cum += ca[k]
        v = cb[k] * (k + 1) + a_cum
        if k == 0 or v > need:
            need = v
    ok_token = need < sc[PAGES] * sc[PAGE_SIZE]
    ok_req = size + paused - (1 if rq[COMPUTED, j] == 0 and rq[GENERATED, j] > 0 else 0) <= running_max_req_size
    prefill_tokens += num_tokens(rq, j)
    ok_prefill = prefill_tokens <= batch_max_tokens
    return ok_token and ok_req and ok_prefill, prefill_tokens


@njit(cache=True, inline="always", _nrt=False)
def _running_pairs(rq, sc, run, ls, order, mark, ca, cb, busy, router_max_new_token_len, added_output_len):
    """:func:`kvdro.sim.engines.lightllm.generate_new_batch`'s cache of the running batch's pairs, sorted by
    ``b`` descending into ``(ca, cb)``: ``order`` (``mark[j]``: j is in it) is the last call's order without
    the requests that left, the newly running at its end, re-sorted by insertion (nearly sorted already)."""
    m = 0
    for i in range(ls[NORDER]):
        j = order[i]
        if rq[RUNNING, j] == 1:
            order[m] = j
            m += 1
        else:
            mark[j] = 0
    for i in range(sc[NRUN]):
        j = run[i]
        if mark[j] == 0:
            mark[j] = 1
            order[m] = j
            m += 1
    ls[NORDER] = m
    for i in range(m):
        j = order[i]
        a, b = tuple_tokens(rq, j, busy, router_max_new_token_len, added_output_len)
        p = i
        while p > 0 and cb[p - 1] < b:
            ca[p] = ca[p - 1]
            cb[p] = cb[p - 1]
            order[p] = order[p - 1]
            p -= 1
        ca[p] = a
        cb[p] = b
        order[p] = j


@njit(cache=True, inline="always", _nrt=False)
def generate_new_batch(rq, sc, q, run, ls, order, mark, ca, cb, running_max_req_size, batch_max_tokens,
                       router_token_ratio, router_max_new_token_len, added_output_len):
    """:func:`kvdro.sim.engines.lightllm.generate_new_batch`: the new batch is the front of the waiting
    queue; returns its length."""
    paused = ls[PAUSED]
    nrun = sc[NRUN]
    if sc[QLEN] == 0 or nrun + paused >= running_max_req_size:
        return 0
    busy = is_busy(sc, router_token_ratio)
    _running_pairs(rq, sc, run, ls, order, mark, ca, cb, busy, router_max_new_token_len, added_output_len)
    count = 0
    prefill = 0
    for i in range(sc[QLEN]):
        j = queue_at(q, sc, i)
        ok, prefill = can_add_new_req(rq, sc, ca, cb, nrun + count, j, busy, prefill, paused, batch_max_tokens,
                                      running_max_req_size, router_max_new_token_len, added_output_len)
        if not ok:
            break
        count += 1
    return count


@njit(cache=True, inline="always", _nrt=False)
def can_decode(rq, sc, run):
    """:func:`kvdro.sim.engines.lightllm.can_decode`."""
    need = 0
    for i in range(sc[NRUN]):
        j = run[i]
        need += pages_needed(rq, sc, j, rq[COMPUTED, j] + 1)
    return need <= sc[FREE]


@njit(cache=True, inline="always", _nrt=False)
def schedule(rq, sc, q, run, ls, order, mark, ca, cb, sj, sk, running_max_req_size, batch_max_tokens,
             router_token_ratio, router_max_new_token_len, added_output_len):
    """:func:`kvdro.sim.engines.lightllm.schedule`: the step in ``sj``/``sk`` (``sc[NSCHED]`` entries)."""
    sc[NPRE] = 0
    sc[NSCHED] = 0
    if ls[DECODE_NEXT] == 0:
        count = generate_new_batch(rq, sc, q, run, ls, order, mark, ca, cb, running_max_req_size, batch_max_tokens,
                                   router_token_ratio, router_max_new_token_len, added_output_len)
        if count > 0:
            for i in range(count):
                j = pop_front(q, sc)
                if rq[GENERATED, j] > 0:
                    ls[PAUSED] -= 1
                if not allocate(rq, sc, j, num_tokens(rq, j)):
                    sc[ERR] = OVERADMIT
                    sc[ERR_J] = j
                    return
                run_append(rq, sc, run, j)
                sj[i] = j
                sk[i] = num_tokens(rq, j)
            sc[NSCHED] = count
            ls[DECODE_NEXT] = 1
            return
    ls[DECODE_NEXT] = 0
    while not can_decode(rq, sc, run):  # select_paused_reqs with Fcfs: the newest first, to the queue's front
        j = run_pop(rq, sc, run)
        evict(rq, sc, j)
        push_front(q, sc, j)
        if rq[GENERATED, j] > 0:
            ls[PAUSED] += 1
        sc[NPRE] += 1
    for i in range(sc[NRUN]):
        j = run[i]
        allocate(rq, sc, j, rq[COMPUTED, j] + 1)
        sj[i] = j
        sk[i] = 1
    sc[NSCHED] = sc[NRUN]


@njit(cache=True, _nrt=False)
def _loop(arrival, rq, sc, q, run, ls, order, mark, ca, cb, sj, sk, c, wide, running_max_req_size, batch_max_tokens,
          router_token_ratio, router_max_new_token_len, added_output_len):
    """:func:`kvdro.sim.engine_presets._loop` with LightLLM's rules; ``sc[ERR]`` says how it ended."""
    n = arrival.size
    while sc[LEFT] > 0 and sc[ERR] == OK:
        while sc[NXT] < n and arrival[sc[NXT]] <= sc[T]:
            on_arrival(q, sc, sc[NXT])
            sc[NXT] += 1
        if sc[QLEN] == 0 and sc[NRUN] == 0:
            idle(arrival, sc)
            continue
        schedule(rq, sc, q, run, ls, order, mark, ca, cb, sj, sk, running_max_req_size, batch_max_tokens,
                 router_token_ratio, router_max_new_token_len, added_output_len)
        if sc[ERR] != OK:
            break
        end_step(arrival, rq, sc, run, sj, sk, c, wide)


def run(engine: str, cfg, spec: EngineSpec, inp: EngineInput, max_new: np.ndarray, clock: StepClock, *,
        window: int) -> EngineOutput:
    """:func:`kvdro.sim.engine_presets.run_preset` for ``lightllm``, compiled: the same
    :class:`EngineOutput` (``trace`` None) and errors."""
    k = Kernel(engine, PRESETS, cfg, spec, inp, max_new, clock)
    size = k.run.size + 1  # the running batch and the new batch's pairs, with one candidate
    ca, cb = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    batch_max_tokens = int(window) if cfg.batch_max_tokens is None else int(cfg.batch_max_tokens)
    ls, order, mark = np.zeros(3, dtype=np.int64), np.zeros_like(k.run), np.zeros_like(k.run)
    _loop(k.arrival, k.rq, k.sc, k.q, k.run, ls, order, mark, ca, cb, k.sj, k.sk, k.c, k.wide,
          int(cfg.running_max_req_size), batch_max_tokens, float(cfg.router_token_ratio),
          int(cfg.router_max_new_token_len), int(cfg.added_output_len))
    return k.output(engine, "lightllm: admitted a prompt beyond the free token slots")
