"""The slotted persistent DP behind `memplan.planner.optimal`'s "slotted" mode, with a certified bound.

NOTE [ slotted mode and its bound ]
The exact frontier DP (planner/_optimal_dp.py) is ~L^3 x (frontier size) in Python: seconds at 60
stages. Rotor's way (Beaumont et al. 2019) is to count memory in S slots of u = budget / S bytes
and tabulate C(s, t, m), the least time of sub-chain s..t within m slots, for every m = 0..S, with
numpy over the memory axis and over the split point. The recurrence and its ops are exactly those
of the exact DP (record, split, late split; NOTE [ the recurrence ] there); only sizes change.

Every peak of the recurrence is a max of sums of sizes (x, s, tf, tb), each with a non-negative
coefficient. Rounding every size UP to slots (ceil(v S / B)) makes each such sum at least its
bytes / u, so a schedule whose rounded peak is at most S fits B bytes: the UP run's schedule is
feasible (and we replay it with planner.simulate anyway: the replay is the prediction). Rounding
every size DOWN (floor(v S / B)) makes each sum at most bytes / u, and an integer, so every
schedule of the recurrence that fits B bytes fits S down-rounded slots: the DOWN run is a
relaxation and its time is a lower bound on the exact DP's optimum at B. The plan reports
`optimality_gap = (time - lower) / lower`; more slots shrink it (the refinement loop doubles S
until the gap is within a tolerance or a time cap is spent).

The bound is on the recurrence's optimum (the persistent schedules the exact DP searches), which is
what "exact" means everywhere in this planner; docs/planner.md says what the recurrence misses.
"""

from __future__ import annotations

import logging
import time as _time
from dataclasses import dataclass

import numpy as np
from memplan.planner._optimal_dp import RECORD, Costs, build_ops, late_useful_of

__all__ = ["SlotResult", "Refined", "slot_sizes", "solve_slotted", "slotted_ops", "refine", "gap_of"]

log = logging.getLogger(__name__)

INF = np.inf
NONE = np.iinfo(np.int16).min  # choice code: nothing fits (late splits are negative)


@dataclass(frozen=True)
class SlotCosts:
    """Sizes of `Costs` in slots (ints); times in seconds, unchanged."""

    X: list[int]
    S: list[int]
    TFf: list[int]
    TFr: list[int]
    TFl: list[int]
    TB: list[int]
    f: list[float]
    b: list[float]
    fn: list[float]  # an unrecorded forward's seconds (NOTE [ no-grad forward time ])


