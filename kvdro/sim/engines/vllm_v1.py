"""vLLM v1: one token budget shared by running requests first, then waiting ones; preempt the newest.

Source: vLLM 0.11.0 (the first release without the v0 engine, October 2025), file
``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule`` and ``Scheduler._preempt_request``, and
``vllm/v1/core/kv_cache_manager.py``, ``KVCacheManager.allocate_slots``; read at vLLM commits
00024d314514900f361ad072af6931e403b7f589 and 003df2961dd8830c317a61f9745ccd557da9fa06 (main, 2026:
later additions -- a watermark, ``full_sequence_must_fit`` -- are off or absent in 0.11.0). Checked
step by step against vLLM 0.11.0's own ``Scheduler`` by ``python -m kvdro.bench conformance``
(:func:`kvdro.sim.engines.step_trace`).
Defaults: ``vllm/engine/arg_utils.py`` ``EngineArgs._set_default_args`` (an A100 serving the OpenAI
API: ``max_num_batched_tokens`` 2048, ``max_num_seqs`` 256; chunked prefill always on in v1).

One ``schedule()`` call (:func:`schedule`), top to bottom:

1. **Running requests first**, in the running list's order (admission order): each asks for
   ``num_tokens - num_computed_tokens`` tokens (a prefill chunk's rest, or 1 for a decode), clipped
   to ``long_prefill_token_threshold`` (0 = off) and to the remaining token budget.
   :func:`allocate_slots` gives it the blocks for its computed + new tokens if the free blocks
   suffice (no watermark in 0.11.0); if not, the **last** request of the running list is preempted
   (:func:`preempt`: blocks freed, ``num_computed_tokens = 0``, to the **front** of the waiting
   queue) and the allocation retried; a request that has to preempt itself stops the walk.
2. **Waiting requests**, only if nothing was preempted in this step, FCFS from the head, while the
   budget is positive and fewer than ``max_num_seqs`` run: a request gets ``num_tokens`` tokens (its
   prompt; prompt + generated after a preemption: recompute), clipped to the threshold and the
   budget (chunked prefill); if its blocks do not fit, the walk stops (head of line).

Prefill chunks and decodes share one step (a mixed step). Automatic prefix caching is on, as in the
engine (``enable_prefix_caching``): without block hashes in the trace no two prompts share blocks,
but a preempted request hits its own freed blocks while the pool has not reused them
(:mod:`kvdro.sim.engines.free_queue`), and recomputes only the rest. Left out: speculative
decoding, async scheduling, priorities. Sharing across requests needs the trace's block hashes:
with them (``simulate(..., prefix_keys=)``) the pool is
:class:`~kvdro.sim.engines.free_queue.HashedBlockPool` (vLLM 0.11.0 ``v1/core/block_pool.py``): a
waiting request skips the prefill of its longest cached run of full blocks -- its own after a
preemption, or another request's, running, finished or preempted, until the free queue evicts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdro.sim.engines.free_queue import FreeBlockQueue
from kvdro.sim.engines.knobs import non_negative_int, positive_int
from kvdro.sim.engines.state import EngineState, Step

__all__ = ["Config", "on_arrival", "allocate_slots", "preempt", "schedule"]

NAME = "vllm-v1"
SOURCE = "vLLM 0.11.0 vllm/v1/core/sched/scheduler.py (Scheduler.schedule), v1/core/kv_cache_manager.py (allocate_slots)"


@dataclass(frozen=True)
class Config:
    """vLLM v1's knobs (``SchedulerConfig`` / ``CacheConfig`` names; defaults of an A100 OpenAI server).

    ``max_num_batched_tokens`` [tokens per step], ``max_num_seqs`` [running requests],
    ``long_prefill_token_threshold`` [tokens; 0 = no per-request cap], ``block_size`` [tokens],
    ``enable_prefix_caching`` (on, as in vLLM: a preempted request hits its own freed blocks while the
    pool has not handed them out, :mod:`kvdro.sim.engines.free_queue`).
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        block = positive_int("block_size", self.block_size)
        positive_int("max_num_batched_tokens", self.max_num_batched_tokens, at_least=block,
                     why="the token budget must hold at least one block")
        positive_int("max_num_seqs", self.max_num_seqs)
        non_negative_int("long_prefill_token_threshold", self.long_prefill_token_threshold)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching: must be True or False, got {self.enable_prefix_caching!r}")

    @property
    def page_size(self) -> int:
        return self.block_size


