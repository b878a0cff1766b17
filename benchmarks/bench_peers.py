"""memplan's installed plans against the checkpointing a user can already reach for, on tiny Hugging
Face GPT-2 and Llama models built from configs (random weights, nothing downloaded), in one run
(issues 21 and 22).

Contenders, each on its own copy of the same model (same weights), all in the user's plain step
(`model(**batch).loss.backward()`, gradients kept allocated between steps):

- unplanned: the model as built (every activation stored);
- hf-gc: `model.activation_checkpointing_enable(use_reentrant=False)` (transformers 5.x; before,
  `gradient_checkpointing_enable`): every layer checkpointed;
- ckpt-seq: torch `checkpoint_sequential` over the blocks with round(sqrt(L)) segments. The
  blocks' ModuleList is replaced by a one-element ModuleList holding a module that, called as the
  first block with the model's keyword arguments (masks, positions, rotary tables), binds those
  arguments (and any positional ones after the hidden states) to each block and runs `checkpoint_sequential(blocks, segments, hidden_states,
  use_reentrant=False)` (NOTE [ Wrapping the blocks ]);
- compile-0.5 / compile-0.2: `torch.compile(model)` (inductor) with
  `torch._functorch.config.activation_memory_budget` 0.5 and 0.2 (a compile failure is recorded
  with its reason and the run goes on);
- titan-2: torchtitan's layer-selective checkpointing: every second block wrapped in
  `checkpoint_wrapper` (non-reentrant), as torchtitan's `selective_ac_option="2"` does;
- titan-ops: torchtitan's op-level selective checkpointing: every block checkpointed with a
  selective-checkpoint policy that saves matmul (mm, bmm, addmm) and attention outputs and
  recomputes the rest;
- memplan@PEER: `memplan.auto_checkpoint(model, batch, budget=PEER's measured activation peak)`
  (optimal, whole blocks), the plan installed in the model;
- memplan-sel@PEER: the same with save policies (`profile_model(..., policies=True)`: each block
  may also be recorded keeping only its matmul outputs, without attention's core, or nothing;
  docs/chain-model.md section 10.8), chosen per block with the checkpoints;
- memplan-sel-c@PEER: the same on compiled blocks (`compile=True`: `torch.compile` per block, so
  compile's fusion and memplan's placement add up), with the min-cut policies besides (each block
  compiled under activation memory budgets 0.5, 0.2, 0.1, 0.05 and 0: NOTE [ min-cut policies of
  compiled stages ] in profiler/policies.py);
- memplan*-front-K: optimal plans at a few budgets spread over each variant's frontier;
- with `--lean-loss`, memplan's contenders (named `...+lean`) compute the loss with
  `memplan.lean_loss` (NOTE [ the lean cross-entropy ] in profiler/lean_cross_entropy.py), the
  peers with Hugging Face's: the same loss to fp32 rounding, so their gradients differ from the
  unplanned step's by rounding, not 0; with `--lean-loss reuse` the lean loss also writes the
  logits' gradient over the logits (`lean_loss(model, reuse_logits=True)`: the step reads the
  loss only).

Peaks: activation bytes (the step's peak above the level before it, the batch included) by exact
CPU accounting, or on CUDA (`--device cuda`) the allocator's counters
(`memplan.profiler.memory.measure_memory`), one step after a warm one, the same function for every
contender. Times: one thread (`torch.set_num_threads(1)`), each contender's
step once per round in an order rotated from round to round (NOTE [ interleaved rounds ] in
bench_seed_claims.py); each time is reported as the median of its per-round ratios to the unplanned
step, with the min and a bootstrap 95% interval of that median, and as the ratio of the
contender's fastest step to the unplanned one's (the least disturbed by load on a shared machine). Writes a table to the log and JSON
to --out.

    .venv/bin/python benchmarks/bench_peers.py   # 6 layers, width 256, seq 128: 11 min here, 6 of them compiling
    .venv/bin/python benchmarks/bench_peers.py --layers 12 --seq 256 --vocab 50257 --rounds 11
    .venv/bin/python benchmarks/bench_peers.py --layers 4 --seq 64 --rounds 5 --no-compile

NOTE [ Wrapping the blocks ]
`checkpoint_sequential` runs a sequence of one-input modules. A Hugging Face decoder calls each
block with the hidden states and keyword arguments computed once per forward (the causal mask,
position ids, the rotary cos/sin). The wrapper receives them at its one call, binds them to every
block in a closure (the recompute of a segment runs in the backward, after the wrapper returned, and
needs them then), and hands `checkpoint_sequential` the list of closures; its output is the last
block's, in the type a block returns. The model's loop over its blocks (`for block in self.h`,
`self.layers[:num_hidden_layers]`) then calls the wrapper once.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.executor.apply import find_blocks, profile_model  # noqa: E402
from memplan.profiler.memory import measure_memory  # noqa: E402

import memplan  # noqa: E402

log = logging.getLogger("bench_peers")


# ---------------------------------------------------------------------------------------------
# models


def build(kind: str, *, layers: int, width: int, seq: int, vocab: int, seed: int = 0,
          device: str = "cpu", dtype: torch.dtype = torch.float32) -> nn.Module:
    """A `kind` ("gpt2" or "llama") causal LM from a config (sdpa attention: flash on CUDA in
    half precision; dropout 0, untied embeddings), random weights from `seed`, its parameters in
    `dtype` on `device`. Returns the model in train mode."""
    import transformers

    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=width, n_layer=layers,
                                      n_head=max(1, width // 64), resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, tie_word_embeddings=False)
        cls = transformers.GPT2LMHeadModel
    elif kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=(8 * width) // 3,
                                       num_hidden_layers=layers, num_attention_heads=max(1, width // 64),
                                       num_key_value_heads=max(1, width // 64), max_position_embeddings=seq,
                                       tie_word_embeddings=False)
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(f"kind: 'gpt2' or 'llama', not {kind!r}")
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    model = cls(cfg).to(device=device, dtype=dtype)
    model.train()
    return model


def make_batch(batch: int, seq: int, vocab: int, seed: int = 1, device: str = "cpu") -> dict:
    """{"input_ids", "labels"} on `device`: random tokens, labels equal to the inputs (the model
    shifts them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    return {"input_ids": ids, "labels": ids.clone()}


# ---------------------------------------------------------------------------------------------
# peers


def _run_block(block: nn.Module, args: tuple, kwargs: dict, hidden: torch.Tensor) -> torch.Tensor:
    """`block` on `hidden` with the forward's other arguments; its hidden states out."""
    out = block(hidden, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


class SequentialCheckpoint(nn.Module):
    """The model's blocks run by torch's `checkpoint_sequential` in `segments` segments
    (NOTE [ Wrapping the blocks ])."""

    def __init__(self, blocks: list[nn.Module], segments: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.segments = segments
        self.returns_tuple = False  # set by wrap_checkpoint_sequential from a block's real output

    def __getattr__(self, name):  # attributes the model's loop reads from a block (attention_type)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.blocks[0], name)

    def forward(self, hidden_states, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint_sequential

        # NOTE: the arguments are bound by closures, not stored on the modules: a segment's
        # recompute runs in the backward, after this forward has returned.
        fns = [functools.partial(_run_block, b, args, kwargs) for b in self.blocks]
        if torch.is_grad_enabled():
            out = checkpoint_sequential(fns, self.segments, hidden_states, use_reentrant=False)
        else:
            out = hidden_states
            for f in fns:
                out = f(out)
        return (out,) if self.returns_tuple else out


def _blocks_path(model: nn.Module) -> tuple[nn.Module, str]:
    """The ModuleList holding the blocks memplan finds (`find_blocks`), as (parent, attribute)."""
    _, blocks = find_blocks(model)
    for parent in model.modules():
        for attr, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and any(c is blocks[0] for c in child):
                return parent, attr
    raise ValueError("model: its blocks are not in an nn.ModuleList")


def _returns_tuple(block: nn.Module, model: nn.Module, batch: dict) -> bool:
    seen: list[bool] = []
    h = block.register_forward_hook(lambda m, a, out: seen.append(isinstance(out, tuple)))
    with torch.no_grad():
        model(**batch)
    h.remove()
    return bool(seen and seen[0])


def wrap_checkpoint_sequential(model: nn.Module, batch: dict) -> int:
    """Replace the blocks by one `SequentialCheckpoint` over them, round(sqrt(L)) segments.
    Returns the number of segments."""
    parent, attr = _blocks_path(model)
    blocks = list(getattr(parent, attr))
    tup = _returns_tuple(blocks[0], model, batch)
    segments = max(1, round(math.sqrt(len(blocks))))
    wrapper = SequentialCheckpoint(blocks, segments)
    wrapper.returns_tuple = tup
    setattr(parent, attr, nn.ModuleList([wrapper]))
    return segments


def wrap_every_other(model: nn.Module, every: int = 2) -> int:
    """torchtitan's layer-selective checkpointing: every `every`-th block (the 2nd, 4th, ...) wrapped
    in a non-reentrant `checkpoint_wrapper`. Returns how many blocks were wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    parent, attr = _blocks_path(model)
    blocks = getattr(parent, attr)
    n = 0
    for i in range(len(blocks)):
        if (i + 1) % every == 0:
            blocks[i] = checkpoint_wrapper(blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                           preserve_rng_state=False)
            n += 1
    return n


_SAVE_OPS = None


def _save_ops() -> set:
    global _SAVE_OPS
    if _SAVE_OPS is None:
        aten = torch.ops.aten
        ops = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.linear.default}
        for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_flash_attention_for_cpu"):
            op = getattr(aten, name, None)
            if op is not None:
                ops.add(op.default)
        _SAVE_OPS = ops
    return _SAVE_OPS


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _save_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def wrap_op_selective(model: nn.Module) -> int:
    """torchtitan's op-level selective checkpointing: every block checkpointed, saving matmul and
    attention outputs and recomputing the rest. Returns how many blocks were wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    parent, attr = _blocks_path(model)
    blocks = getattr(parent, attr)
    ctx = functools.partial(create_selective_checkpoint_contexts, _policy)
    for i in range(len(blocks)):
        blocks[i] = checkpoint_wrapper(blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                       preserve_rng_state=False, context_fn=ctx)
    return len(blocks)


# ---------------------------------------------------------------------------------------------
# one step, its peak


def stepper(model: nn.Module, batch: dict, budget: float | None = None):
    """One training step of the user's plain loop (gradients zeroed in place, forward, loss,
    backward) as a callable; `budget`: run it under that activation_memory_budget (compile)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)

    def step() -> float:
        for p in params:
            p.grad.zero_()
        if budget is None:
            loss = model(**batch).loss
            loss.backward()
        else:
            with torch._functorch.config.patch(activation_memory_budget=budget):
                loss = model(**batch).loss
                loss.backward()
        return float(loss.detach())  # (on CUDA this waits for the step: the timing's sync)

    return step


def batch_bytes(batch: dict) -> int:
    """Bytes of the batch's tensors (counted in every activation peak, as measure_step does)."""
    return sum(t.numel() * t.element_size() for t in batch.values())


def peak_of(step, batch: dict) -> int:
    """The activation peak of one step in bytes: the peak above the level before it (exact CPU
    accounting, or the CUDA allocator's counters on the batch's device), plus the batch. One warm
    step first."""
    step()
    gc.collect()
    with measure_memory(next(iter(batch.values())).device) as m:
        step()
    return m.peak_bytes + batch_bytes(batch)


# ---------------------------------------------------------------------------------------------
# timing


def interleaved(steppers: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of one step of each stepper per round, the order rotated each round. Returns name ->
    list of seconds (one per round)."""
    names = list(steppers)
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                steppers[name]()
                times[name].append(time.perf_counter() - t0)
            gc.collect()
            log.info("round %d/%d done", r + 1, rounds)
    finally:
        gc.enable()
    return times


def median_ci(values: list[float], *, level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """A percentile-bootstrap interval of the median of `values` (seeded)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return meds[int(tail * resamples)], meds[min(resamples - 1, int((1 - tail) * resamples))]


# ---------------------------------------------------------------------------------------------
# one family


def run_family(kind: str, args) -> dict:
    """Every contender on a `kind` model: peaks (bytes) and time ratios to the unplanned step.
    Returns the family's JSON record."""
    device, dtype = args.device, getattr(torch, args.dtype)
    shape = dict(layers=args.layers, width=args.width, seq=args.seq, vocab=args.vocab)
    base = build(kind, **shape, device=device, dtype=dtype)
    batch = make_batch(args.batch, args.seq, args.vocab, device=device)
    state = copy.deepcopy(base.state_dict())

    def fresh() -> nn.Module:
        m = build(kind, **shape, device=device, dtype=dtype)
        m.load_state_dict(state)
        return m

    peers: dict[str, dict] = {}
    steps: dict[str, object] = {}
    errors: dict[str, str] = {}
    ref_grads: list[torch.Tensor] = []  # the unplanned step's gradients, in parameter order

    def add(name: str, how: str, model: nn.Module, budget: float | None = None) -> None:
        try:
            s = stepper(model, batch, budget)
            t0 = time.perf_counter()
            peak = peak_of(s, batch)
            setup_s = time.perf_counter() - t0
        except Exception as err:  # a peer that cannot run on this machine is recorded, not fatal
            errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:400]
            log.warning("%s %s: skipped (%s)", kind, name, errors[name])
            return
        grads = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
        if not ref_grads:
            ref_grads.extend(grads)
        diff = max((float((g - r).abs().max()) for g, r in zip(grads, ref_grads, strict=True)), default=0.0)
        peers[name] = {"how": how, "peak_bytes": peak, "first_steps_s": round(setup_s, 3),
                       "max_grad_diff": diff}
        steps[name] = s
        log.info("%s %-14s peak %10d bytes, gradients within %.3g of the unplanned step's", kind, name, peak,
                 diff)

    add("unplanned", "the model as built", base)
    m = fresh()
    if hasattr(m, "activation_checkpointing_enable"):  # transformers 5.x's name; the old one warns
        m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    add("hf-gc", "HF activation (gradient) checkpointing enabled (every layer, non-reentrant)", m)
    m = fresh()
    seg = wrap_checkpoint_sequential(m, batch)
    add("ckpt-seq", f"torch checkpoint_sequential, {seg} segments (round(sqrt(L)))", m)
    m = fresh()
    n = wrap_every_other(m)
    add("titan-2", f"torchtitan layer-selective: every 2nd block checkpointed ({n} of {args.layers})", m)
    m = fresh()
    wrap_op_selective(m)
    add("titan-ops", "torchtitan op-level selective: every block, matmul and attention outputs saved", m)
    if not args.no_compile:
        for b in (0.5, 0.2):
            torch._dynamo.reset()
            m = fresh()
            add(f"compile-{b}", f"torch.compile (inductor), activation_memory_budget {b}", torch.compile(m), b)
    else:
        errors["compile"] = "not run (--no-compile)"

    # memplan: one profile per variant (whole blocks; with save policies; with save policies and
    # compiled blocks), a plan at each peer's measured peak and over the variant's frontier
    peer_names = [p for p in peers if p != "unplanned"]
    variants = [("memplan", "memplan optimal, whole blocks", {})]
    if not args.no_policies:
        variants.append(("memplan-sel", "memplan optimal with save policies", {"policies": True}))
        if not args.no_compile:
            variants.append(("memplan-sel-c", "memplan optimal with save policies, compiled blocks",
                             {"policies": True, "compile": True}))
    variants = [v for v in variants if v[0] in args.variants]
    if args.lean_loss:  # every memplan contender's model computes its loss with memplan.lean_loss
        reuse = args.lean_loss == "reuse"
        variants = [(f"{prefix}+lean" + ("-reuse" if reuse else ""),
                     f"{how}, lean loss" + (" reusing the logits" if reuse else ""),
                     {**kw, "lean": "reuse" if reuse else True}) for prefix, how, kw in variants]
    mine: dict[str, dict] = {}
    profile_s: dict[str, float] = {}
    fronts: dict[str, list] = {}
    for prefix, how, kw in variants:
        torch._dynamo.reset()
        t0 = time.perf_counter()
        lean = kw.pop("lean", False)

        def fresh_mine(lean=lean) -> nn.Module:
            return memplan.lean_loss(fresh(), reuse_logits=lean == "reuse") if lean else fresh()

        probe = fresh_mine()
        prof = profile_model(probe, batch, repeats=args.repeats, **kw)
        profile_s[prefix] = round(time.perf_counter() - t0, 2)
        del probe
        front = memplan.frontier(prof, points=args.frontier_points)
        fronts[prefix] = [{"peak_bytes": p.peak_bytes, "time_s": p.time_s, "overhead": p.overhead,
                           "policies": p.policies} for p in front.points]
        targets = [(f"{prefix}@{p}", peers[p]["peak_bytes"]) for p in peer_names]
        targets += [(f"{prefix}-front-{i}", pt.peak_bytes) for i, pt in enumerate(front.points)]
        for name, budget in targets:
            m = fresh_mine()
            try:
                plan = memplan.auto_checkpoint(m, batch, budget=int(budget), profile=prof,
                                               compile=kw.get("compile", False))
            except ValueError as err:
                mine[name] = {"budget_bytes": int(budget), "feasible": False, "message": str(err)[:300]}
                log.info("%s %-14s budget %10d: infeasible", kind, name, budget)
                continue
            counts: dict[str, int] = {}
            for pol in plan.stage_policies.values():
                counts[pol] = counts.get(pol, 0) + 1
            add(name, f"{how}, budget {int(budget)} bytes", m)
            if name in peers:
                peers[name].update(budget_bytes=int(budget),
                                   predicted_peak_bytes=plan.predicted.peak_bytes,
                                   predicted_overhead=plan.predicted.overhead,
                                   recomputed=plan.recomputed, policies=counts)

    times = interleaved(steps, args.rounds)
    for name, rec in peers.items():
        ratios = [t / b for t, b in zip(times[name], times["unplanned"], strict=True)]
        lo, hi = median_ci(ratios)
        rec.update(peak_ratio=rec["peak_bytes"] / peers["unplanned"]["peak_bytes"],
                   time_ratio_median=statistics.median(ratios), time_ratio_min=min(ratios),
                   time_ratio_ci95=[lo, hi],
                   time_ratio_of_mins=min(times[name]) / min(times["unplanned"]), step_s_median=statistics.median(times[name]),
                   step_s_min=min(times[name]))
    return {"kind": kind, "peers": peers, "infeasible": mine, "errors": errors, "profile_s": profile_s,
            "frontiers": fronts}


def table(rec: dict) -> str:
    """The family's table: contender, peak (MiB and ratio), time ratio (median [95% CI], min)."""
    rows = [f"{rec['kind']}: contender | peak MiB | peak ratio | time ratio median [95% CI] | min | "
            "min step / unplanned's min step | max |grad - unplanned grad|"]
    for name, r in rec["peers"].items():
        lo, hi = r["time_ratio_ci95"]
        pols = ", ".join(f"{k} x{v}" for k, v in r.get("policies", {}).items())
        rows.append(f"  {name:<22} | {r['peak_bytes'] / 2**20:8.1f} | {r['peak_ratio']:.3f} | "
                    f"{r['time_ratio_median']:.3f} [{lo:.3f}, {hi:.3f}] | {r['time_ratio_min']:.3f} | "
                    f"{r['time_ratio_of_mins']:.3f} | {r['max_grad_diff']:.2g}"
                    + (f" | {pols}" if pols else ""))
    for name, r in rec["infeasible"].items():
        rows.append(f"  {name:<22} | infeasible at {r['budget_bytes'] / 2**20:.1f} MiB")
    for name, why in rec["errors"].items():
        rows.append(f"  {name:<22} | not run: {why}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,llama", help="comma-separated: gpt2, llama")
    ap.add_argument("--layers", type=int, default=6, help="blocks (issue 22's table: 12)")
    ap.add_argument("--width", type=int, default=256, help="hidden size (issue 22: 256)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence (issue 22: 256)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per batch (issue 22: 4)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary (GPT-2's: 50257)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--repeats", type=int, default=3, help="memplan's profile repeats")
    ap.add_argument("--frontier-points", type=int, default=3,
                    help="memplan.frontier(points=): about this many, plus the points at the "
                    "baselines' peaks, which it keeps")
    ap.add_argument("--no-compile", action="store_true",
                    help="skip the torch.compile peers and memplan's compiled blocks")
    ap.add_argument("--no-policies", action="store_true",
                    help="memplan plans whole blocks only (no save policies)")
    ap.add_argument("--variants", default="memplan,memplan-sel,memplan-sel-c",
                    help="comma-separated memplan variants to run: memplan (whole blocks), "
                    "memplan-sel (save policies), memplan-sel-c (save policies on compiled blocks, "
                    "min-cut policies included)")
    ap.add_argument("--lean-loss", nargs="?", const="plain", default=None, choices=("plain", "reuse"),
                    help="memplan's contenders compute the loss with memplan.lean_loss (the "
                    "peers keep Hugging Face's; docs/apply.md, 'A lean loss'); 'reuse': its "
                    "backward writes the logits' gradient over the logits")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the comparison uses 1)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the models' parameter dtype (default float32)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        if v not in ("memplan", "memplan-sel", "memplan-sel-c"):
            print(f"--variants: memplan, memplan-sel and/or memplan-sel-c, not {v!r}", file=sys.stderr)
            return 2
    for k in kinds:
        if k not in ("gpt2", "llama"):
            print(f"--models: gpt2 and/or llama, not {k!r}", file=sys.stderr)
            return 2
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        print(f"--device: cpu, or cuda where CUDA is available; got {args.device!r}", file=sys.stderr)
        return 2
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: pip install 'transformers>=4.57,<6'", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "load_avg_start": os.getloadavg(), "torch": torch.__version__,
           "transformers": transformers.__version__, "args": {k: str(v) for k, v in vars(args).items()},
           "families": []}
    t0 = time.perf_counter()
    for kind in kinds:
        rec = run_family(kind, args)
        out["families"].append(rec)
        log.info("%s", table(rec))
    out["load_avg_end"] = os.getloadavg()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    for rec in out["families"]:
        log.info("%s", table(rec))
    log.info("wall %.0f s, load %s -> %s", out["wall_s"], out["load_avg_start"], out["load_avg_end"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
