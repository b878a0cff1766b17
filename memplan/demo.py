"""The quickstart's main job: profile, plan, run and compare a built-in GPT on the CPU, then the
same for your own model in your own loop.

A small GPT (dropout on, so the RNG guard matters) is profiled, planned with the optimal strategy
at 60% of its store-all activation peak, run for 3 training steps, and compared with the unplanned
step: the table shows predicted against measured peak and time, then the gradient comparison.
Then a tiny Hugging Face GPT-2 is built from a config (random weights, nothing downloaded),
`memplan.auto_checkpoint` installs an optimal plan at 50% of its store-all peak, a plain training
loop runs 3 steps, and `memplan.measure_step` gives measured against predicted (skipped, with a
line saying so, where transformers is not installed).
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
    from memplan.planner.units import format_bytes
    from memplan.profiler.measure import profile_chain
    from memplan.profiler.models.gpt import GPTConfig, build_gpt

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
    _your_model()


# the tiny GPT-2 of the second part (a config as a model's config.json has it)
HF_CONFIG = {"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_embd": 64, "n_layer": 6,
             "n_head": 4, "tie_word_embeddings": False, "bos_token_id": 255, "eos_token_id": 255}


def _your_model() -> None:
    """auto_checkpoint on a Hugging Face model in a plain loop, predicted against measured."""
    # transformers imports torchao when it is installed, whose optional CUDA kernels say at import
    # that they did not load (no GPU here); the demo shows memplan's output, not theirs
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum registrations
    try:
        import transformers
    except ImportError:
        print("\nyour model: skipped (pip install 'transformers>=4.57,<6' to run it)")
        return
    transformers.logging.set_verbosity_error()
    from memplan.executor.install import run_hf_config
    from memplan.planner.units import format_bytes

    print("\nyour model, your loop: plan = memplan.auto_checkpoint(model, batch, budget=...), then "
          "loss = model(**batch).loss; loss.backward(); opt.step()")
    run = run_hf_config(HF_CONFIG, batch_size=4, seq=32, fraction=0.5, steps=3)
    print(f"  {run.model} from a config ({run.n_params:,} parameters), {run.strategy} plan at 50% of "
          f"the store-all peak {format_bytes(run.store_all_peak_bytes)}; recomputes stages "
          f"{run.recomputed}")
    print(f"  losses of the plain loop: {', '.join(f'{v:.4f}' for v in run.losses)}")
    print(f"  peak activations: {format_bytes(run.predicted_peak_bytes)} predicted, "
          f"{format_bytes(run.measured_peak_bytes)} measured ({run.peak_error_pct:+.2f}%)")
    print(f"  step time: {run.predicted_step_s * 1e3:.1f} ms predicted, "
          f"{run.measured_step_s * 1e3:.1f} ms measured")


if __name__ == "__main__":
    main()
