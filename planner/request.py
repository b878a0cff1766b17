"""The plan request: what `memplan.planner.plan`, `memplan plan` and `POST /v1/plans` all take, as one
typed model validated once at the boundary.

A `PlanRequest` is a profile, a budget (activation bytes, or a device's memory), a strategy and that
strategy's options (one options model per strategy, each option with its bound), the storage
dtype of kept activations, and data parallelism. `FrontierRequest` is the same for
`memplan.planner.frontier`. Invalid input raises `PlanError` whose `field` is the request's dotted
path (`budget_bytes`, `options.slots`); the service prefixes it with `body.`, the CLI maps it to
its own option names.

`estimate_work` says up front how much a request may compute (NOTE [ work estimate ]), so that a
caller can refuse what it cannot afford before any of it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from memplan.planner.schema import PlanError
from memplan.profiler.schema import MAX_PROFILE_BYTES, Profile
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "check_offload_options",
    "MAX_BUDGET_BYTES",
    "MAX_STAGES",
    "MAX_OFFLOAD_BANDWIDTH",
    "STRATEGY_NAMES",
    "OPTIONS",
    "StoreAllOptions",
    "UniformOptions",
    "SqrtOptions",
    "HeuristicOptions",
    "OptimalOptions",
    "FrontierOptions",
    "PlanRequest",
    "FrontierRequest",
    "plan_request",
    "frontier_request",
    "plan_error",
    "Work",
    "estimate_work",
]

# A budget or a device's memory: above every peak a valid profile can have (under 3 x 2^58, NOTE
# [ ceilings ] in profiler/schema.py) and below the compiled DP's "no cap" marker (2^62), so no
# budget can reach it.
MAX_BUDGET_BYTES = 2**60
MAX_STAGES = 1_000_000  # the longest chain a request may name in an option (k, groups, ...)
# host-device bandwidth (bytes/s): a thousand times PCIe 5's, so a bound that no link reaches
MAX_OFFLOAD_BANDWIDTH = 1e15
assert 3 * MAX_PROFILE_BYTES < MAX_BUDGET_BYTES < 2**62

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

# strategy names, as planner.STRATEGIES registers them (tests/planner/test_request.py checks both)
STRATEGY_NAMES = ("store-all", "uniform", "sqrt", "heuristic", "optimal")
StrategyName = Literal["store-all", "uniform", "sqrt", "heuristic", "optimal"]
OPTIMAL_MODES = ("auto", "exact", "memo", "banded", "slotted", "grouped")  # optimal.MODES

# each field's valid values in words, for messages that say how to fix the input
_EXPECT = {
    "max_overhead": "a finite fraction from 0 to 1000 (0.2 for at most 20% slower)",
    "exact_max_stages": "a positive integer up to 2000 (stages solved exactly before grouping)",
    "groups": "a positive integer up to 2000 (macro stages in grouped mode)",
    "slots": "an integer from 8 to 10000 (500 is rotor's)",
    "max_gap": "a finite fraction from 0 to 10 (0.01 for 1%)",
    "points": "an integer >= 2 and at most 10000 (or none for all)",
    "tolerance": "a finite relative gradient error from 0 to 1 (0.01 for 1%)",
    "n_gpus": "an integer from 1 to 1000000",
    "zero_stage": "one of 0, 1, 2, 3",
    "precision": "a precision policy name: fp32, bf16-mixed, bf16, fp16-mixed, zero-mixed",
    "checkpoint_dtype": "compute, auto or a storage dtype (bf16, fp16, fp8, ...)",
    "offload_bandwidth": "a finite number of bytes/s from 0 to 1e15 (25e9 for 25 GB/s; 0 or "
                         "null: no offload)",
}


def _budget(value: Any, info: ValidationInfo) -> Any:
    """A budget in bytes: an integer (a finite float is rounded down), 0..MAX_BUDGET_BYTES."""
    name = info.field_name
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number of bytes, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("must be a finite number of bytes, not NaN or infinity")
        value = math.floor(value)
    if value < 0:
        raise ValueError(f"must be at least 0, got {value}")
    if value > MAX_BUDGET_BYTES:
        raise ValueError(
            f"at most 2^60 bytes (1 EiB: above every peak a profile can have), got {value}"
            + ("; leave it out for no limit" if name in ("budget_bytes", "host_memory_bytes")
               else "")
        )
    return int(value)


# the schema says what `_budget` accepts: a number of bytes (a float is rounded down) or null
Budget = Annotated[
    Annotated[int, Field(ge=0, le=MAX_BUDGET_BYTES)] | None,
    BeforeValidator(_budget),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_BUDGET_BYTES},
                              {"type": "null"}]}),
]


class _Options(BaseModel):
    model_config = _STRICT


class StoreAllOptions(_Options):
    """store-all takes no options."""


class SqrtOptions(_Options):
    """sqrt takes no options."""


class HeuristicOptions(_Options):
    """heuristic takes no options."""


class UniformOptions(_Options):
    """Every-k checkpointing."""

    k: int | None = Field(
        default=None, ge=1, le=MAX_STAGES,
        description="segment length (stages); null: the fastest k that fits the budget",
    )


class OptimalOptions(_Options):
    """The exact persistent optimum (planner/optimal.py)."""

    max_overhead: float | None = Field(
        default=None, ge=0, le=1000,
        description="least memory for at most this slowdown (0.2 = 20%); null: least time",
    )
    exact_max_stages: int | None = Field(
        default=None, ge=1, le=2000,
        description="stages solved exactly; longer chains are grouped; null: 200 with a budget, "
        "120 without",
    )
    groups: int = Field(default=150, ge=1, le=2000, description="macro stages in grouped mode")
    mode: Literal["auto", "exact", "memo", "banded", "slotted", "grouped"] = Field(
        default="auto", description="auto (exact up to exact_max_stages; above, memo where "
        "sub-chains repeat, else banded with a budget and grouped without), exact, memo (exact, "
        "memoised by content), banded (certified bound), grouped or slotted (rotor's memory "
        "slots with a certified bound)",
    )
    slots: int = Field(default=500, ge=8, le=10_000, description="slotted mode: memory slots")
    max_gap: float = Field(
        default=0.01, ge=0, le=10, description="banded and slotted modes: refine until the "
        "certified gap to the optimum is at most this (0.01 = 1%)",
    )
    offload_bandwidth: float | None = Field(
        default=None, ge=0, le=MAX_OFFLOAD_BANDWIDTH,
        description="host-device bandwidth, bytes/s each way (25e9 for 25 GB/s): the plan may "
        "also move kept activations to host memory and back, overlapped with compute "
        "(docs/chain-model.md section 10.9; exact mode, chains of up to 64 stages); 0 or null: "
        "no offload",
    )
    host_memory_bytes: Budget = Field(
        default=None, description="host memory offloaded activations may take, bytes (at most "
        "2^60; with offload_bandwidth); null: no limit",
    )


class FrontierOptions(_Options):
    """`memplan.planner.frontier`'s options."""

    points: int | None = Field(
        default=None, ge=2, le=10_000, description="thin to about this many points; null: all",
    )
    exact_max_stages: int | None = Field(
        default=None, ge=1, le=2000, description="stages solved exactly; null: 120",
    )
    groups: int = Field(default=150, ge=1, le=2000, description="macro stages in grouped mode")
    mode: Literal["auto", "exact", "memo", "banded", "grouped"] = Field(
        default="auto", description="auto (exact up to exact_max_stages; above, memo where "
        "sub-chains repeat, else banded, each point with its certified gap), exact, memo, banded "
        "or grouped (NOTE [ the frontier's modes ] in planner/frontier.py)",
    )
    offload_bandwidth: float | None = Field(
        default=None, ge=0, le=MAX_OFFLOAD_BANDWIDTH,
        description="host-device bandwidth, bytes/s: the frontier of plans that may also offload "
        "(docs/chain-model.md section 10.9), with the frontier without offload beside it; 0 or "
        "null: no offload",
    )
    host_memory_bytes: Budget = Field(
        default=None, description="host memory the offload points may take, bytes (with "
        "offload_bandwidth); null: no limit",
    )


