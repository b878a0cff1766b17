"""Benchmark the scaling-law fit on Epoch's extraction of the Chinchilla data (240 points after
dropping the 5 of highest loss), against baselines measured in the same run:

- the fit: variable projection (ours) vs Epoch's full initialisation grid (4500 L-BFGS starts);
- the bootstrap: ours (warm start + a batched coarse grid per resample) vs the full variable
  projection search per resample (timed on a subset, scaled to the same count);
- the intervals: ours vs Epoch's published 95% intervals (alpha 0.317-0.373, beta 0.331-0.415).

    .venv/bin/python benchmarks/bench_fit.py [--bootstrap 1000] [--out /tmp/bench_fit.json]

Fits the Epoch data shipped in memplan.data. Prints a table; `--out` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import memplan.planner.scaling.fit as _fit  # noqa: E402
from memplan.planner.scaling import fit_law  # noqa: E402

from memplan.data import load_dataset  # noqa: E402

EPOCH_INTERVALS = {"alpha": (0.317, 0.373), "beta": (0.331, 0.415)}


def _best_of(fn, repeat: int) -> tuple[float, float, object]:
    """Least wall-clock and least CPU seconds of `repeat` calls, and the last result."""
    best, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, time.perf_counter() - t)
        cpu = min(cpu, time.process_time() - c)
    return best, cpu, out


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--baseline-resamples", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    args = ap.parse_args()
    runs = load_dataset("epoch")  # the 245 points less Epoch's 5 outliers
    fit_law(runs)  # warm up imports (scipy) so that neither side pays for them
    load_before = _load()

    t_ours, c_ours, ours = _best_of(lambda: fit_law(runs), 3)
    t_grid, c_grid, grid = _best_of(lambda: fit_law(runs, method="grid"), 1)

    t_boot, c_boot, boot = _best_of(lambda: fit_law(runs, bootstrap=args.bootstrap, seed=0), 1)
    # baseline: the full variable-projection search on each resample (a subset, scaled)
    d = _fit._Data.of(runs)
    spec = _fit._Spec(tied=False, log_e=None)
    rng = np.random.default_rng(0)
    k = args.baseline_resamples
    t, c = time.perf_counter(), time.process_time()
    with _fit._one_blas_thread():  # the same footing as fit_law
        for _ in range(k):
            w = np.bincount(rng.integers(0, runs.n, runs.n), minlength=runs.n).astype(float)
            _fit._fit_varpro(d, w, spec)
    t_full_boot = (time.perf_counter() - t) / k * args.bootstrap
    c_full_boot = (time.process_time() - c) / k * args.bootstrap

    rows = [
        ("fit (varpro vs Epoch's 4500-start grid)", t_ours, c_ours, t_grid, c_grid),
        (f"{args.bootstrap} bootstraps (ours vs full search each)", t_boot, c_boot, t_full_boot,
         c_full_boot),
    ]
    print(f"bench_fit: {runs.n} runs, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"load average {load_before} before, {_load()} after (others' work inflates both columns)")
    print(f"{'what':52s} {'ours s':>9s} {'(cpu s)':>9s} {'baseline s':>11s} {'(cpu s)':>9s} "
          f"{'speed-up':>9s}")
    for what, a, ac, b, bc in rows:
        print(f"{what:52s} {a:9.3f} {ac:9.3f} {b:11.3f} {bc:9.3f} {b / a:8.1f}x")
    print()
    print(f"{'coefficient':12s} {'ours':>10s} {'grid':>10s} {'rel diff':>9s}")
    for c in ("E", "A", "B", "alpha", "beta"):
        a, b = getattr(ours, c), getattr(grid, c)
        print(f"{c:12s} {a:10.5g} {b:10.5g} {abs(a / b - 1):9.2e}")
    print(f"{'objective':12s} {ours.objective:10.6g} {grid.objective:10.6g} "
          f"{abs(ours.objective / grid.objective - 1):9.2e}")
    print()
    print(f"{'95% interval':12s} {'ours':>18s} {'Epoch':>14s} {'worst rel':>10s}")
    interval_err = {}
    for c, (lo, hi) in EPOCH_INTERVALS.items():
        a, b = boot.intervals[c]
        err = max(abs(a / lo - 1), abs(b / hi - 1))
        interval_err[c] = err
        print(f"{c:12s} {a:8.4f}..{b:8.4f} {lo:6.3f}..{hi:6.3f} {err:10.2%}")

    result = {
        "date": date.today().isoformat(),
        "cores": os.cpu_count(),
        "load_average": [load_before, _load()],
        "runs": runs.n,
        "fit_s": t_ours,
        "fit_cpu_s": c_ours,
        "grid_fit_s": t_grid,
        "grid_fit_cpu_s": c_grid,
        "bootstrap": args.bootstrap,
        "bootstrap_s": t_boot,
        "bootstrap_cpu_s": c_boot,
        "full_search_bootstrap_s_estimated": t_full_boot,
        "full_search_bootstrap_cpu_s_estimated": c_full_boot,
        "coefficients": {c: getattr(ours, c) for c in ("E", "A", "B", "alpha", "beta")},
        "grid_coefficients": {c: getattr(grid, c) for c in ("E", "A", "B", "alpha", "beta")},
        "intervals": boot.intervals,
        "interval_rel_error_vs_epoch": interval_err,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
