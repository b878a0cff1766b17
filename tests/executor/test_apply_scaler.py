"""An installed plan under fp16 autocast on the CPU with a GradScaler (issue 21): the user's loop
(`with torch.autocast("cpu", dtype=torch.float16): loss = model(**batch).loss`, then
`scaler.scale(loss).backward()`, `scaler.step(opt)`, `scaler.update()`) against the unmodified
model in the same loop, and the measured peak against the plan made on the autocast profile
(under fp16 and bf16: the cast cache that holds it above the prediction is the same in both)."""

from __future__ import annotations

import copy

import pytest
import torch
from memplan.executor.apply import auto_checkpoint, measure_step, profile_model, remove_checkpoint
from memplan.planner import plan
from memplan.profiler.memory import measure_memory

from tests.hf_tiny import lm_batch, tiny_lm

DTYPE = torch.float16  # CPU autocast takes float16 in torch 2.13 (matmuls and linears run in fp16)
FRACTION = 0.3


def _model():
    torch.set_num_threads(1)
    model = tiny_lm("llama", "sdpa", n_layer=6, width=64).train()
    model.config.use_cache = False
    return model


_PROFILES: dict[torch.dtype, tuple] = {}


def _autocast_profile(dtype: torch.dtype):
    """The model's profile measured under `dtype` autocast (profile_model inside the autocast
    region: the stages' bytes and times are the autocast step's), and its store-all peak (bytes);
    made once per dtype."""
    if dtype not in _PROFILES:
        with torch.autocast("cpu", dtype=dtype):
            prof = profile_model(_model(), lm_batch(4, 32, seed=200), repeats=1, warmup=0)
        _PROFILES[dtype] = (prof, plan(prof, strategy="store-all").predicted.peak_bytes)
    return _PROFILES[dtype]


@pytest.fixture(scope="module")
def fp16_profile():
    return _autocast_profile(DTYPE)


def _installed(profiled):
    prof, store_all = profiled
    model = _model()
    ref = copy.deepcopy(model)
    p = auto_checkpoint(model, lm_batch(4, 32, seed=200), budget=int(FRACTION * store_all), profile=prof)
    assert p.recomputed  # the budget makes it recompute
    return model, ref, p


def _scaler_run(model, batches):
    """Steps of the user's fp16 loop with a GradScaler whose scale starts at 2**20 and doubles
    after every finite step (growth_interval=1), so that some steps overflow in fp16 and are
    skipped. Returns the scale after each step, whether each step found an inf or NaN, the
    unscaled gradients of each step, and the parameters at the end."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=1)
    scales, found, grads = [], [], []
    for batch in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=DTYPE):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        found.append(sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0)
        grads.append([p.grad.clone() for p in model.parameters()])
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, found, grads, [p.detach().clone() for p in model.parameters()]


def test_grad_scaler_steps_equal_the_unmodified_models(fp16_profile):
    """Five steps: the same scales and the same skipped steps (at least one step overflows and is
    skipped, at least one is taken), the unscaled gradients of every finite step bitwise equal to
    the unmodified model's (the recomputes run under the first forward's autocast; fp16 is the
    same arithmetic then), the non-finite ones non-finite in the same tensors, and the parameters
    equal at the end."""
    model, ref, _ = _installed(fp16_profile)
    batches = [lm_batch(4, 32, seed=210 + k) for k in range(5)]
    try:
        got = _scaler_run(model, batches)
        want = _scaler_run(ref, batches)
    finally:
        remove_checkpoint(model)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert any(got[1]) and not all(got[1]), got[1]  # overflowed steps and taken steps both
    for k, overflow in enumerate(got[1]):
        for a, b in zip(got[2][k], want[2][k], strict=True):
            if overflow:
                assert torch.isfinite(a).all() == torch.isfinite(b).all()
            else:
                assert torch.equal(a, b), f"step {k}"
    for a, b in zip(got[3], want[3], strict=True):
        assert torch.equal(a, b)


def _loop_peak(model, batch, dtype: torch.dtype = DTYPE) -> int:
    """Activation peak (bytes, the batch included) of one step of the user's loop with a
    GradScaler, by exact CPU accounting: forward and loss under `dtype` autocast, the scaled
    backward outside it (as measure_step counts: the peak above the level before the step)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with measure_memory("cpu") as meter:
        with torch.autocast("cpu", dtype=dtype):
            loss = model(**batch).loss
        meter.mark("backward")
        scaler.scale(loss).backward()
        del loss
    peak = max(meter.phases["start"].peak_bytes, meter.phases["backward"].peak_bytes)
    return peak + sum(t.untyped_storage().nbytes() for t in batch.values())


def test_unmodified_model_under_fp16_matches_the_store_all_prediction(fp16_profile):
    """The autocast profile's store-all prediction against the unmodified model in the user's
    fp16 loop (the profile is right about the model under autocast): within 2%."""
    _, store_all = fp16_profile
    measured = _loop_peak(_model(), lm_batch(4, 32, seed=220))
    assert abs(measured - store_all) <= 0.02 * measured, (measured, store_all)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_installed_plan_peak_under_autocast_within_two_percent(dtype):
    """The installed plan's measured peak within 2% of the prediction made on the autocast
    profile, in the user's loop (backward outside autocast, scaled) and in measure_step called
    inside autocast (backward under autocast too), on a fresh batch."""
    model, _, p = _installed(_autocast_profile(dtype))
    try:
        measured = _loop_peak(model, lm_batch(4, 32, seed=221), dtype)
        with torch.autocast("cpu", dtype=dtype):
            m = measure_step(model, lm_batch(4, 32, seed=222), time_steps=0)
    finally:
        remove_checkpoint(model)
    pred = p.predicted.peak_bytes
    assert abs(measured - pred) <= 0.02 * measured, (measured, pred)
    assert abs(m.peak_error_pct) <= 2.0, m.message
