"""sqrt(n) checkpointing (Chen et al. 2016, "Training deep nets with sublinear memory cost"):
about sqrt(L) segments, balanced by forward time rather than by stage count."""

from __future__ import annotations

import math

from memplan.planner._build import finish_plan, one_level_ops
from memplan.planner.schema import Plan
from memplan.profiler.schema import Profile

__all__ = ["plan_sqrt", "sqrt_segments"]


def sqrt_segments(profile: Profile) -> list[tuple[int, int, bool]]:
    """round(sqrt(L)) contiguous segments whose forward times are as equal as the cuts allow."""
    L = profile.n_stages
    n_seg = max(1, min(L, round(math.sqrt(L))))
    f = [layer.forward_s for layer in profile.layers]
    total = sum(f)
    if total <= 0:  # no timings: balance by count
        f, total = [1.0] * L, float(L)
    cuts: list[int] = []  # last stage of each segment but the final one
    acc = 0.0
    for i in range(1, L + 1):
        acc += f[i - 1]
        remaining_cuts = n_seg - 1 - len(cuts)
        if remaining_cuts <= 0:
            break
        target = total * (len(cuts) + 1) / n_seg
        # cut here when this stage's end is nearer the target than the next one's, leaving
        # enough stages for the segments still to come
        nxt = acc + (f[i] if i < L else 0.0)
        must = L - i == remaining_cuts
        if i < L and (must or (acc >= target or abs(acc - target) <= abs(nxt - target))):
            cuts.append(i)
    bounds, p = [], 1
    for q in cuts + [L]:
        bounds.append((p, q))
        p = q + 1
    return [(p, q, n < len(bounds) - 1) for n, (p, q) in enumerate(bounds)]


def plan_sqrt(profile: Profile, budget_bytes: int | None = None) -> Plan:
    """The sqrt(L) plan; infeasible (with its schedule and prediction) when its peak is over."""
    segs = sqrt_segments(profile)
    ops = one_level_ops(segs, profile.n_stages)
    return finish_plan(
        profile, ops, strategy="sqrt", budget_bytes=budget_bytes,
        message=f"{len(segs)} segments balanced by forward time",
        options={"segments": [[p, q] for p, q, _ in segs]},
    )
