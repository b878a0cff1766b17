"""Capacity answers: Llama-2-7B's model states and fit at 1 and 8 GPUs, each boundary checked
against plans one step either side of it, and against a scan on a small model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memplan.planner import plan
from memplan.planner.capacity import DEVICES, capacity, device_preset
from memplan.planner.schema import PlanError
from memplan.profiler.hf_config import hf_analytic_profile
from memplan.profiler.schema import ProfileError

CONFIGS = Path(__file__).parents[1] / "profiler" / "hf_configs"
LLAMA7B = json.loads((CONFIGS / "llama-2-7b.json").read_text())
N7B = 6_738_415_616


def test_llama2_7b_does_not_fit_one_80gb_gpu():
    a = capacity({"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096,
                  "precision": "bf16-mixed", "policies": False})
    assert not a.fits and a.max_micro_batch == 0 and a.min_gpus is None
    assert a.n_params == N7B
    assert a.model_state_bytes == 16 * N7B == 107_814_649_856  # about 108 GB: 4 + 4 + 8 bytes
    assert "model states alone" in a.message


@pytest.mark.parametrize(("optimizer", "per_param"), [
    ("adamw", 16), ("adam", 16), ("sgd-momentum", 12), ("sgd", 8), ("none", 8)])
def test_the_optimizer_prices_the_model_states(optimizer, per_param):
    """fp32 weights and gradients (4 + 4 bytes) plus the optimizer's buffers: AdamW two moments
    (8), SGD with momentum one (4), plain SGD none. Llama-2-7B's states under plain SGD (8 x 6.74e9
    = 53.9 GB) fit one 80 GB GPU, AdamW's (107.8 GB) do not; `plan --precision` of a profile made
    for SGD prices SGD too, as the same plan without it does."""
    n = 6_738_415_616
    a = capacity({"config": LLAMA7B, "memory_bytes": 80 * 10**9, "precision": "fp32", "seq_len": 1024,
                  "optimizer": optimizer, "policies": False})
    assert a.model_state_bytes == per_param * n and a.fits == (per_param == 8)
    prof = hf_analytic_profile(LLAMA7B, seq_len=1024, batch_size=1, precision="fp32", optimizer=optimizer)
    for kw in ({}, {"n_gpus": 8, "zero_stage": 1}):
        without = plan(prof, memory_bytes=80 * 10**9, **kw)
        assert plan(prof, memory_bytes=80 * 10**9, precision="fp32", **kw).budget_bytes == without.budget_bytes


def test_llama2_7b_fits_8_gpus_at_zero3_and_the_boundaries_are_exact():
    base = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096, "precision": "bf16-mixed",
            "n_gpus": 8, "zero_stage": 3, "max_overhead": 0.3, "policies": False}
    a = capacity(base)
    assert a.fits and a.total_peak_bytes <= 80 * 10**9
    # ZeRO-3 over 8: the 16 bytes a parameter sharded, plus the largest unit gathered (a decoder
    # layer: 4 C^2 + 3 C F + 2 C parameters, fp32 weights)
    assert a.model_state_bytes == 16 * N7B // 8 + 4 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096)
    mb = a.max_micro_batch
    z3 = capacity({**base, "policies": True})
    assert {r.precision: r.model_state_bytes for r in z3.policies}["bf16-mixed"] == a.model_state_bytes
    assert mb >= 2 and not a.max_micro_batch_capped
    at = capacity({**base, "micro_batch": mb})
    over = capacity({**base, "micro_batch": mb + 1})
    assert at.fits and at.overhead <= 0.3
    assert not over.fits
    assert capacity({**base, "seq_len": a.max_seq_len}).fits
    assert not capacity({**base, "seq_len": a.max_seq_len + 1}).fits
    g = a.min_gpus
    assert g >= 2 and capacity({**base, "n_gpus": g}).fits and not capacity({**base, "n_gpus": g - 1}).fits


def test_max_micro_batch_equals_a_scan_of_plans():
    """On a small Llama the search's answer is the last micro-batch of a linear scan of the
    optimal plans that fits."""
    cfg = json.loads((CONFIGS / "tiny-llama.json").read_text())
    memory = 3_000_000
    a = capacity({"config": cfg, "memory_bytes": memory, "seq_len": 64, "precision": "fp32",
                  "attention": "eager", "policies": False})
    fits = []
    for b in range(1, 40):
        prof = hf_analytic_profile(cfg, seq_len=64, batch_size=b, precision="fp32", attention="eager",
                                   device="cuda")
        fits.append(plan(prof, memory_bytes=memory, precision="fp32").feasible)
    assert fits[0] and not fits[-1]
    assert a.max_micro_batch == max(b for b, ok in enumerate(fits, start=1) if ok)
    assert fits == sorted(fits, reverse=True)  # monotone, as the search assumes


def test_lean_loss_prices_the_lean_head_and_fits_more():
    """With the lean loss the store-all activations fall by the head's difference (the fp32
    log-softmax against the 16-bit logits, less its labels), the largest micro-batch that fits is
    the last of a scan of plans of lean profiles, and a tensor-parallel head is refused."""
    base = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096, "precision": "bf16-mixed",
            "n_gpus": 8, "zero_stage": 3, "policies": False}
    hf, lean = capacity(base), capacity({**base, "lean_loss": True})
    N, V = 4096, 32000
    assert hf.store_all_activation_bytes - lean.store_all_activation_bytes >= (4 - 2) * N * V
    assert lean.assumptions["loss"] == "lean" and hf.assumptions["loss"] == "hf"
    assert lean.max_micro_batch > hf.max_micro_batch
    mb = lean.max_micro_batch
    assert capacity({**base, "lean_loss": True, "micro_batch": mb}).fits
    assert not capacity({**base, "lean_loss": True, "micro_batch": mb + 1}).fits
    with pytest.raises(ProfileError, match=r"^lean_loss: the lean loss is not vocabulary-parallel"):
        capacity({**base, "lean_loss": True, "tp": 2})


def test_reused_logits_free_one_logits_tensor_at_the_head():
    """`reuse_logits`: the head's backward holds the chunks alone, one N x V of 16-bit logits less
    than the lean loss's; the answer says which loss it assumed, and the largest micro-batch is
    the last that fits; without `lean_loss` it is refused in one line."""
    base = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096, "precision": "bf16-mixed",
            "n_gpus": 8, "zero_stage": 3, "policies": False, "lean_loss": True}
    lean, reuse = capacity(base), capacity({**base, "reuse_logits": True})
    assert lean.assumptions["reuse_logits"] is False and reuse.assumptions["reuse_logits"] is True
    assert reuse.assumptions["loss"] == "lean"
    assert reuse.max_micro_batch >= lean.max_micro_batch
    mb = reuse.max_micro_batch
    assert capacity({**base, "reuse_logits": True, "micro_batch": mb}).fits
    assert not capacity({**base, "reuse_logits": True, "micro_batch": mb + 1}).fits
    with pytest.raises(PlanError, match=r"^reuse_logits: it is an option of the lean loss"):
        capacity({**base, "lean_loss": False, "reuse_logits": True})


def test_policy_table_orders_policies_by_their_bytes():
    a = capacity({"config": LLAMA7B, "device": "h200", "seq_len": 4096})
    rows = {r.precision: r for r in a.policies}
    assert set(rows) == {"fp32", "bf16-mixed", "fp16-mixed", "bf16"}
    assert rows["bf16"].model_state_bytes == 8 * N7B and rows["bf16-mixed"].model_state_bytes == 16 * N7B
    assert rows["bf16-mixed"].model_state_bytes == a.model_state_bytes
    assert rows["bf16"].fits and rows["bf16-mixed"].fits  # 141 GiB holds 108 GB of states
    assert rows["bf16"].max_micro_batch > rows["bf16-mixed"].max_micro_batch >= 1
    assert a.memory_bytes == 141 * 2**30 and a.assumptions["peak_flops"] == 989e12


def test_devices_and_bad_input_name_the_field():
    assert device_preset("H100").memory_bytes == 80 * 2**30 and len(DEVICES) == 7
    with pytest.raises(PlanError, match="device"):
        device_preset("tpu")
    with pytest.raises(PlanError, match="memory_bytes"):
        capacity({"config": LLAMA7B})
    with pytest.raises(PlanError, match="seq_len"):
        capacity({"config": LLAMA7B, "memory_bytes": 10**9, "seq_len": 0})
    with pytest.raises(PlanError, match="precision"):
        capacity({"config": LLAMA7B, "memory_bytes": 10**9, "precision": "fp8"})
    # zero-mixed prices states only: refused naming the policies a step is profiled under, and
    # plan --precision zero-mixed does not send the user to a profile that cannot be made
    with pytest.raises(PlanError, match=r"^precision: choose one of fp32, bf16-mixed, fp16-mixed, bf16, "
                                        r"not 'zero-mixed'"):
        capacity({"config": LLAMA7B, "memory_bytes": 10**9, "precision": "zero-mixed"})
    prof = hf_analytic_profile(LLAMA7B, seq_len=256, batch_size=1, precision="fp32")
    with pytest.raises(PlanError, match=r"^precision: the profile was made under fp32; zero-mixed prices "
                                        r"model states only .* plan with --precision fp32$"):
        plan(prof, memory_bytes=80 * 10**9, n_gpus=8, zero_stage=3, precision="zero-mixed")
    huge = {**json.loads((CONFIGS / "tiny-llama.json").read_text()), "vocab_size": 2**45}
    with pytest.raises(ValueError, match="^config: the profile's .*ceilings.*a smaller model"):
        capacity({"config": huge, "memory_bytes": 2**60})  # one line, naming what to shrink
    # the model fits the ceilings at one token: the batch and sequence are named
    with pytest.raises(ValueError, match="^seq_len, batch_size: the profile's .*ceilings.*smaller batch"):
        hf_analytic_profile(json.loads((CONFIGS / "tiny-llama.json").read_text()), seq_len=2**22,
                            batch_size=2**30)
    # searches pass through sizes beyond the ceilings: they do not fit
    tiny = json.loads((CONFIGS / "tiny-llama.json").read_text())
    a = capacity({"config": tiny, "memory_bytes": 2**60, "seq_len": 2**22, "micro_batch": 2**16,
                  "policies": False})
    assert a.fits and a.max_micro_batch == 2**16 and a.max_micro_batch_capped


def test_cli_exit_codes_and_json():
    from typer.testing import CliRunner

    from memplan.cli import app

    runner = CliRunner()
    path = str(CONFIGS / "llama-2-7b.json")
    res = runner.invoke(app, ["capacity", path, "--memory", "80GB", "--seq", "4096"])
    assert res.exit_code == 1, res.output
    assert "does not fit" in res.stdout
    res = runner.invoke(app, ["capacity", path, "--memory", "80GB", "--seq", "4096", "--gpus", "8",
                              "--zero-stage", "3", "--max-overhead", "30%", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["fits"] and got["max_overhead"] == 0.3 and got["max_micro_batch"] >= 2
    res = runner.invoke(app, ["capacity", path, "--memory", "80GB", "--seq", "4096", "--gpus", "8",
                              "--zero-stage", "3", "--max-overhead", "30%", "--lean-loss", "--json"])
    lean = json.loads(res.stdout)
    assert lean["assumptions"]["loss"] == "lean" and lean["max_micro_batch"] > got["max_micro_batch"]
    for args, field in ((["--device", "tpu"], "--device"), (["--memory", "lots"], "--memory"),
                        (["--memory", "80GB", "--seq", "0"], "--seq"),
                        (["--memory", "80GB", "--tp", "2", "--gpus", "2", "--lean-loss"], "--lean-loss"),
                        (["--memory", "80GB", "--reuse-logits"], "--reuse-logits"),
                        (["--memory", "80GB", "--precision", "fp8"], "--precision")):
        res = runner.invoke(app, ["capacity", path, *args])
        assert res.exit_code == 2, (args, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), res.stderr


def test_cli_profile_hf_config_analytic(tmp_path):
    from typer.testing import CliRunner

    from memplan.cli import app

    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["profile", "--hf-config", str(CONFIGS / "tiny-llama.json"), "--analytic",
                                   "--seq", "12", "--batch", "2", "--precision", "bf16-mixed",
                                   "--attention", "eager", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    want = hf_analytic_profile(json.loads((CONFIGS / "tiny-llama.json").read_text()), seq_len=12,
                               batch_size=2, precision="bf16-mixed", attention="eager")
    assert [ly["saved_bytes"] for ly in prof["layers"]] == [ly.saved_bytes for ly in want.layers]
    res = CliRunner().invoke(app, ["profile", "--hf-config", str(CONFIGS / "tiny-llama.json"), "--analytic"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --seq")


def test_1f1b_in_flight_equals_a_simulation_of_the_schedule():
    """NOTE [ 1F1B in flight ]: stage p holds min(P - p, M) micro-batches, and the makespan is
    (M + P - 1)(f + b), in an event simulation of every (P, M) up to 8 stages and 12 micro-batches."""
    from memplan.planner.pipeline_parallel import in_flight, one_f_one_b, simulate_1f1b

    for P in range(1, 9):
        for M in range(1, 13):
            sim = simulate_1f1b(P, M, forward_s=1.0, backward_s=2.0)
            assert list(sim.max_in_flight) == [in_flight(P, M, p) for p in range(P)], (P, M)
            assert sim.makespan_s == (M + P - 1) * 3.0, (P, M)
    # every stage runs each micro-batch's forward and backward once, forward first
    for ops in one_f_one_b(4, 6):
        assert sorted(ops) == sorted([("F", m) for m in range(6)] + [("B", m) for m in range(6)])
        assert all(ops.index(("F", m)) < ops.index(("B", m)) for m in range(6))


def test_pipeline_stage_bytes_of_llama2_7b():
    from memplan.planner.pipeline_parallel import pipeline_stage_bytes, split_layers

    prof = hf_analytic_profile(LLAMA7B, seq_len=4096, batch_size=1, precision="bf16-mixed")
    stages = pipeline_stage_bytes(prof, 4, 8)
    assert [s["in_flight"] for s in stages] == [4, 3, 2, 1]
    per_layer = prof.layers[1].saved_bytes + prof.layers[1].output_bytes
    embed = prof.layers[0].saved_bytes + prof.layers[0].output_bytes
    head = prof.layers[-1].saved_bytes + prof.layers[-1].output_bytes
    assert stages[0]["activation_bytes"] == 4 * (embed + 8 * per_layer)
    assert stages[3]["activation_bytes"] == 1 * (8 * per_layer + head)
    assert sum(s["param_bytes"] for s in stages) == 4 * N7B
    assert [len(r) for r in split_layers(10, 4)] == [3, 3, 2, 2]
    with pytest.raises(PlanError, match="pp"):
        split_layers(2, 3)


def test_cli_profile_hf_config_measured_equals_analytic(tmp_path):
    """Without --analytic the same flag builds the model from the config (random weights) and
    measures it: its bytes per stage are the analytic ones."""
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from memplan.cli import app

    out = tmp_path / "m.json"
    cfg = CONFIGS / "tiny-qwen2.json"
    res = CliRunner().invoke(app, ["profile", "--hf-config", str(cfg), "--seq", "8", "--batch", "2",
                                   "--attention", "eager", "--repeats", "1", "--warmup", "0",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(out.read_text())
    want = hf_analytic_profile(json.loads(cfg.read_text()), seq_len=8, batch_size=2, attention="eager")
    assert got["meta"]["source"].endswith("(measured)")
    assert [(ly["output_bytes"], ly["saved_bytes"]) for ly in got["layers"]] == [
        (ly.output_bytes, ly.saved_bytes) for ly in want.layers]


def test_interleaved_in_flight_equals_a_simulation_of_the_schedule():
    """NOTE [ Interleaved 1F1B in flight ]: rank p holds min(2 (P - p - 1) + (v - 1) P + 1, M v)
    chunk-micro-batches (all M v when M = P), and the step is (M v + P - 1) chunk times: a bubble of
    (P - 1)/(v M), in an event simulation of Megatron-LM's interleaved order."""
    from memplan.planner.pipeline_parallel import (
        bubble_fraction,
        in_flight_interleaved,
        interleaved_1f1b,
        simulate_interleaved,
    )

    for P in range(2, 7):
        for v in (2, 3):
            for M in (P, 2 * P, 3 * P):
                sim = simulate_interleaved(P, M, v, forward_s=1.0, backward_s=2.0)
                assert list(sim.max_in_flight) == [in_flight_interleaved(P, M, v, p) for p in range(P)]
                assert sim.makespan_s == (M * v + P - 1) * 3.0
                assert sim.makespan_s == pytest.approx(M * v * 3.0 * (1 + bubble_fraction(P, M, v)))
    # rank 0 holds L/P (1 + (P - 1)/(P v)) layers' worth (Korthikanti et al. 2022): 11 chunks of L/8
    assert in_flight_interleaved(4, 8, 2, 0) == 11 and in_flight_interleaved(4, 8, 1, 0) == 4
    for ops in interleaved_1f1b(3, 6, 2):
        assert sorted(ops) == sorted([(k, j, m) for k in "FB" for j in range(2) for m in range(6)])
    with pytest.raises(PlanError, match="^micro_batches: the interleaved schedule runs a multiple"):
        in_flight_interleaved(4, 6, 2, 0)


