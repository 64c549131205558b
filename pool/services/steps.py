"""Step ingestion: the one write path for white-box submissions, the OpenAI proxy and the
Claw-R1 compatibility layer.

Promises
--------
* Atomic: a batch is written whole or not at all.
* Idempotent by ``uid``: an identical resubmission is reported as a duplicate and writes
  nothing; different content under an existing uid raises Conflict (409).
* Trajectories, prompt groups and policy versions are created on first sight.
* Token ids are stored prefix-deduplicated (pool/tokens.py) and read back exactly.

Cost: a constant number of queries per batch (plus one insert per in-batch parent level),
never one per step.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from .. import tokens
from ..bulk import insert_rows, new_instance
from ..errors import Conflict, InvalidInput
from ..models import Channel, PolicyVersion, PromptGroup, Step, Trajectory
from .groups import groups_check_complete

# Concurrent batches racing on the same new uid: the loser's transaction fails on the unique
# constraint and is replayed, and then sees the winner's row as a duplicate or a conflict.
_MAX_ATTEMPTS = 3


@dataclass(slots=True)
class StepIn:
    """A validated step, ready to store. Token arrays are int32, logprobs float64."""

    uid: str
    trajectory_uid: str
    step_index: int
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    prompt_group_uid: str | None = None
    rollout_logprobs: np.ndarray | None = None
    reward: float | None = None
    reward_source: str | None = None
    policy_version: int | None = None
    is_last: bool = False
    finish_reason: str | None = None
    messages: list | None = None
    response_text: str | None = None
    metadata: dict = field(default_factory=dict)
    token_source: str = Step.TokenSource.CLIENT
    drift: bool = False
    drift_offset: int | None = None
    field_prefix: str = ""  # e.g. "steps[3]": how errors name this step's fields

    def full_ids(self) -> np.ndarray:
        """prompt_ids + response_ids as one int32 array."""
        return (
            np.concatenate((self.prompt_ids, self.response_ids))
            if len(self.response_ids)
            else self.prompt_ids
        )

    def content_hash(self, seq_hash: bytes | None = None) -> bytes:
        """Fingerprint of everything submitted, for idempotency. ``seq_hash`` (the hash of
        full_ids' bytes) may be passed when already computed: the tokens are hashed once."""
        if seq_hash is None:
            seq_hash = tokens.seq_hash(tokens.ids_to_bytes(self.full_ids()))
        h = hashlib.blake2b(digest_size=16)
        head = [
            self.trajectory_uid,
            self.prompt_group_uid,
            self.step_index,
            len(self.prompt_ids),
            len(self.response_ids),
            self.reward,
            self.reward_source,
            self.policy_version,
            self.is_last,
            self.finish_reason,
            self.messages,
            self.response_text,
            self.metadata,
            self.token_source,
        ]
        h.update(orjson.dumps(head, option=orjson.OPT_SORT_KEYS))
        h.update(seq_hash)
        if self.rollout_logprobs is not None:
            h.update(b"lp")
            h.update(np.ascontiguousarray(self.rollout_logprobs, dtype=tokens.LOGPROB_DTYPE).tobytes())
        return h.digest()


@dataclass(slots=True)
class Packed:
    """What ingest derives from a step once: its full id array and the two hashes."""

    full: np.ndarray
    seq_hash: bytes
    content_hash: bytes


def pack_step(s: StepIn) -> Packed:
    full = s.full_ids()
    seq_hash = tokens.seq_hash(tokens.ids_to_bytes(full))
    return Packed(full=full, seq_hash=seq_hash, content_hash=s.content_hash(seq_hash))


@dataclass(slots=True)
class IngestResult:
    created: list[Step]
    duplicates: list[str]

    @property
    def created_uids(self) -> list[str]:
        return [s.uid for s in self.created]


def steps_ingest(
    *, steps: Sequence[StepIn], source_id: int | None = None, channel: str | None = None
) -> IngestResult:
    """Store a batch of steps atomically and idempotently (see module docstring).

    Raises InvalidInput (400) or Conflict (409) before anything is written.
    """
    _check_batch(steps)
    packed = [pack_step(s) for s in steps]
    for attempt in range(_MAX_ATTEMPTS):
        try:
            with transaction.atomic():
                return _ingest(steps, packed, source_id=source_id, channel=channel)
        except (IntegrityError, _Raced):
            if attempt == _MAX_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


class _Raced(Exception):
    """A concurrent batch committed some of our uids while we were checking: replay."""


def _check_batch(steps: Sequence[StepIn]) -> None:
    seen_uid: dict[str, int] = {}
    seen_pos: dict[tuple[str, int], int] = {}
    for i, s in enumerate(steps):
        if s.uid in seen_uid:
            raise InvalidInput(f"uid {s.uid!r} appears twice in the batch", field=f"{s.field_prefix}.uid")
        seen_uid[s.uid] = i
        pos = (s.trajectory_uid, s.step_index)
        if pos in seen_pos:
            raise InvalidInput(
                f"trajectory {s.trajectory_uid!r} has step_index {s.step_index} twice in the batch",
                field=f"{s.field_prefix}.step_index",
            )
        seen_pos[pos] = i
        if s.reward is not None and not math.isfinite(s.reward):
            raise InvalidInput("reward must be a finite number", field=f"{s.field_prefix}.reward")


def _ingest(
    steps: Sequence[StepIn], packed: list[Packed], *, source_id: int | None, channel: str | None
) -> IngestResult:
    # 1. Idempotency: classify uids that already exist.
    existing = dict(Step.objects.filter(uid__in=[s.uid for s in steps]).values_list("uid", "content_hash"))
    duplicates: list[str] = []
    new: list[tuple[StepIn, Packed]] = []
    for s, h in zip(steps, packed, strict=True):
        stored = existing.get(s.uid)
        if stored is None:
            new.append((s, h))
        elif bytes(stored) == h.content_hash:
            duplicates.append(s.uid)
        else:
            raise Conflict(f"step {s.uid!r} exists with different content", field=f"{s.field_prefix}.uid")
    if not new:
        return IngestResult(created=[], duplicates=duplicates)

    new_steps = [s for s, _ in new]
    groups = _ensure_groups({s.prompt_group_uid for s in new_steps if s.prompt_group_uid})
    trajectories = _ensure_trajectories(new_steps, groups, source_id=source_id, channel=channel)
    _ensure_policy_versions({s.policy_version for s in new_steps if s.policy_version is not None})

    # 2. Neighbours already stored: (trajectory, step_index) collisions and parent candidates.
    # Trajectories this batch just created have none, so only older ones are queried.
    traj_ids = {t.id for t in trajectories.values() if not t.created}
    wanted_idx = {s.step_index for s in new_steps} | {s.step_index - 1 for s in new_steps if s.step_index > 0}
    stored_steps: dict[tuple[int, int], tuple[int, str, int]] = {}
    if traj_ids:
        stored_steps = {
            (tid, idx): (sid, uid, depth)
            for sid, tid, idx, uid, depth in Step.objects.filter(
                trajectory_id__in=traj_ids, step_index__in=wanted_idx
            ).values_list("id", "trajectory_id", "step_index", "uid", "seq_depth")
        }
    for s in new_steps:
        taken = stored_steps.get((trajectories[s.trajectory_uid].id, s.step_index))
        if taken is not None and taken[1] == s.uid:
            # Our own uid, committed by a concurrent writer after our uid check: replay, and
            # the replay classifies it (duplicate or conflict) like any existing uid.
            raise _Raced()
        if taken is not None:
            raise Conflict(
                f"trajectory {s.trajectory_uid!r} already has step_index {s.step_index} (uid {taken[1]!r})",
                field=f"{s.field_prefix}.step_index",
            )

    # 3. Load the stored candidates' sequences in one recursive query.
    anchor_of_group = {g.id: g.anchor_step_id for g in groups.values() if g.anchor_step_id}
    depth_of: dict[int, int] = {}
    load_ids: set[int] = set()
    for s in new_steps:
        traj = trajectories[s.trajectory_uid]
        prev = stored_steps.get((traj.id, s.step_index - 1))
        if prev is not None:
            load_ids.add(prev[0])
            depth_of[prev[0]] = prev[2]
        if s.step_index == 0 and traj.group_id in anchor_of_group:
            load_ids.add(anchor_of_group[traj.group_id])
    anchors = load_ids - depth_of.keys()  # group anchors some first step will be compared with
    if anchors:
        depth_of.update(Step.objects.filter(id__in=anchors).values_list("id", "seq_depth"))
    stored_full = {sid: tokens.bytes_to_ids(raw) for sid, raw in tokens.load_sequences(load_ids).items()}

    # 4. Encode each step against its best parent and insert, parents before children.
    created = _insert_in_waves(
        new, trajectories, groups, stored_steps, stored_full, depth_of, anchor_of_group, source_id
    )

    # 5. Trajectory counters/status, group anchors and completion.
    _update_trajectories(new_steps, trajectories)
    _set_group_anchors(created, trajectories)
    completed_groups = {
        trajectories[s.trajectory_uid].group_id
        for s in new_steps
        if s.is_last and trajectories[s.trajectory_uid].group_id
    }
    if completed_groups:
        groups_check_complete(group_ids=completed_groups)
    return IngestResult(created=created, duplicates=duplicates)


def _ensure_groups(uids: set[str]) -> dict[str, PromptGroup]:
    if not uids:
        return {}
    found = {g.uid: g for g in PromptGroup.objects.filter(uid__in=uids)}
    missing = uids - found.keys()
    if missing:
        PromptGroup.objects.bulk_create([PromptGroup(uid=u) for u in sorted(missing)], ignore_conflicts=True)
        found.update({g.uid: g for g in PromptGroup.objects.filter(uid__in=missing)})
    return found


@dataclass(slots=True)
class _Traj:
    """The trajectory columns ingest needs (no model instance on the hot path)."""

    id: int
    uid: str
    group_id: int | None
    status: str
    step_count: int
    created: bool = False  # inserted by this batch


_TRAJ_COLS = ("id", "uid", "group_id", "status", "step_count")


def _ensure_trajectories(
    steps: list[StepIn], groups: dict[str, PromptGroup], *, source_id: int | None, channel: str | None
) -> dict[str, _Traj]:
    first: dict[str, StepIn] = {}
    for s in steps:
        first.setdefault(s.trajectory_uid, s)
    found = {
        row[1]: _Traj(*row)
        for row in Trajectory.objects.filter(uid__in=first.keys()).values_list(*_TRAJ_COLS)
    }
    missing = sorted(first.keys() - found.keys())
    if missing:
        found.update(_insert_trajectories(missing, first, groups, source_id=source_id, channel=channel))
        late = [u for u in missing if u not in found]  # inserted concurrently by another batch
        if late:
            found.update(
                {
                    row[1]: _Traj(*row)
                    for row in Trajectory.objects.filter(uid__in=late).values_list(*_TRAJ_COLS)
                }
            )
    adopt: dict[int, int] = {}
    for s in steps:
        traj = found[s.trajectory_uid]
        if s.prompt_group_uid:
            gid = groups[s.prompt_group_uid].id
            if traj.group_id is None:
                adopt[traj.id] = gid
                traj.group_id = gid
            elif traj.group_id != gid:
                raise Conflict(
                    f"trajectory {s.trajectory_uid!r} belongs to another prompt group",
                    field=f"{s.field_prefix}.prompt_group_uid",
                )
        # An ended trajectory still accepts late steps *inside* its known length (concurrent
        # uploads may deliver the is_last step first), but nothing past its end.
        if traj.status != Trajectory.Status.RUNNING and s.step_index >= traj.step_count:
            raise Conflict(
                f"trajectory {s.trajectory_uid!r} is {traj.status} with {traj.step_count} steps; "
                f"step_index {s.step_index} is past its end",
                field=f"{s.field_prefix}.step_index",
            )
    for tid, gid in adopt.items():
        Trajectory.objects.filter(id=tid, group__isnull=True).update(group_id=gid)
    return found


def _insert_trajectories(
    uids: list[str],
    first: dict[str, StepIn],
    groups: dict[str, PromptGroup],
    *,
    source_id: int | None,
    channel: str | None,
) -> dict[str, _Traj]:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING: one statement, race-safe; rows another
    writer inserted first are simply not returned."""
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    now = timezone.now()
    params: list[object] = []
    for u in uids:
        s = first[u]
        group = groups.get(s.prompt_group_uid) if s.prompt_group_uid else None
        params += [
            u,
            group.id if group else None,
            source_id,
            channel or Channel.TRAIN,
            now,
            now,
            s.policy_version,
        ]
    row = "(%s, %s, %s, %s, 'running', 0, '{}', %s, %s, %s)"
    sql = (
        f"INSERT INTO {table} (uid, group_id, source_id, channel, status, step_count, metadata, created_at, "
        f"updated_at, policy_version_id) VALUES {', '.join([row] * len(uids))} "
        f"ON CONFLICT (uid) DO NOTHING RETURNING {', '.join(_TRAJ_COLS)}"
    )
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return {r[1]: _Traj(*r, created=True) for r in cur.fetchall()}


def _ensure_policy_versions(versions: set[int]) -> None:
    if not versions:
        return
    known = set(PolicyVersion.objects.filter(version__in=versions).values_list("version", flat=True))
    if versions - known:
        PolicyVersion.objects.bulk_create(
            [PolicyVersion(version=v) for v in versions - known], ignore_conflicts=True
        )


def _insert_in_waves(
    new: list[tuple[StepIn, Packed]],
    trajectories: dict[str, _Traj],
    groups: dict[str, PromptGroup],
    stored_steps: dict[tuple[int, int], tuple[int, str, int]],
    stored_full: dict[int, np.ndarray],
    depth_of: dict[int, int],
    anchor_of_group: dict[int, int],
    source_id: int | None,
) -> list[Step]:
    """Insert steps so every parent has its id before its children are built.

    A step's parent is chosen among (a) the previous step of its trajectory and (b) for a
    first step, the group anchor (another rollout's first step), by longest common prefix.
    In-batch parents make a later wave; a batch of independent steps is one insert.
    """
    order = sorted(range(len(new)), key=lambda i: (new[i][0].trajectory_uid, new[i][0].step_index))
    full_of: dict[int, np.ndarray] = {i: new[i][1].full for i in order}
    batch_pos = {(new[i][0].trajectory_uid, new[i][0].step_index): i for i in order}
    # The first step-0 of a group inside this batch serves as anchor for later ones when the
    # group has no stored anchor yet.
    batch_anchor: dict[int, int] = {}
    for i in order:
        s = new[i][0]
        gid = trajectories[s.trajectory_uid].group_id
        if s.step_index == 0 and gid is not None and gid not in anchor_of_group:
            batch_anchor.setdefault(gid, i)

    # Candidate parents per step: ("db", step_id) or ("batch", index).
    plan: dict[int, tuple[str, int] | None] = {}
    for i in order:
        s = new[i][0]
        traj = trajectories[s.trajectory_uid]
        cands: list[tuple[str, int]] = []
        if s.step_index > 0:
            j = batch_pos.get((s.trajectory_uid, s.step_index - 1))
            if j is not None:
                cands.append(("batch", j))
            else:
                prev = stored_steps.get((traj.id, s.step_index - 1))
                if prev is not None:
                    cands.append(("db", prev[0]))
        if s.step_index == 0 and traj.group_id is not None:
            if traj.group_id in anchor_of_group:
                cands.append(("db", anchor_of_group[traj.group_id]))
            elif batch_anchor.get(traj.group_id, i) != i:
                cands.append(("batch", batch_anchor[traj.group_id]))
        best, best_len = None, -1
        for kind, ref in cands:
            other = full_of[ref] if kind == "batch" else stored_full.get(ref)
            if other is None:
                continue
            n = tokens.common_prefix_len(full_of[i], other)
            if n > best_len:
                best, best_len = (kind, ref), n
        plan[i] = best if best_len >= tokens.MIN_SHARED_TOKENS else None

    # Wave number = in-batch parent depth.
    wave: dict[int, int] = {}
    for i in order:  # parents sort before children within a trajectory; anchors are step 0
        p = plan[i]
        wave[i] = wave[p[1]] + 1 if p is not None and p[0] == "batch" else 0
    built: dict[int, Step] = {}
    created: list[Step] = []
    for w in sorted(set(wave.values())):
        objs = []
        for i in (i for i in order if wave[i] == w):
            s, h = new[i]
            p = plan[i]
            parent_id, parent_full, parent_depth = None, None, 0
            if p is not None:
                if p[0] == "batch":
                    parent_id, parent_full, parent_depth = (
                        built[p[1]].id,
                        full_of[p[1]],
                        built[p[1]].seq_depth,
                    )
                else:
                    parent_id, parent_full, parent_depth = p[1], stored_full[p[1]], depth_of.get(p[1], 0)
            obj = step_row(
                s,
                h,
                trajectory_id=trajectories[s.trajectory_uid].id,
                parent_id=parent_id,
                parent_full=parent_full,
                parent_depth=parent_depth,
                source_id=source_id,
            )
            built[i] = obj
            objs.append(obj)
        insert_rows(Step, objs)
        created.extend(objs)
    return created


def step_row(
    s: StepIn,
    packed: Packed,
    *,
    trajectory_id: int | None,
    parent_id: int | None,
    parent_full: np.ndarray | None,
    parent_depth: int,
    source_id: int | None,
) -> Step:
    """The unsaved Step row for ``s``, its tokens encoded against the parent candidate (see
    pool/tokens.py). Shared by every write path, so all store steps alike."""
    enc = tokens.encode_against(packed.full, parent_full, parent_depth)
    return new_instance(
        Step,
        dict(
            uid=s.uid,
            trajectory_id=trajectory_id,
            step_index=s.step_index,
            seq_parent_id=parent_id if enc.shared else None,
            seq_shared=enc.shared,
            seq_delta=enc.delta,
            seq_len=len(packed.full),
            prompt_len=len(s.prompt_ids),
            seq_depth=enc.depth,
            seq_hash=packed.seq_hash,
            rollout_logprobs=(
                np.ascontiguousarray(s.rollout_logprobs, dtype=tokens.LOGPROB_DTYPE).tobytes()
                if s.rollout_logprobs is not None
                else None
            ),
            content_hash=packed.content_hash,
            reward=s.reward,
            reward_status=Step.RewardStatus.FINAL if s.reward is not None else Step.RewardStatus.PENDING,
            reward_source=(s.reward_source or Step.RewardSource.ENV) if s.reward is not None else None,
            policy_version_id=s.policy_version,
            is_last=s.is_last,
            finish_reason=s.finish_reason,
            token_source=s.token_source,
            drift=s.drift,
            drift_offset=s.drift_offset,
            messages=s.messages,
            response_text=s.response_text,
            metadata=s.metadata,
            source_id=source_id,
        ),
    )


def _update_trajectories(steps: list[StepIn], trajectories: dict[str, _Traj]) -> None:
    next_index: dict[int, int] = defaultdict(int)
    finished: set[int] = set()
    for s in steps:
        tid = trajectories[s.trajectory_uid].id
        next_index[tid] = max(next_index[tid], s.step_index + 1)
        if s.is_last:
            finished.add(tid)
    now = timezone.now()
    # One statement for all touched trajectories. The max keeps concurrent writers monotone
    # (a row lock orders them); an is_last step completes a running trajectory.
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    values = ", ".join(["(%s, %s, %s)"] * len(next_index))
    params: list[object] = []
    for tid, n in next_index.items():
        params += [tid, n, tid in finished]
    sql = f"""
        WITH v(id, n, last) AS (VALUES {values})
        UPDATE {table} SET
            step_count = CASE WHEN {table}.step_count > v.n THEN {table}.step_count ELSE v.n END,
            status = CASE WHEN v.last AND {table}.status = 'running' THEN 'completed' ELSE {table}.status END,
            completed_at = CASE WHEN v.last AND {table}.status = 'running' THEN %s ELSE {table}.completed_at END,
            updated_at = %s
        FROM v WHERE {table}.id = v.id
    """
    with connection.cursor() as cur:
        cur.execute(sql, [*params, now, now])


def _set_group_anchors(created: list[Step], trajectories: dict[str, _Traj]) -> None:
    group_of = {t.id: t.group_id for t in trajectories.values() if t.group_id}
    first: dict[int, int] = {}
    for st in created:
        gid = group_of.get(st.trajectory_id)
        if gid is not None and st.step_index == 0:
            first.setdefault(gid, st.id)
    for gid, sid in first.items():
        PromptGroup.objects.filter(id=gid, anchor_step__isnull=True).update(anchor_step_id=sid)
