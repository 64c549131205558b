"""Pool models: migrations in sync, database constraints and the named indexes."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from pool.models import (
    Event,
    Feedback,
    MergeResult,
    PolicyVersion,
    PromptGroup,
    RewardEvent,
    Source,
    Step,
    Trajectory,
)
from pool.models.steps import CURATION_COLUMNS
from tests.pool.factories import trajectory_with_steps

pytestmark = pytest.mark.django_db


def test_migrations_match_the_models():
    # given the models as they are now
    out = io.StringIO()
    # when makemigrations checks for changes
    try:
        call_command("makemigrations", "pool", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:  # pragma: no cover - the failure path
        pytest.fail(f"models changed without a migration:\n{out.getvalue()}")
    # then there are none to make


@pytest.mark.parametrize("model", [Step, Trajectory, PromptGroup, RewardEvent, Event, Feedback, MergeResult])
def test_every_named_index_exists_in_the_database(model):
    # given the indexes the model declares (each named after the query it serves)
    declared = {idx.name for idx in model._meta.indexes}
    assert declared and all(declared)
    # when the database's own catalogue is read
    with connection.cursor() as cur:
        actual = connection.introspection.get_constraints(cur, model._meta.db_table)
    # then every one of them is there
    assert declared <= set(actual), declared - set(actual)


def test_step_indexes_cover_the_documented_queries():
    # the step queries the issue names: trajectory + step_index, sequence hash, reward status,
    # policy version, created_at (prompt group goes through the trajectory's group index)
    with connection.cursor() as cur:
        cons = connection.introspection.get_constraints(cur, Step._meta.db_table)
    # (an index's key columns, without the columns a covering index also carries)
    by_columns = {tuple(_key_columns(name, c)) for name, c in cons.items() if c["index"] or c["unique"]}
    for cols in [
        ("trajectory_id", "step_index"),
        ("seq_hash",),
        ("policy_version_id", "created_at"),
        ("created_at",),
        ("uid",),
    ]:
        assert cols in by_columns, cols
    with connection.cursor() as cur:
        traj = connection.introspection.get_constraints(cur, Trajectory._meta.db_table)
    assert ("group_id", "status") in {tuple(c["columns"]) for c in traj.values() if c["index"]}


def _key_columns(name: str, constraint: dict) -> list[str]:
    """The key columns of an index of the step table: Django's introspection lists a
    PostgreSQL index's INCLUDE columns after its keys."""
    if connection.vendor != "postgresql":
        return constraint["columns"]
    with connection.cursor() as cur:
        cur.execute("SELECT indnkeyatts FROM pg_index WHERE indexrelid = %s::regclass", [name])
        (keys,) = cur.fetchone()
    return constraint["columns"][:keys]


def test_the_step_order_key_is_the_narrow_index_curation_reads():
    # given the step table's indexes, as the database has them
    with connection.cursor() as cur:
        cons = connection.introspection.get_constraints(cur, Step._meta.db_table)
    # then the step order is one unique key, (trajectory, step_index)
    order = cons["step_traj_index_uniq"]
    assert order["unique"] and _key_columns("step_traj_index_uniq", order) == ["trajectory_id", "step_index"]
    # and on PostgreSQL it also carries every column curation reads per step (previews,
    # admission and the overview scan it alone, never the wide rows), in one index: no
    # second index of the trajectory's steps is written with each row
    covered = [Step._meta.get_field(f).column for f in CURATION_COLUMNS]
    if connection.vendor == "postgresql":
        assert order["columns"][2:] == covered
        # and it is the only index of every row that leads with the trajectory (a partial
        # one, as step_drift, holds the few rows of its condition only)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
                "WHERE i.indrelid = %s::regclass AND a.attname = 'trajectory_id' AND i.indpred IS NULL",
                [Step._meta.db_table],
            )
            assert [r[0] for r in cur.fetchall()] == ["step_traj_index_uniq"]
    else:  # SQLite: no covering indexes, the plain unique key
        assert order["columns"] == ["trajectory_id", "step_index"]
    assert "step_curation" not in cons


def _violates(fn) -> bool:
    try:
        with transaction.atomic():
            fn()
    except IntegrityError:
        return True
    return False


def test_step_constraints():
    # given two stored steps of one trajectory
    s0, s1 = trajectory_with_steps("cons", 2)
    # then the database refuses inconsistent rows
    assert _violates(lambda: Step.objects.filter(id=s1.id).update(step_index=0)), (
        "trajectory+step_index unique"
    )
    assert _violates(lambda: Step.objects.filter(id=s0.id).update(reward_status="final", reward=None)), (
        "final needs reward"
    )
    assert _violates(lambda: Step.objects.filter(id=s0.id).update(prompt_len=s0.seq_len + 1)), (
        "prompt within seq"
    )
    assert _violates(lambda: Step.objects.filter(id=s0.id).update(seq_parent=None, seq_shared=5)), (
        "shared needs parent"
    )
    assert _violates(lambda: Step.objects.filter(id=s1.id).update(uid=s0.uid)), "uid unique"
    # and a final step with a reward is fine
    assert not _violates(lambda: Step.objects.filter(id=s0.id).update(reward_status="final", reward=1.0))


def test_at_most_one_current_policy_version():
    PolicyVersion.objects.create(version=1, is_current=True)
    PolicyVersion.objects.create(version=2, is_current=False)
    assert _violates(lambda: PolicyVersion.objects.create(version=3, is_current=True))
    assert _violates(lambda: PolicyVersion.objects.filter(version=2).update(is_current=True))


def test_feedback_and_reward_events_need_a_target():
    assert _violates(lambda: Feedback.objects.create(rating=1.0))
    assert _violates(lambda: RewardEvent.objects.create(new_reward=1.0, reward_source="env"))


def test_step_in_use_as_a_parent_cannot_be_deleted_alone():
    # given a step whose successor is stored as a delta against it
    s0, s1 = trajectory_with_steps("parent", 2)
    assert Step.objects.get(id=s1.id).seq_parent_id == s0.id
    # then deleting the parent alone is refused (it would make the child unreadable)
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        s0.delete()


def test_small_model_properties():
    s0 = trajectory_with_steps("props", 1, prompt_len=40, turn_len=20)[0]
    step = Step.objects.get(id=s0.id)
    assert (step.prompt_len, step.response_len, step.seq_len) == (40, 20, 60)
    assert str(step) == "props:0" and str(step.trajectory) == "props"
    assert str(PolicyVersion(version=3, is_current=True)) == "v3 (current)"
    assert str(Source(name="agent")) == "agent"
    merge = MergeResult(total_tokens=100, unique_tokens=25)
    assert merge.ratio == 0.25 and MergeResult().ratio == 1.0
