"""Transfer ops in the runner (executor/offload.py): gradients bitwise equal to the unplanned step
with records and activations moved out and back, the exact bytes moved, the CPU refusal, and a
schedule that reads a moved tensor without fetching it. On the CPU the same code path runs with
the private `_host_device="cpu"` (copies to other CPU tensors, no streams)."""

from __future__ import annotations

import pytest
import torch
from memplan.executor import ExecutorError
from memplan.executor.offload import CPU_REFUSAL
from memplan.executor.runner import ScheduleRunner
from memplan.profiler.tensors import unique_params

from tests.executor.models import measured_profile, mlp_chain

SPEC_REFUSAL = (
    "offload: this plan moves activations to host memory, which needs a CUDA device (there is no "
    "device memory to save on the CPU); plan without offload_bandwidth"
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")


def _plain(stages, x, seed=1):
    """Parameter gradients of the unplanned step (forward in order, loss.backward())."""
    for p in unique_params(stages):
        p.grad = None
    torch.manual_seed(seed)
    a = x
    for s in stages:
        a = s(a)
    a.backward()
    return float(a.detach()), [p.grad.clone() for p in unique_params(stages)]


def _run(stages, x, ops, seed=1, **kw):
    for p in unique_params(stages):
        p.grad = None
    torch.manual_seed(seed)
    r = ScheduleRunner(stages, ops, device=torch.device(kw.pop("device", "cpu")), **kw)
    r.prepare()
    loss = r.step(x)
    return r, float(loss), [p.grad.clone() for p in unique_params(stages)]


def _store_all(L):
    return [("R", i) for i in range(1, L + 1)] + [("loss",)] + [("B", i) for i in range(L, 0, -1)]


# the worked intuition of the spec: store-all with a_1 (pinned by record 2) and record 2 on the host
# from the op after R 2 until the op before B 2, on 5 stages (4 blocks and the head)
WORKED = [("R", 1), ("R", 2), ("offload", 1), ("offload_record", 2), ("R", 3), ("R", 4), ("R", 5),
          ("loss",), ("B", 5), ("B", 4), ("fetch", 1), ("fetch_record", 2), ("B", 3), ("B", 2),
          ("B", 1)]

# a checkpoint offloaded and fetched for its recompute, a record offloaded during the forward, and
# an offloaded pinned input: eager offload (the op after its last reader), lazy fetch (the op
# before its next reader)
CHECKPOINTED = [("F", 1), ("F", 2), ("offload", 1), ("R", 3), ("offload_record", 3), ("R", 4),
                ("offload", 3), ("R", 5), ("loss",), ("fetch", 3), ("B", 5), ("fetch_record", 3),
                ("B", 4), ("drop", 3), ("fetch", 1), ("B", 3), ("drop", 2), ("R", 2), ("B", 2),
                ("drop", 1), ("R", 1), ("B", 1)]


# a_1 offloaded with the op that reads it (R 2 saves it: the record's saved input is the moved
# copy, fetched back for B 2)
ON_ITS_READER = [("R", 1), ("offload", 1), ("R", 2), ("R", 3), ("R", 4), ("R", 5), ("loss",),
                 ("B", 5), ("B", 4), ("fetch", 1), ("B", 3), ("B", 2), ("B", 1)]


def _mlp4():
    """The MLP chain of the schedules above: 4 blocks (BatchNorm, dropout) and the head."""
    stages, x = mlp_chain(4, width=16, batch=8, dropout=0.1, batchnorm=True)
    assert len(stages) == 5
    return stages, x


@pytest.mark.parametrize("ops", [WORKED, CHECKPOINTED, ON_ITS_READER],
                         ids=["worked", "checkpointed", "on-its-reader"])
def test_mlp_chain_gradients_bitwise_equal_with_transfers(ops):
    stages, x = _mlp4()
    loss0, g0 = _plain(stages, x)
    r, loss1, g1 = _run(stages, x, ops, _host_device="cpu")
    assert loss1 == loss0
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    # BatchNorm's running statistics updated once per stage, as in the unplanned step
    assert r.offload is not None and not r.offload.pending()


def test_the_bytes_moved_are_the_activation_and_the_record():
    # record 2's own tensors are s_2 (its input a_1 and output a_2 are not the record's: one copy)
    stages, x = _mlp4()
    prof = measured_profile(stages, x, repeats=1)
    r, _, _ = _run(stages, x, WORKED, _host_device="cpu")
    assert r.offload.moved_bytes == prof.layers[0].output_bytes + prof.layers[1].saved_bytes


def test_an_input_offloaded_with_its_reader_is_freed_after_the_window():
    # R 2 saves a_1 while a_1 moves: the record saves the moving copy, so from R 3 on the device
    # holds a_1 no more (bytes as the plan without transfers, less x_1, plus its host copy x_1)
    stages, x = _mlp4()
    got = _per_op_bytes(stages, x, ON_ITS_READER, _host_device="cpu")
    bare = [op for op in ON_ITS_READER if op[0] not in ("offload", "fetch")]
    want = _per_op_bytes(stages, x, bare)
    assert got[3] == want[2]  # R 3: a_1 on the host (CPU bytes here) instead of the device
    r, _, _ = _run(stages, x, ON_ITS_READER, _host_device="cpu")
    assert r.offload.moved_bytes == 16 * 8 * 4


def test_a_record_that_saves_its_input_shares_the_input_copy():
    # offloading a_1 moves the storage record 2 saved as its input: fetched back, the record reads
    # the fetched copy (the gradients are equal), and offload_record 2 does not move a_1 again
    stages, x = _mlp4()
    prof = measured_profile(stages, x, repeats=1)
    ops = [("R", 1), ("R", 2), ("offload", 1), ("R", 3), ("R", 4), ("R", 5), ("loss",), ("B", 5),
           ("B", 4), ("fetch", 1), ("B", 3), ("B", 2), ("B", 1)]
    _, g0 = _plain(stages, x)
    r, _, g1 = _run(stages, x, ops, _host_device="cpu")
    assert r.offload.moved_bytes == prof.layers[0].output_bytes
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))


