"""An installed plan under FSDP2 (`torch.distributed.fsdp.fully_shard`) on 2 gloo processes on the
CPU (issue 21): the plan is made on rank 0 before sharding and installed on every rank, then each
block and the root are sharded and the user's plain loop runs.

Rank 0 plans, the other ranks install its plan (`install_plan`, the fingerprint checked on their
own batch): a plan made on each rank from its own timings could differ between ranks on a loaded
machine, and under FSDP every recompute all-gathers its block's parameters (a collective), so
every rank must run the same recomputations in the same order."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.hf_tiny import lm_batch, tiny_lm

BATCH, SEQ, STEPS = 2, 32, 3


def _forward_peak(model, batch) -> int:
    """Bytes allocated at the forward's peak (the loss included) above the level before it, by
    exact CPU accounting; the backward runs after the measurement."""
    from memplan.profiler.memory import measure_memory

    with measure_memory("cpu") as meter:
        loss = model(**batch).loss
    loss.backward()
    return meter.peak_bytes


def _fsdp_rank(rank: int, world: int, tmp: str) -> None:
    """One rank: a tiny Llama with rank 0's plan installed and the same model without it, both
    under fully_shard; the first step's full (gathered) gradients compared, then STEPS AdamW steps
    of each on this rank's fresh batches; results written to a file."""
    import torch.distributed as dist
    from memplan.executor.apply import auto_checkpoint, install_plan, measure_step, profile_model
    from memplan.planner import plan as make_plan
    from memplan.planner.schema import Plan
    from memplan.profiler.schema import load_profile
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        model = tiny_lm("llama", "sdpa", n_layer=4, width=64).train()  # the same weights on each rank
        model.config.use_cache = False
        ref = copy.deepcopy(model)
        example = lm_batch(BATCH, SEQ, seed=rank)
        sent: list = [None, None]
        if rank == 0:
            prof = profile_model(model, example, repeats=1, warmup=0)
            store_all = make_plan(prof, strategy="store-all").predicted.peak_bytes
            p = auto_checkpoint(model, example, profile=prof, budget=int(0.4 * store_all))
            sent = [p.model_dump_json(), prof.model_dump_json()]
        dist.broadcast_object_list(sent, src=0)
        p, prof = Plan.model_validate_json(sent[0]), load_profile(sent[1])
        if rank != 0:
            install_plan(model, p, example, profile=prof)
        # unsharded forward peaks, for FSDP's own bytes in the forward below
        fwd = {"plan": [_forward_peak(model, lm_batch(BATCH, SEQ, seed=5))],
               "ref": [_forward_peak(ref, lm_batch(BATCH, SEQ, seed=5))]}
        mesh = init_device_mesh("cpu", (world,))
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
            for layer in m.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
        grads = []
        for m in (model, ref):
            m(**lm_batch(BATCH, SEQ, seed=10 + rank)).loss.backward()
            grads.append([q.grad.full_tensor() for q in m.parameters()])
        grads_equal = all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
        out = {"grads_equal": grads_equal, "recomputed": p.recomputed,
               "predicted": p.predicted.peak_bytes, "curves": [], "params_equal": None}
        finals = []
        for name, m in (("plan", model), ("ref", ref)):
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
            curve = []
            for step in range(STEPS):
                opt.zero_grad()
                loss = m(**lm_batch(BATCH, SEQ, seed=100 * step + rank)).loss
                loss.backward()
                opt.step()
                curve.append(loss.item())
            out["curves"].append(curve)
            finals.append([q.detach().full_tensor() for q in m.parameters()])
            fwd[name].append(_forward_peak(m, lm_batch(BATCH, SEQ, seed=5)))
            out[name + "_step_peak"] = measure_step(m, lm_batch(BATCH, SEQ, seed=6), time_steps=0).measured_peak_bytes
        out["params_equal"] = all(torch.equal(a, b) for a, b in zip(*finals, strict=True))
        out["forward_peaks"] = fwd
        with open(f"{tmp}/rank{rank}.json", "w") as f:
            json.dump(out, f)
        dist.barrier()  # leave together: no rank destroys the group while another still uses it
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fully_shard_two_gloo_processes(tmp_path):
    """FSDP2 on 2 gloo processes: on each rank the installed plan's full gradients equal the
    unplanned sharded model's, bitwise, and so do its loss curve and parameters after STEPS AdamW
    steps. Memory: FSDP's own bytes in the forward (the all-gathered parameters) are the same with
    the plan and without it (within 1%), so the plan's forward saving survives sharding, and the
    forward's activations less those bytes are within the predicted peak; the
    whole step's peak is not compared with the prediction (docs/apply.md, "FSDP2": FSDP's
    unsharded parameters and gradients are step-time allocations the chain model counts as fixed
    and whole, recomputes all-gather again inside the backward, and some of FSDP's buffers are
    freed in the next step), only required to stay below the unplanned sharded model's."""
    from memplan.executor.distributed import run_ranks

    run_ranks(_fsdp_rank, (2, str(tmp_path)), nprocs=2, timeout_s=600)
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["recomputed"]
        assert out["grads_equal"] and out["params_equal"]
        assert out["curves"][0] == out["curves"][1]
        (plan_unsharded, plan_sharded), (ref_unsharded, ref_sharded) = (
            out["forward_peaks"]["plan"], out["forward_peaks"]["ref"])
        assert plan_unsharded < ref_unsharded
        # FSDP's bytes at the forward's peak within 1% (279,272 without the plan, 279,016 with it,
        # 2026-12-05; the 256 bytes not traced)
        fsdp_plan, fsdp_ref = plan_sharded - plan_unsharded, ref_sharded - ref_unsharded
        assert fsdp_ref > 0 and abs(fsdp_plan - fsdp_ref) <= 0.01 * fsdp_ref, out["forward_peaks"]
        # the rank's forward activations (its sharded forward peak less FSDP's forward bytes, as
        # the unplanned model measured them) within the plan's predicted peak
        assert plan_sharded - fsdp_ref <= out["predicted"], (out["forward_peaks"], out["predicted"])
        assert out["plan_step_peak"] < out["ref_step_peak"], out
