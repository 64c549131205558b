"""Snapshots (curation/services/snapshots.py, /api/v1/snapshots): a dataset version frozen
into JSONL and Parquet files, built in chunks, idempotent, and never recorded half-built.

README: "Snapshots: POST /api/v1/snapshots {"dataset": "name"} (consume or admin) freezes
what the dataset's current version admits and builds it in a Celery task."
README: "The step ids are frozen at the first attempt, and the files, written in 1,000-step
chunks (CLAW_SNAPSHOT_CHUNK_STEPS), are recorded only when complete, so a retry rebuilds the
same content and hash."
README: "Poll GET /api/v1/snapshots/{id} for status, progress and the manifest; download with
GET /api/v1/snapshots/{id}/download?format=jsonl|parquet."
(the columns: tests/curation/test_readme_trainer_promises.py)"""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq
import pytest
from django.core.files.storage import default_storage

from curation.models import Snapshot
from curation.services.datasets import dataset_create
from curation.services.labels import steps_label
from curation.services.snapshots import snapshot_build, snapshot_create
from curation.snapshot_files.parquet import COLUMNS
from pool.models import Scope, Step
from pool.selectors.steps import steps_render
from pool.services.service_events import feedback_create
from tests.conftest import client_for
from tests.curation.test_consume import ready_group

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def enqueued(monkeypatch) -> list[tuple]:
    """The snapshot_build tasks published (args), to be run explicitly (tests are not eager)."""
    from curation import tasks

    sent: list[tuple] = []
    monkeypatch.setattr(tasks.snapshot_build, "apply_async", lambda args, **kw: sent.append(tuple(args)))
    return sent


def run_enqueued(sent: list[tuple]) -> None:
    from curation.tasks import snapshot_build as task

    for args in sent:
        orjson.dumps(args)  # task arguments are JSON
        task.apply(args=args).get()
    sent.clear()


@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


@pytest.fixture
def pool_with_labels() -> list[str]:
    """Three ready groups (12 steps), a label, tags and feedback on steps and a trajectory."""
    dataset_create(name="all")
    uids = ready_group("g1", version=1) + ready_group("g2", version=2) + ready_group("g3")
    first = Step.objects.get(uid=uids[0])
    steps_label(step_ids=[first.id], actor="op", label="accepted", tags_add=["gold", "math"])
    feedback_create(step_uid=uids[0], rating=4.0, label="good", comment="fine")
    feedback_create(trajectory_uid="g1-r0", rating=1.0, correction="shorter")
    return uids


def build(dataset: str = "all") -> Snapshot:
    snap = snapshot_create(dataset=dataset, actor="t")
    snapshot_build(snapshot_id=snap.id)
    return Snapshot.objects.get(id=snap.id)


def jsonl_rows(snap: Snapshot) -> list[dict]:
    with default_storage.open(snap.files["jsonl"], "rb") as fh:
        return [orjson.loads(line) for line in fh.read().splitlines()]


def expected_rows() -> list[dict]:
    steps = list(Step.objects.with_context().order_by("id"))
    out = []
    for r in steps_render(steps):
        out.append(
            {
                "uid": r["uid"],
                "trajectory_uid": r["trajectory_uid"],
                "prompt_group_uid": r["prompt_group_uid"],
                "step_index": r["step_index"],
                "prompt_ids": r["prompt_ids"].tolist(),
                "response_ids": r["response_ids"].tolist(),
                "reward": r["reward"],
                "reward_source": r["reward_source"],
                "policy_version": r["policy_version"],
                "token_source": r["token_source"],
                "drift": r["drift"],
                "quality_flags": r["quality_flags"],
                "readiness": r["readiness"],
                "label": r["label"],
                "metadata": r["metadata"],
            }
        )
    return out


