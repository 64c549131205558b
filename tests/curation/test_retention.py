"""Retention (curation/services/retention.py): what a pass removes, what it keeps (pins,
running rollouts, the newest steps), that every kept step reads exactly as before, and
archives read back, byte for byte, from the filesystem and from an S3-compatible server.

The pool: prompt groups of 3 rollouts x 3 turns written through the pipeline (white-box
steps with logprobs, token rewards, per-token policy versions, rewards, messages, metadata),
some made old. What a trainer or a page reads of a step (pool.selectors.steps_render) is
compared field by field before and after each pass."""

from __future__ import annotations

import datetime as dt
import io
import random
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest
from django.core.files.storage import storages
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from curation.models import (
    Archive,
    Consumer,
    Dataset,
    DatasetVersion,
    Delivery,
    Lease,
    RetentionPolicy,
    Snapshot,
)
from curation.services import retention
from curation.services.consume import leases_expire
from pool import tokens
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Source, Step, Trajectory
from pool.selectors.steps import steps_render
from pool.services.purge import groups_purge
from tests.pool.factories import random_ids, step_in

pytestmark = pytest.mark.django_db

ROLLOUTS, TURNS = 3, 3


def _group(name: str, source: Source, *, seed: int, ended: bool = True) -> str:
    """A prompt group of ROLLOUTS rollouts of TURNS turns sharing one prompt (stored as
    deltas against each other through the pipeline); returns its uid."""
    rng = random.Random(seed)
    prompt = random_ids(rng, 30)
    uid = f"{name}-{uuid.uuid4().hex[:8]}"
    batch = []
    for r in range(ROLLOUTS):
        ctx = list(prompt)
        for t in range(TURNS):
            response = random_ids(rng, 6)
            batch.append(
                step_in(
                    f"{uid}-r{r}",
                    t,
                    prompt=list(ctx),
                    response=response,
                    group=uid,
                    rollout_logprobs=[-rng.random() for _ in response],
                    token_rewards=np.asarray([rng.random() for _ in response]),
                    token_policy_versions=[(3, 2), (4, len(response) - 2)],
                    reward=round(rng.random(), 3) if ended and t == TURNS - 1 else None,
                    is_last=ended and t == TURNS - 1,
                    messages=[{"role": "user", "content": f"turn {t}"}],
                    response_text=f"answer {t}",
                    metadata={"turn": t, "rollout": r},
                )
            )
            ctx = ctx + response + random_ids(rng, 4)
    steps_ingest(steps=batch, source_id=source.id, sources=None)
    return uid


def _age(group_uid: str, days: float) -> None:
    then = timezone.now() - dt.timedelta(days=days)
    Trajectory.objects.filter(group__uid=group_uid).update(updated_at=then)


def _reads(group_uids: list[str]) -> dict[str, dict]:
    """Every step of these groups as the API reads it (token ids, logprobs, rewards...)."""
    steps = list(
        Step.objects.filter(trajectory__group__uid__in=group_uids)
        .select_related("trajectory", "trajectory__group")
        .order_by("uid")
    )
    out = {}
    for row in steps_render(steps):
        out[row["uid"]] = {
            k: (v.tolist() if isinstance(v, np.ndarray) else v)
            for k, v in row.items()
            if k not in ("created_at",)
        }
    return out


