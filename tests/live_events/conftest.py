"""Live dashboard fixtures: a websocket client of the real ASGI application (session
cookie of a real login), and users with and without the dashboard's permissions."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from channels.db import database_sync_to_async as sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.db import close_old_connections
from django.test import Client

from pool import live

DEADLINE = 15.0  # seconds: the longest any condition is waited for


@pytest.fixture
def viewer(django_user_model):
    """A user holding the view permissions of the collection topics."""
    user = django_user_model.objects.create_user("viewer", password="pw-viewer")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_trajectory", "view_promptgroup"])
    )
    return user


@pytest.fixture
def nobody(django_user_model):
    return django_user_model.objects.create_user("nobody", password="pw-nobody")


@pytest.fixture(autouse=True)
def drained():
    """Events buffered by earlier tests are sent (to nobody) before the test starts, and the
    per-process source-name and group-uid caches are emptied: an earlier test's rolled-back
    Source or PromptGroup can leave its id to another one here (SQLite reuses a rolled-back
    id)."""
    live.flush_now()
    live._source_names.clear()
    live._group_uids.clear()
    yield


@pytest.fixture(autouse=True)
def own_channel_layer():
    """On Redis, each test's sockets get a channel layer of their own. The Redis layer keeps
    per-channel asyncio locks across calls, and pytest-asyncio gives each test its own event
    loop: a lock that a finished test's loop left held (a receive's backup cleaner that never
    ran because the loop closed first) is bound to that loop, and the next test's receive on
    the same layer raised "bound to a different event loop" (CI, about one run in four). A
    server runs one loop for its life and never meets this. The in-memory layer is kept: it
    holds the messages itself, and the publisher's thread must send into the one the
    consumers read."""
    from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers

    layer = channel_layers.backends.get(DEFAULT_CHANNEL_LAYER)
    if layer is not None and not isinstance(layer, InMemoryChannelLayer):
        del channel_layers.backends[DEFAULT_CHANNEL_LAYER]
    yield


def in_thread(fn: Callable) -> Callable:
    """``fn`` on a worker thread (database_sync_to_async), its connection given back when it
    returns. Without this a test-client request keeps its connection (Django disconnects
    close_old_connections from the request signals in tests) in the test's context, where
    database_sync_to_async, which closes connections outside the function's context, never
    sees it: on PostgreSQL it stays checked out of the pool, and the test database cannot be
    dropped at the end."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(run)


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@asynccontextmanager
async def socket(user=None, topics: str = "overview", *, cookie: str | None = None):
    """A connected websocket of ``user`` (anonymous when None) on ``ws/live/``. A test that
    opens a second socket while the first is connected passes the first's session ``cookie``
    (``session_cookie``, made before either connects): signing in again writes auth_user
    (last_login), which SQLite's shared-cache test database refuses ("table is locked")
    while the first socket's consumer reads it on another thread."""
    from claw_site.asgi import application

    headers = [(b"origin", b"http://localhost")]
    if user is not None or cookie is not None:
        if cookie is None:
            cookie = await sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    comm = WebsocketCommunicator(application, f"/ws/live/?topics={topics}", headers=headers)
    connected, _ = await comm.connect(timeout=DEADLINE)
    assert connected
    try:
        yield comm
    finally:
        await comm.disconnect()


async def until(comm: WebsocketCommunicator, done: Callable[[list[dict]], bool]) -> list[dict]:
    """Receive batches until ``done(events so far)``; fails at the deadline. Returns every
    event received, in order, each message's events tagged with its message number. The
    counters' "state" messages in between are skipped (``state_until`` waits for those)."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE
    n = 0
    while not done(events):
        left = deadline - time.monotonic()
        assert left > 0, f"condition not met by the deadline; got {events!r}"[:2000]
        msg = await comm.receive_json_from(timeout=left)
        if msg["type"] == "state":
            continue
        assert msg["type"] == "batch", msg
        n += 1
        events.extend(dict(e, message=n) for e in msg["events"])
    return events


def total(events: list[dict], kind: str, key: str = "count") -> int:
    return sum(e["data"][key] for e in events if e["kind"] == kind)


async def state_until(comm: WebsocketCommunicator, done: Callable[[dict], bool]) -> tuple[dict, list[dict]]:
    """Receive until a "state" message (the counters read again) whose state satisfies
    ``done``; fails at the deadline with the last state seen. Returns that state and the
    events of the batches received before it."""
    events: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    deadline = time.monotonic() + DEADLINE
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no state met the condition by the deadline; the last was {last!r}"[:2000]
        msg = await comm.receive_json_from(timeout=left)
        if msg["type"] == "batch":
            events.extend(msg["events"])
            continue
        assert msg["type"] == "state", msg
        last = msg["state"]
        if done(last):
            return last, events
