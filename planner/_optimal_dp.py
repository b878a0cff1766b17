"""The exact persistent dynamic programme behind `planner.optimal`, as Pareto frontiers in bytes.

NOTE [ the recurrence ]
Beaumont et al. 2019 ("Optimal checkpointing for heterogeneous chains", the rotor paper) solve
sub-chains s..t: a_{s-1} is live, and so is the gradient d_t of the sub-chain's output (for t = L
the loss creates d_L instead); run B t..s, ending with d_{s-1} live and a_{s-1} freed. Two choices:

  record  `R s`, solve s+1..t above the record s_s (which pins a_{s-1}), then `B s`;
  split   `F s..s'-1` keeping only a_{s'-1}, solve s'..t above a_{s-1}, then solve s..s'-1.

Under ../shared/docs/chain-model.md every op's "bytes live during" is a sum of the sizes that the
sub-chain owns plus what its ancestors hold, so each sub-chain's best time is a step function of the
memory it may use. We keep that function exactly, as its Pareto points (peak bytes, seconds), not
on a grid of memory slots: peaks are integers, so nothing is rounded and nothing is lost. Combining
two children is a merge of two staircases (sizes add, times add); the sub-chain's frontier is the
lower envelope over its choices. Peaks count the sub-chain's own a_{s-1} and d_t; a parent adds
what it holds during the child (a_{s-1} for a split's right part, a_{s-1} + s_s for a record).

NOTE [ macro stages ]
The approximate mode groups consecutive stages into macro stages and solves this same recurrence on
them. A macro stage's forward, recorded forward and backward have different transient bytes, so
the costs here carry separate `tf_f` (for F) and `tf_r` (for R), and `tb` may be negative: they are
the exact peaks of the expanded op sequences, expressed in the single-stage formulas.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from planner.simulate import nograd_forward_s

__all__ = ["Costs", "Frontiers", "solve", "costs_of", "schedule_ops", "least_peak", "group_costs",
           "expand_ops"]

RECORD = 0  # choice code: record stage s; a split stores s' (>= s+1)
LATE = -1  # choice code: F s keeping a_s, solve s+1..t, and `R s` just before its last `B s+1`


@dataclass(frozen=True)
class Costs:
    """Per-stage costs, 1-based (index 0 of per-stage lists is unused). Bytes are ints."""

    x: list[int]  # x[0..L]: output bytes, x[0] the input
    f: list[float]  # forward seconds
    b: list[float]  # backward seconds
    s: list[int]  # saved (record) bytes
    tf_f: list[int]  # transient bytes of an unrecorded forward
    tf_r: list[int]  # transient bytes of a recorded forward
    tf_l: list[int]  # ... of a recorded forward whose output is already live (the late record)
    tb: list[int]  # transient bytes of a backward (may be negative for macro stages)
    fn: list[float] | None = None  # seconds of an unrecorded forward `F` (None: f); see
    # NOTE [ no-grad forward time ] in planner/simulate.py

    @property
    def f_nograd(self) -> list[float]:
        """Seconds of each stage's unrecorded forward (`F`), 1-based."""
        return self.f if self.fn is None else self.fn

    @property
    def L(self) -> int:
        return len(self.x) - 1


def costs_of(profile) -> Costs:
    """The chain model's costs of a Profile."""
    layers = profile.layers
    tf = [0] + [la.forward_temp_bytes for la in layers]
    return Costs(
        fn=[0.0] + nograd_forward_s(profile),
        x=[profile.input_bytes] + [la.output_bytes for la in layers],
        f=[0.0] + [la.forward_s for la in layers],
        b=[0.0] + [la.backward_s for la in layers],
        s=[0] + [la.saved_bytes for la in layers],
        tf_f=tf,
        tf_r=list(tf),
        tf_l=list(tf),
        tb=[0] + [la.backward_temp_bytes for la in layers],
    )


