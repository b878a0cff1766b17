"""Save policies (selective recompute) measured on real stages: per policy, the bytes the profile
gives equal the bytes of a real step run under it, op by op as the replay counts them (CPU, exact
allocation accounting), and the gradients equal the plain step's bitwise (fp32). On a tiny GPT
block (memplan.profiler.models.gpt), a Hugging Face GPT-2 block and a Llama block."""

from __future__ import annotations

import contextlib

import pytest
import torch
from memplan.planner.simulate import simulate
from memplan.profiler import measure
from memplan.profiler.policies import (
    BUILTIN_POLICIES,
    RECOMPUTE_ALL,
    OpRecord,
    candidate_policies,
    recorded,
    select_policies,
    trace_ops,
)
from memplan.profiler.schema import ProfileError, SavePolicy
from memplan.profiler.tensors import storage_bytes, unique_params
from torch import nn

from memplan import planner

gpt = pytest.importorskip("memplan.profiler.models.gpt")

GPT = dict(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4)
HF = dict(n_layer=2, width=32)
BATCH, SEQ = 2, 12


class _Under(nn.Module):
    """A stage whose recorded forward runs under a save policy, as the executor's `R i` runs it."""

    def __init__(self, stage: nn.Module, recompute: list[str]) -> None:
        super().__init__()
        self.stage, self.recompute = stage, recompute

    def forward(self, x):
        if not torch.is_grad_enabled():
            return self.stage(x)
        return recorded(self.stage, x, recompute=self.recompute)


def _gpt_chain():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**GPT, attention="math", dropout=0.1))
    return stages, idx


def _hf_chain(kind: str, attn: str, dropout: float):
    """The decoder cut into stages that pass one tensor (as measure_hf_config wraps them)."""
    from memplan.profiler.cut import cut_decoder

    from tests.hf_tiny import lm_batch, tiny_lm

    model = tiny_lm(kind, attn, dropout=dropout, **HF)
    model.train()
    cut = cut_decoder(model)
    batch = lm_batch(BATCH, SEQ)
    held: dict = {}

    class Embed(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            hidden, args = self.inner({"input_ids": ids, "labels": batch["labels"]})
            held["args"] = args
            return hidden

    class Later(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, h):
            out = self.inner((h, held["args"]))
            return out[0] if isinstance(out, tuple) else out

    stages = [Embed(cut[0]), *(Later(s) for s in cut[1:])]
    stages[0].hf_config = model.config.to_dict()
    stages[0].held = held  # the per-layer arguments, once the chain has run
    return stages, batch["input_ids"]


CHAINS = {
    "gpt": _gpt_chain,
    "gpt2-eager-dropout": lambda: _hf_chain("gpt2", "eager", 0.1),
    "llama-sdpa": lambda: _hf_chain("llama", "sdpa", 0.0),
}


def _step(stages, x, ops, *, seed: int):
    """One step by `ops` (ScheduleRunner), measured op by op on its second run. Returns (the
    level above the step's start during each op, the parameters' gradients)."""
    from memplan.executor.runner import ScheduleRunner
    from memplan.profiler.memory import measure_memory

    params = unique_params(stages)
    for p in params:
        p.grad = torch.zeros_like(p)
    runner = ScheduleRunner(stages, ops, device=torch.device("cpu"))
    runner.prepare()
    torch.manual_seed(seed)
    runner.step(x)
    for p in params:
        p.grad.zero_()
    runner.prepare()
    torch.manual_seed(seed)
    with measure_memory("cpu") as meter:
        def mark(k, op):
            meter.mark(str(k))
            return contextlib.nullcontext()
        runner.step(x, op_context=mark)
    peaks = [meter.phases[str(k)].peak_bytes for k in range(len(ops))]
    return peaks, [p.grad.clone() for p in params]


def _recompute(prof, i: int, name: str) -> list[str]:
    return next(p.recompute for p in prof.layers[i - 1].policies if p.name == name)


@pytest.fixture(scope="module", params=sorted(CHAINS))
def profiled(request):
    stages, x = CHAINS[request.param]()
    prof = measure.profile_chain(stages, x, repeats=1, warmup=0, timing="stage", policies=True)
    return request.param, stages, x, prof


def test_each_policy_measured_is_the_step_run_under_it(profiled):
    # op by op in a store-all step, every stage that has the policy running under it, against
    # the replay with those stages' policy fields; the gradients are the plain step's, bitwise
    chain, stages, x, prof = profiled
    assert prof.layers[-1].policies == []  # the loss stage
    assert all(la.policies for la in prof.layers[1:-1]), chain  # every block offers some
    names = {p.name for la in prof.layers for p in la.policies}
    assert "none" in names, names
    plan = planner.plan(prof, strategy="store-all")
    ops = plan.ops()
    plain, plain_grads = _step(stages, x, ops, seed=3)
    plain_gap = [m + prof.input_bytes - t
                 for m, t in zip(plain, simulate(prof, plan.schedule).timeline, strict=True)]
    for name in sorted(names):
        chosen = {i: name for i, la in enumerate(prof.layers, start=1)
                  if name in la.policy_names}
        wrapped = [_Under(s, _recompute(prof, i, name)) if i in chosen else s
                   for i, s in enumerate(stages, start=1)]
        measured, grads = _step(wrapped, x, ops, seed=3)
        timeline = simulate(prof, plan.schedule, policies=chosen).timeline
        gap = [m + prof.input_bytes - t for m, t in zip(measured, timeline, strict=True)]
        if chain == "gpt":
            # exact: the plain step's own gaps (the loss buffer's 4 bytes, the embedding's
            # backward 512 bytes under its profile), nothing more
            assert gap == plain_gap, (name, gap, plain_gap)
        else:
            # the Hugging Face chains' first stage makes the per-layer arguments (rotary tables,
            # masks) once, and each layer's profile counts what of them its record holds; so
            # each op is held to the first op's gap within those arguments' bytes and the loss
            # buffer's 4 bytes; the embedding's own backward (the last op) is left out as in the
            # plain step
            args = storage_bytes([stages[0].held["args"].layer_args])
            for k, op in enumerate(ops[:-1]):
                assert abs(gap[k] - gap[0]) <= args + 4, (chain, name, k, op, gap, args)
        # the policies change what is kept, never what is computed
        assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True)), name