OPTIONS: dict[str, type[_Options]] = {
    "store-all": StoreAllOptions,
    "uniform": UniformOptions,
    "sqrt": SqrtOptions,
    "heuristic": HeuristicOptions,
    "optimal": OptimalOptions,
}

AnyOptions = OptimalOptions | UniformOptions | StoreAllOptions | SqrtOptions | HeuristicOptions


class PlanRequest(BaseModel):
    """A profile, a budget and a strategy with its options: everything a plan depends on."""

    model_config = _STRICT

    profile: Profile
    budget_bytes: Budget = Field(
        default=None, description="activation budget above fixed_bytes, bytes (at most 2^60); "
        "null: no limit",
    )
    memory_bytes: Budget = Field(
        default=None, description="memory per GPU instead of budget_bytes (at most 2^60): the "
        "budget is this minus the fixed bytes",
    )
    # null is accepted (and documented) as the default, the way an absent field is: the validator
    # below turns it into "optimal", so a validated request always names its strategy
    strategy: StrategyName | None = Field(default="optimal", description="the planner strategy "
                                          "(null: optimal)")
    options: AnyOptions = Field(
        default_factory=OptimalOptions,
        description="the strategy's options (uniform: k; optimal: max_overhead, exact_max_stages, "
        "groups, mode, slots, max_gap, offload_bandwidth, host_memory_bytes; the others: none); "
        "unknown ones: refused",
    )
    checkpoint_dtype: str = Field(
        default="compute", max_length=32,
        description="storage dtype of kept activations: compute (as computed), auto, or a dtype",
    )
    tolerance: float | None = Field(
        default=None, ge=0, le=1,
        description="largest relative gradient error lossy storage may add; null: the policy's own",
    )
    precision: str | None = Field(
        default=None, max_length=32,
        description="precision policy pricing the model states (fp32, bf16-mixed, ...); null: the "
        "profile's fixed bytes as measured",
    )
    n_gpus: int = Field(default=1, ge=1, le=1_000_000, description="data-parallel GPUs")
    zero_stage: int = Field(default=0, ge=0, le=3, description="ZeRO stage sharding model states")

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy_default(cls, value: Any) -> Any:
        if value is None:  # null: the default, as an absent field
            return "optimal"
        if isinstance(value, str) and value not in STRATEGY_NAMES:
            raise ValueError(f"unknown {value!r}; choose one of {', '.join(STRATEGY_NAMES)}")
        return value

    @field_validator("options", mode="wrap")
    @classmethod
    def _strategy_options(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        # the strategy (validated first: fields validate in order) chooses the options model
        model = OPTIONS.get(info.data.get("strategy", "optimal"), OptimalOptions)
        if isinstance(value, model):
            return value
        if isinstance(value, _Options):
            value = value.model_dump(exclude_unset=True)
        strategy = info.data.get("strategy", "optimal")
        try:
            return model.model_validate(value)
        except ValidationError as err:  # an unknown option: say which ones the strategy takes
            takes = ", ".join(model.model_fields) or "none"
            details = []
            for e in err.errors(include_url=False):
                if e["type"] == "extra_forbidden":
                    kind: Any = PydanticCustomError(
                        "option_not_taken",
                        "strategy '{strategy}' takes no such option; it takes {takes}",
                        {"strategy": strategy, "takes": takes})
                else:
                    kind = PydanticCustomError(e["type"], e["msg"], e.get("ctx"))
                details.append({"type": kind, "loc": e["loc"], "input": e.get("input")})
            raise ValidationError.from_exception_data(err.title, details) from None

    @field_validator("checkpoint_dtype")
    @classmethod
    def _dtype_known(cls, value: str) -> str:
        from memplan.planner.checkpoint_dtype import parse_checkpoint_dtype

        parse_checkpoint_dtype(value)  # PlanError (a ValueError) naming the choices
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PlanRequest:
        if "options" not in self.model_fields_set:  # the strategy's defaults, not optimal's
            self.__dict__["options"] = OPTIONS[self.strategy]()
        if self.budget_bytes is not None and self.memory_bytes is not None:
            raise PlanError("give budget_bytes or memory_bytes, not both", field="memory_bytes")
        self._offload_consistent()
        k = getattr(self.options, "k", None)
        if k is not None and k > self.profile.n_stages:
            raise PlanError(f"the segment length must be an integer in 1..{self.profile.n_stages}, "
                            f"got {k}", field="options.k")
        return self

    def _offload_consistent(self) -> None:
        # NOTE [ offload options ]
        # 1. Only optimal plans offload: the other strategies' options models refuse
        #    `offload_bandwidth` (the field named, "strategy 'uniform' takes no such option").
        # 2. `host_memory_bytes` bounds what offload puts on the host: without
        #    `offload_bandwidth` nothing is offloaded, and the bound would silently do nothing.
        # 3. A bandwidth of 0 is no offload, as null: today's plans (a host bound is then moot).
        # 4. Options the offload DP (planner/_optimal_offload.py) does not plan with are refused
        #    here, naming the request's own field: stored checkpoints (`checkpoint_dtype` other
        #    than compute; docs/chain-model.md section 10.9, rule 6) and modes other than auto and
        #    exact. What depends on the profile (save policies, chains longer than
        #    OFFLOAD_MAX_STAGES) plan_optimal refuses at once, naming `offload_bandwidth`.
        opts = self.options
        if not isinstance(opts, OptimalOptions):
            return
        check_offload_options(strategy="optimal", offload_bandwidth=opts.offload_bandwidth,
                              host_memory_bytes=opts.host_memory_bytes, prefix="options.")
        if not opts.offload_bandwidth:
            return
        if self.checkpoint_dtype.strip().lower() != "compute":
            raise PlanError(f"{self.checkpoint_dtype!r} with options.offload_bandwidth: offload "
                            "and stored checkpoints are not planned together; use compute, or "
                            "plan without offload_bandwidth", field="checkpoint_dtype")
        if opts.mode not in ("auto", "exact"):
            raise PlanError(f"{opts.mode!r} with options.offload_bandwidth: offload is planned by "
                            "the exact DP only; use auto or exact, or plan without "
                            "offload_bandwidth", field="options.mode")

    def option_kwargs(self) -> dict[str, Any]:
        """The strategy's options given (not defaulted), as keyword arguments."""
        return self.options.model_dump(exclude_unset=True)


class FrontierRequest(BaseModel):
    """A profile whose memory-time trade-off to trace, and the frontier's options."""

    model_config = _STRICT

    profile: Profile
    options: FrontierOptions = Field(
        default_factory=FrontierOptions,
        description="points, exact_max_stages, groups, mode, offload_bandwidth, host_memory_bytes",
    )

    @model_validator(mode="after")
    def _host_needs_bandwidth(self) -> FrontierRequest:
        opts = self.options  # NOTE [ offload options ], 2
        check_offload_options(strategy="optimal", offload_bandwidth=opts.offload_bandwidth,
                              host_memory_bytes=opts.host_memory_bytes, prefix="options.")
        return self


def check_offload_options(*, strategy: str | None, offload_bandwidth: float | None,
                          host_memory_bytes: int | None, prefix: str = "",
                          names: dict[str, str] | None = None) -> None:
    """NOTE [ offload options ] rules 1 and 2, for requests that hold no profile yet (a run, which
    profiles first, checks them before it starts): raises PlanError naming the field, `prefix`
    before it (`options.`), or its name in `names` (a command's own option, `--host-memory`).
    `strategy` None is the default (optimal). Returns None."""
    def name(field: str) -> str:
        return (names or {}).get(field, prefix + field)

    if offload_bandwidth and strategy not in (None, "optimal"):
        raise PlanError(f"only strategy optimal plans offload, got {strategy!r}; use optimal, or "
                        f"leave {name('offload_bandwidth')} out", field=name("offload_bandwidth"))
    if host_memory_bytes is not None and offload_bandwidth is None:
        raise PlanError(f"bounds the host memory of offloaded activations, and nothing is "
                        f"offloaded without {name('offload_bandwidth')}; give "
                        f"{name('offload_bandwidth')} (bytes/s) too, or leave "
                        f"{name('host_memory_bytes')} out", field=name("host_memory_bytes"))


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def plan_error(err: ValidationError, data: Any = None) -> PlanError:
    """The first error of a request's validation as a `PlanError` naming the field (its dotted
    path in the request) and saying what it expects."""
    errors = err.errors(include_url=False)
    if not errors:
        return PlanError(str(err))
    e = errors[0]
    loc = tuple(e.get("loc", ()))
    field = _field(loc) or None
    name = str(loc[-1]) if loc else ""
    kind = e.get("type", "")
    given = e.get("input")
    if kind == "value_error":
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, PlanError):
            return PlanError(cause.reason, field=cause.field if loc == () else field)
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        if msg.startswith(f"{name}: "):
            msg = msg[len(name) + 2:]
        return PlanError(msg, field=field)
    if kind == "option_not_taken":
        return PlanError(str(e.get("msg")), field=field)
    if kind == "extra_forbidden":
        return PlanError("unknown field; remove it (check the spelling)", field=field)
    if kind == "missing":
        return PlanError("field required", field=field)
    if kind == "finite_number":
        return PlanError(f"expected {_EXPECT.get(name, 'a finite number')}, not NaN or infinity",
                         field=field)
    if name == "k":
        return PlanError(f"the segment length must be an integer in 1..{MAX_STAGES}, got {given!r}",
                         field=field)
    if name in _EXPECT:
        return PlanError(f"expected {_EXPECT[name]}, got {given!r}", field=field)
    if kind == "literal_error":  # the values this model takes (a plan's modes, a frontier's)
        allowed = str((e.get("ctx") or {}).get("expected", "")).replace("'", "")
        return PlanError(f"expected one of {allowed}, got {given!r}", field=field)
    return PlanError(str(e.get("msg", "invalid")), field=field)


