"""`memplan size`: every combination of options is answered as asked or refused with exit code 2
naming the option (issue 19, item 2: `--memory 80GB --params 7B` ignored --params and answered
4.5B). The expected outcome of each combination is written out here from the rules in
docs/sizing.md ("Every combination of options"), not derived from the code.

Memory-aware answers are replaced by recording fakes for the matrix (each real one plans dozens of
models); the real ones are checked end to end below."""

from __future__ import annotations

import itertools
import json

import pytest
from memplan.planner.scaling import cheapest_for_loss, compute_optimal
from typer.testing import CliRunner

from memplan.cli import app

runner = CliRunner()
GB = 10**9

VALUES = {
    "--compute": "1e22", "--params": "7B", "--loss": "2.2", "--tokens": "1e11",
    "--unique-tokens": "1e10", "--inference-tokens": "1e12", "--memory": "80GB",
    "--devices": "8", "--seq-len": "1024", "--micro-batch": "2", "--max-overhead": "20%",
    "--strategy": "uniform", "--device": "H200", "--peak-tflops": "500", "--utilization": "0.5",
    "--law": "hoffmann",
}
MODEL = ("--compute", "--params", "--loss")
MEMORY_ONLY = ("--devices", "--seq-len", "--micro-batch", "--max-overhead", "--strategy",
               "--device", "--peak-tflops", "--utilization")
# what the memory-aware fakes must receive for each memory-only option
RECEIVED = {"--devices": ("n_devices", 8), "--seq-len": ("seq_len", 1024),
            "--micro-batch": ("micro_batch", 2), "--max-overhead": ("max_overhead", 0.2),
            "--strategy": ("strategy", "uniform"), "--device": ("device", "H200"),
            "--peak-tflops": ("peak_flops", 5e14), "--utilization": ("utilization", 0.5),
            "--law": ("law", "hoffmann")}


def expected(flags: frozenset[str]) -> str:
    """'memory' (the largest model), 'fits' (does the model fit), a non-memory query's name, or
    'refused'."""
    f = set(flags) - {"--law"}
    model = f & set(MODEL)
    mem_only = f & set(MEMORY_ONLY)
    if {"--device", "--peak-tflops"} <= f:
        return "refused"
    if "--memory" in f:
        if f & {"--tokens", "--unique-tokens", "--inference-tokens"} or len(model) > 1:
            return "refused"
        return "fits" if model else "memory"
    if mem_only:
        return "refused"
    if "--unique-tokens" in f:
        rest = f - {"--unique-tokens"}
        if rest == {"--compute"}:
            return "data-constrained"
        if rest == {"--params", "--tokens"}:
            return "data-constrained-loss"
        return "refused"
    if "--inference-tokens" in f:
        rest = f - {"--inference-tokens"}
        return "inference" if rest in ({"--compute"}, {"--loss"}) else "refused"
    if "--tokens" in f or len(model) != 1:
        return "refused"
    return {"--compute": "compute", "--params": "params", "--loss": "loss"}[model.pop()]


CASES = sorted({frozenset(c) for n in (1, 2) for c in itertools.combinations(VALUES, n)}
               | {frozenset(c) for c in (
                   ("--params", "--tokens", "--unique-tokens"),
                   ("--memory", "--params", "--devices"), ("--memory", "--compute", "--law"),
                   ("--memory", "--loss", "--max-overhead"),
                   ("--memory", "--params", "--tokens"), ("--compute", "--inference-tokens", "--law"),
                   ("--memory", "--devices", "--seq-len", "--micro-batch", "--max-overhead",
                    "--strategy", "--device", "--utilization", "--law"))}, key=sorted)


@pytest.fixture
def fakes(monkeypatch):
    """Record the memory-aware calls; answer with a plain compute sizing."""
    from memplan.planner.scaling import memory_aware, memory_fit

    calls: list[tuple[str, tuple, dict]] = []

    def fake(kind):
        def run(*args, **kwargs):
            calls.append((kind, args, kwargs))
            return compute_optimal(1e22)
        return run

    monkeypatch.setattr(memory_aware, "memory_aware_size", fake("memory"))
    monkeypatch.setattr(memory_fit, "memory_fit", fake("fits"))
    return calls


