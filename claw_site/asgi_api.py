"""The REST API (``/api/``) under ASGI in one thread hop per request.

Every API view is a synchronous DRF view. Django's stock ASGIHandler serves it through its
async middleware chain: each ``MiddlewareMixin`` middleware (nine of the project's ten) runs
its request and response hooks through ``sync_to_async``, the request_started and
request_finished signals take two more hops, and every request gets a fresh thread (a new
``ThreadSensitiveContext`` executor). Under bench.ingest's load (W-ingest, MessagePack),
py-spy put a third of the server's CPU on the event loop thread doing exactly that, for a
view whose own work is two thirds.

``SyncAPIHandler`` is Django's handler with the *synchronous* middleware chain (the one
WSGI servers and the test client run: the same classes, each request passes every
middleware as before) run in one call on a worker thread of the handler's own pool: the
signals, every middleware and the view, then the response is sent from the event loop. The
pool is wide (``THREADS``): a trainer's long-poll pull sleeps on its thread for up to 30 s, so
a pool as narrow as the event loop's default (cores + 4) would let a few waiting trainers hold
every other API request; Django's handler had no bound at all (a thread per request). The
database pool (CLAW_DB_POOL_SIZE) bounds concurrent database work, as before.
Database connections are per request context (Django's connection handler), so a request's
connection lives and closes on the one thread that ran it (request_finished runs there, with
``response.close()``). Streaming responses (file downloads: claw_kit/web/files.py) iterate
their body from the event loop, as before, and are closed after it. A client that goes away
mid-request cannot stop a synchronous view under either handler; here its answer is dropped.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.http import FileResponse
from django.urls import set_script_prefix

from claw_kit.web.asgi_routing import by_prefix

API_PREFIX = "/api/"
THREADS = 128  # requests served at once by one process (module docstring); idle threads cost nothing


class SyncAPIHandler(ASGIHandler):
    """Django's ASGI handler serving through the synchronous middleware chain, in one thread
    hop per request (module docstring)."""

    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="claw-api")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"the API handler serves HTTP only, not {scope['type']}")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            response = await sync_to_async(self._serve, thread_sensitive=False, executor=self.executor)(
                scope, body_file
            )
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away while we were sending
            if response.streaming:
                await sync_to_async(response.close, thread_sensitive=False, executor=self.executor)()
        finally:
            body_file.close()

    def _serve(self, scope: dict[str, Any], body_file: Any) -> Any:
        """On the worker thread: what ASGIHandler.handle does around the view, in the
        synchronous chain. A response with its body in memory is closed here (the
        request_finished signal: this thread's database connection goes back)."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        response = error_response if request is None else self.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        if response.streaming:
            close_old_connections()  # the body is a file: the database is done with
        else:
            response.close()
        return response


def with_api(app: Any) -> Any:
    """``app`` with the ``/api/`` paths served by SyncAPIHandler."""
    return by_prefix(API_PREFIX, SyncAPIHandler(), app)


__all__ = ["API_PREFIX", "SyncAPIHandler", "with_api"]
