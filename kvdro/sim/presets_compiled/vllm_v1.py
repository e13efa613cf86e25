"""``vllm-v1`` compiled: the rules of :mod:`kvdro.sim.engines.vllm_v1` as numba functions.

One njit function per rule of the reference module (and of its free block queue,
:class:`~kvdro.sim.engines.free_queue.FreeBlockQueue`), under its name, over the arrays of
:mod:`kvdro.sim.presets_compiled.engine_state`; :func:`_loop` is :func:`kvdro.sim.engine_presets._loop`
with these rules, :func:`run` the wrapper with :func:`~kvdro.sim.engine_presets.run_preset`'s
signature and result. The waiting queue is the ring of ``engine_state`` (arrivals at the tail,
preempted requests at the front), the running batch its array in admission order.

The prefix cache's free block queue (``enable_prefix_caching``, on by default) is a fixed-size
doubly linked list over the pool's physical blocks, as vLLM's own ``FreeKVCacheBlockQueue`` is:
allocation pops the head, freed blocks join the tail, each block
tagged with the ``(owner, index, epoch)`` of the reference's queue entry. A prefix-cache hit unlinks
the request's blocks from the middle of the list (a preempted request keeps the chain of its freed
blocks from its block 0), where the reference leaves them in its deque and skips them when it pops
them: the same free blocks in the same order, in ``pages + 1`` entries whatever the run. Blocks in
use are interchangeable (a block is re-tagged when it is freed) and wait on a stack. With the
trace's prefix keys (sharing across requests) vLLM v1 runs on its reference engine only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvdro.sim.presets_compiled.engine_state import (
    COMPUTED, FREE, HELD, NPRE, NRUN, NSCHED, NXT, LEFT, OK, ERR, PAGE_SIZE, PAGES, QHEAD, QLEN, RANGE, RECOMPUTED, T,
    Kernel, end_step, idle, num_tokens, pages_needed, pop_front, push_back, push_front, run_append, run_pop)
from kvdro.sim.presets_compiled.engine_state import allocate as allocate_pages
from kvdro.sim.presets_compiled.engine_state import evict as evict_pages
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import StepClock

__all__ = ["run", "PRESETS"]

#: The presets this module runs.
PRESETS = ("vllm-v1",)

# the free block queue: scalars fq, per-request rows fc (FreeBlockQueue's dicts), per-block rows blk
# (column `pages` is the list's sentinel; USED is the stack of blocks in use, FQ_USED of them)
FQ_CACHING, FQ_USED = range(2)
FC_EPOCH, FC_CACHED, FC_CHAIN = range(3)
B_NEXT, B_PREV, B_OWNER, B_INDEX, B_EPOCH, B_CHAIN, B_USED = range(7)


# -- the free block queue (kvdro.sim.engines.free_queue.FreeBlockQueue) ------------------------------
@njit(cache=True, inline="always", _nrt=False)
def _unlink(blk, b):
    """Block ``b`` leaves the free list."""
    p = blk[B_PREV, b]
    q = blk[B_NEXT, b]
    blk[B_NEXT, p] = q
    blk[B_PREV, q] = p


@njit(cache=True, inline="always", _nrt=False)
def _take(fq, blk):
    """The top of the stack of blocks in use (a block to free)."""
    fq[FQ_USED] -= 1
    return blk[B_USED, fq[FQ_USED]]


@njit(cache=True, inline="always", _nrt=False)
def _put(fq, blk, b):
    """Block ``b`` goes on the stack of blocks in use."""
    blk[B_USED, fq[FQ_USED]] = b
    fq[FQ_USED] += 1


@njit(cache=True, inline="always", _nrt=False)
def _append(blk, b, owner, index, epoch):
    """Block ``b`` joins the tail of the free list, tagged (owner, index, epoch)."""
    end = blk.shape[1] - 1  # the sentinel
    tail = blk[B_PREV, end]
    blk[B_NEXT, tail] = b
    blk[B_PREV, b] = tail
    blk[B_NEXT, b] = end
    blk[B_PREV, end] = b
    blk[B_OWNER, b] = owner
    blk[B_INDEX, b] = index
    blk[B_EPOCH, b] = epoch


@njit(cache=True, _nrt=False)
def queue_pop(fq, fc, blk, count):
    """:meth:`FreeBlockQueue.pop`: ``count`` blocks from the head, evicting cached ones."""
    end = blk.shape[1] - 1
    for _ in range(count):
        b = blk[B_NEXT, end]
        _unlink(blk, b)
        _put(fq, blk, b)
        o = blk[B_OWNER, b]
        if o >= 0 and blk[B_EPOCH, b] == fc[FC_EPOCH, o] and blk[B_INDEX, b] < fc[FC_CACHED, o]:
            fc[FC_CACHED, o] = blk[B_INDEX, b]


@njit(cache=True, _nrt=False)
def queue_free(fq, blk, blocks):
    """:meth:`FreeBlockQueue.free`: finished requests' blocks join the tail, untagged."""
    for _ in range(blocks):
        _append(blk, _take(fq, blk), -1, 0, 0)


