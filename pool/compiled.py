"""Compiled reads: a hot read's SQL built by the ORM once per shape, then run with new values.

Django compiles a queryset on every evaluation: resolving its lookups, subqueries and joins
costs 0.5-3 ms of Python a statement, more than PostgreSQL takes to answer most of the
pool's indexed reads (a pull's two ready-queue reads, each with two anti-join subqueries:
~7 ms of Python, 2 ms in the database). A compiled read builds its queryset with stand-in
values, finds where each lands among the SQL's parameters, and from then on runs that text
with the real values on the database the ORM would use (the router's: the replica inside
``replica_reads``), the rows converted as Django converts them.

    rows = compiled.read(_queue_read(kind, limit=16), consumer_id=who.id, after=at)

``build(**values)`` returns a queryset (``values_list`` rows); every value must reach the
SQL as a parameter, untouched. A read's shape is its build (a module-level function), or,
for what the ORM writes into the text (which model, a slice's bounds), the arguments of a
``shaped`` family of builds (``_queue_read(kind, limit=16)`` above). A value that is None, a
bool or an empty ``Many`` is added to the shape by ``read`` itself (the ORM writes ``IS NULL``
for None, no statement for an empty ``Many``; a bool is too likely to choose a branch), and
so is every other value's type. A ``Many`` of ids (an ``__any`` lookup) is one parameter like any other value. A
shape whose stand-ins do not each land as a parameter at the same places in two builds is
never compiled: that shape is always built (the ORM's answer, never a wrong one).

PostgreSQL only (the scale-out database); elsewhere every read is built. At most
``MAX_TEMPLATES`` are kept per process (then the cache starts again: a pull's slice bound
varies with what it still wants). With
``CLAW_COMPILED_CHECK`` (the test settings) each read is also built and must give the
template's text and parameters, so every test that passes through a compiled read checks it.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet, ValidationError
from django.db import connection, connections, router
from django.db.models import QuerySet

from .lookups import Many, array_param

Build = Callable[..., QuerySet]

_UNCOMPILABLE = object()
MAX_TEMPLATES = 2000
_templates: dict[Hashable, Any] = {}
_serial = itertools.count(1)


@dataclass(frozen=True, slots=True)
class _Template:
    sql: str
    params: tuple[Any, ...]  # the constants; a value's place holds None
    # (parameter index, value name, how the ORM made it a parameter: psycopg's Int8 for a
    # bigint column, int/float/str for a plain one, array_param for Many (an ``__any``
    # lookup), or None: as it is)
    slots: tuple[tuple[int, str, Callable[[Any], Any] | None], ...]
    compiler: Any  # the build's compiler: its converters for the rows
    model: type
    using: str | None  # the queryset's own database (``using()``), or None: the router's
    for_write: bool  # routed as a write (``select_for_update``), as QuerySet.db does

    def alias(self) -> str:
        """The database the ORM would read from now (the replica inside replica_reads)."""
        if self.using is not None:
            return self.using
        if self.for_write:
            return router.db_for_write(self.model)
        return router.db_for_read(self.model)

    def bind(self, values: dict[str, Any]) -> list[Any]:
        params = list(self.params)
        for i, name, wrap in self.slots:
            value = values[name]
            params[i] = value if wrap is None else wrap(value)
        return params

    def rows(self, fetched: list[tuple]) -> list[tuple]:
        """Rows as the ORM returns them: the columns it selected only for its ordering
        dropped, each value through the field's converter."""
        c = self.compiler
        if c.has_extra_select:
            fetched = [r[: c.col_count] for r in fetched]
        return [tuple(r) for r in c.results_iter(results=[fetched])]


def shaped(make: Callable[..., Build]) -> Callable[..., Build]:
    """A family of builds: ``make(*args, **kwargs)`` returns the build of one shape (a
    closure over them), and that shape is ``make`` with those arguments."""

    @functools.wraps(make)
    def of(*args: Hashable, **kwargs: Hashable) -> Build:
        build = make(*args, **kwargs)
        build.shape = (make, args, tuple(sorted(kwargs.items())))  # type: ignore[attr-defined]
        return build

    return of


