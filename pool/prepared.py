"""Server-side prepared statements for the pool's hot raw SQL (PostgreSQL).

Django binds parameters on the client and never prepares (its default, for poolers in
transaction mode), so PostgreSQL parses and plans every statement every time. The write
path's raw statements are a few fixed texts keyed by ids, and planning is much of their cost
(the proxy's fused write: 0.3-0.5 ms of planning per call). They run on a server-binding cursor instead: psycopg prepares a
text the second time a connection runs it (``prepare_threshold`` in the database's OPTIONS,
set by ``CLAW_DB_PREPARE``, on by default) and later runs skip parse and plan; the pool's
connections keep their prepared statements across requests. Django's own cursors are left as
they are (a client-binding cursor never prepares), so ORM queries do not change.

Only texts that repeat belong here: one text whatever the batch size (ids as one array
parameter: ``sql._ids_in``, ``sql._rows``), their plans decided by primary or foreign keys,
so the generic plan PostgreSQL may settle on after five runs is the one it would pick anyway.
Not here: a statement whose best plan depends on how many ids it carries. The settle of
rewards and readiness (``sql.steps_settle``) plans in 1.5 ms for a one-step batch, but its
generic plan ran W-pool's 1,000-id readiness batches at 633 steps/s against 2,245 unprepared.
Nor the token-chain reads (pool/tokens.py): a pull or a snapshot reads thousands of chains
with them, and no benchmark has measured their generic plan.
Elsewhere (SQLite; CLAW_DB_PREPARE=0) ``cursor()`` is the connection's plain cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection as default_connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper


def enabled(conn: BaseDatabaseWrapper) -> bool:
    return conn.vendor == "postgresql" and conn.settings_dict["OPTIONS"].get("prepare_threshold") is not None


@contextmanager
def cursor(conn: BaseDatabaseWrapper | None = None) -> Iterator:
    """A cursor of ``conn`` (default: the default alias) whose statements PostgreSQL prepares
    once they repeat; Django's wrapper around it as around any cursor (its execute wrappers,
    error translation and query log see these statements like the others)."""
    conn = conn or default_connection
    if not enabled(conn):
        with conn.cursor() as cur:
            yield cur
        return
    from django.db.backends.postgresql.base import ServerBindingCursor

    with conn.wrap_database_errors:
        conn.ensure_connection()
        raw = ServerBindingCursor(conn.connection)
    conn.validate_thread_sharing()
    with _Logged(raw, conn) if conn.queries_logged else conn.make_cursor(raw) as cur:
        yield cur


class _Logged(CursorDebugWrapper):
    """Django's query log (DEBUG, CaptureQueriesContext) of these statements, with their
    parameters inlined as for any other cursor: Django reads the text back from the driver,
    which keeps none for a prepared statement."""

    def execute(self, sql, params=None):
        with self.debug_sql(self.db.ops.compose_sql(sql, params) if params else sql, params):
            return CursorWrapper.execute(self, sql, params)
