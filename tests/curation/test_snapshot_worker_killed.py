"""A Celery worker killed mid-snapshot: the snapshot completes on retry and stays consistent.

Killed whole (SIGKILL to its process group, pool children included), the build task it had
taken but not acknowledged (acks late) is redelivered by the broker to another worker once
CLAW_CELERY_VISIBILITY_TIMEOUT has passed. With only its pool process killed (as the OOM
killer would), the living worker retries the task (task_retry_on_worker_lost). Either way
the retry completes a snapshot identical to a clean build of the same dataset version, with
each frozen step once in each file and no leftover file. Runs in CI's PostgreSQL + Redis
leg, against a private Redis.

README: "The task acks late and writes unnamed temporary files, so a worker killed mid-build
leaves nothing on its disk, and the redelivered task completes the snapshot." """

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pyarrow.parquet as pq
import pytest
import redis

from claw_site.settings.base import redelivery_options
from tests.live import (
    LiveServer,
    free_port,
    live_server,
    start_celery_worker,
    start_redis,
    stop_process,
)

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs DATABASE_URL and REDIS_URL (CI's PostgreSQL + Redis run)",
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary"),
]

STEPS = 4_000  # lone one-step trajectories, ingested 1,000 per call
CHUNK_STEPS = 20  # CLAW_SNAPSHOT_CHUNK_STEPS: 200 chunks, so the build is caught mid-way
# Seconds before the dead worker's task is redelivered: longer than the build takes to write
# its first chunk, so the task is still the dead worker's when it dies (a worker's sweep also
# hands back its own task once it has run this long).
VISIBILITY_TIMEOUT = 10


@pytest.mark.parametrize("victim", ["worker", "pool child"])
def test_a_worker_killed_mid_snapshot_leaves_a_consistent_snapshot_after_redelivery(tmp_path, victim):
    (tmp_path / "worker-tmp").mkdir()
    port = free_port()
    redis_server = start_redis(port, tmp_path / "redis.log")
    broker = redis.Redis(port=port, decode_responses=True)
    env = {
        "REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "CLAW_CELERY_QUEUE": f"claw-snapkill-{uuid.uuid4().hex[:8]}",
        # A dead worker's task comes back after the visibility timeout; a dead pool child's
        # must come back from its living parent, long before the (default) timeout.
        "CLAW_CELERY_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT if victim == "worker" else 3600),
        "CLAW_SNAPSHOT_CHUNK_STEPS": str(CHUNK_STEPS),
        "CLAW_MEDIA_ROOT": str(tmp_path / "media"),
        "TMPDIR": str(tmp_path / "worker-tmp"),
    }
    first = second = None

    def log(n: int) -> str:
        return (tmp_path / f"worker-{n}.log").read_text()

    try:
        with live_server(tmp_path, env) as server:
            key = server.make_key("ingest", "read", "consume", "admin")
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as api:
                # given a dataset admitting a few thousand steps, and a prefork worker
                uids = ingest(api, STEPS)
                resp = api.post("/api/v1/datasets", json={"name": "all", "filters": {}})
                assert resp.status_code == 201, resp.text
                assert api.get("/api/v1/datasets/all/preview").json()["steps"] == STEPS
                first = start_worker(server, tmp_path / "worker-1.log")

                # when a snapshot is requested and, once the build has written a chunk but
                # not the last, the worker is killed (its whole process group) or only the
                # pool process running the build (as the kernel's OOM killer would)
                snap_id = api.post("/api/v1/snapshots", json={"dataset": "all"}).json()["id"]
                wait_for(lambda: building_mid_way(api, snap_id), "the build to have written a chunk", 120)
                if victim == "worker":
                    os.killpg(first.pid, signal.SIGKILL)
                    first.wait(timeout=30)
                    killed = snapshot(api, snap_id)
                    # then the build had really been cut short: not done, nothing recorded
                    assert killed["status"] == "building", killed
                    assert 0 < killed["progress"]["steps_done"] < STEPS, killed
                    assert killed["formats"] == [] and killed["content_hash"] == ""
                    # and, the worst case, it died in its restore sweep, holding the sweep's
                    # lock as long as its settings let it (kombu's own 300 s outlasts this
                    # test's wait: the likely cause of a CI run in which it timed out)
                    expire = redelivery_options(VISIBILITY_TIMEOUT)["unacked_mutex_expire"]
                    broker.set("unacked_mutex", "dead", nx=True, px=expire * 1000)  # unless it did
                    assert 0 < broker.pttl("unacked_mutex") <= expire * 1000
                else:
                    (child,) = psutil.Process(first.pid).children()
                    child.send_signal(signal.SIGKILL)
                taken = task_ids(tmp_path / "worker-1.log")
                assert len(taken) == 1, log(1)
                task_id = taken.pop()

                # when another worker starts (the killed one's parent, if alive, keeps going)
                if victim == "worker":
                    second = start_worker(server, tmp_path / "worker-2.log")
                builder = 2 if victim == "worker" else 1
                # then the same task is delivered again, and the snapshot completes
                done = wait_for(
                    lambda: finished(api, snap_id),
                    "the killed snapshot to finish",
                    180,
                    lambda: diagnosis(tmp_path, broker),
                )
                assert done["status"] == "done", (done, log(builder))
                attempt = {snap_id: done_attempt(log, builder, snap_id)}
                assert f"Task curation.snapshot_build[{task_id}] received" in log(builder)
                started = re.findall(
                    rf"snapshot {snap_id}: attempt (\w+) started", log(1) + (log(2) if second else "")
                )
                assert len(set(started)) == 2 and started[-1] == attempt[snap_id], started
                if victim == "worker":
                    assert f"snapshot {snap_id}: done" not in log(1)

                # and it equals a clean build of the same dataset version
                clean_id = api.post("/api/v1/snapshots", json={"dataset": "all"}).json()["id"]
                clean = wait_for(lambda: finished(api, clean_id), "the clean snapshot", 180)
                assert clean["status"] == "done", clean
                assert done["dataset_version"] == clean["dataset_version"]
                assert done["content_hash"] == clean["content_hash"] == done["manifest"]["content_hash"]
                assert counts(done["manifest"]) == counts(clean["manifest"])
                assert done["manifest"]["steps"] == done["progress"]["steps_done"] == STEPS

                # and each file holds every frozen step exactly once
                lines = api.get(f"/api/v1/snapshots/{snap_id}/download", params={"format": "jsonl"})
                assert lines.status_code == 200, lines.text
                jsonl_uids = [orjson.loads(line)["uid"] for line in lines.content.splitlines()]
                parquet = api.get(f"/api/v1/snapshots/{snap_id}/download", params={"format": "parquet"})
                assert parquet.status_code == 200, parquet.text
                parquet_uids = (
                    pq.read_table(io.BytesIO(parquet.content), columns=["uid"]).column(0).to_pylist()
                )
                for got in (jsonl_uids, parquet_uids):
                    assert len(got) == len(set(got)) == done["manifest"]["steps"]
                    assert set(got) == set(uids)
                assert jsonl_uids == parquet_uids

                # and storage holds each snapshot's two files from its completing attempt only
                # (the killed attempt's are gone)
                attempt[clean_id] = done_attempt(log, builder, clean_id)
                media = tmp_path / "media"
                stored = sorted(p.relative_to(media).as_posix() for p in media.rglob("*") if p.is_file())
                assert stored == sorted(
                    f"snapshots/{s}/{attempt[s]}/snapshot.{fmt}"
                    for s in (snap_id, clean_id)
                    for fmt in ("jsonl", "parquet")
                )
                # and the killed build left no partial file on the worker's own disk either
                assert [p for p in (tmp_path / "worker-tmp").rglob("*") if p.is_file()] == []
    finally:
        for worker in (first, second):
            if worker is not None:
                stop_worker(worker)
        broker.close()
        stop_process(redis_server, kill=True)