def plan_request(**fields: Any) -> PlanRequest:
    """A validated `PlanRequest` from keyword arguments (the options nested under `options`).
    Raises `PlanError` naming the first bad field."""
    try:
        return PlanRequest.model_validate(fields)
    except ValidationError as err:
        raise plan_error(err, fields) from None


def frontier_request(**fields: Any) -> FrontierRequest:
    """A validated `FrontierRequest` from keyword arguments. Raises `PlanError`."""
    try:
        return FrontierRequest.model_validate(fields)
    except ValidationError as err:
        raise plan_error(err, fields) from None


# -- how much a request may compute ----------------------------------------------------------------

# NOTE [ work estimate ]
# A plan's work is known up front within a small factor from its stages and its options: the exact
# DP solves m^2/2 sub-chains with up to m splits each over frontiers of a few points (m: the stages
# it solves, the chain's or its groups'), ~m^3 steps within a budget and about eight times that
# without one (frontiers are uncapped); the slotted DP tabulates every sub-chain at every slot count,
# m^3 x slots numpy element steps (about 64 to one DP step) and 2 x m^2 x slots x 10 bytes of
# tables; the baselines replay O(L) schedules of O(L) ops (uniform without k, heuristic, the
# frontier's), ~L^2 steps of Python (about 8 DP steps each). Long chains with a budget (NOTE
# [ long chains and the certificate ] in planner/optimal.py): the banded DP ~L x 160^2 (bands
# doubled from 16 stages while the gap is large; on the loaded two-core test machine 1,000 stages
# took 59 s where the exact DP at 200 took 18 s), the memoised one ~8 x L^2. `steps` compares requests, it is not a
# time: on two cores one step is about 0.1-2 us.
# Offload (options.offload_bandwidth, planner/_optimal_offload.py) runs a pure-Python DP whose
# frontiers grow with the distinct byte sums a chain has, so its work depends on whether stages
# repeat. Measured (CPU seconds, the shared two-core machine, a budget of half the store-all peak,
# 2026-12-05): chains of distinct stages (tests' make_profile) 0.04 s at 10 stages, 1.3 s at 20,
# 4.9 s at 25, 12-15.5 s at 30 (124 MiB resident), over 100 s at 40, about L^6 / 100 steps of
# 2 us (at 25 GB/s, where every transfer hides, 40 stages took 5 s: the time coordinate
# collapses); GPT blocks (examples/gpt24.json's, repeated) 1.0 s at 26, 2.5 s at 38, 9.9 s at 50,
# 29 s at 64 at 25 GB/s, and GPT-2 medium's analytic profile (26 stages) 4.2 s at 50 GB/s, where
# partly hidden copies leave more Pareto points (docs/planner.md: up to 20 s), about 8 L^4 steps.
# A host budget (host_memory_bytes) makes the frontiers
# three-dimensional: 0.3 s at 8 distinct stages, 1.8 s at 9, 5-6 s at 10 (x60-x300); gpt24 at a
# tenth of its store-all peak, 7.7 s at 2 MB/s and over 150 s at 25 GB/s; counted as x L^2 more
# (x 3 L^2 distinct). A request the estimate lets through and that then runs long is a planning
# process's, which its time limit kills. Chains over OFFLOAD_MAX_STAGES are refused at once.
_UNCAPPED = 8
_BAND = 160
_SLOT_STEP = 64
_PY_STEP = 8