@pytest.fixture
def source() -> Source:
    return Source.objects.create(name=f"ret-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def pool(source):
    """Old ended groups, an old one still running, a young one."""
    old = [_group(f"old{i}", source, seed=i) for i in range(3)]
    running = _group("running", source, seed=10, ended=False)
    young = _group("young", source, seed=11)
    for g in [*old, running]:
        _age(g, 40)
    return {"old": old, "running": running, "young": young}


def test_a_dry_run_counts_and_removes_nothing_then_the_pass_removes_exactly_that(source, pool):
    policy = RetentionPolicy.objects.create(name="month", source=source, older_than_days=30, action="delete")
    kept = [pool["running"], pool["young"]]
    before = _reads([*pool["old"], *kept])

    # when: a dry run
    dry = retention.retention_run(policy=policy, dry_run=True)
    # then: it names the three old ended groups, and nothing moved
    assert (dry.groups, dry.trajectories, dry.steps) == (3, 3 * ROLLOUTS, 3 * ROLLOUTS * TURNS)
    assert _reads([*pool["old"], *kept]) == before

    # when: the pass runs
    done = retention.retention_run(policy=policy)
    # then: it removed what the dry run said, and every kept step reads exactly as before
    assert (done.groups, done.trajectories, done.steps) == (dry.groups, dry.trajectories, dry.steps)
    assert not PromptGroup.objects.filter(uid__in=pool["old"]).exists()
    assert not Step.objects.filter(trajectory__group__uid__in=pool["old"]).exists()
    after = _reads(kept)
    assert after == {uid: row for uid, row in before.items() if uid in after}
    assert len(after) == 2 * ROLLOUTS * TURNS
    policy.refresh_from_db()
    assert policy.last_report["steps"] == done.steps
    # and a second pass finds nothing left (idempotent)
    assert retention.retention_run(policy=policy).steps == 0


def test_pins_keep_what_a_lease_or_a_snapshot_holds(source, pool):
    old = pool["old"]
    # given: one old group in an open lease, one in a kept snapshot
    ds = Dataset.objects.create(name=f"d-{uuid.uuid4().hex[:6]}")
    version = DatasetVersion.objects.create(dataset=ds, version=1, spec={})
    consumer = Consumer.objects.create(name="trainer")
    lease = Lease.objects.create(
        id=uuid.uuid4(),
        consumer=consumer,
        dataset_version=version,
        unit="groups",
        format="steps",
        n_units=1,
        n_steps=ROLLOUTS * TURNS,
        content_hash="x",
        body=b"{}",
        created_at=timezone.now() - dt.timedelta(days=60),  # old, but still open
        expires_at=timezone.now() + dt.timedelta(minutes=5),
    )
    Delivery.objects.create(
        consumer=consumer,
        dataset=ds,
        kind=Delivery.Kind.GROUP,
        key=PromptGroup.objects.get(uid=old[0]).id,
        lease=lease,
    )
    Snapshot.objects.create(
        id=uuid.uuid4(),
        dataset_version=version,
        status=Snapshot.Status.DONE,
        content_hash="y",
        step_ids=sorted(Step.objects.filter(trajectory__group__uid=old[1]).values_list("id", flat=True))[:1],
    )
    policy = RetentionPolicy.objects.create(name="pins", source=source, older_than_days=30, action="delete")

    # when: the pass runs
    report = retention.retention_run(policy=policy)

    # then: only the unpinned old group went
    assert (report.pinned, report.groups) == (2, 1)
    assert set(PromptGroup.objects.filter(uid__in=old).values_list("uid", flat=True)) == {old[0], old[1]}

    # and once the lease is acked and past its replay window, it pins no more
    Lease.objects.filter(id=lease.id).update(status=Lease.Status.ACKED)
    with override_settings(CLAW_RETENTION_REPLAY_DAYS=7):
        assert retention.retention_run(policy=policy).groups == 1
    assert list(PromptGroup.objects.filter(uid__in=old).values_list("uid", flat=True)) == [old[1]]


# A delivery (a pull, a snapshot's freeze) and a retention pass racing for one old group,
# each let to reach the trajectories' lock first: (delivery, who first, the group was
# delivered before (its rewards frozen), the group is kept).
RACE_CASES = [
    ("pull", "delivery", False, True),  # its lease pins the group: the pass keeps it
    ("pull", "pass", False, False),  # the group goes: the pull leases nothing of it
    ("pull", "delivery", True, True),
    ("pull", "pass", True, False),  # a delivered trajectory is locked all the same
    ("snapshot", "delivery", False, True),
    ("snapshot", "pass", False, False),  # the snapshot freezes none of its steps
]


@pytest.mark.parametrize(("deliverer", "first", "delivered", "kept"), RACE_CASES)
@pytest.mark.django_db(transaction=True)
def test_a_delivery_racing_a_pass_either_pins_the_unit_or_leaves_it_out(
    source, deliverer, first, delivered, kept
):
    """Whichever reaches a unit's trajectories first, no lease or snapshot records a unit the
    pool no longer holds, and the pass never removes what a delivery committed: a pull that
    claimed a group just before the pass read its pins used to leave a lease that delivered
    a removed group (and that no later pass would revisit)."""
    import threading

    from django.db import connection, transaction

    from curation.services.consume import PullIn, consumer_pull
    from curation.services.datasets import dataset_create
    from curation.services.snapshots import snapshot_build
    from pool.services.readiness import readiness_sweep
    from tests.concurrency import lock_waiters, started, wait_for

    if connection.vendor != "postgresql":
        pytest.skip("concurrent sessions need PostgreSQL (SQLite serialises them)")
    # given: one old ended group, ready, admitted by a dataset
    uid = _group("race", source, seed=7)
    PromptGroup.objects.filter(uid=uid).update(expected_rollouts=ROLLOUTS)
    readiness_sweep()
    _age(uid, 40)
    group = PromptGroup.objects.get(uid=uid)
    assert group.ready_at is not None
    if delivered:  # by a snapshot since removed, say: nothing pins it
        Trajectory.objects.filter(group=group).update(delivered_at=timezone.now())
    version = dataset_create(name="race", spec={"filters": {"sources": [source.name]}}).current
    policy = RetentionPolicy.objects.create(name="race", source=source, older_than_days=30, action="delete")
    steps = sorted(Step.objects.filter(trajectory__group=group).values_list("id", flat=True))
    # and a session holding the group's first trajectory, so that each racer queues on it in
    # the order the case says
    held, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    leases, reports = [], []

    def gate() -> None:
        with transaction.atomic():
            Trajectory.objects.select_for_update().filter(group=group).order_by("id").first()
            held.set()
            assert release.wait(timeout=60)

    def deliver() -> None:
        if deliverer == "pull":
            leases.append(consumer_pull(consumer="trainer", pull=PullIn(dataset="race", batch_size=1)))
        else:
            snapshot_build(snapshot_id=snap.id)

    if deliverer == "snapshot":
        snap = Snapshot.objects.create(id=uuid.uuid4(), dataset_version=version)
    g = started(gate, errors)
    assert held.wait(timeout=60)
    racers = []
    for n, fn in enumerate(
        (deliver, lambda: reports.append(retention.retention_run(policy=policy)))
        if first == "delivery"
        else (lambda: reports.append(retention.retention_run(policy=policy)), deliver)
    ):
        racers.append(started(fn, errors))
        wait_for(
            lambda n=n: lock_waiters() > n or not racers[-1].is_alive(),
            f"racer {n + 1} to queue on the group's trajectory",
            deadline_s=60,
        )
    release.set()
    for t in (g, *racers):
        t.join(timeout=60)
    assert errors == []

    # then: the group is kept (pinned) or removed, as the first racer decides
    (report,) = reports
    assert PromptGroup.objects.filter(id=group.id).exists() is kept
    assert (report.pinned, report.groups) == ((1, 0) if kept else (0, 1))
    # and what the delivery recorded is what the pool holds: every step of the kept group,
    # nothing of a removed one
    if deliverer == "pull":
        (lease,) = leases
        if kept:
            assert lease is not None and lease.n_units == 1 and lease.n_steps == len(steps)
            assert list(Delivery.objects.filter(lease=lease).values_list("kind", "key")) == [
                (Delivery.Kind.GROUP, group.id)
            ]
        else:
            assert lease is None
            assert not Lease.objects.exists() and not Delivery.objects.exists()
    else:
        snap.refresh_from_db()
        assert snap.status == Snapshot.Status.DONE
        assert snap.step_ids == (steps if kept else [])
        assert snap.steps_total == len(snap.step_ids)


@pytest.mark.parametrize(("duty", "rests"), [(1.0, []), (0.5, [1.0, 1.0]), (0.25, [3.0, 3.0])])
def test_a_paced_pass_rests_between_its_chunks_as_its_duty_asks_and_removes_the_same(
    source, pool, settings, monkeypatch, duty, rests
):
    # given: one unit per chunk (3 old groups: 3 chunks), a clock on which each chunk's work
    # takes one second, and a pass working `duty` of its time
    monkeypatch.setattr(retention, "CHUNK_GROUPS", 1)
    ticks = iter(range(1000))
    monkeypatch.setattr(
        retention, "time", type("Clock", (), {"monotonic": staticmethod(lambda: next(ticks))})
    )
    settings.CLAW_RETENTION_DUTY = duty
    policy = RetentionPolicy.objects.create(name="paced", source=source, older_than_days=30, action="delete")
    kept = [pool["running"], pool["young"]]
    before = _reads(kept)
    asked: list[float] = []

    # when: a dry run, then the pass
    dry = retention.retention_run(policy=policy, dry_run=True, rest=asked.append)
    assert asked == []  # a dry run removes nothing and never rests
    done = retention.retention_run(policy=policy, rest=asked.append)

    # then: it rested between its chunks (never after the last) the chunk's second x (1 / duty - 1)
    assert asked == rests
    assert done.chunks == 3
    # and removed what an unpaced pass removes, every kept step reading as before
    assert (
        (done.groups, done.trajectories, done.steps)
        == (dry.groups, dry.trajectories, dry.steps)
        == (
            3,
            3 * ROLLOUTS,
            3 * ROLLOUTS * TURNS,
        )
    )
    assert not PromptGroup.objects.filter(uid__in=pool["old"]).exists()
    assert _reads(kept) == before


# How each way of running a pass paces it, with CLAW_RETENTION_DUTY at 0.25 (each chunk
# followed by three times its time at rest): an operator's run from the admin is waited for
# on its page and never rests; the command follows the setting unless --duty says otherwise.
OPERATOR_RUNS = [
    # (way, command-line arguments (None: the admin's action), rests asked)
    ("admin Run now", None, []),
    ("manage.py retention_run --policy", ["--policy", "paced"], [3.0, 3.0]),
    ("manage.py retention_run --policy --duty 1", ["--policy", "paced", "--duty", "1"], []),
    ("manage.py retention_run --policy --duty 0.5", ["--policy", "paced", "--duty", "0.5"], [1.0, 1.0]),
    ("manage.py retention_run (the sweep) --duty 0.5", ["--duty", "0.5"], [1.0, 1.0]),
]


@pytest.mark.parametrize(("way", "argv", "rests"), OPERATOR_RUNS, ids=[r[0] for r in OPERATOR_RUNS])
def test_each_way_of_running_a_pass_paces_it_as_documented(
    source, pool, settings, monkeypatch, admin_client, way, argv, rests
):
    # given: three chunks (one old group each) on a clock where each chunk takes a second,
    # and the setting asking a quarter of a pass's time
    monkeypatch.setattr(retention, "CHUNK_GROUPS", 1)
    ticks = iter(range(1000))
    slept: list[float] = []
    clock = type(
        "Clock", (), {"monotonic": staticmethod(lambda: next(ticks)), "sleep": staticmethod(slept.append)}
    )
    monkeypatch.setattr(retention, "time", clock)
    settings.CLAW_RETENTION_DUTY = 0.25
    policy = RetentionPolicy.objects.create(
        name="paced", source=source, older_than_days=30, action="delete", enabled=True
    )
    kept = [pool["running"], pool["young"]]
    before = _reads(kept)

    # when: the pass runs that way
    if argv is None:
        url = "/admin/curation/retentionpolicy/"
        page = admin_client.post(
            url, {"action": "run_now", "_selected_action": [policy.pk], "confirm": "yes"}
        )
        assert page.status_code == 302
    else:
        call_command("retention_run", *argv, stdout=io.StringIO(), stderr=io.StringIO())

    # then: it rested as documented, and removed the three old groups, the rest reading as before
    assert slept == rests
    assert not PromptGroup.objects.filter(uid__in=pool["old"]).exists()
    assert _reads(kept) == before


def test_a_duty_outside_its_range_is_refused_by_name(source, pool):
    policy = RetentionPolicy.objects.create(name="p", source=source, older_than_days=30, action="delete")
    for bad in (0, 1.5, -1):
        with pytest.raises(CommandError, match=r"--duty must be in \(0, 1\], not"):
            call_command("retention_run", "--policy", "p", "--duty", str(bad))
        with pytest.raises(ValueError, match=r"^duty must be in \(0, 1\], not"):
            retention.retention_run(policy=policy, duty=bad)
    assert PromptGroup.objects.filter(uid__in=pool["old"]).count() == 3  # nothing went


def test_keep_newest_steps_keeps_the_newest_groups(source, pool):
    for days, uid in zip((50, 45, 35), pool["old"], strict=True):
        _age(uid, days)
    # keep the newest 2 groups' steps (the young one and the 35-day-old one); the running one
    # (40 days) is never a candidate
    keep = 2 * ROLLOUTS * TURNS
    policy = RetentionPolicy.objects.create(
        name="newest", source=source, keep_newest_steps=keep, action="delete"
    )
    assert retention.retention_run(policy=policy).groups == 2
    left = set(PromptGroup.objects.filter(trajectories__source=source).values_list("uid", flat=True))
    assert left == {pool["old"][2], pool["young"], pool["running"]}


def test_a_kept_step_whose_token_parent_goes_is_rebased_and_reads_the_same(source):
    # given: a kept group whose first step is stored against a step of a group that goes (a
    # layout the pipeline never writes across groups, written here by hand)
    gone, kept = _group("gone", source, seed=1), _group("kept", source, seed=2)
    parent = Step.objects.filter(trajectory__group__uid=gone).order_by("id").first()
    child = Step.objects.filter(trajectory__group__uid=kept, step_index=0).order_by("id").first()
    full_child = tokens.bytes_to_ids(tokens.load_sequences([child.id])[child.id])
    full_parent = tokens.bytes_to_ids(tokens.load_sequences([parent.id])[parent.id])
    enc = tokens.encode_against(full_child, full_parent[:0], parent.seq_depth)  # share 0 tokens
    Step.objects.filter(id=child.id).update(
        seq_parent=parent, seq_shared=enc.shared, seq_delta=enc.delta, seq_depth=parent.seq_depth + 1
    )
    before = _reads([kept])

    # when: the other group is removed
    purged = groups_purge(group_ids=[PromptGroup.objects.get(uid=gone).id])

    # then: the kept step was stored whole, and every kept step reads as before
    assert purged.rebased == 1
    child.refresh_from_db()
    assert (child.seq_parent_id, child.seq_shared, child.seq_depth) == (None, 0, 0)
    assert _reads([kept]) == before


def test_an_archive_restores_byte_for_byte_and_loads_with_pyarrow_and_datasets(source, pool, tmp_path):
    old = pool["old"]
    before = _reads(old)
    groups_before = {g.uid: (g.expected_rollouts, g.status) for g in PromptGroup.objects.filter(uid__in=old)}
    policy = RetentionPolicy.objects.create(name="arch", source=source, older_than_days=30)
    with override_settings(
        STORAGES={
            **_storages(),
            "archives": {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(tmp_path)},
            },
        }
    ):
        report = retention.retention_run(policy=policy)
        archive = Archive.objects.get(id=report.archive)
        assert (archive.groups, archive.steps) == (3, len(before))
        # the manifest names every part with its sha256
        manifest = storages["archives"].open(f"{archive.folder}/manifest.json").read()
        assert all(f["sha256"] in manifest.decode() for f in archive.files)
        # the parts load as they are with pyarrow and with Hugging Face datasets
        part = tmp_path / archive.files[0]["name"]
        table = pq.read_table(part)
        assert sorted(table.column("uid").to_pylist()) == sorted(before)
        import datasets

        ds = datasets.load_dataset("parquet", data_files=str(part), split="train")
        row = next(r for r in ds if r["uid"] == sorted(before)[0])
        assert row["prompt_ids"] == before[row["uid"]]["prompt_ids"]

        # when: restored (twice: idempotent)
        call_command("archive_restore", str(archive.id))
        assert retention.archive_restore(archive=archive)["steps"] == 0

        # then: every step reads exactly as before it was archived, and the groups are back
        assert _reads(old) == before
        assert {
            g.uid: (g.expected_rollouts, g.status) for g in PromptGroup.objects.filter(uid__in=old)
        } == groups_before

        # and a changed file is refused, naming it
        data = part.read_bytes()
        part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        with pytest.raises(retention.ArchiveError, match="sha256"):
            retention.archive_restore(archive=archive)


