"""Save policies in the executor (docs/chain-model.md section 10.8): a stage's `R` ops run under
`plan.stage_policies`, in the schedule runner and in a plan installed into a model.

Facts checked (CPU, fp32, exact allocation accounting): gradients, loss, buffers and parameters
bitwise equal to the unplanned step under every policy on the built-in GPT, within the dtype's
tolerance under bf16 autocast; the bytes measured during each op of a plan mixing 'none',
'matmuls' and 'all' equal the replay's under those policies; a plan naming a policy the profile
lacks is refused naming `stage_policies.i`; an installed plan with policies on a Hugging Face
GPT-2 keeps its gradients and its predicted peak.

The profiles' policies are measured here by the profiler's rule (NOTE [ measuring save policies ]
in profiler/measure.py): the stage run as `recorded(stage, a_{i-1}, recompute=...)` in one meter
block for its forward and backward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from memplan.executor import run_plan
from memplan.executor.apply import InstallError
from memplan.executor.report import ExecutorError
from memplan.planner.schema import Plan
from memplan.planner.simulate import simulate
from memplan.profiler.schema import Profile, SavePolicy

from memplan import planner

gpt = pytest.importorskip("memplan.profiler.models.gpt")
measure = pytest.importorskip("memplan.profiler.measure")


TINY = dict(n_layer=3, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4)
# 'none' recomputes the whole block (plain checkpoint); 'matmuls' keeps the matmul and attention
# outputs and recomputes norms, activations and the residual adds (torchtitan's op-level policy)
POLICIES = {
    "none": ["*"],
    "matmuls": ["aten.native_layer_norm", "aten.gelu", "aten._safe_softmax", "aten.add"],
}


def _measure_policy(stage, x_prev, first: bool, recompute, ctx) -> dict[str, int]:
    """A policy's record and transients, measured as the profiler measures them (one run)."""
    return measure._policy_memory_once(stage, x_prev, first, "cpu", ctx, recompute)


def _profile_with_policies(stages, x, *, autocast_dtype=None) -> Profile:
    """profile_chain's profile of `stages`, each block with the POLICIES measured."""
    import contextlib

    prof = measure.profile_chain(stages, x, repeats=1, warmup=0, autocast_dtype=autocast_dtype)

    def ctx():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=autocast_dtype)

    xs = [x]
    with torch.no_grad(), ctx():
        for s in stages[:-1]:
            xs.append(s(xs[-1]))
    layers = []
    for i, (stage, layer) in enumerate(zip(stages, prof.layers, strict=True)):
        pols = []
        if 0 < i < len(stages) - 1:  # the blocks
            for name, rec in POLICIES.items():
                m = _measure_policy(stage, xs[i], False, rec, ctx)
                pols.append(SavePolicy(name=name, recompute=rec, forward_s=layer.forward_s,
                                       backward_s=layer.backward_s + layer.forward_s, **m))
        layers.append(layer.model_copy(update={"policies": pols}))
    for p in stages[0].parameters():  # the profiler leaves gradients allocated (zeros)
        p.grad = None
    return prof.model_copy(update={"layers": layers})


def _under(plan: Plan, prof: Profile, policies: dict[int, str]) -> Plan:
    """`plan` with `policies` and its prediction replayed under them."""
    sim = simulate(prof, plan.schedule, policies=policies)
    assert sim.valid, sim.error
    pred = plan.predicted.model_copy(update={
        "peak_bytes": sim.peak_bytes, "time_s": sim.time_s,
        "total_peak_bytes": prof.fixed_bytes + sim.peak_bytes})
    return plan.model_copy(update={"stage_policies": dict(policies), "predicted": pred,
                                   "profile_fingerprint": prof.fingerprint()})


@pytest.fixture(scope="module")
def gpt_profiled():
    torch.set_num_threads(1)
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dropout=0.0, attention="math"))
    return stages, idx, _profile_with_policies(stages, idx)