gpt = pytest.importorskip("memplan.profiler.models.gpt")
TINY = dict(n_layer=3, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4, dropout=0.1,
            attention="math")


def test_transformer_chain_gradients_bitwise_equal_with_transfers():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY))
    L = len(stages)
    assert L == 5
    ops = [("R", 1), ("R", 2), ("offload_record", 1), ("offload", 1), ("R", 3),
           ("offload_record", 2), ("offload", 2), ("R", 4), ("offload_record", 3), ("R", 5),
           ("loss",), ("fetch_record", 3), ("B", 5), ("B", 4), ("fetch_record", 2), ("fetch", 2),
           ("B", 3), ("fetch_record", 1), ("fetch", 1), ("B", 2), ("B", 1)]
    loss0, g0 = _plain(stages, idx)
    r, loss1, g1 = _run(stages, idx, ops, _host_device="cpu")
    assert loss1 == loss0
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    prof = measured_profile(stages, idx, repeats=1)
    moved = sum(prof.layers[i].saved_bytes for i in range(3)) + sum(
        prof.layers[i].output_bytes for i in range(2))
    assert r.offload.moved_bytes == moved


def test_transformer_chain_with_recompute_and_an_offloaded_checkpoint():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY))
    ops = [("F", 1), ("F", 2), ("offload", 1), ("F", 3), ("drop", 2), ("R", 4), ("R", 5), ("loss",),
           ("B", 5), ("B", 4), ("drop", 3), ("fetch", 1), ("R", 2), ("R", 3), ("B", 3), ("B", 2),
           ("drop", 1), ("R", 1), ("B", 1)]
    loss0, g0 = _plain(stages, idx)
    _, loss1, g1 = _run(stages, idx, ops, _host_device="cpu")
    assert loss1 == loss0
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))


def test_cpu_refuses_transfer_ops_before_anything_runs():
    assert CPU_REFUSAL == SPEC_REFUSAL
    stages, x = _mlp4()
    before = [p.detach().clone() for p in unique_params(stages)]
    with pytest.raises(ExecutorError) as err:
        ScheduleRunner(stages, WORKED, device=torch.device("cpu"))
    assert str(err.value) == SPEC_REFUSAL
    assert all(p.grad is None or not p.grad.any() for p in unique_params(stages))
    assert all(torch.equal(a, b) for a, b in zip(before, unique_params(stages), strict=True))
    ScheduleRunner(stages, _store_all(5), device=torch.device("cpu"))  # no transfers: runs