def test_the_record_under_a_policy_is_the_stage_run_under_it_exactly(profiled):
    # NOTE [ measuring save policies ] rule 2, stage by stage: each policy's bytes are what a
    # recorded forward and backward of the stage under it allocate, to the byte
    from memplan.profiler.memory import measure_memory
    from memplan.profiler.tensors import Seed, stage_input

    chain, stages, x, prof = profiled
    inputs = [x]
    with torch.no_grad():
        for stage in stages[:-1]:
            inputs.append(stage(inputs[-1]))
    checked = 0
    for i, layer in enumerate(prof.layers[:-1]):
        for pol in layer.policies:
            a = stage_input(inputs[i], i == 0)
            with measure_memory("cpu") as meter:
                out = recorded(stages[i], a, recompute=pol.recompute)
                meter.mark("seed")
                seed = Seed.apply(out)
                meter.mark("backward")
                seed.backward()
            fwd, bwd = meter.phases["start"], meter.phases["backward"]
            out_bytes = out.untyped_storage().nbytes()
            in_grad = a.grad.untyped_storage().nbytes() if a.grad is not None else 0
            got = (fwd.end_bytes - out_bytes, fwd.peak_bytes - fwd.end_bytes,
                   bwd.peak_bytes - bwd.start_bytes - in_grad - out_bytes)
            want = (pol.saved_bytes, pol.forward_temp_bytes, pol.backward_temp_bytes)
            assert got == want, (chain, layer.name, pol.name, got, want)
            assert pol.saved_bytes < layer.saved_bytes  # a kept policy frees bytes
            checked += 1
            del out, a, seed
    assert checked


