"""FastAPI dependencies, as `Annotated` types the routers take as parameters."""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from memplan.service.jobs.store import JobStore
from memplan.service.problems import ProblemError
from memplan.service.settings import Settings
from pydantic import BaseModel, ValidationError

__all__ = ["SettingsDep", "StoreDep", "require_api_key", "ApiKeyDep", "json_body", "body_openapi",
           "JobId", "IdempotencyKey", "PreferWait"]

M = TypeVar("M", bound=BaseModel)


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _store(request: Request) -> JobStore:
    return request.app.state.store


SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[JobStore, Depends(_store)]

# the parameters every job resource (runs, profiles) takes
JobId = Annotated[str, Path(min_length=1, max_length=64, description="the job's id")]
IdempotencyKey = Annotated[
    str | None, Header(min_length=1, max_length=255, description="same key, same body: same job")
]
PreferWait = Annotated[
    str | None, Header(max_length=200, description="'wait=N': wait up to N s (at most 60)")
]


def require_api_key(
    settings: SettingsDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    """When `MEMPLAN_API_KEY` is set: `Authorization: Bearer <key>` or `X-API-Key: <key>`, else 401."""
    if settings.api_key is None:
        return
    expected = settings.api_key.get_secret_value().encode()
    given = x_api_key
    if given is None and authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer":
            given = token.strip()
    if given is None or not hmac.compare_digest(given.encode(), expected):
        raise ProblemError(
            401,
            "this server needs an API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            if given is None
            else "wrong API key",
            kind="unauthorized",
            headers={"WWW-Authenticate": 'Bearer realm="memplan"'},
        )


ApiKeyDep = Depends(require_api_key)


# -- strict JSON bodies ----------------------------------------------------------------------------

_JSON_TYPES = ("application/json", "application/problem+json")


def _parse_float(text: str) -> float | int:
    # JSON has one number type: 5.0 is the integer 5 (JSON Schema agrees), so it may fill an int
    # field; strict validation then refuses only what is really wrong (strings for numbers, ...)
    value = float(text)
    return int(value) if math.isfinite(value) and value.is_integer() else value


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that parses the request body into `model` strictly: no numbers from strings,
    no booleans from 0/1, no NaN or infinity, no unknown fields. Errors are 422 naming the field;
    a non-JSON content type is 415."""

    async def parse(request: Request) -> M:
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype and ctype not in _JSON_TYPES and not ctype.endswith("+json"):
            raise ProblemError(
                415, f"Content-Type: {ctype!r} is not JSON; send application/json", kind="unsupported-media-type"
            )
        raw = await request.body()
        try:
            data = json.loads(raw, parse_float=_parse_float)
        except (ValueError, UnicodeDecodeError) as err:
            raise RequestValidationError(
                [{"type": "json_invalid", "loc": ("body",), "msg": "invalid JSON", "ctx": {"error": str(err)}}]
            ) from None
        try:
            return model.model_validate(data, strict=True)
        except ValidationError as err:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]
            ) from None

    return parse


def body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a `json_body(model)` body (the app adds `model` to components)."""
    BODY_MODELS[model.__name__] = model
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


BODY_MODELS: dict[str, type[BaseModel]] = {}
