"""TensorRT-LLM: a capacity scheduler (GUARANTEED_NO_EVICT or MAX_UTILIZATION), then a token budget.

Source: TensorRT-LLM ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``
(``GuaranteedNoEvictScheduler``, ``MaxUtilizationScheduler``), ``kvCacheManager.cpp``
(``getRemainingBlocksToCompletion``, ``getNeededBlocksOneStep``) and ``microBatchScheduler.cpp``,
with the PyTorch backend's ``tensorrt_llm/_torch/pyexecutor/scheduler.py`` (which wraps the same
two classes), read at TensorRT-LLM commit 02a10fed0dbf5db74c7da035be9c5fbef6d2df7a (1.x, 2025;
``GuaranteedNoEvictScheduler::impl`` with ``NoEvictScheduledBlocksManager``: available = free blocks
minus the in-progress requests' remaining blocks to completion). Defaults of the LLM API (``llm_args.py``): policy GUARANTEED_NO_EVICT,
``tokens_per_block`` 32, ``max_num_tokens`` 8192, ``max_batch_size`` 2048, chunked prefill off.

Each step, in the order of the active-request list (arrival order):

* **GUARANTEED_NO_EVICT** (:func:`guaranteed_no_evict`): every request in generation is scheduled
  and its *remaining blocks to completion* -- ``ceil((prompt + max_new)/block)`` minus the blocks it
  holds -- are reserved; a waiting request is admitted only if its own ``ceil((prompt + max_new)/block)``
  fit in the free blocks minus those reservations; the first that does not fit stops the walk (head
  of line). Since every admitted request can run to ``max_new``, the engine never evicts: with
  ``max_new`` = the window (unset) this reserves every request's worst case.
* **MAX_UTILIZATION** (:func:`max_utilization`): requests in generation first, each needing the
  blocks of its *next step only*; if one does not fit, the **last started** request is paused (its
  blocks freed, recomputed later from prompt + generated tokens; it keeps its place in the arrival
  order) and the walk retried; only if no request was paused, waiting requests are admitted in
  order while their prompt's blocks fit.
* The micro-batch scheduler (:func:`micro_batch`) then fills ``max_num_tokens`` in the same order:
  one token per generating request, a whole prompt per context request (chunked prefill off: a
  prompt longer than ``max_num_tokens`` is refused at submission, :func:`prompt_limit`); the first
  that does not fit stops it. Context and generation requests share the step (in-flight batching).

Left out: block reuse (off without block hashes), the disaggregated and LoRA paths, overlap.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from kvdro.sim.engines.knobs import positive_int
from kvdro.sim.engines.state import EngineState, Step

__all__ = ["Config", "POLICIES", "on_arrival", "guaranteed_no_evict", "max_utilization", "micro_batch",
           "prompt_limit", "schedule"]

SOURCE = "TensorRT-LLM cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp (GuaranteedNoEvictScheduler, MaxUtilizationScheduler)"
#: ``CapacitySchedulerPolicy`` values.
POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")


@dataclass(frozen=True)
class Config:
    """TensorRT-LLM's knobs (LLM API names): ``capacity_scheduler_policy`` (:data:`POLICIES`),
    ``tokens_per_block`` [tokens], ``max_num_tokens`` [tokens per step], ``max_batch_size``
    [requests], ``enable_chunked_prefill`` (off)."""

    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"
    tokens_per_block: int = 32
    max_num_tokens: int = 8192
    max_batch_size: int = 2048
    enable_chunked_prefill: bool = False

    def __post_init__(self) -> None:
        if self.capacity_scheduler_policy not in POLICIES:
            raise ValueError(f"capacity_scheduler_policy: must be one of {POLICIES}, got {self.capacity_scheduler_policy!r}")
        block = positive_int("tokens_per_block", self.tokens_per_block)
        positive_int("max_num_tokens", self.max_num_tokens, at_least=block, why="the token budget must hold at least one block")
        positive_int("max_batch_size", self.max_batch_size)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill: must be True or False, got {self.enable_chunked_prefill!r}")

    @property
    def page_size(self) -> int:
        return self.tokens_per_block


def prompt_limit(cfg: Config, window: int) -> int:
    """Longest prompt accepted [tokens]: without chunked prefill a prompt must fit one step's
    ``max_num_tokens``; always below the window (at least one token to generate)."""
    return window - 1 if cfg.enable_chunked_prefill else min(window - 1, cfg.max_num_tokens)


def on_arrival(st: EngineState, cfg: Config, j: int) -> None:
    """A new request joins the active-request list after every earlier arrival."""
    st.waiting.append(j)


def _remaining_blocks_to_completion(st: EngineState, j: int) -> int:
    """``KVCacheManager::getRemainingBlocksToCompletion``: blocks of prompt + max_new, minus the held ones."""
    return max(0, st.pages_for(st.prompt[j] + st.max_new[j]) - st.held[j])


def _needed_blocks_one_step(st: EngineState, j: int) -> int:
    """``KVCacheManager::getNeededBlocksOneStep``: the blocks of the request's next step -- its whole
    context in the context phase (the first chunk of a chunked prefill takes the blocks of the whole
    prompt, later chunks need none), a new block when the next decode token starts one. Both are
    the blocks of ``num_tokens`` (in the decode phase ``computed + 1 == num_tokens``)."""
    return st.pages_needed(j, st.num_tokens(j))


def guaranteed_no_evict(st: EngineState, cfg: Config) -> list[int]:
    """``GuaranteedNoEvictScheduler``: the requests this step may run (module docstring)."""
    scheduled = list(st.running)[: cfg.max_batch_size]
    available = st.free - sum(_remaining_blocks_to_completion(st, j) for j in st.running)
    for j in st.waiting:
        if len(scheduled) >= cfg.max_batch_size:
            break
        needed = _remaining_blocks_to_completion(st, j)
        if needed > available:
            break  # "If one requests fails to be scheduled, break"
        scheduled.append(j)
        available -= needed
    return scheduled


def _pause(st: EngineState, j: int) -> None:
    """A paused request: blocks freed, recomputed later; back among the waiting in arrival order."""
    st.evict(j)
    st.running.remove(j)
    bisect.insort(st.waiting, j)


def max_utilization(st: EngineState, cfg: Config, step: Step) -> list[int]:
    """``MaxUtilizationScheduler``: started requests one step ahead, pausing the last started one when
    a step does not fit; new ones only if none was paused (module docstring)."""
    started = list(st.running)
    scheduled: list[int] = []
    blocks = 0
    i = 0
    while i < len(started) and len(scheduled) < cfg.max_batch_size:
        j = started[i]
        need = _needed_blocks_one_step(st, j)
        if blocks + need <= st.free:
            scheduled.append(j)
            blocks += need
            i += 1
            continue
        last = started.pop()
        _pause(st, last)
        step.preempted.append(last)
    if not step.preempted:
        for j in st.waiting:
            if len(scheduled) >= cfg.max_batch_size:
                break
            need = _needed_blocks_one_step(st, j)
            if blocks + need > st.free:
                break
            scheduled.append(j)
            blocks += need
    return scheduled


def micro_batch(st: EngineState, cfg: Config, candidates: list[int]) -> dict[int, int]:
    """``MicroBatchScheduler``: request -> tokens of this step within ``max_num_tokens``, in order."""
    out: dict[int, int] = {}
    budget = cfg.max_num_tokens
    for j in candidates:
        n = st.num_tokens(j) - st.computed[j]
        if n > budget:
            if not cfg.enable_chunked_prefill or st.computed[j] + 1 == st.num_tokens(j):
                break
            n = budget // cfg.tokens_per_block * cfg.tokens_per_block
            if n <= 0:
                break
        out[j] = n
        budget -= n
    return out


def schedule(st: EngineState, cfg: Config) -> Step:
    """One step: the capacity policy, then the micro batch; admitted requests take their blocks."""
    step = Step()
    if cfg.capacity_scheduler_policy == "GUARANTEED_NO_EVICT":
        candidates = guaranteed_no_evict(st, cfg)
    else:
        candidates = max_utilization(st, cfg, step)
    for j, n in micro_batch(st, cfg, candidates).items():
        if not st.allocate(j, st.computed[j] + n):
            raise AssertionError(f"trtllm: the capacity scheduler admitted request {j} beyond the free blocks")
        if j not in st.running:
            st.waiting.remove(j)
            bisect.insort(st.running, j)  # the active-request list keeps arrival order
        step.scheduled[j] = n
    return step
