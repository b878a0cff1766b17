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

__all__ = ["Costs", "Record", "Frontiers", "record_code", "record_policy", "PolicyRuns",
           "policy_runs", "schedule_and_policies", "expand_policies", "solve", "costs_of", "schedule_ops", "least_peak", "group_costs",
           "expand_ops", "late_useful", "late_useful_of", "staircase", "backward_floor", "backward_floors"]

RECORD = 0  # choice code: record stage s; a split stores s' (>= s+1), a late split -s'
POLICY_BASE = -(1 << 40)  # a record under save policy p >= 1: POLICY_BASE - p (below every -s')


@dataclass(frozen=True)
class Record:
    """A save policy's record costs over stages 0..L (index 0 unused): what changes with it."""

    s: list[int]  # saved (record) bytes
    tf_r: list[int]  # transient bytes of the recorded forward
    tf_l: list[int]  # ... whose output is already live (late splits)
    tb: list[int]  # transient bytes of the backward (its recomputation included)
    f: list[float]  # seconds of the recorded forward
    b: list[float]  # seconds of the backward


def record_code(p: int) -> int:
    """The choice code of a record under policy p (RECORD for p = 0)."""
    return RECORD if p == 0 else POLICY_BASE - p


def record_policy(ch: int) -> int | None:
    """The policy of a record choice code; None for a split or a late split."""
    if ch == RECORD:
        return 0
    return POLICY_BASE - ch if ch <= POLICY_BASE else None


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
    # save policies (NOTE [ save policies in the recurrence ]): the records of policies 1..K-1, one
    # `Record` each, over stages 0..L (stages with fewer policies repeat their policy 0 there), and
    # how many policies each stage has (None: one each)
    alt: tuple[Record, ...] = ()
    npol: list[int] | None = None

    def row(self, p: int) -> Record:
        """The record costs of policy p (0: the base fields), over stages 0..L."""
        if p == 0:
            return Record(s=self.s, tf_r=self.tf_r, tf_l=self.tf_l, tb=self.tb, f=self.f, b=self.b)
        return self.alt[p - 1]

    def pols(self, i: int) -> range:
        """The policies of stage i: range(number of them)."""
        return range(self.npol[i] if self.npol is not None else 1)

    @property
    def K(self) -> int:
        """Policies per stage, at most."""
        return 1 + len(self.alt)

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
        **_policy_rows(layers),
    )


def _policy_rows(layers) -> dict:
    """`alt` and `npol` of a profile's stages (empty when no stage has a policy besides 'all')."""
    K = 1 + max(len(la.policies) for la in layers)
    if K == 1:
        return {}
    alt = []
    for p in range(1, K):
        rows: dict[str, list] = {"s": [0], "tf_r": [0], "tf_l": [0], "tb": [0], "f": [0.0],
                                 "b": [0.0]}
        for la in layers:
            src = la.policies[p - 1] if p <= len(la.policies) else la  # repeat policy 0
            rows["s"].append(src.saved_bytes)
            rows["tf_r"].append(src.forward_temp_bytes)
            rows["tf_l"].append(src.forward_temp_bytes)
            rows["tb"].append(src.backward_temp_bytes)
            rows["f"].append(src.forward_s)
            rows["b"].append(src.backward_s)
        alt.append(Record(**rows))
    return {"alt": tuple(alt), "npol": [1] + [1 + len(la.policies) for la in layers]}


def late_useful(c: Costs) -> list[bool]:
    """useful[j] (j = 1..L-1; False at 0 and L): whether late left parts ending at j, Q(., j),
    can beat the plain ones (NOTE [ late left parts ]). With save policies: where stage j+1 has
    one policy and some policy of stage j makes them useful (NOTE [ save policies in the
    recurrence ]; `policy_runs` fixes the policy of the other stages where they could help)."""
    out = late_useful_of(c.x, c.s, c.tf_r, c.tf_l, c.tb)
    if c.npol is None:
        return out
    for p in range(1, c.K):  # rows repeat policy 0 where a stage has fewer policies
        r = c.row(p)
        more = late_useful_of(c.x, r.s, r.tf_r, r.tf_l, r.tb)
        out = [a or (b and c.npol[j] > p) for j, (a, b) in enumerate(zip(out, more, strict=True))]
    return [u and (j + 1 > c.L or c.npol[j + 1] == 1) for j, u in enumerate(out)]


def late_useful_of(x, s, tf_r, tf_l, tb) -> list[bool]:
    """`late_useful` from the size lists (bytes, or slots), indexed as in `Costs`."""
    L = len(x) - 1
    out = [False] * (L + 1)
    for j in range(1, L):
        out[j] = _late_beats(x[j - 1], x[j], x[j + 1], s[j], tf_r[j], tf_l[j], tb[j], s[j + 1],
                             tb[j + 1])
    return out


