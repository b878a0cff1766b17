"""Oracles for the optimal planner, written for clarity, not speed.

- `memo_time`: the plain memoised recursion of Beaumont et al. 2019 over (s, t, memory), memory in
  whole bytes (the "rotor" formulation without slots). Same recurrence as planner/_optimal_dp.py,
  written independently as one function; the benchmark times it against the frontier DP.
- `exhaustive_frontier`: a shortest-path search over schedule states (live activations, live
  records, backward progress) that finds the Pareto set of (peak, time) over *all* valid schedules
  of the chain model, or over persistent ones only (`persistent=True`), with one schedule per point.

Both read a Profile; sizes are integers, so on chains with integer times every comparison is exact.
"""

from __future__ import annotations

import heapq
import sys
from functools import cache

from memplan.profiler.schema import Profile

__all__ = ["memo_time", "exhaustive_frontier", "is_persistent"]

INF = float("inf")


def _arrays(p: Profile):
    x = [p.input_bytes] + [la.output_bytes for la in p.layers]
    f = [0.0] + [la.forward_s for la in p.layers]
    b = [0.0] + [la.backward_s for la in p.layers]
    s = [0] + [la.saved_bytes for la in p.layers]
    tf = [0] + [la.forward_temp_bytes for la in p.layers]
    tb = [0] + [la.backward_temp_bytes for la in p.layers]
    return x, f, b, s, tf, tb


def _nograd(p: Profile, f, tf):
    """An `F` op's seconds and transient bytes: the no-grad forward's where the profile has them."""
    fn = [f[0]] + [la.forward_s if la.forward_nograd_s is None else la.forward_nograd_s
                   for la in p.layers]
    tfn = [tf[0]] + [la.forward_temp_bytes if la.forward_nograd_temp_bytes is None
                     else la.forward_nograd_temp_bytes for la in p.layers]
    return fn, tfn


