"""Capacity answers before launch: does a Hugging Face decoder train on these GPUs at this sequence
length, with which recompute, how large can the micro-batch and the sequence be, and how few GPUs
will do.

Every answer is a plan: the analytic profile of the config (`memplan.profiler.hf_config`), its
model states priced by the precision policy and sharded by ZeRO (`memplan.planner.sharding`), and
the optimal checkpoint plan for the memory left (`memplan.planner.plan`), whose replay
(`memplan.planner.simulate`) gives the peak and the recompute overhead. "Fits" means that plan is
feasible within `memory_bytes` per GPU and, with `max_overhead`, recomputes at most that fraction
of the step.

NOTE [ Capacity searches ]
Each search asks the same question of more or less work and bisects: the peak of the optimal plan
grows with the micro-batch and the sequence (every activation does), and the per-GPU model states
shrink with the GPUs at ZeRO 1-3, so each answer is the exact boundary of a monotone predicate,
found with O(log) plans. At ZeRO 0 more GPUs leave each one the same bytes: the fewest GPUs is 1 or
none. Searches stop at the caps below and say so (`*_capped`).
Under model parallelism (tp x cp x pp GPUs a replica, `memplan.planner.parallelism`) the GPUs are
searched in whole replicas (the fewest is a multiple of tp x cp x pp) and the sequence in multiples
of cp (times tp under SP), the sizes a layout accepts. A size fits when pipeline ranks 0 and
P - 1 both fit (NOTE [ A pipeline rank as one chain ] 3).
"""

from __future__ import annotations

import logging
from typing import Any

from memplan.planner.devices import DEVICES, DevicePreset, device_preset
from memplan.planner.parallelism import MAX_PARALLEL
from memplan.planner.schema import PlanError
from memplan.profiler.hf_config import REUSE_LOGITS_NEEDS_LEAN, loss_meta
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DevicePreset", "DEVICES", "device_preset", "CapacityRequest", "CapacityAnswer",
           "PolicyRow", "capacity", "MAX_MICRO_BATCH", "MAX_SEQ_LEN", "MAX_GPUS", "MAX_LAYERS"]

log = logging.getLogger(__name__)

MAX_MICRO_BATCH = 1 << 16  # search cap: sequences per micro-batch
MAX_SEQ_LEN = 1 << 22  # search cap: tokens per sequence
MAX_GPUS = 1 << 16  # search cap: all GPUs
MAX_PIPELINE_MICRO_BATCHES = 1 << 12  # micro-batches a step (gradient accumulation)
MAX_LAYERS = 1024  # decoder layers an answer plans (published decoders have at most ~130); each
# answer makes ~40 optimal plans of layers + 2 stages
# bytes of one parameter as the analytic profile stores it (param_bytes), per policy
_POLICY_P = {"fp32": 4, "bf16-mixed": 4, "fp16-mixed": 4, "bf16": 2}


