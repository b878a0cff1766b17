"""Long chains: the exact DP memoised by sub-chain content, and a banded DP with a certified bound.

Both run the compiled kernel's sub-problem solver (`_optimal_kernel._subchain`, the recurrence of
NOTE [ the recurrence ] in planner/_optimal_dp.py) over a chosen set of sub-problems; only which
sub-problems are solved, and what stands in for the others, differs from `solve_compiled`.

NOTE [ memoised by content ]
A sub-problem's frontier depends only on the costs it reads: its input's size x_{s-1}, the costs
of stages s..t, whether t = L (the loss), and for a late left part Q(s, t) the costs of stage t+1
(the state before `B t+1`). Sub-problems of the same length with equal costs have equal frontiers
(by induction on length: their children are equal too), and their choices are the same split
points shifted by the distance between them. A transformer is an embedding, n identical blocks
and a head: of the L^2 / 2 sub-chains only about 3 per length differ (those that start at the
embedding, those that end at the head, the rest), so the DP solves O(L) sub-problems instead of
O(L^2), each still exactly, and aliases the others to them. Each class is solved over the union
of its members' windows (NOTE [ windows ] in planner/_optimal_kernel.py: the least `lo` of its
members), so every member's question is answered exactly. Chains without repeats gain nothing
(every class has one member) and the plain kernel runs instead. With about 3 sub-problems a
length, each is built in memory ranges, one per thread, its predecessor's winning splits tried
first (NOTE [ split order and parts ] in planner/_optimal_kernel.py).

NOTE [ banded DP and its certificate ]
On a long heterogeneous chain the optimum keeps a checkpoint every few stages: its sub-problems
are the suffixes s..L (the "spine": each top-level split's right part) and short segments (left
parts, and everything inside them). The banded DP solves exactly those: P(s, L) for every s, and
every P(s, t) and Q(s, t) of at most `width` stages, O(L x width^2) splits instead of O(L^3).
Two runs over the same band differ only in what the longer sub-problems are:

- upper: they are not offered (no point), so the DP is a restriction of the recurrence: its
  schedule is a schedule of the recurrence, replayed for the plan's numbers;
- lower: each offers one optimistic point, time sum(f + b) over its stages (no schedule of it
  is faster: each stage runs forward and backward at least once) at a peak that every schedule
  of it reaches (`_floors`: the largest `B k` of the sub-chain, which runs with a_{s-1}, its
  input a_{k-1}, s_k and d_k live while d_{k-1} is made). Each such point is below the true
  frontier everywhere, and the recurrence is monotone in its children (a min of sums with maxed
  floors), so the lower run's optimum is a lower bound on the exact optimum at the same budget.

The plan's `optimality_gap` = (replayed time - lower bound) / lower bound is therefore certified.

NOTE [ folded lower run ]
The lower run's cost is the suffixes' splits into optimistic long left parts: O(L^2) splits, each
walking a suffix's frontier (at 1,000 random stages without a budget, 8 s of CPU). Those splits of
P(s, L) at s' > s + width offer C(s') - C(s) + P(s', L)(m - x_{s-1}) at peaks of at least
max(fl[s, s'-1], the forward's peak to s'), C the prefix sums of fn + f + b. Both floors grow with
s', so every such staircase lies on or above G_s(m) = H_{s+width+1}(m - x_{s-1}) - C(s) from the
floors at s' = s + width + 1, where H_k = min over s' >= k of (C(s') + P(s', L)) is one running
envelope, extended by one suffix a length. Offering G_s instead of those splits (`fold`) is a
further relaxation, so the bound stays certified: O(L) merges instead of O(L^2) walks. Its times
are lowered by 1e-12 relative (C's differences round unlike the splits' sums). Only the
frontier's run without a budget uses it (planner/frontier.py); plans keep the unfolded run.
Wider bands close it (at width >= L both runs are exact); `auto` doubles the width until the gap is
within `max_gap`.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np
from memplan.planner._optimal_dp import RECORD, Costs, build_ops
from memplan.planner._optimal_kernel import (
    _BIG,
    _LAUNCH,
    _NO_CAP,
    _PARALLEL_WORK,
    _arrays,
    _grow3,
    _last_le,
    _listed,
    _merge_env,
    _pool,
    _push,
    _restage,
    _staging,
    _subchain,
    _to_row,
    _walk_work,
    _work,
    get_num_threads,
    njit,
    prange,
)

__all__ = ["LongFrontiers", "content_classes", "solve_long", "memo_worthwhile", "repeated_classes",
           "schedule_ops_long"]

log = logging.getLogger(__name__)

SKIP, SOLVE, ALIAS, OPTIMISTIC = 0, 1, 2, 3  # what each sub-problem is (status codes)
_OPT_CHOICE = 1 << 40  # the choice code of an optimistic point (no schedule behind it)


def content_classes(c: Costs) -> np.ndarray:
    """rep[kind, s, t]: the first start s' of a sub-problem of the same length and the same costs
    (NOTE [ memoised by content ]); kind 0 the sub-chains P(s, t), kind 1 the late left parts
    Q(s, t). Entries outside 1 <= s <= t <= L are 0."""
    L = c.L
    rows = np.column_stack([c.x, c.f, c.f_nograd, c.b, c.s, c.tf_f, c.tf_r, c.tf_l, c.tb])
    rows[0, 1:] = 0  # stage 0 is the input: only its size is a cost
    _, stype = np.unique(rows, axis=0, return_inverse=True)
    stype = stype.reshape(-1).astype(np.int64)
    base = int(stype.max()) + 1
    rep = np.zeros((2, L + 2, L + 1), np.int64)

    def pair(a, b):
        """Dense class ids of the pairs (a[i], b[i]), and each one's first index."""
        _, first, inv = np.unique(a * base + b, return_index=True, return_inverse=True)
        return inv.reshape(-1), first

    # A[st - 1]: the class of (x_{st-1}, stages st..st+d), extended one stage per length
    x0 = np.unique(np.asarray(c.x, np.int64), return_inverse=True)[1].reshape(-1)
    A, _ = pair(x0[:L], stype[1:L + 1])
    for d in range(L):
        n = L - d
        st = np.arange(1, n + 1)
        # P(st, st+d): A plus whether it ends at the loss
        inv, first = pair(A[:n], (st + d == L).astype(np.int64))
        rep[0, st, st + d] = first[inv] + 1
        if d + 1 < L:
            # Q(st, st+d) (a late left part, t = st+d < L) reads stage t+1 too: A extended by it
            A, first = pair(A[:n - 1], stype[d + 2:L + 1])
            rep[1, st[:n - 1], st[:n - 1] + d] = first[A] + 1
    return rep


