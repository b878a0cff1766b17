"""Offload in `memplan run` and `executor.pipeline.run_builtin`: `--offload-bandwidth` and
`--host-memory` reach the RunSpec, the planner and `run_hf_config` as bytes/s and bytes; a plan
that moves activations is refused on the CPU in one line naming the option (exit code 2), and a
plan that moves none runs there as any other.

The tiny GPT's kept activations are 4 KiB: at 25 GB/s a transfer takes about 160 ns, hidden under
any window op (hundreds of microseconds on the CPU), so the optimal plan without a budget keeps
one of them on the host (the same time, a lower peak); at 1 byte/s a transfer would take over an
hour, so nothing moves."""

from __future__ import annotations

import pytest
from memplan.executor.offload import CPU_REFUSAL, TRANSFER_OPS, has_transfers
from memplan.executor.pipeline import RunSpec, run_builtin
from memplan.executor.report import ExecutorError, InfeasiblePlanError
from typer.testing import CliRunner

from memplan import planner
from memplan.cli import app
from tests.cli_lines import one_error_line

runner = CliRunner()
TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "2", "--seq", "16", "--vocab", "64",
        "--batch", "2", "--dropout", "0", "--steps", "1"]
SPEC = dict(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=2, dropout=0.0,
            steps=1, repeats=1)
REFUSAL = "--offload-bandwidth: " + CPU_REFUSAL.removeprefix("offload: ")


@pytest.fixture
def plans(monkeypatch):
    """The plans `run_builtin` makes (planner.plan spied on), in order."""
    made = []
    real = planner.plan

    def spy(*args, **kwargs):
        made.append(plan := real(*args, **kwargs))
        return plan

    monkeypatch.setattr(planner, "plan", spy)
    return made


@pytest.fixture
def specs(monkeypatch):
    """The RunSpecs `memplan run` builds; the run itself stops at once (infeasible, exit code 1)."""
    import memplan.executor.pipeline as pipeline

    seen = []

    def fake(spec, progress=None):
        seen.append(spec)
        raise InfeasiblePlanError("--budget: stopped by the test")

    monkeypatch.setattr(pipeline, "run_builtin", fake)
    return seen




@pytest.mark.parametrize(("args", "bandwidth", "host"), [
    (["--offload-bandwidth", "25GB/s", "--host-memory", "64GiB"], 25e9, 64 * 2**30),
    (["--offload-bandwidth", "25GiB/s"], 25 * 2.0**30, None),
    (["--offload-bandwidth", "1e9"], 1e9, None),
    ([], None, None),
])
def test_cli_flags_reach_the_run_spec_in_bytes(specs, args, bandwidth, host):
    res = runner.invoke(app, ["run", *TINY, *args])
    assert res.exit_code == 1 and len(specs) == 1, res.output
    assert specs[0].offload_bandwidth == bandwidth and specs[0].host_memory_bytes == host


def test_cli_bad_bandwidth_is_one_line_naming_the_option(specs):
    line = one_error_line(runner.invoke(app, ["run", *TINY, "--offload-bandwidth", "fast"]))
    assert line.startswith("--offload-bandwidth: cannot read 'fast' as bytes per second")
    line = one_error_line(runner.invoke(app, ["run", *TINY, "--offload-bandwidth", "1GB/s",
                                               "--host-memory", "lots"]))
    assert line.startswith("--host-memory: ")
    line = one_error_line(runner.invoke(app, ["run", *TINY, "--offload-bandwidth", "0GB/s"]))
    assert line == "--offload-bandwidth: must be above 0 bytes/s, got '0GB/s'; leave it out for no offload"
    assert specs == []  # refused before anything was built


def test_cli_server_body_carries_the_options_only_when_given(monkeypatch):
    import memplan.cli.run as run_cli

    bodies = []

    class Remote:
        def run(self, body):
            bodies.append(body)
            return {"id": "r1", "state": "failed", "error": {"detail": REFUSAL}}

    monkeypatch.setattr(run_cli, "remote", lambda server: Remote())
    res = runner.invoke(app, ["run", *TINY, "--offload-bandwidth", "25GB/s", "--host-memory", "1GiB",
                              "--server", "http://127.0.0.1:1"])
    assert one_error_line(res) == f"server: job r1 failed: {REFUSAL}"
    assert bodies[0]["offload_bandwidth"] == 25e9 and bodies[0]["host_memory_bytes"] == 2**30
    runner.invoke(app, ["run", *TINY, "--server", "http://127.0.0.1:1"])
    assert "offload_bandwidth" not in bodies[1] and "host_memory_bytes" not in bodies[1]