def _plans(prof: Profile):
    """store-all, and an optimal plan that recomputes (F ops) at 60% of the store-all peak, both
    made without the policies (the tests choose them)."""
    bare = prof.with_policies({})
    store = planner.plan(bare, strategy="store-all")
    opt = planner.plan(bare, strategy="optimal", budget_bytes=int(0.6 * store.predicted.peak_bytes))
    assert opt.feasible and any(op[0] == "F" for op in opt.ops())
    return {"store-all": store, "optimal": opt}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_keeps_gradients_bitwise_and_its_predicted_peak(gpt_profiled, policy):
    stages, idx, prof = gpt_profiled
    blocks = range(2, prof.n_stages)
    for name, plan in _plans(prof).items():
        p = _under(plan, prof, {i: policy for i in blocks})
        r = run_plan(stages, idx, p, profile=prof, steps=3)
        assert r.status == "ok", (name, r.message)
        assert r.stage_policies == p.stage_policies and not r.compiled
        assert r.grad_max_abs_diff == 0 and r.param_max_abs_diff == 0, (name, r.message)
        assert "bitwise" in r.message
        # within 0.1% (issue 26's bar; 128 B of 229,956 under 'none', 4 B under 'matmuls')
        assert abs(r.measured_peak_bytes - p.predicted.peak_bytes) <= 1e-3 * p.predicted.peak_bytes, (
            name, r.message)


def test_every_profiled_policy_with_dropout_keeps_gradients_bitwise():
    # the profiler's own candidates (profile_chain(policies=True)): random ops recomputed and
    # the producers of tensors written in place never cached, so dropout draws the same masks
    torch.set_num_threads(1)
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dropout=0.1, attention="math"))
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0, policies=True)
    names = {p.name for la in prof.layers for p in la.policies}
    assert {"none", "matmuls"} <= names, names
    for name in sorted(names):
        chosen = {i: name for i, la in enumerate(prof.layers, start=1) if name in la.policy_names}
        for kind, plan in _plans(prof).items():
            p = _under(plan, prof, chosen)
            r = run_plan(stages, idx, p, profile=prof, steps=2)
            assert r.status == "ok" and r.grad_max_abs_diff == 0, (name, kind, r.message)
            assert abs(r.measured_peak_bytes - p.predicted.peak_bytes) <= 1e-3 * p.predicted.peak_bytes, (
                name, kind, r.message)
    # and the optimal planner's own choice of policies
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    own = planner.plan(prof, strategy="optimal", budget_bytes=int(0.5 * store))
    r = run_plan(stages, idx, own, profile=prof, steps=2)
    assert r.status == "ok" and r.grad_max_abs_diff == 0, (own.stage_policies, r.message)


def test_dropout_under_a_whole_block_recompute_keeps_gradients_bitwise():
    # plain checkpoint ('none') restores the generator for its rerun: the same dropout masks
    torch.set_num_threads(1)
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dropout=0.1, attention="math"))
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    layers = [la.model_copy(update={"policies": [SavePolicy(
        name="none", recompute=["*"], saved_bytes=0, forward_s=la.forward_s,
        backward_s=la.backward_s)]}) if 0 < k < prof.n_stages - 1 else la
        for k, la in enumerate(prof.layers)]
    prof = prof.model_copy(update={"layers": layers})
    for plan in _plans(prof).values():
        p = _under(plan, prof, {2: "none", 3: "none"})
        r = run_plan(stages, idx, p, profile=prof, steps=3, peak_tolerance_pct=None)
        assert r.status == "ok" and r.grad_max_abs_diff == 0, r.message
        assert any("RNG" in n for n in r.guard_notes)


def test_bf16_autocast_under_policies_within_tolerance():
    torch.set_num_threads(1)
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dropout=0.0, attention="math"))
    prof = _profile_with_policies(stages, idx, autocast_dtype=torch.bfloat16)
    plan = _plans(prof)["optimal"]
    p = _under(plan, prof, {2: "none", 3: "matmuls"})
    r = run_plan(stages, idx, p, profile=prof, steps=3, autocast_dtype=torch.bfloat16)
    assert r.status == "ok", r.message
    assert r.dtype == "bfloat16" and r.grad_max_rel_diff <= r.tolerance


