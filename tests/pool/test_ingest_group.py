"""Group commit of proxied calls (pool.ingest.steps_append_group): fused appends of several
trajectories in one transaction; what joins, what does not, and what a failure leaves.

Each case writes through the group and compares what the pool holds, step by step, with
what was sent: uid, index, ids (read back through the prefix deltas), logprobs, trajectory
counters. The mechanics of the gateway's writer thread are tests/gateway/test_group_writer.py;
the group commit's rows against every other door's are tests/pool/test_ingest_paths.py
(door ``proxy_group``).
"""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
from django.db import DatabaseError, connection, transaction

from pool import tokens
from pool.errors import PoolError
from pool.ingest.claim import Tail, recent
from pool.ingest.contract import StepIn
from pool.ingest.pipeline import (
    AppendRequest,
    AppendTarget,
    append_groupable,
    groups_ensure,
    steps_append,
    steps_append_group,
)
from pool.models import PromptGroup, Source, Step, Trajectory
from tests.concurrency import lock_waiters, started, wait_for
from tests.pool.statements import sql_statements

pytestmark = pytest.mark.django_db


@pytest.fixture
def source() -> Source:
    return Source.objects.create(name=f"group-{uuid.uuid4().hex[:8]}")


def _step(prompt: list[int], response: list[int]) -> StepIn:
    return StepIn(
        trajectory_uid="",
        step_index=0,
        prompt_ids=np.asarray(prompt, dtype=np.int32),
        response_ids=np.asarray(response, dtype=np.int32),
        rollout_logprobs=np.linspace(-1.0, -0.1, len(response)),
        token_source=Step.TokenSource.UPSTREAM,
    )


def _request(source: Source, uid: str, prompt: list[int], response: list[int], *, new: bool) -> AppendRequest:
    step = _step(prompt, response)
    return AppendRequest(
        target=AppendTarget(trajectory_uid=uid, new=new),
        count=1,
        build=lambda tail: [step],
        source_id=source.id,
    )


def _stored(uid: str) -> list[tuple]:
    """(index, full ids, logprobs) of a trajectory's steps, read back from the pool."""
    rows = list(
        Step.objects.filter(trajectory__uid=uid)
        .order_by("step_index")
        .values_list("id", "step_index", "rollout_logprobs")
    )
    full = tokens.load_sequences(sid for sid, _, _ in rows)
    return [
        (
            index,
            tokens.bytes_to_ids(full[sid]).tolist(),
            np.frombuffer(lp, dtype=tokens.LOGPROB_DTYPE).round(6).tolist(),
        )
        for sid, index, lp in rows
    ]


def _sent(prompt: list[int], response: list[int]) -> tuple[list[int], list[float]]:
    return prompt + response, np.linspace(-1.0, -0.1, len(response)).astype(tokens.LOGPROB_DTYPE).round(
        6
    ).tolist()


def test_concurrent_calls_of_several_trajectories_are_one_group_and_read_back_exactly(
    source, django_capture_on_commit_callbacks
):
    # given: three new trajectories' first calls, and a known trajectory's next call
    known = f"known-{uuid.uuid4().hex}"
    with django_capture_on_commit_callbacks(execute=True):
        steps_append(
            target=AppendTarget(trajectory_uid=known, new=True),
            count=1,
            build=lambda t: [_step([1, 2, 3], [4, 5])],
            source_id=source.id,
        )
    news = [f"new-{i}-{uuid.uuid4().hex}" for i in range(3)]
    sent = {uid: ([10 + i, 11, 12], [13 + i, 14]) for i, uid in enumerate(news)}
    sent[known] = ([1, 2, 3, 4, 5, 6], [7])
    requests = [_request(source, uid, *sent[uid], new=uid != known) for uid in [*news, known]]
    assert all(append_groupable(r.target, r.count) for r in requests)

    # when: they are written as one group
    with django_capture_on_commit_callbacks(execute=True), sql_statements() as statements:
        written = steps_append_group(requests)

    # then: every call was written, each with its next index and exactly what was sent
    assert [[s.step_index for s in w] for w in written] == [[0], [0], [0], [1]]
    for uid in news:
        full, logprobs = _sent(*sent[uid])
        assert _stored(uid) == [(0, full, logprobs)]
    full, logprobs = _sent(*sent[known])
    assert _stored(known)[1] == (1, full, logprobs)
    assert Trajectory.objects.get(uid=known).step_count == 2
    # one statement per call on PostgreSQL (its fused claim + insert), one commit for all
    if connection.vendor == "postgresql":
        assert len(statements) == len(requests), statements
    # and each trajectory's latest append is this process's hint for its next call
    assert recent.latest(known).end == 2


