"""The exact frontier DP of planner/_optimal_dp.py, compiled with numba (NOTE [ the compiled kernel ]).

NOTE [ the compiled kernel ]
`_optimal_dp.solve` is the reference: readable, pure Python, and the tests' second oracle. This is
the same recurrence over the same exact integer peaks, compiled, with two changes that keep it exact
and make it fast:

- Frontiers live in one pool of arrays (`off[s, t]`, `cnt[s, t]` index it), not lists of lists.
- A sub-chain's frontier is built as a running envelope: each choice's staircase is walked in
  peak order and only its points that beat the envelope are kept (NOTE [ only points that beat
  the envelope ]), then merged in linear time (no sort). A split whose fastest possible time is
  no better than the envelope at its least peak is skipped before the walk, and the walk stops
  where the envelope is as fast as the split can ever be. Splits whose forward alone exceeds the
  cap end the scan (the forward peak only grows with the split point).
- Sub-chains of one length depend only on shorter ones: they are solved in parallel (numba's
  threads), each worker writing to a staging row that is copied into the pool afterwards.

Exact ties (same peak, same time) keep the earlier choice in the order tried: the record (its
policies in order), then the splits of the sub-problems one stage shorter (NOTE [ winners
first ]), then the others ascending, each before its late twin; times that differ by under
1e-12 relative count as ties, as in the reference. Peaks and times equal the reference's
(tests/planner/test_optimal_kernel.py); on exact ties the choice may differ (the reference sorts
by choice code), never the point.

NOTE [ windows ]
A plan wants one point: the fastest schedule within the budget B. A sub-chain is then asked for
its best time only within B minus what its ancestors hold (a_{s-1} under a split's right part,
a_{s-1} and s_s under a record), and the most they can hold, `held`, is a max-plus pass from the
whole chain down (`_windows`). So each sub-chain needs its frontier only from lo = B - held (its
point in force there, at its own peak) up to B: a window. Long sub-chains near the chain's start
have narrow windows (the whole chain's is one point), and they are the expensive ones: at 200
stages the walks do half to a quarter of the steps. Every window holds the exact frontier, so
the point at B is the exact optimum. Each choice's point in force at lo enters the envelope at its
own peak (which may lie below lo) and is tested there, so that where times tie the lower peak wins,
as in the full frontier: the point at B is the full frontier's, peak and time.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import threading
from bisect import bisect_right

import numpy as np
from memplan.planner._optimal_dp import POLICY_BASE, RECORD, Costs, late_useful

__all__ = ["available", "check_costs", "solve_compiled", "least_peak_compiled", "PoolFrontiers", "warm"]

log = logging.getLogger(__name__)

try:  # numba is a dependency; a broken install falls back to the reference (slow, still exact)
    import numba
    from numba import get_num_threads, njit, prange

    # NOTE [ numba's threads and torch's ]: numba's default "omp" layer shares the OpenMP
    # runtime with torch: in a benchmark pinned to one torch thread, a second thread ran at 100%
    # through every timed step once a plan had been solved, and step times drifted by 20%. On
    # the workqueue layer (numba's own pthreads) it does not. That layer must not be entered by
    # two Python threads at once (the service plans in a thread pool): _LAUNCH serialises it.
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"
    _NUMBA = True
except Exception as exc:  # pragma: no cover - exercised only where numba cannot load
    log.warning("numba unavailable (%s): the optimal planner uses its pure-Python DP", exc)
    _NUMBA = False

    def njit(*args, **kwargs):  # noqa: D401 - a no-op decorator standing in for numba's
        return (lambda fn: fn) if not (args and callable(args[0])) else args[0]

    prange = range

    def get_num_threads() -> int:
        return 1


_NO_CAP = np.int64(2**62)
# NOTE [ a launch's cost ]
# A parallel loop on numba's workqueue layer (NOTE [ numba's threads and torch's ]) costs 130-150
# us to launch and join on the 2-core machine of docs/planner.md, against 2 us on the OpenMP
# layer: waking the pool's threads, not the work. The DPs launch once per length and kind (2,000
# times at 1,000 stages: 0.3 s of a 1.6 s solve), and short lengths hold less work than a launch.
# So a length runs in the calling thread unless its estimated work, d splits over the points of
# each sub-problem's predecessor (about one walk step each, a few ns), reaches _PARALLEL_WORK
# (about half a millisecond); a length with nothing to solve launches nothing; and the pool is
# filled in one thread (a length's copy takes less than a launch). Which thread solves a
# sub-problem never changes its frontier (tests pass `_parallel_work=0` to run every length in
# parallel).
_PARALLEL_WORK = 100_000


@njit(cache=True, inline="always")
def _walk_work(kind, d, st, cnt):
    """The estimated walk steps of sub-problem (kind, st, st+d-kind) (NOTE [ a launch's cost ]):
    d splits over the points of its predecessor one stage shorter."""
    return d * (cnt[kind, st, st + d - kind - 1] + 1) if d > 0 else 1
_CEIL = np.int64(1 << 41)  # the time cap's choice code (NOTE [ the time cap ]): never stored

# NOTE [ the time cap ]
# A plan wants the fastest schedule within its budget, and an upper bound U on that optimum's
# time (a schedule of the recurrence known to fit) limits what any sub-problem can contribute:
# 1. Every stage runs forward (f) and backward (b) at least once, so the stages outside a
#    sub-problem X take at least W(outside X) = the sum of their least f + b.
# 2. If X ends before the loss (t < L), or is a late left part, some ancestor ran `F s..t` no-grad
#    before X recorded them: the first ancestor with the same end that is a left part was
#    reached by a split whose forward covered it (the root ends at the loss, so one exists). That
#    adds fn(s..t) outside X.
# 3. So in a schedule of time T <= U, X's point has time at most U - W(outside X) - (rule 2), its
#    cap: a sub-problem's points above its cap are never part of such a schedule. The envelope
#    starts as one point at the cap (choice _CEIL, dropped before the frontier is stored), so a
#    split or record whose points do not beat the cap adds nothing, and a child's frontier
#    begins where its times fall below its cap (the walks start higher).
# 4. The optimum's own sub-problems all keep their points (rule 3 with T = the optimum <= U), so
#    the top's point at the budget is the exact optimum whenever one exists within U; if no point
#    is left at the budget, U was below the optimum and the caller solves again without a cap.
#    Caps are loosened by a relative 1e-9 of U (sums in other orders round differently).
# The caps are the same for every member of a content class (they depend on its costs only).
# On 1,000 identical blocks, U from a one-level schedule (planner/optimal.py) drops 47-65% of
# the pool's points and halves the solve.
_BIG = np.int64(2**62)  # the sentinel peak after each frontier in the pool: above every real one
_LAUNCH = threading.Lock()  # NOTE [ numba's threads and torch's ]


def available() -> bool:
    """True when the compiled kernel can run (numba imports)."""
    return _NUMBA


@njit(cache=True)
def _grow(a, need):
    if need <= a.shape[0]:
        return a
    out = np.empty(max(need, 2 * a.shape[0]), a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True)
def _grow3(P, T, C, need):
    """A staircase's three arrays (peaks, times, choices) with room for `need` points."""
    return _grow(P, need), _grow(T, need), _grow(C, need)


@njit(cache=True, inline="always")  # inlined: scalars out, and the loop is each merge's hot part
def _merged_stretch(Ep, Et, Ec, i, ne, Sp, St, Sc, ns, Op, Ot, Oc, k):
    """The lower envelope of E from its point i on (E's point i-1 in force before it) and S
    (ns >= 1), written to O from index k. On exact ties E wins; times within 1e-12 relative are
    ties. Stops once S is spent and E beats its last value: E's tail from there is the envelope's
    as it is. Returns (where that tail starts in E, the end of what was written in O)."""
    ea = Et[i - 1] if i > 0 else np.inf
    ec = Ec[i - 1] if i > 0 else 0
    last = ea
    j = 0
    sa = np.inf
    sc = 0
    while i < ne or j < ns:
        if j >= ns and i < ne and Et[i] < sa:
            if Et[i] < last - abs(last) * 1e-12 or last == np.inf:
                break  # S is spent and E beats its last value from here on: E's tail as it is
        if j >= ns or (i < ne and Ep[i] <= Sp[j]):
            m = Ep[i]
        else:
            m = Sp[j]
        while i < ne and Ep[i] == m:
            ea = Et[i]
            ec = Ec[i]
            i += 1
        while j < ns and Sp[j] == m:
            sa = St[j]
            sc = Sc[j]
            j += 1
        if sa < ea:
            v = sa
            c = sc
        else:
            v = ea
            c = ec
        if v < last - abs(last) * 1e-12 or (last == np.inf and v < np.inf):
            Op[k] = m
            Ot[k] = v
            Oc[k] = c
            k += 1
            last = v
    return i, k


@njit(cache=True, inline="always")  # inlined: a call costs its arrays' reference counts
def _merge_env(Ep, Et, Ec, ne, Sp, St, Sc, ns, Op, Ot, Oc):
    """The lower envelope of staircases E and S into O (`_merged_stretch`); returns its length.
    E's points below S's first peak, and its tail once S is spent and beaten, are block copies."""
    if ns == 0:
        Op[:ne] = Ep[:ne]
        Ot[:ne] = Et[:ne]
        Oc[:ne] = Ec[:ne]
        return ne
    i = _last_le(Ep, 0, ne, Sp[0] - 1) + 1  # E's points with a peak below S's first
    Op[:i] = Ep[:i]
    Ot[:i] = Et[:i]
    Oc[:i] = Ec[:i]
    i, k = _merged_stretch(Ep, Et, Ec, i, ne, Sp, St, Sc, ns, Op, Ot, Oc, i)
    n = ne - i
    Op[k:k + n] = Ep[i:ne]
    Ot[k:k + n] = Et[i:ne]
    Oc[k:k + n] = Ec[i:ne]
    return k + n


@njit(cache=True, inline="always")  # inlined: a call costs its arrays' reference counts
def _merge_in_place(Ep, Et, Ec, ne, Sp, St, Sc, ns, Fp, Ft, Fc):
    """`_merge_env` of E and S (ns >= 1) into E itself (room for ne + ns points; F: scratch for as
    many); returns its length. Only the stretch that S changes is written: E's points below S's
    first peak stay where they are, and its tail once S is spent and beaten is moved as a block
    (NOTE [ winners first ]: most merges add a few points to a long envelope)."""
    i0 = _last_le(Ep, 0, ne, Sp[0] - 1) + 1  # E's points with a peak below S's first: kept
    i, k = _merged_stretch(Ep, Et, Ec, i0, ne, Sp, St, Sc, ns, Fp, Ft, Fc, 0)
    # E = E[:i0] + F[:k] + E[i:ne]: the tail moves from i to i0 + k (ranges may overlap)
    n = ne - i
    to = i0 + k
    if to > i:
        for q in range(n - 1, -1, -1):
            Ep[to + q] = Ep[i + q]
            Et[to + q] = Et[i + q]
            Ec[to + q] = Ec[i + q]
    elif to < i:
        for q in range(n):
            Ep[to + q] = Ep[i + q]
            Et[to + q] = Et[i + q]
            Ec[to + q] = Ec[i + q]
    Ep[i0:to] = Fp[:k]
    Et[i0:to] = Ft[:k]
    Ec[i0:to] = Fc[:k]
    return to + n


@njit(cache=True)
def _push(Sp, St, Sc, n, p, tm, ch):
    """Append (p, tm, ch) to a staircase being built in peak order; returns the new length."""
    if n > 0 and Sp[n - 1] == p:
        if tm < St[n - 1]:
            St[n - 1] = tm
            Sc[n - 1] = ch
        return n
    if n > 0 and tm >= St[n - 1]:
        return n
    Sp[n] = p
    St[n] = tm
    Sc[n] = ch
    return n + 1


@njit(cache=True)
def _last_le(P, lo, hi, v):
    """The index of the last of P[lo:hi] (ascending) that is <= v; lo - 1 when none is."""
    a = lo
    b = hi
    while a < b:
        mid = (a + b) // 2
        if P[mid] <= v:
            a = mid + 1
        else:
            b = mid
    return a - 1


@njit(cache=True)
def _gallop(P, lo, hi, v):
    """`_last_le` searching from lo outwards: O(log distance), for answers near the start (a
    window's in-force point is usually one of a frontier's first few)."""
    if lo >= hi or P[lo] > v:
        return lo - 1
    step = 1
    a = lo  # P[a] <= v
    while True:
        b = a + step
        if b >= hi:
            return _last_le(P, a, hi, v)
        if P[b] > v:
            return _last_le(P, a, b, v)
        a = b
        step *= 2


@njit(cache=True)
def _shifted(PP, PT, o, n, floor, shift, add, cap, lo, choice, Sp, St, Sc):
    """A child's frontier (pool points o..o+n) as the parent's staircase: peaks shifted by `shift`
    bytes and at least `floor`, times plus `add` seconds, up to `cap`, from the point in force at
    `lo` (NOTE [ windows ]); returns its length."""
    ns = 0
    for q in range(max(o, _last_le(PP, o, o + n, lo - shift)), o + n):
        pk = max(floor, PP[q] + shift)
        if pk > cap:
            break
        ns = _push(Sp, St, Sc, ns, pk, PT[q] + add, choice)
    return ns


@njit(cache=True, inline="always")  # inlined: a call costs its arrays' reference counts
def _split_points(PP, PT, oR, nR, oL, nL, xs, fsum, fastest, fwd, m0, m1, sp, Ep, Et, ne, e,
                  Sp, St, Sc):
    """The points of a split's staircase S(m) = fsum + R(m - xs) + L(m) (m >= fwd) on [m0, m1]
    that beat the envelope E (e: its point in force at m0), into (Sp, St, Sc); returns how many
    (at most nR + nL + 1). The first is the point in force at m0, at its own peak (below m0 in a
    window: NOTE [ windows ]). The walk ends where E is as fast as S can ever be (`fastest`).

    NOTE [ only points that beat the envelope ]
    A point of S that does not beat E where it starts cannot win later either: E only falls until
    S's next point. Keeping just the winners means most splits end with nothing to merge, and the
    envelope is copied only for the few that add points (merging every split's staircase copied
    the envelope each time: most of the kernel's time at 200 stages). Testing blocks of S against
    E to skip them without walking was tried, and costs more than the walk."""
    # NOTE [ the walk's inner loop ]: the pool and E hold a sentinel peak (_BIG) after their last
    # points, so the walk needs no end tests; which child steps next is a comparison, not a
    # branch; E's index lags (one step per point of S, no branch) and is made exact only when S
    # seems to beat it (a lagging index only overstates E's time); indices are unsigned, so
    # numba adds no negative-index wraparound to each load. Together: twice as fast. Each child's
    # peak after next is loaded a step ahead (nr2, nl2; E's next peak likewise), so the step that
    # picks the next peak selects a value already loaded instead of waiting on a load whose
    # address the previous step computed: 3.4 ns a step instead of 4.5 in isolation, 15% off the
    # 1,000-block memo solve. The pool keeps room for one point after its last sentinel.
    ns = 0
    i = np.uint64(_gallop(PP, oR, oR + nR, m0 - xs))
    j = np.uint64(_gallop(PP, oL, oL + nL, m0))
    one = np.uint64(1)
    v = fsum + PT[i] + PT[j]
    p = max(max(PP[i] + xs, PP[j]), fwd)
    # tested against E at its own peak, which may lie below m0 in a window: where times tie, the
    # lower peak wins, as in the full frontier (NOTE [ windows ])
    e0 = _last_le(Ep, 0, e + 1, p)
    if e0 < 0 or v < Et[e0] - abs(Et[e0]) * 1e-12:
        ns = _push(Sp, St, Sc, ns, p, v, sp)
    nr = PP[i + one] + xs
    nl = PP[j + one]
    m = min(nr, nl)
    Ep[ne] = _BIG  # (E may be empty)
    while e < 0 and m <= m1:  # below E's first point: every point of S enters
        if Ep[0] <= m:
            e = 0
            break
        i += np.uint64(nr == m)
        j += np.uint64(nl == m)
        nr = PP[i + one] + xs
        nl = PP[j + one]
        ns = _push(Sp, St, Sc, ns, m, fsum + PT[i] + PT[j], sp)
        m = min(nr, nl)
    if e < 0:
        return ns
    k = np.uint64(e)
    two = np.uint64(2)
    nr2 = PP[i + two] + xs  # each child's peak after next, loaded a step ahead
    nl2 = PP[j + two]
    ne1 = Ep[k + one]
    while m <= m1:
        a = nr == m
        b = nl == m
        i += np.uint64(a)
        j += np.uint64(b)
        nr = nr2 if a else nr
        nl = nl2 if b else nl
        nr2 = PP[i + two] + xs
        nl2 = PP[j + two]
        k += np.uint64(ne1 <= m)
        ne1 = Ep[k + one]
        if Et[k] <= fastest:
            break  # E is as fast as S can ever be: nothing from here on beats it
        v = fsum + PT[i] + PT[j]
        if v < Et[k] - abs(Et[k]) * 1e-12:
            while Ep[k + one] <= m:
                k += one
            ne1 = Ep[k + one]
            if v < Et[k] - abs(Et[k]) * 1e-12:
                ns = _push(Sp, St, Sc, ns, m, v, sp)
        m = min(nr, nl)
    return ns


@njit(cache=True, inline="always")
def _hold(late, t, x, s):
    """Bytes that P(., t), or Q(., t) when `late`, holds throughout besides a_{s-1}: the gradient
    d_t (t = L: none yet, the loss makes it), or the state before `B t+1` (a_t, s_{t+1}, d_{t+1})."""
    if late:
        return x[t] + s[t + 1] + x[t + 1]
    return x[t] if t < x.shape[0] - 1 else 0


@njit(cache=True, inline="always")
def _record_floor(st, hold, x, s, tfr, tb):
    """The least peak (bytes) of a record choice at st < t, whatever the child: `R st` with
    `hold` beside a_{st-1}, and `B st`."""
    xs = x[st - 1]
    return max(xs + hold + x[st] + s[st] + tfr[st], xs + s[st] + x[st] + xs + tb[st])


@njit(cache=True, inline="always")
def _one_stage_peak(late, t, x, s, tfr, tfl, tb):
    """The peak (bytes) of P(t, t) (`R t`, `loss` when t = L, `B t`) or, when `late`, of Q(t, t)
    (`R t` on the live a_t, `B t+1` above the record s_t, `B t`)."""
    xs = x[t - 1]
    hold = _hold(late, t, x, s)
    b_peak = xs + s[t] + x[t] + xs + tb[t]
    if late:
        return max(max(xs + hold + s[t] + tfl[t], xs + s[t] + hold + x[t] + tb[t + 1]), b_peak)
    pk = max(xs + hold + x[t] + s[t] + tfr[t], b_peak)
    if t == x.shape[0] - 1:  # t = L: the loss makes d_L while a_L and s_L are live
        pk = max(pk, xs + s[t] + 2 * x[t])
    return pk


@njit(cache=True)
def _subchain(late, st, t, K, cap, lo, off, cnt, PP, PT, PC, W, H):
    """The frontier of sub-chain st..t (P), or of the late left part Q(st, t) when `late` (NOTE
    [ the recurrence ] in planner/_optimal_dp.py), into the work arrays W = (E, F, S) x (peaks,
    times, choices) + the split scratch (`_work`), from the frontiers of shorter sub-problems in
    the pool (PP, PT, PC) at (off, cnt)[kind, s, t] (kind 0: P, 1: Q), from its point in force at
    `lo` bytes up to `cap` (NOTE [ windows ]). K: the cost arrays. The splits listed in
    H[1:1 + H[0]] are tried first, then the others ascending (NOTE [ split order and parts ]).
    Returns (its length, W): the envelope is W[0..2], arrays that grew are new ones.

    NOTE [ split order and parts ]
    The envelope is the lower envelope of every choice's staircase whatever the order they enter
    it, so the splits may be tried in any order: only which choice is kept on an exact tie can
    differ (never a point; times within 1e-12 relative count as ties, as everywhere here). Order
    matters for speed: a split is walked, and the envelope copied, only where it may beat the
    envelope so far, so splits that win early prune the rest. And the envelope at m depends only
    on the choices' points at or below m, so a frontier can be built in parts over memory ranges
    [lo, m1), [m1, m2), ..., [mk, cap] (each part a window: NOTE [ windows ]) and the parts
    merged. The long-chain solver (planner/_optimal_long.py) lists first the splits that won the
    same sub-problem one stage shorter (on repeated blocks nearly the same ones win), and, when a
    length has too few sub-problems to keep the threads busy (1,000 identical blocks: 3 a length),
    builds each one in as many memory ranges as threads. `_solve` lists the splits of the two
    sub-problems one stage shorter (NOTE [ winners first ]) and uses no parts."""
    x, fn, tff, useful = K[0], K[2], K[5], K[9]
    Ps, Ptfr, Ptfl, Ptb, Pf, Pb, npol = K[10], K[11], K[12], K[13], K[14], K[15], K[16]
    Ep, Et, Ec, Fp, Ft, Fc, Sp, St, Sc, FW, FS, MK = W
    own = 1 if late else 0  # the family of the right parts and the record's child
    hold = _hold(late, t, x, K[4])  # a late part's stage t+1 has one policy: its base record
    xs = x[st - 1]
    ne = 0
    tcap = K[19][0] + (K[18][t] - K[18][st - 1])  # NOTE [ the time cap ]
    if late or t < x.shape[0] - 1:  # an ancestor ran `F st..t` no-grad (rule 2 there)
        tcap -= K[20][t] - K[20][st - 1]
    if tcap < np.inf:  # the envelope starts as the cap: only points below it enter
        Ep[0] = -_BIG
        Et[0] = tcap
        Ec[0] = _CEIL
        ne = 1
    # record s, under each of its save policies (NOTE [ save policies in the recurrence ] in
    # planner/_optimal_dp.py): each policy's staircase enters the envelope
    for pol in range(npol[st]):
        code = RECORD if pol == 0 else POLICY_BASE - pol
        fb = Pf[pol, st] + Pb[pol, st]
        if st == t:
            pk = _one_stage_peak(late, t, x, Ps[pol], Ptfr[pol], Ptfl[pol], Ptb[pol])
            if pk > cap:
                continue
            Sp, St, Sc = _grow3(Sp, St, Sc, 1)
            Sp[0] = pk
            St[0] = fb
            Sc[0] = code
            ns = 1
        else:
            o = off[own, st + 1, t]
            nc = cnt[own, st + 1, t]
            if nc == 0:
                continue
            floor = _record_floor(st, hold, x, Ps[pol], Ptfr[pol], Ptb[pol])
            if ne > 0:  # skip a policy whose fastest point is no faster than the envelope at its
                # least peak: the envelope only falls from there (as for splits)
                least = max(floor, PP[o] + xs + Ps[pol, st])
                e = _gallop(Ep, 0, ne, max(least, lo))
                if e >= 0 and Et[e] <= PT[o + nc - 1] + fb and Ep[e] <= least:
                    continue
            Sp, St, Sc = _grow3(Sp, St, Sc, nc + 1)
            ns = _shifted(PP, PT, o, nc, floor, xs + Ps[pol, st], fb, cap, lo, code, Sp, St, Sc)
        if ns == 0:
            continue
        if ne == 0:
            Ep, Et, Ec = _grow3(Ep, Et, Ec, ns)
            Ep[:ns] = Sp[:ns]
            Et[:ns] = St[:ns]
            Ec[:ns] = Sc[:ns]
            ne = ns
        else:
            if ne + ns > Fp.shape[0]:
                Fp, Ft, Fc = _grow3(Fp, Ft, Fc, ne + ns)
            ne = _merge_env(Ep, Et, Ec, ne, Sp, St, Sc, ns, Fp, Ft, Fc)
            Ep, Fp = Fp, Ep
            Et, Ft = Ft, Et
            Ec, Fc = Fc, Ec
    # splits at s': F s..s'-1 keeping a_{s'-1}, the right part s'..t, then the left part s..s'-1
    # plain (choice s') or, where it can help, late (choice -s')
    # (FW, FS: each split's forward peak and no-grad forward seconds, MK: tried, by s' - st - 1)
    fwd = 0
    fsum = 0.0
    spmax = st
    for sp in range(st + 1, t + 1):
        k = sp - 1
        fwd = max(fwd, xs + hold + (x[k - 1] if k > st else 0) + x[k] + tff[k])
        fsum += fn[k]
        if fwd > cap:
            break  # the forward's peak only grows with s'
        FW[sp - st - 1] = fwd
        FS[sp - st - 1] = fsum
        MK[sp - st - 1] = False
        spmax = sp
    nh = H[0]
    for it in range(nh + spmax - st):  # the listed splits, then the others ascending
        if it < nh:
            sp = H[1 + it]
            if sp <= st or sp > spmax or MK[sp - st - 1]:
                continue
            MK[sp - st - 1] = True
        else:
            sp = st + 1 + it - nh
            if MK[sp - st - 1]:
                continue
        fwd = FW[sp - st - 1]
        fsum = FS[sp - st - 1]
        nR = cnt[own, sp, t]
        if nR == 0:
            continue
        oR = off[own, sp, t]
        for left in range(2 if useful[sp - 1] else 1):
            nL = cnt[left, st, sp - 1]
            if nL == 0:
                continue
            oL = off[left, st, sp - 1]
            least = max(max(PP[oR] + xs, PP[oL]), fwd)  # below this peak the split has nothing
            m = max(least, lo)
            if m > cap:
                continue
            fastest = fsum + PT[oR + nR - 1] + PT[oL + nL - 1]
            e = _gallop(Ep, 0, ne, m)  # the envelope's point in force at m
            if e >= 0 and Et[e] <= fastest and (
                    Ep[e] <= least or Et[e] < fastest - abs(fastest) * 1e-12):
                continue  # nothing this split offers beats the envelope, or ties it lower
            # (grown only when short: a call that returns arrays costs their reference counts,
            # and at 200 stages that was a tenth of the solve)
            if nR + nL + 1 > Sp.shape[0]:
                Sp, St, Sc = _grow3(Sp, St, Sc, nR + nL + 1)
            if ne + 1 > Ep.shape[0]:
                Ep, Et, Ec = _grow3(Ep, Et, Ec, ne + 1)  # room for the walk's sentinel
            end = min(cap, max(PP[oR + nR - 1] + xs, PP[oL + nL - 1]))
            ns = _split_points(PP, PT, oR, nR, oL, nL, xs, fsum, fastest, fwd, m, max(m, end),
                               -sp if left else sp, Ep, Et, ne, e, Sp, St, Sc)
            if ns == 0:
                continue  # nothing of this split enters the envelope: no merge, no copy
            if ne + ns + 1 > Fp.shape[0]:
                Fp, Ft, Fc = _grow3(Fp, Ft, Fc, ne + ns + 1)
            if ne + ns + 1 > Ep.shape[0]:
                Ep, Et, Ec = _grow3(Ep, Et, Ec, ne + ns + 1)
            ne = _merge_in_place(Ep, Et, Ec, ne, Sp, St, Sc, ns, Fp, Ft, Fc)
    k = _last_le(Ep, 0, ne, lo)  # the point in force at lo: those before it are never asked for
    if ne > 0 and Ec[max(k, 0)] == _CEIL:
        k += 1  # the time cap's point: nothing below the cap in force at lo
    if k > 0:
        ne -= k
        Ep[:ne] = Ep[k:k + ne].copy()
        Et[:ne] = Et[k:k + ne].copy()
        Ec[:ne] = Ec[k:k + ne].copy()
    return ne, (Ep, Et, Ec, Fp, Ft, Fc, Sp, St, Sc, FW, FS, MK)


@njit(cache=True)
def _work(n, L):
    """`_subchain`'s work arrays: three staircases of n points, and its split scratch for L
    stages."""
    return (np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.int64),
            np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.int64),
            np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.int64),
            np.empty(L, np.int64), np.empty(L, np.float64), np.zeros(L, np.bool_))


