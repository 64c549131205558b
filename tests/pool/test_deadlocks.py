"""pool.deadlocks.retry_on_deadlock: a write service the database picks as a deadlock victim
is run again, whole, and succeeds; its caller never sees the error. A real deadlock on
PostgreSQL between two sessions that lock two trajectories in opposite orders."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from pool.deadlocks import retry_on_deadlock
from pool.models import Trajectory
from pool.services.trajectories import trajectory_create
from tests.concurrency import lock_waiters, started, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_deadlock_victim_is_run_again_and_succeeds():
    if connection.vendor != "postgresql":
        pytest.skip("deadlocks need PostgreSQL (SQLite serialises writers)")
    a, b = trajectory_create(uid="dl-a")[0], trajectory_create(uid="dl-b")[0]
    other_holds_b = threading.Event()
    other_committed = threading.Event()
    attempts: list[int] = []
    errors: list[BaseException] = []

    @retry_on_deadlock
    @transaction.atomic
    def victim() -> None:
        attempts.append(1)
        with connection.cursor() as cur:
            # detect the deadlock long before the other session does: this one is the victim
            cur.execute("SET LOCAL deadlock_timeout = '50ms'")
        if len(attempts) > 1:
            # The retry starts once the winner has committed. Without this, it raced the winner,
            # which was woken by the victim's rollback, for a's row lock: when the retry took the
            # lock first, the two deadlocked again (one CI run in many: 3 attempts).
            other_committed.wait(timeout=30)
        Trajectory.objects.filter(id=a.id).update(channel="val")
        if len(attempts) == 1:
            other_holds_b.wait(timeout=30)
        Trajectory.objects.filter(id=b.id).update(channel="val")

    def other() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("SET LOCAL deadlock_timeout = '10s'")
                Trajectory.objects.filter(id=b.id).update(metadata={"by": "other"})
                other_holds_b.set()
                wait_for(lambda: lock_waiters() > 0, "the victim to wait on trajectory b")
                Trajectory.objects.filter(id=a.id).update(metadata={"by": "other"})
        finally:
            other_committed.set()

    # when: both lock the two trajectories in opposite orders
    threads = [started(victim, errors), started(other, errors)]
    for t in threads:
        t.join(timeout=60)
    # then: the victim ran twice, nobody saw an error, and both writes are in
    assert errors == [] and len(attempts) == 2
    assert set(Trajectory.objects.filter(uid__in=["dl-a", "dl-b"]).values_list("channel", flat=True)) == {
        "val"
    }
    assert all(m == {"by": "other"} for m in Trajectory.objects.values_list("metadata", flat=True))


def test_inside_an_outer_transaction_it_runs_once():
    calls: list[int] = []

    @retry_on_deadlock
    def service() -> bool:
        calls.append(1)
        return connection.in_atomic_block

    with transaction.atomic():
        assert service() is True
    assert calls == [1]
