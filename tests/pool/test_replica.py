"""pool/replica.py: reads from a PostgreSQL streaming replica, chosen per read path.

Without DATABASE_REPLICA_URL nothing changes (every database, SQLite included). On
PostgreSQL the module starts a real replica of the test server (tests/replica.py:
pg_basebackup, a second cluster on a free port) and checks, path by path, which database
served each read (READ_PATHS), that a page read from the replica shows its lag (not an
error) and the replica's data, and that a snapshot reads from the replica only once it has
replayed the snapshot's frozen ids.
"""

from __future__ import annotations

import copy
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from pool.ingest.pipeline import steps_ingest
from pool.models import Scope, Step
from pool.replica import (
    REPLICA,
    ReplicaRouter,
    read_alias,
    replica_caught_up,
    replica_lag,
    replica_reads,
)
from pool.services.api_keys import api_key_create
from pool.services.groups import group_upsert
from tests.live import ROOT

from .factories import random_ids, step_in

PG = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))


# --- without a replica: no effect --------------------------------------------------------------
@pytest.mark.django_db
def test_without_a_replica_every_read_stays_on_the_default_database(client, operator):
    # given no DATABASE_REPLICA_URL (the suite's settings)
    assert REPLICA not in django_settings.DATABASES
    # when a read path asks for the replica
    with replica_reads():
        alias, routed = read_alias(), ReplicaRouter().db_for_read(Step)
    # then it reads from the default database, and no page says it read a replica
    assert (alias, routed, replica_lag(), replica_caught_up(timeout=0)) == ("default", None, None, False)
    client.force_login(operator)
    page = client.get("/trajectories/")
    assert page.status_code == 200 and b"replica-status" not in page.content


