"""The fast engine: the same vLLM semantics as :mod:`kvdro.sim.engine_reference`, jumping between events.

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
would run out (preemption), and an arrival when the waiting queue is empty (with a non-empty FCFS
queue whose head does not fit, arrivals cannot be admitted before a completion: head-of-line
blocking; with a queue ordered by another key, a newcomer can overtake the head, so every arrival
ends a jump unless preempted requests are at the front). With the oracle's look-ahead
(:class:`_Lookahead`) a head that fits vLLM's rules but not the look-ahead ends the jump at the first
step at which it fits (computed from the running sequences' fixed profile). The
jump advances time by the closed-form sum of the ``k`` step durations (affine in the growing
context, :class:`kvdro.sim.timing.StepClock`) and the KV-use integral by a sum over the 16 residues;
then one ordinary step runs with the event. Time and integrals are integers, so every metric is
bit-identical to the reference engine's (checked by a property test).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections import deque

from kvdro.sim.envelope import check_envelope
from kvdro.sim.invariants import InvariantError
from kvdro.sim.scheduler import BLOCK_TOKENS, EngineInput, EngineOutput, EngineSpec, ceil_blocks, grown_reservation, queue_ranks
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock

__all__ = ["run_fast"]

_B = BLOCK_TOKENS


def _moments(o: int, k: int) -> tuple[int, int]:
    """For x = o, o+16, ... < k: (sum x, sum x(x-1)/2)."""
    T = (k - 1 - o) // _B + 1
    s1 = T * o + _B * T * (T - 1) // 2
    s2 = T * o * o + 2 * _B * o * (T * (T - 1) // 2) + _B * _B * ((T - 1) * T * (2 * T - 1) // 6)
    return s1, (s2 - s1) // 2


def run_fast(spec: EngineSpec, inp: EngineInput, clock: StepClock, *, progress=None) -> EngineOutput:
    """Simulate one engine by jumping between events (module docstring). Raises ValueError /
    :class:`~kvdro.sim.timing.ClockLimitError` outside the engines' envelope (:mod:`kvdro.sim.envelope`)."""
    check_envelope(spec, inp, clock)
    n_req = len(inp)
    arr = inp.arrival_ps.tolist()
    L, X, R = inp.prompt.tolist(), inp.output.tolist(), inp.reserve_blocks.tolist()
    K, S = inp.prefix_key.tolist(), inp.shared_blocks.tolist()
    pblocks = list(spec.prefix_blocks)
    out = EngineOutput.empty(n_req)
    # per-request results as Python lists (numpy element access is slow), copied to ``out`` at the end
    admit, first, finish = [-1] * n_req, [-1] * n_req, [-1] * n_req
    preemptions, recomputed, final_cap, generated = [0] * n_req, [0] * n_req, [0] * n_req, [0] * n_req
    blocks, reactive, wm = spec.blocks, spec.free_block_rule, spec.watermark_blocks
    hard, window = spec.hard, spec.window_blocks
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
    rc = [0] * _B  # len(res[o]), kept alongside
    ntight = 0  # sum(rc)
    done_heap: list[tuple[int, int, int]] = []
    ovf_heap: list[tuple[int, int, int]] = []
    ref = [0] * len(pblocks)
    rank, by_rank, fifo = queue_ranks(inp)
    front: deque[int] = deque()  # preempted requests, at the head of the waiting queue
    pool: list[int] = []  # ranks of never-admitted waiting requests (a heap: the queue key's order)
    look = spec.lookahead
    if look and any(R):
        raise ValueError("reserve_blocks: the oracle's look-ahead admits reactively (reserve nothing)")
    limit = blocks - wm
    oracle = _Lookahead(L, X, S, K, pblocks, limit) if look else None
    wake = None  # look-ahead: the decode step at which the blocked head fits
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
        nonlocal sum_off, ntight
        a = adm_of[j]
        if order and order[-1] == a:
            order.pop()
        else:
            del order[bisect_right(order, a) - 1]
        if tight[j]:
            o = (-kv_off[j]) % _B
            lst = res[o]
            del lst[bisect_right(lst, a) - 1]
            rc[o] -= 1
            ntight -= 1
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
        if t >= MAX_CLOCK_PS:  # the drain limit, as in every engine (kvdro.sim.envelope)
            raise ClockLimitError(clock.config.name, n_req, "the clock passed it before the queue drained")
        while nxt < n_req and arr[nxt] <= t:
            heapq.heappush(pool, rank[nxt])
            nxt += 1
        if not front and not pool and not order:
            if nxt >= n_req:
                break
            t = arr[nxt]
            continue

        # 1. prefill-first (as the reference engine)
        admitted: list[int] = []
        tokens = pairs = 0
        wake = None
        while front or pool:
            j = front[0] if front else by_rank[pool[0]]
            P = L[j] + gprev[j]
            key = K[j]
            sj = S[j] if key >= 0 else 0
            hit = key >= 0 and ref[key] > 0
            own_need = -(-P // _B)
            if R[j] > own_need:
                own_need = R[j]
            own_need -= sj
            need = own_need + (pblocks[key] if key >= 0 and not hit else 0)
            if free - need < wm:
                break
            new = P - _B * sj if hit else P
            if tokens + new > budget or len(order) + 1 > max_seqs:  # order already holds this step's admissions
                break
            if look:
                a_fit = oracle.earliest(j, gprev[j], G)
                if a_fit != G:
                    wake = a_fit
                    break
            if front:
                front.popleft()
            else:
                heapq.heappop(pool)
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
            tight[j] = not hard and cap0[j] == _B * ceil_blocks(P)  # hard: never grows, capped at cap0
            sum_off += kv_off[j]
            admitted.append(j)
            if look and X[j] - gprev[j] - 1 >= 1:
                oracle.add(j, kv_off[j] + 1, X[j] - g_off[j] - 1, G)
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
                    final_cap[j] = cap0[j]
                    generated[j] = X[j]
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
                    o = (-kv_off[j]) % _B
                    insort(res[o], a)
                    rc[o] += 1
                    ntight += 1
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
        cnt = None
        if k > 0:
            limit = free - 1 if reactive else free
            if limit < 0:
                k = 0  # the free-block rule (or a tight sequence's block) preempts before the next decode
            elif ntight:
                g16 = G % _B
                cnt = rc[g16:] + rc[:g16]  # cnt[o] = tight sequences taking a block at steps = o (mod 16)
                c, rem = divmod(limit, ntight)
                kmem = _B * c
                for co in cnt:
                    if rem < co:
                        break
                    rem -= co
                    kmem += 1
                if kmem < k:
                    k = kmem
        b = clock.decode_base_ps(n)
        C0 = sum_off + n * (G + 1)
        lin = b + slope * C0
        if wake is not None and wake - G < k:
            k = wake - G  # > 0: the look-ahead failed at G
        watch = nxt < n_req and (not (front or pool) or (not fifo and not front))  # an arrival may be admitted
        if k > 0 and watch:
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
            if cnt is not None and k <= _B:  # one term per residue: x = o
                for o in range(k):
                    c = cnt[o]
                    if c:
                        alloc += c
                        s1 += c * o
                        s2 += c * (o * (o - 1) // 2)
            elif cnt is not None:
                for o in range(_B):
                    c = cnt[o]
                    if c:
                        alloc += c * ((k - 1 - o) // _B + 1)
                        m1, m2 = _moments(o, k)
                        s1 += c * m1
                        s2 += c * m2
            kvi += (U0 + alloc) * Dk - (lin * s1 + slope * n * s2)
            free -= alloc
            if free < 0:
                raise InvariantError("fast engine: a jump took more blocks than are free")
            if U0 + alloc > peak:
                peak = U0 + alloc
            steps += k
            busy += Dk
            resident += n * Dk
            dbatch += n * Dk
            dps += Dk
            t += Dk
            G += k
            if watch and arr[nxt] <= t:
                continue  # an arrival to admit first
            if wake is not None and G >= wake:
                continue  # the look-ahead's head fits now
            # otherwise nothing can be admitted (free blocks only fell, the running set is the same):
            # the event step follows directly

        # 2b. one ordinary decode step (with its event)
        capped: list[int] = []  # hard: admission numbers reaching their reservation this step
        while True:
            g_ovf = top_valid(ovf_heap)
            if g_ovf is None or g_ovf > G:
                break
            _, a, j = heapq.heappop(ovf_heap)
            if hard:
                capped.append(a)
                continue
            tight[j] = True
            o = (-kv_off[j]) % _B
            insort(res[o], a)
            rc[o] += 1
            ntight += 1
        preempted: list[int] = []
        allocs = list(res[G % _B])
        stopped = False
        if hard:
            # no sequence takes a block: free only grows in this step, so the free-block rule can
            # fire only before the oldest sequence; then each capped sequence preempts itself
            capped.sort()
            if reactive and free < 1 and not (capped and capped[0] == order[0]):
                while free < 1:
                    v = adm_req[order[-1]]
                    preempt(v)
                    preempted.append(v)
            for a in capped:
                j = adm_req.get(a)
                if j is None:
                    continue
                if R[j] >= window:
                    raise InvariantError(f"fast engine: request {j} outgrew a reservation at the context window")
                preempt(j)
                preempted.append(j)
                R[j] = grown_reservation(R[j], L[j], window)
        elif reactive:
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
        if preempted and look:
            raise InvariantError("fast engine: the oracle's look-ahead admitted a request that was then preempted")
        front.extendleft(preempted)
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
            generated[j] = X[j]
            final_cap[j] = _B * ceil_blocks(kv_off[j] + G) if tight[j] else cap0[j]
            nb = owned(j)
            remove_running(j)
            release(j, nb)
            if look:
                oracle.done(j)
            ndone += 1
        if ndone and progress is not None:
            progress.update(ndone)

    for name, values in (("admit_ps", admit), ("first_token_ps", first), ("finish_ps", finish), ("preemptions", preemptions),
                         ("recomputed_tokens", recomputed), ("final_cap_tokens", final_cap), ("generated", generated)):
        getattr(out, name)[:] = values
    out.steps, out.prefill_steps, out.busy_ps = steps, prefill_steps, busy
    out.resident_integral, out.kv_integral = resident, kvi
    out.decode_batch_integral, out.decode_ps = dbatch, dps
    out.end_ps, out.peak_blocks, out.free_blocks_end = t, peak, free
    return out


class _Lookahead:
    """The oracle's look-ahead in the fast engine (:mod:`kvdro.sim.scheduler`), on absolute decode steps.

    A running sequence j holds ``ceil((o_j + s)/16) - S_j`` own blocks during decode step ``s`` up to
    its last step ``c_j`` (``o_j`` = its cached tokens at step 0, plus one); a prefix key's blocks are
    held up to the last step of its last user. This *profile* is fixed until the next admission
    (completions are part of it). It is kept as the usage ``V_i`` at every completion point ``c_i``
    (sorted; the maximum of a sum of non-decreasing steps sits at one of them), updated in O(R) when
    a sequence is added (:meth:`add`); points in the past are dropped. :meth:`earliest` returns the
    first step ``a >= G`` at which a request admitted at ``a`` keeps the usage <= ``limit`` at every
    step of its life, skipping ahead from each violated point. Plain lists: R is small (<= 256).
    """

    INF = 1 << 62

    def __init__(self, L, X, S, K, pblocks, limit):
        self.L, self.X, self.S, self.K, self.pblocks, self.limit = L, X, S, K, pblocks, limit
        self.seqs: dict[int, tuple[int, int]] = {}  # request -> (o, c)
        self.bound = 0  # sum of the running sequences' largest own blocks (an upper bound of the usage)
        self.psum = sum(pblocks)
        self.cs: list[int] = []  # completion points, ascending
        self.os_: list[int] = []  # o of the sequence at each point
        self.ss: list[int] = []  # its shared blocks
        self.V: list[int] = []  # the usage at each point
        self.ckey: dict[int, int] = {}  # prefix key -> last step of its last user
        self.memo = None  # ((request, version, gprev), G0, earliest step)
        self.version = 0

    def _maxown(self, j, o, c):
        return -(-(o + c) // _B) - self.S[j]

    def add(self, j, o, c, G):
        """Sequence ``j`` joins at decode step G: o = cached tokens at step 0 plus one, c = its last step."""
        self.seqs[j] = (o, c)
        self.bound += self._maxown(j, o, c)
        self.version += 1
        cs, os_, ss, V = self.cs, self.os_, self.ss, self.V
        lo = bisect_left(cs, G)
        if lo:  # completion points in the past
            del cs[:lo], os_[:lo], ss[:lo], V[:lo]
        S, key = self.S[j], self.K[j]
        hi = bisect_right(cs, c)
        for i in range(hi):
            V[i] += (o + cs[i] + _B - 1) // _B - S
        if key >= 0:
            ck = self.ckey.get(key, -1)
            p = self.pblocks[key]
            if c > ck:
                if p:
                    for i in range(bisect_right(cs, ck), hi):
                        V[i] += p  # the prefix is now held through those points
                self.ckey[key] = c
        v = (o + c + _B - 1) // _B - S + sum(self.pblocks[k] for k, ck in self.ckey.items() if ck >= c)
        for i in range(bisect_left(cs, c), len(cs)):
            v += (os_[i] + c + _B - 1) // _B - ss[i]
        cs.insert(hi, c)
        os_.insert(hi, o)
        ss.insert(hi, S)
        V.insert(hi, v)

    def done(self, j):
        o, c = self.seqs.pop(j)
        self.bound -= self._maxown(j, o, c)

    def _usage(self, s):
        """Blocks in use by the profile during decode step s."""
        cs, os_, ss = self.cs, self.os_, self.ss
        u = sum(self.pblocks[key] for key, ck in self.ckey.items() if ck >= s)
        for i in range(bisect_left(cs, s), len(cs)):
            u += (os_[i] + s + _B - 1) // _B - ss[i]
        return u

    def earliest(self, j, gprev, G):
        """The first decode step >= G at which request ``j`` (``gprev`` tokens generated) fits."""
        P = self.L[j] + gprev
        m = self.X[j] - gprev - 1  # decode steps after its prefill
        if m < 1:
            return G  # finishes at its prefill: vLLM's check is all there is
        S, key, limit = self.S[j], self.K[j], self.limit
        p = self.pblocks[key] if key >= 0 else 0
        own_end = (P + m + _B - 1) // _B - S
        if self.bound + self.psum + own_end + p <= limit:
            return G  # fits even if every sequence held its largest block count at once
        memo = (j, self.version, gprev)
        if self.memo is not None and self.memo[0] == memo and self.memo[1] <= G <= self.memo[2]:
            return self.memo[2]
        cs, V = self.cs, self.V
        lo = bisect_left(cs, G)
        if (max(V[lo:]) if lo < len(cs) else 0) + own_end + p <= limit:
            return G  # fits even at the running sequences' peak
        ck = self.ckey.get(key, -1) if key >= 0 else -1
        a = G
        while True:
            e = a + m - 1
            nxt = None
            base = P + 1 - a + _B - 1
            for i in range(bisect_left(cs, a), bisect_right(cs, e)):
                sv = cs[i]
                ext = p if sv > ck else 0
                room = limit - V[i] - ext  # own blocks the request may hold at sv
                if (base + sv) // _B - S > room:
                    nxt = max(a + 1, min(P + 1 + sv - _B * (room + S), sv + 1))
                    break
            if nxt is None and self._usage(e) + own_end + (p if e > ck else 0) > limit:
                i = bisect_left(cs, e)
                nxt = self.INF if i == len(cs) else cs[i] - m + 2
            if nxt is None:
                self.memo = (memo, G, a)
                return a
            if nxt >= self.INF:
                self.memo = (memo, G, self.INF)
                return self.INF
            a = nxt
