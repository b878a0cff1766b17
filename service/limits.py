"""Request body size limit as pure ASGI middleware: 413 before the body is read into memory."""

from __future__ import annotations

import json
import logging
from typing import Any

from memplan.service.problems import PROBLEM_MEDIA_TYPE
from starlette.requests import ClientDisconnect

__all__ = ["BodyLimitMiddleware"]

log = logging.getLogger(__name__)


class BodyLimitMiddleware:
    """Refuses bodies over `max_bytes`: by their Content-Length at once, and by counting the bytes
    of bodies sent without one (chunked)."""

    def __init__(self, app: Any, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._reject(scope, send)
                    return
        seen = 0
        state = {"started": False, "rejected": False}

        async def counting_receive() -> dict:
            nonlocal seen
            if state["rejected"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not state["started"]:
                    # answer now; the app sees a client that went away and stops reading
                    state["rejected"] = True
                    await self._reject(scope, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict) -> None:
            if state["rejected"]:
                return  # the 413 already went out
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except ClientDisconnect:
            # NOTE [ A refused body is a quiet 413 ]
            # After the 413 the app reading the body sees a client that went away (ClientDisconnect,
            # raised from request.body()). That is the expected end of the request: one log line, no
            # traceback (it was a 50-line "unhandled error" per request). A client that really went
            # away mid-body gets no answer and one debug line.
            if state["rejected"]:
                log.info("%s %s: 413, body over %d bytes", scope.get("method"), scope.get("path"),
                         self.max_bytes)
            else:
                log.debug("%s %s: the client went away", scope.get("method"), scope.get("path"))

    async def _reject(self, scope: dict, send: Any) -> None:
        body = json.dumps(
            {
                "type": "https://memplan.dev/problems/too-large",
                "title": "Content Too Large",
                "status": 413,
                "detail": f"the request body is over the server's limit of {self.max_bytes} bytes "
                "(MEMPLAN_MAX_BODY_BYTES)",
                "instance": scope.get("path", ""),
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
