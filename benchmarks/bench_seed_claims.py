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


def steady_allocator() -> bool:
    """Keep freed activations in the process heap (glibc mallopt): True when it took effect.

    NOTE [ glibc and step times on the CPU ]
    PyTorch's CPU allocator has no cache; glibc serves blocks above its mmap threshold (128 KiB,
    adapting upwards) with fresh mmaps and returns them on free, so a step touches new pages for
    every large activation and pays a page fault per 4 KiB. How often depends on the plan's
    allocation pattern and on glibc's adaptive threshold, not on the work: store-all's step varied
    by 16% against its own prediction in one process. A GPU's caching allocator has no such cost,
    and neither does the chain model. For the time comparison we keep blocks up to 32 MiB (glibc's
    maximum threshold) in the heap and never trim it; --glibc-default leaves glibc as it is.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 2**62))
    except (OSError, AttributeError):
        return False


def main(argv=None):
    global WIDTH, BATCH
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="8,16,32,64,128")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--width", type=int, default=WIDTH, help="block width (more: less per-op overhead)")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--rounds", type=int, default=5, help="NOTE [ interleaved rounds ]")
    ap.add_argument("--tag", default="", help="suffix of the output files (e.g. _w256)")
    ap.add_argument("--glibc-default", action="store_true",
                    help="leave glibc's malloc as it is (NOTE [ glibc and step times on the CPU ])")
    args = ap.parse_args(argv)
    WIDTH, BATCH = args.width, args.batch
    tuned = False if args.glibc_default else steady_allocator()
    print(f"width {WIDTH}, batch {BATCH}, steps {args.steps}; glibc heap kept: {tuned}", flush=True)
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
        # NOTE [ interleaved rounds ]: each round times every plan and the peer back to back
        # (`steps` timed steps each, median), and overheads are per-round ratios to store-all's
        # time in the same round, their median over rounds reported: slow drifts of the
        # machine's speed cancel in a ratio of neighbours, not in one of minutes-apart runs.
        res = {}
        segs = max(1, round(math.sqrt(L)))
        ratios: dict[str, list[float]] = {name: [] for name in [*plans, "peer"]}
        times: dict[str, list[float]] = {name: [] for name in [*plans, "peer"]}
        for _ in range(args.rounds):
            for name, plan in plans.items():
                r = run_plan(stages, x, plan, profile=prof, steps=args.steps + 1,
                             optimizer="none", compare=False)
                res[name] = r
                times[name].append(r.measured_time_s)
            peer_peak, peer_time = measure_peer(stages, x, segs, args.steps)
            times["peer"].append(peer_time)
            for name in ratios:
                ratios[name].append(times[name][-1] / times["store-all"][-1])
        over = {name: statistics.median(v) - 1 for name, v in ratios.items()}
        row = dict(
            depth=L,
            store_all_peak_bytes=res["store-all"].measured_peak_bytes,
            sqrt_peak_bytes=res["sqrt"].measured_peak_bytes,
            sqrt_peak_pred_bytes=res["sqrt"].predicted_peak_bytes,
            sqrt_overhead_measured=over["sqrt"],
            sqrt_overhead_predicted=plans["sqrt"].predicted.overhead,
            peer_peak_bytes=peer_peak,
            peer_overhead_measured=over["peer"],
        )
        if "optimal" in res:
            row.update(optimal_peak_bytes=res["optimal"].measured_peak_bytes,
                       optimal_overhead_measured=over["optimal"],
                       optimal_overhead_predicted=plans["optimal"].predicted.overhead)
        for name in plans:  # step times (medians over rounds), for the prediction's own error
            row[f"{name}_time_measured_s"] = statistics.median(times[name])
            row[f"{name}_time_predicted_s"] = plans[name].predicted.time_s
        rows.append(row)
        print(f"L={L:4d} store-all {row['store_all_peak_bytes'] / 2**20:7.2f} MiB | sqrt "
              f"{row['sqrt_peak_bytes'] / 2**20:6.2f} MiB (pred {row['sqrt_peak_pred_bytes'] / 2**20:6.2f}) "
              f"+{row['sqrt_overhead_measured']:.0%} (pred +{row['sqrt_overhead_predicted']:.0%}) | "
              + (f"optimal {row['optimal_peak_bytes'] / 2**20:6.2f} MiB +{row['optimal_overhead_measured']:.0%} "
                 f"(pred +{row['optimal_overhead_predicted']:.0%}) | " if "optimal_peak_bytes" in row else "")
              + f"checkpoint_sequential({segs}) {peer_peak / 2**20:6.2f} MiB +{row['peer_overhead_measured']:.0%}",
              flush=True)
    out = ROOT / "docs"
    meta = dict(width=WIDTH, batch=BATCH, steps=args.steps, rounds=args.rounds,
                glibc_heap_kept=tuned)
    (out / f"bench_seed_claims{args.tag}.json").write_text(json.dumps(dict(meta, rows=rows), indent=2))
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
    fig.savefig(out / f"bench_seed_claims{args.tag}.png", dpi=120)


if __name__ == "__main__":
    main()
