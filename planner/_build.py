"""Shared plumbing for strategies: drop insertion, one-level schedules, and Plan assembly."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from memplan.planner.schema import TRANSFER_OPS, Op, Plan, PlanError, Predicted
from memplan.planner.simulate import Simulation, replay
from memplan.profiler.schema import Profile

__all__ = ["insert_drops", "one_level_ops", "finish_plan", "infeasible_plan", "check_budget"]


def insert_drops(compute: Sequence[Op], n_stages: int) -> list[Op]:
    """`compute` (F, R, loss, B ops, and transfer ops if any) with each `drop i` placed as early as
    the rules allow. Returns the ops (tuples), the input's in their order with drops between.

    For a fixed sequence of computations, dropping an activation as soon as it is neither pinned by
    a live record nor needed before it is next (re)computed never raises the peak and costs no time,
    so strategies describe only what they compute and this pass frees memory for all of them.

    NOTE [ drops around transfer ops ]
    docs/chain-model.md section 10.9.
    1. A transfer op is not a touch: no drop is placed right after one (it would land inside its
       window). Its window op (the next F, R, loss or B) touches the tensors the window moves,
       besides what it reads and makes.
    2. `offload j` and `fetch j` count as reads of a_j: an a_j fetched later is read again, so
       it is not dropped while on the host, and an a_j is kept until its offload is issued.
    3. So an a_j offloaded and never read again (no fetch, no read before it is made again) is
       dropped right after its window, which frees its host bytes.
    4. Records are never dropped (B frees them): their transfers change nothing here.
    Schedules without transfer ops come out exactly as before.
    """
    L = n_stages
    uses: list[list[int]] = [[] for _ in range(L + 1)]  # positions of ops that read a_i
    creates: list[list[int]] = [[] for _ in range(L + 1)]  # positions of ops that (re)compute a_i
    for k, op in enumerate(compute):
        name = op[0]
        if name == "loss":
            uses[L].append(k)
        elif name in TRANSFER_OPS:
            if name in ("offload", "fetch"):  # rule 2
                uses[op[1]].append(k)  # type: ignore[misc]
        else:
            i = op[1]  # type: ignore[misc]
            uses[i - 1].append(k)
            if name in ("F", "R"):
                creates[i].append(k)

    def needed_after(j: int, k: int) -> bool:
        u = bisect_right(uses[j], k)
        if u == len(uses[j]):
            return False
        next_use = uses[j][u]
        c = bisect_right(creates[j], k)
        return c == len(creates[j]) or creates[j][c] > next_use

    live = [False] * (L + 1)
    rec = [False] * (L + 2)
    moved: list[int] = []  # activations moved by the transfers waiting for their window
    out: list[Op] = []
    for k, op in enumerate(compute):
        out.append(op)
        name = op[0]
        if name in TRANSFER_OPS:  # rule 1
            if name in ("offload", "fetch"):
                moved.append(op[1])  # type: ignore[arg-type]
            continue
        if name == "loss":
            touched: tuple[int, ...] = (L,)
        else:
            i = op[1]  # type: ignore[misc]
            if name == "R":
                rec[i] = True
            if name == "B":
                rec[i] = False
            if name in ("F", "R"):
                live[i] = True
                touched = (i - 1, i)
            else:
                touched = (i - 1,)
        if moved:  # the window op touches what its window moves (rule 1)
            touched += tuple(j for j in moved if j not in touched)
            moved = []
        for j in touched:
            if j > 0 and live[j] and not rec[j + 1] and not needed_after(j, k):
                out.append(("drop", j))
                live[j] = False
    return out


def one_level_ops(segments: Sequence[tuple[int, int, bool]], n_stages: int) -> list[Op]:
    """The schedule of a one-level plan (torch.utils.checkpoint style), drops included.

    `segments` covers 1..L in order as (p, q, recompute). A recomputed segment runs `F p..q` in the
    forward, keeping only its input a_{p-1}, and `R p..q` when the backward reaches it; the others
    are recorded in the forward (`R p..q`) and never rerun.
    """
    _check_segments(segments, n_stages)
    compute: list[Op] = []
    for p, q, recompute in segments:
        compute.extend(("F" if recompute else "R", i) for i in range(p, q + 1))
    compute.append(("loss",))
    for p, q, recompute in reversed(segments):
        if recompute:
            compute.extend(("R", i) for i in range(p, q + 1))
        compute.extend(("B", i) for i in range(q, p - 1, -1))
    return insert_drops(compute, n_stages)


def _check_segments(segments: Sequence[tuple[int, int, bool]], n_stages: int) -> None:
    expect = 1
    for p, q, _ in segments:
        if p != expect or q < p:
            raise PlanError(f"segments: expected a segment starting at stage {expect}, got {p}..{q}")
        expect = q + 1
    if expect != n_stages + 1:
        raise PlanError(f"segments: they end at stage {expect - 1}, not at the last stage {n_stages}")


def check_budget(budget_bytes: int | None) -> int | None:
    """The budget, validated: a non-negative integer number of bytes, or None for no limit."""
    if budget_bytes is None:
        return None
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)):
        raise PlanError(f"budget_bytes: expected a number of bytes, got {budget_bytes!r}")
    if budget_bytes != budget_bytes or budget_bytes in (float("inf"), float("-inf")):
        raise PlanError("budget_bytes: must be a finite number of bytes, not NaN or infinity")
    if budget_bytes < 0:
        raise PlanError(f"budget_bytes: must be at least 0, got {budget_bytes}")
    return int(budget_bytes)


def predicted(sim: Simulation) -> Predicted:
    """The Plan's prediction block from a replay."""
    return Predicted(
        time_s=sim.time_s,
        peak_bytes=sim.peak_bytes,
        total_peak_bytes=sim.total_peak_bytes,
        recompute_s=sim.recompute_s,
        overhead=sim.overhead,
        host_peak_bytes=sim.host_peak_bytes,
        transfer_wait_s=sim.transfer_wait_s,
    )


