"""Pull cursors (curation/services/cursors.py): an oldest-first pull reads its ready queue from
where its consumer stands, and every event that gives a unit back moves the cursor back first,
so a unit is never left behind it. Each case is one row: what happens after the consumer's
cursor has passed some groups, and which groups its next pull must then serve.

docs/trainers.md: "A pull costs the same a month in: each consumer has a pull cursor per
dataset and queue (PullCursor): every unit before it is taken (delivered, or dropped by a drop
that still holds), so an oldest-first pull reads its queue from there instead of re-reading
every unit it ever took. A nack, a release or an expiry moves the cursor back before what it
gives back first; a new dataset version, or a current policy version moved back, makes the
pull read from the head again; the cursor stays CLAW_PULL_CURSOR_LAG_SECONDS (120) behind now,
for readiness still committing, every retention sweep moves it back over the last two sweep
intervals and an archive restore to the head, so a unit is delayed at most, never lost." (What
a pull costs a month in: bench.curriculum's pull_consumed_ratio.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.utils import timezone

from curation.models import Delivery, PullCursor
from curation.services.consume import lease_nack, lease_release, leases_expire
from curation.services.cursors import Cursors, cursors_rewind_recent
from curation.services.datasets import dataset_create, dataset_update
from curation.services.labels import steps_label
from curation.services.retention import retention_sweep
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Scope, Step, Trajectory
from pool.services.policy import policy_version_set
from tests.conftest import client_for
from tests.curation.test_consume import pull, ready_group
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def served(resp) -> list[str]:
    seen: list[str] = []
    for s in resp.json()["batch"]["steps"] if resp.json()["batch"] else []:
        if s["prompt_group_uid"] not in seen:
            seen.append(s["prompt_group_uid"])
    return seen


def group_cursor(consumer: str = "c1") -> tuple[dt.datetime | None, int]:
    row = PullCursor.objects.get(consumer__name=consumer, kind=Delivery.Kind.GROUP)
    return row.at, row.key


def position_of(uid: str) -> tuple[dt.datetime, int]:
    """Just before this group: where a cursor stands when it is the first untaken one."""
    g = PromptGroup.objects.get(uid=uid)
    return g.ready_at, g.id - 1


@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


@pytest.fixture
def no_lag(settings):
    settings.CLAW_PULL_CURSOR_LAG_SECONDS = 0


def test_a_pull_reads_its_queue_from_where_its_consumer_stands(trainer, no_lag):
    # given six ready groups and a trainer that pulls and acks two at a time
    dataset_create(name="all")
    uids = [f"g{i}" for i in range(6)]
    for uid in uids:
        ready_group(uid)
    got = []
    for n in range(3):
        resp = pull(trainer, batch_size=2)
        got += served(resp)
        trainer.post(f"/api/v1/leases/{resp.json()['lease_id']}/ack")
        # then after each pull past the first, its cursor stands just before the first group
        # that pull found untaken (the first pull only creates it)
        if n == 0:
            assert group_cursor() == (None, 0)
        else:
            assert group_cursor() == position_of(uids[2 * n])
    # and every group was served once, oldest first
    assert got == uids
    assert pull(trainer).json()["lease_id"] is None


def _lease(resp) -> str:
    return resp.json()["lease_id"]


@dataclass(frozen=True)
class Case:
    """Ready groups g1..g4 (``spec`` for the dataset); ``before`` runs first (versions,
    labels, which drop g1); the trainer pulls g1 and g2 (lease one, left open; g2 alone where
    g1 was dropped) and g3 (lease two: its pull moves the cursor past g1 and g2); then
    ``event``; the next pull of ten must serve ``expect``."""

    name: str
    event: Callable[[dict], None]
    expect: list[str]
    spec: dict | None = None
    before: Callable[[], None] | None = None
    lag: float = 0


def _nack(ctx):
    lease_nack(lease_id=ctx["leases"][0])


def _release(ctx):
    lease_release(lease_id=ctx["leases"][0], actor="op")


def _expire(ctx):
    assert leases_expire(now=timezone.now() + dt.timedelta(days=2)) == 2


def _versions():
    policy_version_set(version=1)
    ready_group("g1", version=1)
    policy_version_set(version=2)
    for uid in ("g2", "g3", "g4"):
        ready_group(uid, version=2)


def _version_back(ctx):
    policy_version_set(version=1, force=True)


def _rejected():
    for uid in ("g1", "g2", "g3", "g4"):
        ready_group(uid)
    steps_label(
        step_ids=Step.objects.filter(trajectory__group__uid="g1").values_list("id", flat=True),
        label="rejected",
        actor="op",
    )


def _new_version(ctx):
    dataset_update(name="all", spec={"filters": {"exclude_labels": []}})


def _stamped_early(ctx):
    """A group stamped ready before g1 whose commit lands after the cursor passed g1."""
    ready_group("late")
    first = PromptGroup.objects.get(uid="g1").ready_at
    PromptGroup.objects.filter(uid="late").update(ready_at=first - dt.timedelta(seconds=1))


def _stamped_early_then_swept(ctx):
    _stamped_early(ctx)
    retention_sweep()


CASES = [
    Case("a nack gives its units back", _nack, ["g1", "g2", "g4"]),
    Case("an admin's release gives its units back", _release, ["g1", "g2", "g4"]),
    Case("expiry gives every open lease's units back", _expire, ["g1", "g2", "g3", "g4"]),
    Case(
        "a stale drop no longer holds once the current version moves back",
        _version_back,
        ["g1", "g4"],
        spec={"serving": {"stale_after": 0}},
        before=_versions,
    ),
    Case(
        "a new dataset version looks afresh at what the old one filtered",
        _new_version,
        ["g1", "g4"],
        spec={"filters": {"exclude_labels": ["rejected"]}},
        before=_rejected,
    ),
    Case("a unit stamped ready within the lag behind the cursor", _stamped_early, ["late", "g4"], lag=3600),
    Case(
        "a unit stamped ready behind the cursor, after a retention sweep",
        _stamped_early_then_swept,
        ["late", "g4"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_what_is_given_back_behind_the_cursor_is_served_again(trainer, settings, case):
    settings.CLAW_PULL_CURSOR_LAG_SECONDS = case.lag
    dataset_create(name="all", spec=case.spec)
    if case.before:
        case.before()
    else:
        for uid in ("g1", "g2", "g3", "g4"):
            ready_group(uid)
    # given a trainer whose open leases hold g1..g3 (the dropped g1 aside) and whose cursor,
    # with no lag, has passed them
    first = pull(trainer, batch_size=1 if case.before else 2)  # g1 dropped, when it is
    second = pull(trainer, batch_size=1)
    taken = served(first) + served(second)
    assert taken == (["g2", "g3"] if case.before else ["g1", "g2", "g3"])
    if not case.lag:
        assert group_cursor() == position_of(taken[-1])
    # when the event happens
    case.event({"leases": [_lease(first), _lease(second)]})
    # then the next pull serves what it gave back, with what was never taken
    assert sorted(served(pull(trainer, batch_size=10))) == sorted(case.expect)


def test_a_pull_that_read_its_queue_before_a_nack_does_not_move_the_cursor_past_it(trainer, no_lag):
    # given a trainer whose lease holds g1 and g2, a later pull that took g3 (the cursor now
    # just before it), and a pull in flight that has read the queue and found nothing
    # untaken after the cursor
    dataset_create(name="all")
    for uid in ("g1", "g2", "g3"):
        ready_group(uid)
    lease = _lease(pull(trainer, batch_size=2))
    pull(trainer, batch_size=1)
    assert group_cursor() == position_of("g3")
    row = PullCursor.objects.select_related("dataset").get(consumer__name="c1", kind=Delivery.Kind.GROUP)
    in_flight = Cursors(
        consumer_id=row.consumer_id,
        dataset_id=row.dataset_id,
        version_id=row.dataset.current_id,
        current=None,
    )
    in_flight.found(Delivery.Kind.GROUP, None)
    in_flight.found(Delivery.Kind.TRAJECTORY, None)
    # when the nack commits before that pull writes the position it found
    lease_nack(lease_id=lease)
    in_flight.advance()
    # then the cursor stays where the nack put it, and g1 and g2 are served again
    assert group_cursor() == position_of("g1")
    assert served(pull(trainer, batch_size=10)) == ["g1", "g2"]


def test_lone_trajectories_have_a_cursor_of_their_own_and_a_nack_moves_it_back(trainer, no_lag):
    # given three completed trajectories without a group, and a trainer whose open lease
    # holds the first two and whose next pull took the third
    dataset_create(name="all")
    for uid in ("t1", "t2", "t3"):
        steps_ingest(steps=[step_in(uid, 0, prompt=[7], response=[8], reward=1.0, is_last=True)])
    lease = _lease(pull(trainer, batch_size=2))
    assert trajectories_of(pull(trainer, batch_size=1)) == ["t3"]
    # then the trajectories' cursor stands just before t3
    row = PullCursor.objects.get(consumer__name="c1", kind=Delivery.Kind.TRAJECTORY)
    t3 = Trajectory.objects.get(uid="t3")
    assert (row.at, row.key) == (t3.completed_at, t3.id - 1)
    # and when the first lease is nacked, its two come back
    lease_nack(lease_id=lease)
    assert sorted(trajectories_of(pull(trainer, batch_size=10))) == ["t1", "t2"]


def trajectories_of(resp) -> list[str]:
    return sorted({s["trajectory_uid"] for s in resp.json()["batch"]["steps"]})


def test_a_retention_sweep_moves_a_cursor_back_over_two_sweep_intervals_only(trainer, settings, no_lag):
    # given a trainer whose cursor stands just before g3, and hourly retention sweeps
    settings.CLAW_RETENTION_SECONDS = 3600
    dataset_create(name="all")
    for uid in ("g1", "g2", "g3"):
        ready_group(uid)
    pull(trainer, batch_size=2)
    pull(trainer, batch_size=1)
    at = position_of("g3")
    assert group_cursor() == at
    # when a sweep runs more than two intervals after that position
    assert cursors_rewind_recent(now=at[0] + dt.timedelta(hours=3)) == 0
    # then the cursor stays (what it passed is older than any commit still in flight) ...
    assert group_cursor() == at
    # ... and a sweep within two intervals moves it back to two intervals before it
    now = at[0] + dt.timedelta(minutes=30)
    assert cursors_rewind_recent(now=now) == 2  # the groups' and the lone trajectories'
    assert group_cursor() == (now - dt.timedelta(hours=2), 0)
    # and the next pull serves what is left, nothing twice
    assert served(pull(trainer, batch_size=10)) == []
