"""The pool's SQL toolkit: every INSERT, COPY and UPDATE of the house built as a string.

At the bottom of the pool (it imports only the models and flags): the step pipeline
(pool/ingest/), the reward, trajectory, readiness, effective-reward and task-statistics
services and curation's labels and consumption write through it; nothing else builds SQL by
hand.

Two backends, one interface (``Backend``), chosen by the database vendor:

* ``PostgresBackend``: step rows of a batch go by binary COPY; a proxied call's claim and
  insert go as ONE data-modifying statement (one round trip, one commit).
* ``OrmBackend`` (SQLite and anything else): bulk_create, and the same conditional claim as
  an UPDATE in a short transaction.

Everything else of the pipeline (pool/ingest/pipeline.py) is database-neutral Python and ORM
reads. Statements that both backends run (trajectory insert and counters, the claim) are
written once in portable SQL: ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` and
``UPDATE ... RETURNING`` work on PostgreSQL and on SQLite >= 3.35.
"""

from __future__ import annotations

import operator
import re
import weakref
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, models, transaction
from django.db.models.base import ModelState
from django.utils import timezone
from psycopg.types.json import Jsonb

from . import prepared
from .flags import GROUP_QUALITY, Quality, Readiness
from .lookups import array_literal, array_param
from .models import PromptGroup, Step, Trajectory

# The trajectory columns the pipeline reads back from its writes (no model instance on the
# hot path). Order matters: pipeline.TrajectoryRow is built from these tuples.
TRAJ_COLS = ("id", "uid", "group_id", "status", "step_count", "tail_index", "policy_version_id", "source_id")


@dataclass(slots=True)
class FusedClaim:
    """The claim of a proxied call's indexes, executed together with its step insert.

    ``new``: insert this trajectory row, only if no row has its uid (``minted``: the gateway
    minted the uid, so none can; inserted plainly), in the group ``group_uid`` when given,
    only if (``sources``, unless None) the group is shared or one of those sources' and: with
    ``group_anchor``, the group's anchor is that step (the first step was stored against
    it); else the group has no anchor yet, or is new: ``new_group`` is inserted if no row has
    its uid. Otherwise claim ``[expected, expected + n)`` of ``uid`` only if its step_count
    is still ``expected``, it runs, (``group_uid``) it is in that group and (``sources``)
    it belongs to one of those sources (pool/tenancy.py). Else nothing is written.
    """

    uid: str
    expected: int
    new: Trajectory | None = None
    new_group: PromptGroup | None = None
    group_anchor: int | None = None
    minted: bool = False
    group_uid: str | None = None
    sources: tuple[int, ...] | None = None


@dataclass(slots=True)
class Appended:
    """What a fused append wrote: {step_index: step id}, and its trajectory's columns."""

    ids: dict[int, int]
    trajectory_id: int
    group_id: int | None
    policy_version_id: int | None


class Backend(Protocol):
    def insert_steps(self, rows: Sequence[Step]) -> None:
        """Insert ``rows`` and set their primary keys. Inside the caller's transaction."""

    def append(self, claim: FusedClaim, rows: Sequence[Step], *, alone: bool = True) -> Appended | None:
        """Claim and insert in one unit, or None when the claim missed (nothing written).
        Rows without a policy version take the trajectory's. ``alone=False``: one of a group
        commit's appends, in its transaction without a savepoint of its own: a database
        error (a uid taken) is raised, and the group rolls back."""


def backend() -> Backend:
    return _POSTGRES if connection.vendor == "postgresql" else _ORM


# --- statements both backends run ---------------------------------------------------------------
def trajectories_insert(rows: Sequence[Trajectory]) -> list[tuple]:
    """Insert trajectory rows that do not exist yet; returns TRAJ_COLS of those inserted
    (a row another writer inserted first is simply not returned: the caller reads it)."""
    return rows_insert_new(rows, conflict=("uid",), returning=TRAJ_COLS)


