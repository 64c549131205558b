"""Pulling batches under leases (curation/services/consume.py, POST
/api/v1/consumers/{name}/pull): exactly once per consumer, oldest-ready first, nothing
blocks on a group that is not ready, nack and expiry redeliver, replay is byte-identical.

README: "Exactly once per consumer: a pull claims each unit (a whole prompt group, a
trajectory without a group, or a step for unit: steps datasets) by inserting a Delivery row
unique per consumer, dataset and unit; concurrent pullers (threads or processes, tested with
8 on PostgreSQL) never share a unit, and one that loses a unit takes the next candidate."
(each consumer once, step units, 8 threads and 8 processes here; the lost race in
tests/curation/test_readme_trainer_promises.py)"""

from __future__ import annotations

import threading
from datetime import timedelta

import orjson
import pytest
from django.db import connection, connections
from django.utils import timezone

from curation.models import Delivery, Lease
from curation.services.consume import PullIn, consumer_pull, lease_ack, leases_expire
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.services.groups import group_upsert
from pool.services.policy import policy_version_set
from tests.conftest import client_for
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def ready_group(uid: str, *, rollouts: int = 2, steps: int = 2, version: int | None = None) -> list[str]:
    """A complete, ready prompt group; returns its step uids in order."""
    group_upsert(uid=uid, expected_rollouts=rollouts)
    batch = []
    for r in range(rollouts):
        prompt = [1, 2, r]
        for i in range(steps):
            batch.append(
                step_in(
                    f"{uid}-r{r}",
                    i,
                    prompt=prompt,
                    response=[3, i],
                    group=uid,
                    reward=float(r),
                    is_last=i == steps - 1,
                    policy_version=version,
                )
            )
            prompt = prompt + [3, i, 9]
    steps_ingest(steps=batch)
    return [s.uid for s in batch]


@pytest.fixture
def trainer(make_key):
    from pool.models import Scope

    return client_for(make_key(Scope.CONSUME, name="trainer"))


def pull(client, consumer="c1", **body):
    resp = client.post(f"/api/v1/consumers/{consumer}/pull", {"dataset": "all", **body}, format="json")
    assert resp.status_code == 200, resp.content
    return resp


def test_a_pull_leases_ready_groups_oldest_first_with_a_manifest(trainer):
    dataset_create(name="all")
    first = ready_group("g1")
    group_upsert(uid="waiting", expected_rollouts=5)  # never ready: must not block the others
    steps_ingest(
        steps=[step_in("w-r0", 0, prompt=[1], response=[2], group="waiting", reward=1.0, is_last=True)]
    )
    second = ready_group("g2")
    # when the trainer pulls one group at a time
    body = pull(trainer, batch_size=1).json()
    # then it gets the oldest ready group, whole, each step with its uid
    assert [s["uid"] for s in body["batch"]["steps"]] == first
    m = body["manifest"]
    assert (m["dataset"], m["dataset_version"], m["units"], m["step_uids"]) == ("all", 1, 1, first)
    assert body["lease_id"] == m["lease_id"]
    # and the next pull the next one; the group that is not ready never comes
    assert [s["uid"] for s in pull(trainer, batch_size=5).json()["batch"]["steps"]] == second
    assert pull(trainer).json() == {"lease_id": None, "manifest": None, "batch": None}


def test_each_consumer_gets_each_unit_once(trainer):
    dataset_create(name="all")
    for g in range(3):
        ready_group(f"g{g}")
    a = [s["uid"] for s in pull(trainer, consumer="a", batch_size=2).json()["batch"]["steps"]]
    b = [s["uid"] for s in pull(trainer, consumer="a", batch_size=2).json()["batch"]["steps"]]
    assert len(a) == 8 and len(b) == 4 and not set(a) & set(b)
    # another consumer gets everything again
    other = [s["uid"] for s in pull(trainer, consumer="b", batch_size=10).json()["batch"]["steps"]]
    assert sorted(other) == sorted(a + b)