@njit(cache=True)
def _windows(x, s, useful, cap, windowed):
    """lo[kind, st, t]: the least budget (bytes) at which a schedule of the whole chain within
    `cap` asks sub-chain st..t (kind 0) or the late left part Q(st, t) (kind 1) for its best
    point (NOTE [ windows ]); all very low when not `windowed`."""
    L = x.shape[0] - 1
    lo = np.full((2, L + 2, L + 1), -_NO_CAP, np.int64)
    if not windowed:
        return lo
    held = np.full((2, L + 2, L + 1), -_NO_CAP, np.int64)  # the most bytes ancestors hold
    held[0, 1, L] = 0
    for d in range(L - 1, -1, -1):  # parents before children: longer sub-problems first; P(s,
        for kind in range(2):  # s+d) is the parent of Q(s, s+d-1), which is as long
            for st in range(1, L - d + 1):
                t = st + d - kind
                if kind == 1 and (t < st or not useful[t]):
                    continue
                h = held[kind, st, t]
                if h < 0:
                    continue  # never asked for
                lo[kind, st, t] = cap - h
                xs = x[st - 1]
                if st < t:  # the record holds a_{s-1} and s_s above the rest
                    held[kind, st + 1, t] = max(held[kind, st + 1, t], h + xs + s[st])
                for sp in range(st + 1, t + 1):  # a split: its right part above a_{s-1}
                    held[kind, sp, t] = max(held[kind, sp, t], h + xs)
                    held[0, st, sp - 1] = max(held[0, st, sp - 1], h)
                    if useful[sp - 1]:
                        held[1, st, sp - 1] = max(held[1, st, sp - 1], h)
    return lo