def _late_beats(xs, xj, xn, sj, tfr_j, tfl_j, tb_j, s_n, tb_n) -> bool:
    """Whether Q(j, j) peaks below P(j, j): stage j's sizes (its input xs, output xj, record sj,
    transients) under its policy, the next stage's (output xn, record s_n, backward transient
    tb_n) under its own."""
    hold = xj + s_n + xn
    b_peak = 2 * xs + sj + xj + tb_j
    plain = max(xs + 2 * xj + sj + tfr_j, b_peak)  # P(j, j): R j, B j
    late = max(xs + hold + sj + tfl_j, xs + sj + hold + xj + tb_n, b_peak)
    return late < plain


def _hold(c: Costs, t: int, late: bool) -> int:
    """Bytes that P(., t), or Q(., t) when `late`, holds throughout besides a_{s-1}: the gradient
    d_t (t = L: none yet, the loss makes it), or the state before `B t+1` (a_t, s_{t+1}, d_{t+1})."""
    if late:
        return c.x[t] + c.s[t + 1] + c.x[t + 1]
    return c.x[t] if t < c.L else 0


def _record_floor(c: Costs, st: int, hold: int, r: Record | None = None) -> int:
    """The least peak (bytes) of a record choice at st < t, whatever the child: `R st` with
    `hold` beside a_{st-1}, and `B st` (`r`: the record's policy; None: policy 0)."""
    r = r or c.row(0)
    xs = c.x[st - 1]
    return max(xs + hold + c.x[st] + r.s[st] + r.tf_r[st], xs + r.s[st] + c.x[st] + xs + r.tb[st])


def _one_stage_peak(c: Costs, t: int, late: bool, r: Record | None = None) -> int:
    """The peak (bytes) of P(t, t) (`R t`, `loss` when t = L, `B t`) or, when `late`, of Q(t, t)
    (`R t` on the live a_t, `B t+1` above the record s_t, `B t`); `r`: stage t's policy (None: 0).
    Stage t+1 of a late part has one policy (`late_useful`), its base fields."""
    r = r or c.row(0)
    x, s, xs, hold = c.x, r.s, c.x[t - 1], _hold(c, t, late)
    floor = backward_floor(c, t, r)  # a late part's t < L: its plain backward peak
    if late:
        return max(xs + hold + s[t] + r.tf_l[t], xs + s[t] + hold + x[t] + c.tb[t + 1], floor)
    return max(xs + hold + x[t] + s[t] + r.tf_r[t], floor)


def backward_floor(c: Costs, t: int, r: Record | None = None) -> int:
    """The least bytes `B t` holds in any schedule, stage t recorded under `r` (None: policy 0):
    its input a_{t-1}, its record s_t, the gradients d_t and d_{t-1} and its backward
    transients; for t = L also the loss making d_L beside a_L and s_L."""
    r = r or c.row(0)
    xs, xt = c.x[t - 1], c.x[t]
    b_peak = xs + r.s[t] + xt + xs + r.tb[t]
    return max(b_peak, xs + r.s[t] + 2 * xt) if t == c.L else b_peak


def backward_floors(c: Costs) -> list[int]:
    """Per stage t (index 0 unused), `backward_floor` under its leanest save policy, in bytes. No
    schedule's peak is below the largest (NOTE [ the least peak's stage ] in planner/optimal.py)."""
    return [0] + [min(backward_floor(c, t, c.row(p)) for p in c.pols(t)) for t in range(1, c.L + 1)]


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
    x, tff = c.x, c.tf_f
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
        for pol in c.pols(st):  # record s, under each of its save policies
            r = c.row(pol)
            fb = r.f[st] + r.b[st]
            code = record_code(pol)
            if st == t:
                cand.append((_one_stage_peak(c, t, late, r), fb, code))
                continue
            floor = _record_floor(c, st, hold, r)
            sh = xs + r.s[st]
            for p, tm in zip(own_p[st + 1][t], own_t[st + 1][t], strict=True):
                cand.append((max(floor, p + sh), tm + fb, code))
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
    out.extend((m, add + Rt[i] + Lt[j], choice) for m, i, j in staircase(Rp, shift, Lp, floor))


def staircase(Rp, shift, Lp, floor):
    """The breakpoints of m -> (R(m - shift), L(m)) for m >= floor, two staircases given by their
    ascending peaks: yields (m, i, j), the peak and the indices of the points in force there."""
    nR, nL = len(Rp), len(Lp)
    m = max(Rp[0] + shift, Lp[0], floor)
    i = bisect_right(Rp, m - shift) - 1
    j = bisect_right(Lp, m) - 1
    while True:
        yield m, i, j
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
    return schedule_and_policies(fr, budget)[0]


