"""`run_plan`: run a plan's schedule for a few training steps, measure it, and prove it.

NOTE [ What one run measures ]
Each step runs the unplanned reference first (a deep copy of the stages: plain forward, one
backward), then the planned schedule on the stages from the same RNG state, so both see the same
dropout masks; their gradients are compared before either optimizer steps, and both optimizers
step, so the two models stay in lockstep and their buffers and parameters are compared after the
last step. Before each step after the first, the reference's parameters and optimizer state are
set to the planned model's (NOTE [ Every step from the same state ]). Parameter gradients are
allocated (zeros) before the first step and zeroed in place between steps, so the measured peak
is the plan's, not the first step's gradient allocation.
Memory is measured over the schedule of the last step (state warm: optimizer state, lazily
initialised observers) with `memplan.profiler.memory.measure_memory` (exact allocation accounting on the
CPU, `max_memory_allocated` after a reset on CUDA); time is the median over the other steps,
without the memory profiler's overhead (the first step is left out when there are three or more).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from memplan.executor.compare import (
    Diff,
    reference_copy,
    reference_forward,
    tensor_diff,
    tolerance_for,
)
from memplan.executor.guards import GUARDS
from memplan.executor.report import (
    PEAK_TOLERANCE_PCT,
    ExecutorError,
    RunReport,
    StepRecord,
    error_pct,
    peak_problem,
)
from memplan.executor.runner import ScheduleRunner
from memplan.planner.schema import Plan, PlanError
from memplan.profiler.fixed import param_dtype
from memplan.profiler.schema import Profile, load_profile
from memplan.profiler.tensors import storage_bytes, unique_buffers, unique_params
from torch import nn

__all__ = ["run_plan", "check_plan", "policy_recompute", "fixed_bytes_of", "make_optimizer",
           "optimizer_step"]

log = logging.getLogger(__name__)

# largest relative gradient difference accepted from compiled stages (compile=True): inductor's
# fused fp32 kernels sum in another order (measured 1.1e-6 on a tiny GPT on the CPU)
COMPILED_TOLERANCE = 1e-4

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def make_optimizer(params: list[nn.Parameter], optimizer: str | Callable) -> torch.optim.Optimizer | None:
    """'adamw' (lr 1e-3), 'sgd' (lr 1e-2, momentum 0.9), 'none', or a callable params -> optimizer."""
    trainable = [p for p in params if p.requires_grad]
    if callable(optimizer):
        return optimizer(trainable)
    if optimizer == "adamw":
        # foreach=False: the per-parameter loop, whose transient memory does not grow with the model
        return torch.optim.AdamW(trainable, lr=1e-3, foreach=False)
    if optimizer == "sgd":
        return torch.optim.SGD(trainable, lr=1e-2, momentum=0.9, foreach=False)
    if optimizer == "none":
        return None
    raise ExecutorError(
        f"optimizer: unknown {optimizer!r}; use 'adamw', 'sgd', 'none' or a callable params -> optimizer"
    )


def optimizer_step(opt: torch.optim.Optimizer, scaler=None) -> None:
    """One optimizer step; through the gradient scaler when there is one (it unscales the
    gradients, skips the step on infs or NaNs and updates its scale)."""
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()


def fixed_bytes_of(stages: Sequence[nn.Module], opt: torch.optim.Optimizer | None, *,
                   device: torch.device | None = None) -> int:
    """Bytes of the distinct storages of parameters, their gradients, buffers and optimizer state;
    with `device`, only those on it (AdamW keeps its step counters on the CPU when the parameters
    are on a GPU, and a GPU's memory does not hold them: profiler.measure counts them likewise)."""
    params = unique_params(stages)
    states = list(opt.state.values()) if opt is not None else []
    return storage_bytes([params, [p.grad for p in params], unique_buffers(stages), states],
                         device=device)


def check_plan(stages: Sequence[nn.Module], plan: Plan | dict | str,
               profile: Profile | dict | str | None = None) -> tuple[Plan, Profile | None]:
    """The plan (and profile), validated against the stages before anything runs.

    Raises `ExecutorError` naming the field: a plan without a schedule, a stage count that differs
    from the stages', a plan made for another profile (fingerprint), an invalid schedule, a save
    policy the profile does not have (`plan.stage_policies.i`) or save policies without the
    profile that defines them."""
    from memplan.planner.simulate import simulate

    if not isinstance(stages, (list, tuple, nn.ModuleList, nn.Sequential)) or len(stages) == 0:
        raise ExecutorError("stages: expected a non-empty sequence of nn.Module, run in order")
    for k, stage in enumerate(stages):
        if not isinstance(stage, nn.Module):
            raise ExecutorError(f"stages[{k}]: expected an nn.Module, got {type(stage).__name__}")
    try:
        if isinstance(plan, str):
            plan = Plan.model_validate_json(plan)
        elif isinstance(plan, dict):
            plan = Plan.model_validate(plan)
    except (ValueError, PlanError) as err:
        raise ExecutorError(f"plan: not a valid Plan ({str(err).splitlines()[0]})") from None
    if not isinstance(plan, Plan):
        raise ExecutorError(f"plan: expected a Plan, a dict or JSON text, got {type(plan).__name__}")
    if not plan.schedule:
        raise ExecutorError(f"plan: it has no schedule ({plan.message or 'infeasible'}); plan again "
                            "with a larger budget or another strategy")
    L = len(stages)
    if plan.n_stages != L:
        raise ExecutorError(
            f"plan.n_stages: the plan is for {plan.n_stages} stages but the model has {L}; "
            "plan the profile of this model"
        )
    prof = None
    if profile is not None:
        prof = load_profile(profile)
        if prof.n_stages != L:
            raise ExecutorError(
                f"profile: it has {prof.n_stages} stages but the model has {L}; profile this model"
            )
        if plan.profile_fingerprint and plan.profile_fingerprint != prof.fingerprint():
            raise ExecutorError(
                f"plan.profile_fingerprint: {plan.profile_fingerprint} is not this profile's "
                f"{prof.fingerprint()}: the plan was made for another model; plan this profile"
            )
        try:
            sim = simulate(prof, plan.schedule, policies=plan.stage_policies or None,
                           offload_bandwidth=plan.options.get("offload_bandwidth"))
        except PlanError as err:
            raise ExecutorError(f"plan.{str(err).splitlines()[0]}; plan this profile, or profile "
                                "the model with that policy") from None
    else:
        if policy_names(plan):
            i = min(policy_names(plan))
            raise ExecutorError(
                f"plan.stage_policies.{i}: stage {i} runs under the save policy "
                f"{plan.stage_policies[i]!r}, which only the profile defines; pass the profile "
                "the plan was made from (profile=)")
        dummy = Profile(input_bytes=0, layers=[
            dict(name=f"s{i}", forward_s=0, backward_s=0, output_bytes=0, saved_bytes=0)
            for i in range(1, L + 1)])
        sim = simulate(dummy, plan.schedule,
                       offload_bandwidth=plan.options.get("offload_bandwidth"))
    if not sim.valid:
        raise ExecutorError(f"plan.schedule: {sim.error}")
    return plan, prof


def policy_names(plan: Plan) -> dict[int, str]:
    """The plan's stages recorded under a save policy other than 'all': stage -> policy name."""
    from memplan.profiler.schema import SAVE_ALL

    return {int(i): name for i, name in plan.stage_policies.items() if name != SAVE_ALL}


def policy_recompute(plan: Plan, profile: Profile | None) -> dict[int, list[str]]:
    """Stage i -> the operators its `R i` recomputes in the backward (`SavePolicy.recompute` of
    the policy `plan.stage_policies[i]` in `profile.layers[i-1]`), for the stages whose policy is
    not 'all'. Raises `ExecutorError` naming `plan.stage_policies.i` when the profile is missing
    or has no such policy."""
    out: dict[int, list[str]] = {}
    for i, name in sorted(policy_names(plan).items()):
        if profile is None:
            raise ExecutorError(
                f"plan.stage_policies.{i}: stage {i} runs under the save policy {name!r}, which "
                "only the profile defines; pass the profile the plan was made from (profile=)")
        if not 1 <= i <= profile.n_stages:
            raise ExecutorError(f"plan.stage_policies.{i}: no stage {i}; stages are "
                                f"1..{profile.n_stages}")
        layer = profile.layers[i - 1]
        found = [p for p in layer.policies if p.name == name]
        if not found:
            raise ExecutorError(
                f"plan.stage_policies.{i}: stage {i} ({layer.name}) has no policy {name!r} in "
                f"the profile; it has {', '.join(layer.policy_names)}; plan this profile")
        out[i] = list(found[0].recompute)
    return out


def device_of(stages: Sequence[nn.Module], example_input: Any) -> torch.device:
    """The device a chain runs on: its first parameter's, else its input's, else the CPU."""
    for stage in stages:
        for p in stage.parameters():
            return p.device
    if isinstance(example_input, torch.Tensor):
        return example_input.device
    return torch.device("cpu")


def _rng_get(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _rng_set(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _sync_reference(stages, opt, ref, ref_opt) -> None:
    """NOTE [ Every step from the same state ]
    Each step's gradients are compared "from the same state", so the reference starts each step
    from the planned model's parameters and optimizer state. Where kernels are deterministic (the
    CPU) this copies equal values and changes nothing. Where they are not (atomic adds on a GPU:
    flash attention's backward, index_add), the first step's gradients differ in the last bits,
    AdamW's first update (about lr x sign(g)) turns a last-bit difference of a near-zero gradient
    into a whole step of the learning rate, and without this the two runs drift apart step after
    step (seen on an H200: bf16 GPT-2's gradients 40% apart after six steps of store-all, a plan
    with no recompute at all). Buffers are not copied: BatchNorm statistics, observers and
    counters must still come out equal after all the steps on their own. For the same reason the
    parameters after the last step are judged only when that step's gradients were bitwise equal
    (on the H200, bf16 GPT-2's gradients stayed within 0.3-1.8% of the reference in every step
    while single parameters, zero-initialised biases, moved 2-8% apart)."""
    with torch.no_grad():
        for p, q in zip(unique_params(stages), unique_params(ref), strict=True):
            q.copy_(p)
            if opt is None or ref_opt is None:
                continue
            for key, value in opt.state.get(p, {}).items():
                mine = ref_opt.state[q].get(key)
                if isinstance(value, torch.Tensor) and isinstance(mine, torch.Tensor):
                    mine.copy_(value)
                else:  # never shared: the reference's step would change the planned state
                    ref_opt.state[q][key] = value.clone() if isinstance(value, torch.Tensor) else value


def _alloc_grads(stages: Sequence[nn.Module]) -> None:
    for p in unique_params(stages):
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


def _zero_grads(stages: Sequence[nn.Module]) -> None:
    for p in unique_params(stages):
        if p.grad is not None:
            p.grad.zero_()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_plan(
    stages: Sequence[nn.Module],
    example_input: Any,
    plan: Plan | dict | str,
    *,
    steps: int = 3,
    optimizer: str | Callable = "adamw",
    autocast_dtype: torch.dtype | None = None,
    profile: Profile | dict | str | None = None,
    compare: bool = True,
    features: Sequence[str] = (),
    on_step: Callable[[int, int], None] | None = None,
    guards: Sequence[str] = GUARDS,
    peak_tolerance_pct: float | None = PEAK_TOLERANCE_PCT,
    compile: bool = False,
) -> RunReport:
    """Run `plan`'s schedule over `stages` (the last returns the scalar loss) for `steps` training
    steps on `example_input`, measure its peak (bytes) and time (seconds), and compare its
    gradients, loss, buffers and parameters with the unplanned step from the same state.

    `profile` (the one the plan was made from) enables the fingerprint check and the check of
    every stage's output bytes; `autocast_dtype` runs forwards under autocast (float16 also scales
    the loss with a GradScaler); `guards` are on by default (switch one off only to demonstrate
    the trap it closes). Raises `ExecutorError` before anything runs when the plan does not
    fit the model. Returns a `RunReport` (status 'mismatch' when a comparison is over tolerance,
    or the measured peak is more than `peak_tolerance_pct` percent off the prediction; None:
    the peak is not judged). Stages the plan records under a save policy (`plan.stage_policies`)
    run under it (its recompute list from `profile`, which must then be given); `compile` runs
    each stage through `torch.compile` (NOTE [ Save policies in the runner ] in runner.py).
    """
    plan, prof = check_plan(stages, plan, profile)
    from memplan.executor.offload import check_device

    # a plan that moves tensors needs CUDA (NOTE [ Offload in the executor ], 6)
    check_device(plan.ops(), device_of(list(stages), example_input))
    policies = policy_recompute(plan, prof)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ExecutorError(f"steps: expected an integer of at least 1, got {steps!r}")
    if autocast_dtype is not None and autocast_dtype not in (torch.bfloat16, torch.float16):
        raise ExecutorError(
            f"autocast_dtype: use torch.bfloat16, torch.float16 or None, got {autocast_dtype!r}"
        )
    stages = list(stages)
    device = device_of(stages, example_input)
    # the compute dtype sets the gradient tolerance: autocast's, else the parameters' (a model
    # built in bfloat16 computes in it)
    dtype_name = _DTYPES.get(autocast_dtype or param_dtype(stages), "float32")
    ops = plan.ops()

    _alloc_grads(stages)
    opt = make_optimizer(unique_params(stages), optimizer)
    ref = ref_opt = None
    if compare:
        ref = reference_copy(stages)
        _alloc_grads(ref)
        ref_opt = make_optimizer(unique_params(ref), optimizer)
    scaler = ref_scaler = None
    if autocast_dtype is torch.float16:
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
        ref_scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
        # the runner seeds d_L with the scale itself, so initialise the scaler's lazy state here
        scaler.scale(torch.ones((), device=device))

    runner = ScheduleRunner(stages, ops, device=device, autocast_dtype=autocast_dtype, guards=guards,
                            storage=plan.checkpoint_dtypes, policies=policies, compile=compile)
    input_bytes = storage_bytes([example_input])
    records: list[StepRecord] = []
    grad_diff = Diff()
    last_bitwise = True  # the last step's gradients bitwise equal to the reference's
    loss_rel = 0.0
    measured_peak = 0
    timed: list[float] = []
    mem_step = steps
    time_steps = set(range(2, steps)) if steps >= 3 else set(range(1, steps)) or {1}

    for step in range(1, steps + 1):
        rng = _rng_get(device)
        ref_loss = None
        if ref is not None:
            if step > 1:
                _sync_reference(stages, opt, ref, ref_opt)
            _zero_grads(ref)
            loss_r, sizes = reference_forward(ref, example_input, autocast_dtype=autocast_dtype,
                                              device=device)
            if step == 1 and prof is not None:
                for i, (got, layer) in enumerate(zip(sizes, prof.layers, strict=True), start=1):
                    if got != layer.output_bytes:
                        raise ExecutorError(
                            f"profile.layers[{i - 1}].output_bytes: stage {i} ({layer.name}) "
                            f"outputs {got} bytes here, the profile says {layer.output_bytes}; "
                            "the plan was made for another model or input: profile this one"
                        )
            (ref_scaler.scale(loss_r) if ref_scaler else loss_r).backward()
            ref_loss = float(loss_r.detach())
            del loss_r
            if ref_scaler:
                ref_scaler.unscale_(ref_opt)
            _rng_set(rng, device)

        _zero_grads(stages)
        runner.prepare()
        scale = float(scaler.get_scale()) if scaler else None
        _sync(device)
        if step == mem_step:
            from memplan.profiler.memory import measure_memory

            with measure_memory(device) as meter:
                loss = runner.step(example_input, loss_scale=scale)
            measured_peak = meter.peak_bytes + input_bytes
            seconds = None  # not timed: the accounting slows the step
        else:
            t0 = time.perf_counter()
            loss = runner.step(example_input, loss_scale=scale)
            _sync(device)
            seconds = time.perf_counter() - t0
            if step in time_steps:
                timed.append(seconds)
        if scaler:
            scaler.unscale_(opt)
        loss_f = float(loss)
        rec = StepRecord(step=step, loss=loss_f, reference_loss=ref_loss, schedule_s=seconds)
        if ref is not None:
            d = tensor_diff((p.grad, q.grad) for p, q in zip(unique_params(stages), unique_params(ref),
                                                             strict=True))
            grad_diff = grad_diff.merge(d)
            last_bitwise = d.bitwise
            rec.grad_max_abs_diff, rec.grad_max_rel_diff = d.max_abs, d.max_rel
            lr = tensor_diff([(loss.reshape(1), torch.tensor([ref_loss], dtype=loss.dtype, device=loss.device))])
            loss_rel = max(loss_rel, lr.max_rel)
        records.append(rec)
        if opt is not None:
            optimizer_step(opt, scaler)
        if ref_opt is not None:
            optimizer_step(ref_opt, ref_scaler)
        if on_step is not None:
            on_step(step, steps)

    tol = tolerance_for(dtype_name)
    if compile:  # compiled kernels fuse and reorder float sums: not bitwise, a few ulps apart
        tol = max(tol, COMPILED_TOLERANCE)
    if plan.checkpoint_dtypes and isinstance(plan.options.get("tolerance"), (int, float)):
        # lossy checkpoint storage: the plan was made to stay within this gradient error
        tol = max(tol, float(plan.options["tolerance"]))
    buf_diff = param_diff = None
    problems: list[str] = []
    if ref is not None:
        buf_diff = tensor_diff(zip(unique_buffers(stages), unique_buffers(ref), strict=True))
        param_diff = tensor_diff(zip(unique_params(stages), unique_params(ref), strict=True))
        if grad_diff.max_rel > tol:
            problems.append(f"gradients differ from the unplanned step (rel {grad_diff.max_rel:.3g} > {tol:.3g})")
        if buf_diff.max_rel > tol:
            problems.append(f"buffers differ from the unplanned run (rel {buf_diff.max_rel:.3g})")
        unjudged = ""
        if param_diff.max_rel > tol:
            if last_bitwise:
                problems.append(f"parameters differ after {steps} steps (rel {param_diff.max_rel:.3g})")
            else:  # NOTE [ Every step from the same state ]: AdamW turns last-bit gradient
                # differences of near-zero gradients into whole learning-rate steps
                unjudged = (f"; parameters not judged (rel {param_diff.max_rel:.3g}): the last "
                            "step's gradients were not bitwise equal, and the optimizer's update "
                            "magnifies that")
        if loss_rel > tol:
            problems.append(f"loss differs (rel {loss_rel:.3g})")
        message = "; ".join(problems) or (
            "gradients, loss, buffers and parameters bitwise equal to the unplanned run"
            if grad_diff.bitwise and buf_diff.bitwise and param_diff.bitwise and loss_rel == 0
            else f"within tolerance {tol:.3g} of the unplanned run{unjudged}")
    else:
        message = "not compared with the unplanned step (compare=False)"
    pred = plan.predicted
    peak = peak_problem(measured_peak, pred.peak_bytes if pred else None, peak_tolerance_pct)
    if peak is not None:  # memory is judged too: a plan that does not hold its peak is no match
        message = "; ".join([*problems, peak]) if problems else f"{peak}; {message}"
        problems.append(peak)

    untimed = [r.schedule_s for r in records if r.schedule_s is not None]
    measured_time = statistics.median(timed) if timed else (untimed[-1] if untimed else None)
    return RunReport(
        status="mismatch" if problems else "ok",
        message=message,
        strategy=plan.strategy,
        n_stages=len(stages),
        steps=steps,
        device=str(device),
        dtype=dtype_name,
        optimizer=optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "custom"),
        features=list(features),
        stage_policies=dict(plan.stage_policies),
        compiled=bool(compile),
        predicted_peak_bytes=pred.peak_bytes if pred else None,
        measured_peak_bytes=measured_peak,
        peak_error_pct=error_pct(measured_peak, pred.peak_bytes if pred else None),
        predicted_time_s=pred.time_s if pred else None,
        measured_time_s=measured_time,
        time_error_pct=error_pct(measured_time, pred.time_s if pred else None),
        predicted_overhead=pred.overhead if pred else None,
        measured_fixed_bytes=fixed_bytes_of(stages, opt, device=device),
        predicted_fixed_bytes=prof.fixed_bytes if prof else None,
        loss=records[0].loss,
        reference_loss=records[0].reference_loss,
        grad_max_abs_diff=grad_diff.max_abs if ref is not None else None,
        grad_max_rel_diff=grad_diff.max_rel if ref is not None else None,
        buffer_max_abs_diff=buf_diff.max_abs if buf_diff else None,
        param_max_abs_diff=param_diff.max_abs if param_diff else None,
        tolerance=tol,
        peak_tolerance_pct=peak_tolerance_pct,
        forward_counts=runner.counts,
        guard_notes=runner.guards.notes(),
        step_records=records,
    )
