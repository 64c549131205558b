"""Count the SQL statements the database driver executes, whatever sends them.

Django's query log (django_assert_num_queries, CaptureQueriesContext) only sees statements
sent through Django's cursor wrapper. On PostgreSQL the ingest hot paths send some on the raw
psycopg connection: steps_ingest's binary COPY (pool/bulk.py) and the proxy's one-statement
claim+insert statement (pool/sql.py), which the query log never shows. This counter
hooks the driver instead: psycopg's Cursor.execute/executemany/copy on PostgreSQL (one count
per call), sqlite3's trace callback on SQLite (one count per statement run).

Transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE) is not counted: a test runs
inside a transaction, so savepoints stand where production has BEGIN/COMMIT, and psycopg sends
BEGIN/COMMIT without a cursor. What is counted is the work: the statements a call costs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection

_TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)


@contextmanager
def sql_statements() -> Iterator[list[str]]:
    """Yield a list that collects the text of every statement executed in the block on the
    default connection (transaction control excluded; see the module docstring)."""
    seen: list[str] = []

    def record(sql: Any) -> None:
        text = sql.decode() if isinstance(sql, bytes) else str(sql)
        if not _TRANSACTION_CONTROL.match(text):
            seen.append(text)

    connection.ensure_connection()
    if connection.vendor == "postgresql":
        import psycopg

        originals = {name: psycopg.Cursor.__dict__[name] for name in ("execute", "executemany", "copy")}
        # The methods are patched on the class, for every thread: only this connection's
        # statements are the block's (the live flusher's thread reads group uids on its own
        # connection whenever its tick comes, which made counts depend on timing).
        raw = connection.connection

        def counted(original):
            def method(self, query, *args, **kwargs):
                if self.connection is raw:
                    record(query)
                return original(self, query, *args, **kwargs)

            return method

        for name, original in originals.items():
            setattr(psycopg.Cursor, name, counted(original))
        try:
            yield seen
        finally:
            for name, original in originals.items():
                setattr(psycopg.Cursor, name, original)
    else:
        raw = connection.connection
        raw.set_trace_callback(record)
        try:
            yield seen
        finally:
            raw.set_trace_callback(None)