@njit(cache=True, parallel=True)
def _one_length(late, d, width, K, cap, lo, off, cnt, PP, PT, PC, n_workers, gP, gT, gC, gN):
    """The sub-problems of one length, P(s, s+d) or Q(s, s+d-1) when `late`, `n_workers` at a
    time, into the staging rows gP, gT, gC of `width` points (-1 in gN: the row was too narrow)."""
    for w in prange(n_workers):
        _stage(w, late, d, width, K, cap, lo, off, cnt, PP, PT, PC, n_workers, gP, gT, gC, gN)


@njit(cache=True)
def _listed(H, nh, PC, o, n, shift):
    """H with the splits s' (plain or late, as s'; records left out) of the pool points o..o+n
    appended after its first nh, each shifted by `shift` stages, a run of one choice listed once:
    (H, a new array where it grew; the new count). H[0] is left to the caller."""
    if 1 + nh + n > H.shape[0]:
        H = _grow(H, 1 + nh + n)
    last = 0
    for q in range(o, o + n):
        c = PC[q]
        if c == last:
            continue  # consecutive points of one choice: listed once
        last = c
        if c > 0:
            H[1 + nh] = c + shift
            nh += 1
        elif c < 0 and c > POLICY_BASE:  # a late split -s' (a record is 0 or below)
            H[1 + nh] = -c + shift
            nh += 1
    return H, nh


