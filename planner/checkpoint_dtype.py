"""Storage precision of checkpoints: which dtype each kept activation a_i is stored in.

NOTE [ Storage precision of checkpoints ]
The chain model (docs/chain-model.md) keeps a_i in the dtype its stage computed it in.
A plan may store a kept activation in another dtype (`Plan.checkpoint_dtypes`, stage -> dtype),
which `memplan.planner.simulate` replays with these rules (docs/precision.md):

- `F i` produces a_i as computed (x_i bytes). Its first reader, `F i+1`, runs on it unchanged, so
  the forward (and the loss) is exactly the unplanned one; right after that op, unless the next op
  is `drop i`, a_i is converted to its storage dtype: x_i becomes xs_i = numel x element bytes,
  and the conversion is live + xs_i (+ x_i for fp8's scaled copy) above the level after the op.
  A first reader `R i+1` pins a_i through its record, so a_i is then left as computed.
- A later `F i+1` reading a stored a_i runs on a temporary copy in the compute dtype (+ x_i during
  the op); `R i+1` restores a_i to its compute dtype (live + x_i - xs_i from then on: the record
  keeps that copy as its input, as it keeps an unconverted a_i).
- `drop i` frees xs_i or x_i, whichever a_i holds. Only `F` outputs of stages 1..L-1 are stored;
  conversions cost no time in the replay (memory-bound copies, small beside a stage's matmuls;
  the benchmark measures them).

Lossy storage (bf16 of an fp32 residual stream, fp8) perturbs only the recomputation: the gradient
changes, the forward does not. The planner bounds that change: each lossy stored activation i
costs `storage_error(profile, i, dtype)`, a relative gradient error (the executor's metric, the
per-tensor max|g - g_ref| / max|g_ref|), measured (`memplan.executor.precision_run.measure_sensitivity`,
kept in `profile.meta["storage_sensitivity"]`) or else KAPPA x the larger of the dtype's unit
roundoff and the compute dtype's (under bf16 autocast any perturbation of a recompute's input flips
bf16 roundings downstream, so the error is bf16-sized whatever the storage dtype: fp16 storage of
a bf16-mixed GPT measured 0.0062-0.0077, 1.6-2 x KAPPA x fp16's roundoff); the costs add (first
order, triangle inequality), and a plan's sum never exceeds the tolerance it was given.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from memplan.planner._build import finish_plan
from memplan.planner.schema import Op, Plan, PlanError
from memplan.planner.simulate import replay
from memplan.planner.storage import (  # re-exported: part of this module's names
    STORAGE_DTYPES,
    StorageDtype,
    output_dtype,
    storage_sizes,
)
from memplan.profiler.schema import Profile

__all__ = [
    "StorageDtype",
    "STORAGE_DTYPES",
    "CHOICES",
    "KAPPA",
    "StorageChoice",
    "parse_checkpoint_dtype",
    "output_dtype",
    "storage_sizes",
    "storage_error",
    "predicted_error",
    "default_tolerance",
    "choose_storage",
    "apply_storage",
]

log = logging.getLogger(__name__)


_ALIASES = {d.alias: d.name for d in STORAGE_DTYPES.values()} | {d: d for d in STORAGE_DTYPES}
# what `--checkpoint-dtype` takes: a dtype, `compute` (as computed: the chain model) or `auto`
CHOICES = ("auto", "compute", *(d.alias for d in STORAGE_DTYPES.values()))
# storage dtypes `auto` considers (fp16 overflows above 65504 unscaled: never chosen for you)
_AUTO = ("bfloat16", "float8_e4m3fn")

# Gradient error per lossy stored activation, in unit roundoffs, when none was measured: 2.5 x
# the largest ratio measured on the GPT family (3.2, bf16 storage under bf16 autocast; fp8: 1.2;
# docs/precision.md), checked by tests/executor/test_precision.py.
KAPPA = 8.0

# The executor's tolerance for each compute dtype (executor.compare.TOLERANCE: 4 units in the last
# place of the mantissa): the gradient noise the policy itself already accepts; `auto`'s default.
_POLICY_TOLERANCE = {"float32": 0.0, "bfloat16": 4 * 2.0**-8, "float16": 4 * 2.0**-11}


def parse_checkpoint_dtype(value: str) -> str:
    """`auto`, `compute`, or a storage dtype's torch name, from any accepted spelling."""
    if not isinstance(value, str):
        raise PlanError(f"checkpoint_dtype: expected one of {', '.join(CHOICES)}, got {value!r}")
    v = value.strip().lower()
    if v in ("auto", "compute"):
        return v
    if v in _ALIASES:
        return _ALIASES[v]
    raise PlanError(f"checkpoint_dtype: unknown {value!r}; choose one of {', '.join(CHOICES)}")


