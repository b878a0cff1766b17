"""Precision policies x checkpoint storage on the GPT family, CPU: memory, time, gradient error and
the loss after many training steps, against fp32 measured in the same run.

    .venv/bin/python benchmarks/bench_precision.py [--steps 200] [--out docs]

Per policy (fp32, bf16-mixed, fp16-mixed, bf16) and storage of the kept activations (as computed,
bf16, fp8): the plan checkpoints every block (one-level, torch.utils.checkpoint style) so that
storage matters; its measured activation peak and fixed bytes (exact CPU accounting) against the
replay's prediction; the median step time over `steps` AdamW steps, as a ratio to fp32; the
gradient error at the initial weights against the fp32 unplanned step (max_rel and norm_rel,
executor/precision_run.py) and against the same policy stored as computed (the storage's own
cost); the final loss against fp32's. Writes bench_precision.json and bench_precision.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

CFG = dict(n_layer=6, n_embd=64, n_head=4, block_size=64, vocab_size=256, batch_size=4)
POLICIES = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
STORAGES = ("compute", "bfloat16", "float8_e4m3fn")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from memplan.executor import run_plan
    from memplan.executor.precision_run import (
        fp32_curve,
        grad_error,
        plan_grads,
        policy_autocast,
        reference_grads,
        train_curve,
    )
    from memplan.planner._build import finish_plan, one_level_ops
    from memplan.planner.checkpoint_dtype import apply_storage
    from memplan.profiler.measure import profile_chain
    from memplan.profiler.models.gpt import GPTConfig, build_gpt
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    def build(dt):
        return build_gpt(GPTConfig(**CFG, dtype=str(dt).removeprefix("torch.")))

    L = CFG["n_layer"] + 2
    ops = one_level_ops([(1, 1, False)] + [(i, i, True) for i in range(2, L)] + [(L, L, False)], L)
    rows = []
    combos = [(p, s) for p in POLICIES for s in STORAGES if not (p == "bf16" and s == "bfloat16")]
    with Progress(transient=True) as prog:
        task = prog.add_task("fp32 reference", total=args.steps * (len(combos) + 1))
        t0 = time.perf_counter()
        ref_losses = fp32_curve(build, args.steps)
        prog.advance(task, args.steps)
        fp32_ref_s = time.perf_counter() - t0
        for policy, storage in combos:
            prog.update(task, description=f"{policy} / {storage}")
            pdtype, ac = policy_autocast(policy)
            stages, idx = build(pdtype)
            prof = profile_chain(stages, idx, repeats=1, warmup=0, autocast_dtype=ac)
            plan = finish_plan(prof, ops, strategy="every-block", budget_bytes=None)
            if storage != "compute":
                plan = apply_storage(plan, prof, checkpoint_dtype=storage, tolerance=1.0)
            _, fp32_grads = reference_grads(build(torch.float32)[0], idx)
            scale = 2.0**10 if ac is torch.float16 else None
            _, same = plan_grads(stages, idx, plan.ops(), autocast_dtype=ac, loss_scale=scale)
            _, got = plan_grads(stages, idx, plan.ops(), autocast_dtype=ac, loss_scale=scale,
                                storage=plan.checkpoint_dtypes)
            vs_fp32 = grad_error(got, fp32_grads)
            vs_policy = grad_error(got, same)
            # after the gradients: run_plan steps the optimizer
            run = run_plan(stages, idx, plan, profile=prof, steps=1, autocast_dtype=ac, compare=False)
            curve = train_curve(build, plan, policy=policy, steps=args.steps, reference=ref_losses,
                                on_step=lambda *_: prog.advance(task))
            rows.append(dict(
                policy=policy, storage=storage, stored=len(plan.checkpoint_dtypes),
                fixed_bytes=run.measured_fixed_bytes, predicted_fixed_bytes=prof.fixed_bytes,
                peak_bytes=run.measured_peak_bytes, predicted_peak_bytes=run.predicted_peak_bytes,
                step_s=statistics.median(curve.seconds[1:] or curve.seconds),
                grad_max_rel_vs_fp32=vs_fp32.max_rel, grad_norm_rel_vs_fp32=vs_fp32.norm_rel,
                grad_max_rel_vs_policy=vs_policy.max_rel, grad_norm_rel_vs_policy=vs_policy.norm_rel,
                final_loss=curve.losses[-1], final_loss_fp32=ref_losses[-1],
                final_loss_rel=curve.final_rel, max_divergence=max(curve.divergence),
                losses=curve.losses,
            ))
    base = next(r for r in rows if r["policy"] == "fp32" and r["storage"] == "compute")
    table = Table(title=f"GPT {CFG}, {args.steps} AdamW steps, CPU ({torch.get_num_threads()} thread)")
    for col in ("policy", "storage", "fixed", "peak", "peak pred", "peak/fp32", "time/fp32",
                "grad err vs fp32 (max, norm)", "storage's own (max)", "final loss", "vs fp32"):
        table.add_column(col, justify="left" if col in ("policy", "storage") else "right")
    for r in rows:
        table.add_row(
            r["policy"], r["storage"], f"{r['fixed_bytes']:,}", f"{r['peak_bytes']:,}",
            f"{r['predicted_peak_bytes']:,}", f"{r['peak_bytes'] / base['peak_bytes']:.3f}",
            f"{r['step_s'] / base['step_s']:.2f}",
            f"{r['grad_max_rel_vs_fp32']:.2e}, {r['grad_norm_rel_vs_fp32']:.2e}",
            f"{r['grad_max_rel_vs_policy']:.2e}", f"{r['final_loss']:.4f}", f"{r['final_loss_rel']:+.2e}",
        )
    Console(width=220).print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(date=time.strftime("%Y-%m-%d"), machine=f"{platform.machine()}, 2 cores shared, 1 torch thread",
                torch=torch.__version__, config=CFG, steps=args.steps, fp32_reference_s=fp32_ref_s,
                plan="one-level, every block checkpointed")
    (args.out / "bench_precision.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    _plot(rows, ref_losses, args.out / "bench_precision.png")


def _plot(rows, ref_losses, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    steps = range(1, len(ref_losses) + 1)
    ax1.plot(steps, ref_losses, color="black", lw=2, label="fp32 unplanned")
    for r in rows:
        ax1.plot(steps, r["losses"], lw=0.8, label=f"{r['policy']} / {r['storage']}")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_title("loss curves")
    ax1.legend(fontsize=6)
    for r in rows:
        ax2.scatter(r["peak_bytes"] / 1024, max(r["grad_max_rel_vs_fp32"], 1e-9),
                    marker={"compute": "o", "bfloat16": "s", "float8_e4m3fn": "^"}[r["storage"]])
        ax2.annotate(f"{r['policy']}/{r['storage'][:4]}", (r["peak_bytes"] / 1024,
                     max(r["grad_max_rel_vs_fp32"], 1e-9)), fontsize=6)
    ax2.set_yscale("log")
    ax2.set_xlabel("measured activation peak (KiB)")
    ax2.set_ylabel("gradient error vs fp32 (max_rel)")
    ax2.set_title("memory vs gradient error")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
