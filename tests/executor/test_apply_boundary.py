"""The API's boundary: re-planning a planned model, a plan installed without its profile, and bad
calls refused in one clear line with the model left as it was.

Facts checked: `auto_checkpoint` on an already planned model (a new batch shape, a new budget)
replaces the plan as on a fresh model (bitwise equal gradients, one installation's hooks) and
`remove_checkpoint` then gives back the model exactly as it was; a refused call keeps the plan it
found; `measure_step` gives no store-all peak for a plan installed without `profile=`, and the
true one with it; calls under no_grad, on frozen models, with a batch of the wrong form, a bad
`blocks` or a non-module raise `InstallError` naming the argument.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from memplan.executor.apply import (
    InstallError,
    auto_checkpoint,
    install_plan,
    installed_plan,
    measure_step,
    profile_model,
    remove_checkpoint,
)
from memplan.executor.report import InfeasiblePlanError
from memplan.planner import plan as make_plan
from torch import nn

from tests.hf_tiny import lm_batch, tiny_lm

WIDTH = 32


def _gpt2():
    model = tiny_lm("gpt2", "sdpa", n_layer=3, width=WIDTH, dropout=0.1)
    model.config.use_cache = False
    return model.train()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4)], nn.Linear(16, 4))


def _xy(n: int = 8):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _hooks(model: nn.Module) -> list:
    """Every module hook and instance forward of the model (what an installation adds)."""
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
             len(m._backward_pre_hooks), "forward" in m.__dict__) for m in model.modules()]


def _step(model: nn.Module, batch: dict, seed: int):
    """One training step of the user's loop: (loss, gradients)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for the planned model and its copy
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _same_step(model: nn.Module, ref: nn.Module, batch: dict, seed: int) -> bool:
    (l1, g1), (l2, g2) = _step(model, batch, seed), _step(ref, batch, seed)
    return torch.equal(l1, l2) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(g1, g2, strict=True))


def _half_store_all(prof) -> int:
    return int(0.5 * make_plan(prof, strategy="store-all").predicted.peak_bytes)


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert msg and "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------
# re-planning replaces the plan (NOTE [ Re-planning replaces the plan ])