def _refused_without(ops, op, match: str) -> None:
    """Running `ops` less `op` (a fetch) with a CPU host raises ExecutorError matching `match`."""
    stages, x = _mlp4()
    with pytest.raises(ExecutorError, match=match):
        _run(stages, x, [o for o in ops if o != op], _host_device="cpu")


def test_reading_a_record_left_on_the_host_fails_naming_it():
    _refused_without(WORKED, ("fetch_record", 2), r"schedule\[12\] \['B', 2\]: the record of stage 2 "
                     r"is on the host; fetch it \(fetch_record 2\) with the op before")


def test_reading_an_activation_left_on_the_host_fails_naming_it():
    _refused_without(CHECKPOINTED, ("fetch", 1), r"\['R', 2\]: a_1 is on the host; fetch it "
                     r"\(fetch 1\) with the op before")
    # a_1 pinned by record 2, read by B 2
    _refused_without(WORKED, ("fetch", 1), r"\['B', 2\]: a_1 is on the host; fetch it \(fetch 1\)")


def test_a_schedule_ending_with_a_transfer_is_refused():
    stages, x = _mlp4()
    with pytest.raises(ExecutorError, match="ends with a transfer op"):
        _run(stages, x, [*_store_all(5), ("offload", 1)], _host_device="cpu")


@cuda
def test_cuda_transfers_free_device_memory_and_keep_gradients():
    import contextlib

    stages, x = mlp_chain(4, width=512, batch=256, dropout=0.1, batchnorm=False)
    stages = [s.cuda() for s in stages]
    x = x.cuda()
    loss0, g0 = _plain(stages, x)
    levels: dict[str, dict[int, int]] = {"offload": {}, "store-all": {}}

    def at(label):
        def ctx(k, op):
            levels[label][k] = torch.cuda.memory_allocated()
            return contextlib.nullcontext()
        return ctx

    results = {}
    for label, ops in (("offload", WORKED), ("store-all", _store_all(5))):
        for p in unique_params(stages):
            p.grad = None
        torch.manual_seed(1)
        r = ScheduleRunner(stages, ops, device=torch.device("cuda"))
        r.prepare()
        loss = float(r.step(x, op_context=at(label)))
        results[label] = (r, loss, [p.grad.clone() for p in unique_params(stages)])
    r, loss1, g1 = results["offload"]
    assert loss1 == loss0
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    # as R 4 starts (op 5 with transfers, op 3 without) a_1 and record 2 are off the device:
    # the difference is exactly the bytes moved, x_1 + s_2
    off, store = levels["offload"], levels["store-all"]
    assert (store[3] - store[0]) - (off[5] - off[0]) == r.offload.moved_bytes > 0


def _offload_plans(prof, fractions=(0.9, 0.5)):
    """The optimal DP's plans with offload at fractions of the store-all peak (skipped while the
    planner does not take offload_bandwidth)."""
    from memplan.planner.schema import PlanError

    from memplan import planner

    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    plans = []
    for frac in fractions:
        try:
            plan = planner.plan(prof, strategy="optimal", budget_bytes=int(store * frac),
                                offload_bandwidth=1e9)
        except (TypeError, PlanError) as err:
            pytest.skip(f"the planner does not plan offload here: {err}")
        if plan.feasible and any(op[0] in ("offload", "offload_record") for op in plan.ops()):
            plans.append(plan)
    if not plans:
        pytest.skip("no plan with transfer ops at these budgets")
    return plans


def test_the_optimal_dp_offload_plans_run_with_equal_gradients():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY))
    prof = measured_profile(stages, idx, repeats=1)
    loss0, g0 = _plain(stages, idx)
    for plan in _offload_plans(prof):
        r, loss1, g1 = _run(stages, idx, plan.ops(), _host_device="cpu")
        assert loss1 == loss0, plan.schedule
        assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True)), plan.schedule
        moved = sum(prof.layers[op[1] - 1].saved_bytes if op[0] == "offload_record"
                    else prof.layers[op[1] - 1].output_bytes
                    for op in plan.ops() if op[0] in ("offload", "offload_record"))
        assert r.offload.moved_bytes == moved, plan.schedule


