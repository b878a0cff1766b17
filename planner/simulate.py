"""Replay a schedule under the chain model: the single source of every time and peak memplan predicts.

Rules: docs/chain-model.md, section 5 ("The rules of the replay"), and section 10.9 for the
transfer ops of offload. Memory is counted in bytes above `fixed_bytes`; `a_0` (the input) is live
throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from memplan.planner.schema import TRANSFER_OPS, Op, PlanError, parse_schedule
from memplan.planner.storage import storage_sizes
from memplan.profiler.schema import Profile, ProfileError, load_profile

__all__ = ["Simulation", "simulate", "replay", "store_all_time", "nograd_forward_s",
           "nograd_forward_temp_bytes"]


@dataclass(frozen=True)
class Simulation:
    """Outcome of a replay. Times in seconds, sizes in bytes."""

    valid: bool
    error: str | None  # the first rule broken, naming the op; None when valid
    error_index: int | None  # index of that op in the schedule
    time_s: float  # sum of op times up to the end (or the failing op)
    peak_bytes: int  # largest bytes live during any op, a_0 included
    total_peak_bytes: int  # fixed_bytes + peak_bytes
    recompute_s: float  # time_s - (sum f + sum b); 0 for store-all
    overhead: float  # recompute_s / (sum f + sum b)
    timeline: list[int] = field(repr=False)  # bytes live during each op
    forward_counts: list[int] = field(repr=False)  # per stage 1..L: forwards run (F or R)
    checkpoints: list[int] = field(repr=False)  # a_i live at `loss` and not pinned by record i+1
    # stages whose a_i was converted to its storage dtype (a `storage` map; docs/precision.md)
    converted: list[int] = field(default_factory=list, repr=False)
    # offload (NOTE [ transfer ops in the replay ]): the largest bytes held in host memory at any
    # op, the seconds compute waited for copies (included in time_s), and the bytes moved
    # device -> host in all
    host_peak_bytes: int = 0
    transfer_wait_s: float = 0.0
    offloaded_bytes: int = 0
    host_timeline: list[int] = field(default_factory=list, repr=False)  # host bytes at each op

    @property
    def peak_op(self) -> int:
        """Index of the first op at which the peak is reached."""
        return self.timeline.index(self.peak_bytes) if self.timeline else 0


def store_all_time(profile: Profile) -> float:
    """Seconds of the fastest schedule: one forward and one backward per stage."""
    return sum(layer.forward_s + layer.backward_s for layer in profile.layers)


def simulate(
    profile: Profile | dict,
    schedule: list[Op] | list[list],
    *,
    storage: dict[int, str] | None = None,
    policies: dict[int, str] | None = None,
    offload_bandwidth: float | None = None,
) -> Simulation:
    """Replay `schedule` over `profile`.

    Returns a `Simulation`: validity (the first broken rule and its op), time in seconds, peak bytes
    (above fixed memory) and the bytes live during each op. An invalid schedule is a result with
    `valid=False`, not an exception; malformed ops raise `memplan.planner.schema.PlanError`.
    `storage` maps stages i (1..L-1) to the dtype their kept outputs a_i are stored in (see
    NOTE [ Storage precision of checkpoints ] in planner/checkpoint_dtype.py); None: as computed.
    `policies` maps stages to the save policy their `R` ops run under (docs/chain-model.md
    section 10.8); None or unlisted stages: 'all'. An unknown stage or policy raises `PlanError`
    naming `stage_policies.i`. `offload_bandwidth`: host-device bytes per second of each copy
    direction, for the transfer ops (NOTE [ transfer ops in the replay ]); None or 0: a schedule
    with transfer ops is invalid.
    """
    prof = load_profile(profile)
    ops = parse_schedule(schedule)
    return replay(prof, ops, storage, policies, offload_bandwidth=offload_bandwidth)


def nograd_forward_s(prof: Profile) -> list[float]:
    """Seconds of each stage's unrecorded forward (`F`), stages 1..L: `forward_nograd_s` where
    the profile has it, else `forward_s`.

    NOTE [ no-grad forward time ]
    The chain model charges f_i for `F i` and `R i` alike. Under torch.no_grad() a forward records
    nothing for autograd and keeps no saved tensors, and on the CPU it is measurably cheaper (a
    residual MLP block at width 512: about 0.7 x the recorded forward), so a plan's recompute
    overhead was over-predicted by up to a third. The profiler now also times the no-grad forward
    (`forward_nograd_s`), and the simulator and the optimal DP charge it for `F` ops; profiles
    without it (analytic ones, older files) mean the same as before.
    """
    return [layer.forward_s if layer.forward_nograd_s is None else layer.forward_nograd_s
            for layer in prof.layers]


def nograd_forward_temp_bytes(prof: Profile) -> list[int]:
    """Transient bytes of each stage's unrecorded forward (`F`), stages 1..L:
    `forward_nograd_temp_bytes` where the profile has it, else `forward_temp_bytes`.

    NOTE [ no-grad forward bytes ]
    `tf_i` is measured on the recorded forward: its peak minus what it leaves allocated, and what
    it leaves includes the record s_i. Under torch.no_grad() nothing is kept, so the tensors a
    recorded forward saves are freed as the forward goes, and the forward's working set, which
    the chain model would charge as tf_i, can be larger: a tiny GPT block's recorded forward rises
    8,192 bytes above what it leaves (tf_i; nearly everything it makes is saved), its no-grad
    forward 73,728 bytes above its output (its attention and MLP intermediates, for a moment), and
    every `F` op of a plan was 65,536 bytes over its prediction, measured op by op in the executor.
    The profiler measures that transient (`forward_nograd_temp_bytes`), and the simulator and the
    optimal DP charge it for `F` ops; profiles without it mean the same as before.
    """
    return [layer.forward_temp_bytes if layer.forward_nograd_temp_bytes is None
            else layer.forward_nograd_temp_bytes for layer in prof.layers]


def _check_bandwidth(bw: float | None) -> float:
    """`offload_bandwidth` as a float, bytes/s (0.0 for None: no offload); raises `PlanError`."""
    if bw is None:
        return 0.0
    if isinstance(bw, bool) or not isinstance(bw, (int, float)):
        raise PlanError(f"expected bytes per second (a number > 0) or None, got {bw!r}",
                        field="offload_bandwidth")
    if math.isnan(bw) or bw < 0:
        raise PlanError(f"must be a number of bytes per second > 0 (or None: no offload), got {bw}",
                        field="offload_bandwidth")
    return float(bw)


def _window_conflict(op: Op, pend: dict, L: int) -> str | None:
    """Why compute op `op` cannot carry the transfers `pend` ({(kind, j): (k, op name)}, kind 'a'
    for a_j, 'r' for the record of stage j), or None when it can."""
    name = op[0]
    if name == "loss":
        reads = [("a", L)]
        writes: list[tuple[str, int]] = []
    else:
        i = op[1]  # type: ignore[misc]
        reads = [("a", i - 1)] + ([("r", i)] if name == "B" else [])
        writes = [("a", i)] if name in ("F", "R") else []
    for key in reads:
        if key in pend and pend[key][1].startswith("fetch"):
            kind, j = key
            what, how = (f"a_{j}", f"fetch {j}") if kind == "a" else \
                (f"the record of stage {j}", f"fetch_record {j}")
            return (f"{what} is still on the host during this op ({how} rides on it); "
                    "fetch it with the op before")
    for key in writes:
        if key in pend:
            return (f"a_{key[1]} has a transfer pending in this op's window ({pend[key][1]} "
                    f"{key[1]}); it cannot be computed again before that window ends")
    if name == "B" and ("r", op[1]) in pend:  # type: ignore[misc]
        i = op[1]  # type: ignore[misc]
        return (f"the record of stage {i} is being offloaded in this op's window, but B {i} "
                "frees it; offload it with an earlier op or not at all")
    return None


def replay(prof: Profile, ops: list[Op], storage: dict[int, str] | None = None,
           policies: dict[int, str] | None = None, *,
           offload_bandwidth: float | None = None) -> Simulation:
    """`simulate` for a loaded Profile and parsed ops (no validation or conversion: what the
    strategies call on schedules they built). Returns a `Simulation` (seconds, bytes).
    `offload_bandwidth`: bytes/s of each copy direction (None or 0: no transfer ops allowed).

    NOTE [ save policies in the replay ]
    A stage recorded under a policy is replayed as the stage with that policy's fields (its
    record s_i, transients tf_i and tb_i, times f_i and b_i; `F` ops keep the base's no-grad
    time and transient): `Profile.with_policies`. The store-all time that `recompute_s` and
    `overhead` are measured against stays the base profile's, every stage under 'all', so a
    policy's recomputation inside its backward counts as recompute time.

    NOTE [ transfer ops in the replay ]
    docs/chain-model.md section 10.9. The rules, as this loop applies them:
    1. A transfer op (`offload i`, `fetch i`, `offload_record i`, `fetch_record i`) is issued
       with the next compute op (F, R, loss, B; drops may come between): its window. `pend`
       holds the window's transfers until that op, one per tensor.
    2. The window op takes max(t_op, D/bw, H/bw) seconds, D (H) the bytes offloaded (fetched)
       with it; the excess is added to `transfer_wait_s`.
    3. Device bytes: an offloaded tensor is counted on the device through its window op and
       freed after it; a fetched one from its window op on (its `during` included).
    4. Host bytes: from the `offload` op to the end of its fetch's window (or its `drop`); the
       host count at an op is the larger of the counts before and after it.
    5. Needs: offload: the tensor on the device, no transfer of it pending; fetch: the tensor
       on the host (its offload's window done). A tensor on the host cannot be read (F/R i read
       a_{i-1}; B i reads a_{i-1} and record i; loss reads a_L), nor can one being fetched by
       the op's own window; the window op may read a tensor it offloads. A window op may not
       (re)compute an a_i with a transfer pending, nor may `B i` carry the offload of record i
       (it frees the record). `F/R i` with a_i on the host is invalid (drop or fetch it first);
       `R i` with record i on the host is "already has a live record"; a record on the host
       still pins a_{i-1}. `drop i` of an a_i on the host frees its host bytes; with a transfer
       of a_i pending it is invalid.
    6. A transfer with no compute op after it is invalid; transfer ops with a storage map
       (`checkpoint_dtypes`) raise `PlanError`.
    Schedules without transfer ops take none of these branches but two falsy checks per op,
    so the planners' replays keep their speed."""
    base = store_all_time(prof)
    if policies or prof.has_policies:
        try:
            prof = prof.with_policies(policies)
        except ProfileError as err:
            raise PlanError(str(err)) from None
    bw = _check_bandwidth(offload_bandwidth) if offload_bandwidth is not None else 0.0
    if storage and any(op[0] in TRANSFER_OPS for op in ops):
        raise PlanError("offload ops and checkpoint_dtypes are not planned together; plan "
                        "without offload_bandwidth or without checkpoint dtypes",
                        field="checkpoint_dtypes")
    L = prof.n_stages
    x = [prof.input_bytes] + [layer.output_bytes for layer in prof.layers]
    f = [0.0] + [layer.forward_s for layer in prof.layers]
    fn = [0.0] + nograd_forward_s(prof)  # `F` ops (NOTE [ no-grad forward time ])
    b = [0.0] + [layer.backward_s for layer in prof.layers]
    s = [0] + [layer.saved_bytes for layer in prof.layers]
    tf = [0] + [layer.forward_temp_bytes for layer in prof.layers]
    tfn = [0] + nograd_forward_temp_bytes(prof)  # `F` ops (NOTE [ no-grad forward bytes ])
    tb = [0] + [layer.backward_temp_bytes for layer in prof.layers]

    act = [False] * (L + 1)  # a_i live on the device
    act[0] = True
    rec = [False] * (L + 1)  # record s_i live (on the device or the host)
    grad: int | None = None  # index of the live gradient d_i (one at a time)
    next_b = L  # the next stage to run backward
    live = x[0]
    time_s = 0.0
    peak = live
    timeline: list[int] = []
    fwd = [0] * (L + 1)
    checkpoints: list[int] = []
    # storage precision (planner/checkpoint_dtype.py): xs[i] stored bytes of a_i, cast_tmp[i] the
    # transient of its conversion; fresh[i]: produced by F, not yet converted; comp[i]: converted
    xs: dict[int, int] = {}
    cast_tmp: dict[int, int] = {}
    if storage:
        xs, cast_tmp = storage_sizes(prof, storage)
    fresh = [False] * (L + 1)
    comp = [False] * (L + 1)
    converted: list[int] = []
    # offload (NOTE [ transfer ops in the replay ]): ahost[i] / rhost[i]: a_i / record i is on
    # the host and not readable on the device; pend: {(kind, i): (op index, op name)}
    xfer = False  # a transfer op has been seen
    ahost = [False] * (L + 1)
    rhost = [False] * (L + 1)
    pend: dict[tuple[str, int], tuple[int, str]] = {}
    host = 0
    host_peak = 0
    host_timeline: list[int] = []
    wait_s = 0.0
    offloaded = 0

    def result(error: str | None = None, index: int | None = None) -> Simulation:
        rs = max(0.0, time_s - base)
        return Simulation(
            valid=error is None,
            error=error,
            error_index=index,
            time_s=time_s,
            peak_bytes=peak,
            total_peak_bytes=prof.fixed_bytes + peak,
            recompute_s=rs,
            overhead=rs / base if base > 0 else 0.0,
            timeline=timeline,
            forward_counts=fwd[1:],
            checkpoints=checkpoints,
            converted=converted,
            host_peak_bytes=host_peak,
            transfer_wait_s=wait_s,
            offloaded_bytes=offloaded,
            host_timeline=host_timeline,
        )

    def fail(k: int, op: Op, why: str) -> Simulation:
        return result(f"op {k} {list(op)}: {why}", k)

    def on_host(j: int) -> str:  # the error of reading a_j where it is on the host
        return f"a_{j} is on the host; fetch it (fetch {j}) with the op before"

    window = None  # the transfers the current compute op carries
    hfreed = 0  # host bytes a `drop` of an a_i on the host frees
    for k, op in enumerate(ops):
        name = op[0]
        if next_b == 0 and name != "drop" and name not in TRANSFER_OPS:  # the step ended with
            # B 1 (docs/chain-model.md section 5); a trailing transfer fails for want of a carrier
            return fail(k, op, "the step has ended with B 1; only drops may follow it")
        if pend and name != "drop" and name not in TRANSFER_OPS:
            # the compute op that carries the pending transfers (rule 1)
            why = _window_conflict(op, pend, L)
            if why:
                return fail(k, op, why)
            window, pend = pend, {}
            D = H = 0
            for (kind, j), (_, what) in window.items():
                if what == "fetch":  # on the device from this op on (rule 3)
                    act[j], ahost[j] = True, False
                    live += x[j]
                    H += x[j]
                elif what == "fetch_record":
                    rhost[j] = False
                    live += s[j]
                    H += s[j]
                else:
                    D += x[j] if kind == "a" else s[j]
            t0 = time_s
        if name == "loss":
            if not act[L]:
                if ahost[L]:
                    return fail(k, op, on_host(L))
                return fail(k, op, f"a_{L} is not live (run stage {L} forward first)")
            if grad is not None or next_b != L:
                return fail(k, op, "the loss gradient already exists (run loss once)")
            during = live + x[L]
            live += x[L]
            grad = L
            # kept for recomputation only: live (or on the host), and not pinned by the next
            # stage's record
            checkpoints = [i for i in range(1, L) if (act[i] or ahost[i]) and not rec[i + 1]]
        else:
            i = op[1]  # type: ignore[misc]
            if not 1 <= i <= L:
                if i == 0 and name in ("offload", "fetch"):
                    return fail(k, op, "a_0 (the input) is never offloaded: the training loop "
                                "owns it")
                return fail(k, op, f"stage index {i} is out of range 1..{L}")
            if name in ("F", "R"):
                if not act[i - 1]:
                    if ahost[i - 1]:
                        return fail(k, op, on_host(i - 1))
                    return fail(k, op, f"its input a_{i - 1} is not live")
                if name == "R" and rec[i]:
                    return fail(k, op, f"stage {i} already has a live record")
                if xfer and ahost[i] and not act[i]:
                    return fail(k, op, f"a_{i} is on the host; drop it (drop {i}) or fetch it "
                                "before computing it again")
                j = i - 1
                upcast = 0  # a stored a_j read by F: a temporary copy in its compute dtype
                restore = 0  # a stored a_j read by R: restored to its compute dtype (pinned)
                if comp[j]:
                    if name == "F":
                        upcast = x[j]
                    else:
                        restore = live + x[j]
                        live += x[j] - xs[j]
                        comp[j] = False
                if comp[i] and not (i < L and rec[i + 1]):
                    # a live, unpinned stored a_i is freed before it is recomputed (the runner)
                    live -= xs[i]
                    act[i] = comp[i] = False
                new = 0 if act[i] else x[i]
                if name == "R":
                    during = max(restore, live + new + s[i] + tf[i])
                    live += new + s[i]
                    rec[i] = True
                else:
                    during = live + upcast + new + tfn[i]
                    live += new
                if xs:
                    if new and i in xs:
                        fresh[i] = name == "F"
                    if fresh[j]:
                        # the first reader used a_j as computed; store it now, unless dropped next
                        fresh[j] = False
                        if name == "F" and ops[k + 1 : k + 2] != [("drop", j)]:
                            during = max(during, live + xs[j] + cast_tmp[j])
                            live += xs[j] - x[j]
                            comp[j] = True
                            converted.append(j)
                act[i] = True
                fwd[i] += 1
                time_s += f[i] if name == "R" else fn[i]
            elif name == "drop":
                if pend and ("a", i) in pend:
                    return fail(k, op, f"a_{i} has a transfer pending ({pend['a', i][1]} {i} "
                                "rides on the next compute op); drop it after that op")
                if not act[i]:
                    if not ahost[i]:
                        return fail(k, op, f"a_{i} is not live")
                    if i < L and rec[i + 1]:
                        return fail(k, op, f"a_{i} is pinned by the live record of stage {i + 1}")
                    ahost[i] = False  # a copy on the host: frees host bytes only (rule 5)
                    host -= x[i]
                    hfreed = x[i]
                    during = live
                else:
                    if i < L and rec[i + 1]:
                        return fail(k, op, f"a_{i} is pinned by the live record of stage {i + 1}")
                    during = live
                    live -= xs[i] if comp[i] else x[i]
                    act[i] = False
                    comp[i] = fresh[i] = False
            elif name == "B":
                if i != next_b:
                    return fail(k, op, f"backward must run B {next_b} next (B L..1, each once)")
                if grad != i:
                    return fail(k, op, f"the gradient d_{i} is not live (run loss first)")
                if not rec[i]:
                    return fail(k, op, f"stage {i} has no live record (run R {i} first)")
                if rhost[i]:
                    return fail(k, op, f"the record of stage {i} is on the host; fetch it "
                                f"(fetch_record {i}) with the op before")
                if not act[i - 1]:
                    if ahost[i - 1]:
                        return fail(k, op, on_host(i - 1))
                    return fail(k, op, f"its input a_{i - 1} is not live")
                during = live + x[i - 1] + tb[i]
                live += x[i - 1] - x[i] - s[i]
                rec[i] = False
                grad = i - 1
                next_b -= 1
                time_s += b[i]
            else:  # a transfer op (NOTE [ transfer ops in the replay ])
                if not bw:
                    return fail(k, op, f"{name} needs offload_bandwidth > 0")
                if not xfer:
                    xfer = True
                    host_timeline = [0] * k
                key = ("a" if name in ("offload", "fetch") else "r", i)
                if key in pend:
                    return fail(k, op, f"{pend[key][1]} {i} (op {pend[key][0]}) is already "
                                "pending in this window; one transfer of a tensor per window")
                if name == "offload":
                    if not act[i]:
                        if ahost[i]:
                            return fail(k, op, f"a_{i} is already on the host")
                        return fail(k, op, f"a_{i} is not live on the device")
                    ahost[i] = True
                    host += x[i]
                    offloaded += x[i]
                elif name == "offload_record":
                    if not rec[i]:
                        return fail(k, op, f"stage {i} has no live record (run R {i} first)")
                    if rhost[i]:
                        return fail(k, op, f"the record of stage {i} is already on the host")
                    rhost[i] = True
                    host += s[i]
                    offloaded += s[i]
                elif name == "fetch":
                    if not ahost[i]:
                        return fail(k, op, f"a_{i} is not on the host (offload {i} puts it there)")
                else:
                    if not rhost[i]:
                        return fail(k, op, f"the record of stage {i} is not on the host "
                                    f"(offload_record {i} puts it there)")
                pend[key] = (k, name)
                during = live
        timeline.append(during)
        if during > peak:
            peak = during
        if xfer:
            h = host + hfreed  # the host count at this op: before a drop or a window frees it
            hfreed = 0
            if window is not None:  # the window ends with its op (rules 2-4)
                for (_kind, j), (_, what) in window.items():
                    if what == "offload":
                        act[j] = False
                        live -= x[j]
                    elif what == "offload_record":
                        live -= s[j]
                    elif what == "fetch":
                        host -= x[j]
                    else:
                        host -= s[j]
                window = None
                t_op = time_s - t0
                dt = max(t_op, D / bw, H / bw)
                if dt > t_op:
                    wait_s += dt - t_op
                    time_s = t0 + dt
            host_timeline.append(h)
            if h > host_peak:
                host_peak = h

    if pend:
        k0, what = min(pend.values())
        return fail(k0, ops[k0], "no compute op follows it to carry it (a transfer rides on the "
                    "next F, R, loss or B)")
    if next_b != 0:
        return fail(len(ops), ("B", next_b), f"the schedule ends before it (it must run B {L}..1)")
    return result()
