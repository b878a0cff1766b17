"""The precision policy prices the model states on every path (issue 19, item 1): the analytic
profile takes a policy and records it, the plan refuses a profile made under another policy, and
memory below the states is an infeasible plan."""

from __future__ import annotations

import pytest
from memplan.planner.precision import POLICIES, check_profile_policy, profile_policy
from memplan.planner.schema import PlanError
from memplan.profiler.analytic import gpt_analytic_profile
from memplan.profiler.precision import POLICY_DTYPES
from memplan.profiler.schema import ProfileError

from memplan import planner

GB = 10**9
# the model: an analytic 7B GPT, 32 layers, d 4096, seq 4096
GPT_7B = dict(n_layer=32, n_embd=4096, n_head=32, block_size=4096, batch_size=1)


def test_policy_tables_agree():
    """The profiler's (parameter, compute) dtypes are the planner's for every shared policy."""
    for name, (param, compute) in POLICY_DTYPES.items():
        assert (POLICIES[name].param_dtype, POLICIES[name].compute_dtype) == (param, compute)


def test_the_7b_bf16_mixed_profile_prices_16_bytes_a_parameter_and_is_infeasible_at_80_gb():
    prof = gpt_analytic_profile(GPT_7B, precision="bf16-mixed")
    f = prof.meta["fixed"]
    n = f["n_params"]
    assert 6.8e9 < n < 6.9e9
    assert prof.meta["precision"] == {"policy": "bf16-mixed", "optimizer": "adamw",
                                      "param_dtype": "float32", "compute_dtype": "bfloat16"}
    assert prof.dtype == "bfloat16" and prof.meta["autocast_dtype"] == "bfloat16"
    # fp32 weights (the masters) 4 + fp32 gradients 4 + two fp32 AdamW moments 8 = 16 B/param,
    # plus AdamW's 4-byte step counter per tensor on the CPU
    assert f["param_bytes"] == f["grad_bytes"] == 4 * n
    steps = f["optimizer_bytes"] - 8 * n
    assert 0 < steps < 4 * 1000
    assert 16 * n / GB == pytest.approx(110.0, abs=0.1)  # "about 108 GB of model states"
    plan = planner.plan(prof, memory_bytes=80 * GB, precision="bf16-mixed")
    assert not plan.feasible and plan.schedule == [] and plan.predicted is None
    assert f"need {prof.fixed_bytes} bytes" in plan.message and "bf16-mixed" in plan.message
    # the pure-bf16 profile of the same model is 8 bytes a parameter: it fitted, wrongly
    pure = gpt_analytic_profile({**GPT_7B, "dtype": "bfloat16"})
    assert pure.meta["fixed"]["param_bytes"] == 2 * n
    assert pure.meta["precision"]["policy"] == "bf16"
    assert planner.plan(pure, memory_bytes=80 * GB, strategy="store-all").feasible


def test_a_profile_of_another_policy_is_refused():
    pure = gpt_analytic_profile({**GPT_7B, "dtype": "bfloat16"})
    with pytest.raises(PlanError, match=r"^precision: the profile was made under bf16, the plan "
                                        r"asks for bf16-mixed; profile the model under bf16-mixed"):
        planner.plan(pure, memory_bytes=80 * GB, precision="bf16-mixed")
    fp32 = gpt_analytic_profile(GPT_7B)
    with pytest.raises(PlanError, match="made under fp32, the plan asks for bf16-mixed"):
        planner.plan(fp32, precision="bf16-mixed", strategy="store-all")
    mixed = gpt_analytic_profile(GPT_7B, precision="bf16-mixed")
    with pytest.raises(PlanError, match="made under bf16-mixed, the plan asks for fp16-mixed"):
        check_profile_policy(mixed, "fp16-mixed")
    assert check_profile_policy(mixed, "bf16-mixed").bytes_per_param == 16


def test_policy_of_profiles_without_the_record():
    """Profiles written before meta["precision"]: the policy from their parameter bytes and
    autocast dtype."""
    mixed = gpt_analytic_profile(GPT_7B, precision="bf16-mixed")
    meta = {k: v for k, v in mixed.meta.items() if k != "precision"}
    assert profile_policy(mixed.model_copy(update={"meta": meta})) == "bf16-mixed"
    meta16 = {**meta, "autocast_dtype": "float16"}
    assert profile_policy(mixed.model_copy(update={"meta": meta16, "dtype": "float16"})) == "fp16-mixed"
    no_autocast = {**meta, "autocast_dtype": None}
    assert profile_policy(mixed.model_copy(update={"meta": no_autocast})) is None  # unknown
    pure = gpt_analytic_profile({**GPT_7B, "dtype": "bfloat16"})
    legacy = {k: v for k, v in pure.meta.items() if k != "precision"}
    assert profile_policy(pure.model_copy(update={"meta": legacy})) == "bf16"
    assert profile_policy(pure.model_copy(update={"meta": {}})) is None


def test_the_states_are_priced_by_the_policy_when_planned():
    mixed = gpt_analytic_profile(GPT_7B, precision="bf16-mixed")
    n = mixed.meta["fixed"]["n_params"]
    other = mixed.fixed_bytes - (16 * n + (mixed.meta["fixed"]["optimizer_bytes"] - 8 * n))
    plan = planner.plan(mixed, strategy="store-all", precision="bf16-mixed")
    steps = mixed.meta["fixed"]["optimizer_bytes"] - 8 * n
    assert plan.options["fixed_bytes_per_gpu"] == 16 * n + steps + other
    eight = planner.plan(mixed, strategy="store-all", precision="bf16-mixed", n_gpus=8,
                         zero_stage=3, memory_bytes=80 * GB)
    assert eight.feasible  # sharded over 8 GPUs the states fit
    assert eight.options["fixed_bytes_per_gpu"] < 80 * GB - eight.predicted.peak_bytes


def test_analytic_policy_errors():
    with pytest.raises(ProfileError, match="dtype: bfloat16 conflicts with precision 'bf16-mixed'"):
        gpt_analytic_profile({**GPT_7B, "dtype": "bfloat16"}, precision="bf16-mixed")
    with pytest.raises(ProfileError, match="precision: unknown policy 'fp8'"):
        gpt_analytic_profile(GPT_7B, precision="fp8")
    with pytest.raises(ProfileError, match="flash attention and a dense MLP only"):
        gpt_analytic_profile({**GPT_7B, "attention": "math"}, precision="bf16-mixed")
    with pytest.raises(ProfileError, match="flash attention and a dense MLP only"):
        gpt_analytic_profile({**GPT_7B, "moe_experts": 4}, precision="fp16-mixed")
    assert gpt_analytic_profile(GPT_7B, precision="bf16").meta["fixed"]["param_bytes"] == \
        gpt_analytic_profile({**GPT_7B, "dtype": "bfloat16"}).meta["fixed"]["param_bytes"]
