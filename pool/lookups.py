"""``__any``: membership in a list of values as ONE array parameter on PostgreSQL.

``Step.objects.filter(id__any=Many(ids))`` is ``id = ANY(%s)`` with the list bound as one
array on PostgreSQL, and Django's ``__in`` elsewhere. ``__in`` binds one placeholder per value: for
the 1,000 ids of a snapshot chunk or a page of steps, psycopg spent more time splitting and
converting the query text (~13 ms per statement) than PostgreSQL spent answering it, and
every list length is a new statement text. Use it for id lists that can be long; ``__in``
stays right for a handful of values. An empty list matches nothing and, as with ``__in``,
runs no statement. Registered on every field by pool/apps.py.

The values come wrapped in ``Many`` (or as a set): ``filter()`` resolves a list or a tuple
value by value before any lookup sees it (Query.resolve_lookup_value: ~2.3 us a value, 18 ms
for the 8,000 trajectories of a preview's sample, 2.3 ms for each 1,000-id chunk of
readiness), and leaves any other object alone. A bare list or tuple is refused (TypeError),
so a slow call site cannot come back unseen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject, Lookup
from django.db.models.lookups import In


class Many:
    """The values of an ``__any`` lookup, as one object Django does not look into."""

    __slots__ = ("values",)

    def __init__(self, values: Iterable[Any]) -> None:
        self.values = values if type(values) is list else list(values)

    def __iter__(self):
        return iter(self.values)

    def __repr__(self) -> str:
        return f"Many({self.values!r})"


def array_param(values: list[Any]) -> Any:
    """``values`` as the parameter of ``= ANY(%s)`` on a client-binding cursor (Django's):
    one array literal (``array_literal``: integers, strings...), which PostgreSQL reads as an
    array of the column's type (psycopg writes a list's literal value by value, ~0.8 us each:
    7 ms for 8,000 ids, four times what ``str.join`` takes; a string's quoting is a regular
    expression search each); values of other kinds as the list."""
    text = array_literal(values)
    return text if text is not None else values


def array_literal(values: Sequence[Any]) -> str | None:
    """``values`` as one PostgreSQL array literal (``CAST(%s AS type[])`` reads it as that
    type), or None when they are not all plain ints, floats, bools or strs (None among them
    as NULL): the caller passes the list then. Floats go by ``repr``, the shortest text that
    reads back as the same double; strings quoted and escaped. A column at a time, by its
    kind: ~4x faster than psycopg's literal of a list, written value by value."""
    kinds = set(map(type, values))
    if kinds == {int}:  # ids, the common case: str() in C for each
        return "{" + ",".join(map(str, values)) + "}"
    kinds.discard(type(None))
    if not kinds:
        text = map(_null, values)
    elif kinds == {int}:
        text = map(_int_text, values)
    elif kinds == {float}:
        text = map(_float_text, values)
    elif kinds == {str}:
        text = map(_str_text, values)
    elif kinds == {bool}:
        text = map(_bool_text, values)
    else:
        return None
    return "{" + ",".join(text) + "}"


def _null(v: None) -> str:
    return "NULL"


def _int_text(v: int | None) -> str:
    return "NULL" if v is None else str(v)


def _float_text(v: float | None) -> str:
    if v is None:
        return "NULL"
    return repr(v) if v - v == 0 else _SPECIAL[repr(v)]  # inf - inf and nan - nan are nan


def _str_text(v: str | None) -> str:
    return "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bool_text(v: bool | None) -> str:
    return "NULL" if v is None else ("t" if v else "f")


_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


class AnyOf(Lookup):
    lookup_name = "any"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        if isinstance(self.rhs, (list, tuple)):
            raise TypeError(
                f"{getattr(getattr(self.lhs, 'target', None), 'name', 'a field')}__any takes Many(values) or a set, "
                f"not a {type(self.rhs).__name__}: "
                "Django resolves a list value by value (pool/lookups.py)"
            )
        values = self.rhs.values if isinstance(self.rhs, Many) else list(self.rhs)
        if not values:  # as __in: matches nothing, and Django runs no statement for it
            raise EmptyResultSet
        if connection.vendor != "postgresql":
            return In(self.lhs, values).as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s)", [*lhs_params, array_param(values)]


def register() -> None:
    Field.register_lookup(AnyOf)
    ForeignObject.register_lookup(AnyOf)  # related fields keep their own lookup table
