"""bench.partitions: would declarative partitioning of the step table pay? Retention by a
partition detach against a DELETE, index sizes over a retention cycle, and the lookups that
do not name the partition key, on the same rows in both layouts.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.partitions \
        [--steps 500000] [--partitions 16] [--lookups 300]

PostgreSQL only: a fresh database (claw_bench_partitions_<hex>) is created and dropped. The
pool is filled with W-growth (bench/growth.py: W-pool's groups, prefix sharing inside each
rollout) through the pool's services, then its step table is copied twice, with the same
columns, the same indexes and the foreign key of the token chains (``seq_parent``, which a
detach or a delete must check):

* ``flat``: one table, as pool_step is (unique ``uid``, unique (trajectory, step_index));
* ``part``: partitioned by RANGE (id), ``--partitions`` partitions cut at prompt-group
  boundaries. Ids grow with time, so this is partitioning by time (range partitions by
  prompt group id are the same cut: group ids grow with time too); a partitioned table's
  unique indexes must hold the partition key, so ``uid`` moves to a side table
  ``part_uid`` (uid -> id), and (trajectory, step_index) is a plain index.

Figures:

* retention of the oldest partition's steps (a whole number of groups, no kept step's
  token parent among them): ``delete_s`` (DELETE + VACUUM of ``flat``) against
  ``detach_s`` (DETACH PARTITION + DROP TABLE), and the WAL each writes;
* a retention cycle (the oldest partition's worth deleted, then as many new steps stored):
  each layout's table + index bytes after it over before (``*_cycle_growth``), and the
  index bytes of the largest partition against the flat table's;
* p50 of the lookups that do not name the partition key, which a partitioned table answers
  by probing every partition: a step by ``uid``, the steps of a trajectory in order, and
  the first 100 ready steps in id order (the admin's list), in each layout.

Prints progress on stderr and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import psycopg

from bench.curation import BATCH_GROUPS
from bench.growth import GROUP_STEPS, GrowthGen, fill_epoch, grow_by, setup_pool
from bench.pgdb import fresh_database
from pool.flags import READY  # no Django needed

RUNS_WARMUP = 20


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=16)
    p.add_argument("--lookups", type=int, default=300, help="timed lookups per kind and layout")
    args = p.parse_args(argv)
    with fresh_database("partitions"):
        result = run(args)
    print(json.dumps(result), flush=True)


def run(args: argparse.Namespace) -> dict:
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()

    call_command("migrate", verbosity=0)
    setup_pool()
    print(f"W-growth: filling {args.steps:,} steps", file=sys.stderr)
    grow_by(GrowthGen(), args.steps // GROUP_STEPS, fill_epoch())
    connection.ensure_connection()
    conn = connection.connection  # psycopg, autocommit (Django's default outside atomic)
    cuts = group_cuts(conn, args.partitions)
    print(f"copying into flat and part ({args.partitions} partitions)", file=sys.stderr)
    build_flat(conn)
    build_part(conn, cuts)
    sql(conn, "VACUUM ANALYZE flat, part, part_uid")
    result: dict = {
        "workload": "W-growth",
        "db": "postgresql",
        "steps": scalar(conn, "SELECT count(*) FROM flat"),
        "partitions": args.partitions,
        "steps_per_partition": round(scalar(conn, "SELECT count(*) FROM flat") / args.partitions),
    }
    # Lookups first, on the full tables.
    result |= lookups(conn, args.lookups)
    # Sizes before a retention cycle.
    flat_before, part_before = table_bytes(conn, "flat"), part_bytes(conn)
    result["flat_index_bytes"] = index_bytes(conn, "flat")
    result["part_largest_partition_index_bytes"] = max(
        index_bytes(conn, f"part_{k}") for k in range(args.partitions)
    )
    # The oldest partition's rows, kept aside to store them again as new steps.
    oldest = cuts[1]
    sql(conn, f"CREATE TABLE aside AS SELECT * FROM flat WHERE id < {oldest}")
    kept_children = scalar(
        conn, f"SELECT count(*) FROM flat WHERE id >= {oldest} AND seq_parent_id < {oldest}"
    )
    result["kept_steps_with_a_parent_in_the_oldest_partition"] = kept_children
    result["retention_steps"] = scalar(conn, "SELECT count(*) FROM aside")
    # DELETE + VACUUM (flat) against DETACH + DROP (part).
    result["delete_s"], result["delete_wal_bytes"] = timed(
        conn, [f"DELETE FROM flat WHERE id < {oldest}", "VACUUM flat"]
    )
    # A partition whose rows are token parents of each other cannot leave a table whose
    # foreign key covers the chains: PostgreSQL checks the detached rows against every row
    # referencing them, their own included.
    try:
        with conn.transaction():
            sql(conn, "ALTER TABLE part DETACH PARTITION part_0")
        result["detach_with_the_token_fk"] = "allowed"
    except psycopg.errors.ForeignKeyViolation as exc:
        result["detach_with_the_token_fk"] = f"refused: {str(exc).splitlines()[0]}"
    # Without it (the chains kept by the pool alone), a detach is a catalog change.
    sql(conn, "ALTER TABLE part DROP CONSTRAINT part_seq_parent_fk")
    result["detach_s"], result["detach_wal_bytes"] = timed(
        conn,
        [
            "ALTER TABLE part DETACH PARTITION part_0",
            "DROP TABLE part_0",
            f"DELETE FROM part_uid WHERE id < {oldest}",
        ],
    )
    # The same number of new steps: into the flat table's free space, into a new partition.
    top = scalar(conn, "SELECT max(id) FROM flat") + 1
    shift = top - scalar(conn, "SELECT min(id) FROM aside")
    sql(conn, f"CREATE TABLE part_new PARTITION OF part FOR VALUES FROM ({top}) TO (MAXVALUE)")
    renewed = f"SELECT id + {shift}, {_columns_shifted(conn, shift)} FROM aside"  # new ids, uids, parents
    sql(conn, f"INSERT INTO flat {renewed}")
    sql(conn, f"INSERT INTO part {renewed}")
    sql(conn, f"INSERT INTO part_uid SELECT uid || '~', id + {shift} FROM aside")
    sql(conn, "VACUUM ANALYZE flat, part, part_uid")
    result["flat_cycle_growth"] = round(table_bytes(conn, "flat") / flat_before, 3)
    result["part_cycle_growth"] = round(part_bytes(conn) / part_before, 3)
    result["flat_bytes"], result["part_bytes"] = flat_before, part_before
    result["detach_speedup"] = round(result["delete_s"] / result["detach_s"], 1)
    print(json.dumps(result, indent=1), file=sys.stderr)
    return result


# --- layouts --------------------------------------------------------------------------------------
def group_cuts(conn, partitions: int) -> list[int]:
    """Step ids where partitions start, then past the last: the first step of the fill's
    batch at each 1/partitions of the groups. The fill stores BATCH_GROUPS groups per batch,
    their steps level by level (every anchor of the batch, then every second step, ...), so
    a batch's steps interleave its groups' ids, but each batch's ids follow the one before:
    a cut between batches splits no group and no token chain."""
    groups = [r[0] for r in conn.execute("SELECT id FROM pool_promptgroup ORDER BY id").fetchall()]
    firsts = []
    for k in range(partitions):
        g = groups[len(groups) * k // partitions // BATCH_GROUPS * BATCH_GROUPS]
        firsts.append(
            scalar(
                conn,
                f"SELECT min(s.id) FROM pool_step s JOIN pool_trajectory t ON t.id = s.trajectory_id WHERE t.group_id >= {g}",
            )
        )
    firsts[0] = 0
    if len(set(firsts)) < partitions:
        raise SystemExit(f"{len(groups)} groups are too few for {partitions} partitions of whole batches")
    return [*firsts, scalar(conn, "SELECT max(id) FROM pool_step") + 1]


def _indexes(conn) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pool_step' AND indexname <> 'pool_step_pkey'"
    ).fetchall()


def build_flat(conn) -> None:
    sql(conn, "CREATE TABLE flat (LIKE pool_step INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)")
    sql(conn, "INSERT INTO flat SELECT * FROM pool_step")
    sql(conn, "ALTER TABLE flat ADD PRIMARY KEY (id)")
    for name, definition in _indexes(conn):
        sql(conn, definition.replace(f"INDEX {name} ON public.pool_step", f"INDEX flat_{name} ON flat"))
    sql(
        conn,
        "ALTER TABLE flat ADD FOREIGN KEY (seq_parent_id) REFERENCES flat (id) DEFERRABLE INITIALLY DEFERRED",
    )


def build_part(conn, cuts: list[int]) -> None:
    sql(
        conn,
        "CREATE TABLE part (LIKE pool_step INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE) "
        "PARTITION BY RANGE (id)",
    )
    for k in range(len(cuts) - 1):
        sql(conn, f"CREATE TABLE part_{k} PARTITION OF part FOR VALUES FROM ({cuts[k]}) TO ({cuts[k + 1]})")
    sql(conn, "INSERT INTO part SELECT * FROM pool_step")
    sql(conn, "ALTER TABLE part ADD PRIMARY KEY (id)")
    for name, definition in _indexes(conn):
        # Unique indexes without the partition key cannot exist: uid goes to part_uid,
        # (trajectory, step_index) becomes a plain index.
        if "(uid)" in definition:
            continue
        definition = definition.replace("CREATE UNIQUE INDEX", "CREATE INDEX")
        sql(conn, definition.replace(f"INDEX {name} ON public.pool_step", f"INDEX part_{name} ON part"))
    sql(
        conn,
        "ALTER TABLE part ADD CONSTRAINT part_seq_parent_fk FOREIGN KEY (seq_parent_id) REFERENCES part (id) "
        "DEFERRABLE INITIALLY DEFERRED",
    )
    sql(conn, "CREATE TABLE part_uid (uid varchar(160) PRIMARY KEY, id bigint NOT NULL)")
    sql(conn, "INSERT INTO part_uid SELECT uid, id FROM pool_step")


def _columns_shifted(conn, shift: int) -> str:
    """The step columns after id, as a SELECT list over ``aside``: a new uid, the token
    parent moved with the ids, the rest as they were."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'pool_step' "
            "AND column_name <> 'id' ORDER BY ordinal_position"
        ).fetchall()
    ]
    moved = {"uid": "uid || '~'", "seq_parent_id": f"seq_parent_id + {shift}", "parent_step_id": "NULL"}
    return ", ".join(moved.get(n, n) for n in names)


