"""The live dashboard's websocket (``ws/live/?topics=overview,collection``): a thin consumer.

It rejects anonymous users (close 4401) and users without the permission of a requested
topic (close 4403), joins the Channels groups ``live.<topic>`` (pool/live.py publishes
there), sends ``{"type": "hello", "state": ...}`` (curation/selectors_live.py) and then
forwards each coalesced batch as ``{"type": "batch", "events": [...]}``. Before forwarding,
the permissions are checked again against a fresh read of the user (at most once a second),
so a deactivated user or a removed permission closes the socket with 4403.

The socket is accepted before a rejection is sent, so a browser sees the close code (a
handshake refused before accept reaches the page as 1006 without a code).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.db import close_old_connections

from pool import live

from .selectors_live import live_state

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
# Permission re-checks run on their own thread: on the shared sync executor they would queue
# behind the HTTP requests of a busy server, and every batch waits for its check.
_checks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claw-live-perms")


def topic_permission(topic: str) -> str | None:
    if topic.startswith("snapshot.") and 9 < len(topic) <= 80:
        return TOPIC_PERMISSIONS["consumption"]
    return TOPIC_PERMISSIONS.get(topic)


class LiveConsumer(AsyncJsonWebsocketConsumer):
    topics: list[str]
    checked_at: float

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
        state = await database_sync_to_async(live_state)(self.topics)
        await self.send_json({"type": "hello", "state": state})

    async def disconnect(self, code: int) -> None:
        for topic in getattr(self, "topics", []):
            await self.channel_layer.group_discard(live.GROUP_PREFIX + topic, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The socket is one-way: client messages are ignored."""

    async def live_batch(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self.checked_at >= RECHECK_SECONDS:
            self.checked_at = now
            if not await self._check(self.scope["user"].pk):
                await self.close(code=CLOSE_FORBIDDEN)
                return
        await self.send_json({"type": "batch", "events": event["events"]})

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
