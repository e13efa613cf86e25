"""SGLang's radix cache, driven by the trace's prefix keys: shared prompts skip prefill, LRU eviction.

Only with ``simulate(..., prefix_keys=)`` (without keys no two prompts share tokens and the
``sglang`` preset runs as before). Source: SGLang 0.5 (``python/sglang/srt``), read at commit
006b0e3d317f1cd4a7300e919a4eaa878b1947e7 (2026; the rules have this shape since 0.4):

* ``mem_cache/radix_cache.py`` ``RadixCache``: ``match_prefix`` walks the tree from the root along
  the request's tokens and refreshes ``last_access_time`` on the way; ``insert`` adds the tokens the
  tree does not hold yet (``cache_unfinished_req`` after a prefill or chunk, ``cache_finished_req``
  when a request ends: prompt + output) and frees the request's duplicate copies of tokens another
  request inserted first; ``inc_lock_ref`` / ``dec_lock_ref`` pin a path (running requests) and move
  its tokens between ``protected_size_`` and ``evictable_size_``; ``evict(num_tokens)`` pops
  unlocked leaves by ``last_access_time`` (LRU, the default ``eviction_policy``), a parent left
  childless and unlocked joining the heap, until ``num_tokens`` are freed.
* ``mem_cache/common.py`` ``evict_from_tree_cache``: before an allocation of ``num_tokens`` slots,
  if ``available_size() < num_tokens`` then ``evict(num_tokens)`` (prefill: ``alloc_for_extend``,
  the batch's extend tokens; decode: ``check_decode_mem``).
* ``managers/schedule_policy.py`` ``PrefillAdder``: ``rem_total_tokens`` counts
  ``available_size() + evictable_size()``; ``add_one_req`` takes ``extend_input_len`` = tokens minus
  the matched prefix (``Req.init_next_round_input``: at most ``input_len - 1`` tokens), checks
  ``total_tokens >= rem_total_tokens``, locks the matched node (``_lock_node``) and checks again.
* ``managers/schedule_batch.py`` ``retract_decode`` (``release_kv_cache(..., is_insert=False)``):
  a retracted request frees the tokens it holds outside the tree and unlocks its path: its prompt
  stays cached (evictable) and a later re-admission matches it.

Granularity: the tree's nodes here are the trace's 16-token prefix blocks (SGLang matches token by
token; the trace only says which 16-token blocks are equal, :func:`kvdro.datasets.prefix_block_keys`),
so a match is a whole number of blocks and only full blocks enter the tree (a request's partial last
block, under 16 tokens, is freed at its end instead of cached). A request's blocks past its prompt keys
(its partial prompt block, its output) have keys of their own: only the request itself matches them.
The page size is SGLang's default, 1 token. Left out: the ``lpm`` / ``dfs-weight`` orders (the
default ``fcfs`` is modelled), the eviction ``retract_decode`` adds after retracting, hierarchical
caching.
"""

from __future__ import annotations

import heapq

from kvdro.sim.engines.free_queue import credit_hit

__all__ = ["RadixCache", "BLOCK"]

#: Tokens per tree node: the trace's prefix-key block (:data:`kvdro.sim.scheduler.BLOCK_TOKENS`).
BLOCK = 16


class _Node:
    """``radix_cache.TreeNode``: one 16-token block, its children by key, its lock and last access."""

    __slots__ = ("key", "parent", "children", "lock", "access", "id")

    def __init__(self, key, parent, access: int, node_id: int):
        self.key, self.parent, self.children = key, parent, {}
        self.lock, self.access, self.id = 0, access, node_id


