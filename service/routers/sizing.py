"""`GET /v1/sizing` and `POST /v1/sizing/fit`: compute-optimal sizing and fits (planner.scaling)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.deps import require_api_key

__all__ = ["router"]

router = APIRouter(prefix="/v1/sizing", tags=["sizing"], dependencies=[Depends(require_api_key)])
