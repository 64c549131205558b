"""ASGI guard: request bodies over CLAW_MAX_BODY_BYTES are refused with 413 before Django
reads them, and chunked bodies (no Content-Length) are buffered within the same limit and
given a Content-Length, so every view (DRF's parsers included) sees them whole.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.conf import settings

_NO_BODY = {b"GET", b"HEAD", b"OPTIONS"}


class BodyLimitMiddleware:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"].encode() in _NO_BODY:
            return await self.app(scope, receive, send)
        limit = settings.CLAW_MAX_BODY_BYTES
        length = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return await _reply(send, 400, "invalid Content-Length header")
                break
        if length is not None:
            if length > limit:
                return await _reply(send, 413, f"request body is {length} bytes; the limit is {limit}")
            return await self.app(scope, receive, send)

        # No Content-Length: buffer the (chunked) body, within the limit.
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                return await _reply(send, 413, f"request body exceeds the limit of {limit} bytes")
            if not message.get("more_body", False):
                break
        headers = [(k, v) for k, v in scope["headers"] if k != b"transfer-encoding"]
        headers.append((b"content-length", str(len(body)).encode()))
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return await self.app(dict(scope, headers=headers), replay, send)


async def _reply(send: Any, status: int, message: str) -> None:
    kind = "invalid_request_error"
    body = orjson.dumps(
        {
            "error": {
                "type": kind,
                "code": "payload_too_large" if status == 413 else "invalid",
                "message": message,
                "param": None,
            }
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