@njit(cache=True, _nrt=False)
def queue_free_preempted(fq, fc, blk, j, blocks, full_blocks):
    """:meth:`FreeBlockQueue.free_preempted`: ``j``'s blocks join the tail, last block first; the chain
    from its block 0 is kept for a hit."""
    ep = fc[FC_EPOCH, j] + 1
    fc[FC_EPOCH, j] = ep
    fc[FC_CACHED, j] = full_blocks
    later = -1
    for index in range(blocks - 1, -1, -1):
        b = _take(fq, blk)
        _append(blk, b, j, index, ep)
        blk[B_CHAIN, b] = later
        later = b
    fc[FC_CHAIN, j] = later


@njit(cache=True, _nrt=False)
def queue_hit(fq, fc, blk, j, limit):
    """:meth:`FreeBlockQueue.hit`: ``j``'s cached leading blocks (at most ``limit``) out of the free
    list, onto the stack of blocks in use; returns their number."""
    h = min(fc[FC_CACHED, j], limit)
    b = fc[FC_CHAIN, j]
    for _ in range(h):
        _unlink(blk, b)
        _put(fq, blk, b)
        b = blk[B_CHAIN, b]
    fc[FC_CACHED, j] = 0
    return h


# -- the pool with the free queue (kvdro.sim.engines.state.EngineState) ------------------------------
@njit(cache=True, _nrt=False)
def allocate(rq, sc, fq, fc, blk, j, tokens, hit_pages):
    """:meth:`EngineState.allocate` with the free queue (``keep_free`` 0, all vLLM v1 uses)."""
    need = pages_needed(rq, sc, j, tokens)
    if need > sc[FREE]:
        return False
    if fq[FQ_CACHING]:
        if hit_pages:
            queue_hit(fq, fc, blk, j, hit_pages)
            rq[COMPUTED, j] = hit_pages * sc[PAGE_SIZE]
            rq[RECOMPUTED, j] -= rq[COMPUTED, j]
        queue_pop(fq, fc, blk, need - hit_pages)
    return allocate_pages(rq, sc, j, tokens)


