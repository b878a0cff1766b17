"""The parallel layout of a training run (data, tensor, sequence, context and pipeline parallelism)
and the profile of one GPU under it.

`ParallelLayout` names the layout and checks it: tp x cp x pp divides the GPUs, the rest is data
parallel (dp); tp divides the heads and the MLP width, cp (times tp under SP) the sequence; the
interleaved schedule runs a multiple of pp micro-batches. `rank_profile` gives the analytic profile
(`memplan.profiler.hf_config.hf_analytic_profile`, one tensor/context-parallel rank's bytes) of the
layers one pipeline rank runs, with the micro-batches it holds in flight and the communication
buffers it keeps, so that the optimal plan of that profile, its model states sharded by ZeRO over
dp x cp, is what that GPU holds.

NOTE [ A pipeline rank as one chain ]
1. Under 1F1B pipeline rank p holds min(P - p, M) micro-batches of its layers' activations between
   their forward and their backward (NOTE [ 1F1B in flight ]); under the interleaved schedule
   min(W + 1, M v) chunk-micro-batches of one chunk's layers (NOTE [ Interleaved 1F1B in flight ]).
2. The rank's chain is one micro-batch through its layers (one chunk's, the largest, when
   interleaved: the embedding on rank 0 and the head on rank P - 1 included), with every saved and
   output byte and the input times k, the micro-batches in flight (interleaved: the embedding's and
   the head's too, though each lives in one chunk: an upper bound); its transients once (one op
   runs at a time). Store-all, its peak is exactly k micro-batches' activations plus one op's
   transients. A plan that recomputes keeps k micro-batches' checkpoints but recomputes one
   micro-batch's segment at a time, so the scaled chain overstates a recompute's working set
   k - 1 times: an upper bound there.
3. Rank 0 (the most in flight, the most layers and the embedding) and rank P - 1 (the head) bound
   every other rank: a middle rank has at most rank 0's layers and fewer micro-batches in flight.
   An answer plans these two and reports the higher.
4. Model states: the parameters of every layer the rank holds (all its chunks), tensor-parallel
   shards (`hf_config._rank_params`), priced by the precision policy and sharded by ZeRO over the
   dp x cp GPUs that hold the same weights (`ParallelLayout.shard_group`).

NOTE [ Communication buffers ]
Bytes a rank keeps for collectives beyond the activations and the model states, added to its fixed
bytes (sources in docs/capacity.md):
1. Tensor parallelism: the all-reduces run in place on the layer's output (NCCL, torch's
   RowwiseParallel); under SP the all-gathered input is the tensor the projections save (already
   in the activations, NOTE [ Tensor, sequence and context parallel bytes per rank ]): no extra.
2. Context parallelism: the all-gathered K and V are the tensors attention saves: no extra.
3. Pipeline parallelism: a receive buffer for the previous rank's activation and one for the next
   rank's gradient, one micro-batch's p Ns C bytes each (ranks at the ends: one).
4. Data parallelism at ZeRO 0-1: PyTorch DDP with gradient_as_bucket_view=True (gradients are
   views into its 25 MiB buckets; Megatron-LM's contiguous gradient buffer likewise): no extra.
   DDP's default (False) keeps a second copy of every gradient: not assumed.
   ZeRO-2 (FSDP SHARD_GRAD_OP): the largest unit's unsharded gradients until its reduce-scatter.
   ZeRO-3 (FSDP FULL_SHARD, backward_prefetch BACKWARD_PRE): the largest unit's unsharded
   gradients and a second gathered unit (the prefetch), beside the gathered unit the states
   count (planner/sharding.py).
5. Not counted: NCCL's own channel buffers (NCCL_BUFFSIZE, 4 MiB a channel and peer by default),
   the CUDA context, allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from memplan.planner.schema import PlanError

__all__ = ["ParallelLayout", "parallel_layout", "rank_profile", "comm_buffer_bytes", "MAX_PARALLEL"]

MAX_PARALLEL = 1 << 10  # most ranks of one kind of parallelism a layout names


@dataclass(frozen=True)
class ParallelLayout:
    """How a run splits over its GPUs: gpus = dp x tp x cp x pp."""

    gpus: int  # all GPUs
    tp: int = 1  # tensor-parallel ranks
    sp: bool = False  # sequence parallelism over the tp ranks
    cp: int = 1  # context-parallel ranks (each sequence's tokens split)
    pp: int = 1  # pipeline stages (ranks)
    micro_batches: int = 1  # micro-batches a step (gradient accumulation; the pipeline's M)
    virtual_stages: int = 1  # model chunks a pipeline rank holds (1: 1F1B; more: interleaved)

    @property
    def dp(self) -> int:
        """Data-parallel replicas: gpus / (tp cp pp)."""
        return self.gpus // (self.tp * self.cp * self.pp)

    @property
    def shard_group(self) -> int:
        """GPUs that hold the same weights and so share the data-parallel gradient reduction and
        ZeRO's shards: dp x cp (context-parallel ranks hold whole layers, as in Megatron-LM's
        data-parallel-with-context group and FSDP over dp_shard x cp)."""
        return self.dp * self.cp

    @property
    def model_parallel(self) -> int:
        """GPUs one replica spans: tp cp pp."""
        return self.tp * self.cp * self.pp


def parallel_layout(shape, seq_len: int, *, gpus: int, tp: int = 1, sp: bool = False, cp: int = 1,
                    pp: int = 1, micro_batches: int | None = None, virtual_stages: int = 1) -> ParallelLayout:
    """The checked `ParallelLayout` of `gpus` GPUs for decoder `shape` (a DecoderShape) at
    `seq_len` tokens; `micro_batches` None: pp (the fewest that fill the pipeline). Raises
    PlanError with one line naming the field (tp, sp, cp, pp, micro_batches, virtual_stages,
    n_gpus) and the fix."""
    from memplan.profiler.hf_config import check_split
    from memplan.profiler.schema import ProfileError

    for name, v in (("n_gpus", gpus), ("tp", tp), ("cp", cp), ("pp", pp), ("virtual_stages", virtual_stages)):
        top = 1 << 16 if name == "n_gpus" else MAX_PARALLEL
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            raise PlanError(f"{name}: expected an integer from 1 to {top}, got {v!r}")
    if not isinstance(sp, bool):
        raise PlanError(f"sp: expected true or false, got {sp!r}")
    if sp and tp == 1:
        raise PlanError("sp: sequence parallelism splits the norms over the tensor-parallel ranks; "
                        "give tp > 1 with it")
    M = pp if micro_batches is None else micro_batches
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise PlanError(f"micro_batches: expected an integer >= 1, got {M!r}")
    if gpus % (tp * cp * pp):
        raise PlanError(f"n_gpus: tp x cp x pp = {tp * cp * pp} must divide the {gpus} GPUs (the rest is "
                        "data parallel); change --gpus or the split")
    L = shape.n_layer
    if pp * virtual_stages > L:
        raise PlanError(f"pp: {pp} pipeline stages x {virtual_stages} chunks for {L} layers; use at "
                        f"most {L} in all")
    if virtual_stages > 1 and pp == 1:
        raise PlanError("virtual_stages: the interleaved schedule needs pp > 1")
    if virtual_stages > 1 and M % pp:
        raise PlanError(f"micro_batches: the interleaved schedule runs a multiple of pp ({pp}) "
                        f"micro-batches, got {M}")
    try:
        check_split(shape, seq_len, tp=tp, sp=sp, cp=cp)
    except ProfileError as err:
        raise PlanError(str(err)) from None
    return ParallelLayout(gpus=gpus, tp=tp, sp=sp, cp=cp, pp=pp, micro_batches=M,
                          virtual_stages=virtual_stages)


def _rank_layers(L: int, lay: ParallelLayout, p: int) -> tuple[list[int], list[int]]:
    """(the decoder layers of rank p's chain: one chunk, the largest; all of rank p's layers)."""
    from memplan.planner.pipeline_parallel import split_layers

    P, v = lay.pp, lay.virtual_stages
    parts = split_layers(L, P * v)
    mine = [parts[j * P + p] for j in range(v)]
    chain = max(mine, key=len)
    return list(chain), [i for r in mine for i in r]


def comm_buffer_bytes(lay: ParallelLayout, *, zero_stage: int, hidden_bytes: int, unit_params: int,
                      weight_bytes: int, grad_bytes: int, p: int) -> dict[str, int]:
    """Communication buffers of pipeline rank `p` (NOTE [ Communication buffers ]), bytes:
    pipeline receive buffers (`hidden_bytes` each: one micro-batch's activation), and under ZeRO-2/3
    with dp > 1 the largest unit's (`unit_params` elements) unsharded gradients (`grad_bytes` an
    element) and ZeRO-3's prefetched second unit (`weight_bytes` an element)."""
    from memplan.planner.sharding import dp_buffer_bytes

    out = {"pipeline": 0, "data_parallel": 0}
    if lay.pp > 1:
        out["pipeline"] = hidden_bytes * ((p > 0) + (p < lay.pp - 1))
    out["data_parallel"] = dp_buffer_bytes(unit_params, n_gpus=lay.shard_group, zero_stage=zero_stage,
                                           weight_bytes=weight_bytes, grad_bytes=grad_bytes)
    return out