# --- measuring ------------------------------------------------------------------------------------
def lookups(conn, n: int) -> dict:
    rng = random.Random(0)
    rows = conn.execute("SELECT uid, trajectory_id FROM flat").fetchall()
    picks = [rows[rng.randrange(len(rows))] for _ in range(n + RUNS_WARMUP)]
    out = {}
    kinds = {
        "by_uid": (
            "SELECT id, seq_len FROM flat WHERE uid = %s",
            "SELECT s.id, s.seq_len FROM part_uid u JOIN part s ON s.id = u.id WHERE u.uid = %s",
            0,
        ),
        "by_uid_without_side_table": (
            "SELECT id, seq_len FROM flat WHERE uid = %s",
            "SELECT id, seq_len FROM part WHERE uid = %s",
            0,
        ),
        "trajectory_steps": (
            "SELECT id, step_index FROM flat WHERE trajectory_id = %s ORDER BY step_index",
            "SELECT id, step_index FROM part WHERE trajectory_id = %s ORDER BY step_index",
            1,
        ),
    }
    for kind, (flat_sql, part_sql, col) in kinds.items():
        for layout, query in (("flat", flat_sql), ("part", part_sql)):
            times = []
            for i, pick in enumerate(picks):
                t = time.perf_counter()
                conn.execute(query, [pick[col]]).fetchall()
                if i >= RUNS_WARMUP:
                    times.append((time.perf_counter() - t) * 1e6)
            out[f"{kind}_p50_us_{layout}"] = round(statistics.median(times))
        out[f"{kind}_part_over_flat"] = round(out[f"{kind}_p50_us_part"] / out[f"{kind}_p50_us_flat"], 2)
    # The admin's step list: the first 100 ready steps, newest first (step_ready).
    for layout in ("flat", "part"):
        query = f"SELECT id FROM {layout} WHERE readiness = {READY} ORDER BY id DESC LIMIT 100"
        times = []
        for i in range(n // 10 + RUNS_WARMUP):
            t = time.perf_counter()
            conn.execute(query).fetchall()
            if i >= RUNS_WARMUP:
                times.append((time.perf_counter() - t) * 1e6)
        out[f"ready_page_p50_us_{layout}"] = round(statistics.median(times))
    out["ready_page_part_over_flat"] = round(out["ready_page_p50_us_part"] / out["ready_page_p50_us_flat"], 2)
    print(f"  lookups: {out}", file=sys.stderr)
    return out


def timed(conn, statements: list[str]) -> tuple[float, int]:
    """Seconds and WAL bytes of ``statements`` run in order (autocommit)."""
    start = scalar(conn, "SELECT pg_current_wal_insert_lsn()::text")
    t = time.perf_counter()
    for statement in statements:
        sql(conn, statement)
    took = time.perf_counter() - t
    wal = scalar(conn, f"SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '{start}')")
    return round(took, 3), int(wal)


def table_bytes(conn, table: str) -> int:
    return int(scalar(conn, f"SELECT pg_total_relation_size('{table}')"))


def index_bytes(conn, table: str) -> int:
    return int(scalar(conn, f"SELECT pg_indexes_size('{table}')"))


def part_bytes(conn) -> int:
    """The partitioned layout's bytes: every partition with its indexes, and part_uid."""
    return int(
        scalar(
            conn,
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'part'::regclass",
        )
    ) + table_bytes(conn, "part_uid")


def scalar(conn, query: str):
    return conn.execute(query).fetchone()[0]


def sql(conn, statement: str) -> None:
    conn.execute(statement)


if __name__ == "__main__":
    main()
