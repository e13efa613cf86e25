"""LightLLM: admit a request only if the future peak of the running batch's tokens fits the pool.

Source: LightLLM 1.0.1, commit fc72ffab9a3455cfb571f22d45ab777cc29de0de (July 2025):
``lightllm/server/router/req_queue/continues_batch/impl.py`` ``ContinuesBatchQueue._can_add_new_req``
and ``generate_new_batch``; ``lightllm/server/core/objs/req.py`` ``Req.get_tuple_tokens``
(``ADDED_OUTPUT_LEN`` = 6); ``lightllm/server/router/req_queue/base_queue.py`` ``is_busy``;
``lightllm/server/router/manager.py`` ``RouterManager._step`` and ``_can_decode``;
``lightllm/server/router/pause_strategy.py`` ``select_paused_reqs`` (``Fcfs``). Defaults
(``api_cli.py``, ``api_start.py``): ``running_max_req_size`` 1000, ``router_token_ratio`` 0.0,
``router_max_new_token_len`` 1024, ``batch_max_tokens`` = the window without chunked prefill.

* **Admission** (:func:`can_add_new_req`): every running request and every request of the new batch
  is a pair (a, b) = (tokens it holds: prompt + generated + 1, tokens it may still add:
  max(0, max_new - generated - 1) + 6). Sorted by b descending, the batch's token use peaks at
  ``max_k (k b_k + sum_{i<=k} a_i)`` (the k requests with the longest futures still running when the
  k-th ends): the request is admitted if that peak is below the pool (``max_total_token_num``), the
  batch has room (``running_max_req_size``) and the new batch's prompts fit ``batch_max_tokens``.
  The first that does not fit stops the walk (FCFS). With ``router_token_ratio`` 0 the engine is
  always "busy" (:func:`is_busy`), so b uses the full ``max_new``.
* **Steps** (``RouterManager._step``): a prefill step of the new batch when there is one, then a
  decode step of the whole running batch; a decode that does not fit (not expected: admission
  guarantees the peak) pauses the newest request (``Fcfs`` reversed) to the front of the queue.

We follow the ``--disable_chunked_prefill`` queue (``continues_batch``); the default chunked queue
adds ``(router_max_wait_tokens + 1) x ceil(remaining prefill / chunk)`` (7 tokens for a running
request) to each b and prefills in chunks. Left out: the prompt cache, DP and PD modes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdro.sim.engines.knobs import positive_int, ratio
from kvdro.sim.engines.state import EngineState, Step

__all__ = ["Config", "on_arrival", "tuple_tokens", "is_busy", "can_add_new_req", "generate_new_batch",
           "can_decode", "schedule"]

NAME = "lightllm"
SOURCE = "LightLLM 1.0.1 lightllm/server/router/req_queue/continues_batch/impl.py (_can_add_new_req)"


@dataclass(frozen=True)
class Config:
    """LightLLM's knobs (``api_cli.py`` names): ``running_max_req_size`` [requests],
    ``batch_max_tokens`` [prompt tokens per prefill; ``None`` = the window], ``router_token_ratio``
    (busy threshold on the pool's use), ``router_max_new_token_len`` [tokens; the estimate when not
    busy], ``added_output_len`` (``ADDED_OUTPUT_LEN``, tokens)."""

    running_max_req_size: int = 1000
    batch_max_tokens: int | None = None
    router_token_ratio: float = 0.0
    router_max_new_token_len: int = 1024
    added_output_len: int = 6
    page_size: int = 1

    def __post_init__(self) -> None:
        positive_int("running_max_req_size", self.running_max_req_size)
        if self.batch_max_tokens is not None:
            positive_int("batch_max_tokens", self.batch_max_tokens)
        ratio("router_token_ratio", self.router_token_ratio)
        positive_int("router_max_new_token_len", self.router_max_new_token_len)
        positive_int("added_output_len", self.added_output_len, at_least=0)
        if self.page_size != 1:
            raise ValueError(f"page_size: LightLLM allocates token slots (page_size 1), got {self.page_size!r}")


def on_arrival(st: EngineState, cfg: Config, j: int) -> None:
    """A new request joins the tail of ``waiting_req_list``."""
    st.waiting.append(j)


def is_busy(st: EngineState, cfg: Config) -> bool:
    """``BaseQueue.is_busy``: the pool's use is at least ``router_token_ratio``."""
    return st.used_pages / st.pages >= cfg.router_token_ratio