class CapacityRequest(BaseModel):
    """The question: a config, a device and a training setup."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    config: dict[str, Any] = Field(description="the model's Hugging Face config.json, as an object")
    memory_bytes: int | None = Field(default=None, ge=1, le=1 << 60,
                                     description="memory of one GPU, bytes; None: the device preset's")
    device: str | None = Field(default=None, max_length=64,
                               description="a preset (h100, a100-80gb, ...): memory and peak FLOP/s")
    precision: str = Field(default="bf16-mixed", description="fp32, bf16-mixed, fp16-mixed or bf16")
    seq_len: int = Field(default=4096, ge=1, le=MAX_SEQ_LEN, description="tokens per sequence")
    micro_batch: int = Field(default=1, ge=1, le=MAX_MICRO_BATCH, description="sequences a micro-batch (per data-parallel replica)")
    n_gpus: int = Field(default=1, ge=1, le=MAX_GPUS, description="all GPUs: data parallel x tp x cp x pp")
    zero_stage: int = Field(default=0, ge=0, le=3, description="ZeRO stage 0-3 (3: FSDP full shard) "
                            "over the data-parallel replicas")
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="tensor-parallel GPUs (Megatron-style "
                    "split of heads and MLP columns; divides the heads and the MLP width)")
    sp: bool = Field(default=False, description="sequence parallelism over the tp GPUs (norms and "
                     "residual stream split by token)")
    cp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="context-parallel GPUs (each "
                    "sequence's tokens split; K and V all-gathered); divides seq_len")
    pp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="pipeline stages (1F1B)")
    micro_batches: int | None = Field(default=None, ge=1, le=MAX_PIPELINE_MICRO_BATCHES,
                                      description="micro-batches a step (the pipeline's M, gradient "
                                      "accumulation); None: pp")
    virtual_stages: int = Field(default=1, ge=1, le=64, description="model chunks a pipeline rank "
                                "holds: 1 is 1F1B, more the interleaved schedule")
    intra_node_bandwidth: float | None = Field(default=None, gt=0, le=1e15, description="bytes a "
                                               "second each way between GPUs of a node (step time "
                                               "only); None: the device preset's")
    inter_node_bandwidth: float | None = Field(default=None, gt=0, le=1e15, description="bytes a "
                                               "second each way per GPU across nodes; None: the "
                                               "preset's")
    gpus_per_node: int | None = Field(default=None, ge=1, le=1024, description="GPUs a node holds; "
                                      "None: the preset's (8)")
    max_overhead: float | None = Field(default=None, ge=0, le=10,
                                       description="most recompute allowed, a fraction of the step")
    attention: str = Field(default="sdpa", description="sdpa (flash kernel) or eager")
    optimizer: str = Field(default="adamw", description="adamw, adam, sgd-momentum, sgd, none")
    utilization: float = Field(default=0.4, gt=0, le=1,
                               description="fraction of the peak FLOP/s the step reaches (times only)")
    peak_flops: float | None = Field(default=None, gt=0, description="peak FLOP/s; None: the preset's "
                                     "or 1e15")
    policies: bool = Field(default=True, description="also answer for each precision policy (table)")
    lean_loss: bool = Field(default=False, description="the head computes memplan.lean_loss (logits and "
                            "per-token log-sum-exps saved, no log-softmax; not with tp > 1)")
    reuse_logits: bool = Field(default=False, description="with lean_loss: its backward writes the "
                               "logits' gradient over the logits (memplan.lean_loss(model, "
                               "reuse_logits=True)), one N x V tensor less at the head's peak")


class PolicyRow(BaseModel):
    """One row of the per-policy table: the same question under another precision policy."""

    precision: str
    bytes_per_param: int = Field(description="weights + gradients + optimizer state, bytes")
    model_state_bytes: int = Field(description="per GPU, after ZeRO sharding")
    store_all_activation_bytes: int = Field(description="activation peak with nothing recomputed")
    fits: bool
    overhead: float | None = Field(description="the optimal plan's recompute, a fraction of the step")
    max_micro_batch: int


class CapacityAnswer(BaseModel):
    """Whether it fits and the boundaries around it (bytes per GPU, seconds per step)."""

    model: str
    n_params: int
    n_active_params: int
    precision: str
    memory_bytes: int
    seq_len: int
    micro_batch: int
    n_gpus: int
    zero_stage: int
    max_overhead: float | None
    fits: bool
    message: str
    model_state_bytes: int = Field(description="weights, gradients, optimizer state per GPU")
    total_peak_bytes: int | None = Field(description="the plan's predicted peak per GPU")
    activation_peak_bytes: int | None = Field(description="the plan's peak above the model states")
    store_all_activation_bytes: int = Field(description="activation peak with nothing recomputed")
    overhead: float | None = Field(description="recompute time / step time without recompute")
    recomputed: list[int] = Field(default_factory=list, description="stages recomputed (1-based)")
    step_time_s: float | None = Field(description="the step's time, seconds: compute at utilization "
                                      "x peak plus communication (NOTE [ Step time under parallelism ])")
    max_micro_batch: int = Field(description="largest micro-batch that fits (0: none)")
    max_micro_batch_capped: bool
    max_seq_len: int = Field(description="longest sequence that fits at micro_batch (0: none)")
    max_seq_len_capped: bool
    min_gpus: int | None = Field(description="fewest GPUs that fit at this ZeRO stage (None: none "
                                 "up to the cap, or ZeRO 0 and one GPU does not fit)")
    policies: list[PolicyRow] = Field(default_factory=list)
    parallel: dict[str, Any] = Field(default_factory=dict, description="the layout (tp, sp, cp, pp, "
                                     "dp, micro_batches, virtual_stages) and per planned pipeline "
                                     "rank its micro-batches in flight and peak")
    comm_buffer_bytes: int = Field(default=0, description="communication buffers per GPU (in the peak; "
                                   "NOTE [ Communication buffers ] in planner/parallelism.py)")
    step: dict[str, Any] = Field(default_factory=dict, description="the step time's parts (seconds) "
                                 "and bytes sent per GPU (NOTE [ Step time under parallelism ])")
    assumptions: dict[str, Any] = Field(default_factory=dict)


class _Asker:
    """Plans of one config at any (micro-batch, sequence, GPUs, policy, pipeline rank), each made once."""

    def __init__(self, req: CapacityRequest, memory: int, flops_per_s: float):
        from memplan.profiler.hf_config import decoder_shape

        self.req, self.memory, self.flops_per_s = req, memory, flops_per_s
        self.shape = decoder_shape(req.config)
        self.mp = req.tp * req.cp * req.pp  # GPUs one replica spans
        self.seq_unit = req.cp * (req.tp if req.sp else 1)  # sequences split into this many parts
        self.cache: dict[tuple, Any] = {}

    def layout(self, n: int, T: int):
        from memplan.planner.parallelism import parallel_layout

        r = self.req
        return parallel_layout(self.shape, T, gpus=n, tp=r.tp, sp=r.sp, cp=r.cp, pp=r.pp,
                               micro_batches=r.micro_batches, virtual_stages=r.virtual_stages)

    def ranks(self) -> list[int]:
        """The pipeline ranks an answer plans: 0 and P - 1 (NOTE [ A pipeline rank as one chain ] 3)."""
        return sorted({0, self.req.pp - 1})

    def profile(self, B: int, T: int, precision: str, n: int | None = None, p: int = 0):
        from memplan.planner.parallelism import rank_profile

        # the cut's embedding stage has no FLOPs; the device type sets AdamW's step counters
        lay = self.layout(n if n is not None else self.mp, T)
        prof = rank_profile(self.shape, lay, p, B=B, T=T, precision=precision, attention=self.req.attention,
                            optimizer=self.req.optimizer, flops_per_s=self.flops_per_s,
                            zero_stage=self.req.zero_stage, lean_loss=self.req.lean_loss,
                            reuse_logits=self.req.reuse_logits)
        return _with_pending_tied_grad(prof, lay.pp)

    def plan(self, B: int, T: int, n: int, precision: str, strategy: str = "optimal", p: int = 0):
        key = (B, T, n, precision, strategy, p)
        if key not in self.cache:
            from memplan.planner import plan

            self.cache[key] = plan(self.profile(B, T, precision, n, p), memory_bytes=self.memory,
                                   n_gpus=n // (self.req.tp * self.req.pp), zero_stage=self.req.zero_stage,
                                   precision=precision, strategy=strategy)
        return self.cache[key]

    def worst(self, B: int, T: int, n: int, precision: str, strategy: str = "optimal"):
        """(pipeline rank, plan) of the planned rank with the highest peak (an infeasible one first)."""
        plans = [(p, self.plan(B, T, n, precision, strategy, p)) for p in self.ranks()]
        bad = [(p, pl) for p, pl in plans if not pl.feasible or pl.predicted is None]
        if bad:
            return bad[0]
        return max(plans, key=lambda x: x[1].predicted.total_peak_bytes)

    def fits(self, B: int, T: int, n: int, precision: str) -> bool:
        """Whether the optimal plans at (B, T, n, precision) fit on every planned pipeline rank. A
        size whose profile is beyond the profile's ceilings (NOTE [ ceilings ] in
        profiler/schema.py) does not fit: searches pass through such sizes; the asked size itself
        is planned first, so its errors surface."""
        from memplan.profiler.schema import ProfileError
        from pydantic import ValidationError

        cap = self.req.max_overhead
        for p in self.ranks():
            try:
                pl = self.plan(B, T, n, precision, "optimal", p)
            except (ProfileError, ValidationError):
                return False
            if not pl.feasible or pl.predicted is None:
                return False
            if cap is not None and pl.predicted.overhead > cap + 1e-12:
                return False
        return True


def _with_pending_tied_grad(prof, pp: int):
    """`prof` (a pipeline rank's profile) with a tied embedding's pending gradient in its fixed
    bytes when the rank holds both the embedding and the head (pp = 1).

    NOTE [ Parameters shared between stages ] (profiler/measure.py): autograd holds the head's
    gradient of the tied matrix until the embedding's backward adds its own, through the whole
    backward; hf_analytic_profile records it as meta.fixed.pending_shared_grad_bytes (in the
    gradient's dtype of the policy, this tensor-parallel rank's vocabulary rows) and counts it in
    its fixed bytes, as the measured profile does. rank_profile re-prices the model states and
    leaves it out, so it is added back here. It is not sharded by ZeRO: it is autograd's buffer of
    the whole weight before any reduce-scatter, and shard_profile keeps the fixed bytes other than
    the states (buffers, this pending gradient, step counters) whole on every GPU, as it does for
    a measured profile. With pp > 1 the embedding and the head are on different ranks (no pending
    sum on either); the last rank's copy of the tied matrix is not modelled (docs/capacity.md)."""
    fixed = prof.meta.get("fixed", {})
    pending = int(fixed.get("pending_shared_grad_bytes", 0))
    if not pending:
        return prof
    if pp > 1:  # held on no rank: the record says so
        return prof.model_copy(update={"meta": {**prof.meta, "fixed": {**fixed, "pending_shared_grad_bytes": 0}}})
    fixed = {**fixed, "total_bytes": fixed["total_bytes"] + pending}
    return prof.model_copy(update={"fixed_bytes": prof.fixed_bytes + pending,
                                   "meta": {**prof.meta, "fixed": fixed}})


def _largest(ok, low: int, cap: int) -> tuple[int, bool]:
    """(the largest x in [low, cap] with ok(x), whether the cap stopped the search); 0 when not
    even ok(low). `ok` is monotone: true up to a boundary, false after (NOTE [ Capacity searches ])."""
    if not ok(low):
        return 0, False
    good, step = low, low
    while True:
        nxt = min(cap, good + step)
        if nxt == good:
            return good, True
        if not ok(nxt):
            bad = nxt
            break
        good, step = nxt, 2 * step
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good, False


def _smallest(ok, low: int, cap: int) -> int | None:
    """The smallest x in [low, cap] with ok(x) (ok monotone: false, then true), None if none."""
    if ok(low):
        return low
    bad, x = low, low
    while True:
        x = min(cap, 2 * x)
        if ok(x):
            break
        if x == cap:
            return None
        bad = x
    good = x
    while good - bad > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good


def capacity(request: CapacityRequest | dict) -> CapacityAnswer:
    """The capacity answer for `request` (a CapacityRequest or its fields): whether the model
    trains within `memory_bytes` per GPU at `micro_batch` x `seq_len` on `n_gpus` at ZeRO
    `zero_stage` under `precision` (with `max_overhead`: recomputing at most that fraction), the
    optimal plan's peak (bytes), overhead and step time (seconds), `max_micro_batch`,
    `max_seq_len`, `min_gpus` and a row per precision policy.

    Raises PlanError or ProfileError naming the field on bad input (a config memplan cannot
    profile, an unknown device or policy, no memory given)."""
    from memplan.planner.precision import with_optimizer
    from memplan.planner.sharding import sharded_fixed_bytes
    from pydantic import ValidationError

    if isinstance(request, dict):
        try:
            request = CapacityRequest.model_validate(request)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "request"
            raise PlanError(f"{where}: {first['msg']}") from None
    req = request
    preset = device_preset(req.device) if req.device is not None else None
    memory = req.memory_bytes or (preset.memory_bytes if preset else None)
    if memory is None:
        raise PlanError("memory_bytes: give the memory of one GPU (e.g. 80GB) or a device preset")
    from memplan.profiler.precision import POLICY_DTYPES

    if req.precision not in POLICY_DTYPES:  # the policies a profile is made under
        raise PlanError(f"precision: choose one of {', '.join(POLICY_DTYPES)}, not {req.precision!r} "
                        "(the policies a training step is profiled under)")
    if req.attention not in ("sdpa", "eager", "flash"):
        raise PlanError(f"attention: choose sdpa or eager, not {req.attention!r}")
    if req.reuse_logits and not req.lean_loss:
        raise PlanError(REUSE_LOGITS_NEEDS_LEAN)
    peak = req.peak_flops or (preset.peak_bf16_flops if preset else 1e15)
    ask = _Asker(req, memory, peak * req.utilization)
    if ask.shape.n_layer > MAX_LAYERS:
        raise PlanError(f"config.num_hidden_layers: {ask.shape.n_layer} layers is over the {MAX_LAYERS} "
                        "a capacity answer plans; profile and plan the model instead (memplan profile "
                        "--hf-config, memplan plan)")
    B, T, n, pol = req.micro_batch, req.seq_len, req.n_gpus, req.precision
    from memplan.planner.step_time import links_for, step_time
    from memplan.profiler.hf_config import param_counts

    links = links_for(req.device, intra_node=req.intra_node_bandwidth, inter_node=req.inter_node_bandwidth,
                      gpus_per_node=req.gpus_per_node)
    lay = ask.layout(n, T)  # the layout's checks, one line naming the field
    mp = ask.mp
    counts = param_counts(ask.shape)
    p_w, plan = ask.worst(B, T, n, pol)
    _, store = ask.worst(B, T, n, pol, "store-all")
    fits = ask.fits(B, T, n, pol)
    prof_w = ask.profile(B, T, pol, n, p_w)

    def states_of(name: str) -> int:
        """Per-GPU model-state bytes under policy `name` on the binding pipeline rank, as the
        plan's shard_profile counts them (ZeRO-3: plus the largest stage's weights, gathered)."""
        prof = ask.profile(B, T, name, n, p_w)
        unit = max(ly.param_bytes for ly in prof.layers) // _POLICY_P[name]  # elements
        return sharded_fixed_bytes(prof.meta["fixed"]["n_params"], n_gpus=lay.shard_group,
                                   zero_stage=req.zero_stage, policy=with_optimizer(name, req.optimizer),
                                   gathered_params=unit).fixed_bytes

    states = states_of(pol)
    buffers = prof_w.meta["parallel"]["comm_buffer_bytes"]
    store_act = store.predicted.peak_bytes if store.predicted else _store_all_peak(ask, B, T, n, pol)
    mb, mb_capped = _largest(lambda b: ask.fits(b, T, n, pol), 1, MAX_MICRO_BATCH)
    q = ask.seq_unit
    su, sl_capped = _largest(lambda u: ask.fits(B, u * q, n, pol), 1, MAX_SEQ_LEN // q)
    sl = su * q
    if req.zero_stage == 0:
        min_gpus = mp if ask.fits(B, T, mp, pol) else None
    else:
        d = _smallest(lambda k: ask.fits(B, T, k * mp, pol), 1, MAX_GPUS // mp)
        min_gpus = d * mp if d is not None else None
    pred = plan.predicted
    where = f" (pipeline rank {p_w} of {lay.pp})" if lay.pp > 1 else ""
    if fits:
        msg = (f"fits: {pred.total_peak_bytes / 1e9:.1f} GB of {memory / 1e9:.1f} GB per GPU{where}, "
               f"recomputing {len(plan.recomputed)} of {plan.n_stages} stages "
               f"(+{100 * pred.overhead:.1f}% step time)")
    elif not plan.feasible:
        msg = f"does not fit{where}: {plan.message}"
    else:
        msg = (f"does not fit within +{100 * req.max_overhead:.0f}% recompute{where}: the least "
               f"recompute that fits costs +{100 * pred.overhead:.1f}%")
    per_rank, step = {}, {}
    for p in ask.ranks():
        pl = ask.plan(B, T, n, pol, "optimal", p)
        prof_p = ask.profile(B, T, pol, n, p)
        meta = prof_p.meta["parallel"]
        per_rank[str(p)] = {"in_flight": meta["in_flight"], "chain_layers": meta["chain_layers"],
                            "rank_layers": meta["rank_layers"], "feasible": pl.feasible,
                            "total_peak_bytes": pl.predicted.total_peak_bytes if pl.feasible and pl.predicted
                            else None}
        if pl.feasible and pl.predicted:
            st = step_time(ask.shape, lay, links, B=B, T=T, precision=pol, zero_stage=req.zero_stage,
                           chunk_time_s=pl.predicted.time_s, chunk_layers=meta["chain_layers"],
                           rank_layers=meta["rank_layers"],
                           recompute_fraction=len(pl.recomputed) / max(1, pl.n_stages),
                           rank_params=prof_p.meta["fixed"]["n_params"],
                           ends_time_s=sum(ly.forward_s + ly.backward_s for ly in prof_p.layers
                                           if ly.kind in ("embed", "head")))
            if not step or st["step_time_s"] > step["step_time_s"]:
                step = {**st, "pipeline_rank": p}
    rows = []
    if req.policies:
        for name in ("fp32", "bf16-mixed", "fp16-mixed", "bf16"):
            _, p = ask.worst(B, T, n, name)
            _, s_all = ask.worst(B, T, n, name, "store-all")
            rows.append(PolicyRow(
                precision=name, bytes_per_param=with_optimizer(name, req.optimizer).bytes_per_param,
                model_state_bytes=states_of(name),
                store_all_activation_bytes=s_all.predicted.peak_bytes if s_all.predicted
                else _store_all_peak(ask, B, T, n, name),
                fits=ask.fits(B, T, n, name),
                overhead=p.predicted.overhead if p.feasible and p.predicted else None,
                max_micro_batch=_largest(lambda b, name=name: ask.fits(b, T, n, name), 1,
                                         MAX_MICRO_BATCH)[0]))
    log.info("capacity: %d plans for %s", len(ask.cache), req.config.get("model_type"))
    return CapacityAnswer(
        model=ask.profile(B, T, pol, n, 0).name.removesuffix("-pp0"), n_params=counts.total,
        n_active_params=counts.active, precision=pol,
        memory_bytes=memory, seq_len=T, micro_batch=B, n_gpus=n, zero_stage=req.zero_stage,
        max_overhead=req.max_overhead, fits=fits, message=msg, model_state_bytes=states,
        total_peak_bytes=pred.total_peak_bytes if plan.feasible and pred else None,
        activation_peak_bytes=pred.peak_bytes if plan.feasible and pred else None,
        store_all_activation_bytes=store_act,
        overhead=pred.overhead if plan.feasible and pred else None,
        recomputed=list(plan.recomputed) if plan.feasible else [],
        step_time_s=step.get("step_time_s"),
        max_micro_batch=mb, max_micro_batch_capped=mb_capped, max_seq_len=sl,
        max_seq_len_capped=sl_capped, min_gpus=min_gpus, policies=rows,
        parallel={"tp": lay.tp, "sp": lay.sp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp,
                  "shard_group": lay.shard_group,
                  "micro_batches": lay.micro_batches, "virtual_stages": lay.virtual_stages,
                  "binding_pipeline_rank": p_w, "pipeline_ranks": per_rank},
        comm_buffer_bytes=sum(buffers.values()), step=step,
        assumptions={
            "device": preset.name if preset else None,
            "peak_flops": peak, "utilization": req.utilization, "attention": req.attention,
            "optimizer": req.optimizer, **loss_meta(req.lean_loss, req.reuse_logits),
            "activations": "analytic profile of the transformers layers (memplan.profiler.hf_config), "
                           "one tensor/context-parallel rank's, optimal checkpoint plan; transient "
                           "bytes estimated",
            "comm_buffers": {k: v for k, v in buffers.items()},
            "pending_shared_grad_bytes": prof_w.meta["fixed"].get("pending_shared_grad_bytes", 0),
            "not_counted": "NCCL's channel buffers, allocator fragmentation, CUDA context",
        },
    )


def _store_all_peak(ask: _Asker, B: int, T: int, n: int, precision: str) -> int:
    """The store-all activation peak (bytes above the model states, the highest planned pipeline
    rank's) when the states alone leave no room to plan: a plan with no memory limit."""
    from memplan.planner import plan

    return max(plan(ask.profile(B, T, precision, n, p), strategy="store-all").predicted.peak_bytes
               for p in ask.ranks())