@dataclass(frozen=True)
class Work:
    """A request's estimated work: `steps` (DP steps, NOTE [ work estimate ]), `table_bytes` (the
    largest tables it allocates, bytes), and `driver`, the field whose value sets most of it."""

    steps: float
    table_bytes: float
    driver: str


def _dp_stages(n: int, opts: Any, capped: bool) -> tuple[int, str, str]:
    """(stages the DP solves, the field that sets them, the mode that runs)."""
    mode = getattr(opts, "mode", "auto")
    groups = getattr(opts, "groups", 150)
    exact_max = getattr(opts, "exact_max_stages", None)
    if mode in ("exact", "memo", "banded"):
        return n, "profile.layers", mode
    if mode == "grouped":
        return min(groups, n), "options.groups", mode
    if exact_max is None:
        exact_max = 200 if capped else 120
    if n > exact_max:
        # with a budget, long chains are solved whole (memo or banded); without, grouped
        return (n, "profile.layers", "banded") if capped else (min(groups, n), "options.groups",
                                                               "grouped")
    return n, ("options.exact_max_stages" if "exact_max_stages" in opts.model_fields_set
               else "profile.layers"), "exact"


def estimate_work(request: PlanRequest | FrontierRequest) -> Work:
    """The work `request` may do (NOTE [ work estimate ]): a `Work` of DP steps and table bytes."""
    n = request.profile.n_stages
    if isinstance(request, FrontierRequest):
        m, driver, _ = _dp_stages(n, request.options, capped=False)
        steps = _UNCAPPED * m**3 + _PY_STEP * n * n
        work = Work(float(steps), 48.0 * m * m, driver)
        if getattr(request.options, "offload_bandwidth", None):  # the offload frontier beside it
            off = _offload_work(request.profile)
            work = Work(work.steps + off.steps, max(work.table_bytes, off.table_bytes),
                        off.driver if off.steps > work.steps else driver)
        return work
    opts = request.options
    strategy = request.strategy
    if strategy in ("store-all", "sqrt"):
        return Work(float(n), 0.0, "profile.layers")
    if strategy == "uniform":
        given = getattr(opts, "k", None) is not None
        return Work(float(n if given else _PY_STEP * n * n), 0.0, "profile.layers")
    if strategy == "heuristic":
        return Work(float(_PY_STEP * n * n), 0.0, "profile.layers")
    budgeted = request.budget_bytes is not None or request.memory_bytes is not None
    if opts.offload_bandwidth:
        return _offload_work(request.profile)
    if opts.mode == "slotted":
        s = opts.slots
        return Work(n**3 * s / _SLOT_STEP, 20.0 * (n + 2) * (n + 1) * (s + 1), "options.slots")
    stored = request.checkpoint_dtype.strip().lower() != "compute"
    capped = budgeted and opts.max_overhead is None and not stored
    m, driver, mode = _dp_stages(n, opts, capped)
    if mode == "banded":  # bands of up to ~160 stages: L x width^2 splits
        steps = _BAND**2 * n
    elif mode == "memo":  # O(L) distinct sub-problems of O(L) splits each
        steps = (1 if capped else _UNCAPPED) * _UNCAPPED * n * n
    else:
        steps = (1 if capped else _UNCAPPED) * m**3
    if stored or not capped:
        steps += _PY_STEP * n * n  # walking the frontier's points, replaying each
    return Work(float(steps), 48.0 * m * m, driver)


