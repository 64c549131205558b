"""Counts kept per saved dataset (curation/services/counts.py) against the live count.

One table of datasets (specs that read every kind of column a write can change) and one
table of writes, each through the pool's own services as a door would make it. After every
write, each dataset's kept preview (what its page and ``GET /datasets/{name}/preview``
serve) must equal the live count of the same spec, number by number; and every write must
change some dataset's numbers, or the row proves nothing. A new kind of write is one row.
"""

from __future__ import annotations

import pytest

from curation.models import DatasetCount, DatasetCountChange, DatasetCountSource, DatasetCountUnit
from curation.selectors.specs import SHARES, dataset_preview
from curation.services.counts import dataset_count_read, dataset_counts_sweep, dataset_version_preview
from curation.services.datasets import dataset_create, dataset_update
from curation.services.labels import steps_label
from curation.specs import spec_parse
from pool.flags import Quality
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Step, Trajectory
from pool.services.groups import group_upsert
from pool.services.labels import steps_quality_flag_set
from pool.services.policy import policy_version_set
from pool.services.purge import groups_purge
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.service_events import feedback_create
from pool.services.trajectories import trajectory_complete
from tests.concurrency import lock_waiters, started, wait_for
from tests.curation.test_datasets import rollout
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

DATASETS = {
    "default": {},
    "fresh": {"filters": {"max_staleness": 1}},
    # Freshness against a named policy's current version (read by another query than the
    # default policy's).
    "fresh-actor": {"filters": {"max_staleness": 1, "policy": "actor"}},
    "clean": {"filters": {"exclude_flags": ["truncated", "policy_mismatch"], "exclude_tags": ["bad"]}},
    "gold": {"filters": {"tags": ["gold"]}},
    "accepted": {"filters": {"labels": ["accepted"]}},
    "rated": {"filters": {"feedback": "with", "min_rating": 4}},
    "high": {"filters": {"reward_min": 0.5}},
    "masked": {"grouping": {"short_groups": "mask"}},
    "two": {"grouping": {"min_rollouts": 2}},
}


def ids(prefix: str) -> list[int]:
    return list(Step.objects.filter(uid__startswith=prefix).values_list("id", flat=True))


def gapped() -> None:
    """A trajectory ended by its last step (2) while step 1 is still on its way."""
    steps_ingest(
        steps=[
            step_in("gap", 0, prompt=[1, 2, 3, 6], response=[7, 8], reward=1.0),
            step_in("gap", 2, prompt=[1, 2, 3, 6, 7, 8, 9, 9], response=[7, 8], reward=1.0, is_last=True),
        ]
    )


def late_step() -> None:
    """Its missing step, stored after the trajectory ended."""
    steps_ingest(steps=[step_in("gap", 1, prompt=[1, 2, 3, 6, 7, 8], response=[9, 9], reward=1.0)])