def test_a_snapshot_builds_in_the_background_and_its_files_match_the_steps(
    pool_with_labels, django_capture_on_commit_callbacks, enqueued
):
    # given a dataset of 12 ready steps, one labelled, tagged and with feedback
    uids = pool_with_labels
    # when a snapshot is requested, then its build is enqueued on commit, with its id
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        snap = snapshot_create(dataset="all", actor="trainer")
    assert len(callbacks) == 2 and enqueued == [(str(snap.id),)]  # the build and the live event
    # when the task runs
    run_enqueued(enqueued)
    snap = Snapshot.objects.get(id=snap.id)
    # then it is done, with every step, in id order
    assert snap.status == "done" and (snap.steps_done, snap.steps_total) == (12, 12)
    rows = jsonl_rows(snap)
    assert [r["uid"] for r in rows] == uids
    assert all(list(r) == sorted(COLUMNS) for r in rows)
    # and each line is the step exactly: ids, provenance, labels
    for row, want in zip(rows, expected_rows(), strict=True):
        assert {k: row[k] for k in want} == want
        assert row["mask"] is False
    first = rows[0]
    assert first["label"] == "accepted" and first["tags"] == ["gold", "math"]
    assert first["feedback"] == [
        {"rating": 4.0, "label": "good", "correction": "", "comment": "fine"},
        {"rating": 1.0, "label": "", "correction": "shorter", "comment": ""},
    ]
    assert rows[1]["feedback"] == [{"rating": 1.0, "label": "", "correction": "shorter", "comment": ""}]
    assert rows[4]["feedback"] == [] and rows[4]["tags"] == []
    # and the manifest sums it up
    m = snap.manifest
    assert (m["dataset"], m["dataset_version"], m["steps"], m["groups"], m["trajectories"]) == (
        "all",
        1,
        12,
        3,
        6,
    )
    # steps without a policy version are counted apart, never under a "None" key
    assert m["policy_versions"] == {"1": 4, "2": 4}
    assert m["steps_without_policy_version"] == 4
    assert m["prompt_tokens"] == sum(len(r["prompt_ids"]) for r in rows)
    assert m["content_hash"] == snap.content_hash != ""
    # and the Parquet file has the same rows (token columns list<int32>)
    table = pq.read_table(default_storage.path(snap.files["parquet"]))
    assert str(table.schema.field("prompt_ids").type) == "list<element: int32>"
    parquet_rows = table.to_pylist()
    for row in parquet_rows:
        row["metadata"] = orjson.loads(row["metadata"])
    assert parquet_rows == rows


