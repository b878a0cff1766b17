"""`POST /v1/capacity`: will a Hugging Face decoder train on these GPUs: `memplan.planner.capacity`,
the same call as `memplan capacity`."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from memplan.planner.capacity import CapacityRequest
from memplan.service.deps import SettingsDep, body_openapi, json_body, require_api_key
from memplan.service.problems import call_library, problem_responses
from memplan.service.routers.plans import run_bounded

__all__ = ["router"]

router = APIRouter(prefix="/v1/capacity", tags=["capacity"], dependencies=[Depends(require_api_key)])


@router.post(
    "",
    summary="Does a Hugging Face decoder train within a GPU's memory, with which recompute; the "
    "largest micro-batch and sequence and the fewest GPUs that fit",
    description="The body is `memplan.planner.capacity.CapacityRequest` (the config.json as an "
    "object, memory_bytes or a device preset, precision, seq_len, micro_batch, n_gpus, zero_stage, "
    "max_overhead, and the parallel layout: tp, sp, cp, pp, micro_batches, virtual_stages, with the "
    "links' bandwidths for the step time). Returns `CapacityAnswer`: `fits`, the optimal plan's "
    "peak and overhead on the binding GPU, `max_micro_batch`, `max_seq_len`, `min_gpus`, the "
    "communication buffers, the step time's parts and a row per precision policy. An answer that "
    "does not fit is a 200 with `fits: false`; bad input (tp x cp x pp not dividing n_gpus, tp not "
    "dividing the heads, cp not dividing seq_len) is a 422 naming the field.",
    responses={
        200: {"description": "the answer (`CapacityAnswer`)",
              "content": {"application/json": {"schema": {"type": "object"}}}},
        **problem_responses(401, 413, 415, 422, 500, 503),
    },
    openapi_extra=body_openapi(CapacityRequest),
)
async def post_capacity(
    request: Request, settings: SettingsDep,
    body: Annotated[CapacityRequest, Depends(json_body(CapacityRequest))],
) -> Response:
    from memplan.planner.capacity import capacity

    # its plans in a planning process, under the plan limits (NOTE [ Plans in the API process ])
    answer = await run_bounded(request, settings, partial(call_library, capacity, prefix="body"),
                               body, in_process=True)
    return Response(answer.model_dump_json(), media_type="application/json")
