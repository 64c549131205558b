"""Database work of the async gateway, off the event loop.

A small dedicated thread pool instead of ``sync_to_async``: under ASGI, Django runs each
request's thread-sensitive calls on a new per-request thread, so every call would open a new
database connection. These threads live as long as the process and keep their connections
(Django connections are per thread), so a recorded call costs its queries, not a connect.
The pool is small on purpose: it bounds the database connections of one process, and the
work it runs is short (one transaction per call); upstream calls never hold a thread.

:class:`GroupWriter` is the proxied calls' own writer: ONE thread that takes every call
waiting for it and commits their steps together (a group commit: pool.ingest's
``steps_append_group``), then answers all of them with one wake-up of the event loop. Under
load a call no longer costs a thread hand-off each way, eight threads fighting for the GIL
and a commit of its own; alone, it costs what one call on the pool did.
"""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, ParamSpec, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

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


class GroupWriter(Generic[T, R]):
    """One thread running ``write(items)`` over every item waiting (at most ``most`` at a
    time), in order; each submitter gets its own item's result (see the module docstring).
    ``write`` returns one result per item and must not raise for one item's sake: a raise
    fails the whole group (each submitter gets the exception)."""

    def __init__(self, write: Callable[[list[T]], Sequence[R]], *, name: str, most: int = 64):
        self._write = write
        self._most = most
        self._name = name
        self._queue: queue.SimpleQueue[tuple[T, asyncio.AbstractEventLoop, asyncio.Future]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        if self._thread is None:
            self._start()
        self._queue.put((item, loop, fut))
        return await fut

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self._most:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                results: Sequence[Any] = _guarded(self._write, [item for item, _, _ in batch])
                failed: BaseException | None = None
            except BaseException as exc:  # the whole group's: every submitter gets it
                results, failed = [None] * len(batch), exc
            settled: dict[
                asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any, BaseException | None]]
            ] = {}
            for (_, loop, fut), result in zip(batch, results, strict=True):
                settled.setdefault(loop, []).append((fut, result, failed))
            for loop, done in settled.items():
                try:
                    loop.call_soon_threadsafe(_settle, done)  # one wake-up per loop per group
                except RuntimeError:
                    pass  # that loop is closed: nobody waits


def _settle(done: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    for fut, result, failed in done:
        if fut.cancelled():  # the client went away; the steps stay written, as they would
            continue
        if failed is not None:
            fut.set_exception(failed)
        else:
            fut.set_result(result)
