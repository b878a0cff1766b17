"""The optimal DP with offload: each kept tensor is kept, recomputed or moved to host memory.

docs/chain-model.md section 10.9 has the rules (the window of a transfer, its wait, the host
bytes) and a worked example; this module is the recurrence of planner/_optimal_dp.py (NOTE
[ the recurrence ] there: records, splits and late splits over P(s, t) and the late left parts
Q(s, t)) with two more choices, written in plain Python for chains of up to
OFFLOAD_MAX_STAGES stages.

NOTE [ offload in the recurrence ]
A persistent schedule keeps two kinds of tensor idle across other work, and the recurrence names
both: in a record choice of P(s, t), the record s_s and its input a_{s-1} lie idle from `R s` to
`B s` while the child P(s+1, t) runs; in a split at s', a_{s-1} lies idle from `F s` until the
left part P(s, s'-1) starts, while the forwards and the right part P(s', t) run. The DP offers:

1. record-offload (s < t): move s_s, a_{s-1} (s > 1; the loop owns a_0), or both, to the host with
   the child's first op (its window) and fetch them back with the child's last op, `B s+1`; the
   child runs with H fewer device bytes (H: the moved bytes), except during those two windows.
2. split-offload (s > 1, plain splits): move a_{s-1} with the op after `F s` (`F s+1`, or the
   right part's first op when s' = s+1), fetch it with the right part's last op `B s'`; the
   forwards after the window and the right part (but its last op) run without x_{s-1}.

These are the "eager offload, lazy fetch" schedules: every offload rides on the forward right
after the tensor's last use and every fetch on the backward right before its next one (a later
offload or an earlier fetch only holds the bytes longer). The DP is exact over the persistent
schedules of that class that the recurrence builds (tests/planner/test_offload.py: equal to the
exhaustive search over the class on chains where late splits do not help). Each window is then one op whose bytes and seconds are closed forms:
a sub-problem's first op is `R s` (record choices) or `F s` (splits), and its last op is always
`B s`, at 2 x_{s-1} + s_s + x_s + tb_s bytes of its own. So each sub-problem keeps its frontier in
four parts, by first op (R or F) and by whether its last op's inputs come back with the op before
it (a record-offload at the end of its left spine). A late split runs its left part before the
right part's last op `B s'`, so the op before `B s'` is no longer `B s'+1`: its right part may not
end with such a fetch (only the parts without it are offered), and a late split does not offload.
No two transfers share a window (each window belongs to one choice), so a window op takes
max(t_op, bytes / bandwidth) seconds: the extra, max(0, bytes / bandwidth - t_op), is the wait.

With no bandwidth only the original choices are offered and the frontiers equal
planner/_optimal_dp.py's. Host bytes add up the tree (a parent holds its moved bytes on the host
while its child runs); with `host_memory_bytes` the frontiers are Pareto sets in (peak, host, time)
and points above the host budget are dropped; without it host bytes are reported, not searched.
"""

from __future__ import annotations

from bisect import bisect_right
from contextvars import ContextVar
from dataclasses import dataclass
from operator import itemgetter

from memplan.planner._optimal_dp import (
    Costs,
    _hold,
    _one_stage_peak,
    _record_floor,
    _rel_eps,
    late_useful,
    staircase,
)

__all__ = ["OFFLOAD_MAX_STAGES", "OffloadFrontiers", "solve_offload", "offload_ops", "PROGRESS"]

# set by a caller that shows progress (the CLI's bar): called as hook(done, total) after each
# sub-chain length; the DP takes seconds to minutes on long chains of distinct stages
PROGRESS: ContextVar = ContextVar("offload_progress", default=None)

# the pure-Python DP costs about L^3 x (frontier size) steps, several times the plain DP's per
# step: about 1 s at 40 stages on this project's 2-core machine (docs/planner.md "Offload")
OFFLOAD_MAX_STAGES = 64

# a point: (peak bytes, host bytes, seconds, how); `how` names the choice and its child points:
# ("one",), ("rec", a, r, child) (a, r: a_{s-1} / s_s moved), ("split", s', off, right, left),
# ("late", s', right, left)
_ONE = ("one",)
_KEY = itemgetter(0, 1, 2)
_VARIANTS = (("R", False), ("R", True), ("F", False), ("F", True))


