"""A thin client for memplan's REST service, so that every CLI command can run on a remote server
(`--server URL`). It returns the service's JSON exactly (dicts), which is what `--json` prints.

    >>> from memplan.client import Client
    >>> c = Client("http://gpu-node:8000", api_key="...")
    >>> plan = c.plan(profile_dict, budget_bytes=2 << 30, strategy="sqrt")
    >>> run = c.run({"model": "gpt", "budget_bytes": 2 << 30}, on_event=print)

Errors: a problem document from the server raises `ServerError` (a ValueError: the CLI prints it
as one line, exit code 2); an unreachable server raises `ServerUnavailable` (an OSError).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Client", "ServerError", "ServerUnavailable", "TERMINAL"]

TERMINAL = ("succeeded", "failed", "cancelled")


class ServerError(ValueError):
    """The server answered with an error (4xx or 5xx); `problem` is its problem document."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        detail = problem.get("detail") or problem.get("title") or "error"
        super().__init__(f"server: {status} {problem.get('title', '')}: {detail}".replace(" : ", ": "))


class ServerUnavailable(OSError):
    """The server could not be reached."""


class Client:
    """One server; `api_key` defaults to $MEMPLAN_API_KEY."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        import httpx

        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.url = url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("MEMPLAN_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any):
        import httpx

        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise ServerUnavailable(f"server: cannot reach {self.url}: {err}") from None
        if r.status_code >= 400:
            try:
                problem = r.json()
            except ValueError:
                problem = {"title": r.reason_phrase, "detail": r.text[:200]}
            raise ServerError(r.status_code, problem if isinstance(problem, dict) else {"detail": str(problem)})
        return r

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- endpoints -------------------------------------------------------------------------------

    def health(self) -> dict:
        return self._json("GET", "/v1/healthz")

    def ready(self) -> dict:
        return self._json("GET", "/v1/readyz")

    def info(self) -> dict:
        return self._json("GET", "/v1/info")

    def plan(
        self,
        profile: dict,
        *,
        budget_bytes: int | None = None,
        strategy: str | None = None,
        options: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict:
        """POST /v1/plans: the Plan as JSON. `extra`: further body fields (memory_bytes, n_gpus,
        zero_stage, checkpoint_dtype, tolerance); None values are left out."""
        body: dict[str, Any] = {"profile": profile, "budget_bytes": budget_bytes, "options": options or {}}
        body.update({k: v for k, v in (extra or {}).items() if v is not None})
        if strategy is not None:
            body["strategy"] = strategy
        return self._json("POST", "/v1/plans", json=body)

    def frontier(self, profile: dict, *, png: bool = False, options: dict[str, Any] | None = None) -> Any:
        """POST /v1/plans/frontier: the frontier JSON, or PNG bytes with `png=True`."""
        headers = {"Accept": "image/png" if png else "application/json"}
        r = self._request(
            "POST", "/v1/plans/frontier", json={"profile": profile, "options": options or {}}, headers=headers
        )
        return r.content if png else r.json()

    def sizing(self, **query: Any) -> dict:
        """GET /v1/sizing with the query parameters given (None values left out)."""
        return self._json("GET", "/v1/sizing", params={k: v for k, v in query.items() if v is not None})

    def fit(self, body: dict[str, Any]) -> dict:
        """POST /v1/sizing/fit."""
        return self._json("POST", "/v1/sizing/fit", json=body)

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, kind: str, body: dict[str, Any], *, idempotency_key: str | None = None) -> dict:
        """POST /v1/runs or /v1/profiles (`kind` 'runs' or 'profiles'): the accepted job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", f"/v1/{kind}", json=body, headers=headers)

    def job(self, kind: str, job_id: str) -> dict:
        return self._json("GET", f"/v1/{kind}/{job_id}")

    def jobs(self, kind: str, *, state: str | None = None, limit: int = 50) -> dict:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        return self._json("GET", f"/v1/{kind}", params=params)

    def cancel(self, kind: str, job_id: str) -> dict:
        return self._json("POST", f"/v1/{kind}/{job_id}/cancel")

    def events(self, job_id: str, *, after: int = 0) -> Iterator[tuple[str, dict]]:
        """The run's server-sent events as (event, data) pairs, until its `end` event."""
        import httpx

        headers = {"Last-Event-ID": str(after)} if after else {}
        try:
            with self._http.stream("GET", f"/v1/runs/{job_id}/events", headers=headers, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ServerError(r.status_code, r.json())
                event, data = "message", ""
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data += line[6:]
                    elif line == "" and data:
                        yield event, json.loads(data)
                        if event == "end":
                            return
                        event, data = "message", ""
        except httpx.TransportError as err:
            raise ServerUnavailable(f"server: lost {self.url}: {err}") from None

    def wait(
        self,
        kind: str,
        job: dict,
        *,
        on_event: Callable[[str, dict], None] | None = None,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
    ) -> dict:
        """The job once finished: following its events (runs) or polling (profiles)."""
        if kind == "runs":
            for event, data in self.events(job["id"]):
                if on_event is not None:
                    on_event(event, data)
                if event == "end":
                    return data
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while job["state"] not in TERMINAL:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{kind} {job['id']} still {job['state']} after {timeout_s} s")
            time.sleep(poll_s)
            job = self.job(kind, job["id"])
            if on_event is not None:
                on_event("progress", {"progress": job["progress"], "message": job["message"]})
        return job

    def run(self, body: dict[str, Any], *, idempotency_key: str | None = None,
            on_event: Callable[[str, dict], None] | None = None) -> dict:
        """Submit a run and follow it to the end: the finished run (its `result` is the RunReport)."""
        return self.wait("runs", self.submit("runs", body, idempotency_key=idempotency_key), on_event=on_event)

    def profile(self, body: dict[str, Any], *, on_event: Callable[[str, dict], None] | None = None) -> dict:
        """Submit a profile job and wait for it: the finished job (its `result` is the Profile)."""
        return self.wait("profiles", self.submit("profiles", body), on_event=on_event)