@dataclass
class Frontiers:
    """Pareto frontiers of every sub-chain: `peaks[s][t]` ascending, `times[s][t]` descending,
    `choices[s][t]` the choice of each point (RECORD or the split s')."""

    costs: Costs
    peaks: list[list[list[int]]]
    times: list[list[list[float]]]
    choices: list[list[list[int]]]
    cap: int | None

    def top(self) -> tuple[list[int], list[float]]:
        """The whole chain's frontier: (peaks in bytes, times in seconds)."""
        L = self.costs.L
        return self.peaks[1][L], self.times[1][L]

    def choice(self, st: int, t: int, m: int) -> int | None:
        """The choice of sub-chain st..t's fastest point within m bytes (None: nothing fits)."""
        k = bisect_right(self.peaks[st][t], m) - 1
        return None if k < 0 else self.choices[st][t][k]


def _rel_eps(t: float) -> float:
    # times are sums of float seconds: treat differences below 1e-12 relative as ties, so that
    # rounding noise does not create points that are "faster" by 1 ulp
    return abs(t) * 1e-12


def solve(c: Costs, *, cap: int | None = None) -> Frontiers:
    """Frontiers of all sub-chains. `cap`: points with a peak above it are dropped (a budget in
    bytes; None keeps all). Returns `Frontiers`; the whole chain's is `peaks[1][L]`."""
    L = c.L
    x, f, b, s, tff, tfr, tfl, tb = c.x, c.f, c.b, c.s, c.tf_f, c.tf_r, c.tf_l, c.tb
    fn = c.f_nograd  # `F` ops: the split's forwards and the late record's first forward
    big = cap if cap is not None else None
    P: list[list[list[int]]] = [[[] for _ in range(L + 1)] for _ in range(L + 2)]
    T: list[list[list[float]]] = [[[] for _ in range(L + 1)] for _ in range(L + 2)]
    C: list[list[list[int]]] = [[[] for _ in range(L + 1)] for _ in range(L + 2)]
    for t in range(1, L + 1):
        D = x[t] if t < L else 0  # the gradient d_t, live throughout (t = L: made by the loss)
        for st in range(t, 0, -1):
            xs = x[st - 1]
            cand: list[tuple[int, float, int]] = []
            # record s
            r_peak = xs + D + x[st] + s[st] + tfr[st]
            b_peak = xs + s[st] + x[st] + xs + tb[st]
            fb = f[st] + b[st]
            if st == t:
                if t == L:
                    pk = max(r_peak, xs + s[st] + 2 * x[st], b_peak)
                else:
                    pk = max(r_peak, b_peak)
                cand.append((pk, fb, RECORD))
            else:
                floor = max(r_peak, b_peak)
                sh = xs + s[st]
                for p, tm in zip(P[st + 1][t], T[st + 1][t], strict=True):
                    cand.append((max(floor, p + sh), tm + fb, RECORD))
                # late record: `F s` keeps a_s for the child; `R s` runs while a_s is still live,
                # just before the child's last op `B s+1` (whose state is always a_s, s_{s+1},
                # d_{s+1}), so it costs s_s without x_s, at the price of a second forward of s
                before = x[st] + s[st + 1] + x[st + 1]
                floor = max(
                    xs + D + x[st] + tff[st],  # F s
                    xs + before + s[st] + tfl[st],  # R s (a_s is live: no new x_s)
                    xs + s[st] + before + x[st] + tb[st + 1],  # B s+1 above the record s_s
                    b_peak,
                )
                fb2 = fb + fn[st]
                for p, tm in zip(P[st + 1][t], T[st + 1][t], strict=True):
                    cand.append((max(floor, p + xs), tm + fb2, LATE))
            # split at s': F s..s'-1 keeping a_{s'-1}
            fwd = 0
            fsum = 0.0
            for sp in range(st + 1, t + 1):
                k = sp - 1  # the forward F k runs now, a_{k-1} freed after it unless k = s
                fwd = max(fwd, xs + D + (x[k - 1] if k > st else 0) + x[k] + tff[k])
                fsum += fn[k]
                Rp, Rt = P[sp][t], T[sp][t]
                Lp, Lt = P[st][sp - 1], T[st][sp - 1]
                if not Rp or not Lp:
                    continue
                _merge(Rp, Rt, xs, Lp, Lt, fwd, fsum, sp, cand)
            pk_l, tm_l, ch_l = _envelope(cand, big)
            P[st][t], T[st][t], C[st][t] = pk_l, tm_l, ch_l
    return Frontiers(costs=c, peaks=P, times=T, choices=C, cap=cap)