def test_gpt_block_policies_order_as_expected():
    stages, idx = _gpt_chain()
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0, timing="stage",
                                 policies=["matmuls", "none"])
    block = prof.layers[1]
    none = next(p for p in block.policies if p.name == "none")
    matmuls = next(p for p in block.policies if p.name == "matmuls")
    assert none.recompute == [RECOMPUTE_ALL] and none.saved_bytes < matmuls.saved_bytes
    assert matmuls.saved_bytes < block.saved_bytes
    assert "aten.addmm" not in matmuls.recompute and "aten.native_layer_norm" in matmuls.recompute


def test_profiles_without_policies_are_unchanged():
    stages, idx = _gpt_chain()
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0, timing="stage")
    assert not prof.has_policies and prof.meta["policies"] is None
    with pytest.raises(ProfileError, match="policies: 'fast' is not a built-in policy"):
        measure.profile_chain(stages, idx, repeats=1, warmup=0, policies=["fast"])


def _op(name, nbytes, seconds=1e-3, forced=False):
    return OpRecord(name, nbytes, seconds, forced)


def test_candidates_from_a_trace():
    ops = [_op("aten.native_layer_norm", 100), _op("aten.view", 0, forced=True),
           _op("aten.addmm", 300), _op("aten.bmm", 50), _op("aten.mul", 50),
           _op("aten._softmax", 50), _op("aten.bernoulli_", 0, forced=True),
           _op("aten.bmm", 40), _op("aten.gelu", 300, seconds=1e-4), _op("aten.addmm", 100)]
    cands = dict(candidate_policies(ops))
    assert cands["none"] == [RECOMPUTE_ALL]
    assert cands["matmuls"] == ["aten.native_layer_norm", "aten.view", "aten.mul",
                                "aten._softmax", "aten.bernoulli_", "aten.gelu"]
    assert cands["no_attention"] == ["aten.view", "aten.bmm", "aten.mul", "aten._softmax",
                                     "aten.bernoulli_"]
    # bytes per second: gelu 3e6, addmm 2e5 (400 bytes in 2 ms), layer norm 1e5, ...; a quarter
    # of the 990 bytes is gelu alone, a half gelu and addmm
    assert cands["knap1"] == ["aten.view", "aten.bernoulli_", "aten.gelu"]
    assert cands["knap2"] == ["aten.view", "aten.addmm", "aten.bernoulli_", "aten.gelu"]
    for forced in ("aten.view", "aten.bernoulli_"):
        assert all(forced in r for n, r in cands.items() if n != "none")
    # no batched matmul pair around a softmax: no attention core
    assert "no_attention" not in dict(candidate_policies(ops[:3]))
    assert candidate_policies([]) == []
    with pytest.raises(ValueError, match="not a built-in policy"):
        candidate_policies(ops, ["fast"])
    assert set(BUILTIN_POLICIES) == {"matmuls", "no_attention", "none", "knap1", "knap2", "knap3"}


def test_the_outputs_producer_is_recomputed_in_every_candidate():
    # NOTE [ candidate save policies ] rule 5: a cached output is a_i's storage (the record would
    # pin it past `drop i`), so the packet that makes it is forced; the same packet elsewhere in
    # the stage (the first residual add) goes with it
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU())

    def stage(x):
        h = x + block(x)
        return h + torch.tanh(h)

    x = torch.randn(4, 8, requires_grad=True)
    ops = trace_ops(stage, x)
    assert ops[-1].name == "aten.add" and ops[-1].forced
    for name, recompute in candidate_policies(ops):
        assert recompute == [RECOMPUTE_ALL] or "aten.add" in recompute, name