def _storages() -> dict:
    from django.conf import settings

    return dict(settings.STORAGES)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server():
    """moto's S3-compatible server on a free port, with a bucket."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket="claw-archives")
            break
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.1)
    try:
        yield url, client
    finally:
        proc.terminate()
        proc.wait(10)


def test_archives_go_to_an_s3_compatible_store_by_settings_alone_and_come_back(source, pool, s3_server):
    url, client = s3_server
    old = pool["old"]
    before = _reads(old)
    s3 = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": "claw-archives",
            "endpoint_url": url,
            "access_key": "test",
            "secret_key": "test",
            "region_name": "us-east-1",
            "location": "archives",
            "file_overwrite": False,
        },
    }
    policy = RetentionPolicy.objects.create(name="s3", source=source, older_than_days=30)
    with override_settings(STORAGES={**_storages(), "archives": s3}):
        report = retention.retention_run(policy=policy)
        archive = Archive.objects.get(id=report.archive)
        keys = {o["Key"] for o in client.list_objects_v2(Bucket="claw-archives")["Contents"]}
        assert f"archives/{archive.folder}/manifest.json" in keys
        assert {f"archives/{f['name']}" for f in archive.files} <= keys
        assert not Step.objects.filter(trajectory__group__uid__in=old).exists()
        retention.archive_restore(archive=archive)
    assert _reads(old) == before


def test_the_admin_shows_the_dry_run_before_anything_goes(source, pool, admin_client):
    policy = RetentionPolicy.objects.create(name="admin", source=source, older_than_days=30, action="delete")
    url = "/admin/curation/retentionpolicy/"
    # when: "Run now" is chosen
    page = admin_client.post(url, {"action": "run_now", "_selected_action": [policy.pk]})
    # then: the page shows what would go, and nothing went
    assert page.status_code == 200
    html = page.content.decode()
    assert "what would go" in html and f"<td>{3 * ROLLOUTS * TURNS}</td>" in html
    assert PromptGroup.objects.filter(uid__in=pool["old"]).count() == 3
    # when: it is confirmed, then: the pass ran
    done = admin_client.post(url, {"action": "run_now", "_selected_action": [policy.pk], "confirm": "yes"})
    assert done.status_code == 302
    assert not PromptGroup.objects.filter(uid__in=pool["old"]).exists()


def test_consumed_groups_go_once_every_consumer_of_every_dataset_admitting_them_acked_them(
    source, settings, make_key
):
    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from tests.conftest import client_for

    settings.CLAW_RETENTION_REPLAY_DAYS = 0  # acked leases pin nothing: the rule alone decides
    groups = [_group(f"c{i}", source, seed=20 + i) for i in range(3)]
    for g in groups:
        PromptGroup.objects.filter(uid=g).update(expected_rollouts=ROLLOUTS)
    from pool.services.readiness import readiness_sweep

    readiness_sweep()
    dataset_create(name="all")
    a, b = (client_for(make_key(Scope.CONSUME, name=n)) for n in ("ta", "tb"))

    def pull_ack(client, consumer: str) -> None:
        body = client.post(
            f"/api/v1/consumers/{consumer}/pull", {"dataset": "all", "batch_size": 1}, format="json"
        ).json()
        assert body["lease_id"], body
        assert client.post(f"/api/v1/leases/{body['lease_id']}/ack").status_code == 200

    # given: consumer A acked the oldest group, and B holds it leased, not acked
    pull_ack(a, "ta")
    policy = RetentionPolicy.objects.create(name="consumed", source=source, consumed=True, action="delete")
    held = b.post("/api/v1/consumers/tb/pull", {"dataset": "all", "batch_size": 1}, format="json").json()
    # then: nothing is consumed by every consumer of the dataset yet
    assert retention.retention_run(policy=policy).groups == 0
    # when: B acks it too, then: the pass removes that group, and only it
    assert b.post(f"/api/v1/leases/{held['lease_id']}/ack").status_code == 200
    report = retention.retention_run(policy=policy)
    assert (report.groups, report.candidates) == (1, 1)
    assert set(PromptGroup.objects.filter(uid__in=groups).values_list("uid", flat=True)) == set(groups[1:])


def test_a_lease_past_its_replay_window_keeps_its_manifest_and_drops_its_batch(source, settings, make_key):
    """A replay lasts as long as the replay window (CLAW_RETENTION_REPLAY_DAYS, 7 days from the
    pull): past it, a lease that is no longer open keeps its manifest and drops its batch, and
    the replay answers 410 naming the lease. A consumer with a training run keeps its leases
    whole: the run's replay serves them."""
    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from pool.services.readiness import readiness_sweep
    from tests.conftest import client_for

    # given: three ready groups, and a trainer that pulled each one: an old acked lease, a
    # recent acked one, and an old one still open (leased)
    settings.CLAW_RETENTION_REPLAY_DAYS = 7
    groups = [_group(f"l{i}", source, seed=40 + i) for i in range(3)]
    PromptGroup.objects.filter(uid__in=groups).update(expected_rollouts=ROLLOUTS)
    readiness_sweep()
    dataset_create(name="all")
    trainer = client_for(make_key(Scope.CONSUME, name="trainer"))
    served = []
    for _ in groups:
        resp = trainer.post(
            "/api/v1/consumers/trainer/pull", {"dataset": "all", "batch_size": 1}, format="json"
        )
        assert resp.status_code == 200 and resp.json()["lease_id"], resp.content
        served.append((resp.json()["lease_id"], resp.content))
    (old, old_body), (recent, recent_body), (open_, open_body) = served
    for lease_id in (old, recent):
        assert trainer.post(f"/api/v1/leases/{lease_id}/ack").status_code == 200
    # and an old acked lease of a consumer with a training run (lineage: its run's replay)
    learner = client_for(make_key(Scope.CONSUME, name="learner"))
    resp = learner.post("/api/v1/consumers/learner/pull", {"dataset": "all", "batch_size": 1}, format="json")
    lineage, lineage_body = resp.json()["lease_id"], resp.content
    assert learner.post(f"/api/v1/leases/{lineage}/ack").status_code == 200
    from curation.models import Consumer, Run

    Run.objects.create(
        uid="run-1",
        consumer=Consumer.objects.get(name="learner"),
        dataset=Dataset.objects.get(name="all"),
        created_at=timezone.now(),
    )
    ten_days_ago = timezone.now() - dt.timedelta(days=10)
    Lease.objects.filter(id__in=[old, open_, lineage]).update(created_at=ten_days_ago)
    Lease.objects.filter(id=open_).update(expires_at=timezone.now() + dt.timedelta(minutes=5))

    # when: the retention sweep runs (celery beat's task)
    from curation.tasks import retention_sweep

    retention_sweep()

    # then: the old acked lease's replay answers 410 naming the lease and the window ...
    resp = trainer.get(f"/api/v1/leases/{old}/batch")
    assert resp.status_code == 410, resp.content
    error = resp.json()["error"]
    assert error["param"] == "lease" and "replay window of 7 days" in error["message"], error
    # ... and it kept its manifest field by field (what verdicts check steps against), batch gone
    import orjson

    before, after = orjson.loads(old_body), orjson.loads(bytes(Lease.objects.get(id=old).body))
    assert after == {"lease_id": before["lease_id"], "manifest": before["manifest"], "batch": None}
    assert before["batch"] and Lease.objects.get(id=old).batch_dropped_at is not None
    # and the recent lease, the open one and the run's replay byte for byte as first served
    assert trainer.get(f"/api/v1/leases/{recent}/batch").content == recent_body
    assert trainer.get(f"/api/v1/leases/{open_}/batch").content == open_body
    assert learner.get(f"/api/v1/leases/{lineage}/batch").content == lineage_body
    assert list(Lease.objects.filter(batch_dropped_at__isnull=False).values_list("id", flat=True)) == [
        uuid.UUID(old)
    ]
    # and an operator's replay page says why the batch is gone and still shows the manifest
    from django.contrib.auth.models import User
    from django.test import Client

    operator = Client()
    operator.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    from django.urls import reverse

    def replay_page(lease_id: str) -> str:
        resp = operator.get(reverse("curation:lease_batch", args=[lease_id]), HTTP_ACCEPT="text/html")
        assert resp.status_code == 200 and resp["Content-Type"].startswith("text/html"), resp
        return resp.content.decode()

    page = replay_page(old)
    assert "data-batch-dropped" in page and "replay window (7 days from its pull)" in page, page
    assert before["manifest"]["step_uids"][0] in page
    assert "data-batch-dropped" not in replay_page(recent)
    # and a second sweep trims nothing more (idempotent)
    assert retention.leases_trim() == 0