def rows_insert_new(
    rows: Sequence[models.Model], *, conflict: Sequence[str], returning: Sequence[str]
) -> list[tuple]:
    """Insert unsaved rows of one model unless a row with the same ``conflict`` columns
    exists; returns the ``returning`` columns of the rows this call inserted.

    ``INSERT ... ON CONFLICT (...) DO NOTHING RETURNING``: one race-safe statement on
    PostgreSQL and SQLite >= 3.35. Under concurrency exactly one writer inserts each row
    (PostgreSQL waits for the other's transaction), so the returned rows are what this
    writer won: trajectories created on first sight, a trainer's claimed units."""
    if not rows:
        return []
    model = type(rows[0])
    cols = _columns(model)
    q = connection.ops.quote_name
    names = ", ".join(q(str(f.column)) for f, _ in cols)
    tail = (
        f"ON CONFLICT ({', '.join(q(c) for c in conflict)}) DO NOTHING "
        f"RETURNING {', '.join(q(c) for c in returning)}"
    )
    if connection.vendor == "postgresql":
        # One typed array per column (``_rows``): a few parameters whatever the row count.
        # A VALUES list of 13 trajectories' 300 placeholders spent ~10% of a W-ingest
        # batch's server time in psycopg's client-side query splitter (py-spy).
        values, params = _rows(
            [q(str(f.column)) for f, _ in cols],
            _pg_types(model),
            [tuple(_param(f, conv, row) for f, conv in cols) for row in rows],
        )
        sql = f"WITH {values} INSERT INTO {q(model._meta.db_table)} ({names}) SELECT {names} FROM v {tail}"
    else:
        params = [_param(f, conv, row) for row in rows for f, conv in cols]
        one = f"({', '.join(['%s'] * len(cols))})"
        sql = f"INSERT INTO {q(model._meta.db_table)} ({names}) VALUES {', '.join([one] * len(rows))} {tail}"
    with prepared.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def row_insert(obj: models.Model) -> None:
    """Insert one unsaved row as it stands (its primary key set), its parameters bound by the
    server where statements are prepared (``prepared.cursor``): a large bytea then crosses as
    bytes, not as a hex literal in the statement's text. A pull's lease (its 155 kB body, the
    batch served) took 2.1-2.8 ms and 1.2 ms of the client's CPU as Django inserts it; 0.5
    ms and 0.1 ms so. Django's save signals are not sent (the project registers none)."""
    meta = type(obj)._meta
    fields = meta.concrete_fields
    q = connection.ops.quote_name
    sql = (
        f"INSERT INTO {q(meta.db_table)} ({', '.join(q(str(f.column)) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with prepared.cursor() as cur:
        cur.execute(sql, params)
    obj._state.adding = False
    obj._state.db = connection.alias


def trajectories_after_write(updates: Sequence[tuple[int, int, int, bool]]) -> None:
    """Counters and status of the trajectories a write touched, in one statement.

    ``updates``: (trajectory id, end = max step_index + 1 written, tail = first index of the
    latest append, completes = an is_last step was written). step_count only grows (the max
    of stored and written: concurrent writers are ordered by the row lock and never lower
    it); tail_index follows a write that reaches the end; an is_last step completes a
    running trajectory."""
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    cte, params = _rows(("id", "n", "tail", "last"), ("bigint", "integer", "integer", "boolean"), updates)
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql = f"""
        WITH {cte}
        UPDATE {table} SET
            step_count = CASE WHEN {table}.step_count > v.n THEN {table}.step_count ELSE v.n END,
            tail_index = CASE WHEN v.n >= {table}.step_count THEN v.tail ELSE {table}.tail_index END,
            status = CASE WHEN v.last AND {table}.status = 'running' THEN 'completed' ELSE {table}.status END,
            completed_at = CASE WHEN v.last AND {table}.status = 'running' THEN %s ELSE {table}.completed_at END,
            updated_at = %s
        FROM v WHERE {table}.id = v.id
    """
    with prepared.cursor() as cur:
        cur.execute(sql, [*params, now, now])


# --- follow-up writes of the pool's services: rewards, completion, readiness ------------------
# Set-based statements (one per call, whatever the batch size): ``WITH v(...) AS (VALUES ...)
# UPDATE ... FROM v`` runs on PostgreSQL and on SQLite >= 3.33. Rows whose value does not
# change are not rewritten (a rewrite copies the whole row and its index entries).
def trajectories_end(rows: Sequence[tuple[int, str, bool, float | None, str | None]], now: Any) -> None:
    """(trajectory id, status, ends now, reward, reward source) in one statement;
    ``completed_at`` is ``now`` for those that end now. The ids are also given as a list, so
    the rows are found by primary key: joined to the rows' CTE alone, PostgreSQL hashed the
    whole trajectory table for each batch (a cost growing with the pool)."""
    if not rows:
        return
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    ids_sql, ids = _ids_in([r[0] for r in rows])
    cte, params = _rows(
        ("id", "status", "ends", "reward", "source"),
        ("bigint", "varchar", "boolean", "double precision", "varchar"),
        rows,
    )
    sql = f"""
        WITH {cte}
        UPDATE {table} SET
            status = v.status, reward = v.reward, reward_source = v.source, updated_at = %s,
            completed_at = CASE WHEN v.ends THEN %s ELSE {table}.completed_at END
        FROM v WHERE {table}.id = v.id AND {table}.id {ids_sql}
    """
    now = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cur:  # not prepared (a plan over many ids)
        cur.execute(sql, [*params, now, now, *ids])


def _ids_in(ids: Sequence[int]) -> tuple[str, list[Any]]:
    """``col <this>`` membership of ``ids`` and its parameters: one array parameter on
    PostgreSQL (integers as one array literal: ``lookups.array_param``), a list of
    placeholders elsewhere (the caller bounds the ids per call)."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [array_param(list(ids))]
    return f"IN ({', '.join(['%s'] * len(ids))})", list(ids)


def trajectories_last_final(trajectory_ids: Sequence[int]) -> set[int]:
    """Those of these trajectories whose highest step has a final own reward, in one
    statement (the highest index of each from the (trajectory, step_index) key, then those
    rows alone)."""
    step = connection.ops.quote_name(Step._meta.db_table)
    found: set[int] = set()
    for i in range(0, len(trajectory_ids), 1000):  # within SQLite's limit of parameters
        ids_sql, ids = _ids_in(trajectory_ids[i : i + 1000])
        sql = f"""
            SELECT st.trajectory_id FROM {step} st
            JOIN (SELECT trajectory_id AS tid, MAX(step_index) AS mx FROM {step}
                  WHERE trajectory_id {ids_sql} GROUP BY trajectory_id) m
              ON st.trajectory_id = m.tid AND st.step_index = m.mx
            WHERE st.reward_status = %s"""
        with connection.cursor() as cur:  # not prepared (a plan over many ids)
            cur.execute(sql, [*ids, Step.RewardStatus.FINAL.value])
            found.update(tid for (tid,) in cur.fetchall())
    return found


def steps_settle(
    trajectory_ids: Sequence[int],
    *,
    own: Sequence[tuple[int, float | None, str, str | None]] = (),
    bits: bool = True,
    mark_last: Collection[int] = (),
) -> None:
    """The reward columns and readiness of every step of these trajectories, recomputed
    from their rows in ONE statement (pool/services/effective_reward.py states the rules;
    this is their only implementation): the effective reward, its source and scope, the
    outcome and process rewards, the REWARD_FINAL bit and (``bits``) the bits the
    trajectory and its group decide (TRAJECTORY_COMPLETE, GROUP_COMPLETE: pool/services/
    readiness.py); TOKENS_EXACT is kept. ``own``: (step id, reward, reward_status,
    reward_source) written as those steps' own rewards by the same statement (rewards_apply;
    their ``updated_at`` moves). ``mark_last``: trajectories ending now (trajectories_complete),
    whose highest step becomes their ``is_last`` step, and only it, by the same statement
    (the step that becomes it moves its ``updated_at``): each of their rows is written once,
    not once for the mark and again for the settle. Only rows whose values change are written.

    Set-based, no row goes through Python: a branch's final step (its last ``is_last``
    step, else, once the trajectory has ended, its highest index) is an aggregate per
    (trajectory, branch), and its own final reward the branch's outcome. Portable SQL
    (window-free, ``UPDATE ... FROM`` and ``IS DISTINCT FROM``): PostgreSQL, SQLite >= 3.39.
    The caller holds the trajectories' row locks (every writer of their steps locks them
    first) and bounds the ids per call (readiness.CHUNK)."""
    if not trajectory_ids:
        return
    q = connection.ops.quote_name
    step, traj, group = (q(m._meta.db_table) for m in (Step, Trajectory, PromptGroup))
    pg = connection.vendor == "postgresql"
    ids_sql, ids_params = _ids_in(trajectory_ids)
    params: list[Any] = []  # in the order of the text: the own rewards' CTE, then the ids
    ctes = []
    if own:
        if pg:
            cte, own_params = _rows(
                ("id", "reward", "status", "source"),
                ("bigint", "double precision", "varchar", "varchar"),
                own,
            )
            ctes.append(cte.replace("v(", "o(", 1))
            params += own_params
        else:  # one JSON parameter, however many rows (SQLite caps the parameters per statement)
            ctes.append(
                "o(id, reward, status, source) AS (SELECT json_extract(value, '$[0]'), "
                "json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]') "
                "FROM json_each(%s))"
            )
            params.append(_orjson_dumps([list(row) for row in own]))
        own_join = "LEFT JOIN o ON o.id = st.id"
        pick = "CASE WHEN o.id IS NULL THEN st.{c} ELSE o.{o} END"
        changed = "o.id IS NOT NULL"
    else:
        own_join, pick, changed = "", "st.{c}", "1 = 0"
    marks = sorted(set(mark_last).intersection(trajectory_ids)) if mark_last else []
    if marks:
        marks_sql, marks_params = _ids_in(marks)
        mark = f"CASE WHEN tr.id {marks_sql} THEN 1 ELSE 0 END"
        params += marks_params
    else:
        mark = "0"
    params += ids_params
    tc, gc, rf, te = (
        int(Readiness.TRAJECTORY_COMPLETE),
        int(Readiness.GROUP_COMPLETE),
        int(Readiness.REWARD_FINAL),
        int(Readiness.TOKENS_EXACT),
    )
    env, final = Step.RewardSource.ENV.value, Step.RewardStatus.FINAL.value
    # the bits decided by the trajectory and its group, and whether it has ended
    ctes.append(f"""t AS (
        SELECT tr.id, tr.reward AS t_reward, COALESCE(tr.reward_source, '{env}') AS t_source,
               (CASE WHEN tr.status = 'completed' THEN {tc} ELSE 0 END)
               | (CASE WHEN tr.group_id IS NULL OR g.status = 'complete' THEN {gc} ELSE 0 END) AS bits,
               CASE WHEN tr.status = 'running' THEN 0 ELSE 1 END AS ended, {mark} AS mark
        FROM {traj} tr LEFT JOIN {group} g ON g.id = tr.group_id
        WHERE tr.id {ids_sql})""")
    # the highest index of each trajectory ending now (its is_last step to be)
    ctes.append(f"""m AS (
        SELECT st.trajectory_id AS tid, MAX(st.step_index) AS mx FROM {step} st
        WHERE st.trajectory_id IN (SELECT id FROM t WHERE mark = 1) GROUP BY st.trajectory_id)""")
    # the steps, with their own rewards and is_last as this statement leaves them
    ctes.append(f"""s AS (
        SELECT st.id, st.trajectory_id AS tid, st.branch, st.step_index AS idx,
               CASE WHEN m.tid IS NULL THEN st.is_last ELSE st.step_index = m.mx END AS is_last,
               CASE WHEN m.tid IS NOT NULL AND st.step_index = m.mx AND NOT st.is_last THEN 1 ELSE 0 END
                   AS became_last,
               {pick.format(c="reward", o="reward")} AS r,
               {pick.format(c="reward_status", o="status")} AS rs,
               {pick.format(c="reward_source", o="source")} AS src,
               CASE WHEN {changed} THEN 1 ELSE 0 END AS changed
        FROM {step} st {own_join} LEFT JOIN m ON m.tid = st.trajectory_id
        WHERE st.trajectory_id IN (SELECT id FROM t))""")
    # each branch's final step
    ctes.append("""e AS (
        SELECT s.tid, s.branch,
               COALESCE(MAX(CASE WHEN s.is_last THEN s.idx END),
                        CASE WHEN MAX(t.ended) = 1 THEN MAX(s.idx) END) AS fin
        FROM s JOIN t ON t.id = s.tid
        GROUP BY s.tid, s.branch)""")
    # each step's outcome: its branch's final step's own final reward, else the trajectory's
    ctes.append(f"""x AS (
        SELECT s.id, s.r, s.rs, s.src, s.changed, s.idx, s.is_last, s.became_last, e.fin, t.bits,
               CASE WHEN f.id IS NOT NULL THEN f.r ELSE t.t_reward END AS out_v,
               CASE WHEN f.id IS NOT NULL THEN COALESCE(f.src, '{env}')
                    WHEN t.t_reward IS NOT NULL THEN t.t_source END AS out_src,
               CASE WHEN f.id IS NOT NULL THEN 'branch'
                    WHEN t.t_reward IS NOT NULL THEN 'trajectory' END AS out_scope
        FROM s JOIN t ON t.id = s.tid
        JOIN e ON e.tid = s.tid AND e.branch = s.branch
        LEFT JOIN s f ON f.tid = e.tid AND f.idx = e.fin AND f.r IS NOT NULL AND f.rs = '{final}')""")
    ctes.append(f"""n AS (
        SELECT x.id, x.r, x.rs, x.src, x.changed, x.is_last, x.became_last,
               CASE WHEN x.r IS NOT NULL THEN x.r ELSE x.out_v END AS eff,
               CASE WHEN x.r IS NOT NULL THEN x.src ELSE x.out_src END AS eff_src,
               CASE WHEN x.r IS NOT NULL THEN 'step' ELSE x.out_scope END AS scope,
               x.out_v AS outcome,
               CASE WHEN x.r IS NOT NULL AND (x.fin IS NULL OR x.fin <> x.idx) THEN x.r END AS process,
               CASE WHEN x.out_v IS NOT NULL AND (x.r IS NULL OR x.rs = '{final}') THEN {rf} ELSE 0 END AS rf,
               x.bits
        FROM x)""")
    ready = (
        f"(({step}.readiness & {te}) | n.bits | n.rf)"
        if bits
        else f"(({step}.readiness & {~rf & 0xFFFF}) | n.rf)"
    )
    moved = [
        f"{step}.{col} IS DISTINCT FROM n.{val}"
        for col, val in (
            ("effective_reward", "eff"),
            ("effective_reward_source", "eff_src"),
            ("reward_scope", "scope"),
            ("outcome_reward", "outcome"),
            ("process_reward", "process"),
        )
    ]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql = f"""
        WITH {", ".join(ctes)}
        UPDATE {step} SET
            reward = n.r, reward_status = n.rs, reward_source = n.src, is_last = n.is_last,
            updated_at = CASE WHEN n.changed = 1 OR n.became_last = 1 THEN %s ELSE {step}.updated_at END,
            effective_reward = n.eff, effective_reward_source = n.eff_src, reward_scope = n.scope,
            outcome_reward = n.outcome, process_reward = n.process, readiness = {ready}
        FROM n
        WHERE {step}.id = n.id
          AND (n.changed = 1 OR {step}.is_last <> n.is_last OR {step}.readiness <> {ready}
               OR {" OR ".join(moved)})
    """
    with connection.cursor() as cur:  # not prepared: its generic plan ran a 1,000-id batch 3.5x slower
        cur.execute(sql, [*params, now])


def _rollout_reward(reward: str, trajectory_id: str, step: str) -> str:
    """A completed rollout's reward, the one definition the group statements share: its
    trajectory's (``reward``), else the reward of its last step (the highest ``is_last``)."""
    return (
        f"COALESCE({reward}, (SELECT s.reward FROM {step} s WHERE s.trajectory_id = {trajectory_id} "
        "AND s.is_last ORDER BY s.step_index DESC LIMIT 1))"
    )


