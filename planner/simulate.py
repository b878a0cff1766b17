"""Replay a schedule under the chain model: the single source of every time and peak memplan predicts.

Rules: docs/chain-model.md, section 5 ("The rules of the replay"). Memory is counted in bytes
above `fixed_bytes`; `a_0` (the input) is live throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memplan.planner.schema import Op, PlanError, parse_schedule
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
) -> Simulation:
    """Replay `schedule` over `profile`.

    Returns a `Simulation`: validity (the first broken rule and its op), time in seconds, peak bytes
    (above fixed memory) and the bytes live during each op. An invalid schedule is a result with
    `valid=False`, not an exception; malformed ops raise `memplan.planner.schema.PlanError`.
    `storage` maps stages i (1..L-1) to the dtype their kept outputs a_i are stored in (see
    NOTE [ Storage precision of checkpoints ] in planner/checkpoint_dtype.py); None: as computed.
    `policies` maps stages to the save policy their `R` ops run under (docs/chain-model.md
    section 10.8); None or unlisted stages: 'all'. An unknown stage or policy raises `PlanError`
    naming `stage_policies.i`.
    """
    prof = load_profile(profile)
    ops = parse_schedule(schedule)
    return replay(prof, ops, storage, policies)


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


def replay(prof: Profile, ops: list[Op], storage: dict[int, str] | None = None,
           policies: dict[int, str] | None = None) -> Simulation:
    """`simulate` for a loaded Profile and parsed ops (no validation or conversion: what the
    strategies call on schedules they built). Returns a `Simulation` (seconds, bytes).

    NOTE [ save policies in the replay ]
    A stage recorded under a policy is replayed as the stage with that policy's fields (its
    record s_i, transients tf_i and tb_i, times f_i and b_i; `F` ops keep the base's no-grad
    time and transient): `Profile.with_policies`. The store-all time that `recompute_s` and
    `overhead` are measured against stays the base profile's, every stage under 'all', so a
    policy's recomputation inside its backward counts as recompute time."""
    base = store_all_time(prof)
    if policies or prof.has_policies:
        try:
            prof = prof.with_policies(policies)
        except ProfileError as err:
            raise PlanError(str(err)) from None
    L = prof.n_stages
    x = [prof.input_bytes] + [layer.output_bytes for layer in prof.layers]
    f = [0.0] + [layer.forward_s for layer in prof.layers]
    fn = [0.0] + nograd_forward_s(prof)  # `F` ops (NOTE [ no-grad forward time ])
    b = [0.0] + [layer.backward_s for layer in prof.layers]
    s = [0] + [layer.saved_bytes for layer in prof.layers]
    tf = [0] + [layer.forward_temp_bytes for layer in prof.layers]
    tfn = [0] + nograd_forward_temp_bytes(prof)  # `F` ops (NOTE [ no-grad forward bytes ])
    tb = [0] + [layer.backward_temp_bytes for layer in prof.layers]

    act = [False] * (L + 1)  # a_i live
    act[0] = True
    rec = [False] * (L + 1)  # record s_i live
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
        )

    def fail(k: int, op: Op, why: str) -> Simulation:
        return result(f"op {k} {list(op)}: {why}", k)

    for k, op in enumerate(ops):
        name = op[0]
        if name == "loss":
            if not act[L]:
                return fail(k, op, f"a_{L} is not live (run stage {L} forward first)")
            if grad is not None or next_b != L:
                return fail(k, op, "the loss gradient already exists (run loss once)")
            during = live + x[L]
            live += x[L]
            grad = L
            # kept for recomputation only: live, and not pinned by the next stage's record
            checkpoints = [i for i in range(1, L) if act[i] and not rec[i + 1]]
        else:
            i = op[1]  # type: ignore[misc]
            if not 1 <= i <= L:
                return fail(k, op, f"stage index {i} is out of range 1..{L}")
            if name in ("F", "R"):
                if not act[i - 1]:
                    return fail(k, op, f"its input a_{i - 1} is not live")
                if name == "R" and rec[i]:
                    return fail(k, op, f"stage {i} already has a live record")
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
                if not act[i]:
                    return fail(k, op, f"a_{i} is not live")
                if i < L and rec[i + 1]:
                    return fail(k, op, f"a_{i} is pinned by the live record of stage {i + 1}")
                during = live
                live -= xs[i] if comp[i] else x[i]
                act[i] = False
                comp[i] = fresh[i] = False
            else:  # "B"
                if i != next_b:
                    return fail(k, op, f"backward must run B {next_b} next (B L..1, each once)")
                if grad != i:
                    return fail(k, op, f"the gradient d_{i} is not live (run loss first)")
                if not rec[i]:
                    return fail(k, op, f"stage {i} has no live record (run R {i} first)")
                if not act[i - 1]:
                    return fail(k, op, f"its input a_{i - 1} is not live")
                during = live + x[i - 1] + tb[i]
                live += x[i - 1] - x[i] - s[i]
                rec[i] = False
                grad = i - 1
                next_b -= 1
                time_s += b[i]
        timeline.append(during)
        if during > peak:
            peak = during

    if next_b != 0:
        return fail(len(ops), ("B", next_b), f"the schedule ends before it (it must run B {L}..1)")
    return result()

