"""The exact optimum of every long-chain benchmark case, computed once and kept as benchmark data.

    .venv/bin/python benchmarks/bench_optimal_exact.py [--only L,...] [--cases NAME@FRAC,...]

For each chain of benchmarks/bench_optimal.py's long-chain table (random and transformer-like, 300,
500 and 1,000 stages) and each budget (10%, 20%, 40% of the store-all peak) it runs the exact
compiled DP (`plan_optimal(..., mode="exact")`) and appends the plan's replayed time and peak to
benchmarks/data/optimal_exact.json. Cases already there are skipped: at 1,000 stages one solve
takes minutes (356 s on a quiet 2-core machine), so the file is the record and is never recomputed
by the benchmark itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memplan.planner.optimal import plan_optimal  # noqa: E402

from benchmarks.bench_optimal import LONG_FRACS, LONG_LENGTHS, long_chains, store_all_peak  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "optimal_exact.json"


def key(name: str, frac: float) -> str:
    """The record's key: chain name and budget fraction."""
    return f"{name}@{frac:g}"


def load() -> dict:
    """The stored exact values (key -> record); empty when none are stored yet."""
    return json.loads(DATA.read_text()) if DATA.exists() else {}


def solve_case(prof, frac: float) -> dict:
    """The exact plan of `prof` at `frac` of its store-all peak, as a record (bytes, seconds)."""
    top = store_all_peak(prof)
    B = int(frac * top)
    t0 = time.perf_counter()
    plan = plan_optimal(prof, B, mode="exact")
    dt = time.perf_counter() - t0
    return dict(chain=prof.name, n_stages=prof.n_stages, frac=frac, budget_bytes=B,
                store_all_peak_bytes=top, feasible=plan.feasible,
                time_s=plan.predicted.time_s if plan.feasible else None,
                peak_bytes=plan.predicted.peak_bytes if plan.feasible else None,
                solve_s=dt, load_avg=os.getloadavg()[0],
                when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))


def save(k: str, rec: dict) -> None:
    """Add one record to the data file (re-read first: other runs may have added theirs)."""
    data = load()
    data[k] = rec
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(k, rec, flush=True)


def main() -> None:
    only = None
    if "--only" in sys.argv:
        only = {int(v) for v in sys.argv[sys.argv.index("--only") + 1].split(",")}
    if "--cases" in sys.argv:  # these keys, in this order
        for k in sys.argv[sys.argv.index("--cases") + 1].split(","):
            name, frac = k.split("@")
            L = int("".join(ch for ch in name if ch.isdigit()))
            prof = next(p for p in long_chains(L) if p.name == name)
            if key(name, float(frac)) not in load():
                save(key(name, float(frac)), solve_case(prof, float(frac)))
        return
    for L in LONG_LENGTHS:
        if only is not None and L not in only:
            continue
        for prof in long_chains(L):
            for frac in LONG_FRACS:
                if key(prof.name, frac) not in load():
                    save(key(prof.name, frac), solve_case(prof, frac))

if __name__ == "__main__":
    main()