def memo_worthwhile(rep: np.ndarray) -> bool:
    """Whether memoisation by content saves most of the work: fewer than a quarter of the
    sub-chains P(s, t) are their class's first member."""
    L = rep.shape[2] - 1
    s_idx = np.arange(rep.shape[1])[:, None]
    firsts = int(np.count_nonzero((rep[0] == s_idx) & (rep[0] > 0)))
    return firsts < 0.25 * L * (L + 1) / 2


def repeated_classes(c: Costs) -> np.ndarray | None:
    """The content classes of `c` (`content_classes`) where memoisation by them is worthwhile
    (`memo_worthwhile`), else None: what `solve_long(memo=True, classes=...)` takes, so that a
    caller that decides on memo does not have them computed twice."""
    rep = content_classes(c)
    return rep if memo_worthwhile(rep) else None


@njit(cache=True)
def _floors(x, s, tb):
    """fl[s, t]: a peak (bytes) that every schedule of P(s, t) or Q(s, t) reaches: the largest
    `B k`, k = s..t (NOTE [ banded DP and its certificate ])."""
    L = x.shape[0] - 1
    fl = np.zeros((L + 2, L + 1), np.int64)
    for st in range(1, L + 1):
        xs = x[st - 1]
        best = 2 * xs + s[st] + x[st] + tb[st]
        fl[st, st] = best
        for k in range(st + 1, L + 1):
            best = max(best, xs + 2 * x[k - 1] + s[k] + x[k] + tb[k])
            fl[st, k] = best
    return fl


