"""Write services for the OpenAI-compatible gateway (gateway/proxy) and the Claw-R1
compatibility layer (gateway/compat).

A proxied call becomes one step per choice:

* **step_index** is reserved with an atomic update of the trajectory's ``step_count``, so
  concurrent calls of one trajectory get consecutive, distinct indexes (see the two paths
  below). Every call is a new generation: recording is not idempotent.
* **n > 1**: the choices are alternative answers to one prompt. They take consecutive
  indexes ``k .. k+n-1`` (uids ``<trajectory>:<index>``) and carry ``metadata.choice_index``
  and ``metadata.n``. The next call's drift reference is whichever of them its prompt
  extends (an agent continues one choice).
* **Drift**: a step's prompt ids should start with the previous call's prompt + response ids.
  When no previous choice is a prefix of the prompt, the step is stored with ``drift=True``
  and ``drift_offset`` = the first mismatching position (the longest common prefix with any
  previous choice). Nothing is repaired or truncated.

Two write paths, same rows:

* **fast** (the hot path: a trajectory the gateway just minted, or the next call of one whose
  last call this process recorded): one statement claims the indexes with a conditional
  ``UPDATE ... SET step_count = step_count + n WHERE step_count = <expected>`` (or inserts
  the new trajectory) and inserts the steps. On PostgreSQL it is a single data-modifying
  CTE: one round trip and one commit per call. If the claim does not match (another writer
  got there first, the trajectory ended), nothing is written and the general path runs.
* **general**: ``UPDATE ... RETURNING`` reserves the indexes (its row lock serialises
  concurrent calls of one trajectory until commit, so the second sees the first's steps),
  the previous call is looked up, and the steps go through ``steps_ingest``.

The previous call's sequences come from a small in-process LRU keyed by trajectory and
otherwise from the pool (``tokens.load_sequences``). An entry is used only when it ends
exactly at the reserved index (checked by the claim), so it is never stale, whatever other
processes do.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone

from .. import tokens
from ..bulk import column_converter
from ..errors import Conflict, InvalidInput
from ..models import Channel, Event, PromptGroup, Step, Trajectory
from .policy import policy_version_ensure
from .rewards import RewardIn, rewards_apply
from .steps import StepIn, pack_step, step_row, steps_ingest
from .trajectories import trajectory_complete


@dataclass(slots=True)
class ProxiedChoice:
    """One choice of an upstream answer, with its exact token ids."""

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    rollout_logprobs: np.ndarray | None = None
    finish_reason: str | None = None
    response_text: str | None = None
    metadata: dict = field(default_factory=dict)


@dataclass(slots=True)
class ProxiedCall:
    """A completed upstream call: who made it, what was asked, every choice."""

    trajectory_uid: str
    choices: list[ProxiedChoice]
    token_source: str
    prompt_group_uid: str | None = None
    policy_version: int | None = None
    messages: list | None = None
    metadata: dict = field(default_factory=dict)
    # The gateway minted the trajectory uid for this call: no row can exist yet.
    new_trajectory: bool = False


@dataclass(slots=True)
class RecordedStep:
    uid: str
    step_index: int
    drift: bool
    drift_offset: int | None


def proxy_step_record(*, call: ProxiedCall, source_id: int | None = None) -> list[RecordedStep]:
    """Store one step per choice of ``call`` atomically (see the module docstring).

    Creates the trajectory (and prompt group, policy version) on first sight. Not idempotent:
    every call is a new generation and gets new step indexes. Raises Conflict when the
    trajectory has ended or belongs to another prompt group, InvalidInput when a step exceeds
    CLAW_MAX_TOKENS_PER_STEP (never truncated); nothing is written then.
    """
    n = len(call.choices)
    if n == 0:
        raise InvalidInput("the upstream answer has no choices", field="choices")
    limit = settings.CLAW_MAX_TOKENS_PER_STEP
    for i, c in enumerate(call.choices):
        if len(c.prompt_ids) == 0:
            raise InvalidInput("the prompt has no token ids", field=f"choices[{i}].prompt_token_ids")
        if len(c.prompt_ids) + len(c.response_ids) > limit:
            raise InvalidInput(
                f"prompt + response hold {len(c.prompt_ids) + len(c.response_ids)} tokens; the limit is {limit}",
                field=f"choices[{i}]",
            )
    recorded = _record_fast(call, source_id)
    if recorded is None:
        recorded = _record_general(call, source_id)
    return recorded


def _record_general(call: ProxiedCall, source_id: int | None) -> list[RecordedStep]:
    """The general path: reserve indexes (row lock), find the previous call, steps_ingest."""
    n = len(call.choices)
    with transaction.atomic():
        traj_id, end, group_uid, policy_version = _reserve(call, n, source_id=source_id)
        start = end - n
        previous = _previous_call(call.trajectory_uid, traj_id, start) if start > 0 else []
        if policy_version is None:
            policy_version = call.policy_version
        steps, recorded = _steps_in(call, start, previous, policy_version, call.prompt_group_uid or group_uid)
        result = steps_ingest(steps=steps, source_id=source_id)
        by_uid = {st.uid: st for st in result.created}
        latest = [_Prev(by_uid[s.uid].id, by_uid[s.uid].seq_depth, _full(s)) for s in steps]
        transaction.on_commit(lambda: _recent.put(call.trajectory_uid, end, latest))
    return recorded


def _record_fast(call: ProxiedCall, source_id: int | None) -> list[RecordedStep] | None:
    """The common cases in one statement: a trajectory the gateway just minted (no group),
    or the next call of a trajectory whose last call this process recorded (the LRU knows
    its end index and sequences). The index is claimed by a conditional UPDATE (``WHERE
    step_count = <expected>``); if anything changed meanwhile nothing is written and None
    is returned (the caller takes the general path)."""
    if call.policy_version is not None and call.policy_version not in _known_versions:
        return None
    if call.new_trajectory:
        if call.prompt_group_uid:  # a group's first step: anchors are steps_ingest's business
            return None
        start, previous = 0, list[_Prev]()
    else:
        hit = _recent.latest(call.trajectory_uid)
        if hit is None:
            return None
        start, previous = hit
    steps, recorded = _steps_in(call, start, previous, call.policy_version, call.prompt_group_uid)
    rows = [_step_row(s, previous, source_id) for s in steps]
    try:
        if connection.vendor == "postgresql":
            # Alone (autocommit) the statement is its own transaction; inside a caller's
            # transaction a savepoint keeps a failure from breaking it.
            with transaction.atomic() if connection.in_atomic_block else nullcontext():
                ids = _insert_fast_pg(call, start, rows, source_id)
        else:
            ids = _insert_fast_orm(call, start, rows, source_id)
    except IntegrityError:
        ids = None  # e.g. a white-box step already holds one of the uids: the general path says so
    if ids is None:
        return None
    latest = [_Prev(ids[s.step_index], row.seq_depth, _full(s)) for s, row in zip(steps, rows, strict=True)]
    end = start + len(steps)
    transaction.on_commit(lambda: _recent.put(call.trajectory_uid, end, latest))
    return recorded


def _steps_in(
    call: ProxiedCall, start: int, previous: list[_Prev], policy_version: int | None, group_uid: str | None
) -> tuple[list[StepIn], list[RecordedStep]]:
    n = len(call.choices)
    steps: list[StepIn] = []
    recorded: list[RecordedStep] = []
    for i, c in enumerate(call.choices):
        drift, offset = _drift(c.prompt_ids, previous)
        meta = dict(call.metadata)
        meta.update(c.metadata)
        if n > 1:
            meta["choice_index"] = i
            meta["n"] = n
        idx = start + i
        uid = f"{call.trajectory_uid}:{idx}"
        steps.append(
            StepIn(
                uid=uid,
                trajectory_uid=call.trajectory_uid,
                step_index=idx,
                prompt_ids=c.prompt_ids,
                response_ids=c.response_ids,
                prompt_group_uid=group_uid,
                rollout_logprobs=c.rollout_logprobs,
                policy_version=policy_version,
                finish_reason=c.finish_reason[:32] if c.finish_reason else None,
                messages=call.messages,
                response_text=c.response_text,
                metadata=meta,
                token_source=call.token_source,
                drift=drift,
                drift_offset=offset,
                field_prefix=f"choices[{i}]",
            )
        )
        recorded.append(RecordedStep(uid=uid, step_index=idx, drift=drift, drift_offset=offset))
    return steps, recorded


def _step_row(s: StepIn, previous: list[_Prev], source_id: int | None) -> Step:
    """The Step row steps_ingest would write for ``s``: stored as a delta against the
    previous call's step it shares the longest prefix with (pool/tokens.py)."""
    packed = pack_step(s)
    parent: _Prev | None = None
    best = -1
    for p in previous:
        shared = tokens.common_prefix_len(packed.full, p.full)
        if shared > best:
            parent, best = p, shared
    if parent is None or best < tokens.MIN_SHARED_TOKENS:
        parent = None
    row = step_row(
        s,
        packed,
        trajectory_id=None,
        parent_id=parent.step_id if parent else None,
        parent_full=parent.full if parent else None,
        parent_depth=parent.depth if parent else 0,
        source_id=source_id,
    )
    row.created_at = row.updated_at = timezone.now()
    return row