# --- helpers --------------------------------------------------------------------------------
def ingest(api: httpx.Client, n: int) -> list[str]:
    """``n`` completed one-step trajectories with a reward; returns their step uids."""
    uids = []
    for start in range(0, n, 1_000):
        steps = [
            {
                "trajectory_uid": f"t{i}",
                "step_index": 0,
                "prompt_ids": [1, 2, 3, i % 50_000],
                "response_ids": [4, 5, i % 7],
                "reward": float(i % 2),
                "is_last": True,
            }
            for i in range(start, min(n, start + 1_000))
        ]
        resp = api.post("/api/v1/steps", json={"steps": steps})
        assert resp.status_code == 201, resp.text
        uids += [s["uid"] for s in resp.json()["steps"]]
    return uids


def start_worker(server: LiveServer, log: Path) -> subprocess.Popen:
    """A prefork Celery worker (one child) on the server's queue, in its own process group."""
    return start_celery_worker(
        server.env, server.env["CLAW_CELERY_QUEUE"], log, pool="prefork", concurrency=1, new_session=True
    )


def stop_worker(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
    stop_process(worker)
    try:
        os.killpg(worker.pid, signal.SIGKILL)  # pool children left behind, if any
    except ProcessLookupError:
        pass
    if worker.stdout:
        worker.stdout.close()


def snapshot(api: httpx.Client, snap_id: str) -> dict[str, Any]:
    resp = api.get(f"/api/v1/snapshots/{snap_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def building_mid_way(api: httpx.Client, snap_id: str) -> dict[str, Any] | None:
    snap = snapshot(api, snap_id)
    assert snap["status"] in ("pending", "building"), snap  # finished before it could be killed
    return snap if snap["status"] == "building" and snap["progress"]["steps_done"] > 0 else None


def finished(api: httpx.Client, snap_id: str) -> dict[str, Any] | None:
    snap = snapshot(api, snap_id)
    return snap if snap["status"] in ("done", "failed") else None


def counts(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without what names the snapshot or its build time."""
    return {k: v for k, v in manifest.items() if k not in ("snapshot_id", "created_at", "built_at")}


def task_ids(log: Path) -> set[str]:
    """The ids of the snapshot_build tasks a worker received."""
    return set(re.findall(r"Task curation\.snapshot_build\[([0-9a-f-]+)\] received", log.read_text()))


def done_attempt(log: Callable[[int], str], worker: int, snap_id: str) -> str:
    """The attempt that completed the snapshot, from ``worker``'s log line (written just
    after the build's commit, so possibly after the API already says done)."""
    found = wait_for(
        lambda: re.search(rf"snapshot {snap_id}: done by attempt (\w+), {STEPS} steps", log(worker)),
        f"worker {worker} to log that it completed snapshot {snap_id}",
        60,
    )
    return found.group(1)


def diagnosis(tmp_path: Path, broker: redis.Redis) -> str:
    """What the broker and the workers say, for a timeout's message."""
    logs = [f"--- {p.name} (tail)\n" + p.read_text()[-3000:] for p in sorted(tmp_path.glob("worker-*.log"))]
    keys = {key: broker.type(key) for key in broker.keys("*")}
    index = broker.zrange("unacked_index", 0, -1, withscores=True)
    mutex_ttl = broker.pttl("unacked_mutex")
    return "\n".join([f"broker keys {keys}; unacked_index {index}; unacked_mutex pttl {mutex_ttl}", *logs])


def wait_for(
    predicate: Callable[[], Any], what: str, timeout: float, diagnose: Callable[[], str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{diagnose()}" if diagnose else ""))
