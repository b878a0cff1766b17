# ruff: noqa: B023  (each lambda is called at once, inside its loop iteration)
"""Optimal planner: solve times, the speed-up over the plain memoised recursion (the tests' oracle)
on the same chains and budgets, and grouped mode against exact. Run:
    .venv/bin/python benchmarks/bench_optimal.py [--quick]
Prints a table and writes benchmarks/results/bench_optimal.json. Results: docs/planner.md.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner._optimal_dp import costs_of, least_peak  # noqa: E402
from planner.optimal import plan_optimal  # noqa: E402
from profiler.schema import Profile  # noqa: E402
from tests.planner.chains import chain  # noqa: E402
from tests.planner.oracle import memo_time  # noqa: E402


def slot_chain(L: int, seed: int) -> Profile:
    """Heterogeneous chain, sizes in whole slots of 1 MiB (so the oracle's memo is in slots)."""
    r = random.Random(seed)
    u = 2**20
    return chain([r.randint(1, 6) * u for _ in range(L + 1)],
                 [r.uniform(1, 6) * 1e-3 for _ in range(L)], [r.uniform(1, 6) * 1e-3 for _ in range(L)],
                 [r.randint(0, 6) * u for _ in range(L)], [r.randint(0, 3) * u for _ in range(L)],
                 [r.randint(0, 3) * u for _ in range(L)], name=f"slots{L}")


def gpt_chain(L: int) -> Profile:
    """examples/gpt24.json stretched to L stages (embed, L-2 blocks, head), real byte sizes."""
    d = json.loads((REPO / "examples" / "gpt24.json").read_text())
    block = next(la for la in d["layers"] if la["kind"] == "block")
    d["layers"] = [d["layers"][0]] + [dict(block, name=f"block.{i}") for i in range(L - 2)] + [d["layers"][-1]]
    d["name"] = f"gpt{L}"
    return Profile.model_validate(d)


def budget_at(prof: Profile, frac: float) -> int:
    least = least_peak(costs_of(prof))
    top = plan_optimal(prof, None, exact_max_stages=10**6).predicted.peak_bytes if prof.n_stages <= 64 else None
    if top is None:
        c = costs_of(prof)
        top = sum(c.x) + sum(c.s) + max(c.tf_r) + max(c.tb)
    return int(least + frac * (top - least))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    quick = "--quick" in sys.argv
    rows = []
    print(f"{'chain':10} {'L':>5} {'mode':8} {'ours s':>8} {'oracle s':>9} {'speed-up':>9} {'time ratio':>10}")
    for L in ((20, 40) if quick else (20, 40, 60)):
        prof = slot_chain(L, seed=L)
        B = budget_at(prof, 0.3)
        plan, ours = timed(lambda: plan_optimal(prof, B, exact_max_stages=10**6))
        ref, oracle = timed(lambda: memo_time(prof, B, unit=2**20))
        assert abs(plan.predicted.time_s - ref) <= 1e-9 * ref, (plan.predicted.time_s, ref)
        rows.append(dict(chain=prof.name, L=L, mode="exact", ours_s=ours, oracle_s=oracle,
                         speedup=oracle / ours, ratio=1.0))
        print(f"{prof.name:10} {L:5} {'exact':8} {ours:8.3f} {oracle:9.3f} {oracle / ours:9.1f}x {1.0:10.4f}")
    for L in ((60,) if quick else (60, 100)):
        prof = gpt_chain(L)
        B = budget_at(prof, 0.15)
        exact, t_exact = timed(lambda: plan_optimal(prof, B, exact_max_stages=10**6))
        grouped, t_grp = timed(lambda: plan_optimal(prof, B, exact_max_stages=1))
        ratio = grouped.predicted.time_s / exact.predicted.time_s
        rows.append(dict(chain=prof.name, L=L, mode="exact", ours_s=t_exact, oracle_s=None, speedup=None, ratio=1.0))
        rows.append(dict(chain=prof.name, L=L, mode="grouped", ours_s=t_grp, oracle_s=None, speedup=None, ratio=ratio))
        print(f"{prof.name:10} {L:5} {'exact':8} {t_exact:8.3f} {'-':>9} {'-':>9} {1.0:10.4f}")
        print(f"{prof.name:10} {L:5} {'grouped':8} {t_grp:8.3f} {'-':>9} {'-':>9} {ratio:10.4f}")
    for L in ((200,) if quick else (200, 1000)):
        prof = gpt_chain(L)
        grouped, t_grp = timed(lambda: plan_optimal(prof, None, max_overhead=0.3))
        rows.append(dict(chain=prof.name, L=L, mode="grouped", ours_s=t_grp, oracle_s=None, speedup=None,
                         ratio=None, overhead=grouped.predicted.overhead,
                         peak_bytes=grouped.predicted.peak_bytes))
        print(f"{prof.name:10} {L:5} {'grouped':8} {t_grp:8.3f} {'-':>9} {'-':>9} {'n/a':>10}"
              f"  (least memory within +30%: {grouped.predicted.peak_bytes} B, +{grouped.predicted.overhead:.1%})")
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_optimal.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