def read(build: Build, /, **values: Any) -> list[tuple]:
    """The rows of ``build(**values)``: its SQL compiled once per shape (the build, a
    ``shaped`` family's arguments, and what the values decide: ``_shape_of``), then run
    with ``values``."""
    if connection.vendor != "postgresql":
        return [tuple(r) for r in build(**values)]
    key = (getattr(build, "shape", build), tuple((name, _shape_of(v)) for name, v in sorted(values.items())))
    template = _templates.get(key)
    if template is None:
        if len(_templates) >= MAX_TEMPLATES:
            _templates.clear()
        template = _templates[key] = _compile(build, values)
    if template is _UNCOMPILABLE:
        return [tuple(r) for r in build(**values)]
    params = template.bind(values)
    if settings.CLAW_COMPILED_CHECK:
        _check(template, params, build, values)
    with connections[template.alias()].cursor() as cur:
        cur.execute(template.sql, params)
        return template.rows(cur.fetchall())


def _shaping(value: Any) -> bool:
    """A value that decides the statement's text: None (``IS NULL``), a bool (likely a
    branch), an empty Many (no statement at all: the ORM knows no row matches)."""
    return value is None or type(value) is bool or (type(value) is Many and not value.values)


def _shape_of(value: Any) -> Any:
    """What a value adds to its read's shape: itself where it decides the text, else its type
    (the ORM prepares a str for a uuid column as a UUID, an int as an int)."""
    if type(value) is Many:
        return "empty Many" if not value.values else Many
    return value if _shaping(value) else type(value)


def _compile(build: Build, values: dict[str, Any]) -> _Template | object:
    """The template of ``build``'s shape, or _UNCOMPILABLE when its stand-ins do not each land
    as one parameter at the same places in two builds."""
    found = []
    for _ in range(2):
        stands = {name: _stand(v) for name, v in values.items() if not _shaping(v)}
        if None in stands.values():
            return _UNCOMPILABLE
        try:
            qs = build(**{name: stands.get(name, v) for name, v in values.items()})
            compiler = qs.query.get_compiler(connection=connection)
            sql, params = compiler.as_sql()
        except EmptyResultSet:  # no statement (an empty Many): the ORM answers it
            return _UNCOMPILABLE
        except (ValueError, TypeError, ValidationError):
            # A stand-in the field refuses (a str where a uuid column wants a UUID's text):
            # the ORM builds this shape with the real values, and refuses bad ones itself.
            return _UNCOMPILABLE
        slots = []
        for i, p in enumerate(params):
            for name, v in stands.items():
                if type(v) is Many:
                    if p == array_param(v.values):
                        slots.append((i, name, _many_param))
                        break
                elif isinstance(p, type(v)) and p == v:
                    # As the ORM prepares it: in its own wrapper type (Int8), or as the plain
                    # type (an IntegerChoices member is an int: psycopg writes an Enum by name).
                    plain = type(v) in (int, float, str)
                    slots.append(
                        (i, name, type(p) if type(p) is not type(v) else (type(v) if plain else None))
                    )
                    break
        if {name for _, name, _ in slots} != set(stands):
            return _UNCOMPILABLE  # a value was converted, or never reached the SQL
        slots_at = {i for i, _, _ in slots}
        constants = tuple(None if i in slots_at else p for i, p in enumerate(params))
        found.append(_Template(sql, constants, tuple(slots), compiler, qs.model, qs._db, qs._for_write))
    a, b = found
    if (a.sql, a.params, a.slots, a.using, a.for_write) != (b.sql, b.params, b.slots, b.using, b.for_write):
        return _UNCOMPILABLE
    return a


def _stand(value: Any) -> Any:
    """A stand-in of ``value``'s type, unlike any constant of a read (and no two alike).
    Integers stay positive 32-bit: the ORM drops a comparison whose value lies outside its
    column's range (an integer below a positive column's 0 is never true), and the stand-in
    would then be missing from the SQL."""
    n = next(_serial) % 100_000_000
    if type(value) is Many:
        return Many([2_000_000_000 + n])  # as ids: array_param writes the literal "{n}"
    if isinstance(value, uuid.UUID):
        return uuid.UUID(int=(1 << 127) + n)
    if isinstance(value, int):
        return 2_000_000_000 + n
    if isinstance(value, float):
        return -1e300 - n * 1e285
    if isinstance(value, dt.datetime):
        return dt.datetime(1, 1, 1, tzinfo=value.tzinfo) + dt.timedelta(microseconds=n)
    if isinstance(value, str):
        return f"\x1fcompiled-stand-{n}"
    return None  # any other type (a date, a list...): the read is never compiled


def _many_param(value: Many) -> Any:
    return array_param(value.values)


def _check(template: _Template, params: list[Any], build: Build, values: dict[str, Any]) -> None:
    sql, expected = build(**values).query.sql_with_params()
    if (sql, list(expected)) != (template.sql, params):
        raise AssertionError(
            f"compiled read differs from its build:\n{template.sql}\n{params}\n--- built:\n{sql}\n{expected}"
        )