# Each lease of the table below: whose it is, what it pulled, how old it is, what became of it
# and of the groups of its units, and whether the retention sweep forgets it.
ALL = 99
FORGET_CASES = [
    # (name, consumer, unit, batch size, acted, days old, held groups purged, forgotten)
    ("acked, old, its group gone", "trainer", "groups", 1, "ack", 10, 1, True),
    ("acked, old, its group kept", "trainer", "groups", 1, "ack", 10, 0, False),
    ("acked, old, one of its two groups kept", "trainer", "groups", 2, "ack", 10, 1, False),
    ("acked, old, both its groups gone", "trainer", "groups", 2, "ack", 10, ALL, True),
    ("acked, within the replay window, its group gone", "trainer", "groups", 1, "ack", 1, 1, False),
    ("open (leased), old, its group gone", "trainer", "groups", 1, None, 10, 1, False),
    ("nacked, old (a nack frees its units)", "trainer", "groups", 1, "nack", 10, 0, True),
    ("expired, old (an expiry frees its units)", "trainer", "groups", 1, "expire", 10, 0, True),
    ("a training run's (lineage), old, its group gone", "learner", "groups", 1, "ack", 10, 1, False),
    ("steps, acked, old, their groups gone", "stepper", "steps", ROLLOUTS * TURNS, "ack", 10, ALL, True),
    ("steps, acked, old, their groups kept", "stepper", "steps", ROLLOUTS * TURNS, "ack", 10, 0, False),
    ("a lone trajectory, acked, old, gone", "soloist", "lone", 1, "ack", 10, 1, True),
    ("a lone trajectory, acked, old, kept", "soloist", "lone", 1, "ack", 10, 0, False),
    ("two lone trajectories, acked, old, one kept", "soloist", "lone", 2, "ack", 10, 1, False),
]


