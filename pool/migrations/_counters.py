"""The SQL of the pool's counters (pool.models.Counter), for the migrations that install them.

Frozen with the migrations: a later change to what is counted writes a new migration that
calls ``install`` with the new definitions (which replaces the functions and recounts), never
edits one here that a migration already used.

Each counting of a table gets one PL/pgSQL function and three statement-level AFTER
triggers (INSERT, UPDATE, DELETE: PostgreSQL allows transition tables on one event per
trigger). The function aggregates the statement's transition tables, the new rows counted
+1 and the old rows -1, and appends one ``pool_counter`` row per counter (and key: a
source, a minute) whose count changed.
Every write reaches them, whatever its path (the pipeline's COPY, a reward UPDATE, a
retention DELETE, the admin, a manual psql session), and in the write's own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

# (name, kind, SQL over the table's row ``r``): kind "count" counts the rows where the
# expression holds, "sum" sums it, "max" keeps its largest value among new rows (deletes do
# not lower it: a source's "last seen" is when it was last seen).
Definition = tuple[str, str, str]


@dataclass(frozen=True)
class Counted:
    table: str
    columns: tuple[str, ...]  # the columns the definitions read
    definitions: tuple[Definition, ...]
    # What the counters are kept per (``pool_counter.key``), an SQL expression over the row
    # ``r``: a source id, a minute; None: pool-wide (NULL).
    key: str | None = None
    # The function's name (one per table unless a table has two countings).
    name: str = ""
    # UPDATE: count only the rows where this holds, over the old row ``o`` and the new ``n``
    # joined by id (plain column names only); None: every row of the statement.
    changed: str | None = None
    # The rows the first count reads (a WHERE over the table); None: all of them.
    since: str | None = None

    @property
    def function(self) -> str:
        return f"pool_count_{self.name or self.table}"


def _aggregate(kind: str, expr: str) -> str:
    if kind == "count":
        return f"sum(r.sign) FILTER (WHERE {expr})"
    if kind == "sum":
        return f"sum(r.sign * ({expr}))::bigint"
    if kind == "max":
        return f"max({expr}) FILTER (WHERE r.sign = 1)"
    raise ValueError(kind)


def _statement(counted: Counted, rows: list[str]) -> str:
    """INSERT the deltas of ``rows`` (SELECTs of a sign and the columns) into pool_counter."""
    union = " UNION ALL ".join(rows)
    key = counted.key or "NULL::bigint"
    aggs = ", ".join(f"{_aggregate(kind, expr)} AS c{i}" for i, (_n, kind, expr) in enumerate(counted.definitions))
    values = ", ".join(f"('{name}', a.c{i})" for i, (name, _k, _e) in enumerate(counted.definitions))
    group = " GROUP BY 1" if counted.key else ""
    return (
        'INSERT INTO pool_counter (name, "key", value) SELECT c.name, a.k, c.value FROM '
        f"(SELECT {key} AS k, {aggs} FROM ({union}) r{group}) a "
        f"CROSS JOIN LATERAL (VALUES {values}) AS c(name, value) WHERE c.value <> 0"
    )


def _rows(counted: Counted, relation: str, sign: int, where: str | None = None) -> str:
    cols = ", ".join(counted.columns)
    return f"SELECT {sign} AS sign, {cols} FROM {relation}" + (f" WHERE {where}" if where else "")


def _updated(counted: Counted) -> list[str]:
    if counted.changed is None:
        return [_rows(counted, "new_rows", 1), _rows(counted, "old_rows", -1)]
    joined = f"new_rows n JOIN old_rows o USING (id) WHERE {counted.changed}"
    return [
        f"SELECT {sign} AS sign, " + ", ".join(f"{alias}.{c}" for c in counted.columns) + f" FROM {joined}"
        for alias, sign in (("n", 1), ("o", -1))
    ]


def _function(counted: Counted) -> str:
    name, table = counted.function, counted.table
    return f"""
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_statement(counted, [_rows(counted, "new_rows", 1)])};
    ELSIF TG_OP = 'UPDATE' THEN
        {_statement(counted, _updated(counted))};
    ELSE
        {_statement(counted, [_rows(counted, "old_rows", -1)])};
    END IF;
    RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS {name}_insert ON {table};
DROP TRIGGER IF EXISTS {name}_update ON {table};
DROP TRIGGER IF EXISTS {name}_delete ON {table};
CREATE TRIGGER {name}_insert AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {name}();
CREATE TRIGGER {name}_update AFTER UPDATE ON {table}
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {name}();
CREATE TRIGGER {name}_delete AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {name}();
"""


def install(schema_editor, tables: list[Counted]) -> None:
    """Install (or replace) the counting of ``tables`` and count their rows as they are now:
    the tables are locked against writes (SHARE) for the count, in the migration's
    transaction, so no write falls between the count and its trigger. PostgreSQL only."""
    if schema_editor.connection.vendor != "postgresql":
        return
    names = ", ".join(sorted({c.table for c in tables}))
    schema_editor.execute(f"LOCK TABLE {names} IN SHARE MODE")
    for counted in tables:
        schema_editor.execute(_function(counted))
        schema_editor.execute(f"DELETE FROM pool_counter WHERE name IN ({_names(counted)})")
        schema_editor.execute(_statement(counted, [_rows(counted, counted.table, 1, counted.since)]))


def uninstall(schema_editor, tables: list[Counted]) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for counted in tables:
        for event in ("insert", "update", "delete"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {counted.function}_{event} ON {counted.table}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {counted.function}()")
        schema_editor.execute(f"DELETE FROM pool_counter WHERE name IN ({_names(counted)})")


def _names(counted: Counted) -> str:
    return ", ".join(f"'{n}'" for n, _k, _e in counted.definitions)