def memo_time(p: Profile, budget_bytes: int, *, unit: int = 1) -> float:
    """Least time (s) of a persistent schedule whose peak is at most `budget_bytes`; inf if none.

    `unit`: sizes are divided by it (they must be multiples of it) so that the memo table is
    indexed by slots, as rotor does; the result is exact when every size is a multiple."""
    x, f, b, s, tf, tb = _arrays(p)
    fn, tfn = _nograd(p, f, tf)
    for name, arr in (("x", x), ("s", s), ("tf", tf), ("tfn", tfn), ("tb", tb)):
        if any(v % unit for v in arr):
            raise ValueError(f"{name}: sizes must be multiples of unit={unit}")
    x, s, tf, tfn, tb = ([v // unit for v in a] for a in (x, s, tf, tfn, tb))
    L = p.n_stages
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20 * L + 1000))

    @cache
    def C(st: int, t: int, m: int) -> float:
        if m < 0:
            return INF
        D = x[t] if t < L else 0
        xs = x[st - 1]
        best = INF
        r_peak = xs + D + x[st] + s[st] + tf[st]
        b_peak = 2 * xs + s[st] + x[st] + tb[st]
        if st == t:
            pk = max(r_peak, b_peak, xs + s[st] + 2 * x[st] if t == L else 0)
            if pk <= m:
                best = f[st] + b[st]
        elif max(r_peak, b_peak) <= m:
            best = f[st] + b[st] + C(st + 1, t, m - xs - s[st])
        fwd, fsum = 0, 0.0
        for sp in range(st + 1, t + 1):
            k = sp - 1
            fwd = max(fwd, xs + D + (x[k - 1] if k > st else 0) + x[k] + tfn[k])
            fsum += fn[k]
            if fwd > m:
                break
            right = C(sp, t, m - xs)
            if right == INF:
                continue
            left = C(st, sp - 1, m)
            if fsum + right + left < best:
                best = fsum + right + left
        return best

    try:
        return C(1, L, budget_bytes // unit)
    finally:
        C.cache_clear()
        sys.setrecursionlimit(old)


def exhaustive_frontier(p: Profile, *, persistent: bool = False):
    """Pareto set over all valid schedules: a list of (peak_bytes, time_s, ops), peaks descending
    and times ascending. With `persistent`, a checkpoint may not be dropped while a later backward
    still needs it, so it is never recomputed.

    NOTE [ persistent ]
    chain-model.md calls a schedule persistent when each checkpoint, once dropped, is never
    recomputed. A checkpoint is an activation kept across an op that neither makes nor reads it
    (a forward of another stage, the loss, a backward): a_j live while `F k` runs for k not in
    {j, j+1} is stored, just as one live at a backward is. Counting only activations live at the
    loss or a backward (this oracle's first rule) let schedules pass as persistent that store a
    cheap a_j across a forward, drop it, and compute it again before `B j+1`.

    NOTE [ completeness ]
    Dropping an activation earlier, right after the last op that touched it, never raises a peak
    and costs nothing, so drops are only tried right after an op that reads or creates the
    activation. Ops that cannot help (a forward of a live activation, work on stages whose
    backward has run) are skipped, and activations no later op can read are dropped at once.
    """
    x, f, b, s, tf, tb = _arrays(p)
    fn, tfn = _nograd(p, f, tf)
    L = p.n_stages
    BEFORE = L + 1  # phase before the loss; after it, the phase is the next backward's stage

    def live_bytes(act: int, rec: int, ph: int) -> int:
        tot = x[0]
        for i in range(1, L + 1):
            if act >> i & 1:
                tot += x[i]
            if rec >> i & 1:
                tot += s[i]
        if ph != BEFORE:
            tot += x[ph]  # the gradient d_ph
        return tot

    def cleanup(act: int, ck: int, ph: int) -> tuple[int, int, tuple]:
        if ph == BEFORE:
            return act, ck, ()
        # a_j for j >= ph is read by no remaining op: drop it now
        gone = tuple(("drop", j) for j in range(max(ph, 1), L + 1) if act >> j & 1)
        mask = (1 << ph) - 1 | 1
        return act & mask, ck & mask, gone

    start = (1, 0, BEFORE, 0)  # act (bit 0 = a_0), rec, phase, ck
    best_peak: dict[tuple, int] = {}
    labels: list[tuple] = []  # (state, parent label, ops)
    heap: list = [(0.0, x[0], 0, start, -1, ())]
    counter = 1
    result = []
    while heap:
        time, peak, _, state, parent, ops = heapq.heappop(heap)
        if peak >= best_peak.get(state, INF):
            continue
        best_peak[state] = peak
        labels.append((state, parent, ops))
        me = len(labels) - 1
        act, rec, ph, ck = state
        if ph == 0:
            result.append((peak, time, me))
            continue
        live = live_bytes(act, rec, ph)
        succ = []  # (op, during, dt, act, rec, ph, ck, droppable)
        top = L if ph == BEFORE else ph
        for i in range(1, top + 1):
            if not act >> (i - 1) & 1:
                continue
            # what is live across a forward, other than its input and output, is stored
            fck = ck | (act & ~(1 << (i - 1) | 1 << i) & ~1) if persistent else 0
            if not act >> i & 1 and (ph == BEFORE or i <= ph - 1):
                succ.append((("F", i), live + x[i] + tfn[i], fn[i], act | 1 << i, rec, ph, fck,
                             (i - 1,)))
            if not rec >> i & 1:
                new = 0 if act >> i & 1 else x[i]
                succ.append((("R", i), live + new + s[i] + tf[i], f[i], act | 1 << i,
                             rec | 1 << i, ph, fck, (i,)))
        if ph == BEFORE and act >> L & 1:
            nck = act & ~1 if persistent else 0
            succ.append((("loss",), live + x[L], 0.0, act, rec, L, nck, ()))
        if ph != BEFORE and rec >> ph & 1 and act >> (ph - 1) & 1:
            i = ph
            nck = (act & ~(1 << i)) & ~1 if persistent else 0
            succ.append((("B", i), live + x[i - 1] + tb[i], b[i], act, rec & ~(1 << i), i - 1,
                         nck, ()))
        for op, during, dt, a2, r2, ph2, ck2, touch in succ:
            a2, ck2, gone = cleanup(a2, ck2, ph2)
            options = [(a2, ck2, gone)]
            for j in touch:
                if j <= 0 or not a2 >> j & 1:
                    continue
                if j < L and r2 >> (j + 1) & 1:
                    continue  # pinned by record j+1
                if persistent and ck2 >> j & 1:
                    continue  # a checkpoint still needed
                options += [(a & ~(1 << j), c & ~(1 << j), d + (("drop", j),))
                            for a, c, d in options]
            for a3, c3, drops in options:
                st2 = (a3, r2, ph2, c3)
                pk = max(peak, during)
                if pk < best_peak.get(st2, INF):
                    heapq.heappush(heap, (time + dt, pk, counter, st2, me, (op,) + drops))
                    counter += 1
    frontier = []
    for peak, time, me in result:
        seq = []
        k = me
        while k >= 0:
            _, parent, ops = labels[k]
            seq.extend(reversed(ops))
            k = parent
        seq.reverse()
        frontier.append((peak, time, seq))
    return frontier


def is_persistent(ops) -> bool:
    """False when a checkpoint is dropped while a later backward still needs it, which forces its
    recomputation. A checkpoint is an activation kept across an op that neither makes nor reads
    it: across a forward of another stage, the loss or a backward (NOTE [ persistent ])."""
    live: set[int] = set()
    checkpoint: set[int] = set()
    next_b = float("inf")  # a_j is still needed while j < next_b (B j+1 has not run)
    for op in ops:
        if op[0] in ("F", "R"):
            i = op[1]
            checkpoint |= live - {i - 1, i}
            live.add(i)
        elif op[0] == "drop":
            j = op[1]
            if j in checkpoint and j < next_b:
                return False
            live.discard(j)
            checkpoint.discard(j)
        elif op[0] == "B":
            next_b = op[1] - 1
            checkpoint |= live
        elif op[0] == "loss":
            next_b = max(live) if live else 0
            checkpoint |= live
    return True
