"""Tensor and sequence parallelism measured on the CPU: what each rank of a Megatron-style split of a
Hugging Face decoder layer keeps for the backward (torch.distributed, gloo, DTensor).

`measure_tensor_parallel(spec)` builds the model `spec.config` describes (random weights, nothing
downloaded), splits each decoder layer over `spec.tp` gloo processes with torch's tensor-parallel
API and runs every layer's forward and backward on each rank. Per rank and layer it counts,
exactly, the bytes of the tensors autograd keeps (saved tensors hooks, one count per storage, the
layer's input, output and parameters left out, as `memplan.profiler.measure.profile_chain` counts
them) and the layer's output bytes; it checks each rank's output (the whole residual stream, or
the rank's sequence shard under SP) and the input gradient against the unsplit layer.

NOTE [ The Megatron split with torch's TP API ]
1. Attention: q_proj, k_proj, v_proj are ColwiseParallel (each rank computes H/t query heads and
   KV/t key/value heads), o_proj RowwiseParallel (its partial sums all-reduced: the output is the
   whole residual stream on every rank). MLP: gate_proj, up_proj ColwiseParallel (F/t columns),
   down_proj RowwiseParallel.
2. With sequence parallelism (`sp`), the layer's input and output are the rank's T/t tokens:
   input_layernorm and post_attention_layernorm are SequenceParallel (they run on the rank's
   tokens); the attention's and the MLP's inputs are all-gathered (PrepareModuleInput, Shard(1)
   to Replicate) and o_proj and down_proj reduce-scatter (output Shard(1)).
3. A DTensor's bytes are its local tensor's: the hooks unwrap DTensors (`_local_tensor`).
4. The rotary cos and sin (made once by the model, not by a layer) are whole on every rank.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memplan.executor.distributed import run_ranks
from memplan.executor.report import ExecutorError

__all__ = ["TPSpec", "measure_tensor_parallel"]

log = logging.getLogger(__name__)


@dataclass
class TPSpec:
    config: dict[str, Any] = field(default_factory=dict)  # a Hugging Face config.json (Llama-style)
    tp: int = 2  # tensor-parallel ranks (gloo processes)
    seq_len: int = 16  # tokens per sequence
    batch_size: int = 2  # sequences
    seed: int = 0  # weights and data
    # what to run, each in the same process group: (sp, attention, precision); sp: sequence
    # parallelism (NOTE [ The Megatron split with torch's TP API ] 2), attention sdpa or eager,
    # precision fp32, bf16 (bf16 weights) or bf16-mixed (torch.autocast bf16)
    cases: list[tuple[bool, str, str]] = field(default_factory=lambda: [(False, "sdpa", "fp32")])


def case_name(case) -> str:
    """The key of one (sp, attention, precision) case in `measure_tensor_parallel`'s answer."""
    sp, attention, precision = case
    return f"{'sp' if sp else 'tp'}-{attention}-{precision}"


def _local(t):
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _storages(tensors) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = _local(t).untyped_storage()
        if st.nbytes():
            out[st.data_ptr()] = st.nbytes()
    return out