class RadixCache:
    """The tree, its evictable size, and each request's locked path and private slots [tokens].

    ``keys[j]``: request ``j``'s full prompt blocks' keys. ``path[j]``: the nodes ``j`` holds locked
    (its prefix in the tree); ``private[j]``: its slots outside the tree (tokens not inserted yet);
    ``st.held[j]`` = 16 x len(path) + private. ``st.free`` is SGLang's ``available_size()``; the
    tree's unlocked tokens are :attr:`evictable`. ``hit_tokens[j]``: tokens matched at admission.
    """

    def __init__(self, keys: list):
        self.keys = keys
        self.tick = 0  # last_access_time: a counter (monotonic, like SGLang's clock)
        self.root = _Node(None, None, 0, 0)
        self.root.lock = 1
        self.nodes = 1
        self.evictable = 0  # evictable_size_ [tokens]
        self.leaves: set[_Node] = set()  # evictable_leaves
        self.path: dict[int, list[_Node]] = {}
        self.private: dict[int, int] = {}
        self.matched: dict[int, list[_Node]] = {}
        self.pending: set[int] = set()  # prefilled in the last step: inserted before the next schedule
        self.lost: dict[int, int] = {}
        self.hit_tokens = [0] * len(keys)

    # -- tree ---------------------------------------------------------------------------------
    def key(self, j: int, b: int):
        k = self.keys[j]
        return int(k[b]) if b < len(k) else ("own", j, b)

    def _now(self) -> int:
        self.tick += 1
        return self.tick

    def _leaf_status(self, node: _Node) -> None:
        """``_update_leaf_status``."""
        if node is not self.root and node.lock == 0 and not node.children:
            self.leaves.add(node)
        else:
            self.leaves.discard(node)

    def _lock(self, nodes: list[_Node], delta: int) -> None:
        """``inc_lock_ref`` (+1) / ``dec_lock_ref`` (-1) on a path from the root."""
        for node in nodes:
            if delta > 0 and node.lock == 0:
                self.evictable -= BLOCK
            node.lock += delta
            if delta < 0 and node.lock == 0:
                self.evictable += BLOCK
            self._leaf_status(node)

    def match_prefix(self, st, j: int) -> int:
        """``match_prefix`` for a waiting request (``init_next_round_input``): matched tokens, at most
        ``num_tokens - 1``, remembered for :meth:`lock`."""
        now = self._now()
        node, got = self.root, []
        for b in range((st.num_tokens(j) - 1) // BLOCK):
            node = node.children.get(self.key(j, b))
            if node is None:
                break
            node.access = now
            got.append(node)
        self.matched[j] = got
        return BLOCK * len(got)

    def lock(self, j: int) -> None:
        """``PrefillAdder._lock_node`` entered: the matched path is pinned (leaves the evictable size)."""
        self._lock(self.matched[j], +1)

    def unlock(self, j: int) -> None:
        """The lock released without admitting ``j``."""
        self._lock(self.matched.pop(j), -1)

    def admit(self, st, j: int) -> None:
        """``j`` admitted with its matched prefix (still locked): computed, held, hit booked."""
        got = self.matched.pop(j)
        self.path[j] = got
        self.private[j] = 0
        st.computed[j] = st.held[j] = BLOCK * len(got)
        if got:
            credit_hit(st, self, j, BLOCK * len(got))

    def insert(self, st, j: int, tokens: int) -> None:
        """``cache_unfinished_req``: ``j``'s first ``tokens`` tokens (full blocks) into the tree, locked;
        its own copies of blocks already there are freed."""
        path = self.path[j]
        now = self._now()
        for node in path:
            node.access = now
        parent = path[-1] if path else self.root
        added = []
        for b in range(len(path), tokens // BLOCK):
            k = self.key(j, b)
            node = parent.children.get(k)
            if node is None:
                node = _Node(k, parent, now, self.nodes)
                self.nodes += 1
                parent.children[k] = node
                self.evictable += BLOCK  # inserted unlocked, then locked below
                self._leaf_status(parent)
            else:
                node.access = now
                st.free += BLOCK  # a duplicate: the request's copy is freed (it now holds the tree's)
            self.private[j] -= BLOCK
            added.append(node)
            parent = node
        self._lock(added, +1)
        path.extend(added)

    def evict_tokens(self, st, num_tokens: int) -> None:
        """``evict``: free unlocked leaves, least recently used first, until ``num_tokens`` are freed."""
        heap = [(n.access, n.id, n) for n in self.leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key]
            self.leaves.discard(node)
            self.evictable -= BLOCK
            st.free += BLOCK
            freed += BLOCK
            self._leaf_status(parent)
            if parent in self.leaves:
                heapq.heappush(heap, (parent.access, parent.id, parent))

    def evict_if_needed(self, st, num_tokens: int) -> None:
        """``evict_from_tree_cache``: evict ``num_tokens`` if fewer slots are available."""
        if st.free < num_tokens:
            self.evict_tokens(st, num_tokens)

    # -- the pool interface of EngineState --------------------------------------------------------
    def allocate(self, st, j: int, tokens: int, *, keep_free: int = 0, hit_pages: int = 0) -> bool:
        """Slots for ``j``'s first ``tokens`` tokens (its private ones); False if they do not fit."""
        need = max(0, tokens - st.held[j])
        if need > st.free - keep_free:
            return False
        self.path.setdefault(j, [])
        self.private[j] = self.private.get(j, 0) + need
        st.free -= need
        st.held[j] += need
        return True

    def commit(self, st) -> None:
        """The last prefill step's requests still running insert their computed tokens
        (``process_batch_result_prefill`` -> ``cache_unfinished_req``)."""
        for j in sorted(self.pending):
            if j in self.path:
                self.insert(st, j, st.computed[j])
        self.pending.clear()

    def _drop(self, st, j: int) -> None:
        """Free ``j``'s private slots and unlock its path (``dec_lock_ref``)."""
        st.free += self.private.pop(j, 0)
        self._lock(self.path.pop(j, []), -1)
        st.held[j] = 0
        self.pending.discard(j)

    def release(self, st, j: int) -> None:
        """``cache_finished_req``: prompt + output (full blocks) into the tree, the rest freed, unlocked."""
        if j in self.path:
            self.insert(st, j, st.computed[j])
        self._drop(st, j)

    def evict(self, st, j: int) -> None:
        """``retract_decode``: counted, its slots outside the tree freed, its path unlocked (cached)."""
        st.preemptions[j] += 1
        st.recomputed[j] += st.computed[j]
        self.lost[j] = st.computed[j]
        self._drop(st, j)
        st.computed[j] = 0

    def used_pages(self, st) -> int:
        """SGLang's used tokens: the pool minus ``available_size() + evictable_size()``."""
        return st.pages - st.free - self.evictable
