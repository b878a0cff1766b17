"""The seed's claims on the CPU: activation memory linear in depth for store-all and ~sqrt(L) for
sqrt checkpointing; sqrt's recompute overhead (the seed says 30-40%); the optimal plan's overhead
at the same memory; torch's `checkpoint_sequential` measured in the same run as the peer.

Chains of residual MLP blocks (Linear -> GELU -> Linear, width 512, batch 256) from 8 to 128
blocks plus a loss stage. Every number is measured in this run: peaks by exact CPU allocation
accounting (profiler.memory), overheads as medians over interleaved rounds (one thread). Writes
docs/bench_seed_claims.json and docs/bench_seed_claims.png.

    .venv/bin/python benchmarks/bench_seed_claims.py [--depths 8,16,32,64,128] [--rounds 21]
        [--precision 0.08] [--max-minutes 8]
    .venv/bin/python benchmarks/bench_seed_claims.py --width 256 --batch 64 --tag _w256

NOTE [ block size ]
The chain model prices a step as the sum of its ops' profiled times. At width 512 and batch 256 an
op takes 5-20 ms on this CPU, and what the model leaves out is under 1% of it: the executor's
Python work per op (30-50 us) and the cost of switching between backward and forward kernels
(0.15-0.5 ms on the first op after a switch, measured). At width 256 and batch 64 an op takes
under 1 ms, and those costs, which a checkpointed schedule pays more often than store-all, add a
few points to its measured overhead (the `_w256` run; docs/executor.md).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import math
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.executor import ScheduleRunner, run_plan  # noqa: E402
from memplan.profiler.measure import profile_chain  # noqa: E402
from memplan.profiler.memory import measure_memory  # noqa: E402

import planner  # noqa: E402

WIDTH, BATCH = 512, 256  # NOTE [ block size ]
log = logging.getLogger("bench_seed_claims")


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


def runner_step(stages, x, plan):
    """One training step of `plan` by the executor's schedule runner (no optimizer), as a callable."""
    runner = ScheduleRunner(stages, plan.schedule, device=torch.device("cpu"))

    def step():
        runner.prepare()
        runner.step(x)

    return step


def checkpoint_sequential_step(stages, x, segments):
    from torch.utils.checkpoint import checkpoint_sequential

    model = nn.Sequential(*stages[:-1])
    loss = stages[-1](checkpoint_sequential(model, segments, x, use_reentrant=False))
    loss.backward()


def measure_peer_peak(stages, x, segments):
    """checkpoint_sequential's peak activation bytes (a_0 included), by exact CPU accounting."""
    for p in (p for s in stages for p in s.parameters()):
        p.grad = torch.zeros_like(p)
    checkpoint_sequential_step(stages, x, segments)  # warm
    with measure_memory("cpu") as m:
        checkpoint_sequential_step(stages, x, segments)
    return m.peak_bytes + x.numel() * x.element_size()


class InterleavedRounds:
    """Seconds and minor page faults of one step of each stepper, per round; each round runs every
    stepper once, in an order rotated from round to round (NOTE [ interleaved rounds ])."""

    def __init__(self, steppers: dict) -> None:
        self.steppers = steppers
        self.names = list(steppers)
        self.times: dict[str, list[float]] = {name: [] for name in self.names}
        self.faults: dict[str, list[int]] = {name: [] for name in self.names}
        for name in self.names:  # warm
            steppers[name]()

    @property
    def done(self) -> int:
        return len(self.times[self.names[0]])

    def run(self, rounds: int) -> None:
        """Time `rounds` more rounds."""
        gc.collect()
        gc.disable()  # as timeit does: a collection inside a timed step is not the plan's cost
        try:
            for _ in range(rounds):
                k = self.done % len(self.names)
                for name in self.names[k:] + self.names[:k]:
                    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                    self.steppers[name]()
                    self.times[name].append(time.perf_counter() - t0)
                    self.faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                gc.collect()
        finally:
            gc.enable()

    def ratios(self, name: str, base: str) -> list[float]:
        """Per round: `name`'s step time over `base`'s in the same round."""
        return [t / b for t, b in zip(self.times[name], self.times[base], strict=True)]