def test_what_cannot_join_is_left_to_steps_append_and_nothing_of_it_is_written(source):
    # given: a trajectory whose hint is stale (another process wrote since), two calls of one
    # trajectory, a call of several choices and a step over the token limit
    stale = f"stale-{uuid.uuid4().hex}"
    steps_append(
        target=AppendTarget(trajectory_uid=stale, new=True),
        count=1,
        build=lambda t: [_step([1], [2])],
        source_id=source.id,
    )
    recent.put(stale, Tail(end=0, steps=[]))  # as if no call were known: the claim expects 0
    twice = f"twice-{uuid.uuid4().hex}"
    requests = [
        _request(source, stale, [1, 2, 3], [4], new=False),
        _request(source, twice, [5], [6], new=True),
        _request(source, twice, [5, 6, 7], [8], new=True),
        AppendRequest(
            target=AppendTarget(trajectory_uid=f"n2-{uuid.uuid4().hex}", new=True),
            count=2,
            build=lambda t: [_step([1], [2]), _step([1], [3])],
            source_id=source.id,
        ),
    ]

    # when: they are written as one group
    written = steps_append_group(requests)

    # then: only the first call of "twice" joined; the others wrote nothing
    assert [w is not None for w in written] == [False, True, False, False]
    assert Trajectory.objects.get(uid=stale).step_count == 1
    assert _stored(twice) == [(0, *_sent([5], [6]))]
    assert not Trajectory.objects.filter(uid=requests[3].target.trajectory_uid).exists()


def test_a_taken_step_uid_rolls_the_group_back_on_postgresql_or_leaves_that_call_out_elsewhere(
    source, django_capture_on_commit_callbacks
):
    # given: a trajectory with one step, known to this process, whose next uid another step holds
    victim, holder = f"victim-{uuid.uuid4().hex}", f"holder-{uuid.uuid4().hex}"
    with django_capture_on_commit_callbacks(execute=True):
        for uid in (victim, holder):
            steps_append(
                target=AppendTarget(trajectory_uid=uid, new=True),
                count=1,
                build=lambda t: [_step([1], [2])],
                source_id=source.id,
            )
    Step.objects.filter(trajectory__uid=holder).update(uid=f"{victim}:1")
    bystander = f"bystander-{uuid.uuid4().hex}"
    requests = [
        _request(source, bystander, [7, 8], [9], new=True),
        _request(source, victim, [1, 2, 5], [6], new=False),
    ]
    assert all(append_groupable(r.target, r.count) for r in requests)

    if connection.vendor == "postgresql":
        # when: they are written as one group, then: the statement that hit the taken uid
        # aborted the transaction, so nothing of the group was written, and the error reaches
        # the caller (the gateway records each call alone then)
        with pytest.raises(DatabaseError):
            steps_append_group(requests)
        assert not Trajectory.objects.filter(uid=bystander).exists()
    else:
        # when/then: SQLite's backend rolls that call back alone (its savepoint); the other joined
        written = steps_append_group(requests)
        assert [w is not None for w in written] == [True, False]
        assert _stored(bystander) == [(0, *_sent([7, 8], [9]))]
    assert Trajectory.objects.get(uid=victim).step_count == 1
    assert [index for index, *_ in _stored(victim)] == [0]


# A named trajectory's first call creates its trajectory (and a new group) in its one
# statement only when nothing stands in the way; otherwise the statement writes nothing (the
# group it inserted is undone with it) and the general path names the error.
# (case, what is in the way, the error)
IN_THE_WAY = [
    ("another source's trajectory", "trajectory", "uid_taken"),
    ("another source's group", "group", "uid_taken"),
    ("the trajectory in another group", "other group", "conflict"),
]


