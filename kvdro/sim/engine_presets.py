"""The reference engine of the presets: an engine's rules (:mod:`kvdro.sim.engines`) run step by step.

One pass of the loop is one engine step, as the engines run it:

1. requests that have arrived join the waiting queue (the preset's ``on_arrival``);
2. the preset forms the step (its ``schedule``: admission, token budget, chunks, preemption or
   retraction, ratio updates), a map request -> new tokens;
3. the step lasts the hardware model's time of its batch: prefill tokens (with their causal
   attention pairs) beside decoding sequences (with the tokens their attention reads)
   (:func:`step_ps`, the hardware model's mixed step);
4. every request whose computed tokens reach its token count samples one token (the first after its
   prefill, or the next); a request that reached its limit finishes and frees its pages.

A preset may form an empty step (LightLLM's decode after a batch that finished at its prefill); an
engine with nothing running and nothing it can admit waits for the next arrival, and raises
:class:`~kvdro.sim.InvariantError` if none is left. :func:`run_preset` returns the same
:class:`~kvdro.sim.scheduler.EngineOutput` as the vLLM v0 engines (block counts in 16-token blocks);
:func:`replay_steps` runs the same loop with steps in place of time
(:func:`kvdro.sim.engines.step_trace`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvdro.hardware import BLOCK_TOKENS, mixed_step_times
from kvdro.sim.engines import rules
from kvdro.sim.engines.state import EngineState
from kvdro.sim.envelope import check_inputs
from kvdro.sim.invariants import InvariantError
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock, seconds_to_ps

__all__ = ["run_preset", "replay", "replay_steps", "step_ps", "preset_state"]


def step_ps(clock: StepClock, prefill_tokens: int, pairs: int, decode_seqs: int, context_tokens: int, *,
            chunks: int = 1, prefill_kv_tokens: int | None = None) -> int:
    """Duration [ps] of a step with ``prefill_tokens`` prompt tokens in ``chunks`` chunks (``pairs``
    causal attention pairs, reading ``prefill_kv_tokens`` K/V tokens with their prefixes) beside
    ``decode_seqs`` decoding sequences whose attention reads ``context_tokens`` tokens.

    A decode-only step, and a prefill-only step of whole prompts (no chunk continues a cached
    prefix), take the clock's own durations (those of the vLLM v0 engines); any other step -- a
    mixed step, a chunk continuing a prompt -- is :func:`kvdro.hardware.mixed_step_times` of the
    whole batch (linear layers on prefill + decode rows, each part's attention, an LM head row per
    decode and per chunk)."""
    kv = prefill_tokens if prefill_kv_tokens is None else prefill_kv_tokens
    if decode_seqs == 0 and kv == prefill_tokens:
        return clock.prefill_ps(prefill_tokens, pairs)
    if prefill_tokens == 0:
        return clock.decode_ps(decode_seqs, context_tokens)
    cfg = clock.config
    sec = mixed_step_times(clock.model, clock.gpu, cfg.tp, cfg.pp, np.array([prefill_tokens]), np.array([decode_seqs]),
                           np.array([context_tokens]), prefill_seqs=np.array([chunks]),
                           prefill_attention_tokens2=np.array([pairs], dtype=float), prefill_kv_tokens=np.array([kv]))
    return seconds_to_ps(float(sec[0]))


#: The presets whose prefix cache the trace's prefix keys drive (on by default in those engines).
PREFIX_ENGINES: tuple[str, ...] = ("vllm-v1", "sglang")


def preset_state(engine: str, cfg, *, prompt, limit, max_new, pages: int, window: int,
                 prefix_keys: list | None = None) -> EngineState:
    """The state one preset engine starts from (``pages`` of ``cfg.page_size`` tokens).

    ``prefix_keys``: per request (arrival order) the keys of its full 16-token prompt blocks
    (:func:`kvdro.datasets.prefix_block_keys`), or None (no sharing: the engine as before). With keys,
    ``vllm-v1`` (``enable_prefix_caching``) runs :class:`~kvdro.sim.engines.free_queue.HashedBlockPool`
    and ``sglang`` :class:`~kvdro.sim.engines.radix_cache.RadixCache`; another preset, or a block or
    page size the 16-token keys do not describe, raises ValueError naming ``prefix_keys``."""
    st = EngineState([int(v) for v in prompt], [int(v) for v in limit], [int(v) for v in max_new],
                     pages=int(pages), page_size=int(cfg.page_size))
    st.extra["window"] = int(window)
    if prefix_keys is not None:
        st.prefix = prefix_cache(engine, cfg, prefix_keys, pages=int(pages))
    return st


def prefix_cache(engine: str, cfg, prefix_keys: list, *, pages: int):
    """The prefix cache ``engine`` keeps over ``prefix_keys`` (:func:`preset_state`), None if switched off."""
    if engine not in PREFIX_ENGINES:
        raise ValueError(f"prefix_keys: prefix sharing is modelled for {PREFIX_ENGINES}, not {engine!r}")
    if cfg.page_size != (BLOCK_TOKENS if engine == "vllm-v1" else 1):
        raise ValueError(f"prefix_keys: the keys describe {BLOCK_TOKENS}-token blocks; {engine} with page size "
                         f"{cfg.page_size} is not modelled with them")
    if engine == "vllm-v1":
        from kvdro.sim.engines.free_queue import HashedBlockPool

        return HashedBlockPool(pages, cfg.block_size, prefix_keys) if cfg.enable_prefix_caching else None
    from kvdro.sim.engines.radix_cache import RadixCache

    return RadixCache(prefix_keys)


def _loop(engine: str, cfg, st: EngineState, arrival: list[int],
          duration: Callable[..., int], on_step: Callable) -> int:
    """The engine loop of the module docstring; returns the end time. ``on_step(t, dur, step, done, decode)``."""
    r = rules(engine)
    on_arrival = r.on_arrival
    on_idle = getattr(r, "on_idle", None)
    on_finish = getattr(r, "on_finish", None)
    n = len(arrival)
    t, nxt, left = 0, 0, n
    empty_in_a_row = 0
    while left:
        while nxt < n and arrival[nxt] <= t:
            on_arrival(st, cfg, nxt)
            nxt += 1
        if not st.waiting and not st.running and st.extra.get("chunked_req") is None:
            if on_idle is not None:
                on_idle(st, cfg)
            t = max(t, arrival[nxt])
            continue
        step = r.schedule(st, cfg)
        st.steps += 1
        if not step.scheduled:
            dur = duration(0, 0, 0, 0, 0, 0)
            t += dur
            on_step(t, dur, step, [], False)
            if step.preempted:
                continue
            empty_in_a_row += 1
            if empty_in_a_row < 2:
                continue
            if nxt >= n:
                raise InvariantError(f"{engine}: waiting requests but nothing running and nothing admissible")
            t = max(t, arrival[nxt])
            empty_in_a_row = 0
            continue
        empty_in_a_row = 0
        pre = pairs = dec = ctx = chunks = kv = 0
        for j, k in step.scheduled.items():
            c = st.computed[j]
            if k == 1 and st.generated[j] >= 1 and c + 1 == st.num_tokens(j):
                dec += 1
                ctx += c + 1
            else:
                pre += k
                pairs += (c + k) * (c + k) - c * c
                chunks += 1
                kv += c + k
        dur = duration(pre, pairs, dec, ctx, chunks, kv)
        t += dur
        done = []
        for j, k in step.scheduled.items():
            st.computed[j] += k
            if st.computed[j] == st.num_tokens(j):
                st.generated[j] += 1
                if st.generated[j] == st.limit[j]:
                    done.append(j)
        on_step(t, dur, step, done, pre == 0)
        if done:
            gone = set(done)
            st.running[:] = [j for j in st.running if j not in gone]
            for j in done:
                st.release(j)
            left -= len(done)
            if on_finish is not None:
                on_finish(st, cfg, done, pre == 0)
    return t


def run_preset(engine: str, cfg, spec: EngineSpec, inp: EngineInput, max_new: np.ndarray, clock: StepClock, *,
               window: int, record: bool = False, progress=None, prefix_keys: list | None = None) -> EngineOutput:
    """Simulate one engine of preset ``engine`` (knobs ``cfg``) step by step.

    ``inp.output`` is each request's generation limit (its true length after the window, or its
    ``max_new`` when smaller); ``max_new`` the ``max_new_tokens`` the engine sees; the pool is the
    ``spec.blocks`` 16-token blocks, in pages of ``cfg.page_size`` tokens. ``record=True`` keeps
    per-step rows ``(t_ps, dur_ps, scheduled, preempted, finished)``. ``prefix_keys``: per request its
    prompt blocks' keys (:func:`preset_state`); with them the output also carries ``prefix_hit_tokens``
    (per request, tokens taken from the prefix cache over its admissions) and ``prefill_tokens`` (the
    prefill and recompute tokens the engine computed)."""
    check_inputs(inp)  # the engines' common envelope (kvdro.sim.envelope); the clock limit is checked per step
    n = len(inp)
    pages = spec.blocks * BLOCK_TOKENS // cfg.page_size
    st = preset_state(engine, cfg, prompt=inp.prompt, limit=inp.output, max_new=max_new, pages=pages, window=window,
                      prefix_keys=prefix_keys)
    out = EngineOutput.empty(n)
    trace = [] if record else None
    acc = {"steps": 0, "prefill_steps": 0, "busy": 0, "resident": 0, "dbatch": 0, "dps": 0, "kvi": 0, "peak": 0}

    def on_step(t_end, dur, step, done, decode_only):
        if dur == 0:
            return
        if t_end >= MAX_CLOCK_PS:  # the same limit and error as every engine's
            raise ClockLimitError(clock.config.name, n, "the clock passed it before the queue drained")
        t0 = t_end - dur
        for j in step.scheduled:
            if out.admit_ps[j] < 0:
                out.admit_ps[j] = t0
            if st.generated[j] >= 1 and out.first_token_ps[j] < 0:
                out.first_token_ps[j] = t_end
        used = st.used_pages * st.page_size  # tokens of slots in use
        acc["steps"] += 1
        acc["busy"] += dur
        nrun = len(st.running)
        acc["resident"] += nrun * dur
        acc["kvi"] += used * dur
        acc["peak"] = max(acc["peak"], used)
        if decode_only:
            acc["dbatch"] += len(step.scheduled) * dur
            acc["dps"] += dur
        else:
            acc["prefill_steps"] += 1
        for j in done:
            out.finish_ps[j] = t_end
            out.final_cap_tokens[j] = st.held[j] * st.page_size
            out.generated[j] = st.generated[j]
        if trace is not None:
            trace.append((t0, dur, dict(step.scheduled), list(step.preempted), list(done)))
        if progress is not None and done:
            progress.update(len(done))

    def duration(pre, pairs, dec, ctx, chunks, kv):
        acc["prefill_tokens"] = acc.get("prefill_tokens", 0) + pre
        return step_ps(clock, pre, pairs, dec, ctx, chunks=chunks, prefill_kv_tokens=kv) if pre or dec else 0

    end = _loop(engine, cfg, st, inp.arrival_ps.tolist(), duration, on_step)
    out.preemptions[:] = st.preemptions
    out.recomputed_tokens[:] = st.recomputed
    out.steps, out.prefill_steps, out.busy_ps = acc["steps"], acc["prefill_steps"], acc["busy"]
    out.resident_integral = acc["resident"]
    out.kv_integral = acc["kvi"] // BLOCK_TOKENS  # 16-token blocks x ps
    out.decode_batch_integral, out.decode_ps = acc["dbatch"], acc["dps"]
    out.end_ps = end
    out.peak_blocks = -(-acc["peak"] // BLOCK_TOKENS)
    out.free_blocks_end = spec.blocks - (-(-st.used_pages * st.page_size // BLOCK_TOKENS))
    out.trace = trace
    if prefix_keys is not None:
        out.prefill_tokens = acc.get("prefill_tokens", 0)
        out.prefix_hit_tokens = np.array(st.prefix.hit_tokens if st.prefix is not None else [0] * n, dtype=np.int64)
    return out


def replay_steps(engine: str, cfg, *, arrival, prompt, limit, max_new, pages: int, window: int,
                 prefix_keys: list | None = None) -> list[tuple]:
    """The loop with one time unit per step: rows (step, {request: tokens}, preempted, finished),
    one per ``schedule()`` call, and an empty row for each step index at which nothing ran."""
    st = preset_state(engine, cfg, prompt=prompt, limit=limit, max_new=max_new, pages=pages, window=window,
                      prefix_keys=prefix_keys)
    return replay(engine, cfg, st, arrival)


def replay(engine: str, cfg, st: EngineState, arrival) -> list[tuple]:
    """:func:`replay_steps` on a state the caller made (and reads afterwards: the conformance tests)."""
    rows: list[tuple] = []

    def on_step(t_end, dur, step, done, decode_only):
        k = t_end - dur
        while len(rows) < k:  # idle steps before an arrival
            rows.append((len(rows), {}, [], []))
        rows.append((len(rows), dict(step.scheduled), list(step.preempted), list(done)))

    def unit(*batch):
        return 1

    _loop(engine, cfg, st, [int(a) for a in arrival], unit, on_step)
    return rows
