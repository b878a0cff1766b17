"""The seed's claims on the CPU: activation memory linear in depth for store-all and ~sqrt(L) for
sqrt checkpointing; sqrt's recompute overhead (the seed says 30-40%); the optimal plan's overhead
at the same memory; torch's `checkpoint_sequential` measured in the same run as the peer.

Chains of residual MLP blocks (Linear -> GELU -> Linear, width 256, batch 64) from 8 to 128
blocks plus a loss stage. Every number is measured in this run: peaks by exact CPU allocation
accounting (profiler.memory), times as the median of timed steps (one thread). Writes
docs/bench_seed_claims.json and docs/bench_seed_claims.png.

    .venv/bin/python benchmarks/bench_seed_claims.py [--depths 8,16,32,64,128] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import planner  # noqa: E402
from executor import run_plan  # noqa: E402
from profiler.measure import profile_chain  # noqa: E402
from profiler.memory import measure_memory  # noqa: E402

WIDTH, BATCH = 256, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH), nn.GELU()

    def forward(self, x):  # (B, W) -> (B, W)
        return x + self.fc2(self.act(self.fc1(x)))


class Loss(nn.Module):
    def forward(self, x):  # (B, W) -> ()
        return x.pow(2).mean()


def chain(L):
    torch.manual_seed(0)
    return [Block() for _ in range(L)] + [Loss()], torch.randn(BATCH, WIDTH)


def checkpoint_sequential_step(stages, x, segments):
    from torch.utils.checkpoint import checkpoint_sequential

    model = nn.Sequential(*stages[:-1])
    loss = stages[-1](checkpoint_sequential(model, segments, x, use_reentrant=False))
    loss.backward()


def measure_peer(stages, x, segments, steps):
    for p in (p for s in stages for p in s.parameters()):
        p.grad = torch.zeros_like(p)
    checkpoint_sequential_step(stages, x, segments)  # warm
    with measure_memory("cpu") as m:
        checkpoint_sequential_step(stages, x, segments)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        checkpoint_sequential_step(stages, x, segments)
        times.append(time.perf_counter() - t0)
    return m.peak_bytes + x.numel() * x.element_size(), statistics.median(times)


def main(argv=None):
    global WIDTH, BATCH
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="8,16,32,64,128")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--width", type=int, default=WIDTH, help="block width (more: less per-op overhead)")
    ap.add_argument("--batch", type=int, default=BATCH)
    args = ap.parse_args(argv)
    WIDTH, BATCH = args.width, args.batch
    torch.set_num_threads(1)
    rows = []
    for L in [int(v) for v in args.depths.split(",")]:
        stages, x = chain(L)
        prof = profile_chain(stages, x, repeats=3, warmup=1)
        plans = {"store-all": planner.plan(prof, strategy="store-all"),
                 "sqrt": planner.plan(prof, strategy="sqrt")}
        if "optimal" in planner.STRATEGIES:
            plans["optimal"] = planner.plan(prof, strategy="optimal",
                                            budget_bytes=plans["sqrt"].predicted.peak_bytes)
        res = {}
        for name, plan in plans.items():
            r = run_plan(stages, x, plan, profile=prof, steps=args.steps + 1, optimizer="none",
                         compare=False)
            res[name] = r
        segs = max(1, round(math.sqrt(L)))
        peer_peak, peer_time = measure_peer(stages, x, segs, args.steps)
        base = res["store-all"].measured_time_s
        row = dict(
            depth=L,
            store_all_peak_bytes=res["store-all"].measured_peak_bytes,
            sqrt_peak_bytes=res["sqrt"].measured_peak_bytes,
            sqrt_peak_pred_bytes=res["sqrt"].predicted_peak_bytes,
            sqrt_overhead_measured=res["sqrt"].measured_time_s / base - 1,
            sqrt_overhead_predicted=plans["sqrt"].predicted.overhead,
            peer_peak_bytes=peer_peak,
            peer_overhead_measured=peer_time / base - 1,
        )
        if "optimal" in res:
            row.update(optimal_peak_bytes=res["optimal"].measured_peak_bytes,
                       optimal_overhead_measured=res["optimal"].measured_time_s / base - 1,
                       optimal_overhead_predicted=plans["optimal"].predicted.overhead)
        rows.append(row)
        print(f"L={L:4d} store-all {row['store_all_peak_bytes'] / 2**20:7.2f} MiB | sqrt "
              f"{row['sqrt_peak_bytes'] / 2**20:6.2f} MiB (pred {row['sqrt_peak_pred_bytes'] / 2**20:6.2f}) "
              f"+{row['sqrt_overhead_measured']:.0%} (pred +{row['sqrt_overhead_predicted']:.0%}) | "
              + (f"optimal {row['optimal_peak_bytes'] / 2**20:6.2f} MiB +{row['optimal_overhead_measured']:.0%} "
                 f"(pred +{row['optimal_overhead_predicted']:.0%}) | " if "optimal_peak_bytes" in row else "")
              + f"checkpoint_sequential({segs}) {peer_peak / 2**20:6.2f} MiB +{row['peer_overhead_measured']:.0%}",
              flush=True)
    out = ROOT / "docs"
    (out / "bench_seed_claims.json").write_text(json.dumps(rows, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = [r["depth"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(d, [r["store_all_peak_bytes"] / 2**20 for r in rows], "o-", label="store-all")
    ax.plot(d, [r["sqrt_peak_bytes"] / 2**20 for r in rows], "s-", label="sqrt (ours)")
    ax.plot(d, [r["peer_peak_bytes"] / 2**20 for r in rows], "x--", label="checkpoint_sequential")
    if "optimal_peak_bytes" in rows[0]:
        ax.plot(d, [r["optimal_peak_bytes"] / 2**20 for r in rows], "^-", label="optimal at sqrt's memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("blocks L")
    ax.set_ylabel("peak activation memory (MiB, measured)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bench_seed_claims.png", dpi=120)


if __name__ == "__main__":
    main()