def test_nack_and_expiry_make_a_batch_deliverable_again_and_ack_is_final(trainer):
    """README: "An expired lease cannot be acked (409)." """
    dataset_create(name="all")
    uids = ready_group("g1")
    lease = pull(trainer).json()["lease_id"]
    assert trainer.post(f"/api/v1/leases/{lease}/nack").json()["status"] == "released"
    again = pull(trainer, lease_seconds=5).json()
    assert again["manifest"]["step_uids"] == uids
    # an expired lease: its units come back, and it can no longer be acked
    leases_expire(now=timezone.now() + timedelta(seconds=6))
    resp = trainer.post(f"/api/v1/leases/{again['lease_id']}/ack")
    assert resp.status_code == 409 and resp.json()["error"]["param"] == "lease"
    third = pull(trainer).json()
    assert third["manifest"]["step_uids"] == uids
    assert trainer.post(f"/api/v1/leases/{third['lease_id']}/ack").json()["status"] == "acked"
    assert trainer.post(f"/api/v1/leases/{third['lease_id']}/ack").status_code == 200  # idempotent
    assert pull(trainer).json()["lease_id"] is None  # consumed for good
    assert trainer.post(f"/api/v1/leases/{third['lease_id']}/nack").status_code == 409


def test_replay_is_byte_identical_after_ack(trainer):
    """README: "Replay and audit: the response is stored byte for byte with its lease, and
    GET /api/v1/leases/{id}/batch returns it again, after an ack too." """
    dataset_create(name="all")
    ready_group("g1")
    first = pull(trainer)
    lease = first.json()["lease_id"]
    trainer.post(f"/api/v1/leases/{lease}/ack")
    replay = trainer.get(f"/api/v1/leases/{lease}/batch")
    assert replay.status_code == 200 and replay.content == first.content
    # the manifest's content hash is the hash of the batch bytes it carries
    import hashlib

    payload = first.content[first.content.index(b'"batch":') + len(b'"batch":') : -1]
    assert hashlib.sha256(payload).hexdigest() == first.json()["manifest"]["content_hash"]


def test_batches_carry_policy_versions_staleness_and_masks(trainer):
    policy_version_set(version=1)
    dataset_create(name="all", spec={"grouping": {"short_groups": "mask", "min_rollouts": 2}})
    ready_group("g1", version=1)
    policy_version_set(version=3)
    body = pull(trainer).json()
    assert body["manifest"]["policy_versions"] == {"1": 4}
    assert body["manifest"]["staleness"] == {"min": 2, "max": 2}
    assert {s["staleness"] for s in body["batch"]["steps"]} == {2}
    assert {s["mask"] for s in body["batch"]["steps"]} == {False}


def test_step_units_for_a_dataset_of_steps(trainer):
    dataset_create(name="all", spec={"grouping": {"keep_groups_whole": False}})
    uids = ready_group("g1")
    resp = trainer.post("/api/v1/consumers/c/pull", {"dataset": "all"}, format="json")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "unit"
    got = pull(trainer, consumer="c", unit="steps", batch_size=3).json()["manifest"]["step_uids"]
    rest = pull(trainer, consumer="c", unit="steps", batch_size=3).json()["manifest"]["step_uids"]
    assert sorted(got + rest) == sorted(uids) and len(got) == 3


