"""What every preset's rules read and change: the requests, the KV pool, the queues (one engine).

The rules of :mod:`kvdro.sim.engines` (one module per engine) are functions of an
:class:`EngineState`; the loop that runs them step by step is :mod:`kvdro.sim.engine_presets`.
The state is the engines' common vocabulary, in the "num computed tokens" form of vLLM v1
(``vllm/v1/request.py``: ``num_tokens``, ``num_computed_tokens``):

* a request ``j`` has ``num_tokens(j) = prompt + generated`` tokens; ``computed[j]`` of them have
  their KV in the cache. A step schedules ``n`` new tokens for it (a prefill chunk, a whole prompt,
  a recompute, or one decode token); when the step ends with ``computed == num_tokens`` the
  request samples one token (its first after a prefill, the next after a decode);
* it stops after ``limit[j]`` generated tokens: its true output length after the context window,
  or its ``max_new_tokens`` when that is smaller (then it is *capped*: cut short by the client's
  limit, counted apart from the served requests by :func:`kvdro.sim.simulate`);
* the **KV pool** holds ``pages`` pages of ``page_size`` tokens (vLLM's and TensorRT-LLM's blocks,
  SGLang's and LightLLM's token slots with a page of 1); a request holds
  ``ceil(tokens with a slot / page_size)`` pages (:meth:`EngineState.allocate`);
* ``waiting`` is the waiting queue (a deque: each engine decides where an arrival, a preempted or
  a retracted request goes), ``running`` the running batch in admission order.

Units: tokens, pages, integer picoseconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["EngineState", "Step"]


@dataclass
class Step:
    """One engine step as a rule function forms it: ``scheduled`` = request -> new tokens computed
    in this step (prefill chunks and decode tokens, in the batch's order); ``preempted`` = requests
    preempted (vLLM, TensorRT-LLM's pause) or retracted (SGLang) while the step was formed."""

    scheduled: dict[int, int] = field(default_factory=dict)
    preempted: list[int] = field(default_factory=list)


class EngineState:
    """The requests, pool and queues of one engine (module docstring).

    ``prompt``, ``limit`` (tokens each request generates before it stops), ``max_new`` (the
    ``max_new_tokens`` the engine sees, which the reserving engines reserve against): one entry per
    request, in arrival order. ``pages``: the pool; ``page_size`` [tokens].
    """

    def __init__(self, prompt: list[int], limit: list[int], max_new: list[int], *, pages: int, page_size: int):
        n = len(prompt)
        self.prompt, self.limit, self.max_new = prompt, limit, max_new
        self.page_size, self.pages, self.free = page_size, pages, pages
        self.generated = [0] * n
        self.computed = [0] * n
        self.held = [0] * n  # pages each request holds
        self.preemptions = [0] * n
        self.recomputed = [0] * n  # computed tokens thrown away by preemption / retraction
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.steps = 0  # schedule() calls so far (SGLang's ratio decays per decode step)
        self.queue = None  # vLLM v1's FreeBlockQueue when prefix caching is on (kvdro.sim.engines.free_queue)
        # with the trace's prefix keys only (else None): vLLM v1's HashedBlockPool or SGLang's RadixCache,
        # which then own allocate / release / evict / used_pages (kvdro.sim.engines.free_queue, .radix_cache)
        self.prefix = None
        self.extra: dict = {}  # an engine's own state (SGLang's new_token_ratio)

    # -- the request ------------------------------------------------------------------------
    def num_tokens(self, j: int) -> int:
        """Prompt plus generated tokens of request ``j`` (vLLM v1's ``Request.num_tokens``)."""
        return self.prompt[j] + self.generated[j]

    def pages_for(self, tokens: int) -> int:
        """Pages that hold ``tokens`` tokens: ``ceil(tokens / page_size)``."""
        return -(-int(tokens) // self.page_size)

    # -- the pool ---------------------------------------------------------------------------
    def pages_needed(self, j: int, tokens: int) -> int:
        """New pages request ``j`` needs so that ``tokens`` of its tokens have a slot."""
        return max(0, self.pages_for(tokens) - self.held[j])

    def allocate(self, j: int, tokens: int, *, keep_free: int = 0, hit_pages: int = 0) -> bool:
        """Give request ``j`` slots for ``tokens`` tokens if the new pages fit, leaving ``keep_free``
        pages free; False (and nothing taken) otherwise (vLLM v1's ``allocate_slots`` returning None).
        ``hit_pages``: leading pages of a re-admitted request found in the prefix cache (free pages
        taken back, their tokens not recomputed; vLLM v1 with a :attr:`queue`)."""
        if self.prefix is not None:
            return self.prefix.allocate(self, j, tokens, keep_free=keep_free, hit_pages=hit_pages)
        need = self.pages_needed(j, tokens)
        if need > self.free - keep_free:
            return False
        if self.queue is not None:
            if hit_pages:
                self.queue.hit(j, hit_pages)
                self.computed[j] = hit_pages * self.page_size
                self.recomputed[j] -= self.computed[j]
            self.queue.pop(need - hit_pages)
        self.free -= need
        self.held[j] += need
        return True

    def release(self, j: int) -> None:
        """Free every page of request ``j`` (a finished request)."""
        if self.prefix is not None:
            return self.prefix.release(self, j)
        if self.queue is not None:
            self.queue.free(self.held[j])
        self.free += self.held[j]
        self.held[j] = 0

    def evict(self, j: int) -> None:
        """Preempt (or retract) ``j`` by recompute: its cache is dropped, its generated tokens kept
        (its next prefill recomputes prompt + generated; with vLLM v1's prefix cache, only what the
        pool evicted meanwhile). The caller moves it between the queues."""
        if self.prefix is not None:
            return self.prefix.evict(self, j)
        self.preemptions[j] += 1
        self.recomputed[j] += self.computed[j]
        if self.queue is not None:
            self.queue.free_preempted(j, self.held[j], self.computed[j] // self.page_size)
            self.free += self.held[j]
            self.held[j] = 0
        else:
            self.release(j)
        self.computed[j] = 0

    @property
    def used_pages(self) -> int:
        if self.prefix is not None:
            return self.prefix.used_pages(self)
        return self.pages - self.free