@dataclass
class OffloadFrontiers:
    """Frontiers of every sub-problem, by variant (first op R/F, last op's inputs fetched just
    before it); `top()` is the whole chain's."""

    costs: Costs
    bandwidth: float | None
    host_cap: int | None
    P: dict
    Q: dict

    def top(self) -> list[tuple]:
        """The whole chain's Pareto points (peak bytes, host bytes, seconds, how), peaks
        ascending."""
        return _union(self.P[(1, self.costs.L)], _VARIANTS, self.host_cap)

    def best(self, budget: int | None) -> tuple | None:
        """The fastest point within `budget` device bytes (None: any), or None."""
        pts = [p for p in self.top() if budget is None or p[0] <= budget]
        if not pts:
            return None
        return min(pts, key=lambda p: (p[2], p[0], p[1]))


def _envelope(cand: list[tuple], cap: int | None, host_cap: int | None) -> list[tuple]:
    """Pareto points of `cand` within the caps: (peak, time) without a host cap, (peak, host, time)
    with one (NOTE [ offload in the recurrence ]); peaks ascending. Times within 1e-12 relative
    are ties (`_rel_eps`), as in planner/_optimal_dp.py."""
    cand.sort(key=_KEY)
    out: list[tuple] = []
    if host_cap is None:
        best = float("inf")
        for pt in cand:
            if cap is not None and pt[0] > cap:
                break
            tm = pt[2]
            if tm < best - abs(best if best != float("inf") else tm) * 1e-12:
                if out and out[-1][0] == pt[0]:
                    out[-1] = pt
                else:
                    out.append(pt)
                best = tm
        return out
    # 3D: a point is dominated when an earlier one (peak no larger) has host and time no larger;
    # `hosts`/`times` is the staircase of the least time within each host count seen so far
    hosts: list[int] = []
    times: list[float] = []
    for pt in cand:
        if cap is not None and pt[0] > cap:
            break
        h, tm = pt[1], pt[2]
        if h > host_cap:
            continue
        k = bisect_right(hosts, h) - 1
        if k >= 0 and times[k] <= tm + _rel_eps(tm):
            continue
        out.append(pt)
        # insert (h, tm); drop the entries at larger hosts that are no faster
        j = k + 1
        end = j
        while end < len(hosts) and times[end] >= tm:
            end += 1
        if k >= 0 and hosts[k] == h:
            hosts[k:end], times[k:end] = [h], [tm]
        else:
            hosts[j:end], times[j:end] = [h], [tm]
    return out


def _union(parts: dict, keys, host_cap: int | None) -> list[tuple]:
    cand = [pt for k in keys for pt in parts.get(k, ())]
    return _envelope(cand, None, host_cap)


def _combine(right, shift, hshift, left, floor, add, how, out, three_d) -> None:
    """Append the points m -> add + right(m - shift) + left(m), m >= floor (peaks: max of
    right's + shift, left's and floor; host: max of right's + hshift and left's), one per
    breakpoint; with `three_d` every pair (host bytes are then a coordinate of their own).
    `left` None: the right part alone. `how(r, l)` names the point."""
    if left is None:
        for r in right:
            out.append((max(floor, r[0] + shift), r[1] + hshift, add + r[2], how(r, None)))
        return
    if not right or not left:
        return
    if three_d:
        for r in right:
            for lp in left:
                out.append((max(floor, r[0] + shift, lp[0]), max(r[1] + hshift, lp[1]),
                            add + r[2] + lp[2], how(r, lp)))
        return
    for m, i, j in staircase([r[0] for r in right], shift, [lp[0] for lp in left], floor):
        r, lp = right[i], left[j]
        out.append((m, max(r[1] + hshift, lp[1]), add + r[2] + lp[2], how(r, lp)))