def groups_score_inputs(group_ids: Sequence[int]) -> dict[int, tuple[Any, list[float], int]]:
    """What each of these groups' serving scores (curation.GroupScore) are computed from,
    in ONE statement: its ready_at, its completed rollouts' rewards (``_rollout_reward``;
    rollouts with none left out) and its stalest policy version (the lowest of those
    rollouts' steps; -1 when a step has none, or there is no such step). The caller bounds
    the ids per call (SQLite binds them three times)."""
    if not group_ids:
        return {}
    q = connection.ops.quote_name
    step, traj, group = (q(m._meta.db_table) for m in (Step, Trajectory, PromptGroup))
    ids_sql, ids = _ids_in(group_ids)
    completed = Trajectory.Status.COMPLETED.value
    sql = f"""
        SELECT g.id, g.ready_at, v.lowest, v.missing, r.value
        FROM {group} g
        LEFT JOIN (
            SELECT tr.group_id AS gid, MIN(st.policy_version_id) AS lowest,
                   SUM(CASE WHEN st.policy_version_id IS NULL THEN 1 ELSE 0 END) AS missing
            FROM {traj} tr JOIN {step} st ON st.trajectory_id = tr.id
            WHERE tr.group_id {ids_sql} AND tr.status = %s
            GROUP BY tr.group_id) v ON v.gid = g.id
        LEFT JOIN (
            SELECT tr.group_id AS gid, {_rollout_reward("tr.reward", "tr.id", step)} AS value
            FROM {traj} tr WHERE tr.group_id {ids_sql} AND tr.status = %s) r ON r.gid = g.id
        WHERE g.id {ids_sql}"""
    out: dict[int, tuple[Any, list[float], int]] = {}
    with connection.cursor() as cur:
        cur.execute(sql, [*ids, completed, *ids, completed, *ids])
        for gid, ready_at, lowest, missing, value in cur.fetchall():
            _, values, _ = out.get(gid) or (None, [], 0)
            if value is not None:
                values.append(value)
            # SQLite gives the stored UTC time without its zone, as Django's own converter does
            if ready_at is not None and timezone.is_naive(ready_at):
                ready_at = timezone.make_aware(ready_at, connection.timezone)
            out[gid] = (ready_at, values, -1 if missing or lowest is None else lowest)
    return out


