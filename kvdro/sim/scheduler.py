"""The vLLM scheduling rules both engines implement, and their inputs and outputs.

We follow **vLLM v0.6** (the V0 engine's default scheduler without chunked prefill):
``vllm/core/scheduler.py`` (``Scheduler._schedule_default``, ``_schedule_prefills``,
``_schedule_running``) and ``vllm/core/block_manager.py`` (``SelfAttnBlockSpaceManager``:
``can_allocate``, ``can_append_slots``) :cite:`kwon2023vllm`. One engine step:

1. **Prefill first.** Walk the waiting queue from its head (FCFS; or a static key's order, below);
   admit a request if
   (a) its blocks fit above the **watermark** -- ``free - need >= watermark`` (1% of the blocks,
   vLLM's ``can_allocate``), where ``need`` is the prompt's ``ceil(P/16)`` blocks for ``vllm`` and
   the reservation's ``ceil(max(P, L_in + eta)/16)`` for a reservation policy (an *extra*
   admission condition on top of vLLM's) -- (b) the step's token budget
   (``max_num_batched_tokens``) holds its P prompt tokens and (c) running sequences stay
   <= ``max_num_seqs`` (256) -- and, for ``oracle`` only, (d) the look-ahead below holds. The
   first request that does not fit stops the walk (head-of-line blocking, as in vLLM). If
   anything was admitted the step is a **prefill-only** step; each prefilled sequence produces
   its first output token.
2. Otherwise a **decode step** of every running sequence, oldest first. **Free-block rule:** a
   sequence may run only if at least one block is free (v0's worst-case "touched block" heuristic
   in ``can_append_slots``), whatever the policy; it takes that block only when its next token
   falls outside the blocks it holds. If no block is free, the **newest** running sequence is
   preempted (``running.pop()``), by **recompute**: its blocks are freed and it goes back to the
   **front** of the waiting queue (``waiting.extendleft``), to be prefilled again with its prompt
   plus the tokens generated so far. If no newer sequence is left, the sequence preempts itself.
   A step that preempted admits nothing (it is a decode step; admission happens only in step 1).

**Two readings of a reservation** (``EngineSpec.hard``):

* **soft** (default): the reservation is admission control only. A request that outgrows it takes
  a block at a time, like any vLLM sequence, and is preempted only when the pool runs dry -- what
  an unmodified paged engine does with a reservation-aware admission rule.
* **hard**: the reservation is a cap. A request whose next token falls outside its reserved blocks
  is preempted at once (by recompute, to the front of the queue) and is re-admitted with a larger
  reservation, :func:`grown_reservation`: its buffer (reserved blocks beyond the prompt's) doubled,
  at least one block more, capped at the context window. An engine that caps a request at its
  reservation learns only that the output is longer than the reservation; doubling keeps the
  number of restarts of a request logarithmic (at most ``log2(window / 16)``) and its
  over-reservation within a factor of two of the length it finally needs (the amortised argument
  of a growable array). At the window cap the request cannot overflow (its cache never exceeds the
  window), so every request finishes.

**Safety rules off** (``EngineSpec(watermark_blocks=0, free_block_rule=False)``): the behaviour of
this package before issue 15, kept only for chapter 7's before/after table -- a reservation policy
then admits down to the last block and a sequence inside its reservation runs with no free block.

**The oracle's look-ahead** (``EngineSpec.lookahead``, policy ``oracle``): vLLM's admission above
plus one more condition, with the true output lengths. Every running sequence follows a known
trajectory: one token per decode step, a new block when its last one is full, all its blocks freed
after its last decode step (the block manager's usage is a sum of step functions). A request of
the walk is admitted only if, with that trajectory of every running sequence and the new request's
own added (prefix-shared blocks counted once, held until their last user leaves), the blocks in use
never exceed ``blocks - watermark`` at any future decode step. It is checked on top of vLLM's
conditions (a)-(c), so the oracle never admits a request earlier than vLLM would in the same
state, and at every engine step, like them. Between two completions every trajectory is
non-decreasing, so the maximum over the future sits at the last step before a completion (or the
new request's own last step): the check evaluates only those points (:func:`lookahead_fits`).
Consequence: the free pool never falls below the watermark (>= 1 block), so the free-block rule
never fires and the oracle **never preempts** (an engine raises :class:`InvariantError` if it
does). Because completions are part of the trajectories, the future usage of a fixed running set
does not change until the next admission. Whether a given request fits is not monotone in time,
though (a long request admitted later is smaller when a running one peaks), so the fast engine
computes the first step at which the blocked head fits and stops its jump there.

**The waiting queue's order** (``EngineInput.queue_key``): requests that were never admitted wait
in the order of a static key, ties in arrival order; ``None`` (or the arrival time itself) is vLLM's FCFS.
Shortest-output-first with aging ("sof", :func:`kvdro.sim.simulate`) is the key
``arrival + aging x predicted output length``. The walk of step 1 follows the key order and still
stops at the first request that does not fit (head-of-line blocking); preempted requests go to the
front, ahead of every never-admitted one, in the order above.

Token and block bookkeeping per sequence: after a prefill of P tokens its cache holds P tokens; each
decode step appends one token (a new 16-token block when the last one is full) and generates the
next; a request of output length xi leaves after its xi-th token (the last token is never cached).

Prefix caching (delta): a class's shared prefix of ``L_pre`` tokens occupies ``floor(L_pre/16)``
full blocks, stored once per engine and reference counted; a request whose class prefix is resident
skips those tokens' prefill; the blocks are freed when the last request using them leaves. A
request uses ``min(floor(L_pre/16), floor((L_in - 1)/16))`` of them (its own prompt may be shorter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvdro.hardware import BLOCK_TOKENS

__all__ = ["BLOCK_TOKENS", "EngineSpec", "EngineInput", "EngineOutput", "ceil_blocks", "grown_reservation",
           "lookahead_fits", "queue_order", "queue_ranks"]


def ceil_blocks(tokens: int) -> int:
    """Blocks of 16 tokens needed for ``tokens`` tokens."""
    return -(-int(tokens) // BLOCK_TOKENS)


def grown_reservation(reserve_blocks: int, prompt: int, window_blocks: int) -> int:
    """The reservation [blocks] of a hard-capped request re-admitted after outgrowing ``reserve_blocks``:
    its buffer beyond the prompt's ``ceil(prompt/16)`` blocks doubled (at least one block more),
    capped at ``window_blocks`` (the context window). Strictly larger than ``reserve_blocks`` below
    the cap, so a request is restarted at most ``log2(window_blocks) + 1`` times."""
    base = ceil_blocks(prompt)
    buffer = max(int(reserve_blocks) - base, 0)
    return min(int(window_blocks), base + max(2 * buffer, 1))


@dataclass(frozen=True)
class EngineSpec:
    """One micro-batch engine: its KV pool and vLLM settings.

    ``blocks``: KV blocks; ``watermark_blocks``: blocks a prefill must leave free (vLLM's 1%, every
    policy; 0 only with the safety rules off); ``free_block_rule``: v0's one-free-block check before
    every decode of a sequence (True for every policy; False only with the safety rules off);
    ``prefix_blocks``: blocks of each prefix key's shared prefix (index = key); ``hard``: a
    reservation is a cap (module docstring); ``window_blocks``: the context window in blocks, the
    largest reservation a hard-capped request grows to (needed when ``hard``); ``lookahead``: the
    oracle's admission look-ahead with the true output lengths (module docstring; needs the
    watermark >= 1 and the free-block rule, soft, and requests that reserve nothing).
    """

    blocks: int
    watermark_blocks: int
    max_num_seqs: int
    token_budget: int
    free_block_rule: bool
    prefix_blocks: tuple[int, ...] = ()
    hard: bool = False
    window_blocks: int = 0
    lookahead: bool = False

    def __post_init__(self) -> None:
        if self.hard and self.window_blocks < 1:
            raise ValueError("window_blocks: a hard reservation needs the context window in blocks (>= 1)")
        if self.lookahead and (self.hard or self.watermark_blocks < 1 or not self.free_block_rule):
            raise ValueError("lookahead: the oracle's look-ahead needs watermark_blocks >= 1, the free-block rule and hard=False")


@dataclass(frozen=True)
class EngineInput:
    """The requests one engine serves, sorted by arrival (int64 arrays of equal length).

    arrival_ps [ps]; prompt = L_in [tokens]; output = xi after the context cap (>= 1) [tokens];
    reserve_blocks = ceil((L_in + eta)/16) (0 for ``vllm``; a hard-capped request's grows on
    re-admission, :func:`grown_reservation`); prefix_key = index into
    ``EngineSpec.prefix_blocks`` or -1; shared_blocks = prefix blocks this request can use;
    queue_key [ps] = the waiting queue's static order key of a never-admitted request (ties by
    index), ``None`` = FCFS (module docstring).
    """

    arrival_ps: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    reserve_blocks: np.ndarray
    prefix_key: np.ndarray
    shared_blocks: np.ndarray
    queue_key: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arrival_ps.size)


def queue_order(inp: EngineInput) -> tuple[np.ndarray, np.ndarray, bool]:
    """(rank of each request in the waiting queue's order, request of each rank, FCFS?) as int64
    arrays: the order of ``inp.queue_key`` with ties by index; the identity (FCFS) when the key is
    ``None`` (then both are the same ``arange``: read it, do not write it)."""
    n = len(inp)
    ident = np.arange(n, dtype=np.int64)
    if inp.queue_key is None:
        return ident, ident, True
    by_rank = np.lexsort((ident, np.asarray(inp.queue_key, dtype=np.int64)))
    rank = np.empty(n, dtype=np.int64)
    rank[by_rank] = ident
    return rank, by_rank, bool(np.array_equal(by_rank, ident))


def queue_ranks(inp: EngineInput) -> tuple[list[int], list[int], bool]:
    """:func:`queue_order` as Python lists (the pure-Python engines index them per event)."""
    rank, by_rank, fifo = queue_order(inp)
    if fifo and inp.queue_key is None:
        ident = rank.tolist()
        return ident, ident, True
    return rank.tolist(), by_rank.tolist(), fifo


def lookahead_fits(running, new, prefix_blocks, limit: int) -> bool:
    """The oracle's look-ahead (module docstring): does the block usage stay <= ``limit`` blocks at
    every future decode step when ``new`` joins ``running``?

    ``running``: (cached tokens, decode steps left, shared blocks, prefix key) per running sequence
    (decode steps left >= 1; a sequence that finishes without another decode step is left out);
    ``new``: the same for the request being admitted, its cached tokens after the prefill. At future
    decode step d = 0, 1, ... a sequence with ``kv`` cached tokens and ``left`` steps holds
    ``ceil((kv + d + 1)/16) - shared`` own blocks while d < left; a prefix key's
    ``prefix_blocks[key]`` blocks are held while any of its users is. Every term is non-decreasing
    until it ends, so the maximum is at some sequence's last step d = left - 1: only those points
    (within the new request's life) are evaluated.
    """
    left_n = new[1]
    if left_n < 1:
        return True  # it finishes at its prefill: vLLM's own check is all there is
    seqs = list(running) + [new]
    for d in sorted({left - 1 for _, left, _, _ in running if left - 1 < left_n} | {left_n - 1}):
        used = 0
        keys = set()
        for kv, left, sh, key in seqs:
            if d < left:
                used += ceil_blocks(kv + d + 1) - sh
                if key >= 0:
                    keys.add(key)
        used += sum(prefix_blocks[key] for key in keys)
        if used > limit:
            return False
    return True


@dataclass
class EngineOutput:
    """Per request (arrays aligned with the input) and per engine (integers; time in ps).

    Per request: admit_ps (first admission, -1 never), first_token_ps, finish_ps, preemptions,
    recomputed_tokens (own cached tokens discarded by preemption), final_cap_tokens (16 x blocks
    held when it finished, shared ones included), generated (output tokens when it finished). Per engine: steps, prefill_steps, busy_ps,
    resident_integral (sum over steps of running sequences x step ps), decode_batch_integral and
    decode_ps (over decode steps only), kv_integral (blocks in use x step ps), end_ps (last step end),
    peak_blocks, free_blocks_end. ``trace``: per-step (t_ps, dur_ps, running, used_blocks) rows when
    asked (``record=True``), else None.
    """

    admit_ps: np.ndarray
    first_token_ps: np.ndarray
    finish_ps: np.ndarray
    preemptions: np.ndarray
    recomputed_tokens: np.ndarray
    final_cap_tokens: np.ndarray
    generated: np.ndarray
    steps: int = 0
    prefill_steps: int = 0
    busy_ps: int = 0
    resident_integral: int = 0
    decode_batch_integral: int = 0
    decode_ps: int = 0
    kv_integral: int = 0
    end_ps: int = 0
    peak_blocks: int = 0
    free_blocks_end: int = 0
    trace: list | None = field(default=None)

    @classmethod
    def empty(cls, n: int) -> EngineOutput:
        neg = lambda: np.full(n, -1, dtype=np.int64)  # noqa: E731
        zero = lambda: np.zeros(n, dtype=np.int64)  # noqa: E731
        return cls(neg(), neg(), neg(), zero(), zero(), zero(), zero())

    def totals(self) -> dict[str, int]:
        """The per-engine integers, for comparing two engines."""
        keys = ("steps", "prefill_steps", "busy_ps", "resident_integral", "decode_batch_integral", "decode_ps",
                "kv_integral", "end_ps", "peak_blocks", "free_blocks_end")
        return {k: int(getattr(self, k)) for k in keys}
