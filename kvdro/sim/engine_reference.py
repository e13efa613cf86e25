"""The reference engine: vLLM's scheduler (:mod:`kvdro.sim.scheduler`) executed step by step.

Plain and slow on purpose: every engine step is one pass of the loop, every running sequence is
touched in every decode step. It is the specification: the fast engine,
:mod:`kvdro.sim.engine_compiled`, must reproduce it exactly (``tests/test_sim_engines.py``).
"""

from __future__ import annotations

import heapq
from collections import deque

from kvdro.sim.envelope import check_envelope
from kvdro.sim.invariants import InvariantError
from kvdro.sim.scheduler import (BLOCK_TOKENS, EngineInput, EngineOutput, EngineSpec, ceil_blocks, grown_reservation,
                                 lookahead_fits, queue_ranks)
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock

__all__ = ["run_reference"]


def run_reference(spec: EngineSpec, inp: EngineInput, clock: StepClock, *, record: bool = False, progress=None) -> EngineOutput:
    """Simulate one engine step by step. ``record=True`` keeps a per-step trace (small runs only):
    rows ``(t_ps, dur_ps, kind, free_blocks, [(request, cached_tokens, capacity_tokens), ...])``.
    Raises ValueError / :class:`~kvdro.sim.timing.ClockLimitError` outside the engines' envelope
    (:mod:`kvdro.sim.envelope`), as the other engines do."""
    check_envelope(spec, inp, clock)
    n = len(inp)
    arr = inp.arrival_ps.tolist()
    L, X, R = inp.prompt.tolist(), inp.output.tolist(), inp.reserve_blocks.tolist()  # R grows when hard-capped
    K, S = inp.prefix_key.tolist(), inp.shared_blocks.tolist()
    pblocks = list(spec.prefix_blocks)
    out = EngineOutput.empty(n)
    admit, first, finish = out.admit_ps, out.first_token_ps, out.finish_ps
    g = [0] * n  # tokens generated so far
    kv = [0] * n  # tokens in the KV cache
    cap = [0] * n  # token capacity of the request's blocks (shared prefix blocks included)
    own = [0] * n  # blocks the request owns
    ref = [0] * len(pblocks)  # users of each resident prefix
    free = spec.blocks
    if spec.lookahead and any(R):
        raise ValueError("reserve_blocks: the oracle's look-ahead admits reactively (reserve nothing)")
    rank, by_rank, _ = queue_ranks(inp)
    front: deque[int] = deque()  # preempted requests, at the head of the waiting queue
    pool: list[int] = []  # ranks of never-admitted waiting requests (a heap: the queue key's order)
    limit = spec.blocks - spec.watermark_blocks
    running: list[int] = []
    trace = [] if record else None
    t, nxt = 0, 0
    st = {"steps": 0, "prefill_steps": 0, "busy": 0, "resident": 0, "dbatch": 0, "dps": 0, "kvi": 0, "peak": 0}

    def release(j: int) -> None:
        nonlocal free
        free += own[j]
        own[j] = 0
        key = K[j]
        if key >= 0:
            ref[key] -= 1
            if ref[key] == 0:
                free += pblocks[key]

    def account(dur: int, nrun: int) -> None:
        used = spec.blocks - free
        if free < 0:
            raise AssertionError("block conservation violated: more blocks in use than the pool holds")
        st["steps"] += 1
        st["busy"] += dur
        st["resident"] += nrun * dur
        st["kvi"] += used * dur
        st["peak"] = max(st["peak"], used)

    while True:
        if t >= MAX_CLOCK_PS:  # the drain limit, as in every engine (kvdro.sim.envelope)
            raise ClockLimitError(clock.config.name, n, "the clock passed it before the queue drained")
        while nxt < n and arr[nxt] <= t:
            heapq.heappush(pool, rank[nxt])
            nxt += 1
        if not front and not pool and not running:
            if nxt >= n:
                break
            t = arr[nxt]
            continue

        # 1. prefill-first: admit from the head of the waiting queue (preempted first, then by queue key)
        admitted: list[int] = []
        tokens = pairs = 0
        while front or pool:
            j = front[0] if front else by_rank[pool[0]]
            P = L[j] + g[j]
            key = K[j]
            sj = S[j] if key >= 0 else 0
            hit = key >= 0 and ref[key] > 0
            own_need = max(R[j], ceil_blocks(P)) - sj
            need = own_need + (pblocks[key] if key >= 0 and not hit else 0)
            if free - need < spec.watermark_blocks:
                break
            new = P - BLOCK_TOKENS * sj if hit else P
            if tokens + new > spec.token_budget or len(running) + len(admitted) + 1 > spec.max_num_seqs:
                break
            if spec.lookahead:
                traj = [(kv[i], X[i] - g[i], S[i], K[i]) for i in running]
                traj += [(kv[i], X[i] - g[i] - 1, S[i], K[i]) for i in admitted if X[i] - g[i] - 1 >= 1]
                if not lookahead_fits(traj, (P, X[j] - g[j] - 1, sj, key), pblocks, limit):
                    break
            if front:
                front.popleft()
            else:
                heapq.heappop(pool)
            free -= need
            if key >= 0:
                ref[key] += 1
            own[j], cap[j], kv[j] = own_need, BLOCK_TOKENS * (own_need + sj), P
            tokens += new
            pairs += P * P - (BLOCK_TOKENS * sj) ** 2 if hit else P * P
            if admit[j] < 0:
                admit[j] = t
            admitted.append(j)
        if admitted:
            running.extend(admitted)
            dur = clock.prefill_ps(tokens, pairs)
            account(dur, len(running))
            st["prefill_steps"] += 1
            if trace is not None:
                trace.append((t, dur, "prefill", free, [(j, kv[j], cap[j]) for j in running]))
            t += dur
            done = []
            for j in admitted:
                g[j] += 1
                if first[j] < 0:
                    first[j] = t
                if g[j] == X[j]:
                    done.append(j)
            if done:
                _finish(done, running, out, cap, g, t, release, progress)
            continue

        # 2. decode step, oldest first; a hard-capped sequence preempts itself; the free-block rule
        #    (and a soft overflow's missing block) preempts the newest
        preempted: list[int] = []

        def preempt(v: int) -> None:
            out.preemptions[v] += 1
            out.recomputed_tokens[v] += kv[v] - (BLOCK_TOKENS * S[v] if K[v] >= 0 else 0)
            release(v)
            kv[v] = cap[v] = 0
            preempted.append(v)

        i = 0
        while i < len(running):
            j = running[i]
            needs = kv[j] + 1 > cap[j]
            if needs and spec.hard:
                if R[j] >= spec.window_blocks:
                    raise InvariantError(f"reference engine: request {j} outgrew a reservation at the context window")
                running.pop(i)
                preempt(j)
                R[j] = grown_reservation(R[j], L[j], spec.window_blocks)
                continue
            req = 1 if (spec.free_block_rule or needs) else 0
            self_preempted = False
            while free < req:
                if len(running) - 1 > i:
                    v = running.pop()
                else:
                    v = running.pop(i)
                    self_preempted = True
                preempt(v)
                if self_preempted:
                    break
            if self_preempted:
                break
            if needs:
                own[j] += 1
                cap[j] += BLOCK_TOKENS
                free -= 1
            i += 1
        if preempted and spec.lookahead:
            raise InvariantError("reference engine: the oracle's look-ahead admitted a request that was then preempted")
        front.extendleft(preempted)
        if not running:
            if not preempted:
                raise InvariantError("reference engine: waiting requests but nothing running and nothing admissible")
            continue
        nb = len(running)
        ctx = 0
        for j in running:
            ctx += kv[j] + 1
        dur = clock.decode_ps(nb, ctx)
        account(dur, nb)
        st["dbatch"] += nb * dur
        st["dps"] += dur
        if trace is not None:
            trace.append((t, dur, "decode", free, [(j, kv[j] + 1, cap[j]) for j in running]))
        t += dur
        done = []
        for j in running:
            kv[j] += 1
            g[j] += 1
            if g[j] == X[j]:
                done.append(j)
        if done:
            _finish(done, running, out, cap, g, t, release, progress)

    out.steps, out.prefill_steps, out.busy_ps = st["steps"], st["prefill_steps"], st["busy"]
    out.resident_integral, out.kv_integral = st["resident"], st["kvi"]
    out.decode_batch_integral, out.decode_ps = st["dbatch"], st["dps"]
    out.end_ps, out.peak_blocks, out.free_blocks_end = t, st["peak"], free
    out.trace = trace
    return out


def _finish(done, running, out, cap, g, t, release, progress) -> None:
    gone = set(done)
    for j in done:
        out.finish_ps[j] = t
        out.final_cap_tokens[j] = cap[j]
        out.generated[j] = g[j]
        release(j)
    running[:] = [j for j in running if j not in gone]
    if progress is not None:
        progress.update(len(done))