def tuple_tokens(st: EngineState, cfg: Config, j: int, busy: bool) -> tuple[int, int]:
    """``Req.get_tuple_tokens``: (a, b) = (held tokens + 1, tokens still to come + ADDED_OUTPUT_LEN)."""
    out = st.generated[j]
    cur_max_new = st.max_new[j] if busy else min(st.max_new[j], max(int(1.1 * out), cfg.router_max_new_token_len))
    a = max(st.prompt[j] + out + 1, st.computed[j] + 1)
    b = max(0, cur_max_new - out - 1) + cfg.added_output_len
    return a, b


def can_add_new_req(st: EngineState, cfg: Config, cache: list[tuple[int, int]], j: int, busy: bool,
                    prefill_tokens: int, paused: int, window: int) -> tuple[bool, int]:
    """``ContinuesBatchQueue._can_add_new_req`` (module docstring); ``cache`` grows by ``j``'s pair."""
    cache.append(tuple_tokens(st, cfg, j, busy))
    cache.sort(key=lambda x: -x[1])
    b = np.array([e[1] for e in cache], dtype=np.int64)
    a_cum = np.cumsum([e[0] for e in cache], dtype=np.int64)
    need = int((b * np.arange(1, len(cache) + 1) + a_cum).max())
    ok_token = need < st.pages * st.page_size
    ok_req = len(cache) + paused - (1 if st.computed[j] == 0 and st.generated[j] > 0 else 0) <= cfg.running_max_req_size
    prefill_tokens += st.num_tokens(j)
    ok_prefill = prefill_tokens <= (window if cfg.batch_max_tokens is None else cfg.batch_max_tokens)
    return ok_token and ok_req and ok_prefill, prefill_tokens


def generate_new_batch(st: EngineState, cfg: Config, window: int) -> list[int]:
    """``ContinuesBatchQueue.generate_new_batch``: FCFS while :func:`can_add_new_req` holds."""
    paused = sum(1 for j in st.waiting if st.generated[j] > 0)
    if not st.waiting or len(st.running) + paused >= cfg.running_max_req_size:
        return []
    busy = is_busy(st, cfg)
    cache = [tuple_tokens(st, cfg, j, busy) for j in st.running]
    batch, prefill = [], 0
    for j in st.waiting:
        ok, prefill = can_add_new_req(st, cfg, cache, j, busy, prefill, paused, window)
        if not ok:
            break
        batch.append(j)
    return batch


def can_decode(st: EngineState) -> bool:
    """``RouterManager._can_decode``: one new token per running request fits the pool."""
    return sum(st.pages_needed(j, st.computed[j] + 1) for j in st.running) <= st.free


def schedule(st: EngineState, cfg: Config) -> Step:
    """``RouterManager._step`` as two engine steps: the new batch's prefill, then a decode step."""
    step = Step()
    if not st.extra.get("decode_next"):
        batch = generate_new_batch(st, cfg, st.extra["window"])
        if batch:
            for j in batch:
                st.waiting.remove(j)
                if not st.allocate(j, st.num_tokens(j)):
                    raise AssertionError("lightllm: admitted a prompt beyond the free token slots")
                st.running.append(j)
                step.scheduled[j] = st.num_tokens(j)
            st.extra["decode_next"] = True
            return step
    st.extra["decode_next"] = False
    while not can_decode(st):  # select_paused_reqs with Fcfs: the newest first, back to the queue's front
        j = st.running.pop()
        st.evict(j)
        st.waiting.appendleft(j)
        step.preempted.append(j)
    for j in st.running:
        st.allocate(j, st.computed[j] + 1)
        step.scheduled[j] = 1
    return step