def test_parquet_loads_with_hugging_face_datasets(pool_with_labels, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    snap = build()
    loaded = datasets.load_dataset(
        "parquet",
        data_files=default_storage.path(snap.files["parquet"]),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert loaded["uid"] == pool_with_labels
    # the token columns come back as lists of ints, the provenance columns as written
    parquet = pq.read_table(default_storage.path(snap.files["parquet"])).to_pylist()
    assert loaded[0]["response_ids"] == parquet[0]["response_ids"]
    assert set(parquet[0]) <= set(loaded.column_names)


def test_rebuilding_gives_the_same_content_hash(pool_with_labels):
    # given a done snapshot
    snap = build()
    files = dict(snap.files)
    # when it is built again, then nothing changes (idempotent)
    again = snapshot_build(snapshot_id=snap.id)
    assert (again.files, again.content_hash, again.manifest) == (files, snap.content_hash, snap.manifest)
    # and a second snapshot of the same version, data unchanged, has the same content
    other = build()
    assert other.id != snap.id and other.content_hash == snap.content_hash


def test_an_interrupted_build_records_nothing_and_a_retry_completes(pool_with_labels, media):
    # given the hash of a complete build
    reference = build().content_hash
    snap = snapshot_create(dataset="all")
    raised = []

    def crash_on_second_chunk(n: int) -> None:
        if n == 2 and not raised:
            raised.append(n)
            raise RuntimeError("worker killed")

    # when the build dies after its 2nd chunk (chunks of 5 steps)
    with pytest.raises(RuntimeError):
        snapshot_build(snapshot_id=snap.id, chunk_size=5, on_chunk=crash_on_second_chunk)
    # then the snapshot is not done, records no file, and none of the attempt's files is left
    snap.refresh_from_db()
    assert snap.status == "failed" and snap.files == {} and "worker killed" in snap.error
    assert snap.steps_done == 10 and snap.steps_total == 12
    left = [p for p in (media / "snapshots" / str(snap.id)).rglob("*") if p.is_file()]
    assert left == []
    # and a retry (the ids were frozen at the first attempt) completes with the same content
    done = snapshot_build(snapshot_id=snap.id, chunk_size=5, on_chunk=crash_on_second_chunk)
    assert done.status == "done" and done.content_hash == reference
    assert done.steps_done == 12


def test_a_killed_builds_leftovers_are_removed_by_the_retry(pool_with_labels, media):
    # given a build killed after storing a file (nothing recorded)
    snap = snapshot_create(dataset="all")
    stale = media / "snapshots" / str(snap.id) / "dead-attempt"
    stale.mkdir(parents=True)
    (stale / "snapshot.jsonl").write_bytes(b"partial")
    # when the task is redelivered
    done = snapshot_build(snapshot_id=snap.id)
    # then the leftovers are gone and the snapshot is done
    assert done.status == "done" and not (stale / "snapshot.jsonl").exists()


def test_the_frozen_ids_hold_when_data_is_added_later(pool_with_labels):
    snap = snapshot_create(dataset="all")
    with pytest.raises(RuntimeError):
        snapshot_build(snapshot_id=snap.id, on_chunk=lambda n: (_ for _ in ()).throw(RuntimeError("x")))
    ready_group("g4")  # admitted now, but after the snapshot's ids were frozen
    done = snapshot_build(snapshot_id=snap.id)
    assert done.steps_total == 12 and len(jsonl_rows(done)) == 12


def test_api_create_status_and_download(
    pool_with_labels, trainer, django_capture_on_commit_callbacks, enqueued
):
    # given a trainer
    # when it requests a snapshot
    with django_capture_on_commit_callbacks(execute=True):
        resp = trainer.post("/api/v1/snapshots", {"dataset": "all"}, format="json")
    assert resp.status_code == 202, resp.content
    body = resp.json()
    assert body["status"] == "pending" and body["progress"] == {"steps_done": 0, "steps_total": None}
    sid = body["id"]
    # then the download is refused while the build has not run
    resp = trainer.get(f"/api/v1/snapshots/{sid}/download?format=jsonl")
    assert resp.status_code == 409 and resp.json()["error"]["param"] == "snapshot"
    # when the build runs (the enqueued task)
    run_enqueued(enqueued)
    status = trainer.get(f"/api/v1/snapshots/{sid}").json()
    assert status["status"] == "done" and status["progress"] == {"steps_done": 12, "steps_total": 12}
    assert status["manifest"]["content_hash"] == status["content_hash"]
    assert status["formats"] == ["jsonl", "parquet"]
    # then both files stream, with a file name
    snap = Snapshot.objects.get(id=sid)
    for fmt in ("jsonl", "parquet"):
        resp = trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": fmt})
        assert resp.status_code == 200
        assert f'filename="all-v1-{sid}.{fmt}"' in resp["Content-Disposition"]
        with default_storage.open(snap.files[fmt], "rb") as fh:
            assert b"".join(resp.streaming_content) == fh.read()


def test_api_errors_name_the_field(pool_with_labels, trainer):
    snap = build()
    resp = trainer.get(f"/api/v1/snapshots/{snap.id}/download?format=csv")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "format"
    resp = trainer.post("/api/v1/snapshots", {"dataset": "nope"}, format="json")
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "dataset"
    resp = trainer.post("/api/v1/snapshots", {"dataset": "all", "extra": 1}, format="json")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "extra"
    resp = trainer.get("/api/v1/snapshots/00000000-0000-0000-0000-000000000000")
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "snapshot"


def test_scopes_reads_may_download_only_trainers_may_create(pool_with_labels, make_key):
    snap = build()
    reader = client_for(make_key(Scope.READ, name="r"))
    agent = client_for(make_key(Scope.INGEST, name="a"))
    assert reader.get(f"/api/v1/snapshots/{snap.id}/download").status_code == 200
    # an ingest key reads its own source's rows only (pool/tenancy.py): these have no source
    # (nobody's), so their snapshot is an unknown id to it, body for body
    unknown = "00000000-0000-0000-0000-000000000000"
    for suffix in ("", "/download"):
        got = agent.get(f"/api/v1/snapshots/{snap.id}{suffix}")
        none = agent.get(f"/api/v1/snapshots/{unknown}{suffix}")
        assert got.status_code == none.status_code == 404
        assert got.json() == orjson.loads(none.content.decode().replace(unknown, str(snap.id)))
    before = Snapshot.objects.count()
    assert reader.post("/api/v1/snapshots", {"dataset": "all"}, format="json").status_code == 403
    assert agent.post("/api/v1/snapshots", {"dataset": "all"}, format="json").status_code == 403
    assert client_for(None).get(f"/api/v1/snapshots/{snap.id}").status_code == 401
    assert Snapshot.objects.count() == before
    # consume or admin keys create them
    for scope in (Scope.CONSUME, Scope.ADMIN):
        creator = client_for(make_key(scope, name=f"creator-{scope}"))
        assert creator.post("/api/v1/snapshots", {"dataset": "all"}, format="json").status_code == 202
    assert Snapshot.objects.count() == before + 2


def test_files_are_written_in_chunks_of_the_setting(pool_with_labels, settings):
    """README: "The step ids are frozen at the first attempt, and the files, written in
    1,000-step chunks (CLAW_SNAPSHOT_CHUNK_STEPS), are recorded only when complete, so a
    retry rebuilds the same content and hash." (the chunks: of the setting's size, progress
    recorded after each; the default is in test_readme_trainer_promises.py)"""
    # given: chunks of 5 steps, and a build that records what was done after each chunk
    settings.CLAW_SNAPSHOT_CHUNK_STEPS = 5
    snap = snapshot_create(dataset="all")
    progress: list[tuple[int, int, dict]] = []

    def seen(n: int) -> None:
        s = Snapshot.objects.get(id=snap.id)
        progress.append((n, s.steps_done, s.files))

    # when: it is built
    done = snapshot_build(snapshot_id=snap.id, on_chunk=seen)
    # then: 12 steps in chunks of 5, 5 and 2, no file recorded before the end
    assert progress == [(1, 5, {}), (2, 10, {}), (3, 12, {})]
    assert done.status == "done" and set(done.files) == {"jsonl", "parquet"}
    assert len(jsonl_rows(done)) == 12 and done.content_hash == build().content_hash
