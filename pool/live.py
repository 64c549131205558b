"""Live events: the one notifier behind the dashboard's websocket (curation/consumers.py).

Events are typed (pool/live_payloads.py) and sent only by effects registered for the pool's
writes (the builders at the end of this module, registered in pool/apps.py; curation's in
curation/events.py): ``send(event, topics=...)``, or ``publish(kind, data, topics=...)``
under it. Inside a transaction an event waits for the commit with
``transaction.on_commit``; a rolled-back write publishes nothing. It only appends to a process-local buffer under a lock: a few
microseconds, whatever the channel layer. A daemon flusher thread (started on the first
publish, restarted after a fork) wakes every ``CLAW_LIVE_TICK_MS`` (100 ms), coalesces the
buffer per topic and kind, and sends at most one message per topic per tick to the Channels
group ``live.<topic>``: ``{"type": "live.batch", "events": [{"kind", "data"}, ...]}``.

Coalescing (``_merge``): counts add up exactly; lists keep the latest entries (``steps``:
the last 50 trajectories touched and the last 20 steps; other item lists the last 50);
``snapshot`` keeps the latest state per snapshot id. While steps flow, the flusher also
emits ``rate`` (steps per second of this process) once a second.

Every event also goes to the ``overview`` topic. Layers: with the in-memory layer (one
process, no Redis) events can only reach consumers of this process, so the flusher hands the
batch to the event loop a consumer attached (``attach_loop``) and drops it when none did:
nobody connected costs one swap of the buffer per tick. With Redis (REDIS_URL) any process
(web, Celery worker) publishes to the shared layer from the flusher's own event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Sum

from .bus import (
    FeedbackRecorded,
    GroupsReady,
    MergeDone,
    RewardsSet,
    StepsWritten,
    TrajectoriesEnded,
)
from .live_payloads import LiveEvent, MergeItem, StepItem, TrajectoryItem
from .models import PromptGroup, Source, Trajectory

log = logging.getLogger(__name__)

TOPICS = ("overview", "collection", "steps", "curation", "optimization", "consumption")
GROUP_PREFIX = "live."
RECENT_STEPS = 20  # steps.recent: the last N steps
RECENT_ITEMS = 50  # steps.trajectories and every other item list: the last N entries

# Topics of each kind besides "overview" (which gets everything).
KIND_TOPICS: dict[str, tuple[str, ...]] = {
    "steps": ("collection", "steps"),
    "trajectories.completed": ("collection", "steps", "curation"),
    "rate": ("collection", "steps"),
    "rewards": ("collection", "curation"),
    "feedback": ("curation",),
    "readiness": ("curation", "consumption"),
    "merge": ("optimization",),
    "snapshot": ("consumption",),
    "lease": ("consumption",),
}

_lock = threading.Lock()
_buffer: list[tuple[str, dict[str, Any], tuple[str, ...]]] = []
_flusher: _Flusher | None = None
_pid = 0
_consumer_loop: asyncio.AbstractEventLoop | None = None


def publish(kind: str, data: dict[str, Any], *, topics: tuple[str, ...] | None = None) -> None:
    """Queue one event for the live dashboard; after the commit when inside a transaction.
    Never raises and never blocks on the network (the flusher sends). ``topics``: defaults
    to the kind's topics (KIND_TOPICS); "overview" is always added."""
    if not getattr(settings, "CLAW_LIVE", True):
        return
    chosen = ("overview", *(KIND_TOPICS.get(kind, ()) if topics is None else topics))
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _push(kind, data, chosen))
    else:
        _push(kind, data, chosen)


def send(event: LiveEvent, *, topics: tuple[str, ...] | None = None) -> None:
    """``publish`` a typed event (pool/live_payloads.py)."""
    publish(event["kind"], event["data"], topics=topics)  # type: ignore[arg-type]


def attach_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A consumer of this process runs on ``loop``: the in-memory layer's sends go there."""
    global _consumer_loop
    _consumer_loop = loop


