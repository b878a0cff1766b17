"""FastAPI dependencies, as `Annotated` types the routers take as parameters."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request

from service.jobs.store import JobStore
from service.problems import ProblemError
from service.settings import Settings

__all__ = ["SettingsDep", "StoreDep", "require_api_key", "ApiKeyDep"]


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _store(request: Request) -> JobStore:
    return request.app.state.store


SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[JobStore, Depends(_store)]


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