@njit(cache=True)
def _shorter_winners(kind, st, t, off, cnt, PC, H):
    """H[1:1 + H[0]]: the splits s' (plain or late, as s') in the frontiers of the two
    sub-problems one stage shorter, (kind, st, t-1) and (kind, st+1, t), in their peak order,
    repeats allowed (`_subchain` tries each once). Returns H (a new array where it grew).

    NOTE [ winners first ]
    Splits may enter the envelope in any order (NOTE [ split order and parts ]); the ones that
    win a sub-problem mostly win its neighbours one stage shorter too. Tried first, they build
    most of the envelope at once, and the other splits are then walked against it: fewer of their
    points beat it, so fewer merges (each copies the envelope). At 200 GPT-like stages the merges
    copied half as many points, and with four save policies per stage (larger frontiers, more
    splits in them) the solve took 0.6-0.9 x the time (benchmarks/bench_policies.py)."""
    nh = 0
    for src in range(2):
        a = st + src
        b = t - 1 + src
        if b >= a:
            H, nh = _listed(H, nh, PC, off[kind, a, b], cnt[kind, a, b], 0)
    H[0] = nh
    return H


@njit(cache=True)
def _stage(w, late, d, width, K, cap, lo, off, cnt, PP, PT, PC, n_workers, gP, gT, gC, gN):
    useful = K[9]
    kind = 1 if late else 0
    n = useful.shape[0] - 1 - d
    W = _work(width, useful.shape[0])
    H = np.zeros(width + 1, np.int64)
    for idx in range(w, n, n_workers):
        st = idx + 1
        t = st + d - kind
        if late and (t < st or not useful[t]):
            gN[idx] = 0
            continue
        H = _shorter_winners(kind, st, t, off, cnt, PC, H)  # NOTE [ winners first ]
        ne, W = _subchain(late, st, t, K, cap, lo[kind, st, t], off, cnt, PP, PT, PC, W, H)
        _to_row(gP, gT, gC, gN, idx, ne, W, width)


