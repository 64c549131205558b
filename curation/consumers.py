"""The live dashboard's websocket (``ws/live/?topics=overview,collection``): a thin consumer.

It rejects anonymous users (close 4401) and users without the permission of a requested
topic (close 4403), joins the Channels groups ``live.<topic>`` (pool/live.py publishes
there), sends ``{"type": "hello", "state": ...}`` (curation/selectors/live.py) and then
forwards each coalesced batch as ``{"type": "batch", "events": [...]}``. Before forwarding,
the permissions are checked again against a fresh read of the user (at most once a second),
so a deactivated user or a removed permission closes the socket with 4403.

The counters are never moved by adding up events (an event cannot say how many steps became
ready, and one committed before the hello read but delivered after it would count twice):
after a forwarded batch, and every IDLE_REFRESH_SECONDS without one (writes that publish no
event: a trajectory created through the API, the sweep abandoning trajectories, a label, a
policy version), the consumer sends ``{"type": "state", "state": ...}``, the hello state read
again, when it changed. The reads are shared by the consumers of a process (``_StateReader``):
one read serves every consumer whose batch came before it started, and reads start at most
once per REFRESH_SECONDS, and further apart when they are slow (READ_SHARE), so a hundred open
dashboards cost what one does.

The socket is accepted before a rejection is sent, so a browser sees the close code (a
handshake refused before accept reaches the page as 1006 without a code).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.db import close_old_connections

from pool import live

from .selectors.live import live_state, state_for

log = logging.getLogger(__name__)

# The permission each topic needs ("snapshot.<id>" topics: consumption's).
TOPIC_PERMISSIONS: dict[str, str] = {
    "overview": "pool.view_trajectory",
    "collection": "pool.view_trajectory",
    "steps": "pool.view_trajectory",
    "curation": "pool.change_step",
    "optimization": "pool.view_promptgroup",
    "consumption": "pool.view_trajectory",
}
RECHECK_SECONDS = 1.0
MAX_TOPICS = 16
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_BAD_TOPIC = 4400
# The counters (state messages): read at most once per REFRESH_SECONDS per process, and a
# read waits until the reads took at most READ_SHARE of the time (a 300 ms read: 3 s apart);
# a read starts GATHER_SECONDS after it is asked for, so that every consumer woken by the same
# batch is served by it; read again every IDLE_REFRESH_SECONDS when no batch came.
REFRESH_SECONDS = 1.0
READ_SHARE = 0.1
GATHER_SECONDS = 0.05
IDLE_REFRESH_SECONDS = 10.0
# Permission re-checks run on their own thread: on the shared sync executor they would queue
# behind the HTTP requests of a busy server, and every batch waits for its check.
_checks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claw-live-perms")


def topic_permission(topic: str) -> str | None:
    if topic.startswith("snapshot.") and 9 < len(topic) <= 80:
        return TOPIC_PERMISSIONS["consumption"]
    return TOPIC_PERMISSIONS.get(topic)


class _StateReader:
    """The counter reads of one process's consumers (one reader per event loop)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.started = -math.inf  # monotonic time the last read (failed or not) started
        self.took = 0.0
        self.state: dict[str, Any] | None = None
        self.read_at = -math.inf  # monotonic time the read of ``state`` started

    async def read_after(self, moment: float) -> dict[str, Any]:
        """The full state (every section) of a read that started at ``moment`` (monotonic)
        or later, so it holds every write committed before then. Raises what the read
        raised (the database away); the next call reads again."""
        async with self.lock:
            if self.state is None or self.read_at < moment:
                now = time.monotonic()
                wait = max(GATHER_SECONDS, self.started + max(REFRESH_SECONDS, self.took / READ_SHARE) - now)
                await asyncio.sleep(wait)
                started = self.started = time.monotonic()
                try:
                    state = await database_sync_to_async(read_state)(["overview"])
                finally:
                    self.took = time.monotonic() - started
                self.state, self.read_at = state, started
            return self.state


def read_state(topics: list[str]) -> dict[str, Any]:
    """``live_state(topics)`` on a connection given back when it is read: database_sync_to_async
    closes connections outside the context the function runs in, so one opened here would
    stay open (checked out of the pool) for as long as the calling task lives."""
    try:
        return live_state(topics)
    finally:
        close_old_connections()