def _per_op_bytes(stages, x, ops, **kw):
    """Bytes measured during each op of a second step (exact CPU accounting), a_0 counted."""
    import contextlib

    from memplan.profiler.memory import measure_memory

    for p in unique_params(stages):
        p.grad = torch.zeros_like(p)
    r = ScheduleRunner(stages, ops, device=torch.device("cpu"), **kw)
    r.prepare()
    r.step(x)
    r.prepare()
    with measure_memory("cpu") as meter:
        def mark(k, op):
            meter.mark(str(k))
            return contextlib.nullcontext()
        r.step(x, op_context=mark)
    from memplan.profiler.tensors import storage_bytes

    return [meter.phases[str(k)].peak_bytes + storage_bytes([x]) for k in range(len(ops))]


@pytest.mark.parametrize("chain", ["mlp", "gpt"])
def test_transfers_add_nothing_to_the_replays_bytes(chain):
    # On the CPU the host copies are CPU bytes too: during every op but the transfer ops
    # themselves, the bytes measured with transfers are the replay's device plus host bytes, off
    # by exactly what the same schedule without its transfer ops is off from its own replay (the
    # runner's known one-off bytes: the loss buffer, an R on a live pinned output). So moving
    # frees a tensor when its window ends and a fetch allocates when its window starts.
    from memplan.planner.simulate import simulate

    if chain == "mlp":
        stages, x = _mlp4()
    else:
        stages, x = gpt.build_gpt(gpt.GPTConfig(**TINY))
    prof = measured_profile(stages, x, repeats=1)
    for plan in _offload_plans(prof):
        ops = plan.ops()
        bare = [op for op in ops if op[0] not in ("offload", "fetch", "offload_record", "fetch_record")]
        sim = simulate(prof, ops, offload_bandwidth=1e9)
        sim_bare = simulate(prof, bare)
        assert sim.valid and sim_bare.valid
        got = _per_op_bytes(stages, x, ops, _host_device="cpu")
        got_bare = _per_op_bytes(stages, x, bare)
        kb = 0
        for k, op in enumerate(ops):
            if op[0] in ("offload", "fetch", "offload_record", "fetch_record"):
                continue
            off_by = got[k] - sim.timeline[k] - sim.host_timeline[k]
            assert off_by == got_bare[kb] - sim_bare.timeline[kb], (k, op, plan.schedule)
            kb += 1


# -- installed plans (executor/apply.py, NOTE [ Offload in installed plans ]) ----------------------

def _installed_case(kind):
    import torch.nn.functional as F
    from torch import nn

    from tests.hf_tiny import lm_batch, tiny_lm

    torch.manual_seed(0)
    if kind == "sequential":
        model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1))
                                for _ in range(6)], nn.Linear(64, 10))
        g = torch.Generator().manual_seed(11)
        batches = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))
                   for _ in range(2)]
        return model.train(), batches, F.cross_entropy
    model = tiny_lm(kind, "sdpa", n_layer=4, width=64, dropout=0.1 if kind == "gpt2" else 0.0)
    model.config.use_cache = False
    return model.train(), [lm_batch(4, 32, seed=100 + k) for k in range(2)], None