@njit(cache=True)
def _held(held, status, rep, kind, st, t, v):
    """held of sub-problem (kind, st, t), or of its class's first member, raised to v."""
    code = status[kind, st, t]
    if code == SKIP or code == OPTIMISTIC:
        return
    r = rep[kind, st, t] if code == ALIAS else st
    tt = t - (st - r)
    if v > held[kind, r, tt]:
        held[kind, r, tt] = v


@njit(cache=True)
def _windows_long(x, s, useful, cap, windowed, status, rep):
    """lo[kind, st, t] (bytes) of every solved sub-problem, as the kernel's `_windows` (NOTE
    [ windows ] there), with two changes: only solved sub-problems ask their children (a band's
    skipped and optimistic ones ask nothing), and a class's first member answers for every member
    (NOTE [ memoised by content ]: it propagates the most any member's ancestors hold, which
    bounds each member's own; a wider window than needed is still exact)."""
    L = x.shape[0] - 1
    lo = np.full((2, L + 2, L + 1), -_NO_CAP, np.int64)
    if not windowed:
        return lo
    held = np.full((2, L + 2, L + 1), -_NO_CAP, np.int64)
    held[0, 1, L] = 0
    for d in range(L - 1, -1, -1):
        for kind in range(2):
            for st in range(1, L - d + 1):
                t = st + d - kind
                if t < st or status[kind, st, t] != SOLVE:
                    continue
                h = held[kind, st, t]
                if h < 0:
                    continue  # never asked for
                lo[kind, st, t] = cap - h
                xs = x[st - 1]
                if st < t:
                    _held(held, status, rep, kind, st + 1, t, h + xs + s[st])
                for sp in range(st + 1, t + 1):
                    _held(held, status, rep, kind, sp, t, h + xs)
                    _held(held, status, rep, 0, st, sp - 1, h)
                    if useful[sp - 1]:
                        _held(held, status, rep, 1, st, sp - 1, h)
    return lo


@njit(cache=True)
def _hints(kind, st, t, off, cnt, PC, status, rep, H):
    """H[1:1 + H[0]]: the splits s' (absolute, for st) that the sub-problems one stage shorter
    chose, (kind, st, t-1) and (kind, st+1, t), shifted from their class's first member (NOTE
    [ split order and parts ] in planner/_optimal_kernel.py). Returns H (a new array where it
    grew)."""
    nh = 0
    for src in range(2):
        a = st + src
        b = t - 1 + src
        if b < a:
            continue
        code = status[kind, a, b]
        if code != SOLVE and code != ALIAS:
            continue
        shift = a - (rep[kind, a, b] if code == ALIAS else a)
        H, nh = _listed(H, nh, PC, off[kind, a, b], cnt[kind, a, b], shift)
    H[0] = nh
    return H


@njit(cache=True)
def _solve_rows(w, late, d, width, K, off, cnt, PP, PT, PC, n_workers, gP, gT, gC, gN, rows,
                row_st, row_lo, row_cap, status, rep):
    """Worker w's share of staging rows 0..rows-1 (rows w, w + n_workers, ...): row r the
    frontier, on the window row_lo[r]..row_cap[r] bytes (empty when lo > cap), of the sub-problem
    of length d that starts at row_st[r] (P(s, s+d), or Q(s, s+d-1) when `late`), its
    predecessors' splits tried first (`_hints`); -1 in gN: too wide for the row."""
    kind = 1 if late else 0
    L = K[0].shape[0]
    W = _work(width, L)
    H = np.zeros(2 * L + 2, np.int64)
    for r in range(w, rows, n_workers):
        if row_lo[r] > row_cap[r]:
            gN[r] = 0
            continue
        st = row_st[r]
        t = st + d - kind
        H = _hints(kind, st, t, off, cnt, PC, status, rep, H)
        ne, W = _subchain(late, st, t, K, row_cap[r], row_lo[r], off, cnt, PP, PT, PC, W, H)
        _to_row(gP, gT, gC, gN, r, ne, W, width)