def test_a_lease_is_forgotten_once_every_unit_it_delivered_has_left_the_pool(source, settings, make_key):
    """Past its replay window, a lease that is not open and not lineage, whose every unit has
    left the pool, is forgotten by the retention sweep with its deliveries; every other lease
    stays as it was (its row, its deliveries, its body)."""
    import orjson

    from curation.models import Consumer, Dataset, Run
    from curation.services.datasets import dataset_create
    from curation.tasks import retention_sweep
    from pool.models import Scope
    from pool.services.readiness import readiness_sweep
    from tests.conftest import client_for

    # given: ready groups for the group pulls (dataset "all") and, each of a source of their
    # own, for the step pulls (dataset "steps") and lone trajectories, ready, for the pulls of
    # trajectories without a group (dataset "lone"); and each lease of the table pulled
    settings.CLAW_RETENTION_REPLAY_DAYS = 7
    stepped = Source.objects.create(name=f"ret-steps-{uuid.uuid4().hex[:8]}")
    solo = Source.objects.create(name=f"ret-lone-{uuid.uuid4().hex[:8]}")
    for kind, of in (("groups", source), ("steps", stepped)):
        n = sum(c[3] for c in FORGET_CASES if c[2] == kind)
        n = n if kind == "groups" else n // (ROLLOUTS * TURNS)
        made = [_group(f"f{kind}{i}", of, seed=60 + i) for i in range(n)]
        PromptGroup.objects.filter(uid__in=made).update(expected_rollouts=ROLLOUTS)
    for i in range(sum(c[3] for c in FORGET_CASES if c[2] == "lone")):
        steps_ingest(
            steps=[
                step_in(
                    f"flone{i}-{uuid.uuid4().hex[:8]}",
                    0,
                    prompt=[5, 6, i],
                    response=[7, 8],
                    reward=0.5,
                    is_last=True,
                )
            ],
            source_id=solo.id,
            sources=None,
        )
    readiness_sweep()
    dataset_create(name="all", spec={"filters": {"sources": [source.name]}})
    dataset_create(name="steps", spec={"filters": {"sources": [stepped.name]}})
    dataset_create(name="lone", spec={"filters": {"sources": [solo.name]}})
    clients = {
        who: client_for(make_key(Scope.CONSUME, name=who))
        for who in ("trainer", "learner", "stepper", "soloist")
    }
    leases = {}
    for name, who, unit, size, acted, days, purged, _ in FORGET_CASES:
        dataset = {"groups": "all", "steps": "steps", "lone": "lone"}[unit]
        pull = {"dataset": dataset, "batch_size": size, "unit": "steps" if unit == "steps" else "groups"}
        resp = clients[who].post(f"/api/v1/consumers/{who}/pull", pull, format="json")
        assert resp.status_code == 200 and resp.json()["lease_id"], (name, resp.content)
        lease = resp.json()["lease_id"]
        keys = list(Delivery.objects.filter(lease_id=lease).values_list("kind", "key"))
        assert len(keys) == size, name
        if unit == "lone":  # a lone trajectory is delivered as itself, minus its id as its unit
            assert {k for k, _ in keys} == {Delivery.Kind.TRAJECTORY}, name
            of_group = [-k for _, k in keys]
        elif unit == "groups":
            of_group = [k for _, k in keys]
        else:
            of_group = Step.objects.filter(id__in=[k for _, k in keys]).values_list(
                "trajectory__group_id", flat=True
            )
        held = sorted(set(of_group))
        if acted == "expire":  # past its expiry, ended by the consumers' sweep
            Lease.objects.filter(id=lease).update(expires_at=timezone.now() - dt.timedelta(minutes=1))
            assert leases_expire() == 1, name
        elif acted:
            assert clients[who].post(f"/api/v1/leases/{lease}/{acted}").status_code == 200, name
        Lease.objects.filter(id=lease).update(created_at=timezone.now() - dt.timedelta(days=days))
        if acted is None:  # still open: its expiry is ahead
            Lease.objects.filter(id=lease).update(expires_at=timezone.now() + dt.timedelta(minutes=5))
        leases[name] = (lease, held[:purged])
    Run.objects.create(
        uid="run-f",
        consumer=Consumer.objects.get(name="learner"),
        dataset=Dataset.objects.get(name="all"),
        created_at=timezone.now(),
    )
    # and the groups each case says have left the pool, removed as a retention pass does:
    # their leases read first (every lease that delivered one of them, and no other)
    gone = [g for _, of in leases.values() for g in of if g > 0]
    lone = [-u for _, of in leases.values() for u in of if u < 0]
    holders = retention.lease_holders(gone, lone)
    assert set(map(str, holders)) == {lease for lease, of in leases.values() if of}
    groups_purge(group_ids=gone, trajectory_ids=lone)
    before = {
        name: (
            bytes(Lease.objects.get(id=lease).body),
            sorted(Delivery.objects.filter(lease_id=lease).values_list("kind", "key")),
        )
        for name, (lease, _) in leases.items()
    }

    # when: the pass forgets those leases, and the retention sweep (celery beat's task) runs,
    # twice (idempotent)
    retention.leases_forget(holders)
    retention_sweep()
    retention_sweep()

    # then: exactly the table's leases are gone, with their deliveries
    for name, who, *_, forgotten in FORGET_CASES:
        lease = leases[name][0]
        if forgotten:
            assert not Lease.objects.filter(id=lease).exists(), name
            assert not Delivery.objects.filter(lease_id=lease).exists(), name
            assert clients[who].get(f"/api/v1/leases/{lease}/batch").status_code == 404, name
            continue
        # and every other one is as it was: its deliveries, and its body (a trimmed one's
        # manifest is the same manifest)
        kept = Lease.objects.get(id=lease)
        body, deliveries = before[name]
        assert sorted(Delivery.objects.filter(lease_id=lease).values_list("kind", "key")) == deliveries, name
        if kept.batch_dropped_at is None:
            assert bytes(kept.body) == body, name
        else:
            assert orjson.loads(bytes(kept.body))["manifest"] == orjson.loads(body)["manifest"], name


