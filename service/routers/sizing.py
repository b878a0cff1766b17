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
from memplan.planner.scaling import size
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
    # the library names the query's own parameters (NOTE [ sizing errors name the inputs ] in
    # planner/scaling/size.py); call_library puts each under query.
    result = call_library(size, prefix="query", **query)
    return Response(result.model_dump_json(), media_type="application/json")


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
