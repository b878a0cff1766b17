"""`GET /v1/sizing` (compute-optimal sizing by a scaling law) and `POST /v1/sizing/fit` (fit a law
to a user's runs): `memplan.planner.scaling`, the same calls as `memplan size` and `memplan fit`.

The query parameters are `memplan.planner.scaling.size`'s options, which choose the question (see its
docstring); `memplan size` calls the same function.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from memplan.planner.request import MAX_BUDGET_BYTES, StrategyName
from memplan.service.deps import SettingsDep, body_openapi, json_body, require_api_key
from memplan.service.problems import (
    FieldError,
    ProblemError,
    call_library,
    problem_responses,
)
from memplan.service.routers.plans import run_bounded
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["router", "FitRequest"]

router = APIRouter(prefix="/v1/sizing", tags=["sizing"], dependencies=[Depends(require_api_key)])

LawName = Literal["epoch", "hoffmann", "hoffmann-tex", "muennighoff", "approach1"]
Positive = Annotated[float | None, Query(gt=0, allow_inf_nan=False)]


@router.get(
    "",
    summary="Compute-optimal sizing: compute -> (N, D, loss), N -> (D, C), loss -> cheapest (N, D)",
    description="Also inference-aware (`inference_tokens`), data-constrained (`unique_tokens`) and "
    "memory-aware (`memory_bytes`: the largest compute-optimal model whose training step fits, "
    "planned). Returns the library's result: keys `params`, `tokens`, `loss`, `tokens_per_param`, "
    "`flops` and the query's own.",
    responses={
        200: {"description": "the sizing", "content": {"application/json": {"schema": {"type": "object"}}}},
        **problem_responses(401, 422),
    },
)
def get_sizing(
    compute_flops: Annotated[Positive, Query(description="training FLOPs C")] = None,
    params: Annotated[Positive, Query(description="model size N")] = None,
    target_loss: Annotated[Positive, Query(description="loss to reach, nats per token")] = None,
    tokens: Annotated[Positive, Query(description="training tokens D (with params, unique_tokens)")] = None,
    inference_tokens: Annotated[Positive, Query(description="tokens served after training")] = None,
    unique_tokens: Annotated[Positive, Query(description="unique tokens available")] = None,
    memory_bytes: Annotated[
        int | None, Query(gt=0, le=MAX_BUDGET_BYTES, description="device memory, bytes (at most 2^60)")
    ] = None,
    devices: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    seq_len: Annotated[int, Query(ge=1, le=1 << 24)] = 2048,
    micro_batch: Annotated[int, Query(ge=1, le=1 << 20)] = 1,
    peak_flops: Annotated[Positive, Query(description="device peak FLOP/s")] = None,
    device: Annotated[str | None, Query(max_length=64, description="e.g. H100, H200")] = None,
    utilization: Annotated[float, Query(gt=0, le=1, allow_inf_nan=False)] = 0.4,
    strategy: Annotated[StrategyName, Query(description="checkpoint strategy (memory)")] = "optimal",
    law: Annotated[LawName | None, Query(description="null: the library's default")] = None,
) -> Response:
    query = dict(locals())
    result = call_library(_size, query, prefix="query")
    return Response(result.model_dump_json(), media_type="application/json")


# NOTE [ Sizing errors name the query's parameters ]
# The library's sizing errors name its own quantities: `flops` (from target_loss, or params x
# tokens), `inference_flops` (from inference_tokens), a result model's field when the answer
# overflows (`InferenceSizing.inference_flops`). A client sent query parameters, so each is named
# by the parameter it comes from (`_SOURCES`; `flops` by the question's input, `_question`), and
# an answer that overflows is a 422 naming the inputs the question was asked with. An answer of
# less than one parameter or one token (compute_flops=1e-300: 7.9e-156 parameters) is refused as
# params=1e-300 is: sizing below one parameter means nothing.
_SOURCES = {"inference_flops": "inference_tokens", "total_flops": "inference_tokens",
            "epochs": "unique_tokens", "effective_tokens": "unique_tokens", "effective_params": "unique_tokens"}
_QUESTION = ("compute_flops", "target_loss", "params", "tokens")  # what `flops` comes from, in order


def _question(query: dict) -> str:
    """The query parameter the question was asked with (what the library calls `flops`)."""
    return next((k for k in _QUESTION if query.get(k) is not None), "compute_flops")


def _parameter(name: str, query: dict) -> str:
    """The query parameter behind the library's quantity `name`."""
    if name in query:
        return name
    return _SOURCES.get(name) or _question(query)


def _sizing_problem(fields: list[str], message: str, *, kind: str = "invalid-input") -> ProblemError:
    errors = [FieldError(field=f"query.{f}", message=message) for f in dict.fromkeys(fields)]
    return ProblemError(422, f"{', '.join(dict.fromkeys(fields))}: {message}", kind=kind, errors=errors)