def test_replanning_a_planned_model_is_as_on_a_fresh_one_and_removal_restores_it():
    torch.set_num_threads(1)
    model = _gpt2()
    ref = copy.deepcopy(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    bare = _hooks(model)
    small, large = lm_batch(2, 12, seed=1), lm_batch(4, 24, seed=2)

    first = auto_checkpoint(model, small, budget=_half_store_all(
        profile_model(ref, small, repeats=1, warmup=0)), repeats=1)
    one_plan = _hooks(model)
    assert one_plan != bare and first.recomputed

    # measured with the first plan installed: as the fresh copy measures, and the plan stays
    prof_large = profile_model(model, large, repeats=1, warmup=0)
    ref_large = profile_model(ref, large, repeats=1, warmup=0)
    assert installed_plan(model) is first and _hooks(model) == one_plan
    assert prof_large.fingerprint() == ref_large.fingerprint()
    for a, b in zip(prof_large.layers, ref_large.layers, strict=True):
        assert a.saved_bytes == b.saved_bytes, (a.name, a.saved_bytes, b.saved_bytes)

    # the warning's advice followed: re-plan on the new shape, another budget
    second = auto_checkpoint(model, large, budget=_half_store_all(ref_large), repeats=1)
    assert installed_plan(model) is second and second is not first
    assert second.profile_fingerprint == ref_large.fingerprint() != first.profile_fingerprint
    assert second.recomputed
    assert _hooks(model) == one_plan  # one installation's hooks, not two
    for seed in range(2):
        assert _same_step(model, ref, large, seed)

    assert remove_checkpoint(model) is second
    assert remove_checkpoint(model) is None
    assert _hooks(model) == bare
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    model.eval()
    ref.eval()
    with torch.no_grad():
        assert torch.equal(model(**small).logits, ref(**small).logits)


def test_install_plan_replaces_and_a_refused_call_keeps_the_plan_it_found():
    torch.set_num_threads(1)
    model = _gpt2()
    ref = copy.deepcopy(model)
    batch = lm_batch(2, 12, seed=1)
    prof = profile_model(model, batch, repeats=1, warmup=0)
    half = make_plan(prof, budget_bytes=_half_store_all(prof))
    least = make_plan(prof, strategy="sqrt")
    assert half.feasible and least.feasible and half.schedule != least.schedule
    bare = _hooks(model)
    try:
        install_plan(model, half, batch, profile=prof)
        one_plan = _hooks(model)
        install_plan(model, least, batch, profile=prof)
        assert installed_plan(model) is least and _hooks(model) == one_plan

        other_shape = make_plan(profile_model(ref, lm_batch(2, 16), repeats=1, warmup=0), strategy="sqrt")
        with pytest.raises(InstallError, match="plan.profile_fingerprint"):
            install_plan(model, other_shape, batch)
        with pytest.raises(InfeasiblePlanError, match="budget"):
            auto_checkpoint(model, batch, budget=16, repeats=1)
        with pytest.raises(InstallError, match="blocks"):
            auto_checkpoint(model, batch, blocks="transformer.nothing", repeats=1)
        assert installed_plan(model) is least and _hooks(model) == one_plan
        assert _same_step(model, ref, batch, seed=5)
    finally:
        remove_checkpoint(model)
    assert _hooks(model) == bare


def test_a_plan_refused_at_installation_leaves_no_hook():
    """An offload plan on the CPU is refused by the installation itself (after the layout check):
    the refusal comes before any hook or forward is added, and the plan the model had stays."""
    from memplan.executor.apply import OffloadNeedsCudaError
    from memplan.planner.schema import PlanError

    torch.set_num_threads(1)
    model = _gpt2()
    ref = copy.deepcopy(model)
    batch = lm_batch(4, 24, seed=1)
    prof = profile_model(model, batch, repeats=1, warmup=0)
    store = make_plan(prof, strategy="store-all").predicted.peak_bytes
    moving = None
    for frac in (0.6, 0.5, 0.4, 0.8):
        try:
            p = make_plan(prof, budget_bytes=int(frac * store), offload_bandwidth=1e9)
        except (TypeError, PlanError) as err:
            pytest.skip(f"the planner does not plan offload here: {err}")
        if p.feasible and any(op[0] in ("offload", "offload_record") for op in p.ops()):
            moving = p
            break
    if moving is None:
        pytest.skip("no plan with transfer ops at these budgets")
    bare = _hooks(model)
    with pytest.raises(OffloadNeedsCudaError):
        install_plan(model, moving, batch, profile=prof)
    assert installed_plan(model) is None and _hooks(model) == bare
    assert _same_step(model, ref, batch, seed=1)
    kept = install_plan(model, make_plan(prof, budget_bytes=int(0.5 * store)), batch, profile=prof)
    one_plan = _hooks(model)
    try:
        with pytest.raises(OffloadNeedsCudaError):
            install_plan(model, moving, batch, profile=prof)
        assert installed_plan(model) is kept and _hooks(model) == one_plan
        assert _same_step(model, ref, batch, seed=2)
    finally:
        remove_checkpoint(model)


# ---------------------------------------------------------------------------------------------
# the store-all peak of a plan installed without its profile


def test_measure_step_gives_no_wrong_store_all_peak_without_the_profile(caplog):
    torch.set_num_threads(1)
    model = _gpt2()
    batch = lm_batch(4, 24, seed=1)
    prof = profile_model(model, batch, repeats=1, warmup=0)
    store = make_plan(prof, strategy="store-all").predicted.peak_bytes
    p = make_plan(prof, budget_bytes=int(0.5 * store))
    unplanned = measure_step(model, batch, time_steps=0).measured_peak_bytes
    assert abs(unplanned - store) <= 0.035 * store  # the profile's store-all is the real one

    install_plan(model, p, batch)  # no profile=: the plan carries no store-all figure
    try:
        m = measure_step(model, batch, time_steps=0)
        assert m.store_all_peak_bytes is None
        assert "store-all peak unknown" in m.message and "saves nothing" not in m.message
        assert m.measured_peak_bytes < 0.75 * unplanned  # and the plan does save
        # the layout still knows the profiled batch: another shape is warned about
        with caplog.at_level(logging.WARNING, logger="memplan.executor.apply"):
            _step(model, lm_batch(4, 32, seed=2), seed=0)
        assert "re-plan with auto_checkpoint" in caplog.text
    finally:
        remove_checkpoint(model)

    install_plan(model, p, batch, profile=prof)
    try:
        m = measure_step(model, batch, time_steps=0)
        assert m.store_all_peak_bytes == store
        assert f"store-all would be {store} bytes" in m.message and "saves nothing" not in m.message
    finally:
        remove_checkpoint(model)


# ---------------------------------------------------------------------------------------------
# bad calls: one clear line, the model as it was


def test_calls_where_no_training_step_runs_are_refused_clearly():
    mlp = _mlp()
    xy = _xy()
    bare = _hooks(mlp)
    for ctx in (torch.no_grad, torch.inference_mode):
        for call in (lambda: auto_checkpoint(mlp, xy, loss_fn=F.cross_entropy, budget="1MiB"),
                     lambda: profile_model(mlp, xy, loss_fn=F.cross_entropy),
                     lambda: measure_step(mlp, xy, loss_fn=F.cross_entropy)):
            with ctx(), pytest.raises(InstallError) as err:
                call()
            assert "torch.no_grad()" in _one_line(err) and "gradients are enabled" in str(err.value)
    frozen = _mlp().requires_grad_(False)
    for call in (lambda: auto_checkpoint(frozen, xy, loss_fn=F.cross_entropy, budget="1MiB"),
                 lambda: measure_step(frozen, xy, loss_fn=F.cross_entropy)):
        with pytest.raises(InstallError) as err:
            call()
        assert _one_line(err).startswith("model: no parameter requires grad")
    with pytest.raises(InstallError) as err:  # a loss cut from the graph
        auto_checkpoint(mlp, xy, loss_fn=lambda o, t: F.cross_entropy(o, t).detach(), budget="1MiB")
    assert _one_line(err).startswith("loss_fn: the loss does not require grad")
    assert installed_plan(mlp) is None and _hooks(mlp) == bare
    assert all(p.grad is None for p in mlp.parameters())  # the profile put the gradients back


def test_a_batch_of_the_wrong_form_names_loss_fn():
    mlp = _mlp()
    xy = _xy()
    with pytest.raises(InstallError) as err:
        auto_checkpoint(mlp, xy, budget="1MiB")  # (inputs, target) without loss_fn
    msg = _one_line(err)
    assert msg.startswith("example_batch: calling the model on it raised TypeError") and "loss_fn=" in msg
    assert isinstance(err.value.__cause__, TypeError)  # the original, chained
    with pytest.raises(InstallError) as err:
        measure_step(mlp, xy)
    assert _one_line(err).startswith("batch: calling the model") and "loss_fn=" in str(err.value)
    assert installed_plan(mlp) is None


@pytest.mark.parametrize("blocks", [5, nn.Linear(2, 2), {"a": 1}, 2.5])
def test_blocks_of_a_wrong_type_are_refused_at_the_boundary(blocks):
    with pytest.raises(InstallError) as err:
        auto_checkpoint(_mlp(), _xy(), loss_fn=F.cross_entropy, blocks=blocks, budget="1MiB")
    assert _one_line(err).startswith("blocks: give a dotted path")
    assert type(blocks).__name__ in str(err.value)


def test_a_model_that_is_not_a_module_is_refused():
    for call in (lambda: remove_checkpoint("x"), lambda: installed_plan(3),
                 lambda: install_plan("x", {}, _xy()),
                 lambda: measure_step("x", _xy(), loss_fn=F.cross_entropy),
                 lambda: auto_checkpoint(None, _xy(), loss_fn=F.cross_entropy, budget="1MiB"),
                 lambda: profile_model([], _xy(), loss_fn=F.cross_entropy)):
        with pytest.raises(InstallError) as err:
            call()
        assert _one_line(err).startswith("model: expected a torch.nn.Module, got ")


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "nope"}, "--hf-config: model_type 'nope' is not one transformers "),
    ({"torch_dtype": "bogus"}, "--hf-config: torch_dtype 'bogus' is not a torch dtype"),
    ({"dtype": "float33"}, "--hf-config: dtype 'float33' is not a torch dtype"),
    ({"hidden_act": "bogus"}, "--hf-config: hidden_act 'bogus' is not an activation"),
    ({"num_hidden_layers": 1}, "--hf-config: num_hidden_layers is 1; memplan plans a chain of two"),
])
def test_a_config_transformers_would_fail_on_is_named_before_building(change, message):
    """hf_config_of refuses, in one short line naming the field, the configs that failed deep in
    transformers (AttributeError for a bad dtype, KeyError for an activation, a list of every
    model type) or that have a single block."""
    from memplan.executor.install import hf_config_of, hf_model_from_config

    cfg = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    assert hf_config_of(cfg).num_hidden_layers == 2
    for build in (hf_config_of, hf_model_from_config):
        with pytest.raises(InstallError) as err:
            build({**cfg, **change})
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
        assert len(str(err.value)) < 200


def test_an_unknown_optimizer_is_refused_before_measuring():
    model, batch = tiny_lm("gpt2"), lm_batch()
    with pytest.raises(InstallError, match="^optimizer: choose one of adamw"):
        profile_model(model, batch, optimizer="AdamW")