@pytest.mark.parametrize("kind", ["sequential", "gpt2", "llama"])
def test_installed_offload_plans_keep_gradients_and_move_the_planned_bytes(kind):
    import copy

    from memplan.executor.apply import _install, measure_step, profile_model, remove_checkpoint

    model, batches, loss_fn = _installed_case(kind)
    prof = profile_model(model, batches[0], loss_fn=loss_fn, repeats=1, warmup=0)
    # 60%: every record moves; 35%: checkpoints forwarded without a record move and come back
    # for their recompute in the backward (F stages, _Rejoin, recomputes from fetched inputs)
    for plan in _offload_plans(prof, fractions=(0.6, 0.35)):
        ref = copy.deepcopy(model)
        _install(model, plan, prof, None, _host_device="cpu")
        try:
            from memplan.executor.apply import _INSTALLED

            for batch in batches:  # the user's step, fresh batches
                torch.manual_seed(7)
                m = measure_step(model, batch, loss_fn=loss_fn, time_steps=0)
                got = [p.grad.clone() for p in model.parameters()]
                torch.manual_seed(7)
                r = measure_step(ref, batch, loss_fn=loss_fn, time_steps=0)
                assert m.loss == r.loss
                assert all(torch.equal(a, p.grad) for a, p in zip(got, ref.parameters(), strict=True))
            moved = _INSTALLED[model].offload.moved_bytes
            planned = sum(prof.layers[op[1] - 1].saved_bytes if op[0] == "offload_record"
                          else prof.layers[op[1] - 1].output_bytes
                          for op in plan.ops() if op[0] in ("offload", "offload_record"))
            if kind == "gpt2":  # its positions are a block argument (a side value, counted in
                assert 0 < moved - planned <= 512  # x_0) that the prefix's record also saves:
            else:  # copied with the record, kept by the blocks' arguments (frees nothing)
                assert moved == planned
            # on the CPU the host copies are CPU bytes too: device and host peaks together bound it
            pred = plan.predicted
            assert m.measured_peak_bytes <= pred.peak_bytes + pred.host_peak_bytes + 512
        finally:
            remove_checkpoint(model)


def test_an_installed_plan_with_transfers_is_refused_on_the_cpu():
    from memplan.executor.apply import InstallError, install_plan, installed_plan, profile_model

    model, batches, loss_fn = _installed_case("sequential")
    prof = profile_model(model, batches[0], loss_fn=loss_fn, repeats=1, warmup=0)
    plan = _offload_plans(prof, fractions=(0.6,))[0]
    with pytest.raises(InstallError) as err:
        install_plan(model, plan, batches[0], loss_fn=loss_fn)
    assert str(err.value) == SPEC_REFUSAL
    assert installed_plan(model) is None


def test_an_installed_plan_reading_a_record_on_the_host_fails_naming_it():
    from memplan.executor.apply import InstallError, _install, profile_model, remove_checkpoint

    model, batches, loss_fn = _installed_case("sequential")
    prof = profile_model(model, batches[0], loss_fn=loss_fn, repeats=1, warmup=0)
    plan = _offload_plans(prof, fractions=(0.6,))[0]
    gone = next(op for op in plan.ops() if op[0] == "fetch_record")
    broken = plan.model_copy(update={"schedule": [list(op) for op in plan.ops() if op != gone]})
    _install(model, broken, prof, None, _host_device="cpu")
    try:
        with pytest.raises(InstallError, match=rf"the record of stage {gone[1]} is on the host; "
                           rf"fetch it \(fetch_record {gone[1]}\) with the op before"):
            loss_fn(model(batches[0][0]), batches[0][1]).backward()
    finally:
        remove_checkpoint(model)


def test_run_plan_and_auto_checkpoint_refuse_offload_on_the_cpu():
    from memplan.executor.apply import InstallError, auto_checkpoint, installed_plan
    from memplan.executor.run import run_plan

    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY))
    prof = measured_profile(stages, idx, repeats=1)
    plan = _offload_plans(prof)[0]
    with pytest.raises(ExecutorError) as err:
        run_plan(stages, idx, plan, profile=prof)
    assert str(err.value) == CPU_REFUSAL
    from memplan.executor.apply import profile_model

    model, batches, loss_fn = _installed_case("sequential")
    mprof = profile_model(model, batches[0], loss_fn=loss_fn, repeats=1, warmup=0)
    moving = _offload_plans(mprof, fractions=(0.6,))[0]
    with pytest.raises(InstallError) as err2:
        auto_checkpoint(model, batches[0], loss_fn=loss_fn, profile=mprof,
                        budget=moving.budget_bytes, offload_bandwidth=moving.options["offload_bandwidth"])
    assert str(err2.value) == SPEC_REFUSAL
    assert installed_plan(model) is None
