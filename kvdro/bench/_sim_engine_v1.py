"""Benchmark only: the fast engine as it was before issue 15's speed work (commit 67d1755), kept so that
``python -m kvdro.bench sim`` can time today's engine against it in the same run. It knows only the
soft reading and assumes a free-block rule implies vLLM's all-growing sequences (no reservation),
so the benchmark runs it on ``vllm`` and on reservations with the safety rules off -- the cases it
was written for -- and checks its results equal today's. Not part of the simulator's API.

The fast engine: the same vLLM semantics as :mod:`kvdro.sim.engine_reference`, jumping between events.

Between two events every decode step is the same: the same sequences each append one token, and
the only things that change are counters. So the fast engine keeps running sequences **lazily**:

* a global decode-step counter ``G``; a running sequence stores offsets, so its cached tokens are
  ``kv_off + G`` and its generated tokens ``g_off + G`` -- nothing is touched per step;
* a sequence whose blocks are exactly full ("tight": vLLM's reactive growth, or a reservation
  policy's request that has outgrown its reservation) takes a new block in every step with
  ``G % 16 == (-kv_off) % 16``; such sequences sit in one of 16 residue lists, so the blocks taken by
  the next ``k`` steps are a periodic sum over 16 counts;
* heaps hold each sequence's completion step and, for a reservation policy, the step at which it
  outgrows its reservation (it then joins a residue list).

The events that end a jump: a completion, a reservation overflow, the step at which free blocks
would run out (preemption), and an arrival when the waiting queue is empty (with a non-empty queue
whose head does not fit, arrivals cannot be admitted before a completion: FCFS head-of-line). The
jump advances time by the closed-form sum of the ``k`` step durations (affine in the growing
context, :class:`kvdro.sim.timing.StepClock`) and the KV-use integral by a sum over the 16 residues;
then one ordinary step runs with the event. Time and integrals are integers, so every metric is
bit-identical to the reference engine's (checked by a property test).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections import deque

from kvdro.sim.invariants import InvariantError
from kvdro.sim.scheduler import BLOCK_TOKENS, EngineInput, EngineOutput, EngineSpec, ceil_blocks
from kvdro.sim.timing import StepClock

__all__ = ["run_fast"]

_B = BLOCK_TOKENS


def _moments(o: int, k: int) -> tuple[int, int]:
    """For x = o, o+16, ... < k: (sum x, sum x(x-1)/2)."""
    T = (k - 1 - o) // _B + 1
    s1 = T * o + _B * T * (T - 1) // 2
    s2 = T * o * o + 2 * _B * o * (T * (T - 1) // 2) + _B * _B * ((T - 1) * T * (2 * T - 1) // 6)
    return s1, (s2 - s1) // 2


def run_fast(spec: EngineSpec, inp: EngineInput, clock: StepClock, *, progress=None) -> EngineOutput:
    """Simulate one engine by jumping between events (module docstring)."""
    n_req = len(inp)
    arr = inp.arrival_ps.tolist()
    L, X, R = inp.prompt.tolist(), inp.output.tolist(), inp.reserve_blocks.tolist()
    K, S = inp.prefix_key.tolist(), inp.shared_blocks.tolist()
    pblocks = list(spec.prefix_blocks)
    out = EngineOutput.empty(n_req)
    admit, first, finish = out.admit_ps, out.first_token_ps, out.finish_ps
    preemptions, recomputed = out.preemptions, out.recomputed_tokens
    blocks, reactive, wm = spec.blocks, spec.free_block_rule, spec.watermark_blocks
    budget, max_seqs = spec.token_budget, spec.max_num_seqs
    slope = clock.slope_ps

    gprev = [0] * n_req  # tokens generated before the current admission
    kv_off = [0] * n_req
    g_off = [0] * n_req
    own0 = [0] * n_req  # blocks owned at admission (non-tight sequences keep exactly these)
    cap0 = [0] * n_req
    tight = [False] * n_req
    adm_of = [-1] * n_req  # admission number of the running instance, -1 if not running
    adm_req: dict[int, int] = {}
    order: list[int] = []  # admission numbers of running sequences, oldest first
    res: list[list[int]] = [[] for _ in range(_B)]  # tight sequences by allocation residue
    done_heap: list[tuple[int, int, int]] = []
    ovf_heap: list[tuple[int, int, int]] = []
    ref = [0] * len(pblocks)
    waiting: deque[int] = deque()
    free = blocks
    sum_off = 0
    G = 0
    t = 0
    nxt = 0
    next_adm = 0
    steps = prefill_steps = busy = resident = dbatch = dps = kvi = peak = 0

    def owned(j: int) -> int:
        if tight[j]:
            return ceil_blocks(kv_off[j] + G) - S[j]
        return own0[j]

    def release(j: int, nblocks: int) -> None:
        nonlocal free
        free += nblocks
        key = K[j]
        if key >= 0:
            ref[key] -= 1
            if ref[key] == 0:
                free += pblocks[key]

    def remove_running(j: int) -> None:
        nonlocal sum_off
        a = adm_of[j]
        if order and order[-1] == a:
            order.pop()
        else:
            del order[bisect_right(order, a) - 1]
        if tight[j]:
            lst = res[(-kv_off[j]) % _B]
            del lst[bisect_right(lst, a) - 1]
        del adm_req[a]
        adm_of[j] = -1
        sum_off -= kv_off[j]

    def preempt(j: int) -> None:
        nb = owned(j)
        preemptions[j] += 1
        recomputed[j] += kv_off[j] + G - (_B * S[j] if K[j] >= 0 else 0)
        gprev[j] = g_off[j] + G
        remove_running(j)
        release(j, nb)

    def top_valid(heap: list) -> int | None:
        while heap:
            gd, a, j = heap[0]
            if adm_of[j] == a:
                return gd
            heapq.heappop(heap)
        return None

    while True:
        while nxt < n_req and arr[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not order:
            if nxt >= n_req:
                break
            t = arr[nxt]
            continue

        # 1. prefill-first (as the reference engine)
        admitted: list[int] = []
        tokens = pairs = 0
        while waiting:
            j = waiting[0]
            P = L[j] + gprev[j]
            key = K[j]
            sj = S[j] if key >= 0 else 0
            hit = key >= 0 and ref[key] > 0
            own_need = max(R[j], ceil_blocks(P)) - sj
            need = own_need + (pblocks[key] if key >= 0 and not hit else 0)
            if free - need < wm:
                break
            new = P - _B * sj if hit else P
            if tokens + new > budget or len(order) + 1 > max_seqs:  # order already holds this step's admissions
                break
            waiting.popleft()
            free -= need
            if key >= 0:
                ref[key] += 1
            tokens += new
            pairs += P * P - (_B * sj) ** 2 if hit else P * P
            if admit[j] < 0:
                admit[j] = t
            a = next_adm
            next_adm += 1
            adm_of[j] = a
            adm_req[a] = j
            order.append(a)
            kv_off[j] = P - G
            g_off[j] = gprev[j] + 1 - G
            own0[j] = own_need
            cap0[j] = _B * (own_need + sj)
            tight[j] = cap0[j] == _B * ceil_blocks(P)
            sum_off += kv_off[j]
            admitted.append(j)
        if admitted:
            dur = clock.prefill_ps(tokens, pairs)
            used = blocks - free
            steps += 1
            prefill_steps += 1
            busy += dur
            resident += len(order) * dur
            kvi += used * dur
            peak = max(peak, used)
            t += dur
            ndone = 0
            for j in admitted:
                if first[j] < 0:
                    first[j] = t
                a = adm_of[j]
                if gprev[j] + 1 == X[j]:
                    finish[j] = t
                    out.final_cap_tokens[j] = cap0[j]
                    out.generated[j] = X[j]
                    nb = own0[j]
                    remove_running_untight = tight[j]
                    tight[j] = False  # not in a residue list yet
                    remove_running(j)
                    tight[j] = remove_running_untight
                    release(j, nb)
                    ndone += 1
                    continue
                heapq.heappush(done_heap, (X[j] - g_off[j] - 1, a, j))
                if tight[j]:
                    insort(res[(-kv_off[j]) % _B], a)
                else:
                    heapq.heappush(ovf_heap, (cap0[j] - kv_off[j], a, j))
            if ndone and progress is not None:
                progress.update(ndone)
            continue

        if not order:
            raise InvariantError("fast engine: waiting requests but nothing running and nothing admissible")

        # 2a. jump over uneventful decode steps
        n = len(order)
        g_done = top_valid(done_heap)
        k = g_done - G
        g_ovf = top_valid(ovf_heap)
        if g_ovf is not None:
            k = min(k, g_ovf - G)
        if k > 0:
            cnt = [len(res[(G + o) % _B]) for o in range(_B)]
            total = sum(cnt)
            limit = free - 1 if reactive else free
            if total:
                if limit < 0:
                    k = 0
                else:
                    c, rem = divmod(limit, total)
                    kmem = _B * c
                    for o in range(_B):
                        if rem < cnt[o]:
                            break
                        rem -= cnt[o]
                        kmem += 1
                    k = min(k, kmem)
        b = clock.decode_base_ps(n)
        C0 = sum_off + n * (G + 1)
        lin = b + slope * C0
        if k > 0 and not waiting and nxt < n_req:
            gap = arr[nxt] - t  # > 0: arrivals <= t are queued
            # largest s with D(s) = lin*s + slope*n*s(s-1)/2 < gap; the jump may cover s_max + 1 steps
            quad = slope * n / 2.0
            alpha = lin - quad
            s = int((-alpha + math.sqrt(alpha * alpha + 4.0 * quad * gap)) / (2.0 * quad)) if quad > 0 else int(gap // max(lin, 1))
            s = max(s, 0)
            while s > 0 and lin * s + slope * n * s * (s - 1) // 2 >= gap:
                s -= 1
            while lin * (s + 1) + slope * n * (s + 1) * s // 2 < gap:
                s += 1
            k = min(k, s + 1)
        if k > 0:
            Dk = lin * k + slope * n * (k * (k - 1) // 2)
            U0 = blocks - free
            alloc = 0
            s1 = s2 = 0
            if reactive or any(res):
                for o in range(min(_B, k)):
                    c = len(res[(G + o) % _B])
                    if c:
                        T = (k - 1 - o) // _B + 1
                        alloc += c * T
                        m1, m2 = _moments(o, k)
                        s1 += c * m1
                        s2 += c * m2
            kvi += (U0 + alloc) * Dk - (lin * s1 + slope * n * s2)
            free -= alloc
            if free < 0:
                raise InvariantError("fast engine: a jump took more blocks than are free")
            peak = max(peak, U0 + alloc)
            steps += k
            busy += Dk
            resident += n * Dk
            dbatch += n * Dk
            dps += Dk
            t += Dk
            G += k
            continue

        # 2b. one ordinary decode step (with its event)
        while True:
            g_ovf = top_valid(ovf_heap)
            if g_ovf is None or g_ovf > G:
                break
            _, a, j = heapq.heappop(ovf_heap)
            tight[j] = True
            insort(res[(-kv_off[j]) % _B], a)
        preempted: list[int] = []
        allocs = list(res[G % _B])
        stopped = False
        if reactive:
            def check(s_adm: int) -> bool:
                """vLLM's check before sequence ``s_adm``: a free block, else preempt the newest."""
                while free < 1:
                    if order[-1] > s_adm:
                        v = adm_req[order[-1]]
                        preempt(v)
                        preempted.append(v)
                    else:
                        v = adm_req[s_adm]
                        preempt(v)
                        preempted.append(v)
                        return False
                return True

            if free < 1 and not check(order[0]):
                stopped = True
            if not stopped:
                for a in allocs:
                    if a not in adm_req:
                        continue
                    free -= 1
                    if free == 0:
                        i = bisect_right(order, a)
                        if i < len(order) and not check(order[i]):
                            break
        else:
            for a in allocs:
                if a not in adm_req:
                    continue
                while free < 1:
                    if order[-1] > a:
                        v = adm_req[order[-1]]
                    else:
                        v = adm_req[a]
                        stopped = True
                    preempt(v)
                    preempted.append(v)
                    if stopped:
                        break
                if stopped:
                    break
                free -= 1
        waiting.extendleft(preempted)
        if not order:
            continue
        n = len(order)
        dur = clock.decode_ps(n, sum_off + n * (G + 1))
        used = blocks - free
        steps += 1
        busy += dur
        resident += n * dur
        dbatch += n * dur
        dps += dur
        kvi += used * dur
        peak = max(peak, used)
        t += dur
        G += 1
        ndone = 0
        while True:
            g_done = top_valid(done_heap)
            if g_done is None or g_done > G - 1:
                break
            _, a, j = heapq.heappop(done_heap)
            finish[j] = t
            out.generated[j] = X[j]
            out.final_cap_tokens[j] = _B * ceil_blocks(kv_off[j] + G) if tight[j] else cap0[j]
            nb = owned(j)
            remove_running(j)
            release(j, nb)
            ndone += 1
        if ndone and progress is not None:
            progress.update(ndone)

    out.steps, out.prefill_steps, out.busy_ps = steps, prefill_steps, busy
    out.resident_integral, out.kv_integral = resident, kvi
    out.decode_batch_integral, out.decode_ps = dbatch, dps
    out.end_ps, out.peak_blocks, out.free_blocks_end = t, peak, free
    return out
