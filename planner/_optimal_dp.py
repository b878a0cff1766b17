"""The exact persistent dynamic programme behind `memplan.planner.optimal`, as Pareto frontiers in bytes.

NOTE [ the recurrence ]
Beaumont et al. 2019 ("Optimal checkpointing for heterogeneous chains", the rotor paper) solve
sub-chains s..t: a_{s-1} is live, and so is the gradient d_t of the sub-chain's output (for t = L
the loss creates d_L instead); run B t..s, ending with d_{s-1} live and a_{s-1} freed. Their two
choices, and a third that the chain model needs:

  record      `R s`, solve s+1..t above the record s_s (which pins a_{s-1}), then `B s`;
  split       `F s..s'-1` keeping only a_{s'-1}, solve s'..t above a_{s-1}, then solve s..s'-1;
  late split  the same forwards and right part, but the left part s..s'-1 starts just before the
              right part's last op `B s'`, while a_{s'-1} is still live: its `R s'-1` then costs
              no new x_{s'-1} (the chain model's "x_i (if new)"), at the price of holding the
              right part's last state a_{s'-1}, s_{s'}, d_{s'} meanwhile.

The late split's left part is a second family of sub-problems, Q(s, j) (NOTE [ late left parts ]):
a_{s-1} and a_j are live with the record s_{j+1} and the gradient d_{j+1} (the state before
`B j+1`); run `B j+1` at the right moment, then B j..s. Its choices mirror the first family's:
record `R s` then Q(s+1, j); split `F s..m-1`, Q(m, j), then s..m-1 plain; late split `F s..m-1`,
Q(m, j) up to its last op `B m`, then Q(s, m-1); and for s = j, `R j` (a_j live), `B j+1`, `B j`.
Without late splits the DP missed persistent optima that an exhaustive search finds (on 1 of about
1,500 random chains of up to 6 stages with the one-stage case, s' = s + 1, already in; without
that case, on 1 of 300).

Under docs/chain-model.md every op's "bytes live during" is a sum of the sizes that the
sub-chain owns plus what its ancestors hold, so each sub-chain's best time is a step function of the
memory it may use. We keep that function exactly, as its Pareto points (peak bytes, seconds), not
on a grid of memory slots: peaks are integers, so nothing is rounded and nothing is lost. Combining
two children is a merge of two staircases (sizes add, times add); the sub-chain's frontier is the
lower envelope over its choices. Peaks count the sub-chain's own a_{s-1} and d_t (for Q(s, j):
a_{s-1} and the state before `B j+1`); a parent adds what it holds during the child (a_{s-1} for a
split's right part, a_{s-1} + s_s for a record). Times of Q(s, j) leave out b_{j+1}, which the
right part that ends with `B j+1` already counts.

NOTE [ late left parts ]
Q(., j) is worth solving only where its one-stage case beats the plain one: Q(j, j)'s peak
(`R j` on the live a_j, `B j+1` above s_j, `B j`) below P(j, j)'s (`R j`, `B j` with d_j live),
at the same time f_j + b_j (`late_useful`). Otherwise Q(j, j) >= P(j, j) pointwise, and by
induction over s every Q(s, j) >= P(s, j) pointwise: each choice of Q(s, j) is the same choice of
P(s, j) with children that are no better and floors that are no lower (Q holds a_j, s_{j+1},
d_{j+1} where P holds d_j = x_j). A late split whose left part is Q(s, j) is then never better
than the plain split at the same point, so neither family computes it. Since Q(j, j) pays for
`B j+1` with s_j live, it helps only where `R j`'s transient is larger than s_{j+1} + x_{j+1}
plus `B j+1`'s transient: never on transformer chains (the recurrence is then Beaumont's), at
about one boundary in 300 on the random chains of the tests (measured on 3,000 of them).

NOTE [ macro stages ]
The approximate mode groups consecutive stages into macro stages and solves this same recurrence on
them. A macro stage's forward, recorded forward and backward have different transient bytes, so
the costs here carry separate `tf_f` (for F) and `tf_r` (for R), and `tb` may be negative: they are
the exact peaks of the expanded op sequences, expressed in the single-stage formulas.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from memplan.planner.simulate import nograd_forward_s, nograd_forward_temp_bytes

__all__ = ["Costs", "Frontiers", "solve", "costs_of", "schedule_ops", "least_peak", "group_costs",
           "expand_ops", "late_useful", "late_useful_of"]

RECORD = 0  # choice code: record stage s; a split stores s' (>= s+1), a late split -s'


@dataclass(frozen=True)
class Costs:
    """Per-stage costs, 1-based (index 0 of per-stage lists is unused). Bytes are ints."""

    x: list[int]  # x[0..L]: output bytes, x[0] the input
    f: list[float]  # forward seconds
    b: list[float]  # backward seconds
    s: list[int]  # saved (record) bytes
    tf_f: list[int]  # transient bytes of an unrecorded forward
    tf_r: list[int]  # transient bytes of a recorded forward
    tf_l: list[int]  # ... of a recorded forward whose output is already live (late splits)
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
        tf_f=[0] + nograd_forward_temp_bytes(profile),  # NOTE [ no-grad forward bytes ]
        tf_r=tf,
        tf_l=list(tf),
        tb=[0] + [la.backward_temp_bytes for la in layers],
    )


def late_useful(c: Costs) -> list[bool]:
    """useful[j] (j = 1..L-1; False at 0 and L): whether late left parts ending at j, Q(., j),
    can beat the plain ones (NOTE [ late left parts ])."""
    return late_useful_of(c.x, c.s, c.tf_r, c.tf_l, c.tb)


def late_useful_of(x, s, tf_r, tf_l, tb) -> list[bool]:
    """`late_useful` from the size lists (bytes, or slots), indexed as in `Costs`."""
    L = len(x) - 1
    out = [False] * (L + 1)
    for j in range(1, L):
        xs, hold = x[j - 1], x[j] + s[j + 1] + x[j + 1]
        b_peak = 2 * xs + s[j] + x[j] + tb[j]
        plain = max(xs + 2 * x[j] + s[j] + tf_r[j], b_peak)  # P(j, j): R j, B j
        late = max(xs + hold + s[j] + tf_l[j], xs + s[j] + hold + x[j] + tb[j + 1], b_peak)
        out[j] = late < plain
    return out


def _hold(c: Costs, t: int, late: bool) -> int:
    """Bytes that P(., t), or Q(., t) when `late`, holds throughout besides a_{s-1}: the gradient
    d_t (t = L: none yet, the loss makes it), or the state before `B t+1` (a_t, s_{t+1}, d_{t+1})."""
    if late:
        return c.x[t] + c.s[t + 1] + c.x[t + 1]
    return c.x[t] if t < c.L else 0


def _record_floor(c: Costs, st: int, hold: int) -> int:
    """The least peak (bytes) of a record choice at st < t, whatever the child: `R st` with
    `hold` beside a_{st-1}, and `B st`."""
    xs = c.x[st - 1]
    return max(xs + hold + c.x[st] + c.s[st] + c.tf_r[st], xs + c.s[st] + c.x[st] + xs + c.tb[st])


def _one_stage_peak(c: Costs, t: int, late: bool) -> int:
    """The peak (bytes) of P(t, t) (`R t`, `loss` when t = L, `B t`) or, when `late`, of Q(t, t)
    (`R t` on the live a_t, `B t+1` above the record s_t, `B t`)."""
    x, s, xs, hold = c.x, c.s, c.x[t - 1], _hold(c, t, late)
    b_peak = xs + s[t] + x[t] + xs + c.tb[t]
    if late:
        return max(xs + hold + s[t] + c.tf_l[t], xs + s[t] + hold + x[t] + c.tb[t + 1], b_peak)
    pk = max(xs + hold + x[t] + s[t] + c.tf_r[t], b_peak)
    return max(pk, xs + s[t] + 2 * x[t]) if t == c.L else pk


@dataclass
class Frontiers:
    """Pareto frontiers of every sub-chain: `peaks[s][t]` ascending, `times[s][t]` descending,
    `choices[s][t]` the choice of each point (RECORD, a split s' or a late split -s'); the same
    for the late left parts Q(s, j) in `q_peaks`, `q_times`, `q_choices` (empty where not
    computed: NOTE [ late left parts ])."""

    costs: Costs
    peaks: list[list[list[int]]]
    times: list[list[list[float]]]
    choices: list[list[list[int]]]
    q_peaks: list[list[list[int]]]
    q_times: list[list[list[float]]]
    q_choices: list[list[list[int]]]
    cap: int | None

    def top(self) -> tuple[list[int], list[float]]:
        """The whole chain's frontier: (peaks in bytes, times in seconds)."""
        L = self.costs.L
        return self.peaks[1][L], self.times[1][L]

    def choice(self, st: int, t: int, m: int, *, late: bool = False) -> int | None:
        """The choice of sub-chain st..t's fastest point within m bytes (None: nothing fits);
        `late`: of the late left part Q(st, t)."""
        P, C = (self.q_peaks, self.q_choices) if late else (self.peaks, self.choices)
        k = bisect_right(P[st][t], m) - 1
        return None if k < 0 else C[st][t][k]