def test_the_command_runs_the_sweep_and_its_dry_run_changes_nothing(source, pool, settings, make_key):
    """``manage.py retention_run``: ``--dry-run`` prints each enabled policy's report of what
    it would remove and changes nothing; without it, the sweep celery beat runs: the passes
    (a JSON line each, the same numbers), every kept step reading as before, and a nacked
    lease past its replay window forgotten."""
    import json
    from io import StringIO

    from curation.models import Lease
    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from pool.services.groups import groups_check_complete
    from tests.conftest import client_for

    # given: the pool's old groups, a policy removing groups older than 30 days, and a
    # trainer's lease of the young group (the only ready one), nacked, ten days old
    settings.CLAW_RETENTION_REPLAY_DAYS = 7
    RetentionPolicy.objects.create(name="month", source=source, older_than_days=30, action="delete")
    PromptGroup.objects.filter(uid=pool["young"]).update(expected_rollouts=ROLLOUTS)
    groups_check_complete(group_ids=[PromptGroup.objects.get(uid=pool["young"]).id])
    dataset_create(name="all")
    trainer = client_for(make_key(Scope.CONSUME, name="trainer"))
    resp = trainer.post("/api/v1/consumers/trainer/pull", {"dataset": "all", "batch_size": 1}, format="json")
    lease = resp.json()["lease_id"]
    assert lease and resp.json()["batch"]["steps"][0]["prompt_group_uid"] == pool["young"], resp.content
    assert trainer.post(f"/api/v1/leases/{lease}/nack").status_code == 200
    Lease.objects.filter(id=lease).update(created_at=timezone.now() - dt.timedelta(days=10))
    kept = [pool["running"], pool["young"]]
    before = _reads(kept)
    want = {"groups": 3, "trajectories": 3 * ROLLOUTS, "steps": 3 * ROLLOUTS * TURNS}

    def command(*args: str) -> tuple[list[dict], str]:
        out, err = StringIO(), StringIO()
        call_command("retention_run", *args, stdout=out, stderr=err)
        return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()

    # when: a dry run
    (dry,), _ = command("--dry-run")
    # then: it names the three old groups, and nothing moved
    assert dry["policy"] == "month" and dry["dry_run"] is True
    assert {k: dry[k] for k in want} == want
    assert PromptGroup.objects.filter(uid__in=pool["old"]).count() == 3
    assert Lease.objects.filter(id=lease).exists()

    # when: the command runs
    (done,), err = command()
    # then: the pass removed what the dry run said, the kept steps read as before, and the
    # nacked lease is forgotten
    assert done["policy"] == "month" and done["dry_run"] is False
    assert {k: done[k] for k in want} == want
    assert not PromptGroup.objects.filter(uid__in=pool["old"]).exists()
    assert _reads(kept) == before
    assert not Lease.objects.filter(id=lease).exists()
    assert "nacked or expired leases forgotten: 1" in err


