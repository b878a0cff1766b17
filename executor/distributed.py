"""A sharded data-parallel run on the CPU (torch.distributed, gloo): does a plan for N GPUs predict
what each rank holds?

`run_distributed(spec)` profiles a built-in GPT at the per-rank micro-batch, prices its fixed bytes
for `world_size` ranks at ZeRO `zero_stage` (`memplan.planner.sharding.shard_profile`), plans it, then runs
the plan on `world_size` processes joined by gloo: each rank runs the schedule on its own slice of
one global batch, the gradients are averaged (all-reduce) and the optimizer steps. Per rank it
measures (exactly, `memplan.profiler.memory.measure_memory`) the planned step's activation peak and counts
the model states it holds after a step; it compares them, and the gradients and parameters, with
the prediction and with one process training on the whole batch.

NOTE [ What is sharded here ]
Stage 0 is plain data parallelism (every rank holds all states). Stage 1 shards the optimizer state
with `torch.distributed.optim.ZeroRedundancyOptimizer` (AdamW), which partitions by whole
parameter tensors, so a rank's share is Psi/N only up to the granularity of its largest tensor; the
formula (`sharded_fixed_bytes`) assumes an even split, ceil(K Psi / N). AdamW's 4-byte step
counter per parameter tensor lives with the shard that owns the tensor. Stages 2 and 3 need the
gradients reduced and freed (and the weights gathered) stage by stage inside the backward, which
the schedule runner does not do: they are planned (planner.sharding) but not run here.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memplan.executor.report import ExecutorError
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DistributedSpec", "RankReport", "DistributedReport", "run_distributed", "RUN_STAGES"]

log = logging.getLogger(__name__)

RUN_STAGES = (0, 1)  # ZeRO stages this runner executes (see NOTE [ What is sharded here ])

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


@dataclass
class DistributedSpec:
    n_layer: int = 2  # GPT blocks
    n_embd: int = 32  # width
    n_head: int = 2  # heads
    block_size: int = 16  # sequence length
    vocab_size: int = 64  # vocabulary
    batch_size: int = 2  # sequences per rank (the global batch is world_size times this)
    world_size: int = 2  # processes (ranks), one per simulated GPU
    zero_stage: int = 1  # 0: plain data parallel; 1: sharded optimizer state
    strategy: str = "optimal"  # planner strategy
    budget_bytes: int | None = None  # activation budget per rank; None: no limit
    steps: int = 2  # training steps (step 2 is measured: the optimizer state exists by then)
    lr: float = 1e-3  # AdamW learning rate
    seed: int = 0  # weights and data


class RankReport(BaseModel):
    """What one rank held and allocated."""

    model_config = _STRICT

    rank: int
    params: int = Field(description="parameters whose optimizer state this rank holds")
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int = Field(description="optimizer state on this rank, step counters included")
    buffer_bytes: int
    fixed_bytes: int = Field(description="weights + gradients + optimizer state + buffers")
    measured_peak_bytes: int = Field(description="the planned step's peak above fixed, a_0 included")
    loss: float


class DistributedReport(BaseModel):
    """A plan for `world_size` GPUs at ZeRO `zero_stage`, checked on gloo ranks."""

    model_config = _STRICT

    status: str = Field(description="'ok' when every check holds, else 'mismatch'")
    message: str
    world_size: int
    zero_stage: int
    strategy: str
    n_params: int
    predicted_fixed_bytes: int = Field(description="per rank, planner.sharding's formula")
    predicted_peak_bytes: int = Field(description="the plan's activation peak per rank")
    predicted_total_bytes: int
    measured_fixed_bytes: int = Field(description="the largest rank's")
    measured_peak_bytes: int = Field(description="the largest rank's")
    measured_total_bytes: int = Field(description="the largest rank's fixed + peak")
    fixed_error_pct: float | None
    peak_error_pct: float | None
    total_error_pct: float | None
    optimizer_bytes_unsharded: int = Field(description="one process's optimizer state")
    grad_max_rel_diff: float = Field(description="step 1, against one process on the whole batch")
    param_max_rel_diff: float = Field(
        description="after the last step, against one process's AdamW on the same averaged gradients")
    ranks: list[RankReport]
    plan: dict[str, Any]


def _check(spec: DistributedSpec) -> None:
    for name in ("n_layer", "n_embd", "n_head", "block_size", "vocab_size", "batch_size", "steps"):
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ExecutorError(f"{name}: expected an integer of at least 1, got {v!r}")
    if isinstance(spec.world_size, bool) or not isinstance(spec.world_size, int) or not 1 <= spec.world_size <= 8:
        raise ExecutorError(f"world_size: expected 1 to 8 processes, got {spec.world_size!r}")
    if spec.zero_stage not in RUN_STAGES:
        raise ExecutorError(
            f"zero_stage: this gloo runner executes stages {RUN_STAGES} (stages 2 and 3 are planned "
            f"by planner.sharding, not run); got {spec.zero_stage!r}"
        )


def _gpt_config(spec: DistributedSpec, batch: int):
    from memplan.profiler.models.gpt import GPTConfig

    return GPTConfig(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head,
                     block_size=spec.block_size, vocab_size=spec.vocab_size, batch_size=batch,
                     dropout=0.0, tie_weights=False, seed=spec.seed)


def _global_batch(spec: DistributedSpec):
    import torch

    gen = torch.Generator().manual_seed(spec.seed + 1)
    seq = torch.randint(0, spec.vocab_size, (spec.world_size * spec.batch_size, spec.block_size + 1),
                        generator=gen)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # (W B, T) tokens and targets


def _model(spec: DistributedSpec, rank: int | None):
    """Stages (same weights on every rank) and this rank's slice of the global batch (None: all)."""
    from memplan.profiler.models.gpt import build_gpt, set_targets

    idx, tgt = _global_batch(spec)
    if rank is not None:
        sl = slice(rank * spec.batch_size, (rank + 1) * spec.batch_size)
        idx, tgt = idx[sl].contiguous(), tgt[sl].contiguous()
    stages, _ = build_gpt(_gpt_config(spec, idx.shape[0]))
    set_targets(stages, tgt)
    return stages, idx