def test_a_knapsack_that_would_cache_the_output_runs_at_its_prediction(monkeypatch):
    # which packets a knapsack picks follows the traced op times; these times (a fixed draw) made
    # knap1 cache GPT-2's residual adds, and every `B i` ran one activation above the replay
    import dataclasses
    import random

    real = measure.trace_ops

    def timed(run):
        draw = random.Random(3)
        return [dataclasses.replace(op, seconds=draw.uniform(1e-6, 1e-3)) for op in real(run)]

    monkeypatch.setattr(measure, "trace_ops", timed)
    stages, x = CHAINS["gpt2-eager-dropout"]()
    prof = measure.profile_chain(stages, x, repeats=1, warmup=0, timing="stage", policies=True)
    monkeypatch.setattr(measure, "trace_ops", real)
    knap = [p for la in prof.layers for p in la.policies if p.name.startswith("knap")]
    assert knap and all("aten.add" in p.recompute for p in knap)
    test_each_policy_measured_is_the_step_run_under_it(("gpt2-eager-dropout", stages, x, prof))


def test_select_policies_keeps_what_frees_bytes_and_is_not_beaten():
    def pol(name, s, tb, b):
        return SavePolicy(name=name, recompute=["aten.gelu"], saved_bytes=s,
                          backward_temp_bytes=tb, forward_s=1.0, backward_s=b)

    base = (100, 10, 2.0)
    got = select_policies(base, [pol("a", 60, 10, 2.5), pol("b", 60, 10, 2.5),
                                 pol("c", 70, 10, 2.6), pol("d", 100, 0, 1.0),
                                 pol("e", 30, 20, 3.0)])
    assert [p.name for p in got] == ["a", "e"]
    # a backward measured faster than the base's (noise) is raised to it: never a free policy
    got = select_policies(base, [pol("f", 50, 10, 1.5)])
    assert [(p.name, p.backward_s) for p in got] == [("f", 2.0)]


def _measured(prof, i: int) -> dict[str, int]:
    """Saved bytes of every candidate measured for stage i (1-based), kept or not."""
    return {p["name"]: p["saved_bytes"] for p in prof.meta["stages"][i - 1]["policies_measured"]}


def test_gpt_policy_bytes_from_shapes_equal_the_measured_ones():
    from memplan.profiler.analytic import gpt_block_policy_bytes

    cfg = gpt.GPTConfig(**GPT)  # flash attention, dropout 0
    stages, idx = gpt.build_gpt(cfg)
    names = ["none", "matmuls", "no_attention"]
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0, timing="stage", policies=names)
    derived = gpt_block_policy_bytes(cfg)
    for i in (2, 3):
        assert _measured(prof, i) == derived
    # NOTE [ Save policies of a GPT block from shapes ]: with the flash kernel, recomputing the
    # attention core frees nothing, so it is not offered
    assert derived["no_attention"] > prof.layers[1].saved_bytes
    assert prof.layers[1].policy_names == ["all", "none", "matmuls"]


def test_llama_policy_bytes_from_shapes_equal_the_measured_ones():
    from memplan.profiler.hf_config import decoder_shape, llama_layer_policy_bytes

    stages, ids = _hf_chain("llama", "sdpa", 0.0)
    names = ["none", "matmuls", "no_attention"]
    prof = measure.profile_chain(stages, ids, repeats=1, warmup=0, timing="stage", policies=names)
    shape = decoder_shape(stages[0].hf_config)
    derived = llama_layer_policy_bytes(shape, seq_len=SEQ, batch_size=BATCH)
    for i in (2, 3):
        assert _measured(prof, i) == derived


def test_policies_timed_in_chain_passes():
    # NOTE [ measuring save policies ] rule 3: the default chain timing runs passes over the
    # chain with the policy's stages under it, interleaved with plain passes
    stages, idx = _gpt_chain()
    prof = measure.profile_chain(stages, idx, repeats=2, warmup=1, policies=["none", "matmuls"])
    assert prof.meta["timing"] == "chain" and prof.meta["policies"] == ["none", "matmuls"]
    for layer in prof.layers[1:-1]:
        assert [p.name for p in layer.policies] == ["none", "matmuls"]
        assert all(p.forward_s > 0 and p.backward_s > 0 for p in layer.policies)
    assert prof.layers[0].policies == [] and prof.layers[-1].policies == []
