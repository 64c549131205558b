"""Database work of the async gateway, off the event loop.

A small dedicated thread pool instead of ``sync_to_async``: under ASGI, Django runs each
request's thread-sensitive calls on a new per-request thread, so every call would open a new
database connection. These threads live as long as the process and keep their connections
(Django connections are per thread), so a recorded call costs its queries, not a connect.
The pool is small on purpose: it bounds the database connections of one process, and the
work it runs is short (one transaction per call); upstream calls never hold a thread.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections

P = ParamSpec("P")
R = TypeVar("R")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The process-wide pool: 8 threads (connections) on PostgreSQL; 1 on SQLite, whose
    writers are serialised by its file lock anyway and, when several threads race for it,
    wait in its busy handler's growing sleeps instead of queueing here."""
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                default = 1 if connections["default"].vendor == "sqlite" else 8
                threads = int(
                    getattr(settings, "CLAW_PROXY_DB_THREADS", 0)
                    or os.environ.get("CLAW_PROXY_DB_THREADS")
                    or default
                )
                _executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="claw-db")
    return _executor


async def run_db(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``fn(*args, **kwargs)`` on a database thread and return its result (or raise)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(_guarded, fn, *args, **kwargs))


def _guarded(fn: Callable[..., R], /, *args: object, **kwargs: object) -> R:
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        # A broken connection (server restart, network) must not poison this thread: close
        # it so the next call reconnects.
        for conn in connections.all(initialized_only=True):
            conn.close_if_unusable_or_obsolete()
        raise
