"""What offload buys (docs/chain-model.md section 10.9): the optimal plan's predicted step time with
offload at several host-device bandwidths against recompute-only (the same DP without transfers),
at the same device budgets, on the GPT-2 small and medium profiles (analytic, bf16-mixed on a GPU,
flash attention, times from FLOPs at a stated throughput). Run:
    .venv/bin/python benchmarks/bench_offload.py [--flops 400e12]
Prints a table and writes benchmarks/results/bench_offload.json. Results: docs/planner.md
("Offload").

Predicted, not measured: the predictions are the chain model's (replays), so the table says where
transfers hide behind compute under that model; scripts/gpu_check.py's `offload` section measures a
plan on an H200 when one is lent.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memplan.planner import plan  # noqa: E402
from memplan.planner._optimal_dp import costs_of, least_peak  # noqa: E402
from memplan.profiler.analytic import gpt_analytic_profile  # noqa: E402

log = logging.getLogger("bench_offload")

MODELS = {  # nanoGPT's GPT-2 sizes at a sequence of 1024 tokens
    "gpt2 (124M), B 8": dict(n_layer=12, n_head=12, n_embd=768, batch_size=8),
    "gpt2-medium (350M), B 8": dict(n_layer=24, n_head=16, n_embd=1024, batch_size=8),
}
BANDWIDTHS = (0.0, 12.5e9, 50e9, 100e9, 450e9)  # bytes/s: none, PCIe 4 and 5 x16, 2 x PCIe 5, GH200 C2C
BUDGETS = (0.1, 0.3, 0.6)  # of the way from the least peak to the store-all activation peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flops", type=float, default=400e12,
                    help="sustained FLOP/s the profile's times assume (default 400e12: an H200 "
                         "at about 40%% of its dense bf16 peak)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    for label, cfg in MODELS.items():
        prof = gpt_analytic_profile(dict(cfg, block_size=1024), device="cuda",
                                    flops_per_s=args.flops, precision="bf16-mixed")
        full = plan(prof, strategy="store-all").predicted.peak_bytes
        least = least_peak(costs_of(prof))  # the head's logits bound it, offload or not
        for frac in BUDGETS:
            budget = least + int((full - least) * frac)
            base = None
            for bw in BANDWIDTHS:
                t0 = time.perf_counter()
                p = plan(prof, budget_bytes=budget, offload_bandwidth=bw or None)
                secs = time.perf_counter() - t0
                pr = p.predicted
                if bw == 0:
                    base = pr.time_s if p.feasible else None
                moved = sum(1 for op in p.schedule if op[0] in ("offload", "offload_record"))
                rows.append(dict(
                    model=label, budget_fraction=frac, budget_bytes=budget, bandwidth=bw,
                    feasible=p.feasible, time_s=pr.time_s if p.feasible else None,
                    vs_recompute_only=(pr.time_s / base if p.feasible and base else None),
                    overhead=pr.overhead if p.feasible else None,
                    host_peak_bytes=pr.host_peak_bytes if p.feasible else None,
                    transfer_wait_s=pr.transfer_wait_s if p.feasible else None,
                    tensors_moved=moved, plan_s=secs,
                ))
                log.info("%s %.0f%% bw %.3g: %s", label, frac * 100, bw, rows[-1])
    print(f"{'model':26} {'budget':>6} {'GB/s':>6} {'overhead':>9} {'vs recompute':>12} "
          f"{'host GiB':>8} {'moved':>5} {'plan s':>6}")
    for r in rows:
        ov = "-" if r["overhead"] is None else f"{r['overhead']:.1%}"
        vs = "-" if r["vs_recompute_only"] is None else f"{r['vs_recompute_only']:.3f}"
        host = "-" if r["host_peak_bytes"] is None else f"{r['host_peak_bytes'] / 2**30:.2f}"
        print(f"{r['model']:26} {r['budget_fraction']:>6.0%} {r['bandwidth'] / 1e9:>6.1f} {ov:>9} "
              f"{vs:>12} {host:>8} {r['tensors_moved']:>5} {r['plan_s']:>6.2f}")
    out = REPO / "benchmarks" / "results" / "bench_offload.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"flops_per_s": args.flops, "rows": rows}, indent=1))
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