def _claim_sql(call: ProxiedCall, start: int, n: int) -> tuple[str, list]:
    """``UPDATE trajectory ... RETURNING id, policy_version_id`` that claims indexes
    [start, start+n) only if nobody took them and the trajectory still runs (and is in the
    call's group, when it names one)."""
    params: list = [
        n,
        connection.ops.adapt_datetimefield_value(timezone.now()),
        call.trajectory_uid,
        start,
        Trajectory.Status.RUNNING,
    ]
    if call.prompt_group_uid:
        params.append(call.prompt_group_uid)
    return _claim_sql_text(group=bool(call.prompt_group_uid)), params


def _claim_sql_text(*, group: bool) -> str:
    q = connection.ops.quote_name
    sql = (
        f"UPDATE {q(Trajectory._meta.db_table)} SET step_count = step_count + %s, updated_at = %s "
        f"WHERE uid = %s AND step_count = %s AND status = %s"
    )
    if group:
        sql += f" AND group_id = (SELECT id FROM {q(PromptGroup._meta.db_table)} WHERE uid = %s)"
    return sql + " RETURNING id, policy_version_id"


def _new_trajectory(call: ProxiedCall, n: int, source_id: int | None) -> Trajectory:
    now = timezone.now()
    return Trajectory(
        uid=call.trajectory_uid,
        source_id=source_id,
        policy_version_id=call.policy_version,
        step_count=n,
        created_at=now,
        updated_at=now,
    )