@njit(cache=True, parallel=True)
def _solve_set(late, d, width, K, off, cnt, PP, PT, PC, n_workers, gP, gT, gC, gN, rows,
               row_st, row_lo, row_cap, status, rep):
    """`_solve_rows` on `n_workers` threads."""
    for w in prange(n_workers):
        _solve_rows(w, late, d, width, K, off, cnt, PP, PT, PC, n_workers, gP, gT, gC, gN, rows,
                    row_st, row_lo, row_cap, status, rep)


@njit(cache=True)
def _cut(kind, st, t, p, nparts, off, cnt, PP, status, cap):
    """The least peak (bytes) of memory range p of `nparts` of sub-problem (kind, st, t): where
    the points of its predecessor (kind, st, t-1) split into equal counts (NOTE [ split order and
    parts ] in planner/_optimal_kernel.py); cap + 1 (nothing above range p-1) without one."""
    if t - 1 < st or (status[kind, st, t - 1] != SOLVE and status[kind, st, t - 1] != ALIAS):
        return cap + 1
    n = cnt[kind, st, t - 1]
    if n < 2 * nparts:
        return cap + 1
    return PP[off[kind, st, t - 1] + (p * n) // nparts]


@njit(cache=True)
def _parts_merged(gP, gT, gC, gN, r0, nparts, lo):
    """The envelope of staging rows r0..r0+nparts-1 (one sub-problem's memory ranges, NOTE [ split
    order and parts ] in planner/_optimal_kernel.py) from its point in force at `lo` bytes:
    (peaks, times, choices, length)."""
    n = 0
    for p in range(nparts):
        n += gN[r0 + p]
    Ep = np.empty(n + 1, np.int64)
    Et = np.empty(n + 1, np.float64)
    Ec = np.empty(n + 1, np.int64)
    Fp = np.empty(n + 1, np.int64)
    Ft = np.empty(n + 1, np.float64)
    Fc = np.empty(n + 1, np.int64)
    ne = gN[r0]
    Ep[:ne] = gP[r0, :ne]
    Et[:ne] = gT[r0, :ne]
    Ec[:ne] = gC[r0, :ne]
    for p in range(1, nparts):
        ns = gN[r0 + p]
        if ns == 0:
            continue
        if ne == 0:
            Ep[:ns] = gP[r0 + p, :ns]
            Et[:ns] = gT[r0 + p, :ns]
            Ec[:ns] = gC[r0 + p, :ns]
            ne = ns
            continue
        ne = _merge_env(Ep, Et, Ec, ne, gP[r0 + p], gT[r0 + p], gC[r0 + p], ns, Fp, Ft, Fc)
        Ep, Fp = Fp, Ep
        Et, Ft = Ft, Et
        Ec, Fc = Fc, Ec
    k = max(0, _last_le(Ep, 0, ne, lo))  # the point in force at lo, as `_subchain` keeps
    return Ep[k:ne], Et[k:ne], Ec[k:ne], ne - k


@njit(cache=True)
def _fold_running(Hp, Ht, nh, PP, PT, o, n, add):
    """The running envelope H (peaks, times; length nh) with the staircase (pool points o..o+n,
    times plus `add` seconds) folded in (NOTE [ folded lower run ]): (peaks, times, length)."""
    Sp = PP[o:o + n].copy()
    St = PT[o:o + n] + add
    Sc = np.zeros(n, np.int64)
    Op = np.empty(nh + n + 1, np.int64)
    Ot = np.empty(nh + n + 1, np.float64)
    Oc = np.empty(nh + n + 1, np.int64)
    Hc = np.zeros(nh + 1, np.int64)
    k = _merge_env(Hp, Ht, Hc, nh, Sp, St, Sc, n, Op, Ot, Oc)
    return Op, Ot, k


@njit(cache=True)
def _fold_into(Rp, Rt, Rc, ne, Hp, Ht, nh, shift, sub, floor, cap):
    """The envelope (Rp, Rt, Rc; length ne) with G(m) = H(m - shift) - sub from `floor` up to
    `cap` bytes (NOTE [ folded lower run ]; choice _OPT_CHOICE): (peaks, times, choices, length)."""
    Sp = np.empty(nh + 1, np.int64)
    St = np.empty(nh + 1, np.float64)
    Sc = np.empty(nh + 1, np.int64)
    ns = 0
    for q in range(nh):
        pk = max(floor, Hp[q] + shift)
        if pk > cap:
            break
        ns = _push(Sp, St, Sc, ns, pk, (Ht[q] - sub) * (1 - 1e-12), _OPT_CHOICE)
    if ns == 0:
        return Rp, Rt, Rc, ne
    Op = np.empty(ne + ns + 1, np.int64)
    Ot = np.empty(ne + ns + 1, np.float64)
    Oc = np.empty(ne + ns + 1, np.int64)
    if ne == 0:
        Op[:ns] = Sp[:ns]
        Ot[:ns] = St[:ns]
        Oc[:ns] = Sc[:ns]
        return Op[:ns], Ot[:ns], Oc[:ns], ns
    k = _merge_env(Rp, Rt, Rc, ne, Sp, St, Sc, ns, Op, Ot, Oc)
    return Op[:k], Ot[:k], Oc[:k], k


@njit(cache=True)
def _solve_long(K, cap, windowed, n_workers, width, min_work, status, rep, fl, fbsum, fold, band, cum,
                PP, PT, PC):
    """The kernel's `_solve` over the sub-problems `status` marks: SOLVE ones solved (exactly),
    ALIAS ones pointed at their class's first member `rep`, OPTIMISTIC ones given the one point
    (fl, fbsum) (NOTE [ banded DP and its certificate ]), SKIP ones left empty. A length with
    fewer than 4 x n_workers sub-problems to solve builds each one in n_workers memory ranges, one
    a worker (NOTE [ split order and parts ] in planner/_optimal_kernel.py). Returns the pool
    (off, cnt, peaks, times, choices) like `_solve`, in the pool PP, PT, PC (`_pool`; NOTE [ the
    pool's memory ] in planner/_optimal_kernel.py). `fold` (band: the band's width, cum: C): each
    suffix's long optimistic splits as one staircase (NOTE [ folded lower run ])."""
    x, useful = K[0], K[9]
    L = x.shape[0] - 1
    lo = _windows_long(x, K[4], useful, cap, windowed, status, rep)
    off = np.zeros((2, L + 2, L + 1), np.int64)
    cnt = np.zeros((2, L + 2, L + 1), np.int64)
    used = 0
    nrows = max(L, 4 * n_workers * n_workers)
    gP, gT, gC = _staging(nrows, width)
    gN = np.zeros(nrows, np.int64)
    row_st = np.zeros(nrows, np.int64)
    row_lo = np.zeros(nrows, np.int64)
    row_cap = np.zeros(nrows, np.int64)
    Hp = np.empty(1, np.int64)  # the running envelope H_hk (NOTE [ folded lower run ])
    Ht = np.empty(1, np.float64)
    nh = 0
    hk = L + 1
    for d in range(L):
        n = L - d
        for phase in range(2):
            kind = 1 - phase  # Q(s, s+d-1) first: P(s, s+d)'s late split at s' = s+d needs it
            if kind == 1 and d == 0:
                continue
            late = kind == 1
            m = 0  # the sub-problems to solve, one row each
            for idx in range(n):
                st = idx + 1
                t = st + d - kind
                if t >= st and status[kind, st, t] == SOLVE:
                    row_st[m] = st
                    m += 1
            work = 0  # the length's walk work, estimated (NOTE [ a launch's cost ])
            for r in range(m):
                work += _walk_work(kind, d, row_st[r], cnt)
            threads = n_workers if work >= min_work else 1
            nparts = threads if 0 < m < 4 * threads and d > 0 else 1
            for r in range(m - 1, -1, -1):  # row r * nparts + p: memory range p of the r-th
                st = row_st[r]
                t = st + d - kind
                a = lo[kind, st, t]
                for p in range(nparts):
                    b = cap + 1 if p == nparts - 1 else _cut(kind, st, t, p + 1, nparts, off, cnt,
                                                             PP, status, cap)
                    b = min(max(a, b), cap + 1)
                    row_st[r * nparts + p] = st
                    row_lo[r * nparts + p] = a
                    row_cap[r * nparts + p] = b - 1  # (empty when b = a)
                    a = b
            rows = m * nparts
            if threads > 1:
                _solve_set(late, d, width, K, off, cnt, PP, PT, PC, threads, gP, gT, gC, gN, rows,
                           row_st, row_lo, row_cap, status, rep)
            elif rows > 0:
                _solve_rows(0, late, d, width, K, off, cnt, PP, PT, PC, 1, gP, gT, gC, gN, rows,
                            row_st, row_lo, row_cap, status, rep)
            width, gP, gT, gC = _restage(late, d, rows, width, K, off, cnt, PP, PT, PC, gP, gT,
                                         gC, gN, row_st, row_lo, row_cap)
            biggest = 0
            for r in range(m):
                st = row_st[r * nparts]
                t = st + d - kind
                if nparts == 1:
                    ne = gN[r]
                    Rp, Rt, Rc = gP[r, :ne], gT[r, :ne], gC[r, :ne]
                else:
                    Rp, Rt, Rc, ne = _parts_merged(gP, gT, gC, gN, r * nparts, nparts,
                                                   lo[kind, st, t])
                if fold and kind == 0 and t == L and st + band + 1 <= L:
                    while hk > st + band + 1:  # H down to the suffix st + band + 1
                        hk -= 1
                        if cnt[0, hk, L] > 0:
                            Hp, Ht, nh = _fold_running(Hp, Ht, nh, PP, PT, off[0, hk, L],
                                                       cnt[0, hk, L], cum[hk])
                    xs = x[st - 1]
                    fwd = 0
                    for k in range(st, st + band + 1):  # the forward's peak to s' = st+band+1
                        fwd = max(fwd, xs + (x[k - 1] if k > st else 0) + x[k] + K[5][k])
                    Rp, Rt, Rc, ne = _fold_into(Rp, Rt, Rc, ne, Hp, Ht, nh, xs, cum[st],
                                                max(fl[st, st + band], fwd), cap)
                PP, PT, PC = _grow3(PP, PT, PC, used + ne + 2)  # + 2: sentinel, read-ahead
                PP[used:used + ne] = Rp
                PT[used:used + ne] = Rt
                PC[used:used + ne] = Rc
                PP[used + ne] = _BIG
                off[kind, st, t] = used
                cnt[kind, st, t] = ne
                used += ne + 1
                biggest = max(biggest, ne)
            for idx in range(n):
                st = idx + 1
                t = st + d - kind
                if t < st:
                    continue
                code = status[kind, st, t]
                if code == ALIAS:  # its class's first member is earlier in this length
                    r = rep[kind, st, t]
                    off[kind, st, t] = off[kind, r, t - (st - r)]
                    cnt[kind, st, t] = cnt[kind, r, t - (st - r)]
                elif code == OPTIMISTIC and fl[st, t] <= cap:
                    PP, PT, PC = _grow3(PP, PT, PC, used + 3)
                    PP[used] = fl[st, t]
                    PT[used] = fbsum[st, t]
                    PC[used] = _OPT_CHOICE
                    PP[used + 1] = _BIG
                    off[kind, st, t] = used
                    cnt[kind, st, t] = 1
                    used += 2
            if 2 * biggest > width:
                width = 2 * biggest
                gP, gT, gC = _staging(nrows, width)
    return off, cnt, PP[:used], PT[:used], PC[:used]


@dataclass
class LongFrontiers:
    """A `_solve_long` result: the frontiers of the sub-problems it solved (aliases answered by
    their class's first member). `top()` and `choice()` as in `_optimal_dp.Frontiers`."""

    costs: Costs
    cap: int | None
    off: np.ndarray
    cnt: np.ndarray
    peaks: np.ndarray
    times: np.ndarray
    choices: np.ndarray
    rep: np.ndarray | None  # content classes (None: no aliases)
    time_cap_s: float | None = None  # the time cap the frontiers were cut to (NOTE [ the time cap ])

    def top(self) -> tuple[list[int], list[float]]:
        """The whole chain's frontier: (peaks in bytes, times in seconds)."""
        o, n = self.off[0, 1, self.costs.L], self.cnt[0, 1, self.costs.L]
        return self.peaks[o:o + n].tolist(), self.times[o:o + n].tolist()

    def choice(self, st: int, t: int, m: int, *, late: bool = False) -> int | None:
        """The choice of sub-problem st..t's fastest point within m bytes (None: nothing fits),
        shifted from its class's first member to st; ValueError on an optimistic point."""
        k = int(late)
        o = int(self.off[k, st, t])
        # bisect on the pool itself: a schedule asks ~L times, and a slice and np.searchsorted
        # cost several times a bisection's ~10 element reads
        j = bisect_right(self.peaks, m, o, o + int(self.cnt[k, st, t])) - 1
        if j < o:
            return None
        ch = int(self.choices[j])
        if ch == _OPT_CHOICE:
            raise ValueError(f"sub-problem {st}..{t} has only an optimistic point")
        shift = st - int(self.rep[k, st, t]) if self.rep is not None else 0
        if ch == RECORD or shift == 0:
            return ch
        return ch + shift if ch > 0 else ch - shift


def _status(c: Costs, rep: np.ndarray | None, width: int | None, optimistic: bool,
            fold: bool = False) -> np.ndarray:
    """status[kind, s, t] (SKIP, SOLVE, ALIAS, OPTIMISTIC) for a band of `width` stages (None:
    every sub-problem) with content classes `rep` (None: none)."""
    L = c.L
    status = np.zeros((2, L + 2, L + 1), np.int8)
    s_idx = np.arange(L + 2)[:, None]
    t_idx = np.arange(L + 1)[None, :]
    valid = (s_idx >= 1) & (t_idx >= s_idx)
    useful = np.zeros(L + 1, bool)
    from memplan.planner._optimal_dp import late_useful

    useful[:] = late_useful(c)
    length = t_idx - s_idx + 1
    for kind in range(2):
        ok = valid & (t_idx < L) & useful[None, :] if kind else valid
        if width is None:
            inside = ok
        else:
            inside = ok & ((length <= width) | (t_idx == L))
        status[kind][inside] = SOLVE
        if width is not None:
            status[kind][ok & ~inside] = OPTIMISTIC if optimistic and not fold else SKIP
        if rep is not None:
            alias = inside & (rep[kind] != s_idx)
            status[kind][alias] = ALIAS
    return status


def solve_long(c: Costs, *, cap: int | None, width: int | None = None, optimistic: bool = False,
               memo: bool = False, classes: np.ndarray | None = None, windowed: bool = True,
               fold: bool = False, _workers: int | None = None, _width: int = 256,
               time_cap_s: float | None = None, _parallel_work: int = _PARALLEL_WORK
               ) -> LongFrontiers:
    """Frontiers of the sub-problems of a band of `width` stages (None: all, exact), memoised by
    content when `memo` (NOTE [ memoised by content ]; `classes`: `content_classes(c)` where the
    caller has them); `optimistic`: the band's lower run (NOTE [ banded DP and its certificate ]),
    else its upper run; `fold` (lower run only): each suffix's long optimistic splits as one
    staircase (NOTE [ folded lower run ]). `windowed` (with a cap) as in `solve_compiled`.
    `time_cap_s` (with a cap): an upper bound (seconds) on the optimum within it, which lets
    every sub-problem drop the points no such schedule can use (NOTE [ the time cap ] in
    planner/_optimal_kernel.py); the top's point at the cap is still the exact optimum, and where
    the bound was below it the DP runs again without one.
    `_workers` (default: numba's threads), `_width` (the staging rows' first width, points) and
    `_parallel_work` (NOTE [ a launch's cost ] in planner/_optimal_kernel.py) are for tests.
    Returns `LongFrontiers` (bytes, seconds)."""
    L = c.L
    rep = (classes if classes is not None else content_classes(c)) if memo else None
    if width is not None and width >= L:
        width = None  # the band is the whole chain: exact
    fold = bool(fold and optimistic and width is not None)
    status = _status(c, rep, width, optimistic, fold)
    capped = time_cap_s is not None and cap is not None
    K = _arrays(c, time_cap_s if capped else None)
    x = K[0]
    if optimistic and width is not None:
        fl = _floors(x, K[4], K[8])
        cs = np.cumsum(np.asarray(c.f) + np.asarray(c.b))  # cs[k] = sum of f + b over 1..k
        fbsum = np.zeros((L + 2, L + 1))
        fbsum[1:L + 1] = cs[None, :] - cs[:L, None]  # fbsum[s, t] = sum over s..t
    else:
        fl = np.zeros((1, 1), np.int64)
        fbsum = np.zeros((1, 1))
    cum = np.zeros(L + 2)  # cum[k]: C(k), the sum of fn + f + b over stages 1..k-1
    cum[1:] = np.cumsum(np.concatenate([[0.0], (np.asarray(c.f_nograd) + np.asarray(c.f)
                                                 + np.asarray(c.b))[1:L + 1]]))
    cap_i = _NO_CAP if cap is None else np.int64(max(cap, -1))
    rep_arr = rep if rep is not None else np.zeros((2, L + 2, L + 1), np.int64)
    with _LAUNCH:
        off, cnt, P, T, C = _solve_long(K, cap_i, windowed and cap is not None,
                                        _workers or max(1, get_num_threads()), _width,
                                        _parallel_work, status,
                                        rep_arr, fl, fbsum, fold, width or L, cum,
                                        *_pool(int(np.count_nonzero(status == SOLVE))
                                               + int(np.count_nonzero(status == OPTIMISTIC))))
    if capped and cnt[0, 1, L] == 0:  # NOTE [ the time cap ] rule 4: the bound was too low
        log.info("long chains: no schedule within %d bytes is as fast as %.6g s; solving again "
                 "without a time cap", cap, time_cap_s)
        return solve_long(c, cap=cap, width=width, optimistic=optimistic, memo=memo,
                          classes=rep, windowed=windowed, fold=fold, _workers=_workers,
                          _width=_width, _parallel_work=_parallel_work)
    return LongFrontiers(c, cap, off, cnt, P, T, C, rep, time_cap_s if capped else None)


def schedule_ops_long(fr: LongFrontiers, budget: int) -> list[tuple]:
    """Compute ops (no drops) of the fastest schedule within `budget` bytes of an upper (or exact)
    run; ValueError when none fits."""
    c = fr.costs
    return build_ops(c.L, c.x, c.s, budget, fr.choice, unit="bytes")
