"""vLLM v1's free block queue with automatic prefix caching, as far as a trace without hashes needs it.

Source: vLLM 0.11.0 ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``FreeKVCacheBlockQueue``:
allocation pops the **head**, freed blocks are appended at the **tail**: least recently freed is
evicted first) and ``vllm/v1/core/kv_cache_manager.py`` (``free`` returns a request's blocks in
**reverse** order, so its last blocks are evicted before its first; ``get_computed_blocks`` finds the
longest cached prefix of full blocks, at most ``num_tokens - 1`` tokens).

Without block hashes in the trace no two requests share a prefix, so the only hits are a preempted
request's own blocks: they stay in the free pool, cached, until the pool hands them to someone else.
When the request is admitted again it recomputes only what was evicted -- the pitfall the issue saw
in vLLM's own scheduler (64 of 78 resumed requests hit their own freed blocks). A cached free block
is a free block: hits change the tokens computed, never the blocks a request needs.
"""

from __future__ import annotations

from collections import deque

__all__ = ["FreeBlockQueue"]


class FreeBlockQueue:
    """Eviction order of the free blocks and each preempted request's cached prefix [blocks].

    Entries are ``(owner, index, epoch)`` (owner -1: a block with nothing to hit). ``cached[j]`` is the
    number of leading blocks of request ``j``'s last preemption still cached; a hit removes them from
    the queue (entries of that epoch below the hit are skipped when popped: they are no longer free).
    """

    def __init__(self, blocks: int):
        self.queue: deque[tuple[int, int, int]] = deque((-1, 0, 0) for _ in range(blocks))
        self.cached: dict[int, int] = {}  # request -> leading blocks cached since its preemption
        self.epoch: dict[int, int] = {}  # request -> its current preemption's epoch
        self.taken: dict[tuple[int, int], int] = {}  # (request, epoch) -> blocks a hit took back

    def pop(self, count: int) -> None:
        """Hand ``count`` free blocks to an allocation (from the head), evicting cached ones."""
        while count:
            owner, index, ep = self.queue.popleft()
            if owner >= 0:
                if index < self.taken.get((owner, ep), 0):
                    continue  # already back with its owner: not a free block
                if ep == self.epoch.get(owner) and index < self.cached.get(owner, 0):
                    self.cached[owner] = index  # evicted: the cached prefix ends before this block
            count -= 1

    def free(self, blocks: int) -> None:
        """A finished request's ``blocks`` blocks join the tail (nothing will hit them)."""
        self.queue.extend((-1, 0, 0) for _ in range(blocks))

    def free_preempted(self, j: int, blocks: int, full_blocks: int) -> None:
        """A preempted request's ``blocks`` blocks join the tail, last block first; its first
        ``full_blocks`` (holding computed tokens) stay cached for a later hit."""
        ep = self.epoch.get(j, 0) + 1
        self.epoch[j] = ep
        self.cached[j] = full_blocks
        self.queue.extend((j, b, ep) for b in range(blocks - 1, -1, -1))

    def hit(self, j: int, limit: int) -> int:
        """``get_computed_blocks``: the cached leading blocks of ``j`` (at most ``limit``), taken back
        out of the free queue. Returns the number of blocks hit."""
        h = min(self.cached.get(j, 0), limit)
        if h:
            self.taken[(j, self.epoch[j])] = h
        self.cached[j] = 0
        return h
