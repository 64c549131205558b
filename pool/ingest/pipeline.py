"""The step-write pipeline: the one way a step enters the pool.

Two entry points, one pipeline (plan -> claim -> write -> effects):

* ``steps_ingest``: a batch whose steps carry their own indexes and uids (white-box agents,
  Claw-R1's submit_steps). Atomic and idempotent by uid.
* ``steps_append``: steps appended at the end of a trajectory, their indexes claimed by the
  pool (proxied calls: one step per choice of an answer). Atomic, not idempotent (every call
  is a new generation). The door's ``build`` callback turns the trajectory's tail (the
  previous append, with its sequences) into the new steps, so notions of the door (choices,
  drift against the previous call) stay with the door.

Stages:

* **plan** (pool/ingest/plan.py, rules.py): defaults and rules, parent choice for prefix
  deltas, content hash;
* **claim** (claim.py): step_index reservation for appends; the in-process hint of each
  trajectory's latest append is checked by the claim itself, never trusted blindly;
* **write** (pool/sql.py): binary COPY for batches and a fused claim+insert statement for a
  proxied call on PostgreSQL, bulk_create elsewhere;
* **effects** (pool/bus.py): the effects registered for ``StepsWritten``, the pool's first
  (pool/apps.py: counters and status, anchors, rewards, readiness, group completion, the
  live event, trajectory ending), then those other apps registered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import bus, compiled, sql, tokens
from ..bus import StepsWritten, WrittenStep, WrittenTrajectory
from ..errors import Conflict, InvalidInput, UidTaken
from ..flags import Readiness
from ..lookups import Many
from ..models import Channel, PolicyVersion, PromptGroup, Step, Trajectory
from ..sql import TRAJ_COLS, FusedClaim
from ..tenancy import OWN, Sources, allowed, owns
from . import rules
from .claim import ABSENT, GroupAnchor, Tail, anchors, recent, tail_load
from .contract import StepIn, default_uid
from .media import media_link, media_prepare
from .plan import Candidate, Packed, Planned, Stored, build_rows, choose_parents, pack, step_row

# Concurrent batches racing on the same new uid: the loser's transaction fails on the unique
# constraint and is replayed, and then sees the winner's row as a duplicate or a conflict.
_MAX_ATTEMPTS = 3


@dataclass(slots=True)
class IngestResult:
    created: list[Step]
    duplicates: list[str]

    @property
    def created_uids(self) -> list[str]:
        return [s.uid for s in self.created]


# --- batches --------------------------------------------------------------------------------------
def steps_ingest(
    *,
    steps: Sequence[StepIn],
    source_id: int | None = None,
    channel: str | None = None,
    sources: Iterable[int] | None | object = OWN,
) -> IngestResult:
    """Store a batch of steps atomically and idempotently by uid.

    ``sources`` (pool/tenancy.py): whose trajectories, groups and steps the writer may
    write; a uid another source holds raises UidTaken (409) and nothing is written.

    Trajectories, prompt groups and policy versions are created on first sight; an identical
    resubmission is reported as duplicates and writes nothing. Raises InvalidInput (400) or
    Conflict (409: different content under an existing uid, a taken index, another group)
    before anything is written. Costs a constant number of queries per batch (plus one
    insert per in-batch parent level), never one per step.
    """
    if channel is not None:
        rules.check_channel(channel)
    _check_batch(steps)
    packed = [pack(s) for s in steps]
    mine = allowed(source_id, sources)
    for attempt in range(_MAX_ATTEMPTS):
        try:
            with transaction.atomic():
                return _ingest(
                    steps, packed, source_id=source_id, channel=channel or Channel.TRAIN, mine=mine
                )
        except (IntegrityError, _Raced):
            if attempt == _MAX_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


class _Raced(Exception):
    """A concurrent batch committed some of our uids while we were checking: replay."""


def _check_batch(steps: Sequence[StepIn]) -> None:
    seen_uid: set[str] = set()
    seen_pos: set[tuple[str, int]] = set()
    for s in steps:
        if s.uid in seen_uid:
            raise InvalidInput(f"uid {s.uid!r} appears twice in the batch", field=s.at("uid"))
        seen_uid.add(s.uid)
        pos = (s.trajectory_uid, s.step_index)
        if pos in seen_pos:
            raise InvalidInput(
                f"trajectory {s.trajectory_uid!r} has step_index {s.step_index} twice in the batch",
                field=s.at("step_index"),
            )
        seen_pos.add(pos)
        # The wire contract checked the length for decoded steps; StepIns built in Python
        # too; control characters are refused here for both.
        # The trajectory's and group's uids first: the default step uid is made of the first.
        rules.check_uid(s.trajectory_uid, s.at("trajectory_uid"))
        if s.prompt_group_uid is not None:
            rules.check_uid(s.prompt_group_uid, s.at("prompt_group_uid"))
        rules.check_uid(s.uid, s.at("uid"), max_len=rules.MAX_STEP_UID_LEN)
        if s.reward is not None:
            rules.check_reward(s.reward, s.at("reward"))


def _ingest(
    steps: Sequence[StepIn], packed: list[Packed], *, source_id: int | None, channel: str, mine: Sources
) -> IngestResult:
    """A batch's stages, each named below: the uids already stored; the context (groups,
    policy versions, trajectories); the neighbours already stored; the parent candidates;
    then the write with its images and its effects."""
    duplicates, new = _classify(steps, packed, mine)
    if not new:
        return IngestResult(created=[], duplicates=duplicates)
    # Parents sort before children within a trajectory; the first step 0 of a group (in this
    # order) is the batch's anchor for the others.
    new.sort(key=lambda x: (x[0].trajectory_uid, x[0].step_index))
    new_steps = [s for s, _ in new]
    groups, trajs = _context(new_steps, source_id=source_id, channel=channel, mine=mine)
    neighbours = _neighbours(new_steps, trajs)
    candidates = _candidates(new_steps, trajs, groups, neighbours)
    # Images checked and stored (a bad one refuses the write: nothing of it stays); the steps
    # written, parents before children, with their images' rows; then the effects.
    media = media_prepare(new_steps, sources=mine)
    planned = choose_parents(new_steps, [h for _, h in new], candidates)
    rows = build_rows(
        planned,
        trajectory_id_of=lambda s: trajs[s.trajectory_uid].id,
        source_id=source_id,
        insert=sql.backend().insert_steps,
        readiness_of=_known_readiness(new_steps, trajs, groups),
        outcome_of=_known_outcomes(new_steps, trajs),
    )
    media_link(new_steps, [r.id for r in rows], media, source_id=source_id)
    bus.apply(
        _written(rows, [_trajectory_written(t) for t in trajs.values()], source_id=source_id, channel=channel)
    )
    return IngestResult(created=rows, duplicates=duplicates)


def _classify(
    steps: Sequence[StepIn], packed: list[Packed], mine: Sources
) -> tuple[list[str], list[tuple[StepIn, Packed]]]:
    """Idempotency: the uids stored already with the same content (duplicates) and the new
    steps; a uid of another source is taken, the same uid with other content a conflict."""
    found = compiled.read(_stored_uids, uids=Many([s.uid for s in steps]))
    # The owners in a second lookup by primary key, only for uids stored already (a retry):
    # joined, PostgreSQL hashed every trajectory once per batch while its statistics lagged.
    owners = (
        dict(Trajectory.objects.filter(id__any={t for _, _, t in found}).values_list("id", "source_id"))
        if found
        else {}
    )
    existing = {uid: (h, owners.get(t)) for uid, h, t in found}
    duplicates: list[str] = []
    new: list[tuple[StepIn, Packed]] = []
    for s, h in zip(steps, packed, strict=True):
        stored, owner = existing.get(s.uid, (None, None))
        if stored is None:
            new.append((s, h))
        elif not owns(mine, owner):
            raise UidTaken("step", s.uid, field=s.at("uid"))
        elif bytes(stored) == h.content_hash:
            duplicates.append(s.uid)
        else:
            raise Conflict(f"step {s.uid!r} exists with different content", field=s.at("uid"))
    return duplicates, new


def _context(
    new_steps: list[StepIn], *, source_id: int | None, channel: str, mine: Sources
) -> tuple[dict[str, PromptGroup], dict[str, TrajectoryRow]]:
    """Groups, policy versions and trajectories of the new steps (created on first sight); an
    ended trajectory takes no step past its end."""
    groups = groups_ensure(
        {s.prompt_group_uid for s in new_steps if s.prompt_group_uid}, source_id=source_id, sources=mine
    )
    policy_versions_ensure({s.policy_version for s in new_steps if s.policy_version is not None})
    trajs = trajectory_ensure(
        specs=[
            TrajectorySpec(
                uid=s.trajectory_uid,
                group_uid=s.prompt_group_uid,
                channel=channel,
                policy_version=s.policy_version,
                field=s.at("prompt_group_uid"),
                uid_field=s.at("trajectory_uid"),
            )
            for s in new_steps
        ],
        groups=groups,
        source_id=source_id,
        sources=mine,
    )
    for s in new_steps:
        # An ended trajectory still accepts late steps *inside* its known length (concurrent
        # uploads may deliver the is_last step first), but nothing past its end.
        t = trajs[s.trajectory_uid]
        if t.status != Trajectory.Status.RUNNING and s.step_index >= t.step_count:
            raise Conflict(
                f"trajectory {s.trajectory_uid!r} is {t.status} with {t.step_count} steps; "
                f"step_index {s.step_index} is past its end",
                field=s.at("step_index"),
            )
    return groups, trajs


def _neighbours(
    new_steps: list[StepIn], trajs: dict[str, TrajectoryRow]
) -> dict[tuple[int, int], tuple[int, str, int]]:
    """The steps already stored at the new steps' indexes (a collision) and just before them
    (a parent candidate): (trajectory id, index) -> (id, uid, depth). Trajectories this batch
    just created have none, so only older ones are queried."""
    old = {t.id for t in trajs.values() if not t.created}
    neighbours: dict[tuple[int, int], tuple[int, str, int]] = {}
    if old:
        wanted = {s.step_index for s in new_steps} | {s.step_index - 1 for s in new_steps if s.step_index > 0}
        neighbours = {
            (tid, idx): (sid, uid, depth)
            for sid, tid, idx, uid, depth in compiled.read(
                _stored_at, trajectories=Many(old), indexes=Many(wanted)
            )
        }
    for s in new_steps:
        taken = neighbours.get((trajs[s.trajectory_uid].id, s.step_index))
        if taken is not None and taken[1] == s.uid:
            # Our own uid, committed by a concurrent writer after our uid check: replay, and
            # the replay classifies it (duplicate or conflict) like any existing uid.
            raise _Raced()
        if taken is not None:
            raise Conflict(
                f"trajectory {s.trajectory_uid!r} already has step_index {s.step_index} (uid {taken[1]!r})",
                field=s.at("step_index"),
            )
    return neighbours


def _candidates(
    new_steps: list[StepIn],
    trajs: dict[str, TrajectoryRow],
    groups: dict[str, PromptGroup],
    neighbours: dict[tuple[int, int], tuple[int, str, int]],
) -> list[list[Candidate]]:
    """Each new step's parent candidates: the previous step (in the batch or stored), and for
    a first step the group anchor (stored, or the batch's first step 0 of that group)."""
    anchor_of = {g.id: g.anchor_step_id for g in groups.values() if g.anchor_step_id}
    position = {(s.trajectory_uid, s.step_index): i for i, s in enumerate(new_steps)}
    batch_anchor: dict[int, int] = {}
    for i, s in enumerate(new_steps):
        gid = trajs[s.trajectory_uid].group_id
        if s.step_index == 0 and gid is not None and gid not in anchor_of:
            batch_anchor.setdefault(gid, i)
    refs: list[list[int | tuple[str, int]]] = []  # batch index, or ("db", step id)
    depth_of: dict[int, int] = {}
    for i, s in enumerate(new_steps):
        t = trajs[s.trajectory_uid]
        parents: list[int | tuple[str, int]] = []
        if s.step_index > 0:
            j = position.get((s.trajectory_uid, s.step_index - 1))
            if j is not None:
                parents.append(j)
            elif (prev := neighbours.get((t.id, s.step_index - 1))) is not None:
                parents.append(("db", prev[0]))
                depth_of[prev[0]] = prev[2]
        elif t.group_id is not None:
            if t.group_id in anchor_of:
                parents.append(("db", anchor_of[t.group_id]))
            elif batch_anchor.get(t.group_id, i) != i:
                parents.append(batch_anchor[t.group_id])
        refs.append(parents)
    loaded = _load_stored({r[1] for parents in refs for r in parents if isinstance(r, tuple)}, depth_of)
    return [
        [r if isinstance(r, int) else loaded[r[1]] for r in parents if isinstance(r, int) or r[1] in loaded]
        for parents in refs
    ]


def _known_readiness(
    steps: Sequence[StepIn], trajs: dict[str, TrajectoryRow], groups: dict[str, PromptGroup]
) -> Callable[[StepIn], int]:
    """The readiness bits a batch already knows for its steps: those of a trajectory that is
    completed, or that this batch completes (an is_last step), with its group's when the
    group is complete or absent. The rows are then written with them, and the effects'
    refresh rewrites only older rows (a step row rewrite costs as much as its insert)."""
    ending = {s.trajectory_uid for s in steps if s.is_last}
    complete_groups = {g.id for g in groups.values() if g.status == PromptGroup.Status.COMPLETE}
    bits: dict[str, int] = {}
    for uid, t in trajs.items():
        done = t.status == Trajectory.Status.COMPLETED or (
            t.status == Trajectory.Status.RUNNING and uid in ending
        )
        if done:
            group_done = t.group_id is None or t.group_id in complete_groups
            bits[uid] = Readiness.TRAJECTORY_COMPLETE | (Readiness.GROUP_COMPLETE if group_done else 0)
    return lambda s: bits.get(s.trajectory_uid, 0)


def _known_outcomes(
    steps: Sequence[StepIn], trajs: dict[str, TrajectoryRow]
) -> Callable[[StepIn], tuple[bool, float | None] | None]:
    """Which step ends each branch, and the branch's outcome (pool/services/effective_reward.py),
    for the trajectories this batch creates and ends: it holds all their steps. The final
    step is the branch's step marked is_last, else its highest; the outcome its own reward
    (final, given with it), else none (a new trajectory has no reward of its own). So a
    batch that writes whole rewarded trajectories (W-ingest) writes each row once."""
    ending = {s.trajectory_uid for s in steps if s.is_last and trajs[s.trajectory_uid].created}
    if not ending:
        return lambda s: None
    final: dict[tuple[str, int], StepIn] = {}
    for s in steps:
        if s.trajectory_uid in ending:
            key = (s.trajectory_uid, s.branch)
            f = final.get(key)
            if f is None or (s.is_last, s.step_index) > (f.is_last, f.step_index):
                final[key] = s

    def of(s: StepIn) -> tuple[bool, float | None] | None:
        if s.trajectory_uid not in ending:
            return None
        f = final[(s.trajectory_uid, s.branch)]
        return f.step_index == s.step_index, f.reward

    return of


def _load_stored(ids: set[int], depth_of: dict[int, int]) -> dict[int, Stored]:
    """Stored parent candidates with their full sequences (one recursive query), and the
    depths not known yet (group anchors: one query)."""
    if not ids:
        return {}
    missing = ids - depth_of.keys()
    if missing:
        depth_of.update(Step.objects.filter(id__in=missing).values_list("id", "seq_depth"))
    full = tokens.load_sequences(ids)
    return {
        sid: Stored(sid, depth_of.get(sid, 0), tokens.bytes_to_ids(full[sid])) for sid in ids if sid in full
    }


# --- appends (proxied calls) ----------------------------------------------------------------------
@dataclass(slots=True)
class AppendTarget:
    """Where appended steps go. ``new``: the door minted the uid, so no row can exist yet."""

    trajectory_uid: str
    prompt_group_uid: str | None = None
    policy_version: int | None = None
    new: bool = False
    channel: str = Channel.TRAIN


Build = Callable[[Tail], list[StepIn]]


def steps_append(
    *,
    target: AppendTarget,
    count: int,
    build: Build,
    source_id: int | None = None,
    sources: Iterable[int] | None | object = OWN,
) -> list[StepIn]:
    """Append the ``count`` steps ``build(tail)`` returns at the end of the trajectory,
    atomically.

    ``tail`` is the trajectory's previous append (its steps' full sequences). The pipeline
    numbers the steps (the next free indexes, uids ``<trajectory>:<index>``), stamps the
    target's group and policy version (else the trajectory's), stores each as a delta
    against the tail step it shares the longest prefix with, and returns them as written.
    Creates the trajectory (and group, policy version) on first sight. Not idempotent: each
    call takes new indexes. Raises Conflict when the trajectory has ended or belongs to
    another group, UidTaken when another source holds it (``sources``: pool/tenancy.py; the
    claim itself carries the check), InvalidInput when a step breaks a rule; nothing is
    written then.
    """
    if count < 1:
        raise InvalidInput("nothing to append", field="choices")
    mine = allowed(source_id, sources)
    tail = _fused_tail(target, count)
    written = _append_fused(target, count, tail, build, source_id, mine) if tail is not None else None
    return written if written is not None else _append_general(target, count, build, source_id, mine)


@dataclass(slots=True)
class AppendRequest:
    """One append of :func:`steps_append_group`: :func:`steps_append`'s arguments."""

    target: AppendTarget
    count: int
    build: Build
    source_id: int | None = None
    sources: Iterable[int] | None | object = OWN


def append_groupable(target: AppendTarget, count: int) -> bool:
    """Whether an append may join a group commit (:func:`steps_append_group`): its fused path
    applies (the trajectory is new and has no group, or this process knows its latest append;
    one step; a known policy version). Reads only this process's memory."""
    return _fused_tail(target, count) is not None


def steps_append_group(requests: Sequence[AppendRequest]) -> list[list[StepIn] | None]:
    """Group commit: the fused appends (:func:`steps_append`'s fast path) of ``requests``, one
    statement each, all in ONE transaction and one commit: concurrent proxied calls share
    the commit (gateway/proxy/db.py's writer). Durable when this returns.

    Per request, in order: its steps as written, or None when it did not join (its fused path
    does not apply, its steps break a rule, or its claim missed): nothing of it was written
    and the caller runs :func:`steps_append` for it, which decides alone. At most one request
    per trajectory joins (the others are None). A database error rolls the whole group back
    and is raised: nothing was written, the caller runs each request alone."""
    prepared: list[_Fused | None] = []
    seen: set[str] = set()
    for r in requests:
        uid = r.target.trajectory_uid
        tail = _fused_tail(r.target, r.count) if uid not in seen else None
        fused = None
        if tail is not None:
            try:
                fused = _fused_prepare(
                    r.target, r.count, tail, r.build, r.source_id, allowed(r.source_id, r.sources)
                )
            except (InvalidInput, Conflict):
                fused = None  # steps_append says so alone, nothing written
            if fused is not None and fused.has_media:
                fused = None  # its images are linked by steps_append's own transaction
        if fused is not None:
            seen.add(uid)
        prepared.append(fused)
    out: list[list[StepIn] | None] = [None] * len(prepared)
    if not any(prepared):
        return out
    # Trajectory rows are claimed in uid order, so two groups never wait on each other.
    order = sorted(
        (i for i, f in enumerate(prepared) if f is not None), key=lambda i: requests[i].target.trajectory_uid
    )
    # A group of one is a plain fused append: one statement in autocommit, as steps_append's.
    alone = len(order) == 1
    with transaction.atomic() if not alone or bus.any_registered() else nullcontext():
        for i in order:
            fused = prepared[i]
            assert fused is not None
            got = sql.backend().append(fused.claim, fused.rows, alone=alone)
            if got is not None:
                out[i] = _fused_written(fused, got)
    for i in order:
        steps = out[i]
        if steps is not None:
            for s, stored in zip(steps, prepared[i].rows, strict=True):  # type: ignore[union-attr]
                s.row_id = stored.id
    return out


def _fused_tail(target: AppendTarget, count: int) -> Tail | None:
    """The tail a fused append builds on (module docstring of claim.py), or None when only
    the general path can take it."""
    if count != 1:  # a call's choices are stored against each other: their ids are needed in turn
        return None
    if target.policy_version is not None and target.policy_version not in _known_versions:
        return None
    if not target.new:
        tail = recent.latest(target.trajectory_uid)
        if tail is not None:
            return tail
    # New (minted by the door), or unknown here: the statement creates the trajectory, only if
    # no row has its uid (claim.py). A group known to have an anchor not read yet goes to the
    # general path, which stores the first step against it (and remembers it); so do uids
    # that break a rule (the general path names them).
    group = target.prompt_group_uid
    if group is not None:
        known = anchors.get(group)
        if known is not None and known.anchor is None:
            return None
    try:
        if not target.new:
            rules.check_uid(target.trajectory_uid, "trajectory_uid")
        if group is not None:
            rules.check_uid(group, "prompt_group_uid")
    except InvalidInput:
        return None
    return ABSENT


@dataclass(slots=True)
class _Fused:
    """A fused append planned, not yet written."""

    target: AppendTarget
    tail: Tail
    steps: list[StepIn]
    planned: list[Planned]
    rows: list[Step]
    claim: FusedClaim
    source_id: int | None
    has_media: bool


def _append_fused(
    target: AppendTarget, count: int, tail: Tail, build: Build, source_id: int | None, mine: Sources
) -> list[StepIn] | None:
    """The hot path: claim and insert in one statement (sql.Backend.append), trusting
    the hint ``tail`` only as far as the claim proves it (step_count == tail.end). None when
    the claim missed: nothing was written, the general path runs."""
    fused = _fused_prepare(target, count, tail, build, source_id, mine)
    # One statement in autocommit when nothing follows it; inside a transaction when
    # registered effects, or the step's images, must commit or roll back with the steps.
    with transaction.atomic() if bus.any_registered() or fused.has_media else nullcontext():
        got = sql.backend().append(fused.claim, fused.rows)
        if got is None:
            return None
        if fused.has_media:  # after the claim: a missed claim stores nothing; a bad image rolls it back
            media_link(
                fused.steps,
                [got.ids[r.step_index] for r in fused.rows],
                media_prepare(fused.steps, sources=mine),
                source_id=source_id,
            )
        steps = _fused_written(fused, got)
    for s, stored in zip(steps, fused.rows, strict=True):
        s.row_id = stored.id
    return steps


def _fused_prepare(
    target: AppendTarget, count: int, tail: Tail, build: Build, source_id: int | None, mine: Sources
) -> _Fused:
    """Build, number and plan the steps on ``tail``, and their rows and claim: no query."""
    steps = _number(build(tail), count, target, tail.end, trajectory_version=None)
    # A new rollout of a group whose anchor is known: its first step is a candidate child of it.
    known = anchors.get(target.prompt_group_uid) if tail is ABSENT and target.prompt_group_uid else None
    anchor = known.anchor if known is not None else None
    candidates = _append_candidates(tail, len(steps), [anchor] if anchor is not None else [])
    planned = choose_parents(steps, [pack(s) for s in steps], candidates)
    now = timezone.now()
    rows = []
    for p in planned:
        parent = (p.parent.id, p.parent.full, p.parent.depth) if isinstance(p.parent, Stored) else None
        row = step_row(p, trajectory_id=None, parent=parent, source_id=source_id)
        row.created_at = row.updated_at = now
        rows.append(row)
    new = new_group = None
    if tail is ABSENT:  # a new trajectory (_fused_tail): inserted by the statement itself
        spec = TrajectorySpec(
            uid=target.trajectory_uid, channel=target.channel, policy_version=target.policy_version
        )
        new = _trajectory_row(spec, None, source_id, n=count)  # its group: the statement's
        if target.prompt_group_uid is not None and anchor is None:  # inserted by the statement if new
            new_group = _group_row(target.prompt_group_uid, source_id, mine)
    claim = FusedClaim(
        uid=target.trajectory_uid,
        expected=tail.end,
        new=new,
        new_group=new_group,
        group_anchor=anchor.id if anchor is not None else None,
        minted=target.new,
        group_uid=target.prompt_group_uid,
        sources=None if mine is None else tuple(sorted(mine)),
    )
    return _Fused(target, tail, steps, planned, rows, claim, source_id, any(s.images for s in steps))


def _fused_written(fused: _Fused, got: sql.Appended) -> list[StepIn]:
    """A fused append's rows as written, its effects (in the caller's transaction, if any)
    and its hint for the next call (after commit)."""
    target, rows, steps = fused.target, fused.rows, fused.steps
    traj_id, group_id = got.trajectory_id, got.group_id
    for row, s in zip(rows, steps, strict=True):
        row.id, row.trajectory_id = got.ids[row.step_index], traj_id
        row._state.adding = False
        if row.policy_version_id is None:  # stamped by the statement: the trajectory's
            row.policy_version_id = s.policy_version = got.policy_version_id
    created = fused.claim.new is not None
    # the anchored statement checked the group's anchor (sql._fused_sql): nothing to anchor
    anchored = fused.claim.group_anchor is not None
    written = WrittenTrajectory(
        traj_id, target.trajectory_uid, group_id, created, ended=False, anchored=anchored
    )
    bus.apply(
        _written(
            rows,
            [written],
            source_id=fused.source_id,
            tails={traj_id: fused.tail.end},
            counted=True,
            channel=target.channel,
        )
    )
    _remember(target.trajectory_uid, fused.tail.end, rows, fused.planned)
    if created and group_id is not None and fused.claim.group_anchor is None:
        # its step 0 anchors the group (effects.group_anchors), or another rollout's did first
        _remember_anchor(target.prompt_group_uid, GroupAnchor(group_id, None))
    return steps


def _append_general(
    target: AppendTarget, n: int, build: Build, source_id: int | None, mine: Sources
) -> list[StepIn]:
    """Claim under the row lock, read the tail (hint or database), plan, insert, effects."""
    with transaction.atomic():
        if target.policy_version is not None:
            policy_versions_ensure({target.policy_version})
            known = target.policy_version
            transaction.on_commit(lambda: _known_versions.add(known))
        row = None if target.new else sql.trajectory_claim(target.trajectory_uid, n, mine)
        groups = groups_ensure(
            {target.prompt_group_uid} if target.prompt_group_uid else set(), source_id=source_id, sources=mine
        )
        if row is None:
            trajectory_ensure(
                specs=[
                    TrajectorySpec(
                        uid=target.trajectory_uid,
                        group_uid=target.prompt_group_uid,
                        channel=target.channel,
                        policy_version=target.policy_version,
                    )
                ],
                groups=groups,
                source_id=source_id,
                sources=mine,
            )
            row = sql.trajectory_claim(target.trajectory_uid, n, mine)
        assert row is not None, "trajectory_ensure just made sure the row exists"
        traj = TrajectoryRow(*row)
        if traj.status != Trajectory.Status.RUNNING:
            raise Conflict(
                f"trajectory {target.trajectory_uid!r} is {traj.status}; it takes no new steps",
                field="trajectory_uid",
            )
        if target.prompt_group_uid:
            _bind_group(traj, groups[target.prompt_group_uid].id, "prompt_group_uid")
        start = traj.step_count - n
        tail = recent.get(target.trajectory_uid, start) or tail_load(traj.id, traj.tail_index, start)
        steps = _number(build(tail), n, target, start, trajectory_version=traj.policy_version_id)
        group_anchors: list[Stored] = []
        if start == 0 and traj.group_id is not None:
            anchor = groups[target.prompt_group_uid].anchor_step_id if target.prompt_group_uid else None
            if anchor is None:
                anchor = PromptGroup.objects.filter(id=traj.group_id).values_list(
                    "anchor_step_id", flat=True
                )[0]
            if anchor is not None:
                group_anchors = list(_load_stored({anchor}, {}).values())
            if target.prompt_group_uid is not None:  # this step anchors it, or the one read does
                _remember_anchor(
                    target.prompt_group_uid, GroupAnchor(traj.group_id, next(iter(group_anchors), None))
                )
        planned = choose_parents(steps, [pack(s) for s in steps], _append_candidates(tail, n, group_anchors))
        try:
            with transaction.atomic():
                rows = build_rows(
                    planned,
                    trajectory_id_of=lambda s: traj.id,
                    source_id=source_id,
                    insert=sql.backend().insert_steps,
                )
        except IntegrityError:
            raise Conflict(
                f"trajectory {target.trajectory_uid!r}: step uids {steps[0].uid!r}.. are taken by other steps",
                field="trajectory_uid",
            ) from None
        media_link(steps, [r.id for r in rows], media_prepare(steps, sources=mine), source_id=source_id)
        bus.apply(
            _written(
                rows,
                [_trajectory_written(traj, anchored=bool(group_anchors))],
                source_id=source_id,
                tails={traj.id: start},
                channel=target.channel,
            )
        )
        _remember(target.trajectory_uid, start, rows, planned)
    for s, stored in zip(steps, rows, strict=True):
        s.row_id = stored.id
    return steps


def _append_candidates(tail: Tail, n: int, anchors: list[Stored]) -> list[list[Candidate]]:
    """Parent candidates of appended steps, by the rule of every write: the previous index
    (the tail's last step for the first, the preceding step of this append for the others)
    and, for a step 0, the group anchor. A continuation of an n > 1 call is thus stored
    against the last choice, exactly as a white-box batch of the same steps would be."""
    first: list[Candidate] = [tail.steps[-1]] if tail.steps else list(anchors)
    return [first] + [[i - 1] for i in range(1, n)]


def _number(
    steps: list[StepIn], count: int, target: AppendTarget, start: int, *, trajectory_version: int | None
) -> list[StepIn]:
    """Indexes, uids, group and policy version of appended steps; the rules of a step."""
    if len(steps) != count:
        raise AssertionError(f"build returned {len(steps)} steps for an append of {count}")
    for i, s in enumerate(steps):
        s.step_index = start + i
        s.uid = default_uid(target.trajectory_uid, s.step_index)
        s.trajectory_uid = target.trajectory_uid
        s.prompt_group_uid = target.prompt_group_uid
        s.policy_version = target.policy_version if target.policy_version is not None else trajectory_version
        rules.check_token_count(len(s.prompt_ids), len(s.response_ids), s.field_prefix)
        rules.check_reward(s.reward, s.at("reward"))
    return steps


def _remember_anchor(group_uid: str, known: GroupAnchor) -> None:
    """After commit: the group has an anchor, ``known.anchor`` if read (claim.anchors)."""
    transaction.on_commit(lambda: anchors.put(group_uid, known))


def _remember(trajectory_uid: str, start: int, rows: list[Step], planned: list[Planned]) -> None:
    """After commit, this append is the trajectory's hint (claim.recent)."""
    tail = Tail(
        end=start + len(rows),
        steps=[Stored(r.id, r.seq_depth, p.packed.full) for r, p in zip(rows, planned, strict=True)],
    )
    transaction.on_commit(lambda: recent.put(trajectory_uid, tail))


# Policy versions known to exist (rows are never deleted while steps reference them), so the
# fused path can stamp a version without a lookup; a wrong entry makes the insert fail and
# the general path run.
_known_versions: set[int] = set()


# --- context: trajectories, groups, policy versions ---------------------------------------------------
@dataclass(slots=True)
class TrajectoryRow:
    """The trajectory columns the pipeline needs (sql.TRAJ_COLS), no model instance."""

    id: int
    uid: str
    group_id: int | None
    status: str
    step_count: int
    tail_index: int
    policy_version_id: int | None
    source_id: int | None
    created: bool = False  # inserted by this write


@dataclass(slots=True)
class TrajectorySpec:
    """A trajectory as a write names it. ``field``: how errors name its group field."""

    uid: str
    group_uid: str | None = None
    channel: str = Channel.TRAIN
    policy_version: int | None = None
    metadata: dict | None = None
    field: str = "prompt_group_uid"
    uid_field: str = "trajectory_uid"  # how errors name its uid field


def trajectory_ensure(
    *,
    specs: Sequence[TrajectorySpec],
    source_id: int | None = None,
    groups: dict[str, PromptGroup] | None = None,
    sources: Iterable[int] | None | object = OWN,
) -> dict[str, TrajectoryRow]:
    """The trajectories ``specs`` name, inserted when missing (first spec of a uid wins).

    Every write path creates trajectories here. A trajectory without a group adopts the
    group of the first spec that names one; a spec naming another group raises Conflict.
    The policy versions specs name must exist (policy_versions_ensure). Idempotent and
    race-safe (INSERT ... ON CONFLICT DO NOTHING); call inside the writer's transaction.
    A trajectory (or group) another source holds (``sources``: pool/tenancy.py) raises
    UidTaken before anything of it is changed."""
    mine = allowed(source_id, sources)
    if groups is None:
        groups = groups_ensure({s.group_uid for s in specs if s.group_uid}, source_id=source_id, sources=mine)
    first: dict[str, TrajectorySpec] = {}
    bindings: dict[tuple[str, str], str] = {}  # (trajectory uid, group uid) -> error field
    for spec in specs:  # a batch names each trajectory once per step: the work is per uid
        if spec.uid not in first:
            rules.check_uid(spec.uid, "trajectory_uid")
            first[spec.uid] = spec
        if spec.group_uid:
            bindings.setdefault((spec.uid, spec.group_uid), spec.field)
    found = _trajectories_by_uid(first.keys())
    missing = sorted(first.keys() - found.keys())
    if missing:
        rows = [_trajectory_row(first[u], _group_id(groups, first[u].group_uid), source_id) for u in missing]
        for r in sql.trajectories_insert(rows):
            found[r[1]] = inserted = TrajectoryRow(*r)
            inserted.created = True
        late = [u for u in missing if u not in found]  # inserted concurrently by another writer
        if late:
            found.update(_trajectories_by_uid(late))
    for uid, t in found.items():
        if not owns(mine, t.source_id):
            raise UidTaken("trajectory", uid, field=first[uid].uid_field)
    for (uid, group_uid), field in bindings.items():
        _bind_group(found[uid], groups[group_uid].id, field)
    return found


def _group_id(groups: dict[str, PromptGroup], uid: str | None) -> int | None:
    return groups[uid].id if uid else None


def _bind_group(traj: TrajectoryRow, group_id: int, field: str) -> None:
    """Adopt ``group_id`` when the trajectory has no group; Conflict when it has another."""
    if traj.group_id is None:
        if not Trajectory.objects.filter(id=traj.id, group__isnull=True).update(group_id=group_id):
            # A concurrent writer bound a group first (its row lock ordered us after it).
            traj.group_id = Trajectory.objects.filter(id=traj.id).values_list("group_id", flat=True)[0]
        else:
            traj.group_id = group_id
    if traj.group_id != group_id:
        raise Conflict(f"trajectory {traj.uid!r} belongs to another prompt group", field=field)


def _trajectories_by_uid(uids: Iterable[str]) -> dict[str, TrajectoryRow]:
    return {r[1]: TrajectoryRow(*r) for r in compiled.read(_trajectory_rows, uids=Many(uids))}


# The builds of the batch's reads (pool/compiled.py: compiled once, each batch makes them).
def _stored_uids(*, uids: Many):
    return Step.objects.filter(uid__any=uids).values_list("uid", "content_hash", "trajectory_id")


def _stored_at(*, trajectories: Many, indexes: Many):
    return Step.objects.filter(trajectory_id__any=trajectories, step_index__any=indexes).values_list(
        "id", "trajectory_id", "step_index", "uid", "seq_depth"
    )


def _trajectory_rows(*, uids: Many):
    return Trajectory.objects.filter(uid__any=uids).values_list(*TRAJ_COLS)


def _trajectory_row(
    spec: TrajectorySpec, group_id: int | None, source_id: int | None, n: int = 0
) -> Trajectory:
    """A new trajectory's row (``n``: steps it is created with, by a fused append)."""
    now = timezone.now()
    return sql.new_instance(
        Trajectory,
        dict(
            uid=spec.uid,
            group_id=group_id,
            source_id=source_id,
            channel=spec.channel,
            status=Trajectory.Status.RUNNING,
            step_count=n,
            tail_index=0,
            policy_version_id=spec.policy_version,
            metadata=spec.metadata or {},
            created_at=now,
            updated_at=now,
        ),
    )  # type: ignore[return-value]


def groups_ensure(
    uids: set[str], *, source_id: int | None = None, sources: Sources = None
) -> dict[str, PromptGroup]:
    """The prompt groups named, created when missing. Idempotent, race-safe.

    A restricted writer (``sources``: pool/tenancy.py) creates its groups as its source's
    and may name its own groups and shared ones (no source); another source's raises
    UidTaken. An unrestricted writer creates shared groups."""
    if not uids:
        return {}
    for u in uids:
        rules.check_uid(u, "prompt_group_uid")
    found = {g.uid: g for g in PromptGroup.objects.filter(uid__in=uids)}
    missing = uids - found.keys()
    if missing:
        PromptGroup.objects.bulk_create(
            [_group_row(u, source_id, sources) for u in sorted(missing)], ignore_conflicts=True
        )
        found.update({g.uid: g for g in PromptGroup.objects.filter(uid__in=missing)})
    for uid, g in found.items():
        if g.source_id is not None and not owns(sources, g.source_id):
            raise UidTaken("prompt group", uid, field="prompt_group_uid")
    return found


def _group_row(uid: str, source_id: int | None, sources: Sources) -> PromptGroup:
    """A new prompt group's row: a restricted writer's is its source's, an unrestricted
    writer's shared (groups_ensure)."""
    return sql.new_instance(  # type: ignore[return-value]
        PromptGroup,
        dict(uid=uid, source_id=source_id if sources is not None else None, created_at=timezone.now()),
    )


def policy_versions_ensure(versions: set[int]) -> None:
    """The policy version rows named, created when missing. Idempotent, race-safe."""
    if not versions:
        return
    known = set(PolicyVersion.objects.filter(version__in=versions).values_list("version", flat=True))
    if versions - known:
        PolicyVersion.objects.bulk_create(
            [PolicyVersion(version=v) for v in versions - known], ignore_conflicts=True
        )


# --- effects' record ------------------------------------------------------------------------------
def _written_step(r: Step) -> WrittenStep:
    return WrittenStep(
        id=r.id,
        uid=r.uid,
        trajectory_id=r.trajectory_id,
        step_index=r.step_index,
        is_last=r.is_last,
        reward_final=r.reward_status == Step.RewardStatus.FINAL,
        policy_version=r.policy_version_id,
        token_source=r.token_source,
        drift=r.drift,
        prompt_len=r.prompt_len,
        response_len=r.seq_len - r.prompt_len,
    )


def _written(
    rows: list[Step],
    trajectories: Iterable[WrittenTrajectory],
    *,
    source_id: int | None,
    tails: dict[int, int] | None = None,
    counted: bool = False,
    channel: str = "",
) -> StepsWritten:
    """The effects' record of one write. ``tails`` (appends only): each trajectory's first
    index of this append; ``counted``: the write's own statement moved the counters."""
    return StepsWritten(
        steps=tuple(_written_step(r) for r in rows),
        trajectories={t.id: t for t in trajectories},
        source_id=source_id,
        door="batch" if tails is None else "append",
        counted=counted,
        tails=tails or {},
        channel=channel,
    )


def _trajectory_written(t: TrajectoryRow, *, anchored: bool = False) -> WrittenTrajectory:
    return WrittenTrajectory(
        t.id, t.uid, t.group_id, t.created, ended=t.status != Trajectory.Status.RUNNING, anchored=anchored
    )
