"""`/v1/profiles`: profile a built-in model configuration on the server's device (a job: it runs in
the worker, like a run, so that it never competes with a run for the device)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from memplan.service.deps import (
    JobId,
    StoreDep,
    body_openapi,
    json_body,
    require_api_key,
)
from memplan.service.jobs.store import Job
from memplan.service.problems import problem_responses
from memplan.service.routers import _jobs
from memplan.service.routers._jobs import JobList
from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = ["router", "ProfileRequest"]

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], dependencies=[Depends(require_api_key)])


class ProfileRequest(BaseModel):
    """What `memplan profile` takes: a built-in model family and its config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(default="gpt", min_length=1, max_length=64, description="built-in model family")
    # NOTE [ A profile's config is the model config's to judge ]
    # Any JSON value here: the family's typed config (service/jobs/configs.py, strict) checks it at
    # admission and names the field (`body.config.channels.1`). A narrower type here (scalars only)
    # refused the configs' own list fields (conv channels and blocks, GPT exit_layers) with a dump
    # of every branch of a union.
    config: dict[str, JsonValue] = Field(
        default_factory=dict, description="the family's config fields (gpt: GPTConfig's, e.g. n_layer, n_embd, "
        "n_head, block_size, batch_size, dtype, exit_layers (a list); conv: ConvConfig's, e.g. channels and "
        "blocks (lists), image_size), checked at submission against their bounds and the job's estimated "
        "memory and time against the server's limits: 422 naming the field"
    )
    analytic: bool = Field(default=False, description="derive from shapes instead of measuring")
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    repeats: int = Field(default=5, ge=1, le=1000, description="timed repeats (median)")
    warmup: int = Field(default=2, ge=0, le=100)
    timing: Literal["chain", "stage"] = Field(
        default="chain", description="chain: stages timed inside passes over the whole chain; stage: each alone")
    device: str | None = Field(default=None, max_length=32, description="null: the server's device")
    timeout_s: float | None = Field(
        default=None, gt=0, le=30 * 86400,
        description="this job's time limit, seconds; at most the server's job_timeout_s (null: that)",
    )


@router.post(
    "",
    status_code=202,
    response_model=Job,
    summary="Profile a built-in model on the server's device",
    description="A job: 202 with `Location: /v1/profiles/{id}`, whose `result` is the `Profile` once "
    "it has succeeded. `Prefer: wait=N` waits up to N seconds (at most 60) and answers 200 if done.",
    responses={
        200: {"description": "finished within the wait, or a replay", "model": Job},
        **problem_responses(401, 413, 415, 422, 429),
    },
    openapi_extra=body_openapi(ProfileRequest),
)
async def create_profile(
    body: Annotated[ProfileRequest, Depends(json_body(ProfileRequest))], submission: _jobs.SubmissionDep
) -> JSONResponse:
    return await submission.submit("profile", body, base_path="/v1/profiles")


@router.get("", response_model=JobList, summary="List profile jobs", responses=problem_responses(401, 422))
def list_profiles(page: _jobs.JobPageDep) -> JobList:
    return page.jobs("profile")


@router.get("/{profile_id}", response_model=Job, summary="A profile job", responses=problem_responses(401, 404, 422))
def get_profile(profile_id: JobId, store: StoreDep) -> Job:
    return _jobs.get_or_404(store, profile_id, kind="profile")


@router.post(
    "/{profile_id}/cancel",
    response_model=Job,
    summary="Cancel a profile job",
    responses={202: {"description": "stopping", "model": Job}, **problem_responses(401, 404, 409, 422)},
)
def cancel_profile(profile_id: JobId, store: StoreDep) -> JSONResponse:
    return _jobs.cancel(store, profile_id, kind="profile")
