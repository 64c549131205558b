"""A lean ASGI entry for the gateway paths (``/v1/``, ``/t/``, ``/compat/claw-r1/``).

Django's stock ASGIHandler costs several milliseconds of CPU per request on a small machine,
all of it thread hops: every ``MiddlewareMixin`` middleware runs its process_request and
process_response through ``sync_to_async`` (two hops each, so ~12 for the project's seven),
the request_started/request_finished signals take two more, and each request gets a fresh
thread (a new ThreadSensitiveContext executor). None of that is needed by the gateway
endpoints: they authenticate by API key, set no cookies, use no sessions, CSRF or messages,
and do their database work on their own long-lived threads (gateway/proxy/db.py).

``GatewayASGIHandler`` is Django's handler (same request/response objects, URL resolver,
views and exception-to-response conversion) with an empty middleware chain, no per-request
thread context and no signal hops; the view runs in the request's own task, with one
watcher task that cancels it when the client disconnects (Django spawns two and waits on
both). ``with_gateway(app)`` sends the gateway paths to it and
everything else to ``app``.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix, set_urlconf

from claw_kit.web import server_timing
from claw_kit.web.asgi_routing import by_prefix

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]
]

GATEWAY_PREFIXES = ("/v1/", "/t/", "/compat/claw-r1/")
ROUTES = "gateway.proxy.routes"  # the gateway's routes only (same paths as in claw_site/urls.py)


# Django has no public way to build a handler without settings.MIDDLEWARE, so
# GatewayASGIHandler overrides load_middleware and sets the private attributes Django's own
# load_middleware sets (BaseHandler: _view_middleware, _template_response_middleware,
# _exception_middleware, _middleware_chain around _get_response_async). The alternatives
# cost what this handler exists to save (an empty MIDDLEWARE for the whole site, or a second
# settings module and process). Checked here at import, so a Django upgrade that renames them
# fails at startup rather than at the first request, and by tests/gateway/test_asgi.py, which
# serves a request through this handler and fails if any middleware ran.
_DJANGO_PRIVATE = ("_get_response_async", "_middleware_chain")
_missing = [name for name in _DJANGO_PRIVATE if not hasattr(ASGIHandler, name)]
if _missing:  # pragma: no cover - only on a Django that changed its handler internals
    raise ImportError(f"GatewayASGIHandler relies on BaseHandler.{_missing}, gone in this Django version")


class GatewayASGIHandler(ASGIHandler):
    """Django's ASGI handler without middleware, per-request thread context or signals
    (see the module docstring). Only for async views that need none of them."""

    def load_middleware(self, is_async: bool = False) -> None:
        # See _DJANGO_PRIVATE above: the attributes BaseHandler.load_middleware sets.
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]

    async def read_body(self, receive: Any) -> io.BytesIO:
        """The body in memory (Django spools it to a SpooledTemporaryFile, made per request):
        BodyLimitMiddleware has bounded it by CLAW_MAX_BODY_BYTES already."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestAborted()
            chunk = message.get("body")
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return io.BytesIO(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"the gateway handler serves HTTP only, not {scope['type']}")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        received = time.perf_counter()
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            if error_response is not None:
                await self.send_response(error_response, send)
            return
        request.urlconf = ROUTES
        # As Django does: a client that disconnects cancels the view (and a streamed relay).
        # The view runs in this task (one task per request fewer than Django's two, and no
        # asyncio.wait): the watcher cancels it when the client goes.
        work = asyncio.current_task()
        assert work is not None
        state = _Watch()
        watcher = asyncio.ensure_future(self._watch(receive, work, state))
        try:
            await self._respond(request, send, received)
        except asyncio.CancelledError:
            if not state.aborted:
                raise  # cancelled from outside (the server shutting down): not ours to swallow
        finally:
            state.done = True
            watcher.cancel()
            body_file.close()
        if state.aborted:
            work.uncancel()  # the cancellation was ours, and is spent

    def resolve_request(self, request: Any) -> Any:
        """Django's resolution, remembered for the gateway's fixed paths (``/v1/...``: a
        handful, with no path arguments), where resolving a proxied call walked the URL
        patterns on every request (~9% of the event loop's time on a call)."""
        path = request.path_info
        match = _fixed.get(path)
        if match is None:
            match = super().resolve_request(request)
            if path.startswith("/v1/") and not match.kwargs and not match.args and len(_fixed) < 64:
                _fixed[path] = match
            return match
        set_urlconf(request.urlconf)  # as Django's resolve_request does
        request.resolver_match = match
        return match

    async def _watch(self, receive: Any, work: asyncio.Task, state: _Watch) -> None:
        """Wait for the client's disconnect; cancel the view's task when it comes first."""
        try:
            await self.listen_for_disconnect(receive)
        except (RequestAborted, AssertionError):  # a disconnect, or a message out of place
            if not state.done:
                state.aborted = True
                work.cancel()

    async def _respond(self, request: Any, send: Any, received: float) -> None:
        response = await self.run_get_response(request)
        if not response.streaming:
            if not response.has_header("Content-Length"):
                response.headers["Content-Length"] = str(len(response.content))  # type: ignore[attr-defined] # as CommonMiddleware does
            # Server-Timing: the body in hand to the answer ready, after the runner's upstream
            # and record (runner.py), so an agent sees what the gateway added to the upstream.
            server_timing.add(response, server_timing.metric("total", time.perf_counter() - received))
        try:
            await self.send_response(response, send)
        except asyncio.CancelledError:
            pass  # the client went away while we were sending
        # The gateway's database connections live on its own threads, so the
        # request_finished signal (closing this thread's connections) has nothing to do.


_fixed: dict[str, Any] = {}  # path -> ResolverMatch (GatewayASGIHandler.resolve_request)


class _Watch:
    __slots__ = ("aborted", "done")

    def __init__(self) -> None:
        self.aborted = False  # the client went away: the view was cancelled for it
        self.done = False  # the view returned: nothing left to cancel


def with_gateway(app: ASGIApp) -> ASGIApp:
    """``app`` with the gateway paths served by GatewayASGIHandler."""
    return by_prefix(GATEWAY_PREFIXES, GatewayASGIHandler(), app)


__all__ = ["GATEWAY_PREFIXES", "GatewayASGIHandler", "with_gateway"]