def _insert_fast_pg(
    call: ProxiedCall, start: int, rows: list[Step], source_id: int | None
) -> dict[int, int] | None:
    """PostgreSQL: claim (or create) the trajectory and insert the steps in ONE statement
    (a data-modifying CTE): a recorded call costs one round trip and one commit.

    Parameters are bound server-side (token blobs travel as binary bytea instead of escaped
    hex text), and the statement text only depends on the call's shape, so it is prepared
    once per connection: planning this CTE costs 0.3-0.5 ms per call otherwise (measured).
    Django leaves automatic preparation off for the sake of transaction-mode poolers; set
    CLAW_PROXY_PREPARED_STATEMENTS = False behind one that cannot keep prepared statements
    (pgbouncer before 1.21)."""
    shape: tuple[str, int, bool]
    if call.new_trajectory:
        shape = ("new", len(rows), False)
        traj = _new_trajectory(call, len(rows), source_id)
        params = [_param(f, conv, traj) for f, conv in _plan(Trajectory)]
    else:
        shape = ("claim", len(rows), bool(call.prompt_group_uid))
        _, params = _claim_sql(call, start, len(rows))
    sql = _fast_sql.get(shape)
    if sql is None:
        sql = _fast_sql[shape] = _build_fast_sql(shape)
    for row in rows:
        params.extend(_param(f, conv, row) for f, conv in _plan(Step) if f.attname != "trajectory_id")
    connection.ensure_connection()
    prepare = True if getattr(settings, "CLAW_PROXY_PREPARED_STATEMENTS", True) else None
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cur:
        cur.execute(sql, params, prepare=prepare)
        got = {index: sid for sid, index in cur.fetchall()}
    return got or None


_fast_sql: dict[tuple, str] = {}