def test_each_op_of_a_plan_mixing_policies_is_replayed_to_the_byte(gpt_profiled):
    from memplan.executor.timeline import measure_timeline

    stages, idx, prof = gpt_profiled
    plan = _plans(prof)["optimal"]
    policies = {2: "none", 3: "matmuls"}  # stage 4 (the last block): 'all'
    p = _under(plan, prof, policies)
    tl = measure_timeline(stages, idx, p, prof)
    want = simulate(prof, p.schedule, policies=policies).timeline
    assert tl.predicted_bytes == want
    plain = simulate(prof, p.schedule).timeline
    assert want != plain  # the policies change the replay
    for k, op in enumerate(p.ops()):
        # 4 bytes: the loss value's buffer; the embedding's backward allocates 512 bytes less
        # than its profile (tests/executor/test_families.py)
        got = tl.measured_bytes[k]
        assert -512 <= got - want[k] <= 4, (k, op, got, want[k])


def test_a_policy_the_profile_lacks_is_refused_naming_the_stage(gpt_profiled):
    stages, idx, prof = gpt_profiled
    plan = _plans(prof)["store-all"]
    bad = plan.model_copy(update={"stage_policies": {3: "attention_only"}})
    with pytest.raises(ExecutorError, match=r"stage_policies\.3") as err:
        run_plan(stages, idx, bad, profile=prof, steps=1)
    assert "\n" not in str(err.value) and "attention_only" in str(err.value)
    good = _under(plan, prof, {3: "none"})
    with pytest.raises(ExecutorError, match=r"stage_policies\.3.*profile"):
        run_plan(stages, idx, good, steps=1)  # no profile: the recompute list is unknown


def test_policies_leave_the_model_as_the_unplanned_run_leaves_it(gpt_profiled):
    # three steps of AdamW: the planned and the unplanned models stay bitwise equal
    stages, idx, prof = gpt_profiled
    p = _under(_plans(prof)["optimal"], prof, {2: "matmuls", 4: "none"})
    r = run_plan(stages, idx, p, profile=prof, steps=3, optimizer="sgd")
    assert r.status == "ok" and r.param_max_abs_diff == 0, r.message
    assert r.forward_counts == simulate(prof, p.schedule).forward_counts


# ---------------------------------------------------------------------------------------------
# installed plans (auto_checkpoint, install_plan) on a Hugging Face GPT-2


@pytest.fixture(scope="module")
def hf_profiled():
    from memplan.executor.apply import profile_model

    from tests.hf_tiny import lm_batch, tiny_lm

    torch.set_num_threads(1)
    model = tiny_lm("gpt2", "sdpa", n_layer=4, width=64, dropout=0.1).train()
    model.config.use_cache = False
    batch = lm_batch(4, 32, seed=100)
    prof = profile_model(model, batch, repeats=1, warmup=0, policies=True)
    return model, batch, prof


def _installed_step(model, batch):
    from memplan.executor.apply import measure_step

    torch.manual_seed(7)
    m = measure_step(model, batch, time_steps=0)
    return m, [p.grad.clone() for p in model.parameters()]


def test_profile_model_offers_policies_for_the_blocks_only(hf_profiled):
    _, _, prof = hf_profiled
    assert not prof.layers[0].policies and not prof.layers[-1].policies  # prefix, head
    for layer in prof.layers[1:-1]:
        names = layer.policy_names
        assert "none" in names and "matmuls" in names, names
        for p in layer.policies:  # select_policies: each keeps fewer bytes than 'all'
            assert p.saved_bytes < layer.saved_bytes