def test_a_replica_needs_postgresql_on_both_sides():
    # given a replica URL next to SQLite (no DATABASE_URL)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DATABASE_REPLICA_URL"] = "postgres://postgres@127.0.0.1:5433/claw"
    # when the settings are read, then the process stops, naming the variable
    out = subprocess.run(
        [sys.executable, "-c", "import claw_site.settings.base"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "DATABASE_REPLICA_URL must name a PostgreSQL replica" in out.stderr


# --- a real replica ----------------------------------------------------------------------------
pg_only = pytest.mark.skipif(not PG, reason="a streaming replica needs PostgreSQL (CI's PostgreSQL pass)")


@pytest.fixture(scope="module")
def replica_port(django_db_setup, django_db_blocker):
    """A streaming replica of the test server (the test database included), reachable as
    the ``replica`` alias for this module's tests, as DATABASE_REPLICA_URL would configure
    it (a mirror of the test database: never created, flushed or migrated)."""
    from tests.replica import replica_of

    with replica_of(os.environ["DATABASE_URL"]) as port:
        alias = copy.deepcopy(connections["default"].settings_dict)
        alias.update(PORT=port, TEST={"MIRROR": "default"})
        alias["OPTIONS"] = {k: v for k, v in alias.get("OPTIONS", {}).items() if k != "pool"}
        django_settings.DATABASES[REPLICA] = alias  # connections.settings is this dict
        try:
            with django_db_blocker.unblock():
                assert wait_until(lambda: _standby_ready(), 60), "the replica never accepted connections"
            yield port
        finally:
            connections[REPLICA].close()
            del connections[REPLICA]
            del django_settings.DATABASES[REPLICA]


def _standby_ready() -> bool:
    from django.db import OperationalError

    try:
        with connections[REPLICA].cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            return bool(cur.fetchone()[0])
    except OperationalError:
        connections[REPLICA].close()
        return False


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def caught_up() -> None:
    assert replica_caught_up(timeout=60), "the replica did not replay the primary's writes in 60 s"


@pytest.fixture
def paused(replica_port):
    """Pause the replica's replay (it keeps receiving WAL) for the test; resumed after."""
    with connections[REPLICA].cursor() as cur:
        cur.execute("SELECT pg_wal_replay_pause()")
    try:
        yield
    finally:
        with connections[REPLICA].cursor() as cur:
            cur.execute("SELECT pg_wal_replay_resume()")


def ready_group(uid: str, *, rollouts: int = 2, turns: int = 2, seed: int = 0) -> list[str]:
    """A complete group of ``rollouts`` rewarded rollouts of ``turns`` steps: ready to serve."""
    import random

    rng = random.Random(seed)
    group_upsert(uid=uid, expected_rollouts=rollouts)
    steps = []
    for r in range(rollouts):
        for t in range(turns):
            steps.append(
                step_in(
                    f"{uid}-r{r}",
                    t,
                    prompt=random_ids(rng, 24),
                    response=random_ids(rng, 8),
                    group=uid,
                    reward=float(r),
                    is_last=t == turns - 1,
                )
            )
    steps_ingest(steps=steps)
    return [s.uid for s in steps]


@pytest.fixture
def pool(replica_port, operator):
    """Two ready groups, a dataset, an event, keys and a leased batch, committed and
    replayed on the replica."""
    from curation.services.datasets import dataset_create
    from pool.services.service_events import EventIn, event_record

    ready_group("rg-a", seed=1)
    ready_group("rg-b", seed=2)
    dataset_create(name="rep")
    event_record(events=[EventIn(type="note", payload={"x": 1})])
    admin = api_key_create(name="rep-admin", scopes=[Scope.ADMIN])[1]
    trainer = api_key_create(name="rep-trainer", scopes=[Scope.CONSUME])[1]
    lease = Client(HTTP_AUTHORIZATION=f"Bearer {trainer}").post(
        "/api/v1/consumers/t/pull", {"dataset": "rep", "batch_size": 1}, content_type="application/json"
    )
    assert lease.status_code == 200 and lease.json()["lease_id"], lease.content
    caught_up()
    page = Client()
    page.force_login(operator)
    return {
        "page": page,
        "api": Client(HTTP_AUTHORIZATION=f"Bearer {admin}"),
        "trainer": Client(HTTP_AUTHORIZATION=f"Bearer {trainer}"),
        "lease": lease.json()["lease_id"],
        "step": Step.objects.get(uid="rg-a-r0:0"),
    }


def _get(who: str, url: str) -> Callable[[dict], Any]:
    return lambda p: p[who].get(url.format(**p, step_id=p["step"].id))


def _post(who: str, url: str, body: dict | None = None) -> Callable[[dict], Any]:
    return lambda p: p[who].post(url.format(**p), body or {}, content_type="application/json")


# Every read path with the database it must read from: "replica" (pages, the admin's lists,
# previews, the list and stats selectors) or "default" (writes, leases and pulls, what must
# see a write already made: one object by id, a consumer's state, a lease's replay, what
# merges or claims during the request). docs/operations.md has the same table.
READ_PATHS: list[tuple[str, Callable[[dict], Any], str]] = [
    # pages
    ("page: overview", _get("page", "/"), "replica"),
    ("page: trajectories", _get("page", "/trajectories/"), "replica"),
    ("page: a trajectory", _get("page", "/trajectories/rg-a-r0/"), "replica"),
    ("page: steps", _get("page", "/steps/"), "replica"),
    ("page: a step", _get("page", "/steps/{step_id}/"), "replica"),
    ("page: a step's tokens", _get("page", "/steps/{step_id}/tokens"), "replica"),
    ("page: optimization", _get("page", "/optimization/"), "replica"),
    ("page: consumption", _get("page", "/consumption/"), "replica"),
    ("page: curation", _get("page", "/curation/"), "replica"),
    ("page: a dataset", _get("page", "/curation/datasets/rep/"), "replica"),
    ("page: preview", _post("page", "/curation/preview", {"filters": {}}), "replica"),
    ("page: tasks", _get("page", "/tasks/"), "replica"),
    ("page: review (claims)", _get("page", "/review/"), "default"),
    ("page: a prefix tree (merged on demand)", _get("page", "/optimization/groups/rg-a/"), "default"),
    ("page: a lease's replay", _get("page", "/consumption/leases/{lease}/batch"), "default"),
    # the admin
    ("admin: step list", _get("page", "/admin/pool/step/?readiness=ready"), "replica"),
    ("admin: trajectory list", _get("page", "/admin/pool/trajectory/"), "replica"),
    ("admin: group list", _get("page", "/admin/pool/promptgroup/"), "replica"),
    ("admin: event list", _get("page", "/admin/pool/event/"), "replica"),
    ("admin: a step", _get("page", "/admin/pool/step/{step_id}/change/"), "default"),
    ("admin: API keys", _get("page", "/admin/pool/apikey/"), "default"),
    # the API
    ("api: steps", _get("api", "/api/v1/steps"), "replica"),
    ("api: trajectories", _get("api", "/api/v1/trajectories"), "replica"),
    ("api: groups", _get("api", "/api/v1/groups"), "replica"),
    ("api: events", _get("api", "/api/v1/events"), "replica"),
    ("api: feedback", _get("api", "/api/v1/feedback"), "replica"),
    ("api: stats", _get("api", "/api/v1/stats"), "replica"),
    ("api: tasks", _get("api", "/api/v1/tasks"), "replica"),
    ("api: sampler records", _get("api", "/api/v1/task-sampler/records"), "replica"),
    ("api: datasets", _get("api", "/api/v1/datasets"), "replica"),
    ("api: a dataset's preview", _get("api", "/api/v1/datasets/rep/preview"), "replica"),
    ("api: a spec's preview", _post("api", "/api/v1/datasets/preview", {"filters": {}}), "replica"),
    ("api: a step", _get("api", "/api/v1/steps/rg-a-r0:0"), "default"),
    ("api: a trajectory", _get("api", "/api/v1/trajectories/rg-a-r0"), "default"),
    ("api: a group", _get("api", "/api/v1/groups/rg-a"), "default"),
    ("api: policy versions", _get("api", "/api/v1/policy-versions"), "default"),
    ("api: a dataset", _get("api", "/api/v1/datasets/rep"), "default"),
    ("api: a consumer", _get("trainer", "/api/v1/consumers/t"), "default"),
    ("api: a lease's replay", _get("trainer", "/api/v1/leases/{lease}/batch"), "default"),
    (
        "api: pull",
        _post("trainer", "/api/v1/consumers/t/pull", {"dataset": "rep", "batch_size": 1}),
        "default",
    ),
]
# Tables a replica read path reads on the primary before its handler runs: the session and
# the user (a login is a write), the API key and its source (a key just made must work).
BEFORE_THE_HANDLER = ("django_session", "auth_user", "pool_apikey", "pool_source")
# ... and what a path reads there on purpose: the dataset a preview previews (it may be new).
ALSO_ON_PRIMARY = {"api: a dataset's preview": ("curation_dataset", "curation_datasetversion")}


def _tables(sql: str) -> set[str]:
    return set(re.findall(r'(?:FROM|JOIN)\s+"?(\w+)"?', sql))


@pg_only
@pytest.mark.django_db(transaction=True, databases=["default", REPLICA])
def test_each_read_path_reads_from_its_database(pool):
    wrong = []
    for name, call, expected in READ_PATHS:
        # when the path is requested
        with (
            CaptureQueriesContext(connections["default"]) as primary,
            CaptureQueriesContext(connections[REPLICA]) as replica,
        ):
            response = call(pool)
        assert response.status_code == 200, (name, response.status_code, response.content[:300])
        # then its reads went to the database of the table
        on_replica = [q["sql"] for q in replica.captured_queries]
        allowed = BEFORE_THE_HANDLER + ALSO_ON_PRIMARY.get(name, ())
        data_on_primary = [
            q["sql"]
            for q in primary.captured_queries
            if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
            and not _tables(q["sql"]) <= set(allowed)
        ]
        if expected == "replica" and (not on_replica or data_on_primary):
            wrong.append((name, "read on the primary", [s[:200] for s in data_on_primary][:3]))
        if expected == "default" and on_replica:
            wrong.append((name, "read on the replica", [s[:200] for s in on_replica][:3]))
    assert wrong == []


@pg_only
@pytest.mark.django_db(transaction=True, databases=["default", REPLICA])
def test_a_readers_preview_of_some_sources_reads_the_replica_alone(pool):
    """A reader restricted to one source reads a saved dataset's preview from the kept
    count's rows of its source, and counts the units of several sources live: both on the
    replica, so the sum is of one view of the pool."""
    from curation.models import Dataset
    from curation.selectors.specs import dataset_preview
    from curation.services.counts import dataset_counts_sweep
    from curation.specs import spec_parse
    from pool.models import Source

    # given a ready group whose two rollouts come from two sources, and a reader of one (an
    # agent's key reads its own source alone)
    ids = [Source.objects.create(name=f"rep-src-{x}").id for x in ("a", "b")]
    group_upsert(uid="rg-mixed", expected_rollouts=2)
    rng = random.Random(7)
    for r, source_id in enumerate(ids):
        steps_ingest(
            steps=[
                step_in(
                    f"rg-mixed-r{r}",
                    0,
                    prompt=random_ids(rng, 24),
                    response=random_ids(rng, 8),
                    group="rg-mixed",
                    reward=float(r),
                    is_last=True,
                )
            ],
            source_id=source_id,
        )
    reader = Client(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='rep-reader', source_name='rep-src-a', scopes=[Scope.INGEST])[1]}"
    )
    dataset_counts_sweep()  # the kept count built (celery beat's; a new version's on commit)
    caught_up()
    # when the reader asks for the preview
    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections[REPLICA]) as replica,
    ):
        got = reader.get("/api/v1/datasets/rep/preview")
    # then its numbers are the live count's of its source: the mixed group, not whole in
    # its view (one rollout of two), dropped
    assert got.status_code == 200, got.content
    want = dataset_preview(spec_parse(Dataset.objects.get(name="rep").current.spec), frozenset(ids[:1]))
    assert {k: got.json()[k] for k in want} == want
    assert want["dropped_groups"] == 1
    # and every read of the pool's rows went to the replica: the live count's too
    allowed = BEFORE_THE_HANDLER + ALSO_ON_PRIMARY["api: a dataset's preview"]
    on_primary = [
        q["sql"][:200]
        for q in primary.captured_queries
        if q["sql"].lstrip().upper().startswith(("SELECT", "WITH")) and not _tables(q["sql"]) <= set(allowed)
    ]
    assert on_primary == []
    assert any("curation_datasetcountsource" in q["sql"] for q in replica.captured_queries)
    assert any("pool_step" in q["sql"] for q in replica.captured_queries)