WRITES = [
    (
        "a group of two completes",
        lambda: [rollout(t, group="g1", seed=s, version=1) for t, s in (("a", 1), ("b", 2))],
    ),
    (
        "trajectories without a group",
        lambda: (rollout("solo", seed=5, version=1), rollout("one", seed=9, steps=1, version=1)),
    ),
    ("a group's first rollout (it waits)", lambda: rollout("c", group="g2", seed=3, version=1)),
    (
        "a rollout ended by its completion",
        lambda: (rollout("d", group="g2", seed=4, reward=None, version=1),),
    ),
    ("its reward, applied", lambda: rewards_apply(rewards=[RewardIn(reward=0.75, trajectory_uid="d")])),
    ("a step's reward changed", lambda: rewards_apply(rewards=[RewardIn(reward=0.0, step_uid="a:0")])),
    (
        "a lone trajectory's reward changed",
        lambda: rewards_apply(rewards=[RewardIn(reward=0.25, step_uid="one:0")]),
    ),
    ("a label", lambda: steps_label(step_ids=ids("solo:"), label="accepted", actor="op")),
    ("a rejection", lambda: steps_label(step_ids=ids("b:"), label="rejected", actor="op")),
    ("a tag", lambda: steps_label(step_ids=ids("c:") + ids("d:"), tags_add=["gold"], actor="op")),
    ("a tag that excludes", lambda: steps_label(step_ids=ids("solo:"), tags_add=["bad"], actor="op")),
    ("that tag removed", lambda: steps_label(step_ids=ids("solo:"), tags_remove=["bad"], actor="op")),
    ("feedback on a trajectory", lambda: feedback_create(trajectory_uid="solo", rating=5)),
    ("feedback on a step", lambda: feedback_create(step_uid="one:0", rating=4.5)),
    ("a quality flag", lambda: steps_quality_flag_set(step_ids=ids("d:"), flag=int(Quality.POLICY_MISMATCH))),
    ("a group's expected rollouts raised", lambda: group_upsert(uid="g2", expected_rollouts=3)),
    ("a trajectory with a gap", gapped),
    ("its missing step, late", late_step),
    ("a newer policy version (freshness)", lambda: policy_version_set(version=3)),
    ("a newer version of the named policy", lambda: policy_version_set(version=3, policy="actor")),
    (
        "a group on the new version",
        lambda: [rollout(t, group="g3", seed=s, version=3) for t, s in (("e", 6), ("f", 7))],
    ),
    (
        "an explicit completion with a reward",
        lambda: (rollout("h", seed=8, reward=None, version=3), trajectory_complete(uid="h", reward=1.0)),
    ),
    (
        "an ended trajectory's reward changed by its completion",
        lambda: trajectory_complete(uid="h", reward=0.0),
    ),
    ("a purge", lambda: groups_purge(group_ids=[PromptGroup.objects.get(uid="g2").id])),
    (
        "a purge of a lone trajectory",
        lambda: groups_purge(group_ids=[], trajectory_ids=[Trajectory.objects.get(uid="solo").id]),
    ),
]


def live(spec: dict) -> dict:
    return dataset_preview(spec_parse(spec))


def kept(name: str) -> dict | None:
    from curation.models import Dataset

    return dataset_count_read(Dataset.objects.select_related("current").get(name=name).current)


def source_totals(count: DatasetCount) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """A count's kept totals per source (``DatasetCountSource``, those not all zero) and the
    sums of the shares of its units of one source each, per source."""
    want: dict[int, list[int]] = {}
    for src, *share in DatasetCountUnit.objects.filter(
        count=count, one_source=True, source_id__isnull=False
    ).values_list("source_id", *SHARES):
        want[src] = [x + y for x, y in zip(want.get(src, [0] * len(SHARES)), share, strict=True)]
    got = {
        src: list(share)
        for src, *share in DatasetCountSource.objects.filter(count=count).values_list("source_id", *SHARES)
        if any(share)
    }
    return got, want


def test_every_write_leaves_each_kept_count_equal_to_the_live_one():
    policy_version_set(version=1)
    policy_version_set(version=1, policy="actor")
    group_upsert(uid="g1", expected_rollouts=2)
    group_upsert(uid="g2", expected_rollouts=2)
    group_upsert(uid="g3", expected_rollouts=2)
    for name, spec in DATASETS.items():
        dataset_create(name=name, spec=spec)
    assert dataset_counts_sweep() == len(DATASETS)  # built: an empty pool
    before = {name: live(spec) for name, spec in DATASETS.items()}
    for what, write in WRITES:
        write()
        now = {}
        for name, spec in DATASETS.items():
            got, want = kept(name), live(spec)
            assert got is not None, (what, name)
            assert got == want, (what, name)
            now[name] = want
        assert now != before, f"{what}: changed no dataset's numbers (the row checks nothing)"
        before = now
    # Every unit's share was folded: nothing waits, and the shares add up to the totals.
    assert not DatasetCountChange.objects.exists()
    for count in DatasetCount.objects.all():
        for field in ("steps", "trajectories", "groups", "waiting_units", "response_tokens"):
            total = sum(DatasetCountUnit.objects.filter(count=count).values_list(field, flat=True))
            assert getattr(count, field) == total, field


def test_a_count_follows_its_dataset_current_version_and_readers_of_some_sources_count_live():
    policy_version_set(version=1)
    rollout("a", seed=1, version=1)
    rollout("b", seed=2, version=1, finish_reason="length")
    ds = dataset_create(name="d", spec={})
    dataset_counts_sweep()
    assert kept("d") == live({}) and kept("d")["steps"] == 4
    dataset_update(name="d", spec={"filters": {"exclude_flags": ["truncated"]}})
    dataset_counts_sweep()
    ds.refresh_from_db()
    assert DatasetCount.objects.get().version_id == ds.current_id  # the older version's went
    assert kept("d") == live({"filters": {"exclude_flags": ["truncated"]}}) and kept("d")["steps"] == 2
    # A spec of another kind keeps no count; a restricted reader counts its sources live.
    for spec in ({"filters": {"readiness": "any"}}, {"grouping": {"keep_groups_whole": False}}):
        dataset_update(name="d", spec=spec)
        dataset_counts_sweep()
        ds.refresh_from_db()
        assert not DatasetCount.objects.exists()
        assert kept("d") is None
        assert dataset_version_preview(ds.current) == live(spec)
    assert dataset_version_preview(ds.current, frozenset())["steps"] == 0


