"""The planner library at its boundary: extreme sizes, times, budgets and options, every strategy.

Whatever the input, `memplan.planner.plan` returns a Plan or raises PlanError/ProfileError naming
a field, and the process never dies: the compiled kernel once read past its arrays (a segfault) on
sizes summing past int64 and budgets past its "no cap" marker. The fuzzing runs in a subprocess so
that a crash is seen as a signal, not as the test runner vanishing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = r'''
import json, math, sys
from hypothesis import HealthCheck, given, settings, strategies as st
from memplan import planner
from memplan.planner._optimal_dp import Costs
from memplan.planner._optimal_kernel import least_peak_compiled, solve_compiled
from memplan.planner.schema import PlanError
from memplan.profiler.schema import ProfileError

BIG = [0, 1, 2**31, 2**53 - 1, 2**53, 2**53 + 1, 10**17, 2**58, 2**62, 2**63 - 1, 2**64]
small = st.integers(0, 64)
usual = st.floats(0, 10)
extreme_size = st.one_of(st.sampled_from(BIG), st.integers(-5, -1))
extreme_time = st.sampled_from([0.0, 1e-300, 5e-324, 1e9, 1e9 + 1, 1e300, 1e308, 2e9])
budgets = st.one_of(st.none(), st.integers(0, 200), st.sampled_from(BIG + [2**60, 2**60 + 1]),
                    st.sampled_from([-1, 0.5, float("nan"), float("inf"), 1e30]))
OPTIONS = {
    "store-all": st.just({}),
    "sqrt": st.just({}),
    "heuristic": st.just({}),
    "uniform": st.fixed_dictionaries({}, optional={"k": st.integers(-1, 12)}),
    "optimal": st.fixed_dictionaries({}, optional={
        "max_overhead": st.sampled_from([0.0, 0.2, 1e3, 1e9, -0.1, float("nan")]),
        "exact_max_stages": st.integers(0, 8),
        "groups": st.integers(0, 8),
        "mode": st.sampled_from(["auto", "exact", "grouped", "slotted", "fast"]),
        "slots": st.sampled_from([1, 8, 64, 10_000, 10_001]),
        "max_gap": st.sampled_from([0.0, 0.01, 10.0, 11.0, float("inf")]),
    }),
}
unexpected = []
planned = {}

SIZE_FIELDS = ("output_bytes", "saved_bytes", "forward_temp_bytes", "backward_temp_bytes")

@st.composite
def requests(draw):
    # a valid chain, then some of its values (none, one, or every stage's) made extreme
    n = draw(st.integers(1, 6))
    layers = [{"name": f"s{i}", "forward_s": draw(usual), "backward_s": draw(usual),
               **{k: draw(small) for k in SIZE_FIELDS}} for i in range(n)]
    profile = {"input_bytes": draw(small), "fixed_bytes": draw(small), "layers": layers}
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(["one", "all", "top"]))
        if how == "top":
            profile[draw(st.sampled_from(["input_bytes", "fixed_bytes"]))] = draw(extreme_size)
            continue
        key = draw(st.sampled_from(SIZE_FIELDS + ("forward_s", "backward_s")))
        value = draw(extreme_time if key.endswith("_s") else extreme_size)
        for layer in (layers if how == "all" else [draw(st.sampled_from(layers))]):
            layer[key] = value
    strategy = draw(st.sampled_from(sorted(OPTIONS)))
    return profile, strategy, draw(OPTIONS[strategy]), draw(budgets), draw(st.booleans())

@settings(max_examples=int(sys.argv[1]), deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(requests())
def fuzz(req):
    profile, strategy, options, budget, as_memory = req
    key = "memory_bytes" if as_memory else "budget_bytes"
    try:
        plan = planner.plan(profile, strategy=strategy, **{key: budget}, **options)
        assert plan.n_stages == len(profile["layers"])
        planned[strategy] = planned.get(strategy, 0) + 1
    except (PlanError, ProfileError) as err:
        assert str(err) and "\n" not in str(err)
    except Exception as err:  # anything else is a bug at the boundary
        unexpected.append([strategy, options, key, repr(budget), type(err).__name__, str(err)[:300]])

@settings(max_examples=int(sys.argv[1]), deadline=None, database=None, derandomize=True)
@given(st.integers(1, 5), st.data())
def fuzz_kernel(n, data):
    # the kernel's own check, below the profile's validation (costs as grouped stages make them)
    big = st.one_of(st.integers(-3, 50), st.sampled_from(BIG))
    lists = {k: [0] + [data.draw(big) for _ in range(n)] for k in ("s", "tf_f", "tf_r", "tf_l", "tb")}
    x = [data.draw(big) for _ in range(n + 1)]
    c = Costs(x=x, f=[0.0] + [1.0] * n, b=[0.0] + [2.0] * n, **lists)
    cap = data.draw(st.one_of(st.none(), st.integers(-1, 100), st.sampled_from(BIG)))
    try:
        solve_compiled(c, cap=cap, windowed=data.draw(st.booleans()))
        least_peak_compiled(c)
    except PlanError:
        pass
    except Exception as err:
        unexpected.append(["kernel", n, repr(cap), type(err).__name__, str(err)[:300]])

fuzz()
fuzz_kernel()
print(json.dumps({"unexpected": unexpected, "planned": planned}))
'''


def test_the_library_never_crashes_at_its_boundary(tmp_path):
    script = tmp_path / "fuzz.py"
    script.write_text(_SCRIPT)
    out = subprocess.run([sys.executable, str(script), "120"], cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    # a negative return code is a signal (SIGSEGV: -11): the process died
    assert out.returncode == 0, (out.returncode, out.stderr[-4000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["unexpected"] == [], result["unexpected"][:10]
    # not vacuous: a good share of the inputs was planned, the compiled DP's included
    assert result["planned"].get("optimal", 0) > 0 and sum(result["planned"].values()) >= 30, result
