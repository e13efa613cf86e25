"""SGLang: prefill first, admission by ``PrefillAdder`` against the new-token ratio; retract on OOM.

Source: SGLang 0.5 (``python/sglang/srt``), read at commit 00550cd11b35def9d584bf761a1e32729c20a21d
(2026) for the rules below, which have the same shape since 0.4: ``managers/schedule_policy.py``
``PrefillAdder`` (``rem_total_tokens``, ``add_one_req``, ``add_chunked_req``,
``CLIP_MAX_NEW_TOKENS`` = ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` = 4096);
``managers/scheduler.py`` ``get_new_batch_prefill``, ``update_running_batch`` (ratio decay, retract,
``batch_is_full``), the idle reset of ``new_token_ratio``; ``managers/schedule_batch.py``
``ScheduleBatch.check_decode_mem`` and ``retract_decode`` (``retract_decode_steps`` = 20);
the ratio constants of ``server_args.py`` / ``global_config.py``: ``init_new_token_ratio`` =
min(0.7 x ``schedule_conservativeness``, 1), ``min_new_token_ratio`` = min(0.14 x init, 1),
decay (init - min) / ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` (600 decode steps), so 0.7 -> 0.098
after 600 quiet decode steps (0.001003 per step). ``chunked_prefill_size`` 8192 (an 80 GB GPU),
``max_prefill_tokens`` 16384, ``page_size`` 1 (token slots), mixed chunks off.

One event-loop iteration (:func:`schedule`):

1. :func:`get_new_batch_prefill`: unless the running batch is marked full (``batch_is_full``, set
   when admission ran out of tokens, cleared when a batch shrinks as the scheduler filters it: see
   :func:`schedule`), a
   :class:`PrefillAdder` walks the waiting queue FCFS. Its ``rem_total_tokens`` = free slots minus
   ``ratio x sum over running requests of min(max_new - generated, 4096)`` minus what it already
   admitted (each admitted request's extend length plus its own ``min(max_new, 4096)``). A request
   is admitted if ``extend + min(max_new, 4096) < rem_total_tokens``; a prompt beyond the chunk
   budget is cut to a chunk (continued first in the next prefill). If anything was admitted, the
   step is a **prefill-only** step (decodes wait).
2. Otherwise a **decode step** (:func:`update_running_batch`): if the free slots do not cover one
   new token per running request, :func:`retract_decode` retracts requests -- **fewest generated
   tokens first, ties: the longest prompt** -- until the rest fit, puts them at the **tail** of the
   waiting queue (their cache dropped; prompt + generated is prefilled again), and resets the ratio
   to ``min(1, (sum generated + 20 x remaining) / sum max_new)`` over the remaining requests;
   otherwise the ratio decays by one step, down to its floor. The ratio is reset to its initial value
   when the engine is idle.

The radix cache (on by default in SGLang) runs only when the trace carries prefix keys
(``simulate(..., prefix_keys=)``, :mod:`kvdro.sim.engines.radix_cache`): admission counts its evictable
tokens as available, a request prefills only past its matched prefix, and a retracted request's
prompt stays cached until evicted. Without keys it is left out: no two prompts share tokens, and a
retracted request recomputes its prompt where SGLang would hit it (retractions are rare in our runs).
Left out as well: overlap scheduling, the priority and cache-aware policies, mixed chunks
(``--enable-mixed-chunk``, off by default), speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdro.sim.engines.knobs import positive_int, ratio
from kvdro.sim.engines.state import EngineState, Step

__all__ = ["Config", "PrefillAdder", "AddReqResult", "on_arrival", "on_idle", "on_finish", "get_new_batch_prefill",
           "check_decode_mem", "retract_decode", "update_running_batch", "schedule"]

NAME = "sglang"
SOURCE = ("SGLang 0.5 python/sglang/srt/managers/schedule_policy.py (PrefillAdder), scheduler.py "
          "(get_new_batch_prefill, update_running_batch), schedule_batch.py (retract_decode)")


@dataclass(frozen=True)
class Config:
    """SGLang's knobs (``ServerArgs`` names and the constants above).

    ``schedule_conservativeness`` scales the initial ratio; ``init_new_token_ratio`` (0.7),
    ``min_new_token_ratio_factor`` (0.14), ``new_token_ratio_decay_steps`` (600),
    ``clip_max_new_tokens`` (4096 tokens), ``retract_decode_steps`` (20 tokens per request),
    ``chunked_prefill_size`` / ``max_prefill_tokens`` [tokens per prefill step],
    ``max_running_requests`` (SGLang derives it from its pool; we use vLLM's 256 so that the batch
    cap does not differ between presets), ``page_size`` [tokens].
    """

    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    clip_max_new_tokens: int = 4096
    retract_decode_steps: int = 20
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 256
    page_size: int = 1

    def __post_init__(self) -> None:
        ratio("schedule_conservativeness", self.schedule_conservativeness, high=float("inf"), low_open=True)
        ratio("init_new_token_ratio", self.init_new_token_ratio)
        ratio("min_new_token_ratio_factor", self.min_new_token_ratio_factor)
        positive_int("new_token_ratio_decay_steps", self.new_token_ratio_decay_steps)
        positive_int("clip_max_new_tokens", self.clip_max_new_tokens)
        positive_int("retract_decode_steps", self.retract_decode_steps, at_least=0)
        page = positive_int("page_size", self.page_size)
        positive_int("chunked_prefill_size", self.chunked_prefill_size, at_least=page,
                     why="a chunk must hold at least one page")
        positive_int("max_prefill_tokens", self.max_prefill_tokens, at_least=page,
                     why="the prefill budget must hold at least one page")
        positive_int("max_running_requests", self.max_running_requests)

    @property
    def init_ratio(self) -> float:
        """``init_new_token_ratio`` = min(0.7 x schedule_conservativeness, 1)."""
        return min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)

    @property
    def min_ratio(self) -> float:
        """``min_new_token_ratio`` = min(init x 0.14, 1) (0.098 by default)."""
        return min(self.init_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def decay(self) -> float:
        """``new_token_ratio_decay`` = (init - min) / decay steps, per decode step."""
        return (self.init_ratio - self.min_ratio) / self.new_token_ratio_decay_steps


class AddReqResult:
    """``schedule_policy.AddReqResult``."""

    CONTINUE, NO_TOKEN, OTHER = "CONTINUE", "NO_TOKEN", "OTHER"


class PrefillAdder:
    """``schedule_policy.PrefillAdder``: the remaining budgets of one prefill pass [tokens]."""

    def __init__(self, st: EngineState, cfg: Config, new_token_ratio: float):
        self.st, self.cfg = st, cfg
        self.rem_input_tokens = cfg.max_prefill_tokens
        self.rem_chunk_tokens = cfg.chunked_prefill_size
        clip = cfg.clip_max_new_tokens
        # max(0, .): only a request past its max_new (the "policy-soft" arm, kvdro.sim.engine_choice) has none left
        self.rem_total_token_offset = sum(max(0, min(st.max_new[r] - st.generated[r], clip)) * new_token_ratio
                                          for r in st.running)
        self.cur_rem_token_offset = 0
        self.can_run: dict[int, int] = {}  # request -> extend tokens of this pass
        self.new_chunked_req: int | None = None

    @property
    def _available(self) -> int:
        """``available_size() + evictable_size()`` [tokens]: free slots (nothing evictable without prefix
        keys; with them, the radix cache's unlocked tokens, :mod:`kvdro.sim.engines.radix_cache`)."""
        if self.st.prefix is not None:
            return self.st.free * self.st.page_size + self.st.prefix.evictable
        return self.st.free * self.st.page_size

    @property
    def rem_total_tokens(self) -> float:
        return self._available - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._available - self.cur_rem_token_offset

    def _ceil_paged(self, tokens: int) -> int:
        page = self.cfg.page_size
        return -(-tokens // page) * page

    def budget_state(self) -> str:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, extend: int, max_new_tokens: int) -> None:
        extend = self._ceil_paged(extend)
        self.rem_total_token_offset += extend + max_new_tokens
        self.cur_rem_token_offset += extend
        self.rem_input_tokens -= extend
        self.rem_chunk_tokens -= extend

    def add_chunked_req(self, j: int) -> int | None:
        """Continue the chunked request ``j``: as much of its rest as the chunk and total budgets
        allow; its ``min(max_new, clip)`` counts once its last chunk is in. Returns ``j`` if still chunked."""
        st = self.st
        rest = st.num_tokens(j) - st.computed[j]
        room = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        truncated = rest > room
        extend = min(rest, room)
        self.can_run[j] = extend
        self._update_prefill_budget(extend, 0 if truncated else min(st.max_new[j], self.cfg.clip_max_new_tokens))
        return j if truncated else None

    def add_one_req(self, j: int) -> str:
        """Admit waiting request ``j`` if ``extend + min(max_new, clip) < rem_total_tokens``; cut its
        prompt to the chunk budget when it does not fit the chunk."""
        st = self.st
        extend = st.num_tokens(j)  # computed is 0: a new or retracted request prefills prompt + generated
        cache = st.prefix  # the radix cache (prefix keys only): extend_input_len excludes the matched prefix
        if cache is not None:
            extend -= cache.match_prefix(st, j)
        total_tokens = extend + min(st.max_new[j], self.cfg.clip_max_new_tokens)
        input_tokens = self._ceil_paged(extend)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens > self.rem_input_tokens and self.can_run:
            return AddReqResult.OTHER
        if cache is not None:  # _lock_node: the matched prefix leaves the evictable size; check again
            cache.lock(j)
            if total_tokens >= self.rem_total_tokens:
                cache.unlock(j)
                return AddReqResult.NO_TOKEN
        if input_tokens <= self.rem_chunk_tokens:
            self.can_run[j] = extend
            self._update_prefill_budget(extend, min(st.max_new[j], self.cfg.clip_max_new_tokens))
        else:
            trunc = self.rem_chunk_tokens // self.cfg.page_size * self.cfg.page_size
            if trunc <= 0:
                if cache is not None:
                    cache.unlock(j)
                return AddReqResult.OTHER
            self.can_run[j] = trunc
            self.new_chunked_req = j
            self._update_prefill_budget(trunc, 0)
        if cache is not None:
            cache.admit(st, j)
        return self.budget_state()


def on_arrival(st: EngineState, cfg: Config, j: int) -> None:
    """A new request joins the tail of ``waiting_queue``."""
    st.waiting.append(j)


def on_idle(st: EngineState, cfg: Config) -> None:
    """The event loop with no batch to run resets ``new_token_ratio`` to its initial value."""
    st.extra["new_token_ratio"] = cfg.init_ratio
    st.extra["batch_is_full"] = False


def on_finish(st: EngineState, cfg: Config, done: list[int], decode: bool) -> None:
    """Requests finished in the last step: the batch they ran in shrinks when the scheduler next
    filters it (:func:`schedule`), and a batch that shrank is no longer full."""
    if done:
        st.extra["shrank"] = True


def get_new_batch_prefill(st: EngineState, cfg: Config) -> Step:
    """``Scheduler.get_new_batch_prefill``: the chunked request's next chunk, then FCFS admission."""
    chunked = st.extra.get("chunked_req")
    if (st.extra.get("batch_is_full") or not st.waiting) and chunked is None:
        return Step()
    if len(st.running) >= cfg.max_running_requests and chunked is None:
        st.extra["batch_is_full"] = True
        return Step()
    adder = PrefillAdder(st, cfg, st.extra["new_token_ratio"])
    if chunked is not None:
        chunked = adder.add_chunked_req(chunked)
    for j in list(st.waiting):
        if len(adder.can_run) >= cfg.max_running_requests - len(st.running):
            st.extra["batch_is_full"] = True
            break
        res = adder.add_one_req(j)
        if j in adder.can_run:
            st.waiting.remove(j)
        if res != AddReqResult.CONTINUE:
            if res == AddReqResult.NO_TOKEN:
                st.extra["batch_is_full"] = True
            break
    st.extra["chunked_req"] = adder.new_chunked_req if adder.new_chunked_req is not None else chunked
    step = Step()
    if st.prefix is not None and adder.can_run:  # alloc_for_extend: evict_from_tree_cache first
        st.prefix.evict_if_needed(st, sum(adder.can_run.values()))
        st.prefix.pending.update(adder.can_run)
    for j, extend in adder.can_run.items():
        if not st.allocate(j, st.computed[j] + extend):
            raise AssertionError("sglang: PrefillAdder admitted more tokens than the pool holds")
        step.scheduled[j] = extend
    for j in step.scheduled:  # completed prefills join the running batch (the chunked one stays out)
        if j != st.extra["chunked_req"] and j not in st.running:
            st.running.append(j)
    return step


def check_decode_mem(st: EngineState, reqs: list[int]) -> bool:
    """``ScheduleBatch.check_decode_mem``: free slots cover the next token of every request in ``reqs``."""
    need = sum(st.pages_needed(j, st.computed[j] + 1) for j in reqs)
    if st.prefix is not None:  # with the radix cache, evict_from_tree_cache first
        st.prefix.evict_if_needed(st, need)
    return need <= st.free


def retract_decode(st: EngineState, cfg: Config) -> tuple[list[int], float]:
    """``ScheduleBatch.retract_decode``: retract the requests with the fewest generated tokens (ties:
    the longest prompt) until the others' next decode fits; returns (retracted, new ratio)."""
    order = sorted(st.running, key=lambda j: (st.generated[j], -st.prompt[j]), reverse=True)
    retracted = []
    first = True
    while first or not check_decode_mem(st, order):
        if len(order) == 1:
            break
        first = False
        j = order.pop()
        retracted.append(j)
        st.evict(j)
    st.running[:] = [j for j in st.running if j not in set(retracted)]
    decoded = sum(st.generated[j] for j in st.running)
    max_new = sum(st.max_new[j] for j in st.running)
    new_ratio = min(1.0, (decoded + cfg.retract_decode_steps * len(st.running)) / max_new)
    return retracted, new_ratio


def update_running_batch(st: EngineState, cfg: Config) -> Step:
    """``Scheduler.update_running_batch``: retract if the decode does not fit (retracted requests to
    the tail, the ratio reset), else decay the ratio; then one decode token per running request."""
    step = Step()
    if not check_decode_mem(st, st.running):
        retracted, st.extra["new_token_ratio"] = retract_decode(st, cfg)
        st.waiting.extend(retracted)
        step.preempted.extend(retracted)
        st.extra["batch_is_full"] = False
    else:
        st.extra["new_token_ratio"] = max(st.extra["new_token_ratio"] - cfg.decay, cfg.min_ratio)
    for j in st.running:
        if not st.allocate(j, st.computed[j] + 1):
            raise AssertionError("sglang: a decode slot is missing after check_decode_mem")
        step.scheduled[j] = 1
    return step


def schedule(st: EngineState, cfg: Config) -> Step:
    """One event-loop iteration, ``Scheduler.get_next_batch_to_run`` (module docstring): a prefill
    step if anything is admitted, else a decode step.

    ``batch_is_full`` is cleared where SGLang clears it: before the prefill pass, when the last
    step was a prefill batch that shrank as it was filtered (a request finished at its prefill, or
    the chunked request was moved out); after a prefill pass that admitted nothing, when the last
    step was a decode in which requests finished (``update_running_batch``'s ``filter_batch`` --
    one step later than the finish, as in the engine; also when that emptied the running batch)."""
    st.extra.setdefault("new_token_ratio", cfg.init_ratio)
    if st.prefix is not None:  # the last prefill's results: cache_unfinished_req
        st.prefix.commit(st)
    shrank = st.extra.pop("shrank", False)
    last_prefill = st.extra.pop("last_prefill", False)
    if last_prefill and (shrank or st.extra.get("chunked_req") is not None):
        st.extra["batch_is_full"] = False
    step = get_new_batch_prefill(st, cfg)
    if step.scheduled:
        st.extra["last_prefill"] = True
        return step
    if shrank and not last_prefill:
        st.extra["batch_is_full"] = False
    if not st.running:
        return step
    return update_running_batch(st, cfg)