def groups_quality(group_ids: Sequence[int]) -> None:
    """The group quality flags of every step of these groups, from their completed rollouts,
    in ONE statement (no row through Python): DUPLICATE on a completed rollout's step whose
    response another completed rollout of its group repeats; ZERO_VARIANCE on every step of
    a group whose completed rollouts (more than one) all have a reward, each the same (a
    rollout's reward: its trajectory's, else its last step's; no GRPO advantage). Only rows
    whose flags change are written. The caller bounds the ids per call (readiness.CHUNK).
    ``v`` is MATERIALIZED: inlined, each rollout's reward (a subquery) was computed once for
    each of the three aggregates that read it."""
    if not group_ids:
        return
    q = connection.ops.quote_name
    step, traj = q(Step._meta.db_table), q(Trajectory._meta.db_table)
    ids_sql, ids = _ids_in(group_ids)
    keep = ~GROUP_QUALITY  # a negative literal: every other bit
    dup, flat = int(Quality.DUPLICATE), int(Quality.ZERO_VARIANCE)
    completed = Trajectory.Status.COMPLETED.value
    sql = f"""
        WITH c AS (
            SELECT tr.id AS tid, tr.group_id AS gid, tr.reward AS r FROM {traj} tr
            WHERE tr.group_id {ids_sql} AND tr.status = '{completed}'),
        v AS MATERIALIZED (
            SELECT c.gid, {_rollout_reward("c.r", "c.tid", step)} AS x FROM c),
        f AS (
            SELECT gid FROM v GROUP BY gid
            HAVING COUNT(*) > 1 AND COUNT(x) = COUNT(*) AND MAX(x) - MIN(x) <= 1e-12),
        d AS (
            SELECT c.gid, s.response_hash AS h FROM {step} s JOIN c ON c.tid = s.trajectory_id
            WHERE s.response_hash IS NOT NULL
            GROUP BY c.gid, s.response_hash HAVING COUNT(DISTINCT s.trajectory_id) > 1),
        n AS (
            SELECT s.id, (s.quality_flags & ({keep}))
                   | (CASE WHEN d.h IS NOT NULL THEN {dup} ELSE 0 END)
                   | (CASE WHEN f.gid IS NOT NULL THEN {flat} ELSE 0 END) AS flags
            FROM {step} s JOIN {traj} tr ON tr.id = s.trajectory_id
            LEFT JOIN c ON c.tid = s.trajectory_id
            LEFT JOIN d ON c.tid IS NOT NULL AND d.gid = c.gid AND d.h = s.response_hash
            LEFT JOIN f ON f.gid = tr.group_id
            WHERE tr.group_id {ids_sql})
        UPDATE {step} SET quality_flags = n.flags FROM n
        WHERE {step}.id = n.id AND {step}.quality_flags <> n.flags
    """
    with connection.cursor() as cur:  # not prepared (a plan over many ids)
        cur.execute(sql, [*ids, *ids])


def groups_task_claim(group_ids: Sequence[int], now: Any) -> dict[int, int]:
    """Task statistics' claim (services/task_stats.py) of the groups not counted yet, in one
    statement: {group id: task id} of those this transaction marked counted. On PostgreSQL
    the rows are locked in primary-key order (as every writer locks), and a concurrent claim
    of the same group waits on its row and then, re-checking the row, finds it counted;
    SQLite serialises writers."""
    table = connection.ops.quote_name(PromptGroup._meta.db_table)
    marks = ", ".join(["%s"] * len(group_ids))
    uncounted = f"id IN ({marks}) AND task_id IS NOT NULL AND task_counted_at IS NULL"
    if connection.vendor == "postgresql":
        sql = (
            f"WITH c AS (SELECT id FROM {table} WHERE {uncounted} ORDER BY id FOR UPDATE)"
            f" UPDATE {table} AS g SET task_counted_at = %s FROM c WHERE g.id = c.id"
            " RETURNING g.id, g.task_id"
        )
        params = [*group_ids, now]
    else:
        sql = f"UPDATE {table} SET task_counted_at = %s WHERE {uncounted} RETURNING id, task_id"
        params = [connection.ops.adapt_datetimefield_value(now), *group_ids]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return dict(cur.fetchall())


def counters_fold(first_minute: int) -> tuple[int, int]:
    """Fold pool_counter's rows into one per counter and key (PostgreSQL; zero counts and
    per-minute counts before ``first_minute`` dropped) in one statement: the DELETE removes
    the rows its snapshot sees and the INSERT puts back their sums, so a count never changes
    by a fold and rows committed meanwhile stay for the next one. Returns the rows before
    and after (pool/services/counters.py)."""
    with connection.cursor() as cur:
        cur.execute(
            'WITH gone AS (DELETE FROM pool_counter RETURNING name, "key", value), '
            'folded AS (INSERT INTO pool_counter (name, "key", value) '
            "SELECT name, \"key\", CASE WHEN name LIKE 'max:%%' THEN max(value) ELSE sum(value) END "
            'FROM gone WHERE name NOT LIKE \'minute:%%\' OR "key" >= %s GROUP BY name, "key" '
            "HAVING CASE WHEN name LIKE 'max:%%' THEN max(value) ELSE sum(value) END <> 0 RETURNING 1) "
            "SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM folded)",
            [first_minute],
        )
        before, after = cur.fetchone()
    return before, after


