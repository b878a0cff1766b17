"""The optimal DP with save policies (docs/chain-model.md section 10.8): plan time with four
policies per stage against the same chains with one (today's DP), at 100 and 200 stages, three
budgets each, interleaved in rounds so both see the same machine load. Run:
    .venv/bin/python benchmarks/bench_policies.py [--rounds N]
Prints a table and writes benchmarks/results/bench_policies.json. Results: docs/benchmarks.md.

The chains are GPT-like: an embedding, L-2 blocks and a head, each block offering 'all' plus three
policies with the shape of a transformer block's measured ones (profiler/policies.py): keep the
matmul outputs (45% of the record, +20% of a forward in the backward), recompute only attention's
core (70%, +5%) and recompute everything ('none': 0 bytes, +100%). Block times vary by up to 5% so
frontiers are not degenerate.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memplan.planner import plan  # noqa: E402
from memplan.profiler.schema import Profile  # noqa: E402

log = logging.getLogger("bench_policies")


def gpt_like(L: int, n_policies: int, seed: int = 0) -> Profile:
    """A GPT-like chain of L stages whose blocks have `n_policies` policies ('all' included)."""
    rng = random.Random(seed)
    mib = 2**20
    layers = [dict(name="embed", forward_s=1e-3, backward_s=2e-3, output_bytes=4 * mib,
                   saved_bytes=mib)]
    for i in range(L - 2):
        f = 0.01 * (1 + 0.05 * rng.random())
        s = 40 * mib
        pols = [dict(name="matmuls", recompute=["aten.gelu"], saved_bytes=s * 45 // 100,
                     backward_temp_bytes=4 * mib, forward_s=f, backward_s=2.2 * f),
                dict(name="no_attention", recompute=["aten._softmax"], saved_bytes=s * 70 // 100,
                     backward_temp_bytes=8 * mib, forward_s=f, backward_s=2.05 * f),
                dict(name="none", recompute=["*"], saved_bytes=0, backward_temp_bytes=s,
                     forward_s=0.95 * f, backward_s=3 * f)][:n_policies - 1]
        layers.append(dict(name=f"block.{i}", forward_s=f, backward_s=2 * f,
                           forward_nograd_s=0.9 * f, output_bytes=4 * mib, saved_bytes=s,
                           forward_temp_bytes=mib, backward_temp_bytes=6 * mib, policies=pols))
    layers.append(dict(name="head", forward_s=2e-3, backward_s=4e-3, output_bytes=4,
                       saved_bytes=16 * mib))
    return Profile(name=f"gpt{L}x{n_policies}", input_bytes=2**16, layers=layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    for L in (100, 200):
        chains = {k: gpt_like(L, k) for k in (1, 4)}
        peak = plan(chains[1], strategy="store-all").predicted.peak_bytes
        budgets = [int(peak * f) for f in (0.15, 0.3, 0.5)]
        for p in chains.values():  # compile and warm
            plan(p, budget_bytes=budgets[0], mode="exact")
        times: dict[tuple[int, int], list[float]] = {}
        used: dict[tuple[int, int], tuple] = {}
        for r in range(args.rounds):
            for b in budgets:
                for k in ((1, 4) if r % 2 == 0 else (4, 1)):  # interleaved, order alternating
                    t0 = time.perf_counter()
                    out = plan(chains[k], budget_bytes=b, mode="exact")
                    times.setdefault((k, b), []).append(time.perf_counter() - t0)
                    used[(k, b)] = (out.predicted.time_s, len(out.stage_policies))
            log.info("L=%d round %d done", L, r + 1)
        for b in budgets:
            one, four = statistics.median(times[(1, b)]), statistics.median(times[(4, b)])
            rows.append(dict(stages=L, budget_frac=round(b / peak, 2), seconds_one_policy=one,
                             seconds_four_policies=four, ratio=four / one,
                             step_time_ratio=used[(4, b)][0] / used[(1, b)][0],
                             stages_under_policies=used[(4, b)][1]))
    print(f"{'stages':>6} {'budget':>6} {'1 policy s':>10} {'4 policies s':>12} {'ratio':>6} "
          f"{'step time 4/1':>13} {'under policies':>14}")
    for r in rows:
        print(f"{r['stages']:>6} {r['budget_frac']:>6.2f} {r['seconds_one_policy']:>10.3f} "
              f"{r['seconds_four_policies']:>12.3f} {r['ratio']:>6.2f} {r['step_time_ratio']:>13.3f} "
              f"{r['stages_under_policies']:>14}")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} CPUs)")
    out = REPO / "benchmarks" / "results" / "bench_policies.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(rows=rows, load_average=load, cpus=os.cpu_count()), indent=1))


if __name__ == "__main__":
    main()
