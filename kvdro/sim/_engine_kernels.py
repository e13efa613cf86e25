"""The numba kernels of :mod:`kvdro.sim.engine_compiled` (imported on first use: numba's import
costs ~0.2-0.8 s, which ``import kvdro.sim`` and a process that never simulates should not pay).

Every function is ``@njit(cache=True)``: compiled once per machine (~15 CPU s), then loaded from
``__pycache__``. ``NUMBA_DISABLE_JIT=1`` runs the same source as plain Python.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvdro.sim.scheduler import BLOCK_TOKENS
from kvdro.sim.timing import MAX_CLOCK_PS

#: The longest jump [decode steps]; keeps every product of a jump inside int64 (module docstring).
KMAX = 1 << 16
_NONE = 1 << 62
_TMAX = MAX_CLOCK_PS  # the drain limit [ps]: t + one jump (< 2**60 ps) + one step stays inside int64
_LIMB = 30
_MASK = (1 << _LIMB) - 1
_BOUND = 1 << 61

# state vector indices
_FREE, _SUMOFF, _NTIGHT, _NRUN, _RHEAD, _RTAIL, _DSIZE, _OSIZE, _ERR = range(9)
# error codes
_OK, _STUCK, _JUMP_OVERDRAW, _WINDOW, _RANGE, _HEAP, _ORACLE_PREEMPTED, _CLOCK = range(8)


@njit(cache=True)
def _addmul(w, base, a, b):
    """w[base:base+3] (value = w2 * 2**60 + w1 * 2**30 + w0, w0 and w1 in [0, 2**30)) += a * b,
    exactly; False if an operand is outside (-2**61, 2**61)."""
    if a >= _BOUND or a <= -_BOUND or b >= _BOUND or b <= -_BOUND:
        return False
    ah = a >> _LIMB
    al = a & _MASK
    bh = b >> _LIMB
    bl = b & _MASK
    w[base] += al * bl
    w[base + 1] += ah * bl + al * bh
    w[base + 2] += ah * bh
    c = w[base] >> _LIMB
    w[base] &= _MASK
    w[base + 1] += c
    c = w[base + 1] >> _LIMB
    w[base + 1] &= _MASK
    w[base + 2] += c
    return True


@njit(cache=True)
def _rank_push(h, size, r):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if h[p] <= r:
            break
        h[i] = h[p]
        i = p
    h[i] = r
    return size + 1


@njit(cache=True)
def _rank_pop(h, size):
    size -= 1
    if size > 0:
        r = h[size]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and h[c + 1] < h[c]:
                c += 1
            if r <= h[c]:
                break
            h[i] = h[c]
            i = c
        h[i] = r
    return size


@njit(cache=True)
def _less(g1, a1, g2, a2):
    return g1 < g2 or (g1 == g2 and a1 < a2)


@njit(cache=True)
def _sift_down(hg, ha, hj, size, i):
    g, a, j = hg[i], ha[i], hj[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _less(hg[c + 1], ha[c + 1], hg[c], ha[c]):
            c += 1
        if not _less(hg[c], ha[c], g, a):
            break
        hg[i], ha[i], hj[i] = hg[c], ha[c], hj[c]
        i = c
    hg[i], ha[i], hj[i] = g, a, j


@njit(cache=True)
def _push(hg, ha, hj, sc, si, g, a, j, adm_of):
    size = sc[si]
    if size == hg.size:  # drop the stale entries (finished or preempted instances), re-heapify
        m = 0
        for i in range(size):
            if adm_of[hj[i]] == ha[i]:
                hg[m], ha[m], hj[m] = hg[i], ha[i], hj[i]
                m += 1
        for i in range(m // 2 - 1, -1, -1):
            _sift_down(hg, ha, hj, m, i)
        size = m
        if size == hg.size:
            sc[_ERR] = _HEAP
            return
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if not _less(g, a, hg[p], ha[p]):
            break
        hg[i], ha[i], hj[i] = hg[p], ha[p], hj[p]
        i = p
    hg[i], ha[i], hj[i] = g, a, j
    sc[si] = size + 1


@njit(cache=True)
def _pop(hg, ha, hj, sc, si):
    size = sc[si] - 1
    sc[si] = size
    if size > 0:
        hg[0], ha[0], hj[0] = hg[size], ha[size], hj[size]
        _sift_down(hg, ha, hj, size, 0)


@njit(cache=True)
def _top_valid(hg, ha, hj, sc, si, adm_of):
    """The smallest step of a live entry (its instance still running), dropping stale ones; _NONE if empty."""
    while sc[si] > 0:
        if adm_of[hj[0]] == ha[0]:
            return hg[0]
        _pop(hg, ha, hj, sc, si)
    return _NONE


@njit(cache=True)
def _res_insert(j, a, o, qn, qp, qhead, qtail, adm_of):
    """Insert running request ``j`` (admission ``a``) into residue list ``o``, sorted by admission."""
    x = qtail[o]
    while x >= 0 and adm_of[x] > a:
        x = qp[x]
    if x < 0:  # new head
        qp[j] = -1
        qn[j] = qhead[o]
        if qhead[o] >= 0:
            qp[qhead[o]] = j
        else:
            qtail[o] = j
        qhead[o] = j
    else:
        qp[j] = x
        qn[j] = qn[x]
        if qn[x] >= 0:
            qp[qn[x]] = j
        else:
            qtail[o] = j
        qn[x] = j


@njit(cache=True)
def _unlink(j, nx, pv, heads, tails, o):
    p, q = pv[j], nx[j]
    if p >= 0:
        nx[p] = q
    else:
        heads[o] = q
    if q >= 0:
        pv[q] = p
    else:
        tails[o] = p
    nx[j] = -1
    pv[j] = -1


@njit(cache=True)
def _remove_running(j, sc, rn, rp, rhl, tight, kv_off, qn, qp, qhead, qtail, rc, adm_of):
    """Take ``j`` out of the running list (and its residue list when tight) and its offset out of the sum."""
    rhl[0], rhl[1] = sc[_RHEAD], sc[_RTAIL]
    _unlink(j, rn, rp, rhl[0:1], rhl[1:2], 0)
    sc[_RHEAD], sc[_RTAIL] = rhl[0], rhl[1]
    sc[_NRUN] -= 1
    if tight[j]:
        o = (-kv_off[j]) % BLOCK_TOKENS
        _unlink(j, qn, qp, qhead, qtail, o)
        rc[o] -= 1
        sc[_NTIGHT] -= 1
    adm_of[j] = -1
    sc[_SUMOFF] -= kv_off[j]


@njit(cache=True)
def _release(j, nb, sc, K, ref, pblocks):
    sc[_FREE] += nb
    key = K[j]
    if key >= 0:
        ref[key] -= 1
        if ref[key] == 0:
            sc[_FREE] += pblocks[key]


@njit(cache=True)
def _owned(j, G, tight, kv_off, own0, S):
    if tight[j]:
        return -(-(kv_off[j] + G) // BLOCK_TOKENS) - S[j]
    return own0[j]


@njit(cache=True)
def _preempt(j, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn, qp, qhead, qtail, rc, adm_of,
             K, S, ref, pblocks, preemptions, recomputed):
    nb = _owned(j, G, tight, kv_off, own0, S)
    preemptions[j] += 1
    recomputed[j] += kv_off[j] + G - (BLOCK_TOKENS * S[j] if K[j] >= 0 else 0)
    gprev[j] = g_off[j] + G
    _remove_running(j, sc, rn, rp, rhl, tight, kv_off, qn, qp, qhead, qtail, rc, adm_of)
    _release(j, nb, sc, K, ref, pblocks)


@njit(cache=True)
def _free_block_check(s, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn, qp, qhead, qtail, rc, adm_of,
                      K, S, ref, pblocks, preemptions, recomputed, pre_list, npre):
    """vLLM's check before running sequence ``s``: while no block is free, preempt the newest running
    sequence, or ``s`` itself when none is newer. Returns (preemptions listed so far, whether ``s``
    preempted itself)."""
    while sc[_FREE] < 1:
        tail = sc[_RTAIL]
        v = tail if adm_of[tail] > adm_of[s] else s
        _preempt(v, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn, qp, qhead, qtail, rc,
                 adm_of, K, S, ref, pblocks, preemptions, recomputed)
        pre_list[npre] = v
        npre += 1
        if v == s:
            return npre, True
    return npre, False


@njit(cache=True)
def _moments(o, k):
    """For x = o, o+16, ... < k: (sum x, sum x(x-1)/2)."""
    B = BLOCK_TOKENS
    T = (k - 1 - o) // B + 1
    s1 = T * o + B * T * (T - 1) // 2
    s2 = T * o * o + 2 * B * o * (T * (T - 1) // 2) + B * B * ((T - 1) * T * (2 * T - 1) // 6)
    return s1, (s2 - s1) // 2



# ---------------------------------------------------------------------------------------------
# the oracle's look-ahead (kvdro.sim.scheduler.lookahead_fits, the rule the reference engine evaluates
# at every step), on absolute decode steps. A running sequence j holds ceil((o_j + s)/16) - S_j own
# blocks during decode step s up to its last step c_j (o_j = its cached tokens at step 0, plus one);
# a prefix key's blocks are held up to the last step of its last user. This *profile* is fixed until
# the next admission (completions are part of it), so it is kept as the usage V_i at every completion
# point c_i (sorted; the maximum of a sum of non-decreasing steps sits at one of them), rebuilt lazily
# after an admission (_la_profile). _la_earliest returns the first step a >= G at which a request
# admitted at a keeps the usage <= limit at every step of its life, skipping ahead from each violated
# point. Its scalars live in ``lk``; the running sequences' (o, c) in lo_o, lo_c.
_LK_BOUND, _LK_VERSION, _LK_PROF, _LK_PN, _LK_NMEM, _LK_MVALID, _LK_MJ, _LK_MVER, _LK_MGPREV, _LK_MG, _LK_MRES = range(11)


@njit(cache=True)
def _first_geq(cs, n, x):
    """bisect_left: the first index i < n with cs[i] >= x (n if none)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if cs[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _la_add(j, o, c, lk, mem, mpos, lo_o, lo_c, S):
    lo_o[j] = o
    lo_c[j] = c
    mpos[j] = lk[_LK_NMEM]
    mem[lk[_LK_NMEM]] = j
    lk[_LK_NMEM] += 1
    lk[_LK_BOUND] += -(-(o + c) // BLOCK_TOKENS) - S[j]
    lk[_LK_PROF] = 0
    lk[_LK_VERSION] += 1


@njit(cache=True)
def _la_done(j, lk, mem, mpos, lo_o, lo_c, S):
    i = mpos[j]
    last = mem[lk[_LK_NMEM] - 1]
    mem[i] = last
    mpos[last] = i
    mpos[j] = -1
    lk[_LK_NMEM] -= 1
    lk[_LK_BOUND] -= -(-(lo_o[j] + lo_c[j]) // BLOCK_TOKENS) - S[j]


@njit(cache=True)
def _la_profile(lk, mem, lo_o, lo_c, S, K, pblocks, pcs, pos, pss, pV, pckey, tmp):
    """Sorted completion steps c_i of the running sequences and the usage V_i at each."""
    B = BLOCK_TOKENS
    nm = lk[_LK_NMEM]
    for i in range(nm):
        tmp[i] = lo_c[mem[i]]
    order = np.argsort(tmp[:nm])
    for i in range(nm):
        j = mem[order[i]]
        pcs[i], pos[i], pss[i] = lo_c[j], lo_o[j], S[j]
    for key in range(pckey.size):
        pckey[key] = -1
    for i in range(nm):
        j = mem[i]
        if K[j] >= 0 and lo_c[j] > pckey[K[j]]:
            pckey[K[j]] = lo_c[j]
    for i in range(nm):
        ci = pcs[i]
        v = 0
        for q in range(nm):
            if pcs[q] >= ci:
                v += -(-(pos[q] + ci) // B) - pss[q]
        for key in range(pblocks.size):
            if pblocks[key] and ci <= pckey[key]:
                v += pblocks[key]
        pV[i] = v
    lk[_LK_PN] = nm
    lk[_LK_PROF] = 1


@njit(cache=True)
def _la_earliest(j, gprev_j, G, lk, mem, lo_o, lo_c, L, X, S, K, pblocks, psum, limit, pcs, pos, pss, pV, pckey, tmp):
    """The first decode step >= G at which request ``j`` (``gprev_j`` tokens generated) fits, admitted
    then, by the look-ahead rule (section comment above); ``_NONE`` if at no step of the profile. Two
    shortcuts first: the running sequences' largest block counts summed (``lk[_LK_BOUND]``) leave
    room, or the same request asked again before the profile changed (a memo)."""
    B = BLOCK_TOKENS
    P = L[j] + gprev_j
    m = X[j] - gprev_j - 1
    if m < 1:
        return G
    Sj = S[j]
    key = K[j]
    p = pblocks[key] if key >= 0 else 0
    own_end = -(-(P + m) // B) - Sj
    if lk[_LK_BOUND] + psum + own_end + p <= limit:
        return G
    if (lk[_LK_MVALID] == 1 and lk[_LK_MJ] == j and lk[_LK_MVER] == lk[_LK_VERSION] and lk[_LK_MGPREV] == gprev_j
            and lk[_LK_MG] <= G <= lk[_LK_MRES]):
        return lk[_LK_MRES]
    if lk[_LK_PROF] == 0:
        _la_profile(lk, mem, lo_o, lo_c, S, K, pblocks, pcs, pos, pss, pV, pckey, tmp)
    pn = lk[_LK_PN]
    ck = pckey[key] if key >= 0 else -1
    a = G
    while True:
        e = a + m - 1
        lo = _first_geq(pcs, pn, a)
        hi = _first_geq(pcs, pn, e + 1)
        nxt = -1
        for i in range(lo, hi):
            sv = pcs[i]
            ext = p if sv > ck else 0
            if pV[i] + (-(-(P + 1 + sv - a) // B) - Sj) + ext > limit:
                room = limit - pV[i] - ext  # own blocks the request may hold at sv
                cand = P + 1 + sv - B * (room + Sj)
                if sv + 1 < cand:
                    cand = sv + 1
                nxt = a + 1 if a + 1 > cand else cand
                break
        if nxt < 0:
            i0 = _first_geq(pcs, pn, e)
            u = 0
            for q in range(i0, pn):
                u += -(-(pos[q] + e) // B) - pss[q]
            for kk in range(pblocks.size):
                if pckey[kk] >= e:
                    u += pblocks[kk]
            if u + own_end + (p if e > ck else 0) > limit:
                nxt = _NONE if i0 == pn else pcs[i0] - m + 2
        if nxt < 0 or nxt >= _NONE:
            res = a if nxt < 0 else _NONE
            lk[_LK_MVALID], lk[_LK_MJ], lk[_LK_MVER], lk[_LK_MGPREV] = 1, j, lk[_LK_VERSION], gprev_j
            lk[_LK_MG], lk[_LK_MRES] = G, res
            return res
        a = nxt


@njit(cache=True)
def _kernel(arr, rank, by_rank, fifo, look, L, X, R, K, S, pblocks, blocks, wm, max_seqs, budget, reactive, hard, window,
            slope, base, s0tab, pair_s, token_s, kmax,
            admit, first, finish, preemptions, recomputed, final_cap, generated, totals, wide):
    """The event loop of :func:`kvdro.sim.engine_compiled.run_compiled` over arrays (its module docstring).

    Returns an error code (0 = fine); ``totals`` = steps, prefill_steps, busy, dps, end t, peak,
    free at the end, the request an error concerns; ``wide`` = resident, dbatch, kvi in limbs."""
    B = BLOCK_TOKENS
    n_req = arr.size
    gprev = np.zeros(n_req, np.int64)
    kv_off = np.zeros(n_req, np.int64)
    g_off = np.zeros(n_req, np.int64)
    own0 = np.zeros(n_req, np.int64)
    cap0 = np.zeros(n_req, np.int64)
    tight = np.zeros(n_req, np.bool_)
    adm_of = np.full(n_req, -1, np.int64)
    rn = np.full(n_req, -1, np.int64)  # running list: next / previous by admission
    rp = np.full(n_req, -1, np.int64)
    rhl = np.full(2, -1, np.int64)
    qn = np.full(n_req, -1, np.int64)  # residue lists
    qp = np.full(n_req, -1, np.int64)
    qhead = np.full(B, -1, np.int64)
    qtail = np.full(B, -1, np.int64)
    rc = np.zeros(B, np.int64)
    cnt = np.zeros(B, np.int64)
    hcap = 2 * max_seqs + 16
    dg = np.zeros(hcap, np.int64)
    da = np.zeros(hcap, np.int64)
    dj = np.zeros(hcap, np.int64)
    og = np.zeros(hcap, np.int64)
    oa = np.zeros(hcap, np.int64)
    oj = np.zeros(hcap, np.int64)
    ref = np.zeros(max(pblocks.size, 1), np.int64)
    # the waiting queue: preempted requests at the front (a ring: extendleft writes before the head),
    # then the never-admitted ones in the queue key's order (a min-heap of ranks; FCFS: rank = index)
    wbuf = np.zeros(max(n_req, 1), np.int64)
    wcap = wbuf.size
    whead = 0
    wlen = 0
    pool = np.zeros(max(n_req, 1), np.int64)
    psize = 0
    scratch = max_seqs + 1
    adm_list = np.zeros(scratch, np.int64)
    pre_list = np.zeros(n_req + 1, np.int64)
    al_j = np.zeros(scratch, np.int64)
    al_a = np.zeros(scratch, np.int64)
    cp_j = np.zeros(scratch, np.int64)
    cp_a = np.zeros(scratch, np.int64)
    sc = np.zeros(9, np.int64)
    sc[_FREE] = blocks
    sc[_RHEAD] = -1
    sc[_RTAIL] = -1
    G = 0
    t = 0
    nxt = 0
    next_adm = 0
    steps = 0
    prefill_steps = 0
    busy = 0
    dps = 0
    peak = 0
    RES, DB, KVI = 0, 3, 6
    ok = True
    # the oracle's look-ahead
    lk = np.zeros(11, np.int64)
    mem = np.zeros(max(n_req, 1), np.int64)
    mpos = np.full(n_req, -1, np.int64)
    lo_o = np.zeros(n_req, np.int64)
    lo_c = np.zeros(n_req, np.int64)
    pcs = np.zeros(scratch, np.int64)
    pos = np.zeros(scratch, np.int64)
    pss = np.zeros(scratch, np.int64)
    pV = np.zeros(scratch, np.int64)
    ptmp = np.zeros(max(n_req, 1), np.int64)
    pckey = np.full(max(pblocks.size, 1), -1, np.int64)
    psum = 0
    for key in range(pblocks.size):
        psum += pblocks[key]
    limit_la = blocks - wm
    wake = -1

    while True:
        if t >= _TMAX:  # the drain limit, as in every engine (kvdro.sim.envelope)
            return _CLOCK
        while nxt < n_req and arr[nxt] <= t:
            psize = _rank_push(pool, psize, rank[nxt])
            nxt += 1
        if wlen == 0 and psize == 0 and sc[_NRUN] == 0:
            if nxt >= n_req:
                break
            t = arr[nxt]
            continue

        # 1. prefill-first
        m = 0
        tokens = 0
        pairs = 0
        wake = -1
        while wlen > 0 or psize > 0:
            j = wbuf[whead] if wlen > 0 else by_rank[pool[0]]
            P = L[j] + gprev[j]
            key = K[j]
            sj = S[j] if key >= 0 else 0
            hit = key >= 0 and ref[key] > 0
            own_need = -(-P // B)
            if R[j] > own_need:
                own_need = R[j]
            own_need -= sj
            need = own_need + (pblocks[key] if key >= 0 and not hit else 0)
            if sc[_FREE] - need < wm:
                break
            new = P - B * sj if hit else P
            if tokens + new > budget or sc[_NRUN] + 1 > max_seqs:
                break
            if look:
                a_fit = _la_earliest(j, gprev[j], G, lk, mem, lo_o, lo_c, L, X, S, K, pblocks, psum, limit_la,
                                     pcs, pos, pss, pV, pckey, ptmp)
                if a_fit != G:
                    wake = a_fit
                    break
            if wlen > 0:
                whead = (whead + 1) % wcap
                wlen -= 1
            else:
                psize = _rank_pop(pool, psize)
            sc[_FREE] -= need
            if key >= 0:
                ref[key] += 1
            tokens += new
            if hit:
                pairs += P * P - (B * sj) * (B * sj)
            else:
                pairs += P * P
            if admit[j] < 0:
                admit[j] = t
            a = next_adm
            next_adm += 1
            adm_of[j] = a
            # append to the running list
            rp[j] = sc[_RTAIL]
            rn[j] = -1
            if sc[_RTAIL] >= 0:
                rn[sc[_RTAIL]] = j
            else:
                sc[_RHEAD] = j
            sc[_RTAIL] = j
            sc[_NRUN] += 1
            kv_off[j] = P - G
            g_off[j] = gprev[j] + 1 - G
            own0[j] = own_need
            cap0[j] = B * (own_need + sj)
            tight[j] = (not hard) and cap0[j] == B * (-(-P // B))
            sc[_SUMOFF] += kv_off[j]
            adm_list[m] = j
            m += 1
            if look and X[j] - gprev[j] - 1 >= 1:
                _la_add(j, kv_off[j] + 1, X[j] - g_off[j] - 1, lk, mem, mpos, lo_o, lo_c, S)
        if m > 0:
            if tokens >= s0tab.size:  # the table covers every step (envelope.prefill_tokens_bound)
                return _RANGE
            s0 = s0tab[tokens]
            extra = pair_s * float(pairs) - token_s * float(tokens)
            x = s0 + extra if extra > 0 else s0
            dur = np.int64(np.rint(x * 1e12))
            used = blocks - sc[_FREE]
            steps += 1
            prefill_steps += 1
            busy += dur
            ok &= _addmul(wide, RES, sc[_NRUN], dur)
            ok &= _addmul(wide, KVI, used, dur)
            if used > peak:
                peak = used
            t += dur
            for i in range(m):
                j = adm_list[i]
                if first[j] < 0:
                    first[j] = t
                a = adm_of[j]
                if gprev[j] + 1 == X[j]:
                    finish[j] = t
                    final_cap[j] = cap0[j]
                    generated[j] = X[j]
                    nb = own0[j]
                    was = tight[j]
                    tight[j] = False  # not in a residue list yet
                    _remove_running(j, sc, rn, rp, rhl, tight, kv_off, qn, qp, qhead, qtail, rc, adm_of)
                    tight[j] = was
                    _release(j, nb, sc, K, ref, pblocks)
                    continue
                _push(dg, da, dj, sc, _DSIZE, X[j] - g_off[j] - 1, a, j, adm_of)
                if tight[j]:
                    o = (-kv_off[j]) % B
                    _res_insert(j, a, o, qn, qp, qhead, qtail, adm_of)
                    rc[o] += 1
                    sc[_NTIGHT] += 1
                else:
                    _push(og, oa, oj, sc, _OSIZE, cap0[j] - kv_off[j], a, j, adm_of)
            if sc[_ERR] != 0:
                return sc[_ERR]
            if not ok:
                return _RANGE
            continue

        if sc[_NRUN] == 0:
            return _STUCK

        # 2a. jump over uneventful decode steps
        n = sc[_NRUN]
        g_done = _top_valid(dg, da, dj, sc, _DSIZE, adm_of)
        k = g_done - G
        g_ovf = _top_valid(og, oa, oj, sc, _OSIZE, adm_of)
        if g_ovf != _NONE and g_ovf - G < k:
            k = g_ovf - G
        have_cnt = False
        if k > 0:
            limit = sc[_FREE] - 1 if reactive else sc[_FREE]
            if limit < 0:
                k = 0
            elif sc[_NTIGHT] > 0:
                g16 = G % B
                for o in range(B):
                    cnt[o] = rc[(g16 + o) % B]
                c = limit // sc[_NTIGHT]
                rem = limit - c * sc[_NTIGHT]
                kmem = B * c
                for o in range(B):
                    co = cnt[o]
                    if rem < co:
                        break
                    rem -= co
                    kmem += 1
                if kmem < k:
                    k = kmem
                have_cnt = True
        if k > kmax:
            k = kmax
        b = base[n]
        C0 = sc[_SUMOFF] + n * (G + 1)
        lin = b + slope * C0
        sn = slope * n
        if lin <= 0 or lin >= (1 << 43) or sn >= (1 << 28) or sn < 0:  # envelope.MAX_DECODE_PS, MAX_GROWTH_PS
            return _RANGE
        if wake >= 0 and wake - G < k:
            k = wake - G  # > 0: the look-ahead failed at G
        # an arrival may be admitted: into an empty queue, or past a blocked head ordered by another key
        watch = nxt < n_req and ((wlen == 0 and psize == 0) or (not fifo and wlen == 0))
        if k > 0 and watch:
            gap = arr[nxt] - t  # > 0
            # k = min(k, the fewest steps whose duration D >= gap): the jump ends with the step that reaches the arrival
            if lin * k + sn * (k * (k - 1) // 2) >= gap:
                lo, hi = 1, k
                while lo < hi:
                    mid = (lo + hi) // 2
                    if lin * mid + sn * (mid * (mid - 1) // 2) >= gap:
                        hi = mid
                    else:
                        lo = mid + 1
                k = lo
        if k > 0:
            Dk = lin * k + sn * (k * (k - 1) // 2)
            U0 = blocks - sc[_FREE]
            alloc = 0
            s1 = 0
            s2 = 0
            if have_cnt and k <= B:
                for o in range(k):
                    c = cnt[o]
                    if c:
                        alloc += c
                        s1 += c * o
                        s2 += c * (o * (o - 1) // 2)
            elif have_cnt:
                for o in range(B):
                    c = cnt[o]
                    if c:
                        alloc += c * ((k - 1 - o) // B + 1)
                        m1, m2 = _moments(o, k)
                        s1 += c * m1
                        s2 += c * m2
            ok &= _addmul(wide, KVI, U0 + alloc, Dk)
            ok &= _addmul(wide, KVI, -lin, s1)
            ok &= _addmul(wide, KVI, -sn, s2)
            sc[_FREE] -= alloc
            if sc[_FREE] < 0:
                return _JUMP_OVERDRAW
            if U0 + alloc > peak:
                peak = U0 + alloc
            steps += k
            busy += Dk
            ok &= _addmul(wide, RES, n, Dk)
            ok &= _addmul(wide, DB, n, Dk)
            dps += Dk
            t += Dk
            G += k
            if not ok:
                return _RANGE
            if watch and arr[nxt] <= t:
                continue
            if wake >= 0 and G >= wake:
                continue  # the look-ahead's head fits now

        # 2b. one ordinary decode step (with its event)
        ncap = 0
        while True:
            g_ovf = _top_valid(og, oa, oj, sc, _OSIZE, adm_of)
            if g_ovf == _NONE or g_ovf > G:
                break
            a, j = oa[0], oj[0]
            _pop(og, oa, oj, sc, _OSIZE)
            if hard:
                cp_a[ncap] = a
                cp_j[ncap] = j
                ncap += 1
                continue
            tight[j] = True
            o = (-kv_off[j]) % B
            _res_insert(j, a, o, qn, qp, qhead, qtail, adm_of)
            rc[o] += 1
            sc[_NTIGHT] += 1
        npre = 0
        na = 0
        x = qhead[G % B]
        while x >= 0:
            al_j[na] = x
            al_a[na] = adm_of[x]
            na += 1
            x = qn[x]
        if hard:
            # insertion sort of the capped sequences by admission
            for i in range(1, ncap):
                va, vj = cp_a[i], cp_j[i]
                p = i - 1
                while p >= 0 and cp_a[p] > va:
                    cp_a[p + 1], cp_j[p + 1] = cp_a[p], cp_j[p]
                    p -= 1
                cp_a[p + 1], cp_j[p + 1] = va, vj
            if reactive and sc[_FREE] < 1 and not (ncap > 0 and cp_a[0] == adm_of[sc[_RHEAD]]):
                while sc[_FREE] < 1:
                    if sc[_NRUN] == 0:
                        return _STUCK
                    v = sc[_RTAIL]
                    _preempt(v, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn, qp, qhead, qtail, rc,
                             adm_of, K, S, ref, pblocks, preemptions, recomputed)
                    pre_list[npre] = v
                    npre += 1
            for i in range(ncap):
                a, j = cp_a[i], cp_j[i]
                if adm_of[j] != a:
                    continue
                if R[j] >= window:
                    totals[7] = j
                    return _WINDOW
                _preempt(j, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn, qp, qhead, qtail, rc,
                         adm_of, K, S, ref, pblocks, preemptions, recomputed)
                pre_list[npre] = j
                npre += 1
                # grown_reservation (kvdro.sim.scheduler)
                base_b = -(-L[j] // B)
                buf = R[j] - base_b
                if buf < 0:
                    buf = 0
                grow = 2 * buf
                if grow < 1:
                    grow = 1
                R[j] = window if window < base_b + grow else base_b + grow
        elif reactive:
            # vLLM's check before a sequence s: a free block, else preempt the newest (maybe s itself)
            npre, stopped = _free_block_check(sc[_RHEAD], G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn,
                                              qp, qhead, qtail, rc, adm_of, K, S, ref, pblocks, preemptions,
                                              recomputed, pre_list, npre)
            if not stopped:
                for i in range(na):
                    j, a = al_j[i], al_a[i]
                    if adm_of[j] != a:
                        continue
                    sc[_FREE] -= 1
                    if sc[_FREE] == 0:
                        s = rn[j]
                        if s >= 0:
                            npre, done_check = _free_block_check(s, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0,
                                                                 gprev, qn, qp, qhead, qtail, rc, adm_of, K, S, ref,
                                                                 pblocks, preemptions, recomputed, pre_list, npre)
                            if done_check:
                                break
        else:
            for i in range(na):
                j, a = al_j[i], al_a[i]
                if adm_of[j] != a:
                    continue
                npre, stopped = _free_block_check(j, G, sc, rn, rp, rhl, tight, kv_off, g_off, own0, gprev, qn, qp,
                                                  qhead, qtail, rc, adm_of, K, S, ref, pblocks, preemptions,
                                                  recomputed, pre_list, npre)
                if stopped:
                    break
                sc[_FREE] -= 1
        if npre > 0 and look:
            return _ORACLE_PREEMPTED
        for i in range(npre):  # waiting.extendleft(preempted)
            whead = (whead - 1) % wcap
            wbuf[whead] = pre_list[i]
            wlen += 1
        if sc[_NRUN] == 0:
            continue
        n = sc[_NRUN]
        dur = base[n] + slope * (sc[_SUMOFF] + n * (G + 1))
        used = blocks - sc[_FREE]
        steps += 1
        busy += dur
        ok &= _addmul(wide, RES, n, dur)
        ok &= _addmul(wide, DB, n, dur)
        dps += dur
        ok &= _addmul(wide, KVI, used, dur)
        if used > peak:
            peak = used
        t += dur
        G += 1
        while True:
            g_done = _top_valid(dg, da, dj, sc, _DSIZE, adm_of)
            if g_done == _NONE or g_done > G - 1:
                break
            j = dj[0]
            _pop(dg, da, dj, sc, _DSIZE)
            finish[j] = t
            generated[j] = X[j]
            final_cap[j] = B * (-(-(kv_off[j] + G) // B)) if tight[j] else cap0[j]
            nb = _owned(j, G, tight, kv_off, own0, S)
            _remove_running(j, sc, rn, rp, rhl, tight, kv_off, qn, qp, qhead, qtail, rc, adm_of)
            _release(j, nb, sc, K, ref, pblocks)
            if look:
                _la_done(j, lk, mem, mpos, lo_o, lo_c, S)
        if not ok:
            return _RANGE

    totals[0] = steps
    totals[1] = prefill_steps
    totals[2] = busy
    totals[3] = dps
    totals[4] = t
    totals[5] = peak
    totals[6] = sc[_FREE]
    return _OK