def _rows(names: Sequence[str], types: Sequence[str], rows: Sequence[tuple]) -> tuple[str, list[Any]]:
    """A CTE ``v(names)`` holding ``rows``, and its parameters. PostgreSQL: one typed array
    per column through unnest (a few parameters whatever the batch size: client-side
    binding of 4,000 placeholders cost ~50 ms per 1,000 rows in the driver's query
    splitter); elsewhere a VALUES list."""
    cols = ", ".join(names)
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"CAST(%s AS {t}[])" for t in types)
        columns = [list(c) for c in zip(*rows, strict=True)]
        # Each column as one array literal where its values allow (lookups.array_literal).
        return f"v({cols}) AS (SELECT * FROM unnest({arrays}))", [
            text if (text := array_literal(c)) is not None else c for c in columns
        ]
    one = "(" + ", ".join(["%s"] * len(names)) + ")"
    return f"v({cols}) AS (VALUES {', '.join([one] * len(rows))})", [x for row in rows for x in row]


def trajectory_claim(uid: str, n: int, sources: frozenset[int] | None = None) -> tuple | None:
    """Reserve ``n`` step indexes of trajectory ``uid``: ``step_count += n`` under the row
    lock (held until commit, so concurrent calls of one trajectory are serialised and the
    second sees the first's steps). Returns TRAJ_COLS after the update (tail_index still
    names the previous append: the pipeline's effects move it), or None when no row exists
    or (``sources``, unless None) it belongs to none of those sources: that row is left alone."""
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    owned = _sources_sql(tuple(sorted(sources)) if sources is not None else None)
    sql = (
        f"UPDATE {table} SET step_count = step_count + %s, updated_at = %s WHERE uid = %s{owned} "
        f"RETURNING {', '.join(TRAJ_COLS)}"
    )
    with prepared.cursor() as cur:
        cur.execute(sql, [n, connection.ops.adapt_datetimefield_value(timezone.now()), uid, *(sources or ())])
        return cur.fetchone()


def _sources_sql(sources: tuple[int, ...] | None) -> str:
    """`` AND source_id IN (%s, ...)`` for a claim restricted to ``sources`` (pool/tenancy.py)."""
    return "" if sources is None else f" AND source_id IN ({', '.join(['%s'] * len(sources))})"


def _claim_sql(*, group: bool, sources: int | None = None) -> str:
    """The fast path's conditional claim: indexes [expected, expected + n) only if nobody
    took them, the trajectory runs, (``sources``: their count) belongs to the writer's
    sources and (``group``) is in the call's group. It also makes them the trajectory's
    latest append (tail_index = the old step_count)."""
    q = connection.ops.quote_name
    owned = "" if sources is None else _sources_sql(tuple(range(sources)))
    sql = (
        f"UPDATE {q(Trajectory._meta.db_table)} SET step_count = step_count + %s, tail_index = step_count, "
        f"updated_at = %s WHERE uid = %s AND step_count = %s AND status = 'running'{owned}"
    )
    if group:
        sql += f" AND group_id = (SELECT id FROM {q(PromptGroup._meta.db_table)} WHERE uid = %s)"
    return sql + " RETURNING id, policy_version_id, group_id"


def _claim_params(claim: FusedClaim, n: int) -> list[Any]:
    params: list[Any] = [
        n,
        connection.ops.adapt_datetimefield_value(timezone.now()),
        claim.uid,
        claim.expected,
        *(claim.sources or ()),
    ]
    if claim.group_uid:
        params.append(claim.group_uid)
    return params


# --- PostgreSQL -----------------------------------------------------------------------------------
class PostgresBackend:
    def insert_steps(self, rows: Sequence[Step]) -> None:
        """Binary COPY (``_copy_insert``). Django's bulk_create built one multi-row INSERT
        whose client-side parameter binding cost ~1 ms per W-ingest step (pyinstrument);
        COPY sends bytea as raw bytes."""
        _copy_insert(Step, rows)

    def append(self, claim: FusedClaim, rows: Sequence[Step], *, alone: bool = True) -> Appended | None:
        """Claim (or create) the trajectory and insert the steps in ONE statement, a
        data-modifying CTE::

            WITH t AS (UPDATE trajectory SET step_count = step_count + n ... RETURNING id, ...)
            INSERT INTO step (...) SELECT ..., t.id, ... FROM t [UNION ALL ...]
            RETURNING id, step_index, trajectory_id, (SELECT group_id FROM t), ...

        A claim that matches no row inserts nothing. Parameters are bound server-side (token
        blobs travel as binary bytea, not escaped hex), and the text depends only on the
        call's shape, so it is prepared once per connection (pool/prepared.py; off with
        CLAW_DB_PREPARE=0): planning this CTE costs 0.3-0.5 ms per call otherwise (measured)."""
        conn = connections[DEFAULT_DB_ALIAS]  # once: each `connection.x` is a context-local lookup
        n_sources = None if claim.sources is None else len(claim.sources)
        if claim.new is not None:
            grouped = (
                "new"
                if claim.new_group is not None
                else "anchored"
                if claim.group_anchor is not None
                else None
            )
            shape: tuple = ("new", len(rows), grouped, n_sources if grouped else None, not claim.minted)
            if grouped == "new":
                params = [  # in the order of the text (_fused_sql)
                    *_values(_getters(PromptGroup), claim.new_group),
                    claim.group_uid,
                    *_values(_getters(Trajectory, skip="group_id"), claim.new),
                    *(claim.sources or ()),
                ]
            elif grouped == "anchored":
                params = [
                    *_values(_getters(Trajectory, skip="group_id"), claim.new),
                    claim.group_uid,
                    claim.group_anchor,
                    *(claim.sources or ()),
                ]
            else:
                params = _values(_getters(Trajectory), claim.new)
        else:
            shape = ("claim", len(rows), bool(claim.group_uid), n_sources)
            params = _claim_params(claim, len(rows))
        sql = _fused.get(shape)
        if sql is None:
            sql = _fused[shape] = _fused_sql(shape)
        getters = _getters(Step, skip="trajectory_id")
        for row in rows:
            params.extend(_values(getters, row))
        conn.ensure_connection()
        prepare = True if prepared.enabled(conn) else None
        cur = _raw_cursor(conn.connection)
        # A statement that may insert a group and then miss (the trajectory exists, the group
        # has an anchor or another source's) is undone alone: nothing of a missed claim stays.
        undo = claim.new_group is not None
        if not alone and not undo:  # a group commit's: an error is the group's (Backend.append)
            with conn.wrap_database_errors:
                cur.execute(sql, params, prepare=prepare)
                got = cur.fetchall()
            return _appended(got)
        try:
            # Alone (autocommit) the statement is its own transaction; inside a caller's
            # transaction a savepoint keeps a failure from breaking it.
            with transaction.atomic() if conn.in_atomic_block or undo else nullcontext():
                with conn.wrap_database_errors:
                    cur.execute(sql, params, prepare=prepare)
                    got = cur.fetchall()
                if undo and not got:
                    raise _Missed
        except (_Missed, IntegrityError):
            return None  # e.g. a white-box step already holds one of the uids: the general path says so
        return _appended(got)