def _state_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and hasattr(t, "untyped_storage"):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


# NOTE [ A rank leaves nothing running ]
# A thread of torch.distributed still running when a rank's interpreter finalizes is torn down
# there, unordered with C++ static destructors, and the rank may die of SIGABRT ("terminate called
# without an active exception") after its results were written. Three rules keep rank processes
# clear of that:
# 1. The rendezvous is a FileStore in the run's temporary directory: no server, thread or port.
#    With tcp://, rank 0 hosts a TCPStore server (a libuv thread) the other ranks are connected
#    to, and picking a free port to bind later races other processes.
# 2. torch.distributed.optim and torch.distributed.nn are imported before init_process_group.
#    Their `group=dist.group.WORLD` defaults (torch.distributed.nn.functional,
#    zero_redundancy_optimizer._broadcast_object; DDP imports torch.distributed.nn), evaluated
#    after it, pin the default group with its gloo threads past destroy_process_group.
# 3. `run_ranks` ends a rank whose function returned with os._exit(0), after flushing its output,
#    so no rank reaches finalization at all. Not every holder can be released: after fully_shard
#    or any DTensor op, DTensor's sharding-propagation caches keep DTensorSpecs, their DeviceMesh,
#    its `_pg_registry` and so the group and its gloo threads (checked: gloo_tcp_loop and
#    pt_gloo_runloop still run after destroy_process_group and a collection).
def _rank_main(rank: int, spec_d: dict, plan_d: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from memplan.executor.runner import ScheduleRunner
    from memplan.planner.schema import Plan
    from memplan.profiler.memory import measure_memory
    from memplan.profiler.tensors import unique_params

    # before init_process_group: NOTE [ A rank leaves nothing running ]
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.set_num_threads(1)
    spec = DistributedSpec(**spec_d)
    dist.init_process_group("gloo", init_method=(Path(out_dir) / "store").as_uri(), rank=rank,
                            world_size=spec.world_size)
    try:
        stages, x = _model(spec, rank)
        params = unique_params(stages)
        for p in params:
            p.grad = torch.zeros_like(p)
        if spec.zero_stage == 1:
            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=spec.lr)
            local = opt.optim
        else:
            opt = local = torch.optim.AdamW(params, lr=spec.lr)
        plan = Plan.model_validate(plan_d)
        runner = ScheduleRunner(stages, plan.ops(), device=torch.device("cpu"))
        input_bytes = x.untyped_storage().nbytes()
        peak = 0
        loss_f = 0.0
        for step in range(1, spec.steps + 1):
            for p in params:
                p.grad.zero_()
            runner.prepare()
            if step == spec.steps:
                with measure_memory("cpu") as meter:
                    loss = runner.step(x)
                peak = meter.peak_bytes + input_bytes
            else:
                loss = runner.step(x)
            if step == 1:
                loss_f = float(loss)
            for p in params:  # data parallel: average the gradients of the ranks' micro-batches
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(spec.world_size)
            torch.save([p.grad.clone() for p in params], Path(out_dir) / f"grads{rank}_{step}.pt")
            opt.step()
        state = [t for s in local.state.values() for t in s.values() if torch.is_tensor(t)]
        owned = sum(p.numel() for p in local.state)
        bufs = [b for s in stages for b in s.buffers()]
        rep = RankReport(
            rank=rank, params=owned, weight_bytes=_state_bytes(params),
            grad_bytes=_state_bytes(p.grad for p in params), optimizer_bytes=_state_bytes(state),
            buffer_bytes=_state_bytes(bufs),
            fixed_bytes=_state_bytes([*params, *(p.grad for p in params), *state, *bufs]),
            measured_peak_bytes=peak, loss=loss_f,
        )
        (Path(out_dir) / f"rank{rank}.json").write_text(rep.model_dump_json())
        torch.save([p.detach().clone() for p in params], Path(out_dir) / f"params{rank}.pt")
        dist.barrier()  # leave together: no rank destroys the group while another still uses it
    finally:
        dist.destroy_process_group()