def slot_sizes(c: Costs, budget_bytes: int, slots: int, *, up: bool) -> SlotCosts:
    """`c`'s sizes in slots of budget_bytes / slots bytes, rounded up (`up`) or down."""
    if budget_bytes <= 0:
        raise ValueError("slot_sizes: budget_bytes must be positive")

    def r(vals):
        if up:
            return [-((-v * slots) // budget_bytes) for v in vals]
        return [(v * slots) // budget_bytes for v in vals]

    return SlotCosts(X=r(c.x), S=r(c.s), TFf=r(c.tf_f), TFr=r(c.tf_r), TFl=r(c.tf_l), TB=r(c.tb),
                     f=c.f, b=c.b, fn=c.f_nograd)


@dataclass
class SlotResult:
    """A solved table: `top[m]` the whole chain's least time within m slots (s; inf: none fits);
    `choice[kind, s, t, m]` the choice codes, kind 1 the late left parts (None for a bound-only
    run)."""

    sc: SlotCosts
    slots: int
    top: np.ndarray  # [slots + 1]
    choice: np.ndarray | None  # [2, L + 2, L + 1, slots + 1] int16


def solve_slotted(sc: SlotCosts, slots: int, *, choices: bool = True) -> SlotResult:
    """Tabulate C(s, t, m) and the late left parts' Q(s, t, m) for m = 0..slots (NOTE [ slotted
    mode and its bound ]). Returns a `SlotResult`; with `choices=False` no choice table is kept
    (the lower-bound run)."""
    X, Ss, TFf, TFr, TFl, TB, f, b = sc.X, sc.S, sc.TFf, sc.TFr, sc.TFl, sc.TB, sc.f, sc.b
    fn = sc.fn  # `F` ops (NOTE [ no-grad forward time ] in planner/simulate.py)
    L = len(X) - 1
    W = slots + 1
    # C[kind, s, t, m]: kind 0 the sub-chain s..t, kind 1 the late left part Q(s, t); s <= t used
    C = np.full((2, L + 2, L + 1, W), INF)
    CH = np.full((2, L + 2, L + 1, W), NONE, dtype=np.int16) if choices else None
    cols = np.arange(W)
    Fc = np.concatenate(([0.0], np.cumsum(fn[1:])))  # Fc[k] = f'_1 + ... + f'_k (no-grad)
    # g[k]: bytes of `F k` in a split's forward run beyond xs + hold (a_{k-1} freed after F k,
    # except the sub-chain's own input a_{s-1}, counted in xs)
    g_in = [0] + [X[k - 1] + X[k] + TFf[k] for k in range(1, L + 1)]
    g_first = [0] + [X[k] + TFf[k] for k in range(1, L + 1)]
    # G[s][j]: max over k = s..s+j of g (the split's forward run up to F k); HI[kind][s][t]: the
    # peak of recording every stage of s..t (from which on splits cannot be faster)
    G = [np.empty(0)] + [np.maximum.accumulate(np.array([g_first[st]] + g_in[st + 1:L], dtype=np.int64))
                         for st in range(1, L + 1)]
    HI = [[[0] * (L + 1) for _ in range(L + 2)] for _ in range(2)]
    # late left parts where they can help in slots (NOTE [ late left parts ]: the pruned ones are
    # dominated within this table too, so the DOWN run's optimum stays a relaxation's)
    useful = late_useful_of(X, Ss, TFr, TFl, TB)
    for d in range(L):
        for kind in (1, 0):  # Q(s, s+d-1) first: P(s, s+d)'s late split at s' = s+d needs it
            for st in range(1, L - d + 1):
                t = st + d - kind
                if t < st or (kind and not useful[t]):
                    continue
                _slotted_row(kind, st, t, L, X, Ss, TFf, TFr, TFl, TB, f, b, Fc, G, HI, C, CH,
                             cols, W, useful)
    return SlotResult(sc=sc, slots=slots, top=C[0, 1, L].copy(), choice=CH)


def _slotted_row(kind, st, t, L, X, Ss, TFf, TFr, TFl, TB, f, b, Fc, G, HI, C, CH, cols, W,
                 useful):
    """C[kind, st, t] (and its choices) from the rows of shorter sub-problems."""
    hold = X[t] + Ss[t + 1] + X[t + 1] if kind else (X[t] if t < L else 0)
    xs = X[st - 1]
    fb = f[st] + b[st]
    r_peak = xs + hold + X[st] + Ss[st] + TFr[st]
    b_peak = 2 * xs + Ss[st] + X[st] + TB[st]
    row = C[kind, st, t]
    chrow = CH[kind, st, t] if CH is not None else None
    if st == t:
        if kind:  # `R t` on the live a_t, `B t+1` above the record s_t, then `B t`
            pk = max(xs + hold + Ss[st] + TFl[st], xs + Ss[st] + hold + X[st] + TB[st + 1], b_peak)
        else:
            pk = max(r_peak, b_peak, xs + Ss[st] + 2 * X[st] if t == L else r_peak)
        HI[kind][st][t] = pk
        if pk < W:
            row[max(pk, 0):] = fb
            if chrow is not None:
                chrow[max(pk, 0):] = RECORD
        return
    HI[kind][st][t] = max(r_peak, b_peak, HI[kind][st + 1][t] + xs + Ss[st])
    # record s: fb + child(m - xs - s_s) for m >= max(r_peak, b_peak)
    lo = max(r_peak, b_peak, 0)
    sh = xs + Ss[st]
    if lo < W:
        cand = np.full(W, INF)
        a = max(lo, sh)
        if a < W:
            cand[a:] = C[kind, st + 1, t, a - sh:W - sh] + fb
        _take(row, chrow, cand, RECORD)
    # splits at s' = st + j (j = 1..d): F st..s'-1, then s'..t above a_{st-1}, then st..s'-1
    # plain (choice s') or late (choice -s')
    if xs >= W:
        return
    d = t - st
    fwd = (xs + hold) + G[st][:d]  # [d], nondecreasing
    # columns worth computing: m >= the first forward's peak, and m below the all-record peak
    # HI (there recording everything is already the least time, f + b of each stage)
    m0 = max(xs, int(fwd[0]))
    m1 = min(W, HI[kind][st][t])
    if m0 >= m1:
        return
    n = m1 - m0
    right = C[kind, st + 1:t + 1, t, m0 - xs:m1 - xs] + (Fc[st:t] - Fc[st - 1])[:, None]  # [d, n]
    for left, sign in ((0, 1), (1, -1)) if any(useful[st:t]) else ((0, 1),):
        tot = right + C[left, st, st:t, m0:m1]  # [d, n]; unsolved Q rows are inf
        if fwd[-1] > m0:
            tot[cols[None, m0:m1] < fwd[:, None]] = INF
        if chrow is not None:
            j = tot.argmin(axis=0)
            best = tot[j, cols[:n]]
            sub = row[m0:m1]
            better = best < sub
            sub[better] = best[better]
            chrow[m0:m1][better] = (sign * (j + (st + 1)))[better]
        else:
            np.minimum(row[m0:m1], tot.min(axis=0), out=row[m0:m1])


def _take(row, chrow, cand, code) -> None:
    if chrow is None:
        np.minimum(row, cand, out=row)
        return
    better = cand < row
    row[better] = cand[better]
    chrow[better] = code


def slotted_ops(res: SlotResult) -> list[tuple]:
    """Compute ops (F, R, loss, B; no drops) of the UP run's fastest schedule within all slots,
    as `memplan.planner._optimal_dp.schedule_ops` builds them. Raises ValueError when nothing fits."""
    sc, CH = res.sc, res.choice
    assert CH is not None, "slotted_ops needs a run with choices"

    def choose(st: int, t: int, m: int, *, late: bool = False) -> int | None:
        ch = int(CH[int(late), st, t, m])
        return None if ch == NONE else ch

    return build_ops(len(sc.X) - 1, sc.X, sc.S, res.slots, choose, unit="slots")


@dataclass
class Refined:
    """Outcome of `refine`: the UP run's ops (None: the UP run found nothing within the budget),
    the lower bound (s; inf: certified infeasible for the recurrence), the slots used, seconds."""

    ops: list[tuple] | None
    upper_s: float  # the UP run's DP time (inf if none); the replay is the prediction
    lower_s: float
    slots: int
    solve_s: float


def refine(c: Costs, budget_bytes: int, *, slots: int, tolerance: float, time_cap_s: float) -> Refined:
    """Solve UP and DOWN at `slots`; while the relative gap exceeds `tolerance`, double the slots
    (at most 16x) if the next pair of runs is expected (linear in slots) to end within
    `time_cap_s` of the start.
    Returns the best (smallest-gap) outcome."""
    t0 = _time.perf_counter()
    S = slots
    ops, upper, lower, used = None, INF, 0.0, S
    while True:
        t1 = _time.perf_counter()
        down = solve_slotted(slot_sizes(c, budget_bytes, S, up=False), S, choices=False)
        lo = float(down.top[S])
        if lo == INF:  # the relaxation fits nothing: nothing fits (certified)
            return Refined(None, INF, INF, S, _time.perf_counter() - t0)
        lower = max(lower, lo)  # every run's bound is valid: keep the highest
        up = solve_slotted(slot_sizes(c, budget_bytes, S, up=True), S, choices=True)
        hi = float(up.top[S])
        if hi < upper:  # and the fastest schedule
            ops, upper, used = slotted_ops(up), hi, S
        step = _time.perf_counter() - t1
        spent = _time.perf_counter() - t0
        gap = gap_of(upper, lower)
        log.info("slotted: %d slots, gap %.4g, %.2f s", S, gap, step)
        # stop at the tolerance, at the time cap, at 16x the slots asked for, or once a slot is
        # one byte (nothing is rounded any more)
        if (gap <= tolerance or spent + 2.2 * step > time_cap_s or S >= 16 * slots
                or S >= budget_bytes):
            return Refined(ops, upper, lower, used, spent)
        S = min(2 * S, budget_bytes)


def gap_of(upper_s: float, lower_s: float) -> float:
    """(upper - lower) / lower, at least 0 (float noise); inf when nothing is known."""
    if upper_s == INF:
        return INF
    if lower_s <= 0:
        return 0.0 if upper_s <= 0 else INF
    return max(0.0, (upper_s - lower_s) / lower_s)
