"""A Hugging Face causal LM built from a local config, a plan installed by `auto_checkpoint`, and a
plain training loop: the path `memplan run --hf-config` and the quickstart demo show.

Nothing is downloaded: the model is built from the config's JSON with random weights, and the
batches are random tokens of the config's vocabulary.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from memplan.executor.apply import (
    InstallError,
    OffloadNeedsCudaError,
    auto_checkpoint,
    measure_step,
    remove_checkpoint,
)
from memplan.executor.offload import RUN_CPU_REFUSAL
from memplan.profiler.hf_config import CONFIG_DTYPES, REUSE_LOGITS_NEEDS_LEAN

__all__ = ["HFRun", "hf_config_of", "hf_model_from_config", "run_hf_config"]

log = logging.getLogger(__name__)


@dataclass
class HFRun:
    """What a plain loop with the installed plan did, against the plan's prediction."""

    model: str  # the config's model_type
    n_params: int
    strategy: str
    budget_bytes: int | None  # the activation budget asked for (None: the fastest plan)
    store_all_peak_bytes: int | None  # predicted, nothing recomputed
    predicted_peak_bytes: int  # the installed plan's activation peak
    measured_peak_bytes: int  # the user's step, exact CPU accounting (or CUDA's counters)
    peak_error_pct: float | None
    predicted_step_s: float
    measured_step_s: float
    recomputed: list[int]  # stages run forward more than once
    stage_policies: dict[int, str]  # blocks recorded under a save policy (others: 'all')
    losses: list[float]  # the plain loop's loss per step
    message: str

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