def _tp_plan(sp: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    row_out = Shard(1) if sp else Replicate()
    plan = {
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=row_out),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=row_out),
    }
    if sp:
        plan.update({
            "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
    return plan


def _inputs(spec: TPSpec, model):
    import torch

    C = model.config.hidden_size
    g = torch.Generator().manual_seed(spec.seed + 1)
    x = torch.randn(spec.batch_size, spec.seq_len, C, generator=g)
    pos = torch.arange(spec.seq_len).unsqueeze(0)  # (1, T), as the model makes them
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(x, pos)
    return x, (cos, sin)


def _run_case(rank: int, spec: TPSpec, case, mesh) -> list[dict]:
    """One (sp, attention, precision) case on this rank: per layer, what it keeps and how its output
    and input gradient compare with the unsplit layer's."""
    import contextlib
    import copy

    import torch
    from memplan.profiler.hf_config import hf_model
    from torch.distributed.tensor.parallel import parallelize_module

    sp, attention, precision = case
    model = hf_model(spec.config, attention=attention, seed=spec.seed).train()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = model.to(dtype)
    x_full, pe = _inputs(spec, model)
    x_full, pe = x_full.to(dtype), tuple(v.to(dtype) for v in pe)

    def ctx():
        if precision == "bf16-mixed":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    t = spec.tp
    chunk = spec.seq_len // t
    mine = slice(rank * chunk, (rank + 1) * chunk)
    rows = []
    for i, layer in enumerate(model.model.layers):
        ref = copy.deepcopy(layer)
        parallelize_module(layer, mesh, _tp_plan(sp))
        xr = x_full.clone().requires_grad_(True)  # the unsplit layer on the whole input
        with ctx():
            yr = ref(xr, position_embeddings=pe)
        yr = yr[0] if isinstance(yr, tuple) else yr
        gen = torch.Generator().manual_seed(spec.seed + 2 + i)
        gy = torch.randn(yr.shape, generator=gen).to(yr.dtype)
        yr.backward(gy)
        if sp:  # this rank's tokens (NOTE [ The Megatron split with torch's TP API ] 2)
            x_in, gy_in, y_want, gx_want = x_full[:, mine].clone(), gy[:, mine], yr[:, mine], xr.grad[:, mine]
        else:
            x_in, gy_in, y_want, gx_want = x_full.clone(), gy, yr, xr.grad
        x_in.requires_grad_(True)
        saved: dict[int, int] = {}
        n_saved = 0

        def pack(tensor, saved=saved):
            nonlocal n_saved
            n_saved += 1
            saved.update(_storages([tensor]))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), ctx():
            y = layer(x_in, position_embeddings=pe)
        y = y[0] if isinstance(y, tuple) else y
        y_loc = _local(y)
        excluded = _storages([*layer.parameters()]) | _storages([x_in]) | _storages([y_loc])
        y.backward(gy_in)
        rows.append({
            "layer": i, "saved_bytes": sum(n for ptr, n in saved.items() if ptr not in excluded),
            "output_bytes": sum(_storages([y_loc]).values()), "saved_tensors": n_saved,
            "param_bytes": sum(_storages([*layer.parameters()]).values()),
            "output_shape": list(y_loc.shape),
            "output_max_abs_diff": float((y_loc.detach().float() - y_want.detach().float()).abs().max()),
            "input_grad_max_abs_diff": float((x_in.grad.float() - gx_want.float()).abs().max()),
        })
    return rows


def _rank_main(rank: int, spec_d: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    spec = TPSpec(**spec_d)
    dist.init_process_group("gloo", init_method=(Path(out_dir) / "store").as_uri(), rank=rank,
                            world_size=spec.tp)
    try:
        mesh = init_device_mesh("cpu", (spec.tp,))
        out = {case_name(c): _run_case(rank, spec, tuple(c), mesh) for c in spec.cases}
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(out))
        dist.barrier()  # leave together (NOTE [ A rank leaves nothing running ] in executor/distributed.py)
    finally:
        dist.destroy_process_group()


def measure_tensor_parallel(spec: TPSpec, *, timeout_s: float = 180.0) -> dict[str, list[list[dict]]]:
    """Run each decoder layer of `spec.config`'s model split over `spec.tp` gloo ranks
    (NOTE [ The Megatron split with torch's TP API ]) under each of `spec.cases` and return, by
    `case_name`, per rank, per layer: the saved bytes, output bytes and the rank's parameter
    bytes (its shards; exact, bytes), the number of saved tensors, the output's shape, and the
    largest absolute differences of the output and the input gradient from the unsplit layer's. Raises `ExecutorError` naming the field on bad input or when a rank fails."""
    from memplan.profiler.hf_config import decoder_shape

    shape = decoder_shape(spec.config)
    if shape.family != "llama":
        raise ExecutorError(f"config.model_type: the tensor-parallel run splits Llama-style layers, not "
                            f"{shape.model_type}")
    if isinstance(spec.tp, bool) or not isinstance(spec.tp, int) or not 1 <= spec.tp <= 8:
        raise ExecutorError(f"tp: expected 1 to 8 processes, got {spec.tp!r}")
    for name, size in (("num_attention_heads", shape.n_head), ("num_key_value_heads", shape.n_kv_head),
                       ("intermediate_size", shape.intermediate_size)):
        if size % spec.tp:
            raise ExecutorError(f"tp: {spec.tp} ranks must divide config.{name} ({size})")
    for sp, attention, precision in spec.cases:
        if sp and spec.seq_len % spec.tp:
            raise ExecutorError(f"seq_len: {spec.seq_len} tokens must be divisible by tp ({spec.tp}) "
                                "under sequence parallelism")
        if attention not in ("sdpa", "eager"):
            raise ExecutorError(f"cases: attention sdpa or eager, not {attention!r}")
        if precision not in ("fp32", "bf16", "bf16-mixed"):
            raise ExecutorError(f"cases: precision fp32, bf16 or bf16-mixed, not {precision!r}")
    with tempfile.TemporaryDirectory(prefix="memplan-tp-") as out:
        run_ranks(_rank_main, (asdict(spec), out), nprocs=spec.tp, timeout_s=timeout_s)
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(spec.tp)]
    result = {name: [r[name] for r in ranks] for name in ranks[0]}
    log.info("tensor-parallel run (tp=%d): %s", spec.tp, result)
    return result