def rank_profile(shape, lay: ParallelLayout, p: int, *, B: int, T: int, precision: str, attention: str,
                 optimizer: str, flops_per_s: float, zero_stage: int, lean_loss: bool = False,
                 reuse_logits: bool = False):
    """The profile of pipeline rank `p` of layout `lay` (NOTE [ A pipeline rank as one chain ]):
    one tensor/context-parallel rank's stages of a `B` x `T` micro-batch, saved and output bytes
    times the micro-batches in flight, fixed bytes the rank's model states (unsharded: the planner
    shards them over dp x cp) plus its communication buffers (NOTE [ Communication buffers ]).
    `lean_loss`, `reuse_logits`: the head's loss (hf_analytic_profile's options of those names).
    Returns a Profile whose meta["parallel"] records the layout, the rank and what was scaled."""
    from memplan.planner.pipeline_parallel import in_flight_interleaved
    from memplan.planner.precision import get_policy, with_optimizer
    from memplan.profiler.hf_config import hf_analytic_profile

    base = hf_analytic_profile(shape, seq_len=T, batch_size=B, precision=precision, attention=attention,
                               optimizer=optimizer, flops_per_s=flops_per_s, device="cuda",
                               tp=lay.tp, sp=lay.sp, cp=lay.cp, lean_loss=lean_loss,
                               reuse_logits=reuse_logits)
    P = lay.pp
    k = in_flight_interleaved(P, lay.micro_batches, lay.virtual_stages, p)
    blocks = base.layers[1:-1]
    chain_idx, held_idx = _rank_layers(shape.n_layer, lay, p)
    chain = ([base.layers[0]] if p == 0 else []) + [blocks[i] for i in chain_idx]
    chain += [base.layers[-1]] if p == P - 1 else []
    held = ([base.layers[0]] if p == 0 else []) + [blocks[i] for i in held_idx]
    held += [base.layers[-1]] if p == P - 1 else []
    stages = [ly.model_copy(update={"saved_bytes": k * ly.saved_bytes, "output_bytes": k * ly.output_bytes})
              for ly in chain]
    pol = get_policy(precision)
    per_elem = {"fp32": 4, "bf16-mixed": 4, "fp16-mixed": 4, "bf16": 2}[precision]
    n = sum(ly.param_bytes for ly in held) // per_elem  # this rank's parameters (elements)
    unit = max(ly.param_bytes for ly in held) // per_elem
    hidden = base.layers[0].output_bytes  # one micro-batch's activation between ranks
    buffers = comm_buffer_bytes(lay, zero_stage=zero_stage, hidden_bytes=hidden, unit_params=unit,
                                weight_bytes=pol.weight_bytes, grad_bytes=pol.grad_bytes, p=p)
    opt = n * with_optimizer(pol, optimizer).optimizer_bytes
    fixed = {**base.meta["fixed"], "param_bytes": n * pol.weight_bytes, "grad_bytes": n * pol.grad_bytes,
             "optimizer_bytes": opt, "buffer_bytes": sum(buffers.values()), "n_params": n}
    fixed["total_bytes"] = fixed["param_bytes"] + fixed["grad_bytes"] + opt + fixed["buffer_bytes"]
    input_bytes = base.input_bytes if p == 0 else hidden
    meta = {**base.meta, "fixed": fixed,
            "parallel": {"tp": lay.tp, "sp": lay.sp, "cp": lay.cp, "pp": P, "dp": lay.dp,
                         "shard_group": lay.shard_group,
                         "micro_batches": lay.micro_batches, "virtual_stages": lay.virtual_stages,
                         "pipeline_rank": p, "in_flight": k, "chain_layers": len(chain_idx),
                         "rank_layers": len(held_idx), "comm_buffer_bytes": buffers,
                         "scaled": "saved, output and input bytes times in_flight (NOTE [ A pipeline "
                                   "rank as one chain ] in planner/parallelism.py)"}}
    return type(base).model_validate({
        **base.model_dump(), "layers": [ly.model_dump() for ly in stages], "input_bytes": k * input_bytes,
        "fixed_bytes": fixed["total_bytes"], "meta": meta,
        "name": f"{base.name}-pp{p}" if P > 1 else base.name})
