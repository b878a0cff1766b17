"""FastAPI dependencies, as `Annotated` types the routers take as parameters."""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Path, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from memplan.service.jobs.store import JobStore
from memplan.service.problems import ProblemError
from memplan.service.settings import Settings
from pydantic import BaseModel, ValidationError

__all__ = ["SettingsDep", "StoreDep", "require_api_key", "ApiKeyDep", "json_body", "check_json_content_type", "body_openapi",
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


# NOTE [ The API key's scheme ]
# The key is accepted as `Authorization: Bearer <key>` or `X-API-Key: <key>`. The OpenAPI document
# declares the first only (an HTTP bearer scheme, which the 401's WWW-Authenticate names too):
# declared as alternatives, a fuzzer that corrupts one credential while sending the other valid
# one sees a 200 and reports the API as ignoring authentication.
_BEARER = HTTPBearer(scheme_name="BearerKey", auto_error=False,
                     description="`Authorization: Bearer <MEMPLAN_API_KEY>` (or the header "
                     "`X-API-Key: <MEMPLAN_API_KEY>`)")


def require_api_key(
    settings: SettingsDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    """When `MEMPLAN_API_KEY` is set: `Authorization: Bearer <key>` or `X-API-Key: <key>`, else 401."""
    if settings.api_key is None:
        return
    expected = settings.api_key.get_secret_value().encode()
    given = x_api_key
    if given is None and bearer is not None:
        given = bearer.credentials.strip()
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


def check_json_content_type(request: Request) -> None:
    """415 unless the request's Content-Type is JSON (absent: JSON). Every JSON body is checked by
    it before anything answers from the body: the plan cache too (NOTE [ The plan cache ] in
    routers/plans.py)."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype and ctype not in _JSON_TYPES and not ctype.endswith("+json"):
        raise ProblemError(
            415, f"Content-Type: {ctype!r} is not JSON; send application/json", kind="unsupported-media-type"
        )


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that parses the request body into `model` strictly: no numbers from strings,
    no booleans from 0/1, no NaN or infinity, no unknown fields. Errors are 422 naming the field;
    a non-JSON content type is 415."""

    async def parse(request: Request) -> M:
        check_json_content_type(request)
        raw = await request.body()
        try:
            data = json.loads(raw, parse_float=_parse_float)
        except RecursionError:
            data = None
            _too_deep(("body",))
        except (ValueError, UnicodeDecodeError) as err:
            raise RequestValidationError(
                [{"type": "json_invalid", "loc": ("body",), "msg": "invalid JSON", "ctx": {"error": str(err)}}]
            ) from None
        _check_depth(data)
        try:
            return model.model_validate(data, strict=True)
        except ValidationError as err:
            raise RequestValidationError([_located(e) for e in err.errors(include_url=False)]) from None

    return parse


# NOTE [ JSON depth ]
# Parsing and validating JSON recurse once per level: 1,000 levels reach Python's recursion limit
# (a RecursionError, which was a 500). No request of this API nests more than a few levels (a
# profile's meta is the deepest: free-form, kept shallow), so bodies deeper than MAX_JSON_DEPTH
# are refused with a 422 before validation; the walk is iterative.
MAX_JSON_DEPTH = 32


def _too_deep(loc: tuple) -> None:
    raise RequestValidationError([{
        "type": "too_deep", "loc": loc,
        "msg": f"JSON nested deeper than {MAX_JSON_DEPTH} levels; flatten it",
    }])


def _check_depth(data: Any) -> None:
    """422 (RequestValidationError naming the path) when `data` nests over MAX_JSON_DEPTH."""
    stack: list[tuple[Any, tuple, int]] = [(data, ("body",), 0)]
    while stack:
        node, loc, depth = stack.pop()
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        if depth >= MAX_JSON_DEPTH:
            _too_deep(loc)
        stack.extend((v, (*loc, k), depth + 1) for k, v in items)


def _located(e: dict) -> dict:
    """A body model's validation error located under `body`; a PlanError raised by a model
    check is located at its own field."""
    cause = (e.get("ctx") or {}).get("error")
    field = getattr(cause, "field", None)
    if field and not e["loc"]:
        return {**e, "loc": ("body", *field.split(".")), "msg": cause.reason}
    return {**e, "loc": ("body", *e["loc"])}


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
