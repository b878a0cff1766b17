"""Errors as RFC 9457 problem details (`application/problem+json`), naming the field at fault.

Every error the service answers goes through here: request validation (422, with one entry per
bad field in `errors`), the library's own input errors (`PlanError`, `ProfileError`, ...: 422),
HTTP errors raised by the routers, and anything unexpected (500, logged with its traceback, never
shown to the client).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "Problem",
    "FieldError",
    "ProblemError",
    "problem_response",
    "install_problem_handlers",
    "UnexpectedErrorMiddleware",
    "problem_responses",
]

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
_TYPE_BASE = "https://memplan.dev/problems/"


class FieldError(BaseModel):
    """One invalid input: where it is and what is wrong with it."""

    field: str = Field(description="dotted path of the input, e.g. 'body.profile.layers.3.saved_bytes'")
    message: str = Field(description="what is wrong and how to fix it")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(default="about:blank", description="URI naming the kind of problem")
    title: str = Field(description="short summary of the kind of problem")
    status: int = Field(description="the HTTP status code")
    detail: str | None = Field(default=None, description="this occurrence, in a sentence")
    instance: str | None = Field(default=None, description="the request path")
    errors: list[FieldError] | None = Field(default=None, description="the invalid fields")


class ProblemError(Exception):
    """Raise in a router to answer with a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
        errors: list[FieldError] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.kind = kind
        self.headers = headers or {}
        self.errors = errors
        self.extra = extra


def problem_response(
    status: int,
    detail: str | None,
    *,
    instance: str | None = None,
    kind: str | None = None,
    headers: dict[str, str] | None = None,
    errors: list[FieldError] | None = None,
    **extra: Any,
) -> JSONResponse:
    """A `JSONResponse` carrying a problem document with media type application/problem+json."""
    body = Problem(
        type=_TYPE_BASE + kind if kind else "about:blank",
        title=HTTPStatus(status).phrase,
        status=status,
        detail=detail,
        instance=instance,
        errors=errors,
        **extra,
    ).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def _message(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "unknown field; remove it (check the spelling against /openapi.json)"
    if kind == "finite_number":
        return "must be a finite number, not NaN or infinity"
    if kind == "missing":
        return "field required"
    if kind == "json_invalid":
        ctx = err.get("ctx") or {}
        return f"the body is not valid JSON ({ctx.get('error', 'parse error')})"
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def validation_errors(errors: list[dict[str, Any]]) -> list[FieldError]:
    """Pydantic/FastAPI error dicts as `FieldError`s."""
    return [FieldError(field=_loc(tuple(e.get("loc", ()))), message=_message(e)) for e in errors]


def install_problem_handlers(app: FastAPI) -> None:
    """Route every error of `app` through problem documents."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = validation_errors(list(exc.errors()))
        detail = "; ".join(f"{e.field}: {e.message}" for e in errors[:5])
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
        return problem_response(
            422, detail, instance=request.url.path, kind="validation", errors=errors
        )

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(
            exc.status,
            exc.detail,
            instance=request.url.path,
            kind=exc.kind,
            headers=exc.headers,
            errors=exc.errors,
            **exc.extra,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).description
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # every method of every route on this path (Starlette names only the first route's)
            allowed = _allowed_methods(app, request)
            headers["Allow"] = ", ".join(allowed)
            detail = f"{request.method} is not allowed here; use {' or '.join(allowed)}"
        return problem_response(exc.status_code, detail, instance=request.url.path, headers=headers)

    app.add_middleware(UnexpectedErrorMiddleware)


class UnexpectedErrorMiddleware:
    """Anything unexpected becomes a logged 500 problem, and the connection stays open.

    NOTE [ A 500 keeps the connection ]
    An `exception_handler(Exception)` is Starlette's ServerErrorMiddleware, which sends the
    handler's response and then re-raises, so the server closes the connection and a keep-alive
    client's next request fails too. Answering here, inside that middleware, ends the request
    normally. An error after the response started cannot be answered: it is re-raised."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            raise  # no error of ours: the client went away, or its body was refused (limits.py)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            response = problem_response(
                500, "internal error; the server's log has the details",
                instance=scope.get("path"), kind="internal",
            )
            await response(scope, receive, send)


