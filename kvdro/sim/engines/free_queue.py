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

With the trace's prefix keys (``simulate(..., prefix_keys=)``), :class:`HashedBlockPool` replaces
:class:`FreeBlockQueue`: the same free queue over real block ids and hashes, so that requests share
prefix blocks; with keys no two requests share it gives exactly :class:`FreeBlockQueue`'s steps.
"""

from __future__ import annotations

from collections import deque

__all__ = ["FreeBlockQueue", "HashedBlockPool", "credit_hit"]


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


# ------------------------------------------------------------------------------------------------
# With block hashes (issue 32, item 4): prefix sharing across requests
# ------------------------------------------------------------------------------------------------

def credit_hit(st, pool, j: int, tokens: int) -> None:
    """Book a prefix-cache hit of ``tokens`` tokens for request ``j`` (vLLM's and SGLang's caches):
    ``pool.hit_tokens[j]`` grows; the part of its last preemption's discarded tokens found again
    (``pool.lost[j]``) is not recomputed."""
    st.recomputed[j] -= min(tokens, pool.lost.get(j, 0))
    pool.lost[j] = 0
    pool.hit_tokens[j] += tokens


class HashedBlockPool:
    """vLLM v1's block pool with automatic prefix caching, driven by the trace's block hashes.

    Used instead of :class:`FreeBlockQueue` when the trace carries prefix keys (``simulate(...,
    prefix_keys=)``); without keys nothing here runs. Each request's block ``b`` has a key: the
    trace's key of its ``b``-th full prompt block (equal keys = equal prefixes up to that block,
    :func:`kvdro.datasets.prefix_block_keys`), else a key of its own (the partial last prompt block
    and the generated tokens: no other request holds them, but the request itself hits them after a
    preemption). Rules, each from vLLM 0.11.0:

    * ``block_pool.py`` ``BlockPool``: the free queue holds every block with ``ref_cnt == 0``, cached
      or not, in eviction order (initially block id order); ``get_new_blocks`` pops the **head** and
      ``_maybe_evict_cached_block`` drops a popped block's hash from ``cached_block_hash_to_block``;
      ``free_blocks`` decrements ``ref_cnt`` and appends the blocks that reach 0 at the **tail**;
      ``touch`` takes a hit block with ``ref_cnt == 0`` out of the free queue and increments it;
      ``BlockHashToBlockMap``: a hash may map to several blocks (no de-duplication), a lookup
      returns the first inserted.
    * ``kv_cache_manager.py`` ``KVCacheManager.get_computed_blocks``: the longest run of cached
      blocks from block 0 (``FullAttentionManager.find_longest_cache_hit``: stops at the first
      miss), at most ``num_tokens - 1`` tokens; ``allocate_slots``: the blocks to allocate are the
      new blocks plus the hit blocks that sit in the free queue
      (``get_num_blocks_to_allocate``: ``num_evictable_computed_blocks``), refused (None) above the
      free blocks; then ``touch``, ``allocate_new_blocks``, and ``cache_blocks`` up to
      ``min(num_computed + num_new, num_tokens)`` tokens (full blocks only): blocks are cached
      when scheduled, so a request admitted later in the same step can hit them; ``free`` returns a
      request's blocks in **reverse** order (its last blocks are evicted first).

    A finished or preempted request's cached blocks stay in the free queue, hittable, until the
    pool hands them out (LRU by the time they were freed). ``hit_tokens[j]``: tokens request ``j``
    took from the cache over all its admissions [tokens].
    """

    def __init__(self, pages: int, page_size: int, keys: list):
        from collections import OrderedDict

        self.page_size = page_size
        self.keys = keys  # request -> its full prompt blocks' keys (a sequence of ints)
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(pages))
        self.block_key: list = [None] * pages
        self.ref = [0] * pages
        self.cached: dict = {}  # key -> block ids holding it, first inserted first
        self.table: dict[int, list[int]] = {}  # request -> its blocks
        self.num_cached: dict[int, int] = {}  # request -> leading blocks of its table already cached
        self.lost: dict[int, int] = {}  # request -> computed tokens its last preemption discarded
        self.hit_tokens = [0] * len(keys)

    def key(self, j: int, b: int):
        """Request ``j``'s key of block ``b``: the trace's prompt key, else one of its own."""
        k = self.keys[j]
        return int(k[b]) if b < len(k) else ("own", j, b)

    def longest_hit(self, j: int, max_blocks: int) -> list[int]:
        """``find_longest_cache_hit``: the cached blocks of ``j``'s blocks 0, 1, ... (first miss stops)."""
        hit = []
        for b in range(max_blocks):
            ids = self.cached.get(self.key(j, b))
            if not ids:
                break
            hit.append(ids[0])
        return hit

    def allocate(self, st, j: int, tokens: int, *, keep_free: int = 0, hit_pages: int = 0) -> bool:
        """:meth:`EngineState.allocate` with hashes (``allocate_slots``; class docstring)."""
        table = self.table.setdefault(j, [])
        hits = self.longest_hit(j, hit_pages) if hit_pages else []
        new = max(0, st.pages_for(tokens) - len(table) - len(hits))
        need = new + sum(1 for b in hits if self.ref[b] == 0)
        if need > st.free - keep_free:
            return False
        for b in hits:  # touch
            if self.ref[b] == 0:
                del self.free_queue[b]
            self.ref[b] += 1
        table.extend(hits)
        if hits:
            st.computed[j] = len(hits) * self.page_size
            credit_hit(st, self, j, st.computed[j])
        for _ in range(new):  # get_new_blocks: pop the head, evicting its hash
            b, _ = self.free_queue.popitem(last=False)
            k = self.block_key[b]
            if k is not None:
                ids = self.cached[k]
                ids.remove(b)
                if not ids:
                    del self.cached[k]
                self.block_key[b] = None
            self.ref[b] = 1
            table.append(b)
        st.free -= need
        st.held[j] = len(table)
        full = min(tokens, st.num_tokens(j)) // self.page_size  # cache_blocks
        start = self.num_cached.get(j, 0)
        for i in range(start, full):
            b = table[i]
            if self.block_key[b] is None:
                k = self.key(j, i)
                self.block_key[b] = k
                self.cached.setdefault(k, []).append(b)
        self.num_cached[j] = max(start, full)
        return True

    def release(self, st, j: int) -> None:
        """``KVCacheManager.free``: ``j``'s blocks back, last block first; cached ones stay hittable."""
        table = self.table.pop(j, [])
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_queue[b] = None
                st.free += 1
        self.num_cached.pop(j, None)
        st.held[j] = 0

    def evict(self, st, j: int) -> None:
        """``Scheduler._preempt_request`` with the pool: counted, its blocks freed (cached), recompute."""
        st.preemptions[j] += 1
        st.recomputed[j] += st.computed[j]
        self.lost[j] = st.computed[j]
        self.release(st, j)
        st.computed[j] = 0

    def used_pages(self, st) -> int:
        """Blocks with ``ref_cnt > 0`` (vLLM's usage: cached free blocks are free)."""
        return st.pages - st.free