def test_a_retention_pass_forgets_the_leases_of_what_it_removed(source, settings, make_key):
    """End to end: a policy's pass removes two old groups; the trainer's old acked leases of
    them are forgotten in the same pass (counted in its report), a training run's lease of
    one of them is kept, and the lease of a young group the pass keeps stays whole."""
    from curation.models import Consumer, Dataset, RetentionPolicy, Run
    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from pool.services.readiness import readiness_sweep
    from tests.conftest import client_for

    # given: three ready groups, a trainer's acked lease of each and a learner's (with a
    # training run) of one of them, all ten days old
    settings.CLAW_RETENTION_REPLAY_DAYS = 7
    made = [_group(f"e{i}", source, seed=80 + i) for i in range(3)]
    PromptGroup.objects.filter(uid__in=made).update(expected_rollouts=ROLLOUTS)
    readiness_sweep()
    dataset_create(name="all")

    def pulled(who: str) -> tuple[str, int]:
        c = client_for(make_key(Scope.CONSUME, name=who))
        resp = c.post(f"/api/v1/consumers/{who}/pull", {"dataset": "all", "batch_size": 1}, format="json")
        assert resp.status_code == 200 and resp.json()["lease_id"], resp.content
        lease = resp.json()["lease_id"]
        assert c.post(f"/api/v1/leases/{lease}/ack").status_code == 200
        return lease, Delivery.objects.get(lease_id=lease).key

    trainer = [pulled("trainer") for _ in made]
    learner, learnt = pulled("learner")
    Lease.objects.update(created_at=timezone.now() - dt.timedelta(days=10))
    Run.objects.create(
        uid="run-e",
        consumer=Consumer.objects.get(name="learner"),
        dataset=Dataset.objects.get(name="all"),
        created_at=timezone.now(),
    )
    # and the trainer's first two groups old (the learner's is among them), the third young
    (a, _), (b, _), (young, young_group) = trainer
    old = [trainer[0][1], trainer[1][1]]
    assert learnt in old
    for g in PromptGroup.objects.filter(id__in=old).values_list("uid", flat=True):
        _age(g, 40)

    # when: a policy removing groups older than 30 days runs its pass
    report = retention.retention_run(policy=RetentionPolicy.objects.create(name="old", older_than_days=30))

    # then: it removed the two old groups and forgot the trainer's two leases of them
    assert report.groups == 2 and not PromptGroup.objects.filter(id__in=old).exists()
    assert report.forgotten_leases == 2
    assert not Lease.objects.filter(id__in=[a, b]).exists()
    assert not Delivery.objects.filter(lease_id__in=[a, b]).exists()
    # and the learner's (lineage) and the young group's lease are as they were
    assert Delivery.objects.get(lease_id=learner).key == learnt
    assert Delivery.objects.get(lease_id=young).key == young_group