@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "group commit"])
@pytest.mark.parametrize(("case", "in_the_way", "code"), IN_THE_WAY, ids=[c[0] for c in IN_THE_WAY])
def test_a_named_first_call_that_cannot_be_created_writes_nothing_not_even_its_group(
    source, case, in_the_way, code, grouped
):
    # given: what stands in the way of trajectory T joining a new group G
    other = Source.objects.create(name=f"other-{uuid.uuid4().hex[:8]}")
    uid, group = f"t-{uuid.uuid4().hex}", f"g-{uuid.uuid4().hex}"
    if in_the_way == "trajectory":  # T is another source's
        steps_append(
            target=AppendTarget(trajectory_uid=uid),
            count=1,
            build=lambda t: [_step([1], [2])],
            source_id=other.id,
        )
    elif in_the_way == "group":  # G is another source's, without an anchor yet
        groups_ensure({group}, source_id=other.id, sources=frozenset({other.id}))
    else:  # T is this source's, in another group
        steps_append(
            target=AppendTarget(trajectory_uid=uid, prompt_group_uid=f"first-{group}"),
            count=1,
            build=lambda t: [_step([1], [2])],
            source_id=source.id,
        )
    recent.clear()  # the call comes to a process that does not know T
    before = (
        sorted(PromptGroup.objects.values_list("uid", "source_id")),
        sorted(Trajectory.objects.values_list("uid", "group_id", "step_count", "source_id")),
        Step.objects.count(),
    )
    target = AppendTarget(trajectory_uid=uid, prompt_group_uid=group)

    # when: the call is recorded, alone or in a group commit (which leaves it to steps_append)
    with pytest.raises(PoolError) as raised:
        if grouped:
            request = AppendRequest(
                target=target, count=1, build=lambda t: [_step([5], [6])], source_id=source.id
            )
            assert steps_append_group([request]) == [None]
        steps_append(target=target, count=1, build=lambda t: [_step([5], [6])], source_id=source.id)

    # then: the general path's error, and the pool holds what it held: no group G, no step
    assert raised.value.code == code, raised.value
    after = (
        sorted(PromptGroup.objects.values_list("uid", "source_id")),
        sorted(Trajectory.objects.values_list("uid", "group_id", "step_count", "source_id")),
        Step.objects.count(),
    )
    assert after == before


@pytest.mark.django_db(transaction=True)
def test_a_named_first_call_into_a_group_another_writer_is_creating_joins_it_once_committed():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL (SQLite serialises them)")
    # given: a writer that has inserted group G and not committed yet
    source = Source.objects.create(name=f"race-{uuid.uuid4().hex[:8]}")
    uid, group = f"t-{uuid.uuid4().hex}", f"g-{uuid.uuid4().hex}"
    inserted, errors = threading.Event(), []

    def creator() -> None:
        with transaction.atomic():
            groups_ensure({group}, source_id=source.id, sources=frozenset({source.id}))
            inserted.set()
            wait_for(lambda: lock_waiters() > 0, "the call to wait on the uncommitted group")

    def call() -> None:
        assert inserted.wait(timeout=30)
        # when: a call names G for a new trajectory (its statement's insert of G waits, then
        # finds G taken and, G not in its snapshot, writes nothing: the general path joins G)
        steps_append(
            target=AppendTarget(trajectory_uid=uid, prompt_group_uid=group),
            count=1,
            build=lambda t: [_step([1, 2, 3], [4, 5])],
            source_id=source.id,
        )

    for t in [started(creator, errors), started(call, errors)]:
        t.join(timeout=60)

    # then: no error, one group G (the creator's), the trajectory in it, its step as sent
    assert errors == []
    assert list(PromptGroup.objects.filter(uid=group).values_list("source_id", flat=True)) == [source.id]
    traj = Trajectory.objects.select_related("group").get(uid=uid)
    assert (traj.group.uid, traj.step_count, traj.source_id) == (group, 1, source.id)
    assert _stored(uid) == [(0, *_sent([1, 2, 3], [4, 5]))]
    assert traj.group.anchor_step_id == Step.objects.get(trajectory=traj).id