def test_installed_plan_under_every_policy_keeps_gradients_and_its_peak(hf_profiled):
    from memplan.executor.apply import install_plan, remove_checkpoint

    model, batch, prof = hf_profiled
    ref = copy.deepcopy(model)
    _, want = _installed_step(ref, batch)
    bare = prof.with_policies({})
    store = planner.plan(bare, strategy="store-all").predicted.peak_bytes
    names = sorted({p.name for la in prof.layers for p in la.policies})
    for policy in names:
        chosen = {i: policy for i, la in enumerate(prof.layers, start=1)
                  if policy in la.policy_names}
        for plan in (planner.plan(bare, strategy="store-all"),
                     planner.plan(bare, strategy="optimal", budget_bytes=int(0.6 * store))):
            p = _under(plan, prof, chosen)
            first = min(chosen)
            with pytest.raises(InstallError, match=rf"stage_policies\.{first}.*profile"):
                install_plan(model, p, batch)  # the recompute lists are in the profile only
            install_plan(model, p, batch, profile=prof)
            try:
                m, got = _installed_step(model, batch)
            finally:
                remove_checkpoint(model)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (policy, plan.strategy)
            assert abs(m.peak_error_pct) <= 0.1, (policy, m.message)


def test_auto_checkpoint_chooses_policies_and_holds_its_prediction(hf_profiled):
    from memplan.executor.apply import auto_checkpoint, remove_checkpoint

    model, batch, prof = hf_profiled
    ref = copy.deepcopy(model)
    _, want = _installed_step(ref, batch)
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    p = auto_checkpoint(model, batch, budget=int(0.6 * store), profile=prof)
    try:
        m, got = _installed_step(model, batch)
        for step in range(3):  # the user's plain loop on fresh batches of the profiled shape
            from tests.hf_tiny import lm_batch

            model(**lm_batch(4, 32, seed=200 + step)).loss.backward()
    finally:
        remove_checkpoint(model)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert m.measured_peak_bytes <= int(0.6 * store) and abs(m.peak_error_pct) <= 0.1, m.message
    assert "forward" not in model.__dict__ and all("forward" not in b.__dict__
                                                    for b in model.transformer.h)
    if p.stage_policies:  # the planner records blocks under policies where they pay
        assert set(p.stage_policies) <= set(range(2, prof.n_stages))


def test_a_policy_on_the_prefix_cannot_be_installed(hf_profiled):
    from memplan.executor.apply import install_plan

    model, batch, prof = hf_profiled
    plan = planner.plan(prof.with_policies({}), strategy="store-all")
    layers = list(prof.layers)
    layers[0] = layers[0].model_copy(update={"policies": [SavePolicy(
        name="none", recompute=["*"], saved_bytes=0, forward_s=0, backward_s=0)]})
    odd = prof.model_copy(update={"layers": layers})
    p = _under(plan, odd, {1: "none"})
    with pytest.raises(InstallError, match=r"stage_policies\.1: stage 1 is the model's prefix"):
        install_plan(model, p, batch, profile=odd)


# ---------------------------------------------------------------------------------------------
# compiled stages (torch.compile per stage; compiling is slow on a small CPU: two tiny tests)


@pytest.mark.slow
def test_compiled_stages_run_a_plan_under_policies():
    from memplan.executor.run import COMPILED_TOLERANCE

    torch.set_num_threads(1)
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**{**TINY, "n_layer": 2}, dropout=0.0,
                                              attention="math"))
    prof = _profile_with_policies(stages, idx)
    p = _under(_plans(prof)["optimal"], prof, {2: "none", 3: "matmuls"})
    # compiled memory is not the eager profile's: the peak is not judged here
    r = run_plan(stages, idx, p, profile=prof, steps=2, compile=True, peak_tolerance_pct=None)
    assert r.status == "ok", r.message
    assert r.grad_max_rel_diff <= COMPILED_TOLERANCE and r.tolerance == COMPILED_TOLERANCE
    assert r.compiled and r.stage_policies == {2: "none", 3: "matmuls"}