_readers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StateReader] = weakref.WeakKeyDictionary()


def state_reader() -> _StateReader:
    """The shared reader of the running event loop."""
    loop = asyncio.get_running_loop()
    reader = _readers.get(loop)
    if reader is None:
        reader = _readers[loop] = _StateReader()
    return reader


class LiveConsumer(AsyncJsonWebsocketConsumer):
    topics: list[str]
    checked_at: float
    sent: dict[str, Any]
    moved: asyncio.Event
    refresher: asyncio.Task | None = None
    # The groups this socket joined: the only ones it leaves at close (a refused topic, 5,000
    # characters long, is no group name the layer takes).
    joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        raw = parse_qs(self.scope.get("query_string", b"").decode()).get("topics", ["overview"])
        self.topics = list(dict.fromkeys(t for part in raw for t in part.split(",") if t))[:MAX_TOPICS]
        if not self.topics or any(topic_permission(t) is None for t in self.topics):
            await self.close(code=CLOSE_BAD_TOPIC)
            return
        if not await self._check(user.pk):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.checked_at = time.monotonic()
        live.attach_loop(asyncio.get_running_loop())
        for topic in self.topics:
            await self.channel_layer.group_add(live.GROUP_PREFIX + topic, self.channel_name)
            self.joined = (*self.joined, topic)
        self.sent = await database_sync_to_async(read_state)(self.topics)
        await self.send_json({"type": "hello", "state": self.sent})
        self.moved = asyncio.Event()
        self.refresher = asyncio.create_task(self._refresh())

    async def disconnect(self, code: int) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
        for topic in self.joined:
            try:
                await self.channel_layer.group_discard(live.GROUP_PREFIX + topic, self.channel_name)
            except Exception:  # noqa: BLE001 - the layer away (Redis timeout) at close: the
                # membership expires by itself (channels-redis group_expiry); a closing socket
                # must not end in "Exception in ASGI application"
                log.warning(
                    "live: leaving %s at close failed; the membership will expire", topic, exc_info=True
                )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The socket is one-way: client messages are ignored."""

    async def live_batch(self, event: dict[str, Any]) -> None:
        if not await self._still_allowed():
            return
        await self.send_json({"type": "batch", "events": event["events"]})
        if any(e["kind"] != "rate" for e in event["events"]):
            self.moved.set()

    async def _refresh(self) -> None:
        """Send the counters again (a "state" message, when they changed) after each batch
        that may have moved them, and every IDLE_REFRESH_SECONDS."""
        reader = state_reader()
        while True:
            try:
                await asyncio.wait_for(self.moved.wait(), IDLE_REFRESH_SECONDS)
            except TimeoutError:
                pass
            self.moved.clear()
            try:
                state = state_for(await reader.read_after(time.monotonic()), self.topics)
            except Exception:  # noqa: BLE001 - a failed read (database away) is retried on the next wake
                log.warning("live: the counters could not be read", exc_info=True)
                continue
            if state == self.sent:
                continue
            if not await self._still_allowed():
                return
            self.sent = state
            try:
                await self.send_json({"type": "state", "state": state})
            except OSError:  # the browser went away before disconnect() stopped this task
                # (uvicorn's ClientDisconnected): nothing to send to, nothing to log
                return

    async def _still_allowed(self) -> bool:
        """The user still holds the topics' permissions (read again at most once per
        RECHECK_SECONDS); closes the socket with 4403 when not."""
        now = time.monotonic()
        if now - self.checked_at >= RECHECK_SECONDS:
            self.checked_at = now
            if not await self._check(self.scope["user"].pk):
                await self.close(code=CLOSE_FORBIDDEN)
                return False
        return True

    async def _check(self, user_id: int) -> bool:
        return await sync_to_async(self._allowed, thread_sensitive=False, executor=_checks)(user_id)

    def _allowed(self, user_id: int) -> bool:
        """A fresh read of the user (no permission cache) holds every topic's permission."""
        close_old_connections()
        try:
            user = get_user_model().objects.filter(pk=user_id).first()
            if user is None or not user.is_active:
                return False
            return all(user.has_perm(topic_permission(t)) for t in self.topics)
        finally:
            close_old_connections()
