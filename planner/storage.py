"""Storage sizes of kept activations: the dtypes a checkpoint may be stored in and their bytes.

A leaf of the planner (it imports only the schemas): the simulator replays stored checkpoints with
`storage_sizes`, and planner/checkpoint_dtype.py chooses them (NOTE [ Storage precision of
checkpoints ] there).
"""

from __future__ import annotations

from dataclasses import dataclass

from memplan.planner.schema import PlanError
from memplan.profiler.schema import Profile

__all__ = ["StorageDtype", "STORAGE_DTYPES", "output_dtype", "numel", "storage_sizes"]


@dataclass(frozen=True)
class StorageDtype:
    """A dtype a kept activation may be stored in."""

    name: str  # torch's name: float32, bfloat16, float16, float8_e4m3fn
    alias: str  # the short name the CLI takes
    element_bytes: int
    precision_bits: int  # significand bits p, implicit bit included: unit roundoff 2^-p
    scaled: bool  # stored times a per-tensor power of two so that its largest value fits (fp8)

    @property
    def unit_roundoff(self) -> float:
        """Largest relative rounding error of round-to-nearest in the normal range."""
        return 2.0 ** -self.precision_bits


# IEEE 754 binary32/binary16, bfloat16 (8 significand bits), OCP FP8 E4M3 (4 bits, max 448)
STORAGE_DTYPES: dict[str, StorageDtype] = {
    d.name: d
    for d in (
        StorageDtype("float32", "fp32", 4, 24, False),
        StorageDtype("bfloat16", "bf16", 2, 8, False),
        StorageDtype("float16", "fp16", 2, 11, False),
        StorageDtype("float8_e4m3fn", "fp8", 1, 4, True),
    )
}


def output_dtype(profile: Profile, i: int) -> str:
    """The dtype stage i computes a_i in (its `output_dtype`, else the profile's dtype)."""
    return profile.layers[i - 1].output_dtype or profile.dtype


def numel(profile: Profile, i: int) -> int:
    """Elements of a_i (output_bytes / the element size of its dtype); PlanError when a_i is not
    a whole number of elements of a known floating dtype."""
    src = output_dtype(profile, i)
    if src not in STORAGE_DTYPES:
        raise PlanError(
            f"checkpoint_dtypes[{i}]: stage {i} outputs {src!r}, which has no storage conversion; "
            "store it as computed"
        )
    x = profile.layers[i - 1].output_bytes
    e = STORAGE_DTYPES[src].element_bytes
    if x % e:
        raise PlanError(
            f"checkpoint_dtypes[{i}]: output_bytes {x} of stage {i} is not a whole number of "
            f"{src} elements; only single floating tensor outputs can be stored converted"
        )
    return x // e


def storage_sizes(profile: Profile, storage: dict[int, str]) -> tuple[dict[int, int], dict[int, int]]:
    """For a storage map (stage -> dtype name): stored bytes of each a_i, and the transient bytes
    of its conversion (fp8's scaled copy: x_i). Raises PlanError naming a bad entry."""
    L = profile.n_stages
    xs: dict[int, int] = {}
    tmp: dict[int, int] = {}
    for i, name in storage.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i < L:
            raise PlanError(
                f"checkpoint_dtypes: stage {i!r} is not a kept activation; use stages 1..{L - 1}"
            )
        if name not in STORAGE_DTYPES:
            raise PlanError(
                f"checkpoint_dtypes[{i}]: unknown dtype {name!r}; use one of {', '.join(STORAGE_DTYPES)}"
            )
        d = STORAGE_DTYPES[name]
        xs[i] = numel(profile, i) * d.element_bytes
        tmp[i] = profile.layers[i - 1].output_bytes if d.scaled else 0
    return xs, tmp