def time_to_precision(rounds: InterleavedRounds, *, base: str, judged: list[str], min_rounds: int,
                      precision: float, max_seconds: float, chunk: int = 4,
                      progress: Callable[[int], None] | None = None) -> bool:
    """Run rounds until each plan in `judged` has a 95% interval of its overhead (ratio to `base`,
    minus 1) no wider than +-`precision` x its median overhead, after at least `min_rounds`, or
    until `max_seconds` have passed; True when the precision was reached.

    NOTE [ rounds to a precision ]
    A step's time on this shared machine moves 5-15% from one second to the next, and a ratio of
    two neighbouring steps by 7-17 points of overhead: 21 rounds left a 95% interval of +-5-7
    points around overheads of 25-30%, as wide as the 15% the comparison allows. How many rounds
    bring it to a given width depends on the machine's noise at the time, so the rounds are not
    fixed: they go on until the interval is narrow enough. The rule looks at the measured ratios
    only, never at the prediction, so it cannot stop on a lucky agreement.
    """
    t0 = time.monotonic()
    while True:
        todo = min_rounds - rounds.done if rounds.done < min_rounds else chunk
        rounds.run(todo)
        if progress is not None:
            progress(rounds.done)
        if rounds.done >= min_rounds and all(_precise(rounds.ratios(n, base), precision) for n in judged):
            return True
        if time.monotonic() - t0 > max_seconds:
            return False


def _precise(ratios: list[float], precision: float) -> bool:
    lo, hi = median_ci(ratios, resamples=1000)
    over = statistics.median(ratios) - 1
    return over > 0 and (hi - lo) / 2 <= precision * over


@contextmanager
def _bar(what: str):
    """A progress bar (rich, on stderr) counting rounds; it has no total: the rounds end on precision."""
    from rich.console import Console
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description} {task.completed}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        yield bar, bar.add_task(what, total=None)


