"""Oracles for the optimal planner, written for clarity, not speed.

- `memo_time`: the plain memoised recursion of Beaumont et al. 2019 over (s, t, memory), memory in
  whole bytes (the "rotor" formulation without slots). Same recurrence as planner/_optimal_dp.py,
  written independently as one function; the benchmark times it against the frontier DP.
- `exhaustive_frontier`: a shortest-path search over schedule states (live activations, live
  records, backward progress) that finds the Pareto set of (peak, time) over *all* valid schedules
  of the chain model, or over persistent ones only (`persistent=True`), with one schedule per point;
  with `offload_bandwidth`, also over the "eager offload, lazy fetch" transfer schedules
  (docs/chain-model.md section 10.9) within `host_memory_bytes`.

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


def exhaustive_frontier(p: Profile, *, persistent: bool = False,
                        offload_bandwidth: float | None = None,
                        host_memory_bytes: int | None = None):
    """Pareto set over all valid schedules: a list of (peak_bytes, time_s, ops), peaks descending
    and times ascending. With `persistent`, a checkpoint may not be dropped while a later backward
    still needs it, so it is never recomputed. With `offload_bandwidth` (bytes/s, > 0) the
    schedules may also move tensors to host memory, in the class of NOTE [ offload in the
    oracle ]; `host_memory_bytes` (None: unlimited) bounds the host bytes at every op.

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

    NOTE [ offload in the oracle ]
    docs/chain-model.md section 10.9, "eager offload, lazy fetch". Each step is one window: the
    transfers issued with a compute op, the op, then its drops.
    1. `offload X` (X an a_j, j >= 1, or a record) only with a forward (`F`/`R`) right after the
       compute op that made or read X (`elig` in the state) and that does not read X itself (the
       first forward of X's idle time), never with an op that makes X again, and never for a
       tensor that op's drops free.
    2. `fetch X` only with a backward (`B`), and only when the compute op after it reads X (a
       fetch on a forward admits schedules outside the recurrence, section 10.9, which records a
       stage early only to carry a fetch past a peak): a window's fetches are the
       host-resident part of what one op reads ({a_j}, {record i} or {a_{i-1}, record i}); the
       state keeps them (`need`) and the next op must read them all, else the branch is dead.
    3. The window op takes max(t_op, D/bw, H/bw) s (D, H: bytes offloaded, fetched); its bytes
       during are the device's before it, plus what it fetches, plus its own; what it offloads
       leaves the device after it. Host bytes: the state's host tensors; at the window op they
       are the host bytes before it plus D, which must fit `host_memory_bytes`.
    4. A tensor on the host cannot be read; an a_j on the host is dropped (host bytes) when no
       later op reads it, like the device's (`cleanup`); a record on the host still pins a_{j-1}.
    5. With a bandwidth, two shapes outside the recurrence are left out, which transfers would
       otherwise reward: `R i` on a live a_i (a late split's left part; the chains the offload
       tests draw are those where late splits cannot help, NOTE [ late left parts ]) and `F i`
       while record i lives (a stage recorded early, its record sent to the host, its output
       dropped and computed again: a record whose output is not kept is not a choice of the DP),
       and `F L` (the recurrence records the last stage for the loss; a no-grad `F L` before the
       loss and `R L` after it would carry a transfer on a forward the step does not need).
    The state gains (hact, hrec, elig_a, elig_r, need_a, need_r), all 0 without a bandwidth, so
    that search is the one above, step for step.
    """
    x, f, b, s, tf, tb = _arrays(p)
    fn, tfn = _nograd(p, f, tf)
    L = p.n_stages
    BEFORE = L + 1  # phase before the loss; after it, the phase is the next backward's stage
    bw = float(offload_bandwidth or 0.0)
    host_cap = INF if host_memory_bytes is None else host_memory_bytes

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

    @cache
    def bits(mask: int) -> tuple[int, ...]:
        return tuple(i for i in range(L + 1) if mask >> i & 1)

    def host_bytes(hact: int, hrec: int) -> int:
        return sum(x[i] for i in bits(hact)) + sum(s[i] for i in bits(hrec))

    def cleanup(act: int, ck: int, ph: int, hact: int) -> tuple[int, int, int, tuple]:
        if ph == BEFORE:
            return act, ck, hact, ()
        # a_j for j >= ph is read by no remaining op: drop it now (on the device or the host)
        gone = tuple(("drop", j) for j in range(max(ph, 1), L + 1) if (act | hact) >> j & 1)
        mask = (1 << ph) - 1 | 1
        return act & mask, ck & mask, hact & mask, gone

    def reads(op) -> tuple[int, int]:  # (a mask, record mask) an op reads
        if op[0] == "loss":
            return 1 << L, 0
        i = op[1]
        return 1 << (i - 1), (1 << i if op[0] == "B" else 0)

    def windows(act, rec, hact, hrec, elig_a, elig_r, op, ph2):
        """(offloads, fetches, D, H) of every window op `op` may carry (rules 1 and 2), `ph2`
        the phase after it. Left out, as they cannot lead to a better point: fetches that no op
        possible next reads (their branch would die), offloads of an a_j the backward is done
        with (`cleanup` drops it right after the window)."""
        if not bw:
            return [((), (), 0, 0)]
        i = op[1] if op[0] != "loss" else 0
        made_a = 1 << i if op[0] in ("F", "R") else 0
        freed_r = 1 << i if op[0] == "B" else 0
        done = 0 if ph2 == BEFORE else ~((1 << ph2) - 1)  # a_j with j >= ph2
        if op[0] not in ("F", "R"):  # rule 1: offloads ride on forwards
            return _windows(0, 0, hact, hrec, ph2, op[0] == "B")
        read_a = 1 << (i - 1)  # rule 1: not on a forward that reads the tensor
        return _windows(elig_a & act & ~made_a & ~read_a & ~done & ~1, elig_r & rec & ~freed_r,
                        hact, hrec, ph2, False)  # rule 2: fetches ride on backwards

    @cache
    def _windows(out_a: int, out_r: int, hact: int, hrec: int, ph2: int, fetch_ok: bool):
        cand = [("offload", j) for j in bits(out_a)]
        cand += [("offload_record", j) for j in bits(out_r)]
        outs = [()]
        for c in cand:
            outs += [o + (c,) for o in outs]
        # next readers: a_j by F/R/B j+1 (or the loss for j = L); record j by B j alone
        if not fetch_ok:
            hact = hrec = 0
        ins = [()] + [(("fetch", j),) for j in bits(hact) if ph2 == BEFORE or j < ph2]
        ins += [(("fetch_record", j),) for j in bits(hrec) if j == ph2]
        ins += [(("fetch", j - 1), ("fetch_record", j)) for j in bits(hrec)
                if j == ph2 and hact >> (j - 1) & 1]
        res = []
        for o in outs:
            D = sum(x[j] if n == "offload" else s[j] for n, j in o)
            for h in ins:
                H = sum(x[j] if n == "fetch" else s[j] for n, j in h)
                res.append((o, h, D, H))
        return res

    start = (1, 0, BEFORE, 0, 0, 0, 0, 0, 0, 0)
    # act (bit 0 = a_0), rec, phase, ck; hact, hrec (on the host); elig_a, elig_r (what the last
    # op made or read); need_a, need_r (fetched for the next op)
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
        act, rec, ph, ck, hact, hrec, elig_a, elig_r, need_a, need_r = state
        if ph == 0:
            if not (need_a or need_r):
                result.append((peak, time, me))
            continue
        live = live_bytes(act, rec, ph)
        held = host_bytes(hact, hrec)
        succ = []  # (op, during, dt, act, rec, ph, ck, droppable)
        top = L if ph == BEFORE else ph
        anywhere = act | hact
        for i in range(1, top + 1):
            if not act >> (i - 1) & 1 or hact >> i & 1:
                continue
            # what is kept across a forward, other than its input and output, is stored
            fck = ck | (anywhere & ~(1 << (i - 1) | 1 << i) & ~1) if persistent else 0
            if not act >> i & 1 and (ph == BEFORE or i <= ph - 1) and not (
                    bw and ((rec | hrec) >> i & 1 or i == L)):  # rule 5: no F i beside record
                # i, no F L
                succ.append((("F", i), live + x[i] + tfn[i], fn[i], act | 1 << i, rec, ph, fck,
                             (i - 1,)))
            if not (rec | hrec) >> i & 1 and not (bw and act >> i & 1):  # rule 5: no R on a_i
                new = 0 if act >> i & 1 else x[i]
                succ.append((("R", i), live + new + s[i] + tf[i], f[i], act | 1 << i,
                             rec | 1 << i, ph, fck, (i,)))
        if ph == BEFORE and act >> L & 1:
            nck = anywhere & ~1 if persistent else 0
            succ.append((("loss",), live + x[L], 0.0, act, rec, L, nck, ()))
        if ph != BEFORE and rec >> ph & 1 and act >> (ph - 1) & 1:
            i = ph
            nck = (anywhere & ~(1 << i)) & ~1 if persistent else 0
            succ.append((("B", i), live + x[i - 1] + tb[i], b[i], act, rec & ~(1 << i), i - 1,
                         nck, ()))
        for op, during, dt, a2, r2, ph2, ck2, touch in succ:
            ra, rr = reads(op)
            if need_a & ~ra or need_r & ~rr:
                continue  # a fetch the op does not read (rule 2)
            ea = (ra | (1 << op[1] if op[0] in ("F", "R") else 0)) & ~1
            er = 1 << op[1] if op[0] == "R" else 0
            for outs, ins, D, H in windows(act, rec, hact, hrec, elig_a, elig_r, op, ph2):
                if held + D > host_cap:
                    continue
                a4, r4, ha, hr = a2, r2, hact, hrec
                for n, j in outs:
                    if n == "offload":
                        a4, ha = a4 & ~(1 << j), ha | 1 << j
                    else:
                        r4, hr = r4 & ~(1 << j), hr | 1 << j
                na = nr = 0
                for n, j in ins:
                    if n == "fetch":
                        a4, ha, na = a4 | 1 << j, ha & ~(1 << j), na | 1 << j
                    else:
                        r4, hr, nr = r4 | 1 << j, hr & ~(1 << j), nr | 1 << j
                wdt = max(dt, D / bw, H / bw) if bw else dt
                a4, ck4, ha, gone = cleanup(a4, ck2, ph2, ha)
                options = [(a4, ck4, gone)]
                moved = {j for n, j in outs if n == "offload"}
                for j in touch:
                    if j <= 0 or not a4 >> j & 1 or j in moved:
                        continue
                    if j < L and (r4 | hr) >> (j + 1) & 1:
                        continue  # pinned by record j+1
                    if persistent and ck4 >> j & 1:
                        continue  # a checkpoint still needed
                    options += [(a & ~(1 << j), c & ~(1 << j), d + (("drop", j),))
                                for a, c, d in options]
                for a5, c5, drops in options:
                    st2 = (a5, r4, ph2, c5, ha, hr, ea & a5, er & r4, na, nr) if bw else \
                        (a5, r4, ph2, c5, 0, 0, 0, 0, 0, 0)
                    pk = max(peak, during + H)
                    if pk < best_peak.get(st2, INF):
                        heapq.heappush(heap, (time + wdt, pk, counter, st2, me,
                                              outs + ins + (op,) + drops))
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
