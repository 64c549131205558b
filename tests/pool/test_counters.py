"""The counters PostgreSQL keeps (pool.models.Counter, pool/selectors/counters.py) say what a
count of the rows says, after every kind of write: the pipeline's inserts, completions and
rewards, labels, merges, pulls and acks, events and feedback, a purge's deletes, a source's
deletion (its trajectories set to NULL), a compaction, and a plain SQL UPDATE that no service
made. Each reader of the counts (the dashboard's live state with its sources, the overview's
source health, ``GET /api/v1/stats``'s whole-pool numbers) is read both ways, from the
counters and by counting, and compared whole. PostgreSQL only: SQLite counts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.utils import timezone

from curation.models import Lease
from curation.selectors.live import ALL, live_state
from curation.selectors.pages import ingest_rate, overview, sources_health
from pool.models import Counter, PromptGroup, Source, Step, Trajectory
from pool.selectors.counters import minute_of
from pool.selectors.stats import pool_stats
from pool.services.counters import MINUTES_KEPT, counters_compact
from pool.services.purge import groups_purge
from pool.services.service_events import EventIn, event_record, feedback_create
from tests.conftest import client_for
from tests.dashboard.traffic import drive

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite keeps no counters: its readers count (CI's PostgreSQL pass runs this)")


def both(read: Callable[..., object]) -> tuple[object, object]:
    return read(counted=True), read(counted=False)


def without_last_seen(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "last_seen"} for r in rows]


def check(*, moved: bool = False) -> dict:
    """Every reader, from the counters and by counting, compared whole. Once trajectories
    were deleted or moved to another source, a source's "last seen" is when it was last
    seen, even if that trajectory is gone: the counters never lower it, a count forgets it."""
    counted, scanned = both(lambda counted: live_state(ALL, counted=counted))
    counted_sources, scanned_sources = counted["collect"].pop("sources"), scanned["collect"].pop("sources")
    assert counted == scanned
    counted_stats, scanned_stats = both(pool_stats)
    assert counted_stats == scanned_stats
    assert ingest_rate(counted=True) == ingest_rate(counted=False)
    counted_health, scanned_health = both(sources_health)
    if moved:
        assert without_last_seen(counted_sources) == without_last_seen(scanned_sources)
        assert sorted(without_last_seen(counted_health), key=lambda r: r["name"]) == sorted(
            without_last_seen(scanned_health), key=lambda r: r["name"]
        )
        for mine, theirs in zip(counted_health, scanned_health, strict=True):
            assert theirs["last_seen"] is None or mine["last_seen"] >= theirs["last_seen"]
    else:
        assert counted_sources == scanned_sources
        assert counted_health == scanned_health
    return counted_stats


def test_the_counters_say_what_a_count_says_after_every_kind_of_write(agent_key, trainer_key, admin_key):
    agent, trainer = client_for(agent_key), client_for(trainer_key)
    check()
    # the pipeline, completions with rewards, a retokenized step, a label, a merge, a policy
    # version and a pull, twice (two sources' worth of trajectories)
    drive(agent, trainer)
    drive(agent, trainer, prefix="b-")
    stats = check()
    assert stats["steps"] == 16 and stats["trajectories"] == 12 and stats["merge"]["total_tokens"] > 0
    # acks of the leases
    for lease_id in Lease.objects.filter(status=Lease.Status.LEASED).values_list("id", flat=True):
        assert trainer.post(f"/api/v1/leases/{lease_id}/ack", {}, format="json").status_code == 200
    check()
    # events and feedback
    event_record(events=[EventIn(type="tool_call", trajectory_uid="g-r0"), EventIn(type="upstream_error")])
    feedback_create(trajectory_uid="run", rating=1.0, comment="good")
    feedback_create(step_uid="g-r0-s0", label="wrong", comment="bad")
    stats = check()
    assert stats["events"] == 2 and stats["feedback"] == 2
    # a compaction folds the rows and changes no count
    rows = Counter.objects.count()
    folded = counters_compact()
    assert folded["rows_before"] == rows and 0 < folded["rows_after"] < rows
    assert Counter.objects.count() == folded["rows_after"]
    check()
    assert counters_compact()["rows_after"] == folded["rows_after"]  # idempotent
    # a plain SQL write that no service made
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE pool_step SET label = 'rejected', drift = true WHERE trajectory_id IN "
            "(SELECT id FROM pool_trajectory WHERE uid LIKE 'b-%%')"
        )
        cur.execute("UPDATE pool_trajectory SET status = 'failed' WHERE uid = 'b-run'")
    check()
    # steps moved back in time: out of the last hour's window, and past the minutes kept
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE pool_step SET created_at = created_at - interval '5 hours' WHERE trajectory_id IN "
            "(SELECT id FROM pool_trajectory WHERE uid IN ('b-run', 'b-g-r0'))"
        )
    state = check()
    assert state["steps"] == 16 and live_state(["overview"])["quality"]["steps"] == 16 - 4
    assert sum(r["steps"] for r in ingest_rate()) == 16 - 4
    counters_compact()  # the fold forgets those minutes; the window's counts stay
    assert not Counter.objects.filter(
        name="minute:steps", key__lt=minute_of(timezone.now()) - MINUTES_KEPT
    ).exists()
    check()
    # a source deleted: its trajectories are set to NULL and their counts move with them
    Trajectory.objects.filter(uid__startswith="b-").update(
        source=Source.objects.create(name="other", kind="agent")
    )
    check(moved=True)
    Source.objects.filter(name="other").delete()
    assert Trajectory.objects.filter(uid__startswith="b-", source__isnull=True).count() == 6
    check(moved=True)
    # a purge of a group and lone trajectories (their steps, merges, feedback, events go)
    groups_purge(
        group_ids=[PromptGroup.objects.get(uid="g").id],
        trajectory_ids=list(Trajectory.objects.filter(uid__in=["run", "retok"]).values_list("id", flat=True)),
    )
    stats = check(moved=True)
    assert stats["steps"] == 16 - 5 - 1 and stats["trajectories"] == 12 - 4
    assert Step.objects.count() == stats["steps"]
    # and the overview page's numbers are the counters'
    assert overview()["stats"] == stats