@njit(cache=True, inline="always")
def _to_row(gP, gT, gC, gN, r, ne, W, width):
    """Staging row r gets the envelope in W's first three arrays (ne points), or -1 in gN when
    it is wider than the rows' `width` (solved again by `_restage`)."""
    if ne <= width:
        gP[r, :ne] = W[0][:ne]
        gT[r, :ne] = W[1][:ne]
        gC[r, :ne] = W[2][:ne]
        gN[r] = ne
    else:
        gN[r] = -1


@njit(cache=True)
def _store(n, gP, gT, gC, gN, PP, PT, PC, at):
    """Staging rows 0..n-1 into the pool at `at`, each followed by a sentinel peak (in one
    thread: copying a length's rows takes less than a launch, NOTE [ a launch's cost ])."""
    for idx in range(n):
        ne = gN[idx]
        u = at[idx]
        PP[u:u + ne] = gP[idx, :ne]
        PT[u:u + ne] = gT[idx, :ne]
        PC[u:u + ne] = gC[idx, :ne]
        PP[u + ne] = _BIG


@njit(cache=True)
def _staging(rows, width):
    return (np.empty((rows, width), np.int64), np.empty((rows, width), np.float64),
            np.empty((rows, width), np.int64))


@njit(cache=True)
def _widen(g, width, n):
    """Staging rows (P, T, C) made `width` points wide, the first `n` rows kept."""
    out = _staging(g[0].shape[0], width)
    k = min(width, g[0].shape[1])
    out[0][:n, :k] = g[0][:n, :k]
    out[1][:n, :k] = g[1][:n, :k]
    out[2][:n, :k] = g[2][:n, :k]
    return out


