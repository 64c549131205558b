"""``__any``: membership in a list of values as ONE array parameter on PostgreSQL.

``Step.objects.filter(id__any=ids)`` is ``id = ANY(%s)`` with the list bound as one array on
PostgreSQL, and Django's ``__in`` elsewhere. ``__in`` binds one placeholder per value: for
the 1,000 ids of a snapshot chunk or a page of steps, psycopg spent more time splitting and
converting the query text (~13 ms per statement) than PostgreSQL spent answering it, and
every list length is a new statement text. Use it for id lists that can be long; ``__in``
stays right for a handful of values. An empty list matches nothing and, as with ``__in``,
runs no statement. Registered on every field by pool/apps.py.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject, Lookup
from django.db.models.lookups import In


class AnyOf(Lookup):
    lookup_name = "any"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        values = list(self.rhs)
        if not values:  # as __in: matches nothing, and Django runs no statement for it
            raise EmptyResultSet
        if connection.vendor != "postgresql":
            return In(self.lhs, values).as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s)", [*lhs_params, values]


def register() -> None:
    Field.register_lookup(AnyOf)
    ForeignObject.register_lookup(AnyOf)  # related fields keep their own lookup table
