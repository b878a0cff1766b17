"""The typed plan request (planner/request.py): one model for the library, the CLI and the service,
validated once, every option bounded, errors carrying their field; and the work estimate."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
from memplan.planner.request import (
    MAX_BUDGET_BYTES,
    OPTIONS,
    STRATEGY_NAMES,
    FrontierRequest,
    PlanRequest,
    estimate_work,
    frontier_request,
    plan_request,
)
from memplan.planner.schema import PlanError

from memplan import planner
from tests.planner.chains import worked_example
from tests.service.conftest import make_profile

REPO = Path(__file__).resolve().parents[2]


def test_the_optimal_modes_are_the_planners():
    from memplan.planner.optimal import MODES
    from memplan.planner.request import OPTIMAL_MODES, OptimalOptions

    assert OPTIMAL_MODES == MODES
    assert OptimalOptions.model_json_schema()["properties"]["mode"]["enum"] == list(MODES)


def test_the_registry_and_the_options_models_agree():
    assert STRATEGY_NAMES == tuple(planner.STRATEGIES) == tuple(OPTIONS)
    for name, model in OPTIONS.items():
        fn = planner._strategy(name)
        takes = {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}
        # every option the model admits is one the strategy takes (storage options are the
        # request's own fields, passed by plan_for)
        assert set(model.model_fields) <= takes, (name, set(model.model_fields) - takes)
        assert set(model.model_fields) == takes - {"checkpoint_dtype", "tolerance"}, name
        props = model.model_json_schema().get("properties", {})
        for field, info in model.model_fields.items():
            bounds = [m for m in info.metadata if type(m).__name__ in ("Le", "Lt")]
            # a byte budget (host_memory_bytes) carries its bound in its validator and schema
            bounds += [a for a in props[field].get("anyOf", []) if "maximum" in a]
            assert bounds or field == "mode", f"{name}.{field} has no upper bound"


@pytest.mark.parametrize(("fields", "field", "needle"), [
    (dict(budget_bytes=-1), "budget_bytes", "at least 0"),
    (dict(budget_bytes=float("nan")), "budget_bytes", "finite"),
    (dict(budget_bytes="10"), "budget_bytes", "number of bytes"),
    (dict(budget_bytes=2**60 + 1), "budget_bytes", "at most 2^60"),
    (dict(budget_bytes=2**63 - 1), "budget_bytes", "at most 2^60"),
    (dict(memory_bytes=2**62), "memory_bytes", "at most 2^60"),
    (dict(budget_bytes=5, memory_bytes=5), "memory_bytes", "not both"),
    (dict(strategy="fastest"), "strategy", "unknown 'fastest'"),
    (dict(strategy="sqrt", options={"k": 2}), "options.k", "strategy 'sqrt' takes no such option"),
    (dict(strategy="uniform", options={"k": 0}), "options.k", "segment length"),
    (dict(strategy="uniform", options={"k": 5}), "options.k", "in 1..4"),
    (dict(strategy="uniform", options={"k": "3"}), "options.k", "segment length"),
    (dict(options={"slots": 10_001}), "options.slots", "from 8 to 10000"),
    (dict(options={"groups": 2001}), "options.groups", "up to 2000"),
    (dict(options={"groups": True}), "options.groups", "positive integer"),
    (dict(options={"exact_max_stages": 0}), "options.exact_max_stages", "positive integer"),
    (dict(options={"max_overhead": -0.1}), "options.max_overhead", "finite fraction"),
    (dict(options={"max_gap": float("inf")}), "options.max_gap", "finite fraction"),
    (dict(options={"mode": "fast"}), "options.mode", "one of auto, exact, memo, banded, slotted or grouped, got 'fast'"),
    (dict(checkpoint_dtype="int8"), "checkpoint_dtype", "unknown 'int8'"),
    (dict(tolerance=2.0), "tolerance", "from 0 to 1"),
    (dict(n_gpus=0), "n_gpus", "from 1 to"),
    (dict(zero_stage=4), "zero_stage", "one of 0, 1, 2, 3"),
    (dict(options={"offload_bandwidth": -25e9}), "options.offload_bandwidth", "from 0 to 1e15"),
    (dict(options={"offload_bandwidth": float("inf")}), "options.offload_bandwidth", "not NaN"),
    (dict(options={"offload_bandwidth": 2e15}), "options.offload_bandwidth", "from 0 to 1e15"),
    (dict(options={"offload_bandwidth": "25GB/s"}), "options.offload_bandwidth", "bytes/s"),
    (dict(options={"offload_bandwidth": True}), "options.offload_bandwidth", "bytes/s"),
    (dict(options={"offload_bandwidth": 1e9, "host_memory_bytes": -1}),
     "options.host_memory_bytes", "at least 0"),
    (dict(options={"offload_bandwidth": 1e9, "host_memory_bytes": 2**60 + 1}),
     "options.host_memory_bytes", "at most 2^60"),
    (dict(options={"offload_bandwidth": 1e9, "host_memory_bytes": "64GiB"}),
     "options.host_memory_bytes", "number of bytes"),
    (dict(options={"host_memory_bytes": 10**9}), "options.host_memory_bytes",
     "give options.offload_bandwidth"),
    (dict(strategy="uniform", options={"offload_bandwidth": 1e9}), "options.offload_bandwidth",
     "strategy 'uniform' takes no such option"),
    (dict(strategy="heuristic", options={"offload_bandwidth": 1e9}), "options.offload_bandwidth",
     "strategy 'heuristic' takes no such option"),
    (dict(options={"offload_bandwidth": 1e9}, checkpoint_dtype="bf16"), "checkpoint_dtype",
     "not planned together"),
    (dict(options={"offload_bandwidth": 1e9, "mode": "slotted"}), "options.mode",
     "exact DP only"),
])
def test_bad_fields_raise_plan_error_naming_them(fields, field, needle):
    for call in (lambda: plan_request(profile=worked_example(), **fields),
                 lambda: planner.plan(worked_example(), **{**{k: v for k, v in fields.items()
                                                              if k != "options"},
                                                           **fields.get("options", {})})):
        with pytest.raises(PlanError) as err:
            call()
        assert err.value.field == field, str(err.value)
        assert needle in err.value.reason
        assert str(err.value) == f"{field}: {err.value.reason}"


def test_valid_requests_keep_what_was_given():
    req = plan_request(profile=worked_example(), strategy="uniform", options={"k": 2},
                       budget_bytes=30.9)
    assert req.budget_bytes == 30 and req.option_kwargs() == {"k": 2}
    assert plan_request(profile=worked_example(), strategy="sqrt").options == OPTIONS["sqrt"]()
    assert plan_request(profile=worked_example(), strategy=None).strategy == "optimal"
    assert plan_request(profile=worked_example(), budget_bytes=MAX_BUDGET_BYTES).budget_bytes == 2**60
    # JSON round trip: what the CLI sends is what the service validates
    again = PlanRequest.model_validate(json.loads(req.model_dump_json()), strict=True)
    assert again == req


def test_offload_options_are_kept_as_given():
    req = plan_request(profile=worked_example(), budget_bytes=30,
                       options={"offload_bandwidth": 25 * 10**9, "host_memory_bytes": 64.9})
    # an integer bandwidth is a float of the same value; a float host budget is rounded down
    assert req.option_kwargs() == {"offload_bandwidth": 25e9, "host_memory_bytes": 64}
    assert type(req.option_kwargs()["offload_bandwidth"]) is float
    assert PlanRequest.model_validate(json.loads(req.model_dump_json()), strict=True) == req
    # null is no offload, as an absent field
    none = plan_request(profile=worked_example(), options={"offload_bandwidth": None})
    assert none.options.offload_bandwidth is None and none.options.host_memory_bytes is None
    limit = plan_request(profile=worked_example(),
                         options={"offload_bandwidth": 1e9, "host_memory_bytes": 0})
    assert limit.options.host_memory_bytes == 0  # no host memory at all is a valid bound
    # bandwidth 0 is no offload: the lossy storage and modes it cannot plan are then fine
    zero = plan_request(profile=worked_example(), checkpoint_dtype="bf16",
                        options={"offload_bandwidth": 0, "mode": "slotted"})
    assert zero.options.offload_bandwidth == 0.0
    props = PlanRequest.model_json_schema()["$defs"]["OptimalOptions"]["properties"]
    assert props["offload_bandwidth"]["anyOf"][0] == {"type": "number", "minimum": 0,
                                                      "maximum": 1e15}
    assert props["host_memory_bytes"]["anyOf"][0]["maximum"] == 2**60


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_plan_and_plan_for_are_one_path(strategy):
    prof = worked_example()
    direct = planner.plan(prof, budget_bytes=30, strategy=strategy)
    via = planner.plan_for(plan_request(profile=prof, budget_bytes=30, strategy=strategy))
    # optimal's message names the seconds it spent: equal otherwise
    assert _timeless(direct) == _timeless(via)
    assert direct.strategy == strategy and direct.predicted is not None


def _timeless(plan) -> dict:
    data = plan.model_dump(mode="json")
    data["message"] = re.sub(r"[0-9.]+ s\b", "N s", data["message"])
    return data


def test_the_schema_bounds_every_option():
    schema = PlanRequest.model_json_schema()
    defs = schema["$defs"]
    assert defs["OptimalOptions"]["properties"]["slots"]["maximum"] == 10_000
    assert defs["UniformOptions"]["properties"]["k"]["anyOf"][0]["maximum"] == 1_000_000
    assert {d["$ref"].rsplit("/", 1)[1] for d in schema["properties"]["options"]["anyOf"]} == {
        m.__name__ for m in OPTIONS.values()}
    assert schema["properties"]["budget_bytes"]["anyOf"][0]["maximum"] == 2**60
    assert FrontierRequest.model_json_schema()["$defs"]["FrontierOptions"]["properties"]["points"][
        "anyOf"][0]["minimum"] == 2
    with pytest.raises(PlanError, match="options.points: expected an integer >= 2"):
        frontier_request(profile=worked_example(), options={"points": 1})


def test_work_estimate_follows_the_options():
    prof = make_profile(1500)
    auto = estimate_work(plan_request(profile=prof, budget_bytes=10**7))
    assert auto.driver == "profile.layers" and auto.steps == 160**2 * 1500  # banded
    grouped = estimate_work(plan_request(profile=prof, budget_bytes=10**7,
                                         options={"mode": "grouped"}))
    assert grouped.driver == "options.groups" and grouped.steps == 150**3  # capped
    free = estimate_work(plan_request(profile=prof))
    assert free.driver == "options.groups" and free.steps > grouped.steps  # uncapped frontiers
    exact = estimate_work(plan_request(profile=prof, budget_bytes=10**7, options={"mode": "exact"}))
    assert exact.driver == "profile.layers" and exact.steps == 1500**3
    slotted = estimate_work(plan_request(profile=make_profile(50), budget_bytes=10**6,
                                         options={"mode": "slotted", "slots": 10_000}))
    assert slotted.driver == "options.slots"
    assert slotted.table_bytes == 20 * 52 * 51 * 10_001  # C (float64) and choices (int16)
    k = estimate_work(plan_request(profile=prof, strategy="uniform", options={"k": 3}))
    assert k.steps == 1500  # one schedule
    assert estimate_work(plan_request(profile=prof, strategy="uniform")).steps > k.steps
    fr = estimate_work(frontier_request(profile=prof, options={"groups": 2000}))
    assert fr.driver == "options.groups" and fr.steps >= 8 * 1500**3


def test_work_estimate_of_offload_follows_repetition():
    # NOTE [ work estimate ]: the offload DP is pure Python, its frontiers grow with the distinct
    # byte sums of the chain: ~8 L^4 steps for repeated blocks, ~L^6 / 100 for distinct stages; a
    # host budget costs the same (the plan without it is tried first)
    from memplan.planner._optimal_offload import OFFLOAD_MAX_STAGES
    from memplan.profiler.schema import load_profile

    gpt = load_profile(json.loads((REPO / "examples" / "gpt24.json").read_text()))
    assert gpt.n_stages == 26
    bw = {"offload_bandwidth": 25e9}
    work = estimate_work(plan_request(profile=gpt, budget_bytes=2**32, options=bw))
    assert work.steps == 8 * 26**4 and work.driver == "profile.layers"
    host = estimate_work(plan_request(profile=gpt, budget_bytes=2**32,
                                      options={**bw, "host_memory_bytes": 2**30}))
    assert host == work
    distinct = make_profile(30)
    work = estimate_work(plan_request(profile=distinct, budget_bytes=10**5, options=bw))
    assert work.steps == 30**6 / 100 and work.table_bytes == 80 * 30**4
    host = estimate_work(plan_request(profile=distinct, budget_bytes=10**5,
                                      options={**bw, "host_memory_bytes": 10**5}))
    assert host == work
    # no offload (0 or null): the plain DP's estimate; too long a chain: refused before any work
    plain = estimate_work(plan_request(profile=distinct, budget_bytes=10**5))
    assert estimate_work(plan_request(profile=distinct, budget_bytes=10**5,
                                      options={"offload_bandwidth": 0})) == plain
    long = make_profile(OFFLOAD_MAX_STAGES + 1)
    assert estimate_work(plan_request(profile=long, options=bw)).steps == OFFLOAD_MAX_STAGES + 1
    # the frontier with offload: the plain frontier's work and the offload DP's beside it
    fr = estimate_work(frontier_request(profile=distinct))
    fr_off = estimate_work(frontier_request(profile=distinct, options=bw))
    assert fr_off.steps == fr.steps + 30**6 / 100 and fr_off.driver == "profile.layers"