def schedule_and_policies(fr, budget: int) -> tuple[list[tuple], dict[int, int]]:
    """`schedule_ops` and the save policy of each recorded stage ({stage: policy index}; stages
    under policy 0 left out), from any frontiers object, `PolicyRuns` included."""
    if isinstance(fr, PolicyRuns):
        return fr.schedule(budget)
    c = fr.costs
    chosen: dict[int, int] = {}
    s_rows = [c.row(p).s for p in range(c.K)] if c.K > 1 else None
    ops = build_ops(c.L, c.x, c.s, budget, fr.choice, unit="bytes", s_rows=s_rows, chosen=chosen)
    return ops, {i: p for i, p in chosen.items() if p}


def build_ops(L: int, x, s, budget: int, choose, *, unit: str, s_rows=None,
              chosen: dict[int, int] | None = None) -> list[tuple]:
    """Compute ops from a solved recurrence: `choose(st, t, m, late=...)` gives sub-chain st..t's
    choice within m units (RECORD, a split s', a late split -s', or None when nothing fits), of
    the late left part Q(st, t) when `late`; x and s are the sizes in those units, as in `Costs`.
    With save policies, `s_rows[p]` are policy p's record sizes and `chosen` receives each
    recorded stage's policy."""
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
        pol = record_policy(ch)
        if pol is not None:
            if chosen is not None:
                chosen[st] = pol
            if not skip:
                stack.append((False, 0, st, 0, False))
            out.append(("R", st))
            if st < t:
                stack.append((late, st + 1, t, m - xs - (s_rows[pol] if pol else s)[st], False))
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
    x, tff = c.x, c.tf_f
    useful = late_useful(c)
    big = 2**62
    M = [[big] * (L + 1) for _ in range(L + 2)]
    MQ = [[big] * (L + 1) for _ in range(L + 2)]

    def least(st: int, t: int, late: bool) -> int:
        own = MQ if late else M
        xs = x[st - 1]
        hold = _hold(c, t, late)
        if st == t:
            best = min(_one_stage_peak(c, t, late, c.row(p)) for p in c.pols(st))
        else:
            best = min(max(_record_floor(c, st, hold, c.row(p)), own[st + 1][t] + xs + c.row(p).s[st])
                       for p in c.pols(st))
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
    out = Costs(x=x, f=f, b=b, s=s, tf_f=tff, tf_r=tfr, tf_l=tfl, tb=tb, fn=fn)
    if c.K == 1:
        return out
    # save policies: macro policy p records every stage of the group under its policy p (or its
    # policy 0 where it has fewer), priced by the same formulas on those records
    alt = []
    for p in range(1, c.K):
        r = c.row(p)
        g = group_costs(Costs(x=c.x, f=r.f, b=r.b, s=r.s, tf_f=c.tf_f, tf_r=r.tf_r, tf_l=r.tf_l,
                              tb=r.tb, fn=c.f_nograd), bounds)
        alt.append(Record(s=g.s, tf_r=g.tf_r, tf_l=g.tf_l, tb=g.tb, f=g.f, b=g.b))
    npol = [1] + [max(c.npol[i] for i in range(p, q + 1)) for p, q in bounds]
    return Costs(x=x, f=f, b=b, s=s, tf_f=tff, tf_r=tfr, tf_l=tfl, tb=tb, fn=fn, alt=tuple(alt),
                 npol=npol)


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


# NOTE [ save policies in the recurrence ]
# A stage with several save policies (docs/chain-model.md section 10.8) is recorded once in a
# persistent schedule, by the record choice of exactly one sub-problem; its policy changes only
# that choice's sizes and times (s, tf_r, tf_l, tb, f, b of the recorded stage). So the record
# choice (and the one-stage case) takes the envelope over the stage's policies, and every other
# choice is unchanged: the DP stays exact over (schedule, policy per stage).
# One place breaks that independence: a late left part Q(., j) holds the record of stage j+1 and
# runs its backward, but stage j+1 was recorded inside the right part, under a policy that Q
# cannot see. So Q(., j) is solved only where stage j+1 has one policy (`late_useful`). Where a
# late split could help at a boundary whose next stage has several, `policy_runs` fixes that
# stage's policy and solves once per combination (at most MAX_POLICY_RUNS runs; past that the
# remaining such boundaries go without late splits, and the plan says so). No boundary of a
# transformer chain needs it (NOTE [ late left parts ]): there it is one run.
MAX_POLICY_RUNS = 64