def finish_plan(
    profile: Profile,
    ops: list[Op],
    *,
    strategy: str,
    budget_bytes: int | None,
    message: str = "",
    options: dict | None = None,
    sim: Simulation | None = None,
    policies: dict[int, str] | None = None,
    offload_bandwidth: float | None = None,
    host_memory_bytes: int | None = None,
) -> Plan:
    """A Plan for `ops`, with its prediction from a replay; infeasible when it breaks the budget
    (its peak above `budget_bytes`, or its host peak above `host_memory_bytes`; None: no limit).
    `policies`: the save policy of each recorded stage ({stage: name}; unlisted: 'all').
    `offload_bandwidth`: bytes/s of host-device copies, for schedules with transfer ops."""
    sim = sim or replay(profile, ops, None, policies, offload_bandwidth=offload_bandwidth)
    if not sim.valid:  # a strategy bug, never the user's input
        raise AssertionError(f"{strategy} produced an invalid schedule: {sim.error}")
    fits = budget_bytes is None or sim.peak_bytes <= budget_bytes
    if not fits:
        message = (
            f"peak {sim.peak_bytes} bytes exceeds the budget of {budget_bytes} bytes"
            + (f"; {message}" if message else "")
        )
    if host_memory_bytes is not None and sim.host_peak_bytes > host_memory_bytes:
        fits = False
        message = (
            f"host peak {sim.host_peak_bytes} bytes exceeds host_memory_bytes "
            f"{host_memory_bytes}" + (f"; {message}" if message else "")
        )
    return Plan(
        strategy=strategy,
        budget_bytes=budget_bytes,
        feasible=fits,
        message=message,
        schedule=[list(op) for op in ops],
        predicted=predicted(sim),
        n_stages=profile.n_stages,
        profile_fingerprint=profile.fingerprint(),
        checkpoints=sim.checkpoints,
        recomputed=[i + 1 for i, n in enumerate(sim.forward_counts) if n > 1],
        options=options or {},
        stage_policies=dict(policies or {}),
    )


def infeasible_plan(
    profile: Profile,
    *,
    strategy: str,
    budget_bytes: int | None,
    least_bytes: int,
    options: dict | None = None,
) -> Plan:
    """An infeasible Plan that says the least budget at which the strategy finds a schedule."""
    return Plan(
        strategy=strategy,
        budget_bytes=budget_bytes,
        feasible=False,
        message=(
            f"no {strategy} schedule fits {budget_bytes} bytes; the least budget it fits is "
            f"{least_bytes} bytes (raise the budget or try strategy 'optimal')"
        ),
        n_stages=profile.n_stages,
        profile_fingerprint=profile.fingerprint(),
        options=options or {},
    )