def _size(query: dict):
    """`memplan.planner.scaling.size(**query)`, its errors naming query parameters (NOTE above)."""
    from memplan.planner.scaling import ScalingError, size
    from pydantic import ValidationError

    given = [k for k, v in query.items() if v is not None and k in (*_QUESTION, "inference_tokens", "unique_tokens")]
    try:
        result = size(**query)
    except ValidationError as err:  # the answer is out of float's range
        first = err.errors(include_url=False)[0] if err.errors() else {}
        name = str((first.get("loc") or ("",))[0])
        fields = [_parameter(name, query)] if name in _SOURCES else given
        raise _sizing_problem(fields, f"too small or too large to size (the answer's {name or 'value'} "
                              "over- or underflows floating point); use realistic values",
                              kind="out-of-range") from None
    except ScalingError as err:
        head, sep, rest = str(err).partition(": ")
        names = [n.strip() for n in head.split(",")] if sep else []
        if not names or not all(n.isidentifier() for n in names) or all(n in query for n in names):
            raise
        implied = ", ".join(n for n in names if n not in query)
        raise _sizing_problem([_parameter(n, query) for n in names],
                              f"{rest} (the {implied} this query implies); use realistic values") from None
    _check_at_least_one(result, query)
    return result


def _check_at_least_one(result, query: dict) -> None:
    """Refuse an answer of less than one parameter or one token (NOTE above)."""
    asked = _question(query)
    fix = "ask for a lower target_loss" if asked == "target_loss" else f"ask for a larger {asked}"
    for what in ("params", "tokens"):
        value = getattr(result, what, None)
        if isinstance(value, float) and value < 1:
            raise _sizing_problem([asked], f"{query[asked]:g} sizes a model of {value:.3g} {what}, less "
                                  f"than one; {fix}")


class RunPoint(BaseModel):
    """One training run: its size, its data (tokens or FLOPs) and its final loss."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    params: float = Field(gt=0, description="N")
    tokens: float | None = Field(default=None, gt=0, description="D (or give flops)")
    flops: float | None = Field(default=None, gt=0, description="6 N D (if no tokens)")
    loss: float = Field(gt=0, description="final loss, nats per token")


class FitRequest(BaseModel):
    """What `memplan fit` takes: the runs and the fit's options."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    runs: list[RunPoint] = Field(min_length=1, max_length=100_000)
    method: Literal["varpro", "grid", "local"] = "varpro"
    alpha_equals_beta: bool = False
    fixed_E: float | None = Field(default=None, gt=0)
    bootstrap: int = Field(default=0, ge=0, le=2000, description="resamples for the intervals (at most 2000 in a request)")
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    confidence: float = Field(default=0.95, gt=0, lt=1)
    flops: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=list, max_length=1000, description="FLOPs to predict N_opt, D_opt and loss at"
    )


@router.post(
    "/fit",
    summary="Fit L = E + A/N^alpha + B/D^beta to runs (Huber on log loss, global search, bootstrap)",
    responses={
        200: {"description": "the fit (`FitResult`)", "content": {"application/json": {"schema": {"type": "object"}}}},
        **problem_responses(401, 413, 415, 422, 500, 503),
    },
    openapi_extra=body_openapi(FitRequest),
)
async def post_fit(
    request: Request, settings: SettingsDep,
    body: Annotated[FitRequest, Depends(json_body(FitRequest))],
) -> Response:
    rows = []
    for r in body.runs:
        row = r.model_dump(exclude_none=True)
        if "tokens" in row and "flops" in row:
            row.pop("flops")
        rows.append(row)
    if any("tokens" not in row and "flops" not in row for row in rows):
        i = next(i for i, row in enumerate(rows) if "tokens" not in row and "flops" not in row)
        raise ProblemError(
            422, f"runs.{i}: give tokens or flops", kind="invalid-input",
            errors=[FieldError(field=f"body.runs.{i}.tokens", message="give tokens or flops")],
        )
    # in a planning process, under the plan limits (NOTE [ Plans in the API process ]): a fit of
    # many runs with many resamples takes minutes
    fit = partial(
        call_library, _fit_law, method=body.method, alpha_equals_beta=body.alpha_equals_beta,
        fixed_E=body.fixed_E, bootstrap=body.bootstrap, seed=body.seed, confidence=body.confidence,
        flops=body.flops or None, prefix="body",
    )
    result = await run_bounded(request, settings, fit, rows, in_process=True)
    return Response(result.model_dump_json(), media_type="application/json")


def _fit_law(rows: list[dict], *, flops: list[float] | None = None, **options):
    """`memplan.planner.scaling.fit_law`; a prediction at FLOPs so far outside the runs' that it
    over- or underflows (flops 1e-300: `FitPrediction.extrapolation` infinite) is a ValueError naming
    `flops.<k>` (call_library: `body.flops.<k>`), not the library's result model."""
    from memplan.planner.scaling import fit_law
    from pydantic import ValidationError

    try:
        return fit_law(rows, flops=flops, **options)
    except ValidationError as err:
        if err.title != "FitPrediction" or not flops:
            raise
        run_flops = [r.get("flops") or 6 * r["params"] * r["tokens"] for r in rows]
        lo, hi = min(run_flops), max(run_flops)
        k = next((k for k, c in enumerate(flops) if not math.isfinite(max(c / hi, lo / c))), 0)
        raise ValueError(f"flops.{k}: {flops[k]:g} FLOPs is too far outside the runs' {lo:.3g}..{hi:.3g} "
                         "FLOPs to predict at; ask within their range or a few orders of magnitude "
                         "of it") from None
