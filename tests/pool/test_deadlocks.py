"""pool.deadlocks.retry_on_deadlock: a write service the database picks as a deadlock victim
is run again, whole, and succeeds; its caller never sees the error. A real deadlock on
PostgreSQL between two sessions that lock two trajectories in opposite orders."""

from __future__ import annotations

import threading
import time

import psycopg.errors
import pytest
from django.db import OperationalError, connection, transaction

from pool.deadlocks import ATTEMPTS, BACKOFF_S, backoff_s, retry_on_deadlock
from pool.models import Trajectory
from pool.services.trajectories import trajectory_create
from tests.concurrency import lock_waiters, started, wait_for


def _raise_as_django(error: Exception) -> None:
    """Raise ``error`` (a psycopg error) as Django's OperationalError wrapping it, as a
    failed statement reaches a service."""
    try:
        raise error
    except psycopg.Error as exc:
        raise OperationalError(str(exc)) from exc


@pytest.mark.django_db(transaction=True)
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


@pytest.mark.django_db(transaction=True)
def test_inside_an_outer_transaction_it_runs_once():
    calls: list[int] = []

    @retry_on_deadlock
    def service() -> bool:
        calls.append(1)
        return connection.in_atomic_block

    with transaction.atomic():
        assert service() is True
    assert calls == [1]


def test_each_retry_waits_at_least_the_backoff_which_doubles():
    # given: a service the database picks as a victim twice (the error psycopg raises for it)
    starts: list[float] = []

    @retry_on_deadlock
    def service() -> str:
        starts.append(time.monotonic())
        if len(starts) < ATTEMPTS:
            _raise_as_django(psycopg.errors.DeadlockDetected("deadlock detected"))
        return "done"

    # when / then: it succeeds on its last attempt, each retry after at least its backoff
    assert service() == "done" and len(starts) == ATTEMPTS == 3
    waits = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert waits[0] >= BACKOFF_S and waits[1] >= 2 * BACKOFF_S
    # the backoff's bounds: [base, 2 * base), base doubling per attempt
    for attempt in (1, 2, 3):
        base = BACKOFF_S * 2 ** (attempt - 1)
        assert backoff_s(attempt, lambda: 0.0) == base
        assert base <= backoff_s(attempt) < 2 * base
        assert backoff_s(attempt, lambda: 0.999) < 2 * base


def test_an_error_that_is_not_a_deadlock_is_not_retried():
    calls: list[int] = []

    @retry_on_deadlock
    def service() -> None:
        calls.append(1)
        _raise_as_django(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))

    with pytest.raises(OperationalError):
        service()
    assert calls == [1]
