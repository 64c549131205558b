"""ASGI middleware: the identifier rule (claw_kit/web/guard.py) on every URL the site serves,
before any work.

Every path segment and every query key and value of every HTTP request and websocket, the
gateway's lean path (gateway/proxy/asgi.py) and static files included, is checked once here
(the one place: no view, converter or serializer needs to): a NUL, another control character
(CR, LF...), U+2028/U+2029, a bidi control or a zero-width character is a 400 in the door's
error shape naming the URL argument that holds it (``uid``, ``trajectory_uid``: the route's
own name for it), the query parameter, or ``path``. Nothing else runs: no authentication, no
database, no upstream. A websocket is accepted and closed with 4400 at once.

Cost on the hot path: ``str.isascii`` and ``str.isprintable`` on the path (in C), nothing more
for a request without a query string.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import orjson
from django.urls import Resolver404, resolve

from claw_kit.web import guard
from claw_kit.web.errors import error_body

# Paths answered in Anthropic's error shape ({"type": "error", "error": {type, message}}):
# the Messages doors, under every base URL (/v1/, /t/.../v1/, /compat/claw-r1/.../v1/).
_ANTHROPIC_SUFFIXES = ("/v1/messages", "/v1/messages/count_tokens")
WEBSOCKET_CLOSE_CODE = 4400


class UrlGuardMiddleware:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        found = url_problem(scope["path"], scope.get("query_string", b""))
        if found is None:
            return await self.app(scope, receive, send)
        param, message = found
        if scope["type"] == "websocket":
            # Accepted, then closed, as the live consumer does: a browser sees the code only
            # after an accept (a refused handshake reaches the page as 1006).
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": WEBSOCKET_CLOSE_CODE})
            return
        body = orjson.dumps(_error_body(scope["path"], message, param))
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def url_problem(path: str, query_string: bytes) -> tuple[str, str] | None:
    """(the offending argument, parameter or ``path``; the message) of the first character no
    identifier may hold in ``path`` (decoded, as ASGI gives it) or ``query_string`` (raw),
    else None."""
    problem = guard.chars_problem(path)
    if problem:
        return _path_param(path), f"the URL path {problem}"
    if query_string and not _plain(query_string):
        query = query_string.decode("utf-8", errors="replace")
        pairs = parse_qsl(query, keep_blank_values=True, encoding="utf-8", errors="replace")
        for name, value in pairs:
            problem = guard.chars_problem(name)
            if problem:
                return "query", f"a query parameter's name {problem}"
            problem = guard.chars_problem(value)
            if problem:
                return name, f"query parameter {name!r} {problem}"
    return None


def _plain(query_string: bytes) -> bool:
    """Printable ASCII without a percent escape: nothing in it can decode to a refused
    character (the common query string, checked without parsing it)."""
    return b"%" not in query_string and query_string.isascii() and query_string.decode("ascii").isprintable()


def _path_param(path: str) -> str:
    """The route's name of the argument holding the bad character (error path only), else
    ``path``."""
    try:
        match = resolve(path)
    except Resolver404:
        return "path"
    for name, value in match.kwargs.items():
        if isinstance(value, str) and guard.chars_problem(value):
            return name
    return "path"


def _error_body(path: str, message: str, param: str) -> dict[str, Any]:
    if path.endswith(_ANTHROPIC_SUFFIXES):
        from gateway.proxy.doors.anthropic import error_body as anthropic_error_body

        return anthropic_error_body(400, message)
    return error_body(400, message, param=param, code="invalid")