def _build_fast_sql(shape: tuple) -> str:
    q = connection.ops.quote_name
    if shape[0] == "new":
        fields = [f for f, _ in _plan(Trajectory)]
        claim = (
            f"INSERT INTO {q(Trajectory._meta.db_table)} ({', '.join(q(str(f.column)) for f in fields)}) "
            f"VALUES ({', '.join(_placeholder(f) for f in fields)}) RETURNING id, policy_version_id"
        )
    else:
        claim = _claim_sql_text(group=shape[2])
    fields = [f for f, _ in _plan(Step)]
    exprs = []
    for f in fields:
        if f.attname == "trajectory_id":
            exprs.append("t.id")
        elif f.attname == "policy_version_id":  # the call's version, else the trajectory's
            exprs.append(f"COALESCE({_placeholder(f)}, t.policy_version_id)")
        else:
            exprs.append(_placeholder(f))
    one = f"SELECT {', '.join(exprs)} FROM t"
    return (
        f"WITH t AS ({claim}) INSERT INTO {q(Step._meta.db_table)} ({', '.join(q(str(f.column)) for f in fields)}) "
        f"{' UNION ALL '.join([one] * shape[1])} RETURNING id, step_index"
    )


_plans: dict[type[models.Model], list[tuple[models.Field, Callable[[Any], Any] | None]]] = {}


def _plan(model: type[models.Model]) -> list[tuple[models.Field, Callable[[Any], Any] | None]]:
    """(field, value converter) of each column written, the primary key excepted."""
    plan = _plans.get(model)
    if plan is None:
        plan = _plans[model] = [
            (f, column_converter(f)) for f in model._meta.concrete_fields if not f.primary_key
        ]
    return plan


def _placeholder(f: models.Field) -> str:
    db_type = f.rel_db_type(connection) if f.is_relation else f.db_type(connection)
    assert db_type is not None, f.name
    return f"%s::{db_type}"


def _param(f: models.Field, conv: Callable[[Any], Any] | None, obj: models.Model) -> object:
    value = getattr(obj, f.attname)
    return conv(value) if conv is not None and value is not None else value


class _Miss(Exception):
    """The fast path's claim did not match: nothing was written."""


def _insert_fast_orm(
    call: ProxiedCall, start: int, rows: list[Step], source_id: int | None
) -> dict[int, int] | None:
    """Other databases (SQLite): the same claim and insert in one short transaction."""
    try:
        with transaction.atomic():
            if call.new_trajectory:
                traj = _new_trajectory(call, len(rows), source_id)
                traj.save(force_insert=True)
                traj_id, version = traj.id, traj.policy_version_id
            else:
                sql, params = _claim_sql(call, start, len(rows))
                with connection.cursor() as cur:
                    cur.execute(sql, params)
                    got = cur.fetchone()
                if got is None:
                    raise _Miss
                traj_id, version = got
            for row in rows:
                row.trajectory_id = traj_id
                if row.policy_version_id is None:
                    row.policy_version_id = version
            Step.objects.bulk_create(rows)
    except _Miss:
        return None
    return {row.step_index: row.id for row in rows}


def proxy_event_record(
    *, type: str, payload: dict, trajectory_uid: str | None = None, source_id: int | None = None
) -> Event:
    """Record a gateway event (upstream fault, untokenized call, failed recording).

    Links the trajectory when it exists (never creates one: a failed first call leaves no
    empty trajectory behind); the uid is always in the payload. Not idempotent.
    """
    traj_id = None
    if trajectory_uid:
        payload = {"trajectory_uid": trajectory_uid, **payload}
        traj_id = Trajectory.objects.filter(uid=trajectory_uid).values_list("id", flat=True).first()
    return Event.objects.create(
        type=type, payload=payload, trajectory_id=traj_id, source_id=source_id, occurred_at=timezone.now()
    )


