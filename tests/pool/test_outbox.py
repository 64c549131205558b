"""The task outbox (pool/services/outbox.py): Redis stops mid-run, writes keep answering and
stay durable, and the follow-up tasks they made necessary reach a real Celery worker once
Redis is back: none is lost."""

from __future__ import annotations

import shutil
import time
import uuid

import httpx
import pytest

from tests.live import free_port, live_server, start_celery_worker, start_redis, stop_process

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary"),
]


def group_steps(uid: str) -> list[dict]:
    prompt = list(range(100, 132))
    return [
        {
            "trajectory_uid": f"{uid}-r{r}",
            "prompt_group_uid": uid,
            "step_index": 0,
            "prompt_ids": prompt,
            "response_ids": [r + 1, r + 2],
            "is_last": True,
        }
        for r in range(2)
    ]


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_redis_outage_loses_no_task(tmp_path):
    port = free_port()
    redis = start_redis(port, tmp_path / "redis.log")
    queue = f"claw-outbox-{uuid.uuid4().hex[:8]}"
    env = {
        "REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "CLAW_CELERY_QUEUE": queue,
        "CLAW_OUTBOX_RETRY_SECONDS": "0.5",
    }
    worker = None
    try:
        with live_server(tmp_path, env) as server:
            worker = start_celery_worker(server.env, queue, tmp_path / "worker.log")
            key = server.make_key("ingest", "read")
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
            ) as c:

                def merged_tokens() -> int:
                    return c.get("/api/v1/stats").json()["merge"]["total_tokens"]

                def outbox(name: str | None = None) -> int:
                    where = f"filter(name={name!r})" if name else "all()"
                    out = server.manage(
                        "shell",
                        "-c",
                        f"from pool.models import OutboxTask; print(OutboxTask.objects.{where}.count())",
                    )
                    return int(out.strip().splitlines()[-1])

                # given a group merged by the worker while Redis is up
                for uid in ("before", "during"):
                    c.post("/api/v1/groups", json={"uid": uid, "expected_rollouts": 2}).raise_for_status()
                c.post("/api/v1/steps", json={"steps": group_steps("before")}).raise_for_status()
                one = wait_for(merged_tokens, "the first merge")
                assert outbox() == 0
                # when Redis stops and a write completes another group
                stop_process(redis, kill=True)
                t0 = time.monotonic()
                resp = c.post("/api/v1/steps", json={"steps": group_steps("during")})
                # then the write answers at once and is durable, and its merge waits in the outbox
                assert resp.status_code == 201, resp.text
                assert time.monotonic() - t0 < 5
                assert c.get("/api/v1/steps/during-r1:0").json()["response_ids"] == [2, 3]
                # (with the reward computations the completion also asks for: one per
                # rollout without a final reward, one for the group)
                assert outbox("pool.groups_merge") == 1
                assert outbox() == 4
                # and once Redis is back, the server's relay sends it and the worker merges it
                redis = start_redis(port, tmp_path / "redis.log")
                wait_for(lambda: merged_tokens() == 2 * one, "the merge enqueued during the outage", 90)
                wait_for(lambda: outbox() == 0, "an empty outbox")
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(redis, kill=True)
    assert "pool.groups_merge" in (tmp_path / "worker.log").read_text()