def _offload_work(profile: Profile) -> Work:
    """The offload DP's work (NOTE [ work estimate ]): ~8 L^4 steps when the chain's stages
    repeat (at most one distinct byte signature in four stages), ~L^6 / 100 when they do not. A
    host budget costs the same when the plan without it fits it (the planner tries that first);
    the three-dimensional DP behind it when it does not (up to L^2 x more) is not counted here:
    its work depends on the answer, so the request runs in a worker and the time limit bounds it."""
    from memplan.planner._optimal_offload import OFFLOAD_MAX_STAGES

    n = profile.n_stages
    if n > OFFLOAD_MAX_STAGES:  # plan_optimal refuses it before any work
        return Work(float(n), 0.0, "profile.layers")
    shapes = {(la.output_bytes, la.saved_bytes, la.forward_temp_bytes, la.backward_temp_bytes)
              for la in profile.layers}
    repeated = 4 * len(shapes) <= n
    steps = 8.0 * n**4 if repeated else n**6 / 100
    # frontiers of Python tuples: 4 variants of n^2 / 2 sub-problems, ~n points each (repeated)
    # or ~n^2 (distinct), ~40 bytes a point as measured (64 MiB at 30 distinct stages)
    points = n if repeated else n * n
    return Work(steps, 80.0 * n * n * points, "profile.layers")
