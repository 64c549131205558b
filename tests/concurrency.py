"""Helpers of the tests that race sessions against each other on PostgreSQL: a thread that
reports its exception instead of losing it, a wait on a condition with a deadline (never a
fixed sleep), and who waits on a lock now."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import connections


def started(fn: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """``fn`` running in a thread of its own, started: what it raises goes to ``errors``
    (the test asserts it empty), and its database connections are closed when it ends."""

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported through ``errors``
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_for(cond: Callable[[], object], what: str, deadline_s: float = 30) -> None:
    """Return once ``cond()`` is true; fail naming ``what`` after ``deadline_s`` seconds."""
    deadline = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def lock_waiters(table: str | None = None) -> int:
    """Sessions of this database waiting on a lock (on ``table``'s, when given), seen from a
    connection of its own (a transaction sees pg_stat_activity as it was when it first read
    it)."""
    conn = connections.create_connection("default")
    try:
        with conn.cursor() as cur:
            if table is None:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            else:
                cur.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "WHERE c.relname = %s AND NOT l.granted",
                    [table],
                )
            return cur.fetchone()[0]
    finally:
        conn.close()