@pytest.mark.parametrize("flags", CASES, ids=lambda c: "+".join(sorted(c)))
def test_every_combination_is_answered_as_asked_or_refused(flags, fakes):
    args = [x for flag in sorted(flags) for x in (flag, VALUES[flag])]
    res = runner.invoke(app, ["size", *args, "--json"])
    want = expected(flags)
    assert "Traceback" not in res.output
    if want == "refused":
        assert res.exit_code == 2, (args, res.output)
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1 and line.startswith("error: --"), line
        named = line.split(":")[1].strip()
        # the refusal names an option: one that was given, or the one missing (and asks for it)
        assert named in flags or (named in VALUES and "give" in line), (named, flags, line)
        assert not fakes
        return
    assert res.exit_code == 0, (args, res.output)
    if want in ("memory", "fits"):
        assert len(fakes) == 1 and fakes[0][0] == want
        _, pos, kw = fakes[0]
        if want == "fits":
            n, mem = pos
            law = "hoffmann" if "--law" in flags else None
            assert n == {"--params": 7e9,
                         "--compute": compute_optimal(1e22, law=law).params,
                         "--loss": cheapest_for_loss(2.2, law=law).params}[next(iter(flags & set(MODEL)))]
        else:
            (mem,) = pos
        assert mem == 80 * GB
        for flag in flags:
            if flag in RECEIVED:
                key, value = RECEIVED[flag]
                assert kw[key] == value, (flag, kw)
        assert "--max-overhead" in flags or kw["max_overhead"] == 0.3  # the stated default
        return
    assert json.loads(res.stdout)["query"] == want
    assert not fakes


def test_the_matrix_covers_every_option_and_outcome():
    seen = {expected(c) for c in CASES}
    assert seen == {"memory", "fits", "compute", "params", "loss", "inference", "data-constrained",
                    "data-constrained-loss", "refused"}
    assert {f for c in CASES for f in c} == set(VALUES)


def test_does_7b_fit_on_80_gb():
    """The issue's question, answered for real: on one 80 GB device 7B's bf16-mixed state alone
    (16 bytes a parameter) does not fit (exit 1); on 8 with ZeRO-3 it does, with the plan's
    overhead, the largest micro-batch and the longest sequence."""
    one = runner.invoke(app, ["size", "--memory", "80GB", "--params", "7B", "--json"])
    assert one.exit_code == 1, one.output
    a = json.loads(one.stdout)
    assert a["query"] == "fits" and a["fits"] is False and a["params"] == 7e9
    assert a["fixed_bytes_per_device"] > 80 * GB and "state alone" in a["message"]
    # ZeRO-3 (the default) already shards every state: the fix offered is more devices, not a
    # higher stage (there is none); below stage 3 raising it is offered too
    assert a["message"].endswith("add devices, or give a smaller model")
    from memplan.planner.scaling.memory_fit import memory_fit

    assert memory_fit(7e9, 80 * GB, zero_stage=1).message.endswith(
        "add devices or raise the ZeRO stage (now 1)")
    eight = runner.invoke(app, ["size", "--memory", "80GB", "--params", "7B", "--devices", "8",
                                "--json"])
    assert eight.exit_code == 0, eight.output
    b = json.loads(eight.stdout)
    assert b["fits"] is True and b["recompute_overhead"] <= 0.3
    assert b["total_peak_bytes"] <= 80 * GB
    assert b["largest_micro_batch"] >= 1 and b["largest_seq_len"] >= 2048
    # the largest micro-batch fits and one more does not (within the overhead cap)
    from memplan.planner.scaling.memory_fit import memory_fit

    at = memory_fit(7e9, 80 * GB, n_devices=8, micro_batch=b["largest_micro_batch"])
    over = memory_fit(7e9, 80 * GB, n_devices=8, micro_batch=b["largest_micro_batch"] + 1)
    assert at.fits and not over.fits