def test_cli_hf_config_passes_the_options_to_run_hf_config(monkeypatch, tmp_path):
    import memplan.executor.install as install

    seen = {}

    def fake(path, **kwargs):
        seen.update(kwargs)
        raise InfeasiblePlanError("budget: stopped by the test")

    monkeypatch.setattr(install, "run_hf_config", fake)
    res = runner.invoke(app, ["run", "--hf-config", str(tmp_path / "config.json"),
                              "--offload-bandwidth", "16GB/s", "--host-memory", "8GiB"])
    assert res.exit_code == 1, res.output
    assert seen["offload_bandwidth"] == 16e9 and seen["host_memory_bytes"] == 8 * 2**30


def test_run_hf_config_names_the_runs_option_when_it_refuses_on_the_cpu():
    from memplan.executor.apply import InstallError
    from memplan.executor.install import run_hf_config

    gpt2 = {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 32, "n_layer": 3,
            "n_head": 4, "tie_word_embeddings": False}
    with pytest.raises(InstallError) as info:
        run_hf_config(gpt2, batch_size=2, seq=16, fraction=0.5, steps=1, offload_bandwidth=25e9)
    assert str(info.value) == REFUSAL


@pytest.mark.slow
def test_cli_offload_plan_on_the_cpu_is_refused_in_one_line(plans):
    line = one_error_line(runner.invoke(app, ["run", *TINY, "--offload-bandwidth", "25GB/s"]))
    assert line == REFUSAL
    assert plans[-1].options["offload_bandwidth"] == 25e9
    moved = [op for op in plans[-1].schedule if op[0] in TRANSFER_OPS]

    def what(op):  # ("", i) for a_i, ("_record", i) for record i
        return (op[0].removeprefix("offload").removeprefix("fetch"), *op[1:])

    # each tensor the plan puts on the host comes back
    assert moved and sorted(what(op) for op in moved if op[0].startswith("offload")) == \
        sorted(what(op) for op in moved if op[0].startswith("fetch")), plans[-1].schedule


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    (["--strategy", "sqrt", "--offload-bandwidth", "25GB/s"],
     "--offload-bandwidth: only strategy optimal plans offload, got 'sqrt'"),
    (["--host-memory", "1GiB"], "--host-memory: bounds the host memory of offloaded activations"),
])
def test_cli_options_the_planner_refuses_name_the_option(args, message):
    # refused before profiling, with the planner's own rules (check_offload_options)
    assert one_error_line(runner.invoke(app, ["run", *TINY, *args])).startswith(message)


@pytest.mark.slow
def test_cli_plan_that_moves_nothing_runs_on_the_cpu(plans):
    res = runner.invoke(app, ["run", *TINY, "--offload-bandwidth", "1B/s", "--json"])
    assert res.exit_code == 0, res.output
    assert plans[-1].options["offload_bandwidth"] == 1.0 and not has_transfers(plans[-1].ops())
    assert '"status": "ok"' in res.stdout


@pytest.mark.slow
def test_run_builtin_host_memory_of_zero_moves_nothing_and_runs(plans):
    report, _, plan = run_builtin(RunSpec(**SPEC, offload_bandwidth=25e9, host_memory_bytes=0))
    assert plan.options["host_memory_bytes"] == 0 and not has_transfers(plan.ops())
    assert report.status == "ok", report.message


def test_run_builtin_refuses_offload_with_another_strategy_naming_the_field():
    from memplan.planner.schema import PlanError

    with pytest.raises(PlanError) as info:
        run_builtin(RunSpec(**SPEC, strategy="uniform", offload_bandwidth=25e9))
    assert info.value.field == "options.offload_bandwidth" and "\n" not in str(info.value)


@pytest.mark.gpu
def test_offload_run_on_cuda_matches_its_prediction(plans):
    report, _, plan = run_builtin(RunSpec(**SPEC, device="cuda", offload_bandwidth=25e9))
    assert has_transfers(plan.ops())
    assert report.status == "ok", report.message
    assert report.grad_max_rel_diff is not None and report.grad_max_rel_diff <= report.tolerance


def test_the_cpu_refusal_is_the_runners_line_naming_the_option():
    """The check `run_builtin` makes between planning and running: transfer ops off CUDA."""
    from memplan.executor.pipeline import _check_offload_device

    class Plan:
        def __init__(self, ops):
            self._ops = ops

        def ops(self):
            return self._ops

    moving = Plan([("F", 1), ("offload", 1), ("F", 2), ("loss",), ("B", 2), ("fetch", 1), ("B", 1)])
    with pytest.raises(ExecutorError) as info:
        _check_offload_device(moving, "cpu")
    assert str(info.value) == REFUSAL and "\n" not in REFUSAL
    _check_offload_device(moving, "cuda:0")  # CUDA: the runner's own checks follow
    _check_offload_device(Plan([("F", 1), ("F", 2), ("loss",), ("B", 2), ("B", 1)]), "cpu")
