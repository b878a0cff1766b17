# ruff: noqa: B023  (each lambda is called at once, inside its loop iteration)
"""Optimal planner: exact solve times (compiled), the speed-up over the pure-Python reference DP and
the plain memoised recursion (the tests' oracle) on the same chains and budgets, grouped mode
against exact at 100 and 200 stages, and the long-chain table: "auto" (memo or banded) on random
and transformer-like chains of 300, 500 and 1,000 stages at 10%, 20% and 40% of the store-all peak,
each plan's time, mode, certified gap and its time against the exact optimum kept in
benchmarks/data/optimal_exact.json (benchmarks/bench_optimal_exact.py computes those once), and the
frontier of those chains at 300 and 1,000 stages (mode, time, each point's certified gap). Run:
    .venv/bin/python benchmarks/bench_optimal.py [--quick] [--long-only] [--blocks-only] [--frontier]
(--blocks-only: the long table's transformer-like chains alone, memo mode, about a minute; run it
also with NUMBA_NUM_THREADS=1 for one thread's wall time, which a shared machine's load inflates
less than two threads'. --frontier: `frontier(points=50)` of the long table's chains at 300 and
1,000 stages: mode, time, and each point's certified gap.)
Prints tables and writes benchmarks/results/bench_optimal.json. Results: docs/planner.md.
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


LONG_LENGTHS = (300, 500, 1000)  # the long-chain table's lengths (stages)
LONG_FRACS = (0.1, 0.2, 0.4)  # its budgets, fractions of the store-all peak


def long_chains(L: int, blocks_only: bool = False) -> list[Profile]:
    """The long-chain table's chains at L stages: random (MiB sizes, seed L) and transformer-like
    (L-2 identical blocks between an embedding and a head); `blocks_only`: the second alone."""
    return [gpt_chain(L)] if blocks_only else [slot_chain(L, seed=L), gpt_chain(L)]


def store_all_peak(prof: Profile) -> int:
    """The store-all schedule's replayed peak (bytes above fixed memory)."""
    from memplan.planner._build import one_level_ops
    from memplan.planner.simulate import simulate

    L = prof.n_stages
    return simulate(prof, one_level_ops([(1, L, False)], L)).peak_bytes


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


def long_table(rows: list, lengths=LONG_LENGTHS, blocks_only: bool = False) -> None:
    """The long-chain table (module docstring): one "auto" plan per chain and budget, timed."""
    from memplan.planner._optimal_long import solve_long

    c = costs_of(gpt_chain(30))  # load the long-chain kernels (numba's cache) before timing
    solve_long(c, cap=None, memo=True)
    solve_long(c, cap=None, width=4, optimistic=True)
    exact_file = REPO / "benchmarks" / "data" / "optimal_exact.json"
    exact = json.loads(exact_file.read_text()) if exact_file.exists() else {}
    print(f"\n{'chain':10} {'L':>5} {'budget':>6} {'mode':>7} {'plan s':>7} {'cpu s':>6} "
          f"{'cert. gap':>9} {'vs exact':>9} {'exact s':>8}")
    for L in lengths:
        for prof in long_chains(L, blocks_only):
            top = store_all_peak(prof)
            for frac in LONG_FRACS:
                B = int(frac * top)
                cpu0 = time.process_time()  # CPU seconds of every thread: the shared machine's
                plan, t = timed(lambda: plan_optimal(prof, B))  # load inflates wall time only
                cpu = time.process_time() - cpu0
                ex = exact.get(f"{prof.name}@{frac:g}")
                vs = plan.predicted.time_s / ex["time_s"] - 1 if ex and ex["time_s"] else None
                gap = plan.options.get("optimality_gap")
                rows.append(dict(kind="long", chain=prof.name, L=L, frac=frac, budget_bytes=B,
                                 numba_threads=get_num_threads(),
                                 mode=plan.options["mode"], band=plan.options.get("band"),
                                 plan_s=t, cpu_s=cpu, load_avg=os.getloadavg()[0], gap=gap,
                                 lower_bound_s=plan.options.get("lower_bound_s"),
                                 time_s=plan.predicted.time_s, vs_exact=vs,
                                 exact_solve_s=ex["solve_s"] if ex else None))
                vs_txt = "" if vs is None else f"{vs:+.4%}"
                ex_txt = "" if not ex else f"{ex['solve_s']:.0f}"
                print(f"{prof.name:10} {L:5} {frac:6.0%} {plan.options['mode']:>7} {t:7.2f} "
                      f"{cpu:6.2f} {gap:9.4%} {vs_txt:>9} {ex_txt:>8}", flush=True)