def test_parallel_layout_errors_name_the_field():
    base = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "policies": False}
    for extra, field in ((dict(n_gpus=6, tp=4), "n_gpus"), (dict(n_gpus=3, tp=3), "tp"),
                         (dict(n_gpus=2, cp=2, seq_len=4097), "seq_len"), (dict(n_gpus=2, sp=True), "sp"),
                         (dict(n_gpus=2, tp=2, sp=True, seq_len=4095), "seq_len"),
                         (dict(n_gpus=64, pp=64), "pp"), (dict(tp=0), "tp"),
                         (dict(n_gpus=2, pp=2, virtual_stages=2, micro_batches=3), "micro_batches"),
                         (dict(virtual_stages=2), "virtual_stages"), (dict(gpus_per_node=0), "gpus_per_node")):
        with pytest.raises(PlanError, match=f"^{field}: ") as err:
            capacity({**base, **extra})
        assert "\n" not in str(err.value)
    tiny_moe = json.loads((CONFIGS / "tiny-mixtral.json").read_text())
    with pytest.raises(PlanError, match="^tp: .*MoE"):
        capacity({"config": tiny_moe, "memory_bytes": 10**9, "n_gpus": 2, "tp": 2, "seq_len": 8})


def test_llama2_7b_tp2_pp2_states_boundaries_and_step_time():
    """8 x 80 GB, tp=2, pp=2 (dp=2), ZeRO-1: each GPU holds half of half of the model's tensors,
    the optimizer state halved again; the boundaries hold one step either side."""
    from memplan.planner.step_time import LINKS
    from memplan.profiler.hf_config import _rank_params, decoder_shape, param_counts

    base = {"config": LLAMA7B, "device": "h100", "memory_bytes": 80 * 10**9, "seq_len": 4096,
            "precision": "bf16-mixed", "n_gpus": 8, "zero_stage": 1, "tp": 2, "pp": 2,
            "max_overhead": 0.3, "policies": False}
    a = capacity(base)
    assert a.fits and a.parallel["dp"] == 2 and a.parallel["micro_batches"] == 2
    shape = decoder_shape(LLAMA7B)
    embed, layers, head = _rank_params(shape, param_counts(shape), 2)
    C, F = 4096, 11008
    assert layers[0] == (4 * C * C + 3 * C * F) // 2 + 2 * C  # norms whole on each rank
    rank0 = embed + sum(layers[:16])  # pipeline rank 0: the embedding and 16 layers
    rank1 = sum(layers[16:]) + head
    n = rank0 if a.parallel["binding_pipeline_rank"] == 0 else rank1
    assert a.model_state_bytes == (4 + 4) * n + 8 * n // 2
    # rank 0 holds 2 micro-batches in flight, rank 1 one
    assert {k: v["in_flight"] for k, v in a.parallel["pipeline_ranks"].items()} == {"0": 2, "1": 1}
    # pipeline receive buffers: one activation each way (rank 0: one), bf16-mixed keeps fp32 x
    assert a.comm_buffer_bytes == 4 * 4096 * C
    mb = a.max_micro_batch
    assert capacity({**base, "micro_batch": mb}).fits and not capacity({**base, "micro_batch": mb + 1}).fits
    g = a.min_gpus
    assert g % 4 == 0 and capacity({**base, "n_gpus": g}).fits
    assert g == 4 or not capacity({**base, "n_gpus": g - 4}).fits
    # step time: NOTE [ Step time under parallelism ]; ZeRO-1 all-reduces the rank's fp32 gradients
    st, link = a.step, LINKS["h100"]
    G = 4 * (rank0 if st["pipeline_rank"] == 0 else rank1)
    assert st["dp_comm_s"] == pytest.approx(2 * (2 - 1) / 2 * G / link.intra_node)
    assert st["bubble_fraction"] == 0.5
    tp_layer = 4 * 2 * (2 - 1) / 2 * 2 * 4096 * C  # four all-reduces of bf16 N x C a layer
    assert st["tp_comm_s"] == pytest.approx(3 * 16 * tp_layer / link.intra_node)  # (M + P - 1) x 16 layers
    assert a.step_time_s == pytest.approx(st["compute_s"] + st["tp_comm_s"] + st["pp_comm_s"] + st["dp_comm_s"])
    slow = capacity({**base, "intra_node_bandwidth": link.intra_node / 2})
    assert slow.step["tp_comm_s"] == pytest.approx(2 * st["tp_comm_s"])