@njit(cache=True, _nrt=False)
def evict(rq, sc, fq, fc, blk, j):
    """:meth:`EngineState.evict` with the free queue: the blocks join it, the first full ones cached."""
    if fq[FQ_CACHING]:
        queue_free_preempted(fq, fc, blk, j, rq[HELD, j], rq[COMPUTED, j] // sc[PAGE_SIZE])
    evict_pages(rq, sc, j)


@njit(cache=True, inline="always", _nrt=False)
def release_finished(sc, fq, blk):
    """:meth:`EngineState.release` with the free queue, for the requests a step finished: ``end_step``
    returned their pages to the pool's count; their blocks join the free queue's tail, untagged
    (nothing is allocated in between, and untagged blocks are alike: their order does not matter)."""
    if fq[FQ_CACHING]:
        queue_free(fq, blk, fq[FQ_USED] - (sc[PAGES] - sc[FREE]))


# -- the rules (kvdro.sim.engines.vllm_v1) -----------------------------------------------------------
@njit(cache=True, inline="always", _nrt=False)
def on_arrival(q, sc, j):
    """:func:`kvdro.sim.engines.vllm_v1.on_arrival` (the free queue exists from the start)."""
    push_back(q, sc, j)


@njit(cache=True, inline="always", _nrt=False)
def get_computed_blocks(rq, fq, fc, j, block_size):
    """:func:`kvdro.sim.engines.vllm_v1.get_computed_blocks`."""
    if not fq[FQ_CACHING]:
        return 0
    return min(fc[FC_CACHED, j], (num_tokens(rq, j) - 1) // block_size)


@njit(cache=True, inline="always", _nrt=False)
def allocate_slots(rq, sc, fq, fc, blk, j, num_new_tokens, num_new_computed_blocks):
    """:func:`kvdro.sim.engines.vllm_v1.allocate_slots`."""
    hit_tokens = num_new_computed_blocks * sc[PAGE_SIZE]
    return allocate(rq, sc, fq, fc, blk, j, rq[COMPUTED, j] + hit_tokens + num_new_tokens, num_new_computed_blocks)


@njit(cache=True, inline="always", _nrt=False)
def preempt(rq, sc, fq, fc, blk, q, j):
    """:func:`kvdro.sim.engines.vllm_v1.preempt`."""
    evict(rq, sc, fq, fc, blk, j)
    push_front(q, sc, j)


@njit(cache=True, inline="always", _nrt=False)
def _clip(threshold, n, budget):
    """:func:`kvdro.sim.engines.vllm_v1._clip`."""
    if 0 < threshold < n:
        n = threshold
    return min(n, budget)


@njit(cache=True, _nrt=False)
def schedule(rq, sc, fq, fc, blk, q, run, sj, sk, max_num_batched_tokens, max_num_seqs, threshold, block_size):
    """:func:`kvdro.sim.engines.vllm_v1.schedule`: the step is ``sj[:sc[NSCHED]]`` with ``sk`` new
    tokens each, in the batch's order; ``sc[NPRE]`` requests were preempted."""
    ns = 0
    npre = 0
    budget = max_num_batched_tokens
    i = 0
    while i < sc[NRUN] and budget > 0:  # 1. RUNNING requests
        j = run[i]
        n = _clip(threshold, num_tokens(rq, j) - rq[COMPUTED, j], budget)
        scheduled = True
        while not allocate_slots(rq, sc, fq, fc, blk, j, n, 0):
            victim = run_pop(rq, sc, run)  # the lowest priority under FCFS: the last admitted
            preempt(rq, sc, fq, fc, blk, q, victim)
            npre += 1
            if victim == j:
                scheduled = False
                break
        if not scheduled:
            break
        sj[ns] = j
        sk[ns] = n
        ns += 1
        budget -= n
        i += 1
    if npre == 0:  # 2. WAITING requests (none in a step that preempted)
        while sc[QLEN] > 0 and budget > 0 and sc[NRUN] < max_num_seqs:
            j = q[sc[QHEAD]]
            hit = get_computed_blocks(rq, fq, fc, j, block_size)
            n = _clip(threshold, num_tokens(rq, j) - hit * block_size, budget)
            if not allocate_slots(rq, sc, fq, fc, blk, j, n, hit):
                break
            pop_front(q, sc)
            run_append(rq, sc, run, j)
            sj[ns] = j
            sk[ns] = n
            ns += 1
            budget -= n
    sc[NSCHED] = ns
    sc[NPRE] = npre


@njit(cache=True, _nrt=False)
def _loop(arrival, rq, sc, q, run, sj, sk, c, wide, fq, fc, blk, max_num_batched_tokens, max_num_seqs, threshold,
          block_size):
    """:func:`kvdro.sim.engine_presets._loop` with vLLM v1's rules; ``sc[ERR]`` says how it ended."""
    n = arrival.size
    while sc[LEFT] > 0 and sc[ERR] == OK:
        while sc[NXT] < n and arrival[sc[NXT]] <= sc[T]:
            on_arrival(q, sc, sc[NXT])
            sc[NXT] += 1
        if sc[QLEN] == 0 and sc[NRUN] == 0:
            idle(arrival, sc)
            continue
        schedule(rq, sc, fq, fc, blk, q, run, sj, sk, max_num_batched_tokens, max_num_seqs, threshold, block_size)
        end_step(arrival, rq, sc, run, sj, sk, c, wide)
        release_finished(sc, fq, blk)


def run(engine: str, cfg, spec: EngineSpec, inp: EngineInput, max_new: np.ndarray, clock: StepClock, *,
        window: int) -> EngineOutput:
    """:func:`kvdro.sim.engine_presets.run_preset` for ``vllm-v1``, compiled: the same
    :class:`EngineOutput` (``trace`` None) and errors. A run whose integers leave the kernel's exact
    range (a request of 3e9 tokens; ``engine_state``) is served by the reference engine."""
    k = Kernel(engine, PRESETS, cfg, spec, inp, max_new, clock)
    pages = int(k.sc[PAGES])
    caching = bool(cfg.enable_prefix_caching)
    fq = np.array([int(caching), 0], dtype=np.int64)
    fc = np.zeros((3, k.n), dtype=np.int64)
    width = pages + 1 if caching else 1
    blk = np.zeros((7, width), dtype=np.int64)
    if caching:  # every block free and untagged, in order, between the sentinel's two ends
        ring = np.arange(width, dtype=np.int64)
        blk[B_NEXT], blk[B_PREV], blk[B_OWNER] = (ring + 1) % width, (ring - 1) % width, -1
    _loop(k.arrival, k.rq, k.sc, k.q, k.run, k.sj, k.sk, k.c, k.wide, fq, fc, blk, int(cfg.max_num_batched_tokens),
          int(cfg.max_num_seqs), int(cfg.long_prefill_token_threshold), int(cfg.block_size))
    if k.sc[ERR] == RANGE:  # exact in the reference's Python integers
        from kvdro.sim.engine_presets import run_preset

        return run_preset(engine, cfg, spec, inp, max_new, clock, window=window)
    return k.output(engine, "")