def _merge(Rp, Rt, shift, Lp, Lt, floor, add, choice, out) -> None:
    """Points of m -> add + R(m - shift) + L(m) for m >= floor, appended to `out`."""
    nR, nL = len(Rp), len(Lp)
    m = max(Rp[0] + shift, Lp[0], floor)
    i = bisect_right(Rp, m - shift) - 1
    j = bisect_right(Lp, m) - 1
    while True:
        out.append((m, add + Rt[i] + Lt[j], choice))
        nr = Rp[i + 1] + shift if i + 1 < nR else None
        nl = Lp[j + 1] if j + 1 < nL else None
        if nr is None and nl is None:
            return
        if nl is None or (nr is not None and nr <= nl):
            m = nr
            i += 1
            if nl is not None and nl == nr:
                j += 1
        else:
            m = nl
            j += 1


def _envelope(cand, cap):
    cand.sort()
    peaks: list[int] = []
    times: list[float] = []
    choices: list[int] = []
    best = float("inf")
    for p, tm, ch in cand:
        if cap is not None and p > cap:
            break
        if tm < best - _rel_eps(best if best != float("inf") else tm):
            if peaks and peaks[-1] == p:
                times[-1], choices[-1] = tm, ch
            else:
                peaks.append(p)
                times.append(tm)
                choices.append(ch)
            best = tm
    return peaks, times, choices


def schedule_ops(fr, budget: int) -> list[tuple]:
    """The compute ops (F, R, loss, B; no drops) of the fastest schedule within `budget` bytes,
    from `Frontiers` or the compiled kernel's `PoolFrontiers` (anything with `costs` and
    `choice`). The caller adds drops with `planner._build.insert_drops`. Raises ValueError when
    none fits."""
    c = fr.costs
    return build_ops(c.L, c.x, c.s, budget, fr.choice, unit="bytes")


def build_ops(L: int, x, s, budget: int, choose, *, unit: str) -> list[tuple]:
    """Compute ops from a solved recurrence: `choose(st, t, m)` gives sub-chain st..t's choice
    within m units (RECORD, LATE, a split point, or None when nothing fits); x and s are the
    sizes in those units, indexed as in `Costs`."""
    out: list[tuple] = []
    stack: list[tuple[int, int, int]] = [(1, L, budget)]
    # an explicit stack (the recursion is L deep); each entry solves sub-chain (s, t) within m.
    # Children run in order: a split's right part, then its left part.
    while stack:
        st, t, m = stack.pop()
        if st == 0:  # a marker: emit `B t`
            out.append(("B", t))
            continue
        if st < 0:  # a marker: `R t` goes before the last op emitted (the child's `B t+1`)
            out.insert(len(out) - 1, ("R", t))
            continue
        ch = choose(st, t, m) if m >= 0 else None
        if ch is None:
            raise ValueError(f"sub-chain {st}..{t} does not fit {m} {unit}")
        xs = x[st - 1]
        if ch == LATE:
            out.append(("F", st))
            stack.append((0, st, 0))
            stack.append((-1, st, 0))
            stack.append((st + 1, t, m - xs))
        elif ch == RECORD:
            out.append(("R", st))
            stack.append((0, st, 0))
            if st < t:
                stack.append((st + 1, t, m - xs - s[st]))
            elif t == L:
                out.append(("loss",))
        else:
            out.extend(("F", i) for i in range(st, ch))
            stack.append((st, ch - 1, m))  # left part, after the right part
            stack.append((ch, t, m - xs))
    return out