_cursors: weakref.WeakKeyDictionary[psycopg.Connection, psycopg.RawCursor] = weakref.WeakKeyDictionary()


def _raw_cursor(raw: psycopg.Connection) -> psycopg.RawCursor:
    """One RawCursor per psycopg connection, kept (a new cursor builds its adapters: ~11 of
    the ~70 us of an insert's client side). A connection is used by one thread at a time."""
    cur = _cursors.get(raw)
    if cur is None or cur.closed:
        cur = _cursors[raw] = psycopg.RawCursor(raw)
    return cur


def _appended(got: list[tuple]) -> Appended | None:
    if not got:
        return None
    return Appended({index: sid for sid, index, *_ in got}, got[0][2], got[0][3], got[0][4])


_fused: dict[tuple, str] = {}


def _fused_sql(shape: tuple) -> str:
    q = connection.ops.quote_name
    ctes = ""
    if shape[0] == "new":
        _, _, grouped, n_sources, if_absent = shape
        fields = [f for f, _ in _columns(Trajectory)]
        names = ", ".join(q(str(f.column)) for f in fields)
        absent = " ON CONFLICT (uid) DO NOTHING" if if_absent else ""
        group = q(PromptGroup._meta.db_table)
        owned = (
            ""
            if n_sources is None
            else f" AND (gg.source_id IS NULL OR gg.source_id IN ({', '.join(['%s'] * n_sources)}))"
        )
        values = ", ".join("gg.id" if f.attname == "group_id" else _placeholder(f) for f in fields)
        if grouped == "anchored":  # an existing group whose anchor the first step is stored against
            claim = (
                f"INSERT INTO {q(Trajectory._meta.db_table)} ({names}) SELECT {values} FROM {group} gg "
                f"WHERE gg.uid = %s AND gg.anchor_step_id = %s{owned}{absent} "
                "RETURNING id, policy_version_id, group_id"
            )
        elif grouped == "new":  # a new group, or one without an anchor yet
            gfields = [f for f, _ in _columns(PromptGroup)]
            ctes = (
                f"g AS (INSERT INTO {group} ({', '.join(q(str(f.column)) for f in gfields)}) "
                f"VALUES ({', '.join(_placeholder(f) for f in gfields)}) ON CONFLICT (uid) DO NOTHING "
                "RETURNING id, source_id, anchor_step_id), "
                "gg AS (SELECT id, source_id, anchor_step_id FROM g UNION ALL "
                f"SELECT id, source_id, anchor_step_id FROM {group} WHERE uid = %s AND NOT EXISTS (SELECT FROM g)), "
            )
            claim = (
                f"INSERT INTO {q(Trajectory._meta.db_table)} ({names}) SELECT {values} FROM gg "
                f"WHERE gg.anchor_step_id IS NULL{owned}{absent} RETURNING id, policy_version_id, group_id"
            )
        else:
            claim = (
                f"INSERT INTO {q(Trajectory._meta.db_table)} ({names}) "
                f"VALUES ({', '.join(_placeholder(f) for f in fields)}){absent} "
                "RETURNING id, policy_version_id, group_id"
            )
    else:
        claim = _claim_sql(group=shape[2], sources=shape[3])
    fields = [f for f, _ in _columns(Step)]
    exprs = []
    for f in fields:
        if f.attname == "trajectory_id":
            exprs.append("t.id")
        elif f.attname == "policy_version_id":  # the call's version, else the trajectory's
            exprs.append(f"COALESCE({_placeholder(f)}, t.policy_version_id)")
        else:
            exprs.append(_placeholder(f))
    one = f"SELECT {', '.join(exprs)} FROM t"
    return _numbered(
        f"WITH {ctes}t AS ({claim}) INSERT INTO {q(Step._meta.db_table)} ({', '.join(q(str(f.column)) for f in fields)}) "
        f"{' UNION ALL '.join([one] * shape[1])} "
        f"RETURNING id, step_index, trajectory_id, (SELECT group_id FROM t), (SELECT policy_version_id FROM t)"
    )


def _numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders as PostgreSQL's own ``$1, $2, ...``, for a
    RawCursor: psycopg re-parses a query of more than 50 parameters or 4 KB on every execute
    (it caches only smaller ones), which was a third of a proxied call's recording CPU."""
    assert "%%" not in sql
    parts = sql.split("%s")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]


def _placeholder(f: models.Field) -> str:
    db_type = f.rel_db_type(connection) if f.is_relation else f.db_type(connection)
    assert db_type is not None, f.name
    return f"%s::{db_type}"


# --- SQLite and others ----------------------------------------------------------------------------
class OrmBackend:
    def insert_steps(self, rows: Sequence[Step]) -> None:
        if rows:
            Step.objects.bulk_create(rows, batch_size=500)

    def append(self, claim: FusedClaim, rows: Sequence[Step], *, alone: bool = True) -> Appended | None:
        """The same claim and insert as PostgresBackend.append, in one short transaction (a
        savepoint in a group commit's: a claim that missed is rolled back alone)."""
        try:
            with transaction.atomic():
                if claim.new is not None:
                    if claim.new_group is not None or claim.group_anchor is not None:
                        claim.new.group_id = _group_joinable(claim)
                    if not claim.minted and Trajectory.objects.filter(uid=claim.uid).exists():
                        raise _Missed
                    claim.new.save(force_insert=True)
                    traj_id, version, group_id = claim.new.id, claim.new.policy_version_id, claim.new.group_id
                else:
                    with connection.cursor() as cur:
                        n_sources = None if claim.sources is None else len(claim.sources)
                        cur.execute(
                            _claim_sql(group=bool(claim.group_uid), sources=n_sources),
                            _claim_params(claim, len(rows)),
                        )
                        got = cur.fetchone()
                    if got is None:
                        raise _Missed
                    traj_id, version, group_id = got
                for row in rows:
                    row.trajectory_id = traj_id
                    if row.policy_version_id is None:
                        row.policy_version_id = version
                Step.objects.bulk_create(rows)
        except (_Missed, IntegrityError):
            return None
        return Appended({row.step_index: row.id for row in rows}, traj_id, group_id, version)


class _Missed(Exception):
    """The conditional claim matched no row: roll back, nothing was written."""