def hf_config_of(config: str | Path | dict) -> Any:
    """The transformers config (a `PretrainedConfig`) of a causal LM's config (a JSON file path or
    a dict with "model_type"), checked before any model is built: a known model_type, a torch
    dtype, activations transformers has, and two or more layers (the blocks memplan plans).
    Raises `InstallError` naming the field (a missing file, no model_type, transformers not
    installed, or one of those)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
        from transformers.activations import ACT2FN
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        raise InstallError("--hf-config: needs transformers (pip install 'transformers>=4.57,<6')") from None
    if not isinstance(config, dict):
        path = Path(config)
        if not path.is_file():
            raise InstallError(f"--hf-config: no file {str(path)!r}; give a model's config.json")
        try:
            config = json.loads(path.read_text())
        except ValueError as err:
            raise InstallError(f"--hf-config: {path} is not JSON ({err})") from None
        if not isinstance(config, dict):
            raise InstallError(f"--hf-config: {path} holds a JSON {type(config).__name__}, not a "
                               "config object")
    config = dict(config)
    model_type = config.pop("model_type", None)
    if not model_type:
        raise InstallError("--hf-config: the config has no model_type (e.g. \"gpt2\", \"llama\")")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise InstallError(f"--hf-config: model_type {model_type!r} is not one transformers "
                           f"{transformers.__version__} knows (e.g. gpt2, llama, mistral, qwen2)")
    for key in ("torch_dtype", "dtype"):
        v = config.get(key)
        if v is not None and not (isinstance(v, torch.dtype) and v.is_floating_point) and v not in CONFIG_DTYPES:
            raise InstallError(f"--hf-config: {key} {v!r} is not a torch dtype (e.g. float32, "
                               "bfloat16); the model is built in float32 either way")
    for key in ("hidden_act", "activation_function"):
        v = config.get(key)
        if v is not None and (not isinstance(v, str) or v not in ACT2FN):
            raise InstallError(f"--hf-config: {key} {v!r} is not an activation transformers has "
                               "(e.g. gelu, gelu_new, silu, relu)")
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **config)
    except (ValueError, KeyError, TypeError) as err:
        raise InstallError(f"--hf-config: model_type {model_type!r}: {err}") from None
    n_layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(n_layers, int) and n_layers < 2:
        raise InstallError(f"--hf-config: num_hidden_layers is {n_layers}; memplan plans a chain of "
                           "two or more blocks, so give 2 or more")
    cfg.use_cache = False
    return cfg


def hf_model_from_config(config: str | Path | dict) -> torch.nn.Module:
    """A causal LM with random weights from a config (a JSON file path or a dict with
    "model_type"), in fp32 with eager or sdpa attention as the config says. Raises `InstallError`
    as `hf_config_of` does."""
    import transformers

    return transformers.AutoModelForCausalLM.from_config(hf_config_of(config))


def run_hf_config(config: str | Path | dict, *, batch_size: int = 4, seq: int = 64,
                  budget: int | str | None = None, fraction: float | None = None,
                  strategy: str = "optimal", steps: int = 3, seed: int = 0,
                  policies: bool = False, compile: bool = False, lean_loss: bool = False,
                  reuse_logits: bool = False, offload_bandwidth: float | None = None,
                  host_memory_bytes: int | None = None) -> HFRun:
    """Build the model, `auto_checkpoint` it on a random batch (for `budget` bytes, or `fraction` of
    its store-all activation peak), run `steps` AdamW steps of a plain loop on fresh batches, and
    measure one more step against the prediction (`measure_step`). `policies`: profile the blocks'
    save policies so the plan may record blocks under them; `compile`: compile each block
    (`auto_checkpoint`'s options of the same names); `lean_loss`: the model computes its loss with
    `memplan.lean_loss` (docs/apply.md, "A lean loss"), with `reuse_logits` the one whose backward
    writes the logits' gradient over the logits (the loop reads only the loss).
    `offload_bandwidth` (bytes/s) and `host_memory_bytes`: the optimal plan may also move kept
    activations to host memory (`auto_checkpoint`'s options; the model runs on the CPU here, where
    a plan that moves any is refused with `InstallError`, and one that moves none runs).

    Returns an `HFRun` (bytes, seconds). Raises `InstallError` on bad input and
    `InfeasiblePlanError` when nothing fits the budget."""
    from memplan.executor.apply import profile_model
    from memplan.planner import plan as make_plan

    for name, v in (("batch_size", batch_size), ("seq", seq)):
        if not isinstance(v, int) or v < 1:
            raise InstallError(f"{name}: an integer >= 1, got {v!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InstallError(f"steps: an integer >= 1, got {steps!r}")
    if reuse_logits and not lean_loss:
        raise InstallError(REUSE_LOGITS_NEEDS_LEAN)
    torch.manual_seed(seed)
    model = hf_model_from_config(config).train()
    if lean_loss:
        from memplan.executor.lean_loss import lean_loss as use_lean_loss

        use_lean_loss(model, reuse_logits=reuse_logits)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 1)

    def batch() -> dict:
        ids = torch.randint(0, vocab, (batch_size, seq), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}

    example = batch()
    prof = profile_model(model, example, repeats=3, warmup=1, policies=policies, compile=compile)
    store = make_plan(prof, strategy="store-all").predicted.peak_bytes
    if fraction is not None:
        budget = int(fraction * store)
    try:
        plan = auto_checkpoint(model, example, budget=budget, strategy=strategy, profile=prof,
                               compile=compile, offload_bandwidth=offload_bandwidth,
                               host_memory_bytes=host_memory_bytes)
    except OffloadNeedsCudaError:  # named as the run's option, as `run_builtin` names it
        raise InstallError(RUN_CPU_REFUSAL) from None
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(steps):  # the user's plain loop, unchanged
            opt.zero_grad()
            loss = model(**batch()).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        m = measure_step(model, batch(), time_steps=2)
    finally:
        remove_checkpoint(model)
    return HFRun(
        model=model.config.model_type, n_params=sum(p.numel() for p in model.parameters()),
        strategy=plan.strategy, budget_bytes=plan.budget_bytes, store_all_peak_bytes=store,
        predicted_peak_bytes=plan.predicted.peak_bytes, measured_peak_bytes=m.measured_peak_bytes,
        peak_error_pct=m.peak_error_pct, predicted_step_s=plan.predicted.time_s,
        measured_step_s=m.measured_step_s, recomputed=list(plan.recomputed),
        stage_policies=dict(plan.stage_policies), losses=losses,
        message=m.message,
    )