# Readers restricted to some sources, against the same kept counts: every write through a
# source's door (or none), a group's rollouts of one source, of two, and one whose second
# source joins late. A reader's kept preview must equal its live count, number by number,
# without falling back to the live count (``_restricted_read`` answers).
SOURCED_WRITES = [
    (
        "a group of one source",
        lambda a, b: [
            rollout(t, group="s1", seed=s, version=1, source_id=a) for t, s in (("a", 1), ("b", 2))
        ],
    ),
    (
        "a group of two sources",
        lambda a, b: [
            rollout(t, group="s2", seed=s, version=1, source_id=src)
            for t, s, src in (("c", 3, a), ("d", 4, b))
        ],
    ),
    ("a lone trajectory of the second source", lambda a, b: rollout("e", seed=5, version=1, source_id=b)),
    ("a lone trajectory without a source", lambda a, b: rollout("n", seed=6, version=1)),
    (
        "a reward in the group of two",
        lambda a, b: rewards_apply(rewards=[RewardIn(reward=0.0, step_uid="d:0")]),
    ),
    (
        "a group's first rollout, of one source (it waits)",
        lambda a, b: rollout("f", group="s3", seed=7, version=1, source_id=a),
    ),
    (
        "its second rollout, of the other source",
        lambda a, b: rollout("g", group="s3", seed=8, version=1, source_id=b),
    ),
    ("a newer policy version (freshness)", lambda a, b: policy_version_set(version=3)),
]
SOURCED_DATASETS = {name: DATASETS[name] for name in ("default", "fresh", "two", "high")}


def test_readers_of_some_sources_read_the_kept_count_of_their_units():
    from curation.models import Dataset
    from curation.services.counts import _restricted_read
    from pool.models import Source

    a, b = (Source.objects.create(name=f"counts-{n}").id for n in "ab")
    readers = {
        "a": frozenset({a}),
        "b": frozenset({b}),
        "both": frozenset({a, b}),
        "none": frozenset(),
        "all": None,
    }
    policy_version_set(version=1)
    for g in ("s1", "s2", "s3"):
        group_upsert(uid=g, expected_rollouts=2)
    for name, spec in SOURCED_DATASETS.items():
        dataset_create(name=name, spec=spec)
    dataset_counts_sweep()
    before = None
    for what, write in SOURCED_WRITES:
        write(a, b)
        now = {}
        for name, spec in SOURCED_DATASETS.items():
            version = Dataset.objects.select_related("current").get(name=name).current
            for reader, sources in readers.items():
                want = dataset_preview(spec_parse(spec), sources)
                got = dataset_count_read(version) if sources is None else _restricted_read(version, sources)
                assert got is not None, (what, name, reader)
                assert got == want, (what, name, reader)
                assert dataset_version_preview(version, sources) == want, (what, name, reader)
                now[(name, reader)] = want
        assert now != before, f"{what}: changed no reader's numbers (the row checks nothing)"
        before = now
    # the units' sources as kept: one source, several, none
    units = dict(
        DatasetCountUnit.objects.filter(count__version__dataset__name="default").values_list(
            "unit", "source_id"
        )
    )
    one = dict(
        DatasetCountUnit.objects.filter(count__version__dataset__name="default").values_list(
            "unit", "one_source"
        )
    )
    s1, s2, s3 = (PromptGroup.objects.get(uid=g).id for g in ("s1", "s2", "s3"))
    assert (units[s1], one[s1]) == (a, True)
    assert not one[s2] and not one[s3]
    n = -Trajectory.objects.get(uid="n").id
    assert (units[n], one[n]) == (None, True)
    # and each source's totals are the sum of its units' shares
    for count in DatasetCount.objects.all():
        got, want = source_totals(count)
        assert got == {k: v for k, v in want.items() if any(v)}