def _group_joinable(claim: FusedClaim) -> int:
    """OrmBackend: the id of the new trajectory's group (FusedClaim): ``new_group`` inserted
    when no row has its uid, else the existing one if its anchor is ``group_anchor`` (None:
    none yet) and the writer may join it; _Missed otherwise."""
    got = (
        PromptGroup.objects.filter(uid=claim.group_uid)
        .values_list("id", "source_id", "anchor_step_id")
        .first()
    )
    if got is None:
        if claim.new_group is None:
            raise _Missed
        claim.new_group.save(force_insert=True)
        return claim.new_group.id
    gid, source_id, anchor = got
    if anchor != claim.group_anchor or not (
        claim.sources is None or source_id is None or source_id in claim.sources
    ):
        raise _Missed
    return gid


_POSTGRES = PostgresBackend()
_ORM = OrmBackend()


# --- rows and parameters --------------------------------------------------------------------------
def new_instance(model: type[models.Model], values: dict[str, Any]) -> models.Model:
    """Build an unsaved instance from attname -> value without Model.__init__ (which costs
    ~30 us per row through its kwargs handling). Every concrete field not in ``values`` gets
    its default; the primary key and auto_now columns are filled by the backend. Defaults
    that are constants are computed once per model (``Field.get_default`` per field and row
    was most of a 1,000-reward batch's audit rows, pyinstrument)."""
    obj = model.__new__(model)
    obj._state = ModelState()
    d = obj.__dict__
    for attname, const, default in _defaults(model):
        if attname in values:
            d[attname] = values[attname]
        else:
            d[attname] = default if const else default()
    return obj


_field_defaults: dict[type[models.Model], tuple[tuple[str, bool, Any], ...]] = {}


def _defaults(model: type[models.Model]) -> tuple[tuple[str, bool, Any], ...]:
    """(attname, is a constant, the constant or the field's get_default) per concrete field,
    as Django's ``Field.get_default`` gives them: a default that is not callable is the same
    object on every call (Django shares it too), a field without one None or ""; a callable
    or database default is asked per row."""
    got = _field_defaults.get(model)
    if got is None:
        rows = []
        for f in model._meta.concrete_fields:
            if f.primary_key or getattr(f, "auto_now_add", False):
                rows.append((f.attname, True, None))
            elif (f.has_default() and callable(f.default)) or getattr(
                f, "db_default", models.NOT_PROVIDED
            ) is not models.NOT_PROVIDED:
                rows.append((f.attname, False, f.get_default))
            else:
                rows.append((f.attname, True, f.get_default()))
        got = _field_defaults[model] = tuple(rows)
    return got


def column_converter(field: models.Field) -> Callable[[Any], Any] | None:
    """How a non-NULL attribute value becomes a parameter for ``field``'s column, or None
    when it goes as is: JSON serialised with orjson (as jsonb on PostgreSQL), binary as bytes,
    and on other databases datetimes as their text form."""
    if isinstance(field, models.JSONField):
        return _json if connection.vendor == "postgresql" else _orjson_dumps
    if isinstance(field, models.BinaryField):
        return _bytes
    if isinstance(field, models.DateTimeField) and connection.vendor != "postgresql":
        return connection.ops.adapt_datetimefield_value
    target = field.target_field if field.is_relation else field
    if isinstance(target, models.UUIDField) and connection.vendor != "postgresql":
        return _uuid_hex  # Django stores UUIDs as 32 hex characters where there is no uuid type
    return None


def _json(value: Any) -> Any:
    return Jsonb(value, dumps=_orjson_dumps)


def _orjson_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _uuid_hex(value: Any) -> str:
    return value.hex


def _bytes(value: Any) -> bytes:
    return bytes(value)


def _param(f: models.Field, conv: Callable[[Any], Any] | None, obj: models.Model) -> object:
    value = getattr(obj, f.attname)
    return conv(value) if conv is not None and value is not None else value


def _values(getters: Sequence[tuple[str, Callable[[Any], Any] | None]], obj: models.Model) -> list[Any]:
    """The parameters of ``obj``'s columns, read from its ``__dict__`` (a column's value sits
    there under its attname): a getattr per column went through Django's DeferredAttribute
    descriptor, ~40% of building a proxied call's 56 parameters."""
    d = obj.__dict__
    out = []
    for attname, conv in getters:
        value = d[attname]
        out.append(conv(value) if conv is not None and value is not None else value)
    return out


_getters_cache: dict[
    tuple[str, type[models.Model], str | None], list[tuple[str, Callable[[Any], Any] | None]]
] = {}


def _getters(
    model: type[models.Model], *, skip: str | None = None
) -> list[tuple[str, Callable[[Any], Any] | None]]:
    """(attname, converter) of ``_columns(model)``, less the column ``skip``."""
    key = (connection.vendor, model, skip)
    got = _getters_cache.get(key)
    if got is None:
        got = _getters_cache[key] = [(f.attname, c) for f, c in _columns(model) if f.attname != skip]
    return got


_columns_cache: dict[
    tuple[str, type[models.Model]], list[tuple[models.Field, Callable[[Any], Any] | None]]
] = {}


_pg_types_cache: dict[type[models.Model], list[str]] = {}


def _pg_types(model: type[models.Model]) -> list[str]:
    """The PostgreSQL type of each column ``_columns`` writes (for ``_rows``' typed arrays)."""
    types = _pg_types_cache.get(model)
    if types is None:
        types = _pg_types_cache[model] = [_pg_type(f) for f, _ in _columns(model)]
    return types


def _pg_type(f: models.Field) -> str:
    db_type = f.rel_db_type(connection) if f.is_relation else f.db_type(connection)
    return re.sub(r"\(.*\)", "", db_type or "text").strip()


def _columns(model: type[models.Model]) -> list[tuple[models.Field, Callable[[Any], Any] | None]]:
    """(field, value converter) of each column written, the primary key excepted."""
    key = (connection.vendor, model)
    cols = _columns_cache.get(key)
    if cols is None:
        cols = _columns_cache[key] = [
            (f, column_converter(f)) for f in model._meta.concrete_fields if not f.primary_key
        ]
    return cols


_copy_plans: dict[type[models.Model], _CopyPlan] = {}