def _rel_eps(t: float) -> float:
    # times are sums of float seconds: treat differences below 1e-12 relative as ties, so that
    # rounding noise does not create points that are "faster" by 1 ulp
    return abs(t) * 1e-12


def solve(c: Costs, *, cap: int | None = None) -> Frontiers:
    """Frontiers of all sub-chains. `cap`: points with a peak above it are dropped (a budget in
    bytes; None keeps all). Returns `Frontiers`; the whole chain's is `peaks[1][L]`."""
    L = c.L
    x, f, b, s, tff = c.x, c.f, c.b, c.s, c.tf_f
    fn = c.f_nograd  # `F` ops: the splits' forwards
    useful = late_useful(c)

    def table():
        return [[[] for _ in range(L + 1)] for _ in range(L + 2)]

    P, T, C = table(), table(), table()
    QP, QT, QC = table(), table(), table()

    def subchain(st: int, t: int, late: bool):
        """Candidates of P(st, t), or of Q(st, t) when `late`; their envelope."""
        own_p, own_t = (QP, QT) if late else (P, T)
        xs = x[st - 1]
        hold = _hold(c, t, late)
        cand: list[tuple[int, float, int]] = []
        fb = f[st] + b[st]
        if st == t:
            cand.append((_one_stage_peak(c, t, late), fb, RECORD))
        else:  # record s
            floor = _record_floor(c, st, hold)
            sh = xs + s[st]
            for p, tm in zip(own_p[st + 1][t], own_t[st + 1][t], strict=True):
                cand.append((max(floor, p + sh), tm + fb, RECORD))
        # splits at s': F s..s'-1 keeping a_{s'-1}; then the right part s'..t, and the left part
        # s..s'-1 after it (plain) or from just before its last op (late)
        fwd = 0
        fsum = 0.0
        for sp in range(st + 1, t + 1):
            k = sp - 1  # the forward F k runs now, a_{k-1} freed after it unless k = s
            fwd = max(fwd, xs + hold + (x[k - 1] if k > st else 0) + x[k] + tff[k])
            fsum += fn[k]
            Rp, Rt = own_p[sp][t], own_t[sp][t]
            if not Rp:
                continue
            if P[st][sp - 1]:
                _merge(Rp, Rt, xs, P[st][sp - 1], T[st][sp - 1], fwd, fsum, sp, cand)
            if useful[sp - 1] and QP[st][sp - 1]:
                _merge(Rp, Rt, xs, QP[st][sp - 1], QT[st][sp - 1], fwd, fsum, -sp, cand)
        return _envelope(cand, cap)

    for t in range(1, L + 1):
        # Q(., t-1) first: P(st, t)'s late split at s' = t needs Q(st, t-1)
        if useful[t - 1]:
            for st in range(t - 1, 0, -1):
                QP[st][t - 1], QT[st][t - 1], QC[st][t - 1] = subchain(st, t - 1, True)
        for st in range(t, 0, -1):
            P[st][t], T[st][t], C[st][t] = subchain(st, t, False)
    return Frontiers(costs=c, peaks=P, times=T, choices=C, q_peaks=QP, q_times=QT, q_choices=QC,
                     cap=cap)


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
    `choice`). The caller adds drops with `memplan.planner._build.insert_drops`. Raises ValueError when
    none fits."""
    c = fr.costs
    return build_ops(c.L, c.x, c.s, budget, fr.choice, unit="bytes")


def build_ops(L: int, x, s, budget: int, choose, *, unit: str) -> list[tuple]:
    """Compute ops from a solved recurrence: `choose(st, t, m, late=...)` gives sub-chain st..t's
    choice within m units (RECORD, a split s', a late split -s', or None when nothing fits), of
    the late left part Q(st, t) when `late`; x and s are the sizes in those units, as in `Costs`."""
    out: list[tuple] = []
    # an explicit stack (the recursion is L deep): (late, st, t, m, skip) solves P(st, t) or
    # Q(st, t) within m; `skip`: leave out its last op `B st` (a late split's left part runs it);
    # st == 0 is a marker that emits `B t`. Children run in order: right part, then left part.
    stack: list[tuple[bool, int, int, int, bool]] = [(False, 1, L, budget, False)]
    while stack:
        late, st, t, m, skip = stack.pop()
        if st == 0:
            out.append(("B", t))
            continue
        ch = choose(st, t, m, late=late) if m >= 0 else None
        if ch is None:
            raise ValueError(f"sub-chain {st}..{t} does not fit {m} {unit}")
        xs = x[st - 1]
        if ch == RECORD:
            if not skip:
                stack.append((False, 0, st, 0, False))
            out.append(("R", st))
            if st < t:
                stack.append((late, st + 1, t, m - xs - s[st], False))
            elif late:
                out.append(("B", t + 1))  # the right part's last op, now that s_t is recorded
            elif t == L:
                out.append(("loss",))
        else:
            sp = abs(ch)
            out.extend(("F", i) for i in range(st, sp))
            stack.append((ch < 0, st, sp - 1, m, skip))  # left part (ends with B st), after
            stack.append((late, sp, t, m - xs, ch < 0))
    return out


def least_peak(c: Costs) -> int:
    """The least peak (bytes) of any schedule the recurrence can build: the first point of the
    whole chain's frontier, by the same recurrence on scalars (no times, so it is O(L^3) cheap)."""
    L = c.L
    x, s, tff = c.x, c.s, c.tf_f
    useful = late_useful(c)
    big = 2**62
    M = [[big] * (L + 1) for _ in range(L + 2)]
    MQ = [[big] * (L + 1) for _ in range(L + 2)]

    def least(st: int, t: int, late: bool) -> int:
        own = MQ if late else M
        xs = x[st - 1]
        hold = _hold(c, t, late)
        if st == t:
            best = _one_stage_peak(c, t, late)
        else:
            best = max(_record_floor(c, st, hold), own[st + 1][t] + xs + s[st])
        fwd = 0
        for sp in range(st + 1, t + 1):
            k = sp - 1
            fwd = max(fwd, xs + hold + (x[k - 1] if k > st else 0) + x[k] + tff[k])
            if fwd >= best:
                break  # the forward's peak only grows with s'
            left = min(M[st][sp - 1], MQ[st][sp - 1] if useful[sp - 1] else big)
            best = min(best, max(fwd, own[sp][t] + xs, left))
        return best

    for t in range(1, L + 1):
        if useful[t - 1]:
            for st in range(t - 1, 0, -1):
                MQ[st][t - 1] = least(st, t - 1, True)
        for st in range(t, 0, -1):
            M[st][t] = least(st, t, False)
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