def _compiled_gpt2(policies):
    """A 2-block HF GPT-2, a batch, the unplanned step's gradients, and its profile with each
    block compiled and `policies` measured."""
    from memplan.executor.apply import profile_model

    from tests.hf_tiny import lm_batch, tiny_lm

    torch.set_num_threads(1)
    model = tiny_lm("gpt2", "sdpa", n_layer=2, width=64, dropout=0.0).train()
    model.config.use_cache = False
    batch = lm_batch(4, 32, seed=100)
    _, want = _installed_step(copy.deepcopy(model), batch)
    prof = profile_model(model, batch, repeats=1, warmup=1, policies=policies, compile=True)
    return model, batch, want, prof


def _check_installed_compiled(model, plan, batch, prof, want) -> None:
    """`plan` installed on compiled blocks: gradients within the compiled tolerance of `want`,
    the measured peak within 0.1% of the prediction."""
    from memplan.executor.apply import install_plan, remove_checkpoint
    from memplan.executor.run import COMPILED_TOLERANCE

    install_plan(model, plan, batch, profile=prof, compile=True)
    try:
        m, got = _installed_step(model, batch)
    finally:
        remove_checkpoint(model)
    rel = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
              for a, b in zip(got, want, strict=True))
    assert rel <= COMPILED_TOLERANCE, plan.stage_policies
    assert abs(m.peak_error_pct) <= 0.1, (plan.stage_policies, m.message)


@pytest.mark.slow
def test_auto_checkpoint_compiled_blocks_plans_on_compiled_costs():
    from memplan.executor.apply import (
        auto_checkpoint,
        measure_step,
        profile_model,
        remove_checkpoint,
    )

    model, batch, want, prof = _compiled_gpt2(["none", "matmuls"])
    assert prof.meta["compiled"] and all("forward" not in b.__dict__ for b in model.transformer.h)
    eager = profile_model(copy.deepcopy(model), batch, repeats=1, warmup=0)
    # compile's fusion: the compiled blocks keep fewer bytes than the eager ones
    assert prof.layers[1].saved_bytes < eager.layers[1].saved_bytes
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    bare = prof.with_policies({})
    _check_installed_compiled(model, _under(planner.plan(bare, strategy="optimal",
                                                         budget_bytes=int(0.7 * store)), prof,
                                            {2: "matmuls", 3: "none"}), batch, prof, want)
    auto_checkpoint(model, batch, budget=int(0.7 * store), profile=prof, compile=True)
    try:
        m = measure_step(model, batch, time_steps=0)
    finally:
        remove_checkpoint(model)
    assert m.measured_peak_bytes <= int(0.7 * store) and abs(m.peak_error_pct) <= 0.1, m.message
    assert all("forward" not in b.__dict__ for b in model.transformer.h)  # removed exactly


def test_installed_policies_under_bf16_autocast_within_tolerance(hf_profiled):
    from memplan.executor.apply import install_plan, remove_checkpoint
    from memplan.executor.compare import tolerance_for

    model, batch, prof = hf_profiled
    ref = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, want = _installed_step(ref, batch)
    bare = prof.with_policies({})
    store = planner.plan(bare, strategy="store-all").predicted.peak_bytes
    plan = planner.plan(bare, strategy="optimal", budget_bytes=int(0.6 * store))
    chosen = {i: ("matmuls" if i % 2 else "none") for i, la in enumerate(prof.layers, start=1)
              if {"matmuls", "none"} <= set(la.policy_names)}
    install_plan(model, _under(plan, prof, chosen), batch, profile=prof)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, got = _installed_step(model, batch)
    finally:
        remove_checkpoint(model)
    tol = tolerance_for("bfloat16")
    for a, b in zip(got, want, strict=True):
        assert float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1e-30)