def _check_tolerance(tolerance: float | None) -> None:
    if tolerance is None:
        return
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
        math.isfinite(tolerance) and tolerance >= 0
    ):
        raise PlanError(
            f"tolerance: expected a finite relative gradient error >= 0 (0.01 for 1%), got {tolerance!r}"
        )


def default_tolerance(profile: Profile) -> float:
    """`auto`'s tolerance when none is given: the executor's tolerance for the profile's compute
    dtype (0 for fp32: lossless only)."""
    return _POLICY_TOLERANCE.get(profile.dtype, 0.0)


def storage_error(profile: Profile, i: int, dtype: str) -> float:
    """Predicted relative gradient error of storing a_i in `dtype` (0 when lossless): the measured
    sensitivity in `profile.meta["storage_sensitivity"][dtype][i-1]` if present, else KAPPA x the
    larger unit roundoff of `dtype` and of the profile's compute dtype (module docstring)."""
    src = output_dtype(profile, i)
    dst = STORAGE_DTYPES[dtype]
    if src in STORAGE_DTYPES and dst.precision_bits >= STORAGE_DTYPES[src].precision_bits and (
        dst.name != "float16" or src == "float16"
    ):
        return 0.0  # every value of src is exact in dst (fp16 only holds bf16's range if scaled)
    measured = (profile.meta.get("storage_sensitivity") or {}).get(dtype)
    if isinstance(measured, list) and len(measured) >= i and isinstance(measured[i - 1], (int, float)):
        return float(measured[i - 1])
    compute = STORAGE_DTYPES.get(profile.meta.get("autocast_dtype") or profile.dtype or "")
    return KAPPA * max(dst.unit_roundoff, compute.unit_roundoff if compute else 0.0)


def predicted_error(profile: Profile, storage: dict[int, str]) -> float:
    """Sum of `storage_error` over the map: a first-order bound on the relative gradient error."""
    return sum(storage_error(profile, i, d) for i, d in storage.items())


@dataclass(frozen=True)
class StorageChoice:
    """A storage map for a schedule and what it is predicted to cost."""

    storage: dict[int, str]  # stage -> dtype, only the stages whose a_i is converted
    peak_bytes: int  # replayed peak with this storage
    error: float  # predicted relative gradient error
    tolerance: float
    message: str


