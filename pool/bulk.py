"""Bulk row insertion for the ingest hot path.

On PostgreSQL, rows are written with binary COPY: ids are reserved from the table's identity
sequence in one round trip, then the rows stream through ``COPY ... FROM STDIN (FORMAT
BINARY)`` inside the caller's transaction. Django's bulk_create builds one multi-row INSERT
whose client-side parameter binding cost ~1 ms per W-ingest step (pyinstrument); binary COPY
is the database's own fast path and sends bytea as raw bytes. Elsewhere (SQLite) it falls
back to bulk_create, which is fast there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import psycopg
from django.db import IntegrityError, connection, models
from django.db.models.base import ModelState
from django.utils import timezone
from psycopg.types.json import Jsonb

_plans: dict[
    type[models.Model], tuple[str, str, list[str], list[tuple[str, Callable[[Any], Any] | None]]]
] = {}


def insert_rows(model: type[models.Model], objs: Sequence[models.Model]) -> None:
    """Insert ``objs`` and set their primary keys. Must run inside transaction.atomic."""
    if not objs:
        return
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create(objs, batch_size=500)
        return
    table, seq, pg_types, getters = _plan(model)
    with connection.cursor() as cur:
        cur.execute("SELECT nextval(%s) FROM generate_series(1, %s)", [seq, len(objs)])
        ids = [row[0] for row in cur.fetchall()]
    now = timezone.now()
    columns = ", ".join(connection.ops.quote_name(f.column) for f in model._meta.concrete_fields)
    raw = connection.connection  # the psycopg connection of Django's (atomic) transaction
    try:
        _copy_rows(raw, table, columns, pg_types, getters, objs, ids, now)
    except psycopg.errors.IntegrityError as exc:
        # Raw psycopg errors bypass Django's wrapper; callers (and their retries) expect this.
        raise IntegrityError(str(exc)) from exc
    for obj in objs:
        obj._state.adding = False
        obj._state.db = connection.alias


def _copy_rows(raw, table, columns, pg_types, getters, objs, ids, now) -> None:
    with raw.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(pg_types)
        for obj, pk in zip(objs, ids, strict=True):
            obj.pk = pk
            row = []
            for attname, conv in getters:
                if conv is _NOW:
                    setattr(obj, attname, now)
                    row.append(now)
                    continue
                value = getattr(obj, attname)
                row.append(conv(value) if conv is not None and value is not None else value)
            copy.write_row(row)


def new_instance(model: type[models.Model], values: dict[str, Any]) -> models.Model:
    """Build an unsaved instance from attname -> value without Model.__init__ (which costs
    ~30 us per row through its kwargs handling). Every concrete field not in ``values`` gets its
    default; the primary key and auto_now columns are filled by insert_rows."""
    obj = model.__new__(model)
    obj._state = ModelState()
    d = obj.__dict__
    for f in model._meta.concrete_fields:
        if f.attname in values:
            d[f.attname] = values[f.attname]
        else:
            d[f.attname] = None if f.primary_key or getattr(f, "auto_now_add", False) else f.get_default()
    return obj


def _NOW(value: Any) -> Any:  # marker: auto_now / auto_now_add columns
    return value


def column_converter(field: models.Field) -> Callable[[Any], Any] | None:
    """How a non-NULL attribute value becomes a psycopg parameter for ``field``'s column
    (JSON as jsonb serialised with orjson, binary as bytes), or None when it goes as is.
    Shared by the COPY path here and the proxy's one-statement insert."""
    if isinstance(field, models.JSONField):
        return _json
    if isinstance(field, models.BinaryField):
        return _bytes
    return None


def _json(value: Any) -> Any:
    return Jsonb(value, dumps=_orjson_dumps)


def _orjson_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _bytes(value: Any) -> bytes:
    return bytes(value)


def _plan(model: type[models.Model]):
    plan = _plans.get(model)
    if plan is not None:
        return plan
    meta = model._meta
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_serial_sequence(%s, %s)", [meta.db_table, meta.pk.column])
        seq = cur.fetchone()[0]
    pg_types: list[str] = []
    getters: list[tuple[str, Callable[[Any], Any] | None]] = []
    for f in meta.concrete_fields:
        db_type = f.rel_db_type(connection) if f.is_relation else f.db_type(connection)
        pg_types.append(re.sub(r"\(.*\)", "", db_type or "text").strip())
        auto_now = getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        getters.append((f.attname, _NOW if auto_now else column_converter(f)))
    plan = _plans[model] = (connection.ops.quote_name(meta.db_table), seq, pg_types, getters)
    return plan