@pytest.mark.parametrize(
    ("body", "field", "status"),
    [
        ({"dataset": "nope"}, "dataset", 404),
        ({"dataset": "all", "batch_size": 0}, "batch_size", 400),
        ({"dataset": "all", "unit": "rollouts"}, "unit", 400),
        ({"dataset": "all", "format": "parquet"}, "format", 400),
        ({"dataset": "all", "lease_seconds": "long"}, "lease_seconds", 400),
        ({"dataset": "all", "wait": 99}, "wait", 400),
        ({"dataset": "all", "colour": 1}, "colour", 400),
    ],
)
def test_bad_pulls_name_the_field_and_lease_nothing(trainer, body, field, status):
    dataset_create(name="all")
    ready_group("g1")
    resp = trainer.post("/api/v1/consumers/c/pull", body, format="json")
    assert resp.status_code == status and resp.json()["error"]["param"] == field
    assert Lease.objects.count() == 0 and Delivery.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_pullers_of_one_consumer_never_share_a_unit():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent pullers need PostgreSQL (SQLite serialises writers)")
    dataset_create(name="all")
    expected = set()
    for g in range(12):
        expected.update(ready_group(f"g{g}"))
    barrier = threading.Barrier(8)
    got: list[list[str]] = []
    errors: list[BaseException] = []

    def puller() -> None:
        try:
            barrier.wait(timeout=60)
            while True:
                lease = consumer_pull(consumer="shared", pull=PullIn(dataset="all", batch_size=1))
                if lease is None:
                    return
                got.append(orjson.loads(bytes(lease.body))["manifest"]["step_uids"])
                lease_ack(lease_id=lease.id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=puller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    delivered = [uid for batch in got for uid in batch]
    # every step exactly once, in 12 one-group batches
    assert len(got) == 12 and sorted(delivered) == sorted(expected)


def test_a_batch_fills_past_ready_groups_the_dataset_does_not_admit(trainer):
    # given ready groups, the oldest ones labelled rejected (so the dataset skips them)
    from curation.models import Skip
    from curation.services.labels import steps_label
    from pool.models import Step

    dataset_create(name="all")
    for g in range(6):
        ready_group(f"g{g}")
    rejected = Step.objects.filter(trajectory__group__uid__in=["g0", "g1", "g2", "g3"]).values_list(
        "id", flat=True
    )
    steps_label(step_ids=list(rejected), label="rejected", actor="op")
    # when a trainer asks for two groups
    body = pull(trainer, batch_size=2).json()
    # then it gets the two admitted ones, and the rejected ones are not read again
    groups = {s["prompt_group_uid"] for s in body["batch"]["steps"]}
    assert groups == {"g4", "g5"}
    assert Skip.objects.count() == 4
    assert pull(trainer).json()["lease_id"] is None


# A puller process. faulthandler names every thread's stack should one crash the process;
# it ends with os._exit once its answer is flushed: once (of many CI runs) a puller aborted
# with glibc's "FATAL: exception not rethrown" after its pulls, while the interpreter tore
# down its threads, which is not what this test is about.
PULLER = """
import faulthandler, json, os, sys
faulthandler.enable()
import django
django.setup()
from curation.services.consume import PullIn, consumer_pull, lease_ack
got = []
while True:
    lease = consumer_pull(consumer="shared", pull=PullIn(dataset="all", batch_size=1))
    if lease is None:
        break
    got.append(json.loads(bytes(lease.body))["manifest"]["step_uids"])
    lease_ack(lease_id=lease.id)
print(json.dumps(got))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.django_db(transaction=True)
def test_eight_puller_processes_share_a_consumer_without_duplicates_or_loss():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent puller processes need PostgreSQL")
    import json
    import os
    import subprocess
    import sys

    from tests.live import _with_db

    dataset_create(name="all")
    expected = set()
    for g in range(16):
        expected.update(ready_group(f"g{g}"))
    env = {
        **os.environ,
        "DATABASE_URL": _with_db(os.environ["DATABASE_URL"], connection.settings_dict["NAME"]),
    }
    env["DJANGO_SETTINGS_MODULE"] = "claw_site.settings.test"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PULLER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(8)
    ]
    batches = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err.decode()[-2000:]
        batches += json.loads(out.decode().strip().splitlines()[-1])
    delivered = [uid for batch in batches for uid in batch]
    # every step exactly once across the eight processes, one group per batch
    assert len(batches) == 16 and sorted(delivered) == sorted(expected)


def test_a_pull_costs_the_same_statements_whatever_the_ready_set():
    # given a dataset of whole groups and a consumer that has pulled the 2 oldest groups
    from tests.pool.statements import sql_statements

    dataset_create(name="all")
    for g in range(2):
        ready_group(f"sc-{g}")
    consumer_pull(consumer="counted", pull=PullIn(dataset="all", batch_size=2))
    counts, served = [], []
    for n in (2, 30):
        # when n more groups are ready and it pulls 2
        groups = [f"sc{n}-{g}" for g in range(n)]
        for g in groups:
            ready_group(g)
        with sql_statements() as seen:
            lease = consumer_pull(consumer="counted", pull=PullIn(dataset="all", batch_size=2))
        counts.append(len(seen))
        # then it gets the oldest 2 of them, whole
        served = orjson.loads(lease.body)["manifest"]["step_uids"]
        assert served == [f"{g}-r{r}:{i}" for g in groups[:2] for r in range(2) for i in range(2)]
    # and the pull is the same statements whatever the ready set: the dataset, the consumer,
    # lease expiry, the policy version, the consumer's pull cursors (services/cursors.py),
    # the two ready queues (read from the cursors), the candidates' rollouts (one
    # read, so the admission reads their trajectories by primary key: a subquery there let
    # PostgreSQL hash a scan of the whole trajectory table at 1M steps, bench.growth), the
    # candidates' admission (one statement), the claim, the delivery stamp (the steps'
    # trajectories, then a locking read and an update of those by primary key: joined in one
    # statement, PostgreSQL may hash the whole trajectory table), the batch's steps, the
    # policy version again (none is current), their token chains and media, the cursors'
    # advance (one UPDATE) and the lease row (one INSERT)
    assert counts[0] == counts[1] == 19, counts