def flush_now(timeout: float = 5.0) -> None:
    """Send what is buffered now (tests and shutdown); returns when it was handed over."""
    f = _ensure_flusher()
    f.wake.set()
    done = f.flushed
    deadline = time.monotonic() + timeout
    while f.flushed == done and time.monotonic() < deadline:
        time.sleep(0.005)


def _push(kind: str, data: dict[str, Any], topics: tuple[str, ...]) -> None:
    with _lock:
        _buffer.append((kind, data, topics))
    if _flusher is None or _pid != os.getpid():
        _ensure_flusher()


def _ensure_flusher() -> _Flusher:
    global _flusher, _pid
    with _lock:
        if _flusher is None or _pid != os.getpid():  # first publish, or a forked child
            _pid = os.getpid()
            _flusher = _Flusher(getattr(settings, "CLAW_LIVE_TICK_MS", 100) / 1000)
            _flusher.start()
        return _flusher


def _take() -> list[tuple[str, dict[str, Any], tuple[str, ...]]]:
    global _buffer
    with _lock:
        taken, _buffer = _buffer, []
    return taken


class _Flusher(threading.Thread):
    def __init__(self, tick: float) -> None:
        super().__init__(name="claw-live-flusher", daemon=True)
        self.tick = tick
        self.wake = threading.Event()
        self.flushed = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.rate_steps = 0
        self.rate_since = time.monotonic()
        self.rate_shown = False

    def run(self) -> None:
        while True:
            self.wake.wait(self.tick)
            self.wake.clear()
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - live events are best effort; never kill the thread
                log.exception("live: a batch was dropped")
            self.flushed += 1

    def flush(self) -> None:
        raw = _take()
        for kind, data, _topics in raw:
            if kind == "steps":
                self.rate_steps += data.get("count", 0)
        now = time.monotonic()
        if now - self.rate_since >= 1.0:
            if self.rate_steps or self.rate_shown:  # while steps flow, and one 0 after they stop
                rate = round(self.rate_steps / (now - self.rate_since), 1)
                raw.append(("rate", {"steps_per_s": rate}, ("overview", *KIND_TOPICS["rate"])))
                self.rate_shown = bool(self.rate_steps)
            self.rate_steps, self.rate_since = 0, now
        if not raw:
            return
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        if isinstance(layer, InMemoryChannelLayer) and (_consumer_loop is None or _consumer_loop.is_closed()):
            return  # nobody connected to this process: nothing to deliver
        name_groups(raw)
        batches = coalesce(raw)
        self.send(
            layer,
            [(GROUP_PREFIX + topic, {"type": "live.batch", "events": events}) for topic, events in batches],
        )

    def send(self, layer: Any, messages: list[tuple[str, dict[str, Any]]]) -> None:
        from channels.layers import InMemoryChannelLayer

        if isinstance(layer, InMemoryChannelLayer):
            loop = _consumer_loop
            if loop is None or loop.is_closed():
                return
            # Not waited for: a consumer loop that stopped (a finished test) must not stall us.
            asyncio.run_coroutine_threadsafe(_send_all(layer, messages), loop).add_done_callback(_logged)
            return
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(_send_all(layer, messages))