@transaction.atomic
def proxy_trajectory_register(
    *,
    uid: str,
    prompt_group_uid: str | None = None,
    channel: str | None = None,
    metadata: dict | None = None,
    source_id: int | None = None,
) -> Trajectory:
    """Create or update a trajectory for the proxy (Claw-R1 init/register_trajectory).

    Idempotent. ``metadata`` is merged into the trajectory's; ``metadata['policy_version']``
    (an integer) becomes the policy version stamped on later proxied steps. Raises Conflict
    for a trajectory of another prompt group, InvalidInput for a bad channel or version.
    """
    if channel is not None and channel not in Channel.values:
        raise InvalidInput(f"channel must be one of {Channel.values}; got {channel!r}", field="channel")
    meta = metadata or {}
    version = meta.get("policy_version")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidInput(
                "metadata.policy_version must be a non-negative integer", field="metadata.policy_version"
            )
        policy_version_ensure(version=version)
    group = PromptGroup.objects.get_or_create(uid=prompt_group_uid)[0] if prompt_group_uid else None
    traj, created = Trajectory.objects.select_for_update().get_or_create(
        uid=uid,
        defaults={
            "group": group,
            "channel": channel or Channel.TRAIN,
            "metadata": meta,
            "policy_version_id": version,
            "source_id": source_id,
        },
    )
    if created:
        return traj
    if group is not None and traj.group_id not in (None, group.id):
        raise Conflict(f"trajectory {uid!r} belongs to another prompt group", field="prompt_group_uid")
    if group is not None:
        traj.group = group
    if channel is not None:
        traj.channel = channel
    if meta:
        traj.metadata = {**traj.metadata, **meta}
    if version is not None:
        traj.policy_version_id = version
    traj.save(update_fields=["group", "channel", "metadata", "policy_version", "updated_at"])
    return traj


@transaction.atomic
def proxy_trajectory_complete(
    *, uid: str, reward: float | None = None, channel: str | None = None, source_id: int | None = None
) -> Trajectory:
    """End a proxied trajectory the Claw-R1 way: its last step gets ``is_last`` and, with the
    trajectory, the reward (both audited as RewardEvents). Idempotent for the same reward.
    Raises NotFound for an unknown trajectory, InvalidInput for a bad channel or reward."""
    if channel is not None:
        if channel not in Channel.values:
            raise InvalidInput(f"channel must be one of {Channel.values}; got {channel!r}", field="channel")
        Trajectory.objects.filter(uid=uid).update(channel=channel)
    traj = trajectory_complete(uid=uid, reward=reward, source_id=source_id)
    if reward is not None:
        last = Step.objects.filter(trajectory=traj, is_last=True).values_list("uid", flat=True).first()
        if last is not None:
            rewards_apply(rewards=[RewardIn(reward=reward, step_uid=last)], source_id=source_id)
    return traj


# --- helpers ------------------------------------------------------------------------------------
def _reserve(call: ProxiedCall, n: int, *, source_id: int | None) -> tuple[int, int, str | None, int | None]:
    """Reserve ``n`` step indexes; returns (trajectory id, new step_count, group uid, policy
    version of the trajectory). Creates the trajectory on first sight."""
    if call.policy_version is not None:
        policy_version_ensure(version=call.policy_version)
        known = call.policy_version
        transaction.on_commit(lambda: _known_versions.add(known))
    row = None if call.new_trajectory else _bump(call.trajectory_uid, n)
    if row is None:
        group_id = (
            PromptGroup.objects.get_or_create(uid=call.prompt_group_uid)[0].id
            if call.prompt_group_uid
            else None
        )
        traj = Trajectory(
            uid=call.trajectory_uid,
            group_id=group_id,
            source_id=source_id,
            policy_version_id=call.policy_version,
            step_count=n,
        )
        if call.new_trajectory:
            traj.save(force_insert=True)
            return traj.id, n, None, None
        try:
            with transaction.atomic():  # savepoint: a concurrent first call may insert it first
                traj.save(force_insert=True)
            return traj.id, n, None, None
        except IntegrityError:
            row = _bump(call.trajectory_uid, n)
            if row is None:  # pragma: no cover - the row we collided with cannot vanish here
                raise
    traj_id, count, status, group_uid, version = row
    if status != Trajectory.Status.RUNNING:
        raise Conflict(
            f"trajectory {call.trajectory_uid!r} is {status}; it takes no new steps", field="trajectory_uid"
        )
    return traj_id, count, group_uid, version


def _bump(uid: str, n: int) -> tuple[int, int, str, str | None, int | None] | None:
    """Atomically add ``n`` to the trajectory's step_count; None when it does not exist."""
    traj = connection.ops.quote_name(Trajectory._meta.db_table)
    group = connection.ops.quote_name(PromptGroup._meta.db_table)
    # RETURNING works on PostgreSQL and SQLite >= 3.35. The group uid comes from a scalar
    # subquery so the reservation stays one round trip.
    sql = (
        f"UPDATE {traj} SET step_count = step_count + %s, updated_at = %s WHERE uid = %s "
        f"RETURNING id, step_count, status, "
        f"(SELECT g.uid FROM {group} g WHERE g.id = {traj}.group_id), policy_version_id"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [n, connection.ops.adapt_datetimefield_value(timezone.now()), uid])
        row = cur.fetchone()
    return tuple(row) if row is not None else None  # type: ignore[return-value]