def median_ci(values: list[float], *, level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """A percentile-bootstrap interval of the median of `values` (seeded, so reruns agree)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return meds[int(tail * resamples)], meds[min(resamples - 1, int((1 - tail) * resamples))]


def steady_allocator() -> bool:
    """Keep freed activations in the process heap (glibc mallopt): True when it took effect.

    NOTE [ glibc and step times on the CPU ]
    PyTorch's CPU allocator has no cache; glibc serves blocks above its mmap threshold (128 KiB,
    adapting upwards) with fresh mmaps and returns them on free, so a step touches new pages for
    every large activation and pays a page fault per 4 KiB. How often depends on the plan's
    allocation pattern and on glibc's adaptive threshold, not on the work: store-all's step varied
    by 16% against its own prediction in one process. A GPU's caching allocator has no such cost,
    and neither does the chain model. For the time comparison we keep blocks up to 32 MiB (glibc's
    maximum threshold) in the heap and trim it only above INT_MAX bytes; --glibc-default leaves
    glibc as it is. mallopt takes a C int: a larger value (2**62 here once) wraps to 0, which
    trims the heap at every free, and store-all then took 25,000 page faults a step, 0-4 in
    steady state with INT_MAX. Each row records the median page faults per timed step.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def main(argv=None):
    global WIDTH, BATCH
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="8,16,32,64,128")
    ap.add_argument("--width", type=int, default=WIDTH, help="block width (more: less per-op overhead)")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--rounds", type=int, default=21,
                    help="at least this many timed steps per plan (NOTE [ interleaved rounds ])")
    ap.add_argument("--precision", type=float, default=0.08,
                    help="more rounds until each plan's 95%% interval of its overhead is within +- this "
                    "fraction of it (NOTE [ rounds to a precision ]); 0: exactly --rounds")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="at most this long timing one depth")
    ap.add_argument("--repeats", type=int, default=11, help="profile repeats (passes over the chain)")
    ap.add_argument("--tag", default="", help="suffix of the output files (e.g. _w256)")
    ap.add_argument("--glibc-default", action="store_true",
                    help="leave glibc's malloc as it is (NOTE [ glibc and step times on the CPU ])")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or args.precision < 0 or args.max_minutes <= 0:
        ap.error("--rounds and --repeats: at least 1; --precision: at least 0; --max-minutes: above 0")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    WIDTH, BATCH = args.width, args.batch
    tuned = False if args.glibc_default else steady_allocator()
    log.info("width %d, batch %d, at least %d rounds, precision +-%g, at most %g min per depth; "
             "glibc heap kept: %s", WIDTH, BATCH, args.rounds, args.precision, args.max_minutes, tuned)
    torch.set_num_threads(1)
    rows = []
    for L in [int(v) for v in args.depths.split(",")]:
        stages, x = chain(L)
        prof = profile_chain(stages, x, repeats=args.repeats, warmup=1)
        plans = {"store-all": planner.plan(prof, strategy="store-all"),
                 "sqrt": planner.plan(prof, strategy="sqrt")}
        if "optimal" in planner.STRATEGIES:
            plans["optimal"] = planner.plan(prof, strategy="optimal",
                                            budget_bytes=plans["sqrt"].predicted.peak_bytes)
        # NOTE [ interleaved rounds ]: on a shared 2-core machine a step's time moves by 5-30%
        # within seconds. Each round times one step of every plan and of the peer back to back
        # (the order rotated between rounds), an overhead is the median over rounds of the ratio
        # to store-all's step in the same round: drifts cancel in a ratio of neighbours, and a
        # median over many short rounds leaves out the spikes. Peaks come from run_plan (exact
        # accounting, one measured step each).
        res = {name: run_plan(stages, x, plan, profile=prof, steps=2, optimizer="none", compare=False)
               for name, plan in plans.items()}
        segs = max(1, round(math.sqrt(L)))
        peer_peak = measure_peer_peak(stages, x, segs)
        steppers = {name: runner_step(stages, x, plan) for name, plan in plans.items()}
        steppers["peer"] = functools.partial(checkpoint_sequential_step, stages, x, segs)
        rounds = InterleavedRounds(steppers)
        judged = [name for name in plans if name != "store-all"]
        with _bar(f"L={L}: rounds") as (bar, task):
            if args.precision > 0:
                precise = time_to_precision(
                    rounds, base="store-all", judged=judged, min_rounds=args.rounds,
                    precision=args.precision, max_seconds=60 * args.max_minutes,
                    progress=lambda n: bar.update(task, completed=n))
            else:  # exactly --rounds, whatever the overheads
                rounds.run(args.rounds)
                precise = None
        times, faults = rounds.times, rounds.faults
        ratios = {name: rounds.ratios(name, "store-all") for name in times}
        over = {name: statistics.median(v) - 1 for name, v in ratios.items()}
        ci = {name: median_ci(v) for name, v in ratios.items() if name != "store-all"}
        row = dict(
            depth=L,
            store_all_peak_bytes=res["store-all"].measured_peak_bytes,
            sqrt_peak_bytes=res["sqrt"].measured_peak_bytes,
            sqrt_peak_pred_bytes=res["sqrt"].predicted_peak_bytes,
            sqrt_overhead_measured=over["sqrt"],
            sqrt_overhead_predicted=plans["sqrt"].predicted.overhead,
            peer_peak_bytes=peer_peak,
            peer_overhead_measured=over["peer"],
            rounds=rounds.done,
            precision_reached=precise,
        )
        if "optimal" in res:
            row.update(optimal_peak_bytes=res["optimal"].measured_peak_bytes,
                       optimal_overhead_measured=over["optimal"],
                       optimal_overhead_predicted=plans["optimal"].predicted.overhead)
        for name in plans:  # step times (medians over rounds), for the prediction's own error
            row[f"{name}_time_measured_s"] = statistics.median(times[name])
            row[f"{name}_time_predicted_s"] = plans[name].predicted.time_s
        for name in times:
            row[f"{name}_step_times_s"] = times[name]
        for name, (lo, hi) in ci.items():  # the measured overhead's 95% interval, and its data
            row[f"{name}_overhead_ci95"] = [lo - 1, hi - 1]
            row[f"{name}_ratios"] = ratios[name]
        for name in faults:  # NOTE [ glibc and step times on the CPU ]
            row[f"{name}_page_faults_per_step"] = statistics.median(faults[name])
        rows.append(row)
        if precise is False:
            log.warning("L=%d: the overhead's 95%% interval is still wider than +-%g of it after %d rounds "
                        "(--max-minutes %g)", L, args.precision, rounds.done, args.max_minutes)
        log.info(f"L={L:4d} ({rounds.done} rounds) store-all {row['store_all_peak_bytes'] / 2**20:7.2f} MiB | sqrt "
              f"{row['sqrt_peak_bytes'] / 2**20:6.2f} MiB (pred {row['sqrt_peak_pred_bytes'] / 2**20:6.2f}) "
              f"+{row['sqrt_overhead_measured']:.0%} (pred +{row['sqrt_overhead_predicted']:.0%}) | "
              + (f"optimal {row['optimal_peak_bytes'] / 2**20:6.2f} MiB +{row['optimal_overhead_measured']:.0%} "
                 f"(pred +{row['optimal_overhead_predicted']:.0%}) | " if "optimal_peak_bytes" in row else "")
              + f"checkpoint_sequential({segs}) {peer_peak / 2**20:6.2f} MiB +{row['peer_overhead_measured']:.0%}")
    out = ROOT / "docs"
    meta = dict(width=WIDTH, batch=BATCH, min_rounds=args.rounds, precision=args.precision,
                max_minutes_per_depth=args.max_minutes, profile_repeats=args.repeats,
                profile_timing=prof.meta.get("timing"),
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