@njit(cache=True)
def _restage(late, d, rows, width, K, off, cnt, PP, PT, PC, gP, gT, gC, gN, row_st, row_lo,
             row_cap):
    """Staging rows 0..rows-1 that came back too wide (-1 in gN), solved again one at a time into
    rows widened to fit; row r holds the frontier, on the window row_lo[r]..row_cap[r] bytes, of
    the sub-problem of length d that starts at row_st[r] (P(st, st+d), or Q(st, st+d-1) when
    `late`). Returns the width (points) and the staging arrays (gP, gT, gC), new if widened."""
    kind = 1 if late else 0
    H = np.zeros(width + 1, np.int64)
    for r in range(rows):
        if gN[r] >= 0:
            continue
        st = row_st[r]
        t = st + d - kind
        H = _shorter_winners(kind, st, t, off, cnt, PC, H)  # NOTE [ winners first ]
        ne, W = _subchain(late, st, t, K, row_cap[r], row_lo[r], off, cnt, PP, PT, PC,
                          _work(width, K[0].shape[0]), H)
        if ne > width:
            width = max(2 * width, ne)
            gP, gT, gC = _widen((gP, gT, gC), width, rows)
        gP[r, :ne] = W[0][:ne]
        gT[r, :ne] = W[1][:ne]
        gC[r, :ne] = W[2][:ne]
        gN[r] = ne
    return width, gP, gT, gC


@njit(cache=True)
def _solve(K, cap, windowed, n_workers, width, min_work, PP, PT, PC):
    """All sub-problems by length (each needs only shorter ones, and P(s, s+d) also Q(s, s+d-1)),
    those of one length and kind in parallel: each worker writes its frontiers to a staging row
    of width `width`; one that does not fit is solved again after the parallel loop, alone, and
    the rows widened. The pool (PP, PT, PC: `_pool`) keeps a sentinel peak after every frontier
    (for `_split_points`); returned are its used parts, views (NOTE [ the pool's memory ])."""
    x, useful = K[0], K[9]
    L = x.shape[0] - 1
    lo = _windows(x, K[17], useful, cap, windowed)  # the largest record: the most held
    off = np.zeros((2, L + 2, L + 1), np.int64)
    cnt = np.zeros((2, L + 2, L + 1), np.int64)
    used = 0
    gP, gT, gC = _staging(L, width)
    gN = np.zeros(L, np.int64)
    at = np.zeros(L, np.int64)
    row_st = np.arange(1, L + 1)  # staging row idx: the sub-problem that starts at idx + 1
    row_lo = np.zeros(L, np.int64)
    row_cap = np.full(L, cap, np.int64)
    any_late = False
    for j in range(L + 1):
        any_late = any_late or useful[j]
    for d in range(L):
        n = L - d  # P(st, st+d) and Q(st, st+d-1), st = 1..n
        for phase in range(2):
            kind = 1 - phase  # Q(s, s+d-1) first: P(s, s+d)'s late split at s' = s+d needs it
            if kind == 1 and (d == 0 or not any_late):
                continue
            late = kind == 1
            work = 0  # the length's walk work, estimated (NOTE [ a launch's cost ])
            for idx in range(n):
                work += _walk_work(kind, d, idx + 1, cnt)
            if work >= min_work and n_workers > 1:
                _one_length(late, d, width, K, cap, lo, off, cnt, PP, PT, PC, n_workers,
                            gP, gT, gC, gN)
            else:  # NOTE [ a launch's cost ]
                _stage(0, late, d, width, K, cap, lo, off, cnt, PP, PT, PC, 1, gP, gT, gC, gN)
            for idx in range(n):
                if gN[idx] < 0:  # too wide for its row: again, alone (`_restage`)
                    row_lo[idx] = lo[kind, idx + 1, idx + 1 + d - kind]
            width, gP, gT, gC = _restage(late, d, n, width, K, off, cnt, PP, PT, PC, gP, gT, gC,
                                         gN, row_st, row_lo, row_cap)
            biggest = 0
            for idx in range(n):
                at[idx] = used
                off[kind, idx + 1, idx + 1 + d - kind] = used
                cnt[kind, idx + 1, idx + 1 + d - kind] = gN[idx]
                used += gN[idx] + 1
                biggest = max(biggest, gN[idx])
            PP, PT, PC = _grow3(PP, PT, PC, used + 1)  # + 1: the walk reads a point ahead
            _store(n, gP, gT, gC, gN, PP, PT, PC, at)
            if 2 * biggest > width:
                width = 2 * biggest
                gP, gT, gC = _staging(L, width)
    return off, cnt, PP[:used], PT[:used], PC[:used]


# NOTE [ the pool's memory ]
# The pool holds every sub-problem's frontier: 5.9 M points, 142 MB, at 200 stages with four save
# policies (benchmarks/bench_policies.py). Grown by doubling, it was copied about seven times and
# each new array's pages faulted in one by one, and trimmed by a last copy: a tenth of the solve.
# So it is reserved once, as anonymous memory that the OS commits only where it is written
# (pages never touched cost nothing, so the reservation may be generous), with transparent huge
# pages asked for where Linux offers them on request (`madvise` mode): 2 MiB pages fault in 512
# times less often, and the walks' reads, scattered over children's frontiers all over the pool,
# miss the TLB less. A pool that outgrows its reservation still doubles (`_grow3`), and the result
# is the used part of the pool, a view that keeps the reservation alive, not a copy.
_POOL_POINTS_PER_SUB = 1024  # reserved points per sub-problem (windowed 200-stage chains: ~300)
_POOL_MAX_POINTS = 1 << 27  # 1 GiB of address space per array at most


_POOL_DTYPES = (np.int64, np.float64, np.int64)  # peaks (bytes), times (seconds), choices


