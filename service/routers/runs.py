"""`/v1/runs`: validation runs of the executor (profile a built-in model, plan it, run the plan and
compare measured against predicted; or a Hugging Face model built from its config, with the plan
installed), queued and run by the worker; and `/v1/jobs/{id}/artifacts/{name}`: the files a job
kept (a run's measured timeline, on CUDA its allocator snapshot; NOTE [ Job artifacts ])."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response, StreamingResponse
from memplan.planner.request import (
    MAX_BUDGET_BYTES,
    MAX_OFFLOAD_BANDWIDTH,
    Budget,
    check_offload_options,
)
from memplan.service.deps import (
    JobId,
    SettingsDep,
    StoreDep,
    body_openapi,
    json_body,
    require_api_key,
)
from memplan.service.jobs.store import Job
from memplan.service.problems import problem_responses
from memplan.service.routers import _jobs
from memplan.service.routers._jobs import JobList
from memplan.service.routers.plans import OptionValue, StrategyName
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

__all__ = ["router", "RunRequest"]

runs_router = APIRouter(prefix="/v1/runs", tags=["runs"], dependencies=[Depends(require_api_key)])
jobs_router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_api_key)])

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class RunRequest(BaseModel):
    """What `memplan run` takes: a built-in model, a budget and a strategy; the worker profiles
    the model on the server's device, plans it and runs the plan for `steps` training steps."""

    model_config = _STRICT

    model: str = Field(default="gpt", min_length=1, max_length=64,
                       description="built-in model family (gpt, conv), or hf: a Hugging Face model from its config")
    config: dict[str, OptionValue | dict[str, JsonValue]] = Field(
        default_factory=dict, description="the model's settings of executor.pipeline.RunSpec (gpt: n_layer, n_embd, "
        "n_head, block_size, vocab_size, batch_size, dropout, repeats; conv: n_layer, batch_size, repeats); "
        "hf: hf_config (a config.json object, model_type gpt2, llama, mistral or qwen2), seq, batch_size, "
        "lean_loss (docs/apply.md, \"A lean loss\"). "
        "Checked at submission against their bounds (docs/service.md) and the job's estimated memory "
        "and time against the server's limits: 422 naming the field"
    )
    budget_bytes: Budget = Field(default=None, description="activation budget, bytes (0..2^60, checked as "
                                 "POST /v1/plans checks a plan's); null: none")
    strategy: StrategyName | None = Field(default=None, description="null: the planner's default")  # type: ignore[valid-type]
    features: list[Literal["moe", "flash", "qat", "prune", "exit"]] = Field(
        default_factory=list, max_length=5, description="model features to switch on"
    )
    steps: int = Field(default=3, ge=1, le=10_000, description="training steps to run")
    autocast_dtype: Literal["bfloat16", "float16"] | None = None
    device: str | None = Field(
        default=None, max_length=32, description="'cpu' or 'cuda[:i]' (cuda only on a server with CUDA: "
        "else a 422 on body.device); null: the server's device"
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=30 * 86400,
        description="this job's time limit, seconds; at most the server's job_timeout_s (null: that)",
    )
    offload_bandwidth: float | None = Field(
        default=None, gt=0, le=MAX_OFFLOAD_BANDWIDTH,
        description="strategy optimal: host-device bandwidth, bytes/s each way (25e9 for 25 GB/s); the plan "
        "may also move kept activations to host memory (docs/chain-model.md section 10.9). Runs on CUDA: on "
        "the CPU a plan that moves any fails the job with one line naming --offload-bandwidth, and one that "
        "moves none runs. null: no offload",
    )
    host_memory_bytes: int | None = Field(
        default=None, ge=0, le=MAX_BUDGET_BYTES,
        description="with offload_bandwidth: host memory offloaded activations may take, bytes; null: no limit",
    )

    @model_validator(mode="after")
    def _offload_consistent(self) -> RunRequest:
        # what the planner would refuse only after the worker has profiled the model
        # (NOTE [ offload options ] in planner/request.py, 1 and 2), refused at submission
        check_offload_options(strategy=self.strategy, offload_bandwidth=self.offload_bandwidth,
                              host_memory_bytes=self.host_memory_bytes)
        return self