def test_sequence_and_context_parallel_shrink_the_activations():
    """At tp=2 SP splits the norms and the residual stream too; cp=2 halves every activation but
    the gathered K and V; both leave the model states of their layout."""
    from memplan.planner.parallelism import parallel_layout, rank_profile
    from memplan.profiler.hf_config import decoder_shape

    shape = decoder_shape(LLAMA7B)
    kw = dict(B=1, T=4096, precision="bf16", attention="sdpa", optimizer="adamw", flops_per_s=1e15,
              zero_stage=0)
    whole = rank_profile(shape, parallel_layout(shape, 4096, gpus=1), 0, **kw).layers[1].saved_bytes
    tp = rank_profile(shape, parallel_layout(shape, 4096, gpus=2, tp=2), 0, **kw).layers[1].saved_bytes
    sp = rank_profile(shape, parallel_layout(shape, 4096, gpus=2, tp=2, sp=True), 0, **kw).layers[1].saved_bytes
    cp = rank_profile(shape, parallel_layout(shape, 4096, gpus=2, cp=2), 0, **kw).layers[1].saved_bytes
    s, h, kv = 4096, 4096, 2 * 4096 * 4096 * 2  # kv: bf16 K and V of the whole sequence
    # pure bf16: what TP leaves whole (NOTE [ ... per rank ] 2-3): the norms' fp32 upcasts 2 x 4sh,
    # rsqrts 2 x 4s, normalised x and outputs (the projections' inputs) 4 x 2sh, cos and sin
    replicated = 2 * 4 * s * h + 2 * 4 * s + 4 * 2 * s * h + 2 * 2 * s * 128
    assert tp == replicated + (whole - replicated) // 2
    # SP splits all but the projections' gathered inputs (2 x 2sh) and cos, sin
    gathered = 2 * 2 * s * h + 2 * 2 * s * 128
    assert sp == gathered + (whole - gathered) // 2
    assert cp == (whole - kv - 2 * 2 * s * 128) // 2 + kv + 2 * 2 * (s // 2) * 128