def solve_offload(c: Costs, *, bandwidth: float | None, cap: int | None = None,
                  host_cap: int | None = None) -> OffloadFrontiers:
    """Frontiers of every sub-problem with the offload choices (NOTE [ offload in the recurrence
    ]); `bandwidth` bytes/s (None or 0: no offload), `cap` the device budget (bytes above fixed
    memory; None keeps every point), `host_cap` the host budget (bytes; None: unlimited).
    Save policies are not planned here (the caller refuses them)."""
    if c.K > 1:
        raise ValueError("solve_offload plans whole stages only (no save policies)")
    L = c.L
    x, s, f, b, tff, tfr, tfl, tb = c.x, c.s, c.f, c.b, c.tf_f, c.tf_r, c.tf_l, c.tb
    fn = c.f_nograd
    bw = bandwidth if bandwidth else None
    three_d = host_cap is not None
    useful = late_useful(c)
    P: dict = {}
    Q: dict = {}
    cache: dict = {}

    def parts(late: bool, st: int, t: int, keys) -> list[tuple]:
        """A sub-problem's points over the variants `keys` (cached)."""
        key = (late, st, t, keys)
        got = cache.get(key)
        if got is None:
            got = cache[key] = _union((Q if late else P)[(st, t)], keys, host_cap)
        return got

    ALL = _VARIANTS
    FIRST = {"R": (("R", False), ("R", True)), "F": (("F", False), ("F", True))}
    FLAG = {False: (("R", False), ("F", False)), True: (("R", True), ("F", True))}

    def last_op(st: int) -> int:  # bytes of the sub-problem's own during its last op, `B st`
        return 2 * x[st - 1] + s[st] + x[st] + tb[st]

    def first_op(st: int, t: int, late: bool, kind: str) -> tuple[int, float]:
        """(bytes, seconds) of the sub-problem's own during its first op: `R st` or `F st`."""
        hold = _hold(c, t, late)
        if kind == "F":
            return x[st - 1] + hold + x[st] + tff[st], fn[st]
        if late and st == t:  # `R t` on the live a_t
            return x[st - 1] + hold + s[st] + tfl[st], f[st]
        return x[st - 1] + hold + x[st] + s[st] + tfr[st], f[st]

    def subchain(st: int, t: int, late: bool) -> dict:
        xs = x[st - 1]
        hold = _hold(c, t, late)
        fb = f[st] + b[st]
        cand: dict = {v: [] for v in ALL}
        if st == t:
            cand[("R", False)].append((_one_stage_peak(c, t, late), 0, fb, _ONE))
        else:
            floor = _record_floor(c, st, hold)
            held = xs + s[st]
            _combine(parts(late, st + 1, t, ALL), held, 0, None, floor, fb,
                     lambda r, _: ("rec", False, False, r), cand[("R", False)], three_d)
            if bw:
                masks = [(False, True)] + ([(True, False), (True, True)] if st > 1 else [])
                for kind in "RF":
                    child = parts(late, st + 1, t, FIRST[kind])
                    if not child:
                        continue
                    w_bytes, t1 = first_op(st + 1, t, late, kind)
                    fl = max(floor, held + max(w_bytes, last_op(st + 1)))
                    for a, r in masks:
                        moved = (xs if a else 0) + (s[st] if r else 0)
                        if moved == 0:
                            continue
                        tx = moved / bw
                        wait = max(0.0, tx - t1) + max(0.0, tx - b[st + 1])
                        _combine(child, held - moved, moved, None, fl, fb + wait,
                                 lambda rr, _, a=a, r=r: ("rec", a, r, rr),
                                 cand[("R", True)], three_d)
        fwd = fwd_off = 0
        fsum = 0.0
        for sp in range(st + 1, t + 1):
            k = sp - 1  # F k runs now; a_{k-1} freed after it unless k = st
            term = xs + hold + (x[k - 1] if k > st else 0) + x[k] + tff[k]
            fwd = max(fwd, term)
            fwd_off = max(fwd_off, term if k <= st + 1 else term - xs)
            fsum += fn[k]
            if not any((Q if late else P)[(sp, t)].values()):
                continue
            right = parts(late, sp, t, ALL)
            for flag in (False, True):
                left = parts(False, st, sp - 1, FLAG[flag])
                if left:
                    _combine(right, xs, 0, left, fwd, fsum,
                             lambda r, lp, sp=sp: ("split", sp, False, r, lp),
                             cand[("F", flag)], three_d)
                if useful[sp - 1]:
                    qleft = parts(True, st, sp - 1, FLAG[flag])
                    plain_right = parts(late, sp, t, FLAG[False])
                    if qleft and plain_right:
                        _combine(plain_right, xs, 0, qleft, fwd, fsum,
                                 lambda r, lp, sp=sp: ("late", sp, r, lp),
                                 cand[("F", flag)], three_d)
            if not bw or st == 1:
                continue
            tx = xs / bw
            fetch_floor = xs + last_op(sp)
            fetch_wait = max(0.0, tx - b[sp])
            if sp > st + 1:  # the window is `F st+1`
                windows = [(right, fwd_off, max(0.0, tx - fn[st + 1]))]
            else:  # the window is the right part's first op
                windows = []
                for kind in "RF":
                    w_bytes, t1 = first_op(sp, t, late, kind)
                    windows.append((parts(late, sp, t, FIRST[kind]), max(fwd_off, xs + w_bytes),
                                    max(0.0, tx - t1)))
            for rpts, fl, wait in windows:
                for flag in (False, True):
                    left = parts(False, st, sp - 1, FLAG[flag])
                    _combine(rpts, 0, xs, left, max(fl, fetch_floor), fsum + wait + fetch_wait,
                             lambda r, lp, sp=sp: ("split", sp, True, r, lp),
                             cand[("F", flag)], three_d)
        return {v: _envelope(pts, cap, host_cap) for v, pts in cand.items()}

    hook = PROGRESS.get()
    work = L * (L + 1) * (L + 2) // 6  # the splits below each length: about t^2 / 2 each
    for t in range(1, L + 1):
        if useful[t - 1]:
            for st in range(t - 1, 0, -1):
                Q[(st, t - 1)] = subchain(st, t - 1, True)
        for st in range(t, 0, -1):
            P[(st, t)] = subchain(st, t, False)
        if hook is not None:
            hook(t * (t + 1) * (t + 2) // 6, work)
    return OffloadFrontiers(costs=c, bandwidth=bw, host_cap=host_cap, P=P, Q=Q)


def offload_ops(fr: OffloadFrontiers, point: tuple) -> list[tuple]:
    """The compute and transfer ops (no drops) of a point of `fr.top()`; the caller adds drops
    with `memplan.planner._build.insert_drops`."""
    L = fr.costs.L

    def emit(pt: tuple, st: int, t: int, late: bool, skip: bool) -> list[tuple]:
        how = pt[3]
        kind = how[0]
        if kind == "one":
            ops = [("R", st)]
            if late:
                ops.append(("B", t + 1))  # the right part's last op, now that s_t is recorded
            elif t == L:
                ops.append(("loss",))
            return ops if skip else ops + [("B", st)]
        if kind == "rec":
            _, a, r, child = how
            ops = [("R", st)]
            fetch = []
            if a:
                ops.append(("offload", st - 1))
                fetch.append(("fetch", st - 1))
            if r:
                ops.append(("offload_record", st))
                fetch.append(("fetch_record", st))
            inner = emit(child, st + 1, t, late, False)
            ops += inner[:-1] + fetch + inner[-1:]  # fetched with the child's last op, `B st+1`
            return ops if skip else ops + [("B", st)]
        sp = how[1]
        if kind == "late":
            _, _, right, left = how
            return ([("F", i) for i in range(st, sp)] + emit(right, sp, t, late, True)
                    + emit(left, st, sp - 1, True, skip))
        _, _, off, right, left = how
        ops = [("F", st)] + ([("offload", st - 1)] if off else []) + [
            ("F", i) for i in range(st + 1, sp)]
        inner = emit(right, sp, t, late, False)
        if off:
            inner = inner[:-1] + [("fetch", st - 1)] + inner[-1:]  # with the right part's `B sp`
        return ops + inner + emit(left, st, sp - 1, False, skip)

    return emit(point, 1, L, False, False)