def _plain_pool(points: int):
    """The pool's three arrays as plain numpy arrays of `points` each."""
    return tuple(np.empty(points, dtype) for dtype in _POOL_DTYPES)


def _pool(n_sub: int):
    """The frontier pool's three arrays (peaks int64 bytes, times float64 seconds, choices int64),
    room for `_POOL_POINTS_PER_SUB` points per sub-problem (`n_sub` of them), committed only where
    written (NOTE [ the pool's memory ]); plain arrays where anonymous mappings are missing."""
    points = int(min(_POOL_MAX_POINTS, max(1 << 16, n_sub * _POOL_POINTS_PER_SUB)))
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not flags:  # pragma: no cover - Windows: no anonymous private mappings in mmap
        return _plain_pool(points)
    out = []
    for dtype in _POOL_DTYPES:
        try:
            buf = mmap.mmap(-1, points * 8, flags=flags | getattr(mmap, "MAP_NORESERVE", 0))
        except (OSError, ValueError):  # pragma: no cover - address space refused: grow instead
            return _plain_pool(1 << 16)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                buf.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # pragma: no cover - a kernel without transparent huge pages
                pass
        out.append(np.frombuffer(buf, dtype))
    return tuple(out)


@njit(cache=True)
def _least_of(late, st, t, K, M):
    """The least peak of P(st, t), or of Q(st, t) when `late`, from those of shorter ones in M."""
    x, s, tff, useful = K[0], K[4], K[5], K[9]
    Ps, Ptfr, Ptfl, Ptb, npol = K[10], K[11], K[12], K[13], K[16]
    own = 1 if late else 0
    hold = _hold(late, t, x, s)
    xs = x[st - 1]
    best = _BIG
    for pol in range(npol[st]):
        if st == t:
            pk = _one_stage_peak(late, t, x, Ps[pol], Ptfr[pol], Ptfl[pol], Ptb[pol])
        else:
            pk = max(_record_floor(st, hold, x, Ps[pol], Ptfr[pol], Ptb[pol]),
                     M[own, st + 1, t] + xs + Ps[pol, st])
        best = min(best, pk)
    fwd = 0
    for sp in range(st + 1, t + 1):
        k = sp - 1
        fwd = max(fwd, xs + hold + (x[k - 1] if k > st else 0) + x[k] + tff[k])
        if fwd >= best:
            break  # the forward's peak only grows with s'
        left = M[0, st, sp - 1]
        if useful[sp - 1]:
            left = min(left, M[1, st, sp - 1])
        best = min(best, max(max(fwd, M[own, sp, t] + xs), left))
    return best


@njit(cache=True)
def _least_peak(K):
    x, useful = K[0], K[9]
    L = x.shape[0] - 1
    M = np.full((2, L + 2, L + 1), _BIG, np.int64)
    for t in range(1, L + 1):
        if useful[t - 1]:
            for st in range(t - 1, 0, -1):
                M[1, st, t - 1] = _least_of(True, st, t - 1, K, M)
        for st in range(t, 0, -1):
            M[0, st, t] = _least_of(False, st, t, K, M)
    return M[0, 1, L]


def _arrays(c: Costs, time_cap_s: float | None = None):
    """The kernel's cost tuple K: x, f, fn, b, s, tf_f, tf_r, tf_l, tb, useful (NOTE [ late left
    parts ] in planner/_optimal_dp.py), then the records of the save policies as (policies,
    stages) arrays: s, tf_r, tf_l, tb, f, b (row 0 the base fields), the number of policies per
    stage, and the largest record per stage (NOTE [ save policies in the recurrence ]); then, for
    the time cap (NOTE [ the time cap ]), the prefix sums W of each stage's least f + b
    (`_least_work`), the slack `time_cap_s` (1 + 1e-9) - W[L] (seconds; inf without a cap) and
    the prefix sums of fn."""
    i64 = np.int64
    rows = [c.row(p) for p in range(c.K)]
    Ps = np.asarray([r.s for r in rows], i64)
    npol = np.asarray(c.npol if c.npol is not None else [1] * (c.L + 1), i64)
    Pf = np.asarray([r.f for r in rows], np.float64)
    Pb = np.asarray([r.b for r in rows], np.float64)
    work = _least_work(Pf, Pb, npol)
    slack = np.inf if time_cap_s is None else time_cap_s * (1 + 1e-9) - float(work[c.L])
    return (np.asarray(c.x, i64), np.asarray(c.f, np.float64), np.asarray(c.f_nograd, np.float64),
            np.asarray(c.b, np.float64),
            np.asarray(c.s, i64), np.asarray(c.tf_f, i64), np.asarray(c.tf_r, i64),
            np.asarray(c.tf_l, i64), np.asarray(c.tb, i64),
            np.asarray(late_useful(c), np.bool_),
            Ps, np.asarray([r.tf_r for r in rows], i64), np.asarray([r.tf_l for r in rows], i64),
            np.asarray([r.tb for r in rows], i64), Pf, Pb, npol, Ps.max(axis=0),
            work, np.array([slack], np.float64),
            np.concatenate([[0.0], np.cumsum(np.asarray(c.f_nograd, np.float64)[1:])]))


def _least_work(Pf: np.ndarray, Pb: np.ndarray, npol: np.ndarray) -> np.ndarray:
    """W[t]: the least seconds stages 1..t take in any schedule (each runs forward and backward
    once, under its fastest save policy; Pf, Pb: (policies, stages), npol policies per stage);
    W[0] = 0."""
    offered = np.arange(Pf.shape[0])[:, None] < npol[None, :]
    least = np.where(offered, Pf + Pb, np.inf).min(axis=0)
    least[0] = 0.0
    return np.cumsum(least)


class PoolFrontiers:
    """Frontiers of every sub-chain in one pool: the compiled kernel's result. Same questions as
    `_optimal_dp.Frontiers`: `top()` and `choice(s, t, m)`."""

    def __init__(self, costs: Costs, cap, off, cnt, peaks, times, choices):
        self.costs = costs
        self.cap = cap
        self._off, self._cnt = off, cnt
        self._peaks, self._times, self._choices = peaks, times, choices

    def point_arrays(self, st: int, t: int, *, late: bool = False):
        """(peaks in bytes, times in seconds, choices) of sub-chain st..t (`late`: of the late
        left part Q(st, t)), as arrays."""
        o, n = self._off[int(late), st, t], self._cnt[int(late), st, t]
        return self._peaks[o:o + n], self._times[o:o + n], self._choices[o:o + n]

    def top(self) -> tuple[list[int], list[float]]:
        """The whole chain's frontier: (peaks in bytes, times in seconds)."""
        p, t, _ = self.point_arrays(1, self.costs.L)
        return p.tolist(), t.tolist()

    def choice(self, st: int, t: int, m: int, *, late: bool = False) -> int | None:
        """The choice of sub-chain st..t's fastest point within m bytes (None: nothing fits);
        `late`: of the late left part Q(st, t)."""
        o = int(self._off[int(late), st, t])
        # bisect on the pool itself: a schedule asks ~L times, and a slice and np.searchsorted
        # cost several times a bisection's ~10 element reads
        k = bisect_right(self._peaks, m, o, o + int(self._cnt[int(late), st, t])) - 1
        return None if k < o else int(self._choices[k])