@pg_only
@pytest.mark.django_db(transaction=True, databases=["default", REPLICA])
def test_a_page_read_from_the_replica_shows_its_lag_and_the_replicas_data(pool, paused):
    # given a replica that stopped replaying, and a trajectory written since
    ready_group("rg-late", seed=3)
    assert wait_until(lambda: (replica_lag() or 0) >= 1.0, 30), "the replica's lag never reached 1 s"
    # when the trajectory list is read
    page = pool["page"].get("/trajectories/")
    # then it is the replica's (without the new trajectory), and it says how far behind it is
    assert page.status_code == 200
    body = page.content.decode()
    assert "rg-a-r0" in body and "rg-late-r0" not in body
    lag = float(re.search(r'data-replica-lag="([0-9.]+)"', body).group(1))
    assert lag >= 1.0
    assert re.search(r"Read from a replica, [0-9.]+ s behind the primary\.", body)
    # and the API's lists read it too
    uids = [t["uid"] for t in pool["api"].get("/api/v1/trajectories").json()["results"]]
    assert "rg-a-r0" in uids and "rg-late-r0" not in uids
    # while a read-back by id and the writes use the primary
    assert pool["api"].get("/api/v1/trajectories/rg-late-r0").status_code == 200


@pg_only
@pytest.mark.django_db(transaction=True, databases=["default", REPLICA])
def test_a_snapshot_reads_the_replica_once_it_has_its_steps(pool, settings, tmp_path):
    from curation.services.snapshots import snapshot_build, snapshot_create

    settings.MEDIA_ROOT = tmp_path / "media"
    tokens = "WITH RECURSIVE chain"  # the chunks' token reads (pool/tokens.py)

    def build() -> tuple[int, int, int]:
        snap = snapshot_create(dataset="rep", actor="test")
        with (
            CaptureQueriesContext(connections["default"]) as primary,
            CaptureQueriesContext(connections[REPLICA]) as replica,
        ):
            done = snapshot_build(snapshot_id=snap.id)
        assert done.status == "done", done.error
        return (
            done.manifest["steps"],
            sum(tokens in q["sql"] for q in primary.captured_queries),
            sum(tokens in q["sql"] for q in replica.captured_queries),
        )

    # given a replica that has replayed everything: the steps are read there
    assert build() == (8, 0, 1)
    # given a replica that stopped replaying, and a group made ready since
    with connections[REPLICA].cursor() as cur:
        cur.execute("SELECT pg_wal_replay_pause()")
    try:
        ready_group("rg-late", seed=3)
        settings.CLAW_REPLICA_WAIT_SECONDS = 0.2
        # when a snapshot is built, then it reads the primary, which has every frozen step
        # (a step missing where it reads fails the build: curation/services/snapshots.py)
        assert build() == (12, 1, 0)
    finally:
        with connections[REPLICA].cursor() as cur:
            cur.execute("SELECT pg_wal_replay_resume()")
