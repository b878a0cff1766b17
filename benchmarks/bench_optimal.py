# ruff: noqa: B023  (each lambda is called at once, inside its loop iteration)
"""Optimal planner: exact solve times (compiled), the speed-up over the pure-Python reference DP and
the plain memoised recursion (the tests' oracle) on the same chains and budgets, grouped mode
against exact at 100 and 200 stages, and grouped mode at 1,000 stages. Run:
    .venv/bin/python benchmarks/bench_optimal.py [--quick]
Prints a table and writes benchmarks/results/bench_optimal.json. Results: docs/planner.md.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memplan.planner._optimal_dp import costs_of, solve  # noqa: E402
from memplan.planner._optimal_kernel import get_num_threads, solve_compiled  # noqa: E402
from memplan.planner._optimal_kernel import least_peak_compiled as least_peak  # noqa: E402
from memplan.planner.optimal import DEFAULT_GROUPS, plan_optimal  # noqa: E402
from memplan.profiler.schema import Profile  # noqa: E402

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


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def budgets(prof: Profile, fracs=(0.05, 0.15, 0.3)) -> list[int]:
    """Budgets (bytes) at `fracs` of the way from the least peak to store-all's: its exact peak up
    to 64 stages, a cheap upper bound above."""
    c = costs_of(prof)
    least = least_peak(c)
    if prof.n_stages <= 64:
        top = plan_optimal(prof, None, mode="exact").predicted.peak_bytes
    else:
        top = sum(c.x) + sum(c.s) + max(c.tf_r) + max(c.tb)
    return [int(least + f * (top - least)) for f in fracs]


def main() -> None:
    quick = "--quick" in sys.argv
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; numba threads "
          f"{get_num_threads()}")
    _, t_jit = timed(lambda: solve_compiled(costs_of(slot_chain(4, 0))))
    print(f"kernel compile or cache load: {t_jit:.2f} s (once per process)")
    rows.append(dict(kind="jit", seconds=t_jit))

    print(f"\n{'chain':10} {'L':>4} {'exact s':>8} {'python s':>9} {'oracle s':>9} "
          f"{'vs python':>9} {'vs oracle':>9}")
    for L in ((20, 40) if quick else (20, 40, 60)):
        prof = slot_chain(L, seed=L)
        B = budgets(prof, (0.3,))[0]
        c = costs_of(prof)
        plan, ours = timed(lambda: plan_optimal(prof, B, mode="exact"))
        _, t_py = timed(lambda: solve(c, cap=B))
        ref, oracle = timed(lambda: memo_time(prof, B, unit=2**20))
        assert abs(plan.predicted.time_s - ref) <= 1e-9 * ref, (plan.predicted.time_s, ref)
        rows.append(dict(kind="oracle", chain=prof.name, L=L, exact_s=ours, python_s=t_py,
                         oracle_s=oracle))
        print(f"{prof.name:10} {L:4} {ours:8.3f} {t_py:9.3f} {oracle:9.3f} {t_py / ours:8.1f}x "
              f"{oracle / ours:8.1f}x")

    print(f"\n{'chain':10} {'L':>4} {'budget':>6} {'exact s':>8} {'grouped s':>9} {'groups':>6} "
          f"{'grouped/exact':>13}")
    for L in ((100,) if quick else (100, 200)):
        for prof in (gpt_chain(L), slot_chain(L, seed=L)):
            for frac, B in zip((0.05, 0.15, 0.3), budgets(prof), strict=True):
                ex, t_ex = timed(lambda: plan_optimal(prof, B, mode="exact"))
                G = DEFAULT_GROUPS if L > DEFAULT_GROUPS else L // 2
                gr, t_gr = timed(lambda: plan_optimal(prof, B, mode="grouped", groups=G))
                ratio = gr.predicted.time_s / ex.predicted.time_s
                rows.append(dict(kind="exact", chain=prof.name, L=L, frac=frac, exact_s=t_ex,
                                 grouped_s=t_gr, groups=G, ratio=ratio))
                print(f"{prof.name:10} {L:4} {frac:6.0%} {t_ex:8.3f} {t_gr:9.3f} {G:6} {ratio:13.5f}")

    for L in (() if quick else (1000,)):
        for prof in (gpt_chain(L), slot_chain(L, seed=L)):
            for frac, B in zip((0.05, 0.15, 0.3), budgets(prof), strict=True):
                gr, t_gr = timed(lambda: plan_optimal(prof, B))
                rows.append(dict(kind="grouped", chain=prof.name, L=L, frac=frac, grouped_s=t_gr,
                                 groups=len(gr.options["groups"]), time_s=gr.predicted.time_s))
                print(f"{prof.name:10} {L:4} {frac:6.0%} {'-':>8} {t_gr:9.3f} "
                      f"{len(gr.options['groups']):6} {'n/a':>13}")
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_optimal.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