def _reference(spec: DistributedSpec, step_grads: list[list[Any]]):
    """One process: the whole global batch's gradients at step 1 (plain forward and backward), and
    the parameters after AdamW steps on the ranks' averaged gradients `step_grads` (per step)."""
    import torch
    from memplan.executor.compare import reference_forward
    from memplan.profiler.tensors import unique_params

    stages, x = _model(spec, None)
    params = unique_params(stages)
    loss, _ = reference_forward(stages, x, device=torch.device("cpu"))
    loss.backward()
    grads = [p.grad.clone() for p in params]
    opt = torch.optim.AdamW(params, lr=spec.lr)
    for g in step_grads:
        for p, gi in zip(params, g, strict=True):
            p.grad = gi.clone()
        opt.step()
    return grads, [p.detach().clone() for p in params], opt


def _rel(pairs) -> float:
    worst = 0.0
    for a, b in pairs:
        scale = float(b.abs().max())
        diff = float((a - b).abs().max())
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _leave_after(rank: int, fn, *args) -> None:
    """Run `fn(rank, *args)` in a spawned rank; when it returns, end the process at once with exit
    status 0 (NOTE [ A rank leaves nothing running ]). An exception propagates as usual, and
    torch's spawn wrapper reports it."""
    import logging
    import os
    import sys

    fn(rank, *args)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn, args: tuple, *, nprocs: int, timeout_s: float) -> None:
    """Run `fn(rank, *args)` in `nprocs` spawned processes and wait for all of them, at most
    `timeout_s` seconds; whatever is still alive at the end is terminated. Returns None (the ranks
    write their results to files). Raises `ExecutorError` naming `ranks` when one fails, dies or
    does not finish in time."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.start_processes(_leave_after, args=(fn, *args), nprocs=nprocs, join=False,
                             start_method="spawn")
    try:
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise ExecutorError(f"ranks: not finished within {timeout_s:g} s")
    except mp.ProcessRaisedException as err:
        raise ExecutorError(f"ranks: a rank failed: {str(err).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as err:  # killed by a signal, or exited without a word
        raise ExecutorError(f"ranks: rank {err.error_index} died ({err}); nothing was "
                            "measured, run again") from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()


def run_distributed(spec: DistributedSpec | None = None, *, timeout_s: float = 300.0) -> DistributedReport:
    """Plan `spec`'s GPT for `spec.world_size` ranks at ZeRO `spec.zero_stage`, run the plan on that
    many gloo processes on the CPU, and compare per-rank bytes (fixed, activation peak, total)
    with the prediction and the gradients and parameters with one process on the whole batch.

    Returns a `DistributedReport` (bytes, errors in percent of measured); raises `ExecutorError`
    on bad input or when a rank fails."""
    import torch
    from memplan.executor.report import error_pct
    from memplan.planner.sharding import shard_profile
    from memplan.profiler.measure import profile_chain

    from memplan import planner

    spec = spec or DistributedSpec()
    _check(spec)
    if spec.strategy not in planner.STRATEGIES:
        raise ExecutorError(f"strategy: unknown {spec.strategy!r}; choose one of {', '.join(planner.STRATEGIES)}")
    stages, x = _model(spec, 0)
    prof = profile_chain(stages, x, repeats=1, warmup=1, name="gpt")
    sharded = shard_profile(prof, n_gpus=spec.world_size, zero_stage=spec.zero_stage)
    plan = planner.plan(sharded, budget_bytes=spec.budget_bytes, strategy=spec.strategy)
    if not plan.schedule:
        raise ExecutorError(f"budget_bytes: {plan.message}")
    del stages, x
    with tempfile.TemporaryDirectory(prefix="memplan-dist-") as out:
        run_ranks(_rank_main, (asdict(spec), plan.model_dump(mode="json"), out),
                  nprocs=spec.world_size, timeout_s=timeout_s)
        ranks = [RankReport.model_validate_json((Path(out) / f"rank{r}.json").read_text())
                 for r in range(spec.world_size)]
        grads = [[torch.load(Path(out) / f"grads{r}_{k}.pt") for k in range(1, spec.steps + 1)]
                 for r in range(spec.world_size)]
        params = [torch.load(Path(out) / f"params{r}.pt") for r in range(spec.world_size)]
    ref_grads, ref_params, ref_opt = _reference(spec, grads[0])
    grad_rel = max(_rel(zip(g[0], ref_grads, strict=True)) for g in grads)
    same = all(torch.equal(a, b) for g in grads[1:] for k in range(spec.steps)
               for a, b in zip(g[k], grads[0][k], strict=True))
    param_rel = max(_rel(zip(p, ref_params, strict=True)) for p in params)
    unsharded_opt = _state_bytes(t for s in ref_opt.state.values() for t in s.values() if torch.is_tensor(t))
    pred = plan.predicted
    worst = max(ranks, key=lambda r: r.fixed_bytes + r.measured_peak_bytes)
    m_fixed = max(r.fixed_bytes for r in ranks)
    m_peak = max(r.measured_peak_bytes for r in ranks)
    m_total = worst.fixed_bytes + worst.measured_peak_bytes
    problems = []
    tol = 1e-4  # float32 sums in another order (all-reduce) agree to a few ulps per element
    if grad_rel > tol:
        problems.append(f"gradients differ from one process on the whole batch (rel {grad_rel:.3g})")
    if not same:
        problems.append("the ranks' averaged gradients differ from each other")
    if param_rel > tol:
        problems.append(f"parameters differ from AdamW on the same gradients after {spec.steps} "
                        f"steps (rel {param_rel:.3g})")
    if sum(r.optimizer_bytes for r in ranks) != unsharded_opt * (1 if spec.zero_stage else spec.world_size):
        problems.append("optimizer state is not partitioned exactly across the ranks")
    report = DistributedReport(
        status="mismatch" if problems else "ok",
        message="; ".join(problems) or (
            f"{spec.world_size} gloo ranks at ZeRO {spec.zero_stage}: gradients match one "
            "process on the whole batch, parameters match AdamW on the same gradients"),
        world_size=spec.world_size, zero_stage=spec.zero_stage, strategy=plan.strategy,
        n_params=prof.meta["fixed"]["n_params"],
        predicted_fixed_bytes=sharded.fixed_bytes, predicted_peak_bytes=pred.peak_bytes,
        predicted_total_bytes=pred.total_peak_bytes,
        measured_fixed_bytes=m_fixed, measured_peak_bytes=m_peak, measured_total_bytes=m_total,
        fixed_error_pct=error_pct(m_fixed, sharded.fixed_bytes),
        peak_error_pct=error_pct(m_peak, pred.peak_bytes),
        total_error_pct=error_pct(m_total, pred.total_peak_bytes),
        optimizer_bytes_unsharded=unsharded_opt,
        grad_max_rel_diff=grad_rel, param_max_rel_diff=param_rel,
        ranks=ranks, plan=plan.model_dump(mode="json"),
    )
    log.info("distributed run: %s", json.dumps({k: v for k, v in report.model_dump().items()
                                                if k not in ("ranks", "plan")}))
    return report


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m executor.distributed
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(run_distributed().model_dump_json(indent=2, exclude={"plan"}))  # noqa: T201
