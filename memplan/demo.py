"""The quickstart's main job: profile, plan, run and compare a built-in GPT on the CPU.

A small GPT (dropout on, so the RNG guard matters) is profiled, planned with the optimal strategy
at 60% of its store-all activation peak, run for 3 training steps, and compared with the unplanned
step: the table shows predicted against measured peak and time, then the gradient comparison.
"""

from __future__ import annotations

import logging


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from memplan.cli import quiet_torch_native_warnings

    quiet_torch_native_warnings()
    import torch

    from memplan import planner
    from memplan.cli.run import print_report
    from memplan.executor.pipeline import RunSpec, run_builtin
    from memplan.profiler.measure import profile_chain
    from memplan.profiler.models.gpt import GPTConfig, build_gpt
    from memplan.units import format_bytes

    # one thread: on a small shared CPU, intra-op threads waiting on each other make timings erratic
    torch.set_num_threads(1)
    spec = RunSpec(model="gpt", n_layer=6, n_embd=64, n_head=4, block_size=32, vocab_size=256,
                   batch_size=4, dropout=0.1, strategy="optimal",
                   repeats=2)
    stages, x = build_gpt(GPTConfig(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head,
                                    block_size=spec.block_size, vocab_size=spec.vocab_size,
                                    batch_size=spec.batch_size, dropout=spec.dropout, attention="math"))
    store = planner.plan(profile_chain(stages, x, repeats=1, warmup=0), strategy="store-all")
    spec.budget_bytes = int(store.predicted.peak_bytes * 0.6)
    print(f"store-all peak {format_bytes(store.predicted.peak_bytes)}; planning {spec.strategy} "
          f"within {format_bytes(spec.budget_bytes)} (60%)")
    report, _, _ = run_builtin(spec)
    print_report(report)


if __name__ == "__main__":
    main()