def _previous_call(trajectory_uid: str, traj_id: int, start: int) -> list[_Prev]:
    """The steps of the call that took the indexes just below ``start`` (one step, or all
    choices of an n > 1 call) with their full sequences (prompt + response)."""
    hit = _recent.get(trajectory_uid, start)
    if hit is not None:
        return hit
    last = (
        Step.objects.filter(trajectory_id=traj_id, step_index__lt=start)
        .order_by("-step_index")
        .values_list("id", "step_index", "metadata", "seq_depth")
        .first()
    )
    if last is None:
        return []
    last_id, last_index, meta, depth = last
    rows = [(last_id, depth)]
    n, choice = (meta or {}).get("n"), (meta or {}).get("choice_index")
    if isinstance(n, int) and isinstance(choice, int) and 0 < choice < n:
        rows = list(
            Step.objects.filter(
                trajectory_id=traj_id, step_index__gte=last_index - choice, step_index__lte=last_index
            )
            .order_by("step_index")
            .values_list("id", "seq_depth")
        )
    full = tokens.load_sequences(sid for sid, _ in rows)
    return [_Prev(sid, d, tokens.bytes_to_ids(full[sid])) for sid, d in rows]


def _drift(prompt: np.ndarray, previous: list[_Prev]) -> tuple[bool, int | None]:
    """(drift, first mismatching position) of ``prompt`` against the previous call: no drift
    when the prompt starts with any previous choice's prompt + response."""
    if not previous:
        return False, None
    best = -1
    for p in previous:
        shared = tokens.common_prefix_len(prompt, p.full)
        if shared == len(p.full):
            return False, None
        best = max(best, shared)
    return True, best


def _full(s: StepIn) -> np.ndarray:
    return np.concatenate((s.prompt_ids, s.response_ids)).astype(tokens.TOKEN_DTYPE, copy=False)


@dataclass(slots=True)
class _Prev:
    """A step of a trajectory's latest call: what drift checks and delta encoding need."""

    step_id: int
    depth: int
    full: np.ndarray


class _RecentCalls:
    """LRU of each trajectory's latest recorded call: (end index, its steps), bounded by the
    number of tokens held. Thread-safe (the gateway records from a thread pool). An entry is
    only trusted by index (``get(uid, end)``, or a conditional claim of ``end`` in the fast
    path), so entries another process made stale are never used."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._data: OrderedDict[str, tuple[int, list[_Prev], int]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def get(self, trajectory_uid: str, end: int) -> list[_Prev] | None:
        hit = self.latest(trajectory_uid)
        return hit[1] if hit is not None and hit[0] == end else None

    def latest(self, trajectory_uid: str) -> tuple[int, list[_Prev]] | None:
        with self._lock:
            hit = self._data.get(trajectory_uid)
            if hit is None:
                return None
            self._data.move_to_end(trajectory_uid)
            return hit[0], hit[1]

    def put(self, trajectory_uid: str, end: int, steps: list[_Prev]) -> None:
        size = sum(len(p.full) for p in steps)
        with self._lock:
            old = self._data.pop(trajectory_uid, None)
            if old is not None:
                self._tokens -= old[2]
            if size > self.max_tokens:
                return
            self._data[trajectory_uid] = (end, steps, size)
            self._tokens += size
            while self._tokens > self.max_tokens:
                _, (_, _, dropped) = self._data.popitem(last=False)
                self._tokens -= dropped

    def forget(self, trajectory_uid: str) -> None:
        with self._lock:
            old = self._data.pop(trajectory_uid, None)
            if old is not None:
                self._tokens -= old[2]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._tokens = 0


# 16 M tokens = 64 MB of int32: the latest call of thousands of live trajectories.
_recent = _RecentCalls(max_tokens=16_000_000)
# Policy versions known to exist (rows are never deleted while steps reference them), so the
# fast path can stamp a version without a lookup.
_known_versions: set[int] = set()