# NOTE [ the kernel's inputs ]
# The compiled code indexes its pool by peaks compared against the sentinel _BIG = 2^62 and adds
# sizes to peaks in int64 without checks, so its inputs are checked here, before any indexing:
# every list has L + 1 entries, sizes are integers whose magnitudes sum to at most _MAX_SUM
# (2^60; a valid profile's are under 2^58 + its temporaries, NOTE [ ceilings ] in
# profiler/schema.py), so any peak plus any size stays below _BIG and _BIG plus a size below 2^63;
# times are finite and non-negative; a cap is at most _MAX_CAP (2^60, the budget ceiling of
# planner/request.py), so no budget reaches the "no cap" marker.
_MAX_SUM = 2**60
_MAX_CAP = 2**60


def check_costs(c: Costs, cap: int | None = None) -> None:
    """Raise `PlanError` (naming the input) unless `c` and `cap` are within the kernel's bounds
    (NOTE [ the kernel's inputs ]). Returns None."""
    from memplan.planner.schema import PlanError

    L = len(c.x) - 1
    if L < 1:
        raise PlanError("the chain has no stages", field="profile.layers")
    for name in ("x", "f", "b", "s", "tf_f", "tf_r", "tf_l", "tb"):
        if len(getattr(c, name)) != L + 1:
            raise PlanError(f"cost list {name} has {len(getattr(c, name))} entries, not {L + 1}",
                            field="profile.layers")
    total = 0
    for name in ("x", "s", "tf_f", "tf_r", "tf_l", "tb"):
        for v in getattr(c, name):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise PlanError(f"sizes must be integers of bytes, got {v!r} in {name}",
                                field="profile.layers")
            total += abs(int(v))
    if total > _MAX_SUM:
        raise PlanError(f"the sizes add up to {total} bytes, over the planner's ceiling of 2^60 "
                        "(NOTE [ ceilings ] in profiler/schema.py)", field="profile.layers")
    for name in ("f", "b"):
        for v in getattr(c, name):
            if not (math.isfinite(v) and v >= 0):
                raise PlanError(f"times must be finite seconds >= 0, got {v!r} in {name}",
                                field="profile.layers")
    for k, r in enumerate(c.alt, start=1):  # save policies' records: as the base fields
        for name in ("s", "tf_r", "tf_l", "tb", "f", "b"):
            vals = getattr(r, name)
            if len(vals) != L + 1:
                raise PlanError(f"policy {k}'s {name} has {len(vals)} entries, not {L + 1}",
                                field="profile.layers")
            for v in vals:
                if name in ("f", "b"):
                    if not (math.isfinite(v) and v >= 0):
                        raise PlanError(f"times must be finite seconds >= 0, got {v!r} in policy "
                                        f"{k}'s {name}", field="profile.layers")
                elif isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise PlanError(f"sizes must be integers of bytes, got {v!r} in policy {k}'s "
                                    f"{name}", field="profile.layers")
                else:
                    total += abs(int(v))
    if total > _MAX_SUM:
        raise PlanError(f"the sizes add up to {total} bytes, over the planner's ceiling of 2^60 "
                        "(NOTE [ ceilings ] in profiler/schema.py)", field="profile.layers")
    if c.npol is not None and (len(c.npol) != L + 1 or any(not 1 <= n <= c.K for n in c.npol)):
        raise PlanError(f"npol must give 1..{c.K} policies for each of {L + 1} entries",
                        field="profile.layers")
    if c.fn is not None and not all(math.isfinite(v) and v >= 0 for v in c.f_nograd):
        raise PlanError("no-grad forward times must be finite seconds >= 0", field="profile.layers")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, np.integer))
                            or int(cap) > _MAX_CAP):
        raise PlanError(f"at most 2^60 bytes (the planner's ceiling), got {cap!r}",
                        field="budget_bytes")


def solve_compiled(c: Costs, *, cap: int | None = None, windowed: bool = False, _width: int = 256,
                   _parallel_work: int = _PARALLEL_WORK):
    """`_optimal_dp.solve` compiled: the frontiers of every sub-chain (points above `cap` bytes
    dropped). `windowed` (with a cap): each sub-chain's frontier only where a schedule of the
    whole chain within `cap` can ask for it, and the whole chain's only its point at `cap`
    (NOTE [ windows ]); several times faster. Returns `PoolFrontiers` (the reference's
    `Frontiers` where numba is missing, which ignores `windowed`)."""
    check_costs(c, cap)
    if not _NUMBA:  # pragma: no cover
        from memplan.planner._optimal_dp import solve

        return solve(c, cap=cap)
    if cap is not None and cap < 0:
        cap = -1  # nothing fits (the kernel's "no cap" sentinel is large, so keep the sign)
    cap_i = _NO_CAP if cap is None else np.int64(cap)
    # _width: the first staging row's width in points (tests make it tiny to take the slow path);
    # _parallel_work: the least work a length runs in parallel (NOTE [ a launch's cost ]; tests: 0)
    K = _arrays(c)
    n_sub = c.L * (c.L + 1) // 2 * (2 if K[9].any() else 1)  # P, and Q where late splits help
    with _LAUNCH:
        off, cnt, P, T, C = _solve(K, cap_i, windowed and cap is not None,
                                   max(1, get_num_threads()), _width, _parallel_work,
                                   *_pool(n_sub))
    return PoolFrontiers(c, cap, off, cnt, P, T, C)


def least_peak_compiled(c: Costs) -> int:
    """`_optimal_dp.least_peak` compiled: the least peak (bytes) of any schedule of the recurrence."""
    check_costs(c)
    if not _NUMBA:  # pragma: no cover
        from memplan.planner._optimal_dp import least_peak

        return least_peak(c)
    return int(_least_peak(_arrays(c)))


def warm() -> float:
    """Compile (or load from numba's cache) every kernel function; returns the seconds it took.
    The Docker image calls it at build time so that the first plan in a container is fast."""
    import time

    t0 = time.perf_counter()
    c = Costs(x=[1, 2, 3, 1], f=[0.0, 1.0, 1.0, 1.0], b=[0.0, 2.0, 2.0, 2.0], s=[0, 1, 1, 1],
              tf_f=[0, 0, 0, 0], tf_r=[0, 0, 0, 0], tf_l=[0, 0, 0, 0], tb=[0, 0, 0, 0])
    solve_compiled(c)
    least_peak_compiled(c)
    return time.perf_counter() - t0