def test_a_restricted_reader_with_too_many_units_of_several_sources_counts_live(monkeypatch):
    from curation.models import Dataset
    from curation.services import counts
    from pool.models import Source

    a, b = (Source.objects.create(name=f"counts-live-{n}").id for n in "ab")
    group_upsert(uid="m", expected_rollouts=2)
    for t, seed, src in (("x", 1, a), ("y", 2, b)):
        rollout(t, group="m", seed=seed, source_id=src)
    dataset_create(name="d", spec={})
    dataset_counts_sweep()
    version = Dataset.objects.select_related("current").get(name="d").current
    # the group counts only the reader's rollout: one of the two it needs, so it is dropped
    live = dataset_preview(spec_parse({}), frozenset({a}))
    assert counts._restricted_read(version, frozenset({a})) == live and live["dropped_groups"] == 1
    monkeypatch.setattr(counts, "MAX_LIVE_UNITS", 0)
    assert counts._restricted_read(version, frozenset({a})) is None
    assert dataset_version_preview(version, frozenset({a})) == dataset_preview(spec_parse({}), frozenset({a}))


def test_a_new_current_version_is_counted_by_a_task_after_its_commit(
    django_capture_on_commit_callbacks, monkeypatch
):
    from curation import tasks
    from curation.services.counts import dataset_count_build

    sent: list[tuple] = []  # tests are not eager: the task's calls, run below
    monkeypatch.setattr(tasks.dataset_count_build, "apply_async", lambda args, **kw: sent.append(tuple(args)))
    rollout("a", seed=1)
    with django_capture_on_commit_callbacks(execute=True):
        ds = dataset_create(name="d", spec={})
    assert sent == [(ds.current_id,)]
    dataset_count_build(*sent[0])
    count = DatasetCount.objects.get()
    assert count.built and count.steps == 2
    assert kept("d") == live({})
    with django_capture_on_commit_callbacks(execute=True):
        ds = dataset_update(name="d", spec={"filters": {"reward_min": 2}})
    assert sent[1:] == [(ds.current_id,)]
    dataset_count_build(*sent[0])  # the older version's task, late: no longer current, nothing
    assert DatasetCount.objects.get().version_id == sent[0][0]
    dataset_count_build(*sent[1])
    assert list(DatasetCount.objects.values_list("version_id", flat=True)) == [ds.current_id]
    assert kept("d") == live({"filters": {"reward_min": 2}}) and kept("d")["steps"] == 0


def test_a_policy_version_counts_again_only_the_units_it_makes_stale():
    policy_version_set(version=1)
    for i in range(6):
        rollout(f"old{i}", seed=i, version=1)
    policy_version_set(version=2)
    for i in range(3):
        rollout(f"new{i}", seed=10 + i, version=2)
    dataset_create(name="f", spec={"filters": {"max_staleness": 1}})
    dataset_counts_sweep()
    assert kept("f")["trajectories"] == 9
    policy_version_set(version=3)  # version 1 is now two behind: the six old units change
    count = DatasetCount.objects.get()
    stale = set(
        DatasetCountUnit.objects.filter(count=count, recount_at__lte=3).values_list("unit", flat=True)
    )
    assert stale == {
        -t for t in Trajectory.objects.filter(uid__startswith="old").values_list("id", flat=True)
    }
    assert kept("f") == live({"filters": {"max_staleness": 1}}) and kept("f")["trajectories"] == 3


@pytest.mark.django_db(transaction=True)
def test_a_count_created_while_a_write_is_in_flight_counts_that_write():
    """A write marks its units before a count exists and commits after the count was
    created: the creation waits for it, so the first count sees its rows."""
    import threading

    from django.db import connection, transaction

    from curation.models import Dataset
    from curation.services.counts import dataset_count_build

    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL (SQLite serialises them)")
    marked, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        with transaction.atomic():
            rollout("a", seed=1)  # its end marks its unit (no count exists yet)
            marked.set()
            assert commit.wait(timeout=60)

    w = started(writer, errors)
    assert marked.wait(timeout=60)
    version_id = dataset_create(name="d", spec={}).current_id
    b = started(lambda: dataset_count_build(version_id), errors)
    # The builder waits on the writer's lock on the change table (a condition, with a deadline).
    wait_for(
        lambda: lock_waiters("curation_datasetcountchange") or not b.is_alive(),
        "the count's creation to wait for the write",
        deadline_s=60,
    )
    assert b.is_alive(), "the count was built without waiting for the write"
    commit.set()
    w.join(timeout=60)
    b.join(timeout=60)
    assert errors == []
    assert kept("d") == live({}) and kept("d")["steps"] == 2
    assert Dataset.objects.get(name="d").current.count.steps == 2