def _logged(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("live: a batch was dropped: %r", future.exception())


async def _send_all(layer: Any, messages: list[tuple[str, dict[str, Any]]]) -> None:
    for group, message in messages:
        await layer.group_send(group, message)


# --- coalescing --------------------------------------------------------------------------------
def coalesce(raw: Iterable[tuple[str, dict[str, Any], tuple[str, ...]]]) -> list[tuple[str, list[dict]]]:
    """One event list per topic: events of one kind merged into one (``snapshot``: one per
    snapshot id), in the order each kind first appeared."""
    per_topic: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, data, topics in raw:
        key = f"snapshot:{data.get('id')}" if kind == "snapshot" else kind
        for topic in topics:
            merged = per_topic.setdefault(topic, {})
            current = merged.get(key)
            merged[key] = {"kind": kind, "data": data} if current is None else _merge(kind, current, data)
    return [(topic, list(merged.values())) for topic, merged in per_topic.items()]


def _merge(kind: str, current: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    old = current["data"]
    if kind == "snapshot":
        data = new
    elif kind == "steps":
        by_source = dict(old["by_source"])
        for name, n in new["by_source"].items():
            by_source[name] = by_source.get(name, 0) + n
        trajs = {t["uid"]: t for t in old["trajectories"]}
        for t in new["trajectories"]:
            trajs.pop(t["uid"], None)
            trajs[t["uid"]] = t
        data = {
            "count": old["count"] + new["count"],
            "by_source": by_source,
            "drift": old["drift"] + new["drift"],
            "trajectories": list(trajs.values())[-RECENT_ITEMS:],
            "recent": (old["recent"] + new["recent"])[-RECENT_STEPS:],
        }
    elif kind == "rate":
        data = new
    else:  # counts add up, item lists keep the latest
        data = dict(old)
        for name, value in new.items():
            if name == "items":
                data["items"] = (old.get("items", []) + value)[-RECENT_ITEMS:]
            elif isinstance(value, int | float) and not isinstance(value, bool):
                data[name] = old.get(name, 0) + value
            else:
                data[name] = value
    return {"kind": kind, "data": data}


# --- prompt groups by uid -------------------------------------------------------------------------
# Live items name a prompt group by its uid, as the pages and the API do. The services only
# know its id, and a query per write would cost the write path a statement, so a builder
# leaves the id under GROUP_ID and the flusher names the groups of a whole tick at once, after
# the commit (so a uid cached here belongs to a committed group): one query per tick for
# groups it has not seen, none when nobody listens.
GROUP_ID = "_group_id"
GROUP_UIDS_CACHED = 10_000  # uids remembered per process (then forgotten at once); uids never change
_group_uids: dict[int, str] = {}


def name_groups(raw: Iterable[tuple[str, dict[str, Any], tuple[str, ...]]]) -> None:
    """Replace the GROUP_ID of every trajectory item of these events by ``group``, the group's
    uid (None without a group, or when the database cannot be read: the event still goes)."""
    items = {  # by identity: one write's completed trajectory is in both of its events
        id(item): item
        for kind, data, _topics in raw
        if kind in ("steps", "trajectories.completed")
        for item in data["trajectories" if kind == "steps" else "items"]
        if GROUP_ID in item
    }
    missing = {item[GROUP_ID] for item in items.values()} - {None} - _group_uids.keys()
    if missing:
        _group_uids_read(missing)
    for item in items.values():
        group_id = item.pop(GROUP_ID)
        item["group"] = _group_uids.get(group_id) if group_id is not None else None


GROUP_UIDS_READ_TRIES = 20  # a table locked by a writer (SQLite) is free again within milliseconds
GROUP_UIDS_RETRY_S = 0.01


def _group_uids_read(ids: set[int]) -> None:
    for attempt in range(1, GROUP_UIDS_READ_TRIES + 1):
        try:
            found = dict(PromptGroup.objects.filter(id__in=ids).values_list("id", "uid"))
            break
        except DatabaseError:
            if attempt == GROUP_UIDS_READ_TRIES:
                log.warning("live: prompt group uids could not be read", exc_info=True)
                return
            # SQLite answers "database table is locked" while a writer holds the table (its
            # shared-cache test database does not wait); the flusher's thread waits a little
            # and reads again rather than sending the group as unknown.
            time.sleep(GROUP_UIDS_RETRY_S * attempt)
        finally:
            # The flusher keeps no connection between ticks: none to go stale, and none to
            # hold a database (a test database being dropped) open.
            connection.close()
    if len(_group_uids) + len(found) > GROUP_UIDS_CACHED:
        _group_uids.clear()
    _group_uids.update(found)


# --- event builders (called by the services) ----------------------------------------------------
_source_names: dict[int, str] = {}


def source_name(source_id: int | None) -> str:
    """The name of a source, cached per process (sources are few and never renamed by the
    write path): one query the first time an id is seen."""
    if source_id is None:
        return ""
    name = _source_names.get(source_id)
    if name is None:
        name = Source.objects.filter(id=source_id).values_list("name", flat=True).first() or ""
        _source_names[source_id] = name
    return name


def trajectory_item(
    *, uid: str, source: str, channel: str, status: str, step_count: int, group_id: int | None
) -> TrajectoryItem:
    """One trajectory of a live event (``steps``' trajectories, ``trajectories.completed``'s
    items): uid, source, channel, status, step_count and group (its uid, named by the
    flusher)."""
    item: Any = {
        "uid": uid,
        "source": source,
        "channel": channel,
        "status": status,
        "step_count": step_count,
        GROUP_ID: group_id,
    }
    return item


def steps_written(written: StepsWritten) -> None:
    """The ``steps`` event of one write, from the effects' record: one publish per write, no
    query but the first sight of a source."""
    steps = written.steps
    source = source_name(written.source_id)
    drift = 0
    end: dict[int, int] = {}
    ended: set[int] = set()
    for s in steps:
        drift += s.drift
        if s.step_index >= end.get(s.trajectory_id, 0):
            end[s.trajectory_id] = s.step_index + 1
        if s.is_last:
            ended.add(s.trajectory_id)
    trajectories = []
    for tid, n in end.items():
        t = written.trajectories[tid]
        trajectories.append(
            trajectory_item(
                uid=t.uid,
                source=source,
                channel=written.channel,
                status="completed" if tid in ended else ("ended" if t.ended else "running"),
                step_count=n,
                group_id=t.group_id,
            )
        )
    uid_of = {t.id: t.uid for t in written.trajectories.values()}
    recent: list[StepItem] = [
        {
            "id": s.id,
            "uid": s.uid,
            "trajectory": uid_of[s.trajectory_id],
            "step_index": s.step_index,
            "source": source,
            "token_source": s.token_source,
            "drift": s.drift,
            "prompt_len": s.prompt_len,
            "response_len": s.response_len,
        }
        for s in steps[-RECENT_STEPS:]
    ]
    send(
        {
            "kind": "steps",
            "data": {
                "count": len(steps),
                "by_source": {source: len(steps)},
                "drift": drift,
                "trajectories": trajectories[-RECENT_ITEMS:],
                "recent": recent,
            },
        }
    )


def trajectories_ended(event: TrajectoriesEnded) -> None:
    """The ``trajectories.completed`` event of the trajectories a write ended (not the late
    last steps of ended ones). No query but the first sight of a source."""
    items = [
        trajectory_item(
            uid=t.uid,
            source=source_name(t.source_id),
            channel=t.channel,
            status=t.status,
            step_count=t.step_count,
            group_id=t.group_id,
        )
        for t in event.trajectories
        if t.just_ended
    ]
    if items:
        send(
            {"kind": "trajectories.completed", "data": {"count": len(items), "items": items[-RECENT_ITEMS:]}}
        )


def rewards_set(event: RewardsSet) -> None:
    """The ``rewards`` event: how many rewards a write applied."""
    send({"kind": "rewards", "data": {"count": event.count}})


def feedback_recorded(event: FeedbackRecorded) -> None:
    """The ``feedback`` event: one feedback recorded."""
    send({"kind": "feedback", "data": {"count": 1}})


def groups_ready(event: GroupsReady) -> None:
    """The ``readiness`` event for the groups that become ready now (two small reads, only
    when some group is ready; run before their ``ready_at`` is written)."""
    newly = list(
        PromptGroup.objects.filter(id__in=event.group_ids, ready_at__isnull=True).values_list("id", flat=True)
    )
    if newly:
        steps = Trajectory.objects.filter(group_id__in=newly, status=Trajectory.Status.COMPLETED).aggregate(
            n=Sum("step_count")
        )["n"]
        send({"kind": "readiness", "data": {"ready_steps": steps or 0, "ready_groups": len(newly)}})


def merge_done(event: MergeDone) -> None:
    """The ``merge`` event of a group's stored merge."""
    item: MergeItem = {
        "group": event.group_uid,
        "group_id": event.group_id,
        "tokens": event.tokens,
        "tokens_saved": event.tokens_saved,
    }
    send({"kind": "merge", "data": {"items": [item]}})