def test_cli_parallel_flags():
    from typer.testing import CliRunner

    from memplan.cli import app

    runner = CliRunner()
    path = str(CONFIGS / "llama-2-7b.json")
    res = runner.invoke(app, ["capacity", path, "--memory", "80GB", "--gpus", "8", "--tp", "2", "--sp",
                              "--pp", "2", "--micro-batches", "4", "--virtual-stages", "2",
                              "--inter-node-bandwidth", "25GB", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert {k: got["parallel"][k] for k in ("tp", "sp", "pp", "dp", "micro_batches", "virtual_stages")} == {
        "tp": 2, "sp": True, "pp": 2, "dp": 2, "micro_batches": 4, "virtual_stages": 2}
    assert got["step"]["links"]["inter_node_bytes_per_s"] == 25e9 and got["step"]["bubble_fraction"] == 0.125
    for args, field in ((["--gpus", "6", "--tp", "4"], "--gpus"), (["--gpus", "2", "--sp"], "--sp"),
                        (["--gpus", "2", "--cp", "2", "--seq", "4097"], "--seq"),
                        (["--gpus", "2", "--pp", "2", "--virtual-stages", "2", "--micro-batches", "3"],
                         "--micro-batches"), (["--tp", "0"], "--tp")):
        res = runner.invoke(app, ["capacity", path, "--memory", "80GB", *args])
        assert res.exit_code == 2, (args, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), res.stderr


def test_tied_embedding_pending_gradient_is_in_the_peak():
    """Gemma-2B ties its 256,000 x 2,048 embedding to the head: autograd holds the head's fp32
    gradient of it (2.1 GB) through the whole backward. Capacity used to leave it out and answered
    "fits" at 57.62 GB of 58 GB with a plan whose real peak was 59.72 GB."""
    gemma = json.loads((CONFIGS / "gemma-2b.json").read_text())
    pending = 256_000 * 2_048 * 4
    a = capacity({"config": gemma, "memory_bytes": 58 * 10**9, "seq_len": 2048, "policies": False})
    assert a.assumptions["pending_shared_grad_bytes"] == pending
    # the plan's fixed bytes are the states plus the pending gradient, so its peak is at least that
    assert a.total_peak_bytes - a.activation_peak_bytes == a.model_state_bytes + pending
    assert a.total_peak_bytes <= 58 * 10**9
    # the old answer's plan (its activations beside states without the pending gradient) is over
    assert a.activation_peak_bytes < 57_624_092_680 - a.model_state_bytes
    # an untied config holds none
    assert capacity({"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 256, "n_gpus": 8,
                     "zero_stage": 3, "policies": False}).assumptions["pending_shared_grad_bytes"] == 0


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_tied_pending_gradient_is_whole_on_every_gpu_under_zero(zero_stage):
    """Autograd's buffer of the head's gradient precedes any reduce-scatter: ZeRO shards the
    states, not it (as shard_profile keeps a measured profile's pending gradient)."""
    qwen = json.loads((CONFIGS / "qwen2-0.5b.json").read_text())
    pending = qwen["vocab_size"] * qwen["hidden_size"] * 4
    a = capacity({"config": qwen, "memory_bytes": 80 * 10**9, "seq_len": 1024, "n_gpus": 8,
                  "zero_stage": zero_stage, "policies": False})
    fixed = a.total_peak_bytes - a.activation_peak_bytes
    assert fixed == a.model_state_bytes + a.comm_buffer_bytes + pending


def test_cli_capacity_bad_config_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from memplan.cli import app

    for patch, start in (({"tie_word_embeddings": "false"}, "config.tie_word_embeddings: expected true or false"),
                         ({"model_type": ["llama"]}, "config.model_type: ['llama'] is not a decoder"),
                         ({"model_type": None}, "config.model_type: missing"),
                         ({"num_hidden_layers": 10**9}, "config.num_hidden_layers: at most 10,000")):
        path = tmp_path / "c.json"
        path.write_text(json.dumps({**LLAMA7B, **patch}))
        res = CliRunner().invoke(app, ["capacity", str(path), "--memory", "80GB"])
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {start}"), res.stderr
    res = CliRunner().invoke(app, ["capacity", str(CONFIGS / "llama-2-7b.json"), "--memory", "80GB",
                                   "--optimizer", "lion"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --optimizer:"), res.stderr
