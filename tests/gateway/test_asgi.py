"""The lean gateway handler (gateway/proxy/asgi.py) relies on Django internals it cannot
reach through a public API; these tests fail loudly when Django changes underneath it."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from django.core.handlers.base import BaseHandler

from gateway.proxy.asgi import GatewayASGIHandler, with_gateway

pytestmark = pytest.mark.django_db(transaction=True)


async def _serve(
    app, path: str, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int, dict[bytes, bytes]]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers or [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    received = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if received:
            return received.pop(0)
        await asyncio.Event().wait()  # the client stays connected; the server cancels this wait

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    assert start is not None, sent
    return start["status"], {k.lower(): v for k, v in start["headers"]}


def test_django_still_builds_the_chain_the_handler_replaces():
    # Django's load_middleware still wraps _get_response_async into _middleware_chain, and
    # get_response_async still calls it: what GatewayASGIHandler.load_middleware replaces.
    load = inspect.getsource(BaseHandler.load_middleware)
    assert "self._middleware_chain = handler" in load and "self._get_response_async" in load
    assert "self._middleware_chain(request)" in inspect.getsource(BaseHandler.get_response_async)


async def test_gateway_paths_run_no_middleware_and_the_rest_does():
    # given the project's ASGI app: gateway paths through the lean handler, the rest through Django
    from django.core.handlers.asgi import ASGIHandler

    app = with_gateway(ASGIHandler())
    # when a gateway path and a site path are served
    gw_status, gw_headers = await _serve(app, "/v1/unknown-endpoint")
    site_status, site_headers = await _serve(app, "/healthz")
    # then the gateway answered through its own URLconf (an OpenAI-shaped 404) with no
    # middleware (XFrameOptionsMiddleware would add X-Frame-Options)...
    assert gw_status == 404 and gw_headers[b"content-type"] == b"application/json", gw_headers
    assert b"x-frame-options" not in gw_headers
    # ...while the site's middleware still runs for everything else
    assert site_status == 200 and site_headers[b"x-frame-options"] == b"DENY"


def test_the_handler_has_an_empty_chain():
    handler = GatewayASGIHandler()
    assert handler._view_middleware == [] and handler._exception_middleware == []
    assert handler._middleware_chain is not None