@pytest.mark.django_db(transaction=True)
def test_a_read_while_a_fold_is_under_way_waits_for_it_and_counts_every_committed_write():
    """A fold holds its count (the beat's sweep, or another read); a write commits meanwhile;
    a read then waits for that fold and folds the write: it never answers the totals from
    before (the production end-to-end test saw 52 of 56 ready steps that way)."""
    import threading

    from django.db import connection, transaction

    from curation.models import DatasetCount
    from curation.services.counts import dataset_count_build

    if connection.vendor != "postgresql":
        pytest.skip("concurrent folds need PostgreSQL (SQLite serialises them)")
    version_id = dataset_create(name="d", spec={}).current_id
    dataset_count_build(version_id)
    held, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    read: list[dict | None] = []

    def fold_under_way() -> None:
        with transaction.atomic():
            DatasetCount.objects.select_for_update(no_key=True).get(version_id=version_id)  # as a fold
            held.set()
            assert release.wait(timeout=60)

    f = started(fold_under_way, errors)
    assert held.wait(timeout=60)
    rollout("a", seed=1)  # committed: its end marked its unit
    r = started(lambda: read.append(kept("d")), errors)
    # The reader waits on the fold's lock (a condition, with a deadline); a reader that
    # answered without waiting is caught by the numbers below.
    wait_for(lambda: lock_waiters() or not r.is_alive(), "the read to wait or answer", deadline_s=60)
    release.set()
    f.join(timeout=60)
    r.join(timeout=60)
    assert errors == []
    assert read == [live({})] and read[0]["steps"] == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_of_two_sources_and_folds_keep_each_sources_totals():
    """Two sources write at once (rollouts of their own, and groups of one rollout from
    each) while a third thread keeps folding the count: afterwards each source's kept totals
    (``DatasetCountSource``) are the sums of its units' shares, and every reader's kept
    preview (one source, both, every source) equals the live count of its scope."""
    from django.db import connection

    from curation.models import Dataset
    from curation.services import counts
    from pool.models import Source

    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers and folds need PostgreSQL (SQLite serialises them)")
    a, b = (Source.objects.create(name=f"counts-race-{n}").id for n in "ab")
    for i in range(4):
        group_upsert(uid=f"mix{i}", expected_rollouts=2)
    version_id = dataset_create(name="d", spec={}).current_id
    counts.dataset_count_build(version_id)
    errors: list[BaseException] = []
    writing = [True, True]

    def writer(n: int, src: int, name: str) -> None:
        try:
            for i in range(4):
                rollout(f"{name}{i}", seed=10 * n + i, source_id=src)  # its own
                rollout(f"{name}-mix{i}", group=f"mix{i}", seed=20 * n + i, source_id=src)  # a shared group
        finally:
            writing[n] = False

    def folder() -> None:
        while any(writing):
            kept("d")  # a fold of whatever committed, as every read does

    threads = [started(lambda: writer(0, a, "a"), errors), started(lambda: writer(1, b, "b"), errors)]
    threads.append(started(folder, errors))
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and not any(t.is_alive() for t in threads)
    # then each source's kept totals are the sums of its units' shares
    version = Dataset.objects.select_related("current").get(name="d").current
    kept("d")  # the last writes folded
    got, want = source_totals(DatasetCount.objects.get(version_id=version_id))
    assert set(want) == {a, b}  # 4 rollouts of its own each, every mixed group of two sources
    assert got == want
    count = DatasetCount.objects.get(version_id=version_id)
    assert DatasetCountUnit.objects.filter(count=count, one_source=False).count() == 4
    # and each reader's kept preview is the live count of its scope, number by number
    spec = spec_parse({})
    for sources in (frozenset({a}), frozenset({b}), frozenset({a, b})):
        read = counts._restricted_read(version, sources)
        assert read is not None and read == dataset_preview(spec, sources), sorted(sources)
    assert kept("d") == dataset_preview(spec) and kept("d")["trajectories"] == 16