def rows_insert(rows: Sequence[models.Model]) -> None:
    """Insert unsaved rows of one model and set their primary keys: binary COPY on
    PostgreSQL (audit rows by the thousand: RewardEvent, LabelEvent), bulk_create elsewhere.
    Inside the caller's transaction."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        _copy_insert(type(rows[0]), rows)
    else:
        type(rows[0]).objects.bulk_create(rows, batch_size=500)


def _copy_insert(model: type[models.Model], rows: Sequence[models.Model]) -> None:
    """Ids are reserved from the identity sequence in one round trip, then the rows stream
    through ``COPY ... FROM STDIN (FORMAT BINARY)`` inside the caller's transaction."""
    if not rows:
        return
    plan = _copy_plan(model)
    with prepared.cursor() as cur:
        # nextval() for n ids at once: the ids are ours even if the transaction aborts.
        cur.execute("SELECT nextval(%s) FROM generate_series(1, %s)", [plan.seq, len(rows)])
        ids = [row[0] for row in cur.fetchall()]
    now = timezone.now()
    raw = connection.connection  # the psycopg connection of Django's (atomic) transaction
    values, converted, stamped = plan.values, plan.converted, plan.stamped
    try:
        with raw.cursor() as cur, cur.copy(plan.statement) as copy:
            copy.set_types(plan.pg_types)
            for obj, pk in zip(rows, ids, strict=True):
                obj.pk = pk
                for attname in stamped:
                    setattr(obj, attname, now)
                row = list(values(obj))  # every column at once (operator.attrgetter, in C)
                for i, conv in converted:
                    if row[i] is not None:
                        row[i] = conv(row[i])
                copy.write_row(row)
    except psycopg.errors.IntegrityError as exc:
        # Raw psycopg errors bypass Django's wrapper; callers (and their retries) expect this.
        raise IntegrityError(str(exc)) from exc
    alias = connection.alias  # (a thread-local lookup: once, not per row)
    for obj in rows:
        obj._state.adding = False
        obj._state.db = alias


@dataclass(frozen=True, slots=True)
class _CopyPlan:
    """How a model's rows stream through binary COPY (``_copy_insert``)."""

    statement: str
    seq: str
    pg_types: list[str]
    values: Callable[[models.Model], tuple]  # every concrete column's attribute, in order
    converted: tuple[tuple[int, Callable[[Any], Any]], ...]  # (column, converter) for non-NULL values
    stamped: tuple[str, ...]  # auto_now / auto_now_add attributes, set to the write's time


def _copy_plan(model: type[models.Model]) -> _CopyPlan:
    plan = _copy_plans.get(model)
    if plan is not None:
        return plan
    meta = model._meta
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_serial_sequence(%s, %s)", [meta.db_table, meta.pk.column])
        seq = cur.fetchone()[0]
    fields = meta.concrete_fields
    converted = []
    for i, f in enumerate(fields):
        conv = column_converter(f)
        # Binary COPY takes bytes-like values as they are (bytes, memoryview).
        if conv is not None and conv is not _bytes:
            converted.append((i, conv))
    quote = connection.ops.quote_name
    plan = _copy_plans[model] = _CopyPlan(
        statement=(
            f"COPY {quote(meta.db_table)} ({', '.join(quote(str(f.column)) for f in fields)}) "
            "FROM STDIN (FORMAT BINARY)"
        ),
        seq=seq,
        pg_types=[_pg_type(f) for f in fields],
        # (a tuple even for a model of one column: attrgetter of one name returns the value)
        values=operator.attrgetter(*(f.attname for f in fields))
        if len(fields) > 1
        else (lambda obj, name=fields[0].attname: (getattr(obj, name),)),
        converted=tuple(converted),
        stamped=tuple(
            f.attname for f in fields if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        ),
    )
    return plan


# --- retention: whole groups out, kept token chains re-based ----------------------------------
def steps_rebase(rows: Sequence[tuple[int, bytes]]) -> None:
    """Store these steps whole: (step id, full sequence bytes) -> no token parent, nothing
    shared, the whole sequence as the delta, depth 0. Their ids read exactly as before (and
    so do their descendants', which share a prefix of them). One statement per call."""
    if not rows:
        return
    table = connection.ops.quote_name(Step._meta.db_table)
    cte, params = _rows(("id", "whole"), ("bigint", "bytea"), [(i, bytes(b)) for i, b in rows])
    sql = f"""
        WITH {cte}
        UPDATE {table} SET seq_parent_id = NULL, seq_shared = 0, seq_delta = v.whole, seq_depth = 0
        FROM v WHERE {table}.id = v.id
    """
    with connection.cursor() as cur:
        cur.execute(sql, params)


def rows_delete(model: type[models.Model], ids: Sequence[int]) -> int:
    """DELETE the rows of ``model`` with these primary keys, in one statement; returns how
    many went. The caller has removed or re-pointed what references them first (foreign
    keys are checked at commit)."""
    if not ids:
        return 0
    table = connection.ops.quote_name(model._meta.db_table)
    pk = connection.ops.quote_name(model._meta.pk.column)
    if connection.vendor == "postgresql":
        sql, params = f"DELETE FROM {table} WHERE {pk} = ANY(%s)", [list(ids)]
    else:
        sql, params = f"DELETE FROM {table} WHERE {pk} IN ({', '.join(['%s'] * len(ids))})", list(ids)
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def unit_marks_insert(
    into: type[models.Model],
    per: type[models.Model],
    *,
    units: Sequence[int],
    trajectory_ids: Sequence[int],
    step_ids: Sequence[int],
) -> None:
    """PostgreSQL: one row of ``into`` (its foreign key to ``per``, ``unit``) for each row of
    ``per`` and each unit (a group's id, or minus a lone trajectory's id) named, or of these
    trajectories and steps, in one statement, run whether or not ``per`` has rows (the
    INSERT's table lock is what curation/services/counts.py relies on)."""
    fk = next(f.column for f in into._meta.concrete_fields if f.is_relation and f.related_model is per)
    traj, step = _q(Trajectory._meta.db_table), _q(Step._meta.db_table)
    parts, params = [], []
    if units:
        parts.append("SELECT unnest(%s::bigint[]) AS unit")
        params.append(list(units))
    if trajectory_ids:
        parts.append(f"SELECT COALESCE(t.group_id, -t.id) AS unit FROM {traj} t WHERE t.id = ANY(%s)")
        params.append(list(trajectory_ids))
    if step_ids:
        parts.append(
            f"SELECT COALESCE(t.group_id, -t.id) AS unit FROM {step} s JOIN {traj} t ON t.id = s.trajectory_id "
            "WHERE s.id = ANY(%s)"
        )
        params.append(list(step_ids))
    if not parts:
        return
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {_q(into._meta.db_table)} ({_q(fk)}, unit) SELECT p.id, u.unit FROM {_q(per._meta.db_table)} p "
            f"CROSS JOIN ({' UNION '.join(parts)}) u",
            params,
        )


def rows_take(model: type[models.Model], column: str, value: Any, returning: str) -> list[Any]:
    """Delete the rows of ``model`` whose ``column`` is ``value`` and return their
    ``returning`` column (``DELETE ... RETURNING``: PostgreSQL, SQLite >= 3.35). Rows a
    transaction still holds uncommitted are not seen, and stay."""
    with connection.cursor() as cur:
        cur.execute(
            f"DELETE FROM {_q(model._meta.db_table)} WHERE {_q(column)} = %s RETURNING {_q(returning)}",
            [value],
        )
        return [r[0] for r in cur.fetchall()]


def table_lock(model: type[models.Model], mode: str) -> None:
    """PostgreSQL: ``LOCK TABLE`` in ``mode`` (e.g. "SHARE"), to the transaction's end."""
    with connection.cursor() as cur:
        cur.execute(f"LOCK TABLE {_q(model._meta.db_table)} IN {mode} MODE")
