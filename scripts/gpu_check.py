#!/usr/bin/env python
"""Check the profiler's predictions on a real device: profile GPT-2 small and medium in bf16, plan
them (store-all, sqrt, optimal at the sqrt plan's memory), run each plan, and compare the
predicted peak with `torch.cuda.max_memory_allocated` (target: within 2%) and the predicted step
time with the measured one (target: within 10%). Prints a table and writes JSON.

    python scripts/gpu_check.py                      # on a CUDA machine, < 5 minutes
    python scripts/gpu_check.py --device cpu --tiny  # the same logic on a tiny config, anywhere

Needs nothing beyond torch (and this repository). The JSON goes to --out, else $OUT/gpu_check.json
when $OUT is set, else ./gpu_check.json. Runs plans with `executor.run_plan` when the executor is
importable, else with a minimal one-level runner (torch.utils.checkpoint) of its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from profiler.measure import profile_chain  # noqa: E402
from profiler.memory import measure_memory  # noqa: E402
from profiler.models.gpt import GPT2_SIZES, GPTConfig, build_gpt  # noqa: E402

log = logging.getLogger("gpu_check")

MODELS = {
    "gpt2": dict(GPT2_SIZES["gpt2"], block_size=1024, batch_size=8),
    "gpt2-medium": dict(GPT2_SIZES["gpt2-medium"], block_size=1024, batch_size=4),
}
TINY = {
    "tiny-a": dict(n_layer=4, n_head=2, n_embd=32, block_size=16, vocab_size=64, batch_size=2),
    "tiny-b": dict(n_layer=6, n_head=4, n_embd=64, block_size=32, vocab_size=128, batch_size=2),
}


def _plans(prof):
    import planner

    out = [planner.plan(prof, strategy="store-all"), planner.plan(prof, strategy="sqrt")]
    if "optimal" in planner.STRATEGIES:
        out.append(planner.plan(prof, strategy="optimal", budget_bytes=out[1].predicted.peak_bytes))
    return out


def _segments(plan) -> list[tuple[int, int]]:
    """Recomputed segments of a one-level schedule: runs of consecutive `F` ops before the loss."""
    segs: list[list[int]] = []
    for op in plan.schedule:
        if op[0] == "loss":
            break
        if op[0] == "F":
            if segs and segs[-1][1] == op[1] - 1:
                segs[-1][1] = op[1]
            else:
                segs.append([op[1], op[1]])
    return [(p, q) for p, q in segs]


def _run_minimal(stages, x0, plan, *, steps: int, device: torch.device) -> dict:
    """One-level plans through torch.utils.checkpoint (use_reentrant=False)."""
    from torch.utils.checkpoint import checkpoint

    segs = {p: q for p, q in _segments(plan)}

    def forward():
        x, i, L = x0, 1, len(stages)
        while i <= L:
            if i in segs:
                q = segs[i]
                chunk = stages[i - 1 : q]

                def run(h, chunk=chunk):
                    for s in chunk:
                        h = s(h)
                    return h

                x = checkpoint(run, x, use_reentrant=False)
                i = q + 1
            else:
                x = stages[i - 1](x)
                i += 1
        return x

    params = list({id(p): p for s in stages for p in s.parameters()}.values())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    peaks, times = [], []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with measure_memory(device) as meter:
            loss = forward()
            loss.backward()
            del loss
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        peaks.append(meter.peak_bytes)
    return {"measured_peak_bytes": max(peaks), "measured_time_s": statistics.median(times[1:] or times)}


def _run(stages, x0, plan, prof, *, steps: int, device: torch.device) -> dict:
    try:
        from executor import run_plan
    except ImportError:
        run_plan = None
    if run_plan is not None:
        rep = run_plan(stages, x0, plan, profile=prof, steps=steps, compare=False)
        return {"runner": "executor.run_plan", "measured_peak_bytes": rep.measured_peak_bytes,
                "measured_time_s": rep.measured_time_s}
    res = _run_minimal(stages, x0, plan, steps=steps, device=device)
    # the chain model counts a_0, which was allocated before the measured block
    res["measured_peak_bytes"] += prof.input_bytes
    return {"runner": "minimal", **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (a logic check, not a measurement)")
    ap.add_argument("--dtype", default="bfloat16", help="parameter dtype (default bfloat16)")
    ap.add_argument("--steps", type=int, default=3, help="steps per plan")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: CUDA is not available; use --device cpu --tiny", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    models = TINY if args.tiny else MODELS
    rows, results = [], []
    t_start = time.perf_counter()
    for name, fields in models.items():
        cfg = GPTConfig(**fields, dtype=args.dtype, attention="flash")
        stages, x0 = build_gpt(cfg, device=device)
        t0 = time.perf_counter()
        prof = profile_chain(stages, x0, device=device, repeats=5, warmup=2, name=name)
        log.info("%s: profiled in %.1f s (attention: %s)", name, time.perf_counter() - t0,
                 prof.meta.get("attention_backend"))
        for plan in _plans(prof):
            res = _run(stages, x0, plan, prof, steps=args.steps, device=device)
            pred_peak, pred_time = plan.predicted.peak_bytes, plan.predicted.time_s
            peak_err = 100.0 * (pred_peak - res["measured_peak_bytes"]) / res["measured_peak_bytes"]
            time_err = 100.0 * (pred_time - res["measured_time_s"]) / res["measured_time_s"]
            record = {
                "model": name, "strategy": plan.strategy, "feasible": plan.feasible,
                "predicted_peak_bytes": pred_peak, "predicted_time_s": pred_time,
                "peak_error_pct": peak_err, "time_error_pct": time_err,
                "fixed_bytes": prof.fixed_bytes, **res,
            }
            results.append(record)
            rows.append(record)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del stages, x0
    elapsed = time.perf_counter() - t_start
    header = f"{'model':<12} {'strategy':<10} {'pred peak':>12} {'meas peak':>12} {'err %':>7} " \
             f"{'pred s':>9} {'meas s':>9} {'err %':>7}"
    print(header)
    for r in rows:
        print(f"{r['model']:<12} {r['strategy']:<10} {r['predicted_peak_bytes'] / 2**20:>10.1f}Mi "
              f"{r['measured_peak_bytes'] / 2**20:>10.1f}Mi {r['peak_error_pct']:>7.2f} "
              f"{r['predicted_time_s']:>9.4f} {r['measured_time_s']:>9.4f} {r['time_error_pct']:>7.2f}")
    print(f"total {elapsed:.1f} s; targets: peak within 2%, time within 10%")
    out = args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json"))
    info = {
        "date": time.strftime("%Y-%m-%d"), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "dtype": args.dtype, "tiny": args.tiny, "elapsed_s": elapsed,
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
