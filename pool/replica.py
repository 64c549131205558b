"""Reads from a PostgreSQL streaming replica (``DATABASE_REPLICA_URL``), chosen per read path.

With the setting, ``settings.DATABASES`` has a second alias, ``replica``: a hot standby that
replays the primary's WAL, so it holds what the primary held a moment ago (its lag). Nothing
reads from it unless a read path asks: the path runs inside ``replica_reads()`` (views use
``replica_view``, DRF handlers ``replica_handler``), and ``ReplicaRouter`` then sends the ORM's
reads there; raw SQL of such paths takes ``read_connection()``. Everything else stays on the
primary: every write (the router sends writes to ``default`` whatever the context), and every
read that must see a write already made: API-key lookups and sessions (read before a view
runs), leases and pulls, idempotency checks, a read-back of one object by its id, a read
inside a transaction of the primary. docs/operations.md has the table of read paths, and
tests/test_replica.py checks each one against a real replica.

Without the setting there is no ``replica`` alias: every function here answers ``default``,
the router has no opinion, and SQLite works as before.

A page served from the replica shows its lag (``replica_lag``, the ``replica`` context
processor). A job that must read what it has just committed from the replica (a snapshot's
steps, after their ids were frozen) waits for the replica to replay that far first
(``replica_caught_up``) and reads from the primary when it does not in time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest
from django.utils.functional import cached_property

REPLICA = "replica"
# Set while a read path that may read from the replica runs (per thread and per asyncio task:
# sync_to_async copies it into the thread it runs a view in).
_reads: ContextVar[bool] = ContextVar("claw_replica_reads", default=False)
# Set once a read of the path went to the replica: the page then shows the replica's lag.
_used: ContextVar[list[bool] | None] = ContextVar("claw_replica_used", default=None)


def replica_configured() -> bool:
    """Whether a replica alias exists (DATABASE_REPLICA_URL is set)."""
    return REPLICA in settings.DATABASES


@contextmanager
def replica_reads() -> Iterator[None]:
    """Inside the block, the ORM's reads (and ``read_connection()``) go to the replica when
    one is configured. Writes never do. Nests."""
    token = _reads.set(True)
    used_token = _used.set(_used.get() or [False])
    try:
        yield
    finally:
        _used.reset(used_token)
        _reads.reset(token)


def read_alias() -> str:
    """The alias this read path reads from now: ``replica`` inside ``replica_reads()`` with a
    replica configured, unless the primary is inside a transaction (a read there must see its
    writes); else ``default``."""
    if not _reads.get() or not replica_configured() or connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS
    used = _used.get()
    if used is not None:
        used[0] = True
    return REPLICA


def read_connection() -> BaseDatabaseWrapper:
    """The connection for a read path's raw SQL (the router covers the ORM)."""
    return connections[read_alias()]


class ReplicaRouter:
    """Django's database router (settings.DATABASE_ROUTERS): reads inside ``replica_reads()``
    go to the replica, when configured; writes always go to the primary; the replica is
    never migrated (it replays the primary's schema)."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        alias = read_alias()
        return alias if alias == REPLICA else None

    def db_for_write(self, model: type, **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # one database, two copies of it

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db != REPLICA


# --- read paths -------------------------------------------------------------------------------
def replica_view(view: Callable) -> Callable:
    """A page view whose reads may come from the replica: GET and HEAD requests run inside
    ``replica_reads()`` and their template is rendered there too; other methods (forms that
    write) run on the primary. Put it inside the access check, so the session and the user
    are read from the primary (a login is a write)."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method not in ("GET", "HEAD"):
            return view(request, *args, **kwargs)
        with replica_reads():
            response = view(request, *args, **kwargs)
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()  # a TemplateResponse reads its querysets when rendered
            return response

    return wrapped


def replica_handler(handler: Callable) -> Callable:
    """A DRF handler method (``get``) whose reads may come from the replica. DRF has
    authenticated the key, checked its scope and its rate before calling it (on the
    primary: a key just created must work)."""

    @wraps(handler)
    def wrapped(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        with replica_reads():
            return handler(self, request, *args, **kwargs)

    return wrapped


class ReplicaChangelist:
    """ModelAdmin mixin: the change list, on GET, is read from the replica (the admin site
    has checked the user on the primary before calling it) and rendered there; its actions
    (POST) and every other admin page run on the primary."""

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        if request.method not in ("GET", "HEAD"):
            return super().changelist_view(request, extra_context)  # type: ignore[misc]
        with replica_reads():
            response = super().changelist_view(request, extra_context)  # type: ignore[misc]
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()
            return response


# --- lag ------------------------------------------------------------------------------------
# Seconds the replica is behind: 0 while it has replayed all it received (an idle primary
# sends nothing, and the last replayed transaction's age is then no lag at all); NULL on a
# server that is not a standby.
_LAG_SQL = """
    SELECT CASE
        WHEN NOT pg_is_in_recovery() THEN NULL
        WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
        ELSE GREATEST(0, EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()))
    END
"""


def replica_lag() -> float | None:
    """Seconds the replica is behind the primary (0.0 when it has replayed everything it
    received), or None without a replica or when the server is not a standby."""
    if not replica_configured():
        return None
    with connections[REPLICA].cursor() as cur:
        cur.execute(_LAG_SQL)
        row = cur.fetchone()
    return None if row is None or row[0] is None else float(row[0])


class ReplicaStatus:
    """What a page shows about where it was read from (base.html's footer): ``used``, and
    ``lag`` (seconds; None when unknown). Read when the template gets to them, after the
    page's own reads, and from the replica itself."""

    def used(self) -> bool:
        return replica_used()

    @cached_property
    def lag(self) -> float | None:
        try:
            return replica_lag()
        except DatabaseError:
            return None


def replica_context(request: HttpRequest) -> dict[str, Any]:
    """Template context processor (settings.TEMPLATES): ``replica``, a ReplicaStatus."""
    return {"replica": ReplicaStatus()}


def replica_used() -> bool:
    """Whether a read of the current read path went to the replica."""
    used = _used.get()
    return bool(used and used[0])


def replica_caught_up(*, timeout: float) -> bool:
    """Wait until the replica has replayed everything the primary has written so far (its
    WAL position now), for at most ``timeout`` seconds. True when it has (or the replica is
    the primary's own data: no replica configured answers False, so callers read from the
    primary); False when it is still behind, or does not answer."""
    if not replica_configured():
        return False
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()")
            target = cur.fetchone()[0]
        deadline = time.monotonic() + timeout
        with connections[REPLICA].cursor() as cur:
            while True:
                cur.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target])
                if cur.fetchone()[0]:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)
    except DatabaseError:
        return False