def choose_storage(
    profile: Profile,
    ops: list[Op],
    *,
    checkpoint_dtype: str = "auto",
    tolerance: float | None = None,
) -> StorageChoice:
    """The storage of the kept activations of `ops` that lowers the replayed peak most while the
    predicted gradient error stays within `tolerance` (None: `default_tolerance`).

    `checkpoint_dtype`: `auto` (per activation the smallest of bf16 and fp8 that the remaining
    tolerance allows, largest activations first), `compute` (none), or one dtype for all kept
    activations (lossy ones only as far as the tolerance allows). Lossy choices that do not lower
    the peak are then undone. Returns a `StorageChoice` (bytes, relative error)."""
    mode = parse_checkpoint_dtype(checkpoint_dtype)
    _check_tolerance(tolerance)
    tol = default_tolerance(profile) if tolerance is None else float(tolerance)
    base = replay(profile, ops)
    if mode == "compute" or not base.valid:
        return StorageChoice({}, base.peak_bytes, 0.0, tol, "checkpoints stored as computed")
    kept = _kept(profile, ops)
    options = list(_AUTO) if mode == "auto" else [mode]
    spent = 0.0
    storage: dict[int, str] = {}
    skipped = 0
    for i in sorted(kept, key=lambda j: (-profile.layers[j - 1].output_bytes, j)):
        src_bytes = profile.layers[i - 1].output_bytes
        best = None
        if options == [output_dtype(profile, i)]:
            continue  # already in that dtype: nothing to convert
        for d in options:
            if d == output_dtype(profile, i):
                continue
            xs, _ = storage_sizes(profile, {i: d})
            if mode == "auto" and xs[i] >= src_bytes:
                continue  # auto only compresses
            err = storage_error(profile, i, d)
            if spent + err <= tol * (1 + 1e-12) and (best is None or xs[i] < best[1]):
                best = (d, xs[i], err)
        if best is None:
            skipped += mode != "auto"
            continue
        storage[i] = best[0]
        spent += best[2]
    sim = replay(profile, ops, storage)
    # undo lossy choices that do not lower the peak (smallest savings first)
    for i in sorted(storage, key=lambda j: (profile.layers[j - 1].output_bytes, -j)):
        if storage_error(profile, i, storage[i]) == 0:
            continue
        trial = {j: d for j, d in storage.items() if j != i}
        t = replay(profile, ops, trial)
        if t.peak_bytes <= sim.peak_bytes:
            storage, sim = trial, t
    storage = {i: storage[i] for i in sorted(sim.converted) if i in storage}
    err = predicted_error(profile, storage)
    lossy = sum(1 for i, d in storage.items() if storage_error(profile, i, d) > 0)
    msg = (
        f"{len(storage)} of {len(kept)} kept activations stored converted ({lossy} lossy), "
        f"predicted gradient error {err:.3g} within tolerance {tol:.3g}"
    )
    if skipped:
        msg += f"; {skipped} left as computed (the tolerance allows no more)"
    return StorageChoice(storage, sim.peak_bytes, err, tol, msg)


def _kept(profile: Profile, ops: list[Op]) -> list[int]:
    """Stages whose F output the replay would convert (stored across later ops)."""
    candidates = {}
    for i in range(1, profile.n_stages):
        try:
            storage_sizes(profile, {i: "bfloat16"})
        except PlanError:
            continue  # not a single floating tensor of a known dtype: stored as computed
        candidates[i] = "bfloat16"
    return sorted(set(replay(profile, ops, candidates).converted)) if candidates else []


def apply_storage(
    plan: Plan,
    profile: Profile,
    *,
    checkpoint_dtype: str = "auto",
    tolerance: float | None = None,
) -> Plan:
    """`plan` with its kept activations' storage chosen by `choose_storage`, re-predicted and
    re-checked against its budget. An infeasible plan without a schedule is returned unchanged."""
    if not plan.schedule:
        return plan
    ops = plan.ops()
    choice = choose_storage(profile, ops, checkpoint_dtype=checkpoint_dtype, tolerance=tolerance)
    sim = replay(profile, ops, choice.storage)
    options = {**plan.options, **storage_options(checkpoint_dtype, choice)}
    message = plan.message if plan.feasible else ""
    out = finish_plan(
        profile, ops, strategy=plan.strategy, budget_bytes=plan.budget_bytes, sim=sim,
        message="; ".join(m for m in (message, choice.message) if m), options=options,
    )
    return out.model_copy(update={"checkpoint_dtypes": dict(choice.storage)})


def storage_options(checkpoint_dtype: str, choice: StorageChoice) -> dict:
    """The plan options that record a storage choice."""
    return {
        "checkpoint_dtype": parse_checkpoint_dtype(checkpoint_dtype),
        "tolerance": choice.tolerance,
        "predicted_grad_error": choice.error,
    }
