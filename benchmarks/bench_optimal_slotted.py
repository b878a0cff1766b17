# ruff: noqa: B023  (each lambda is called at once, inside its loop iteration)
"""Slotted mode of the optimal planner: solve times and certified gaps at 60/100/200 stages
(GPT-like and random chains), against exact and the memoised-recursion oracle where they run.
    .venv/bin/python benchmarks/bench_optimal_slotted.py [--quick]
Prints a table, writes benchmarks/results/bench_optimal_slotted.json. Results: docs/planner.md.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memplan.planner._optimal_dp import costs_of, least_peak  # noqa: E402
from memplan.planner.optimal import plan_optimal  # noqa: E402

from benchmarks.bench_optimal import gpt_chain, slot_chain, timed  # noqa: E402
from tests.planner.oracle import memo_time  # noqa: E402


def fmt(v, f):
    return "-" if v is None else format(v, f)


def main() -> None:
    quick = "--quick" in sys.argv
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'chain':10} {'L':>5} {'slotted s':>9} {'slots':>6} {'gap':>7} {'exact s':>8} "
          f"{'time/exact':>10} {'oracle s':>9} {'speed-up':>8}")
    cases = [("random", 60), ("gpt", 60), ("gpt", 100)] if quick else [
        ("random", 60), ("gpt", 60), ("random", 100), ("gpt", 100), ("gpt", 200), ("random", 200)]
    for kind, L in cases:
        prof = gpt_chain(L) if kind == "gpt" else slot_chain(L, seed=L)
        c = costs_of(prof)
        least = least_peak(c)
        B = int(least + 0.15 * (sum(c.x) + sum(c.s) - least))
        plan, t_s = timed(lambda: plan_optimal(prof, B, mode="slotted"))
        row = dict(chain=prof.name, L=L, slotted_s=t_s, slots=plan.options["slots"],
                   gap=plan.options["optimality_gap"], time_s=plan.predicted.time_s,
                   lower_s=plan.options["lower_bound_s"], exact_s=None, ratio=None, oracle_s=None)
        if L <= 60:
            ex, t_e = timed(lambda: plan_optimal(prof, B, mode="exact"))
            row.update(exact_s=t_e, ratio=plan.predicted.time_s / ex.predicted.time_s)
            if kind == "random":  # sizes are whole MiB: the oracle's memo runs in MiB slots
                _, t_o = timed(lambda: memo_time(prof, B - B % 2**20, unit=2**20))
                row["oracle_s"] = t_o
        rows.append(row)
        print(f"{prof.name:10} {L:5} {t_s:9.3f} {row['slots']:6} {row['gap']:7.3%} "
              f"{fmt(row['exact_s'], '8.3f'):>8} {fmt(row['ratio'], '10.5f'):>10} "
              f"{fmt(row['oracle_s'], '9.3f'):>9} "
              f"{fmt(row['oracle_s'] and row['oracle_s'] / t_s, '7.1f'):>7}x")
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_optimal_slotted.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