def least_peak(c: Costs) -> int:
    """The least peak (bytes) of any schedule the recurrence can build: the first point of the
    whole chain's frontier, by the same recurrence on scalars (no times, so it is O(L^3) cheap)."""
    L = c.L
    x, s, tff, tfr, tfl, tb = c.x, c.s, c.tf_f, c.tf_r, c.tf_l, c.tb
    M = [[0] * (L + 1) for _ in range(L + 2)]
    for t in range(1, L + 1):
        D = x[t] if t < L else 0
        for st in range(t, 0, -1):
            xs = x[st - 1]
            r_peak = xs + D + x[st] + s[st] + tfr[st]
            b_peak = xs + s[st] + x[st] + xs + tb[st]
            if st == t:
                best = max(r_peak, b_peak, xs + s[st] + 2 * x[st] if t == L else r_peak)
            else:
                child = M[st + 1][t]
                best = max(r_peak, b_peak, child + xs + s[st])
                before = x[st] + s[st + 1] + x[st + 1]
                late = max(xs + D + x[st] + tff[st], xs + before + s[st] + tfl[st],
                           xs + s[st] + before + x[st] + tb[st + 1], b_peak, child + xs)
                best = min(best, late)
            fwd = 0
            for sp in range(st + 1, t + 1):
                k = sp - 1
                fwd = max(fwd, xs + D + (x[k - 1] if k > st else 0) + x[k] + tff[k])
                if fwd >= best:
                    break
                best = min(best, max(fwd, M[sp][t] + xs, M[st][sp - 1]))
            M[st][t] = best
    return M[1][L]


def group_costs(c: Costs, bounds: list[tuple[int, int]]) -> Costs:
    """Costs of macro stages, one per (p, q) in `bounds` (consecutive stages p..q run as a unit:
    `F p..q`, `R p..q`, `B q..p`). Each macro cost is the exact peak of its expanded op sequence
    written in the single-stage formulas (see NOTE [ macro stages ]), except the unrecorded
    forward, which counts the group's input as live throughout (an over-estimate of at most x_{p-1}
    when that input is not a kept checkpoint), so the recurrence never under-estimates a peak."""
    x = [c.x[0]]
    f, fn, b, s, tff, tfr, tfl, tb = ([0] for _ in range(8))
    cfn = c.f_nograd
    for p, q in bounds:
        xq, xin = c.x[q], c.x[p - 1]
        sg = sum(c.x[p:q]) + sum(c.s[p:q + 1])
        fwd = max(c.x[p] + c.tf_f[p],
                  max((c.x[k - 1] + c.x[k] + c.tf_f[k] for k in range(p + 1, q + 1)), default=0))
        terms, acc = [], 0
        for k in range(p, q + 1):
            terms.append(acc + c.x[k] + c.s[k] + c.tf_r[k])
            acc += c.x[k] + c.s[k]
        late = max(max(terms[:-1], default=0),
                   terms[-1] - xq - c.tf_r[q] + c.tf_l[q])
        back, acc_s, acc_x = [], 0, 0
        for k in range(p, q + 1):
            acc_s += c.s[k]
            back.append(acc_s + acc_x + c.x[k] + c.x[k - 1] + c.tb[k])
            acc_x += c.x[k]
        x.append(xq)
        f.append(sum(c.f[p:q + 1]))
        fn.append(sum(cfn[p:q + 1]))
        b.append(sum(c.b[p:q + 1]))
        s.append(sg)
        tff.append(fwd - xq)
        tfr.append(max(terms) - xq - sg)
        tfl.append(late - sg)
        tb.append(max(back) - (sg + xq + xin))
    return Costs(x=x, f=f, b=b, s=s, tf_f=tff, tf_r=tfr, tf_l=tfl, tb=tb, fn=fn)


def expand_ops(ops: list[tuple], bounds: list[tuple[int, int]]) -> list[tuple]:
    """Macro-stage compute ops as ops on the original stages."""
    out: list[tuple] = []
    for op in ops:
        if op[0] == "loss":
            out.append(op)
            continue
        p, q = bounds[op[1] - 1]
        if op[0] == "B":
            out.extend(("B", i) for i in range(q, p - 1, -1))
        else:
            out.extend((op[0], i) for i in range(p, q + 1))
    return out