def on_arrival(st: EngineState, cfg: Config, j: int) -> None:
    """``Scheduler.add_request``: a new request joins the tail of the waiting queue."""
    if cfg.enable_prefix_caching and st.queue is None and st.prefix is None:
        st.queue = FreeBlockQueue(st.pages)
    st.waiting.append(j)


def get_computed_blocks(st: EngineState, cfg: Config, j: int) -> int:
    """``KVCacheManager.get_computed_blocks``: leading blocks of ``j`` still in the prefix cache
    (full blocks, at most ``num_tokens - 1`` tokens: the last token is always computed). With the
    trace's prefix keys: the longest cached run of its blocks, shared or its own
    (:class:`~kvdro.sim.engines.free_queue.HashedBlockPool`)."""
    if st.prefix is not None:
        return len(st.prefix.longest_hit(j, (st.num_tokens(j) - 1) // cfg.block_size))
    if st.queue is None:
        return 0
    return min(st.queue.cached.get(j, 0), (st.num_tokens(j) - 1) // cfg.block_size)


def allocate_slots(st: EngineState, j: int, num_new_tokens: int, num_new_computed_blocks: int = 0) -> bool:
    """``KVCacheManager.allocate_slots`` (0.11.0): blocks for ``num_computed_tokens`` + the prefix-cache
    hit + ``num_new_tokens`` tokens, taken only if the pool's free blocks (cached ones included)
    cover them (no watermark); False = None."""
    hit_tokens = num_new_computed_blocks * st.page_size
    return st.allocate(j, st.computed[j] + hit_tokens + num_new_tokens, hit_pages=num_new_computed_blocks)


def preempt(st: EngineState, j: int) -> None:
    """``Scheduler._preempt_request``: free the request's blocks, ``num_computed_tokens = 0``
    (recompute), ``waiting.prepend_request`` -- the front of the waiting queue."""
    st.evict(j)
    st.waiting.appendleft(j)


def _clip(cfg: Config, n: int, budget: int) -> int:
    """The threshold and budget clips of both walks."""
    if 0 < cfg.long_prefill_token_threshold < n:
        n = cfg.long_prefill_token_threshold
    return min(n, budget)


def schedule(st: EngineState, cfg: Config) -> Step:
    """``Scheduler.schedule`` (module docstring): the running walk, then the waiting walk."""
    step = Step()
    budget = cfg.max_num_batched_tokens
    i = 0
    while i < len(st.running) and budget > 0:  # 1. RUNNING requests
        j = st.running[i]
        n = _clip(cfg, st.num_tokens(j) - st.computed[j], budget)
        scheduled = True
        while not allocate_slots(st, j, n):
            victim = st.running.pop()  # the lowest priority under FCFS: the last admitted
            preempt(st, victim)
            step.preempted.append(victim)
            if victim == j:
                scheduled = False
                break
        if not scheduled:
            break
        step.scheduled[j] = n
        budget -= n
        i += 1
    if not step.preempted:  # 2. WAITING requests (none in a step that preempted)
        while st.waiting and budget > 0 and len(st.running) < cfg.max_num_seqs:
            j = st.waiting[0]
            hit = get_computed_blocks(st, cfg, j)
            n = _clip(cfg, st.num_tokens(j) - hit * cfg.block_size, budget)
            if not allocate_slots(st, j, n, hit):
                break
            st.waiting.popleft()
            st.running.append(j)
            step.scheduled[j] = n
            budget -= n
    return step
