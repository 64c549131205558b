"""Compiled reads (pool/compiled.py): each returns exactly what the ORM's own read returns, for
every shape of values, and a build that breaks the rules is caught rather than answered wrongly."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection
from django.db.models import Q
from django.test import override_settings
from django.utils import timezone

from pool import compiled
from pool.lookups import Many
from pool.models import PolicyVersion, PromptGroup, Trajectory
from tests.concurrency import started

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def trajectories():
    """Twelve trajectories: two groups, a policy version (a bigint column) on some, a
    completion time on the odd ones, and metadata (a JSON column, converted on read)."""
    for v in (3, 7):
        PolicyVersion.objects.create(version=v)
    groups = [PromptGroup.objects.create(uid=f"cg-{i}") for i in range(2)]
    out = []
    for i in range(12):
        out.append(
            Trajectory.objects.create(
                uid=f"ct-{i:02d}",
                group=groups[i % 2] if i < 10 else None,
                policy_version_id=(3, 7, None)[i % 3],
                completed_at=T0 + dt.timedelta(minutes=i) if i % 2 else None,
                step_count=i,
                metadata={"i": i, "nested": {"even": i % 2 == 0}},
            )
        )
    return out


def _by_version(*, version, after, ids):
    """Each kind of value: a bigint foreign key (None: IS NULL), a datetime, a Many of ids;
    distinct, ordered by columns not selected (the ORM selects them too, a read drops them)."""
    return (
        Trajectory.objects.filter(Q(policy_version_id=version) | Q(completed_at__gt=after), id__any=ids)
        .order_by("-step_count", "id")
        .values_list("uid", "metadata", "completed_at")
        .distinct()
    )


# (name, version, after offset in minutes or None for "no completion filter value", ids: which)
CASES = [
    ("a-version", 3, 5, "all"),
    ("another-version", 7, 100, "all"),
    ("no-version", None, 100, "all"),
    ("some-ids", 3, 0, "first-half"),
    ("one-id", 7, 0, "one"),
    ("no-ids", 3, 0, "none"),
]


@pytest.mark.parametrize(("name", "version", "minutes", "which"), CASES, ids=[c[0] for c in CASES])
def test_a_compiled_read_returns_what_the_orm_returns(trajectories, name, version, minutes, which):
    ids = {
        "all": [t.id for t in trajectories],
        "first-half": [t.id for t in trajectories[:6]],
        "one": [trajectories[5].id],
        "none": [],
    }[which]
    values = dict(version=version, after=T0 + dt.timedelta(minutes=minutes), ids=Many(ids))
    # given the ORM's own answer
    expected = [tuple(r) for r in _by_version(**values)]
    # when the same read runs compiled, twice (the second from its template)
    first = compiled.read(_by_version, **values)
    second = compiled.read(_by_version, **values)
    # then both are the ORM's rows, value for value (the JSON column decoded, the ordering
    # column dropped)
    assert first == second == expected
    if which != "none":
        assert expected, "the case must read rows"
        assert all(isinstance(meta, dict) for _uid, meta, _at in expected)


def _by_status(*, status, at_least):
    return (
        Trajectory.objects.filter(status=status, step_count__gte=at_least).order_by("id").values_list("uid")
    )


def test_a_choices_member_is_read_as_its_value(trajectories):
    # given some trajectories completed (the others running)
    Trajectory.objects.filter(step_count__gte=6).update(status=Trajectory.Status.COMPLETED)
    for status in (Trajectory.Status.COMPLETED, Trajectory.Status.RUNNING, Trajectory.Status.COMPLETED):
        # when a read takes a TextChoices member as a value (psycopg would write an Enum by name)
        got = compiled.read(_by_status, status=status, at_least=2)
        # then it matches by the member's value, as the ORM does
        assert got == [tuple(r) for r in _by_status(status=status, at_least=2)]
        assert got, status


def test_the_shapes_are_compiled_once_each_on_postgresql(trajectories):
    if connection.vendor != "postgresql":
        pytest.skip("compiled on PostgreSQL only; elsewhere every read is built")
    compiled._templates.clear()
    ids = Many([t.id for t in trajectories])
    for version in (3, 7, 3):
        compiled.read(_by_version, version=version, after=T0, ids=ids)
    compiled.read(_by_version, version=None, after=T0, ids=ids)
    # a version and no version (IS NULL) are two texts; 3 and 7 one
    shapes = [k for k in compiled._templates if k[0] is _by_version]
    assert len(shapes) == 2
    assert all(compiled._templates[k] is not compiled._UNCOMPILABLE for k in shapes)


def _branching(*, n):
    """Breaks the rules: a parameter that also chooses the text (a slice's bound)."""
    return Trajectory.objects.filter(step_count__gte=n).order_by("id").values_list("uid")[: 3 if n > 5 else 1]


def test_a_value_that_chooses_the_text_is_caught_by_the_check(trajectories):
    if connection.vendor != "postgresql":
        pytest.skip("compiled on PostgreSQL only")
    compiled._templates.clear()
    # a stand-in (never <= 5) compiles the "> 5" branch; a later value of 1 would get 3 rows
    with override_settings(CLAW_COMPILED_CHECK=True), pytest.raises(AssertionError, match="differs"):
        compiled.read(_branching, n=1)


def _unused(*, n):
    """A value that never reaches the SQL: no template can be made."""
    return Trajectory.objects.filter(step_count__gte=2 if n else 0).order_by("id").values_list("uid")


def test_a_value_that_never_reaches_the_sql_is_always_built(trajectories):
    compiled._templates.clear()
    # when the read runs with a value that is not a parameter of its SQL
    with override_settings(CLAW_COMPILED_CHECK=False):
        got = compiled.read(_unused, n=9)
    # then it is the ORM's answer, and the shape is marked never to be compiled
    assert got == [(t.uid,) for t in trajectories[2:]]
    if connection.vendor == "postgresql":
        assert [compiled._templates[k] for k in compiled._templates if k[0] is _unused] == [
            compiled._UNCOMPILABLE
        ]


def _by_day(*, day):
    return Trajectory.objects.filter(completed_at__date=day).order_by("id").values_list("uid")


def test_a_value_of_a_type_without_stand_ins_is_always_built(trajectories):
    compiled._templates.clear()
    # when a read takes a date (no stand-in is made for one)
    got = compiled.read(_by_day, day=T0.date())
    # then it is the ORM's answer (the odd trajectories, completed that day), never compiled
    assert got == [(t.uid,) for t in trajectories if t.completed_at is not None]
    if connection.vendor == "postgresql":
        assert [compiled._templates[k] for k in compiled._templates if k[0] is _by_day] == [
            compiled._UNCOMPILABLE
        ]


def test_reads_see_rows_written_after_their_template(trajectories):
    # given a compiled read run once
    ids = Many([t.id for t in trajectories])
    before = compiled.read(_by_version, version=3, after=timezone.now(), ids=ids)
    # when a row changes
    Trajectory.objects.filter(id=trajectories[0].id).update(metadata={"changed": True}, step_count=99)
    # then the next read returns it as the ORM does
    after = compiled.read(_by_version, version=3, after=timezone.now(), ids=ids)
    assert after[0] == ("ct-00", {"changed": True}, None)
    assert after != before


def _uids(*, ids):
    return Trajectory.objects.filter(id__any=ids).order_by("id").values_list("uid")


def _counts(*, ids):
    return Trajectory.objects.filter(id__any=ids).order_by("id").values_list("step_count")


@compiled.shaped
def _first(n: int):
    def build(*, at_least):
        return Trajectory.objects.filter(step_count__gte=at_least).order_by("id").values_list("uid")[:n]

    return build


def test_each_build_and_each_shape_of_a_family_reads_its_own_statement(trajectories):
    compiled._templates.clear()
    ids = Many([t.id for t in trajectories])
    # two builds taking the same values never share a template
    assert compiled.read(_uids, ids=ids) == [(t.uid,) for t in trajectories]
    assert compiled.read(_counts, ids=ids) == [(t.step_count,) for t in trajectories]
    # the members of a shaped family (a slice bound is text) are shapes of their own
    for n in (1, 3, 1, 5):
        assert compiled.read(_first(n), at_least=2) == [(t.uid,) for t in trajectories[2 : 2 + n]]


def test_the_cache_of_templates_is_bounded(trajectories, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_TEMPLATES", 3)
    compiled._templates.clear()
    for n in range(1, 9):
        # each read is still the ORM's answer while the cache starts again
        assert compiled.read(_first(n), at_least=0) == [(t.uid,) for t in trajectories[:n]]
        assert len(compiled._templates) <= 3


@pytest.mark.django_db(transaction=True)
def test_threads_reading_through_one_cache_each_get_their_own_rows(trajectories, monkeypatch):
    # given a cache so small that threads keep emptying it under each other's reads, and
    # the rows each read must give (the ORM's, read before any thread starts)
    monkeypatch.setattr(compiled, "MAX_TEMPLATES", 2)
    compiled._templates.clear()
    ids = [t.id for t in trajectories]
    after = T0 + dt.timedelta(minutes=4)
    reads = [(_first(n), {"at_least": n}) for n in range(1, 6)] + [
        (_by_version, {"version": v, "after": after, "ids": Many(ids[:k])})
        for v in (3, 7, None)
        for k in (3, 12)
    ]
    want = [[tuple(r) for r in build(**values)] for build, values in reads]
    assert all(want) and len({repr(w) for w in want}) > 5  # reads that tell each other apart
    # when four threads (each its own connection) make every read, in orders of their own
    start = threading.Barrier(4)
    errors: list[BaseException] = []
    got: dict[int, list] = {}

    def reader(k: int) -> None:
        start.wait(timeout=30)
        order = [(i * (k + 1) + k) % len(reads) for i in range(len(reads) * 6)]
        got[k] = [(i, compiled.read(reads[i][0], **reads[i][1])) for i in order]

    threads = [started(lambda k=k: reader(k), errors) for k in range(4)]
    for t in threads:
        t.join(timeout=120)
    # then each thread read exactly the ORM's rows for each read, whatever the others did
    assert not errors, errors
    assert sorted(got) == [0, 1, 2, 3]
    for rows in got.values():
        for i, r in rows:
            assert r == want[i], reads[i]