def library_error(err: Exception, *, prefix: str = "body") -> ProblemError:
    """A 422 problem from a library input error, naming its field: the error's `field` attribute
    (PlanError), else a message that starts with the field's name ("k: ..."); under `prefix`."""
    msg = str(err)
    field = getattr(err, "field", None)
    fields = [field] if field else []
    if field is None and ":" in msg:  # "k: ..." or, for several fields, "k1, k2: ..."
        names = [n.strip() for n in msg.split(":", 1)[0].split(",")]
        fields = names if all(n and " " not in n for n in names) else []
    errors = [FieldError(field=f"{prefix}.{f}", message=msg) for f in fields] or [
        FieldError(field="(request)", message=msg)]
    return ProblemError(422, msg, kind="invalid-input", errors=errors)


_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing or wrong API key",
    404: "No such resource",
    406: "The Accept header names no media type this endpoint can produce",
    409: "The resource is in a state that forbids this",
    413: "Request body larger than the server's limit",
    415: "Unsupported content type",
    422: "Invalid input: the problem names each bad field",
    429: "Too many jobs queued; retry after the number of seconds in Retry-After",
    500: "Internal error",
    501: "Not available in this build",
    503: "Not ready",
}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries of a route for these error codes (content: problem+json)."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {
            "description": _DESCRIPTIONS.get(code, HTTPStatus(code).phrase),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if code == 429:
            entry["headers"] = {
                "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
            }
        if code == 401:
            entry["headers"] = {
                "WWW-Authenticate": {"description": "the scheme", "schema": {"type": "string"}}
            }
        out[code] = entry
    return out


def call_library(
    fn: Any, *args: Any, prefix: str = "body", value_errors: bool = True, **kwargs: Any
) -> Any:
    """`fn(*args, **kwargs)`, with the library's input errors as 422 problems: its ValueErrors
    (PlanError, ProfileError, ScalingError name the field), inputs so extreme that the result
    cannot be represented (an overflow to infinity that the result's schema refuses, a division by
    an underflowed zero), and inputs too large or too deep to compute (MemoryError,
    RecursionError). With `value_errors=False`, PlanError and ProfileError are raised for the
    caller to name their field; any other ValueError is still a 422."""
    from pydantic import ValidationError

    try:
        return fn(*args, **kwargs)
    except ValidationError as err:
        # the library built an invalid result (e.g. a time that overflowed to infinity)
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or err.title
        raise ProblemError(
            422,
            f"the input is out of the representable range: {err.title}.{where}: "
            f"{_message(dict(first))}; use realistic sizes and times",
            kind="out-of-range",
        ) from None
    except ArithmeticError as err:
        raise ProblemError(
            422,
            f"the input is out of the representable range ({type(err).__name__}: {err}); "
            "use realistic values",
            kind="out-of-range",
        ) from None
    except MemoryError:
        log.warning("%s: out of memory on this request's input", getattr(fn, "__name__", fn))
        raise ProblemError(
            422, "the input is too large to compute in this server's memory; use smaller options "
            "or fewer stages", kind="too-large",
        ) from None
    except RecursionError:
        raise ProblemError(
            422, "the input is nested too deeply to compute; flatten it", kind="too-deep",
        ) from None
    except ValueError as err:
        if not value_errors and _is_input_error(err):
            raise
        raise library_error(err, prefix=prefix) from None


def _is_input_error(err: ValueError) -> bool:
    from memplan.planner.schema import PlanError
    from memplan.profiler.schema import ProfileError

    return isinstance(err, (PlanError, ProfileError))


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of `request`'s path takes (HEAD wherever GET is), sorted."""
    path = request.url.path
    methods: set[str] = set()
    stack = list(app.router.routes)
    while stack:
        route = stack.pop()
        regex = getattr(route, "path_regex", None)
        route_methods = getattr(route, "methods", None)
        if regex is not None and route_methods and regex.match(path):
            methods |= set(route_methods)
        # routers included into the app keep their routes inside (FastAPI's included routers
        # expose them as candidates; Starlette's mounts as routes)
        stack.extend(getattr(route, "_effective_candidates", None) or ())
        stack.extend(getattr(route, "routes", None) or ())
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)