_JOB_RESPONSES = {
    202: {"description": "accepted; poll the Location", "model": Job},
    **problem_responses(401, 413, 415, 422, 429),
}


@runs_router.post(
    "",
    status_code=202,
    response_model=Job,
    summary="Submit a validation run",
    description="Answers 202 with `Location: /v1/runs/{id}`. The same `Idempotency-Key` with the "
    "same body returns the same run (200 once finished); `Prefer: wait=N` waits up to N seconds "
    "(at most 60) for it to finish.",
    responses={200: {"description": "finished within the wait, or a replay", "model": Job}, **_JOB_RESPONSES},
    openapi_extra=body_openapi(RunRequest),
)
async def create_run(
    body: Annotated[RunRequest, Depends(json_body(RunRequest))], submission: _jobs.SubmissionDep
) -> JSONResponse:
    return await submission.submit("run", body, base_path="/v1/runs")


@runs_router.get("", response_model=JobList, summary="List runs, newest first", responses=problem_responses(401, 422))
def list_runs(page: _jobs.JobPageDep) -> JobList:
    return page.jobs("run")


@runs_router.get(
    "/{run_id}", response_model=Job, summary="A run: state, progress, result or error",
    responses=problem_responses(401, 404, 422),
)
def get_run(run_id: JobId, store: StoreDep) -> Job:
    return _jobs.get_or_404(store, run_id, kind="run")


@runs_router.post(
    "/{run_id}/cancel",
    response_model=Job,
    summary="Cancel a run (its process ends, freeing its device memory)",
    description="200: cancelled (or already was); 202: running, asked to stop; 409: it finished.",
    responses={202: {"description": "stopping", "model": Job}, **problem_responses(401, 404, 409, 422)},
)
def cancel_run(run_id: JobId, store: StoreDep) -> JSONResponse:
    return _jobs.cancel(store, run_id, kind="run")


@runs_router.get(
    "/{run_id}/events",
    summary="Progress as server-sent events",
    description="`text/event-stream`: `state`, `progress` and `log` events (with `id:` for "
    "resuming through `Last-Event-ID`), then one `end` event with the finished run.",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "the event stream",
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "description": "one server-sent event; `data` is JSON",
                        "properties": {
                            "event": {"type": "string", "enum": ["state", "progress", "log", "end"]},
                            "data": {"type": "string"},
                            "id": {"type": "string"},
                            "retry": {"type": "integer"},
                        },
                    }
                }
            },
        },
        **problem_responses(401, 404, 422),
    },
)
async def run_events(
    run_id: JobId,
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    after: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="resume after this event id")] = None,
    last_event_id: Annotated[
        str | None, Header(pattern=r"^\s*[0-9]{1,18}\s*$", description="resume after this event id")
    ] = None,
) -> StreamingResponse:
    job = _jobs.get_or_404(store, run_id, kind="run")
    start = _jobs.last_event_id(last_event_id, after)
    return await _jobs.stream_events(request, store, job, after=start, settings=settings)


ArtifactName = Annotated[str, PathParam(min_length=1, max_length=255,
                                        description="an artifact's name as the job lists it, e.g. timeline.json")]


@jobs_router.get(
    "/{job_id}/artifacts/{name}",
    summary="A file a job kept: a run's measured timeline, on CUDA its allocator snapshot",
    description="The job's JSON lists its `artifacts` (name, media type, bytes, `href`; or the reason "
    "one is absent). `timeline.json` is memplan-timeline/1 (the plan's predicted bytes per op and the "
    "measured ones); `snapshot.pickle` is torch.cuda.memory._dump_snapshot's file for "
    "https://pytorch.org/memory_viz. 404 when the job or the artifact is unknown (the detail says why "
    "an absent one is absent); 422 for a name that is not a plain file name.",
    response_class=Response,
    responses={200: {"description": "the file, as an attachment",
                     "content": {"application/json": {"schema": {"type": "object"}},
                                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
               **problem_responses(401, 404, 422)},
)
def get_artifact(job_id: JobId, name: ArtifactName, store: StoreDep) -> Response:
    return _jobs.artifact_response(store, job_id, name)


router = APIRouter()  # what the app includes: the runs and the jobs' artifacts
router.include_router(runs_router)
router.include_router(jobs_router)