def _late_pairs(c: Costs) -> list[int]:
    """Stages m (2..L) with several policies where some pair of policies (stage m-1's, stage
    m's) makes a late left part ending at m-1 useful."""
    if c.npol is None:
        return []
    out = []
    for m in range(2, c.L + 1):
        if c.npol[m] < 2:
            continue
        j, x = m - 1, c.x
        if any(_late_beats(x[j - 1], x[j], x[m], rj.s[j], rj.tf_r[j], rj.tf_l[j], rj.tb[j],
                           rm.s[m], rm.tb[m])
               for rj in (c.row(p) for p in c.pols(j)) for rm in (c.row(q) for q in c.pols(m))):
            out.append(m)
    return out


def fix_policy(c: Costs, m: int, q: int) -> Costs:
    """`c` with stage m's policy fixed to q (its only policy, at row 0)."""
    r = c.row(q)

    def put(base: list, v) -> list:
        out = list(base)
        out[m] = v
        return out

    alt = tuple(Record(s=put(a.s, r.s[m]), tf_r=put(a.tf_r, r.tf_r[m]), tf_l=put(a.tf_l, r.tf_l[m]),
                       tb=put(a.tb, r.tb[m]), f=put(a.f, r.f[m]), b=put(a.b, r.b[m]))
                for a in c.alt)
    return Costs(x=c.x, f=put(c.f, r.f[m]), b=put(c.b, r.b[m]), s=put(c.s, r.s[m]), tf_f=c.tf_f,
                 tf_r=put(c.tf_r, r.tf_r[m]), tf_l=put(c.tf_l, r.tf_l[m]), tb=put(c.tb, r.tb[m]),
                 fn=c.fn, alt=alt, npol=put(c.npol, 1))


def policy_runs(c: Costs) -> tuple[list[tuple[Costs, dict[int, int]]], list[int]]:
    """The solves that together are exact (NOTE [ save policies in the recurrence ]): a list of
    (costs, {stage: fixed policy}) and the stages left with several policies and no late split
    (past MAX_POLICY_RUNS runs; usually empty)."""
    stages = _late_pairs(c)
    runs: list[tuple[Costs, dict[int, int]]] = [(c, {})]
    left: list[int] = []
    for m in stages:
        if len(runs) * c.npol[m] > MAX_POLICY_RUNS:
            left.append(m)
            continue
        runs = [(fix_policy(cc, m, q), {**fixed, m: q}) for cc, fixed in runs for q in c.pols(m)]
    return runs, left


class PolicyRuns:
    """Frontiers of several `policy_runs` solves: `top()` is their envelope, `schedule(m)` the
    fastest run's schedule within m bytes and its policies."""

    def __init__(self, costs: Costs, runs: list[tuple[object, dict[int, int]]]):
        self.costs = costs
        self.runs = runs

    def top(self) -> tuple[list[int], list[float]]:
        """The envelope of the runs' frontiers: (peaks in bytes, times in seconds)."""
        pts = sorted((p, t) for fr, _ in self.runs for p, t in zip(*fr.top(), strict=True))
        peaks: list[int] = []
        times: list[float] = []
        for p, t in pts:
            if not times or t < times[-1] - _rel_eps(times[-1]):
                if peaks and peaks[-1] == p:
                    times[-1] = t
                else:
                    peaks.append(p)
                    times.append(t)
        return peaks, times

    def schedule(self, budget: int) -> tuple[list[tuple], dict[int, int]]:
        """(compute ops, {stage: policy}) of the fastest run's schedule within `budget` bytes."""
        best = None
        for k, (fr, _) in enumerate(self.runs):
            peaks, times = fr.top()
            i = bisect_right(peaks, budget) - 1
            if i >= 0 and (best is None or times[i] < best[0] - _rel_eps(best[0])):
                best = (times[i], k)
        if best is None:
            raise ValueError(f"the chain does not fit {budget} bytes")
        fr, fixed = self.runs[best[1]]
        ops, chosen = schedule_and_policies(fr, budget)
        chosen.update(fixed)
        return ops, {i: p for i, p in chosen.items() if p}


def expand_policies(chosen: dict[int, int], bounds: list[tuple[int, int]],
                    npol: list[int] | None) -> dict[int, int]:
    """Macro-stage policies as stage policies: macro policy p applies policy p to each stage of
    the group that has it (the others keep policy 0, as `group_costs` priced them)."""
    out: dict[int, int] = {}
    for g, p in chosen.items():
        lo, hi = bounds[g - 1]
        for i in range(lo, hi + 1):
            if npol is not None and npol[i] > p:
                out[i] = p
    return out
