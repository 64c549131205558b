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
class Keyed:
    """More counters of the same rows, kept per ``key`` (an SQL expression over the row
    ``r``, such as its minute), counted by the same statement (GROUPING SETS: one pass over
    the transition tables); the first count reads only the rows where ``since`` holds (a
    WHERE over the table; None: all)."""

    key: str
    definitions: tuple[Definition, ...]
    since: str | None = None


@dataclass(frozen=True)
class Counted:
    table: str
    columns: tuple[str, ...]  # the columns the definitions read
    definitions: tuple[Definition, ...]
    # What the counters are kept per (``pool_counter.key``), an SQL expression over the row
    # ``r``, such as its source; None: pool-wide (NULL).
    key: str | None = None
    also: tuple[Keyed, ...] = ()

    @property
    def function(self) -> str:
        return f"pool_count_{self.table}"

    def sets(self) -> list[tuple[str | None, tuple[Definition, ...]]]:
        return [(self.key, self.definitions)] + [(k.key, k.definitions) for k in self.also]


def _aggregate(kind: str, expr: str) -> str:
    if kind == "count":
        return f"sum(r.sign) FILTER (WHERE {expr})"
    if kind == "sum":
        return f"sum(r.sign * ({expr}))::bigint"
    if kind == "max":
        return f"max({expr}) FILTER (WHERE r.sign = 1)"
    raise ValueError(kind)


def _statement(sets: list[tuple[str | None, tuple[Definition, ...]]], rows: list[str]) -> str:
    """INSERT the deltas of ``rows`` (SELECTs of a sign and the columns) into pool_counter:
    each set's definitions per its key, all from one pass over the rows."""
    union = " UNION ALL ".join(rows)
    defs = [(i, d) for i, (_key, ds) in enumerate(sets) for d in ds]
    aggs = ", ".join(f"{_aggregate(kind, expr)} AS c{j}" for j, (_i, (_n, kind, expr)) in enumerate(defs))
    if len(sets) == 1:
        key = sets[0][0]
        source = f"(SELECT {key or 'NULL::bigint'} AS k, {aggs} FROM ({union}) r{' GROUP BY 1' if key else ''})"
        values = ", ".join(f"('{name}', a.c{j})" for j, (_i, (name, _k, _e)) in enumerate(defs))
    else:
        # One key column per set; GROUPING(k<i>) = 0 on the rows of set i.
        keyed = [i for i, (key, _ds) in enumerate(sets) if key]
        keys = ", ".join(f"{sets[i][0]} AS k{i}" for i in keyed)
        grouping = ", ".join(f"(k{i})" if key else "()" for i, (key, _ds) in enumerate(sets))
        mine = {
            i: (f"GROUPING(k{i}) = 0" if key else " AND ".join(f"GROUPING(k{x}) = 1" for x in keyed))
            for i, (key, _ds) in enumerate(sets)
        }
        picks = ", ".join(f"CASE WHEN {mine[i]} THEN k{i} END" for i, (key, _ds) in enumerate(sets) if key)
        source = (
            f"(SELECT COALESCE({picks}) AS k, "
            + ", ".join(f"{mine[i]} AS s{i}" for i in range(len(sets)))
            + f", {aggs} FROM (SELECT r.*, {keys} FROM ({union}) r) r GROUP BY GROUPING SETS ({grouping}))"
        )
        values = ", ".join(f"('{name}', CASE WHEN a.s{i} THEN a.c{j} END)" for j, (i, (name, _k, _e)) in enumerate(defs))
    return (
        'INSERT INTO pool_counter (name, "key", value) SELECT c.name, a.k, c.value FROM '
        f"{source} a CROSS JOIN LATERAL (VALUES {values}) AS c(name, value) WHERE c.value <> 0"
    )


def _rows(counted: Counted, relation: str, sign: int, where: str | None = None) -> str:
    cols = ", ".join(counted.columns)
    return f"SELECT {sign} AS sign, {cols} FROM {relation}" + (f" WHERE {where}" if where else "")


def _function(counted: Counted) -> str:
    name, table = counted.function, counted.table
    return f"""
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_statement(counted.sets(), [_rows(counted, "new_rows", 1)])};
    ELSIF TG_OP = 'UPDATE' THEN
        {_statement(counted.sets(), [_rows(counted, "new_rows", 1), _rows(counted, "old_rows", -1)])};
    ELSE
        {_statement(counted.sets(), [_rows(counted, "old_rows", -1)])};
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
        schema_editor.execute(_statement(counted.sets()[:1], [_rows(counted, counted.table, 1)]))
        for keyed in counted.also:
            rows = [_rows(counted, counted.table, 1, keyed.since)]
            schema_editor.execute(_statement([(keyed.key, keyed.definitions)], rows))


def uninstall(schema_editor, tables: list[Counted]) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for counted in tables:
        for event in ("insert", "update", "delete"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {counted.function}_{event} ON {counted.table}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {counted.function}()")
        schema_editor.execute(f"DELETE FROM pool_counter WHERE name IN ({_names(counted)})")


def _names(counted: Counted) -> str:
    return ", ".join(f"'{n}'" for _key, ds in counted.sets() for n, _k, _e in ds)