def test_installed_policies_on_llama_keep_gradients_and_peak():
    # Llama's blocks take the rotary tables and the mask as keywords: the recorded call and its
    # rerun inside the backward get them from the block's own call
    from memplan.executor.apply import install_plan, profile_model, remove_checkpoint

    from tests.hf_tiny import lm_batch, tiny_lm

    torch.set_num_threads(1)
    model = tiny_lm("llama", "sdpa", n_layer=3, width=64).train()
    model.config.use_cache = False
    batch = lm_batch(4, 32, seed=100)
    _, want = _installed_step(copy.deepcopy(model), batch)
    prof = profile_model(model, batch, repeats=1, warmup=0, policies=["none", "matmuls"])
    bare = prof.with_policies({})
    store = planner.plan(bare, strategy="store-all").predicted.peak_bytes
    plan = planner.plan(bare, strategy="optimal", budget_bytes=int(0.6 * store))
    for name in ("none", "matmuls"):
        chosen = {i: name for i, la in enumerate(prof.layers, start=1) if name in la.policy_names}
        assert len(chosen) == 3, prof.layers[1].policy_names
        install_plan(model, _under(plan, prof, chosen), batch, profile=prof)
        try:
            m, got = _installed_step(model, batch)
        finally:
            remove_checkpoint(model)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), name
        assert abs(m.peak_error_pct) <= 0.1, (name, m.message)


@pytest.mark.slow
def test_mincut_policies_of_compiled_blocks_measure_what_they_run():
    # NOTE [ min-cut policies of compiled stages ]: each block compiled under a memory budget is
    # an option with its own measured bytes; installed, the step's peak is the predicted one
    from memplan.executor.apply import install_plan

    model, batch, want, prof = _compiled_gpt2(["mincut50", "mincut5", "mincut0"])
    for layer in prof.layers[1:-1]:
        by_name = {p.name: p for p in layer.policies}
        assert set(by_name) == {"mincut50", "mincut5", "mincut0"}, by_name
        assert by_name["mincut50"].recompute == ["mincut:0.5"]
        assert by_name["mincut5"].recompute == ["mincut:0.05"]
        assert by_name["mincut0"].recompute == ["mincut:0.0"]
        # the partitioner under a smaller budget keeps no more bytes, and all fewer than plain
        assert (by_name["mincut0"].saved_bytes <= by_name["mincut5"].saved_bytes
                <= by_name["mincut50"].saved_bytes < layer.saved_bytes)
        assert by_name["mincut0"].saved_bytes < by_name["mincut50"].saved_bytes
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    bare = planner.plan(prof.with_policies({}), strategy="optimal", budget_bytes=int(0.7 * store))
    for chosen in ({2: "mincut50", 3: "mincut0"}, {2: "mincut5", 3: "mincut0"}, {2: "mincut0", 3: "mincut0"}):
        _check_installed_compiled(model, _under(bare, prof, chosen), batch, prof, want)
    # eager blocks cannot run a min-cut policy: refused in one line naming the stage
    with pytest.raises(InstallError, match=r"plan.stage_policies.2: 'mincut:0.5' .* compile=True"):
        install_plan(model, _under(bare, prof, {2: "mincut50"}), batch, profile=prof)
    assert all("forward" not in b.__dict__ for b in model.transformer.h)


def test_mincut_policies_need_compiled_stages():
    from memplan.executor.apply import profile_model
    from memplan.executor.runner import ScheduleRunner
    from memplan.profiler.policies import policy_names, recorded

    with pytest.raises(ValueError, match="policies: 'mincut50' .* compile=True"):
        policy_names(["matmuls", "mincut50"])
    assert {"mincut50", "mincut20", "mincut10", "mincut5", "mincut0"} <= set(policy_names(True, compiled=True))
    assert "mincut20" not in policy_names(True)
    with pytest.raises(ValueError, match="runs only on compiled stages"):
        recorded(torch.nn.Linear(2, 2), torch.ones(1, 2), recompute=["mincut:0.2"])
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**{**TINY, "n_layer": 1}, dropout=0.0))
    plan = planner.plan(measure.profile_chain(stages, idx, repeats=1, warmup=0),
                        strategy="store-all")
    with pytest.raises(ExecutorError, match="policies: stage 2 is recorded under 'mincut:0.5'"):
        ScheduleRunner(stages, plan.ops(), device=torch.device("cpu"), policies={2: ["mincut:0.5"]})
    with pytest.raises(InstallError, match="policies: 'mincut0' .* compile=True"):
        profile_model(torch.nn.Linear(2, 2), torch.ones(1, 2), policies=["mincut0"])