def frontier_table(rows: list, lengths=(300, 1000)) -> None:
    """`frontier(points=50)` (NOTE [ the frontier's modes ] in planner/frontier.py) of the long
    table's chains: mode, Pareto points, wall and CPU seconds, the DP's share, the least peak
    against the exact least peak, and the points' certified gaps (largest, and the largest above
    a third of the store-all peak)."""
    import logging

    from memplan.planner.frontier import frontier

    frontier(gpt_chain(30))  # load the kernels (numba's cache) before timing
    times: dict[str, float] = {}

    class _DP(logging.Handler):  # the frontier logs its DP's seconds
        def emit(self, record):
            if record.args and len(record.args) == 6:
                times["dp"] = record.args[4]

    log = logging.getLogger("memplan.planner.frontier")
    log.addHandler(_DP())
    log.setLevel(logging.INFO)
    print(f"\n{'chain':10} {'L':>5} {'mode':>7} {'pareto':>6} {'wall s':>7} {'cpu s':>6} "
          f"{'dp s':>6} {'least/exact':>11} {'max gap':>8} {'gap>1/3':>8}")
    for L in lengths:
        for prof in long_chains(L):
            least = least_peak(costs_of(prof))
            top = store_all_peak(prof)
            cpu0 = time.process_time()
            res, t = timed(lambda: frontier(prof, points=50))
            cpu = time.process_time() - cpu0
            gaps = [p.optimality_gap for p in res.points]
            upper = [p.optimality_gap for p in res.points if p.peak_bytes >= top / 3]
            rows.append(dict(kind="frontier", chain=prof.name, L=L, mode=res.mode,
                             n_pareto=res.n_pareto, n_points=len(res.points), wall_s=t, cpu_s=cpu,
                             dp_s=times.get("dp"), load_avg=os.getloadavg()[0],
                             least_peak_bytes=res.least_peak_bytes, exact_least_bytes=least,
                             max_gap=max(gaps), max_gap_above_third=max(upper, default=0.0),
                             numba_threads=get_num_threads()))
            print(f"{prof.name:10} {L:5} {res.mode:>7} {res.n_pareto:6} {t:7.2f} {cpu:6.2f} "
                  f"{times.get('dp', 0):6.2f} {res.least_peak_bytes / least:11.3f} "
                  f"{max(gaps):8.3%} {max(upper, default=0.0):8.3%}", flush=True)


def main() -> None:
    quick = "--quick" in sys.argv
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; numba threads "
          f"{get_num_threads()}")
    _, t_jit = timed(lambda: solve_compiled(costs_of(slot_chain(4, 0))))
    print(f"kernel compile or cache load: {t_jit:.2f} s (once per process)")
    rows.append(dict(kind="jit", seconds=t_jit))
    if "--frontier" in sys.argv:
        frontier_table(rows, (300,) if quick else (300, 1000))
        _write(rows)
        return
    if "--long-only" in sys.argv or "--blocks-only" in sys.argv:
        long_table(rows, (300,) if quick else LONG_LENGTHS, "--blocks-only" in sys.argv)
        _write(rows)
        return

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

    long_table(rows, (300,) if quick else LONG_LENGTHS)
    frontier_table(rows, (300,) if quick else (300, 1000))
    _write(rows)


def _write(rows: list) -> None:
    out = REPO / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_optimal.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
