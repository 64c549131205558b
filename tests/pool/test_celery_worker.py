"""Follow-up work and the broker: with REDIS_URL set (CI's second run) a completed group
really crosses Redis to a Celery worker process; and with the broker down, writes neither
fail nor wait on it."""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest

from tests.live import live_server, refused_port, start_celery_worker

pytestmark = pytest.mark.live


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (a real broker)")
def test_group_completion_is_merged_by_a_real_worker(tmp_path):
    queue = f"claw-test-{uuid.uuid4().hex[:8]}"  # private queue: no other run's worker takes it
    with live_server(tmp_path, {"CLAW_CELERY_QUEUE": queue}) as server:
        worker = start_celery_worker(server.env, queue, tmp_path / "worker.log")
        try:
            key = server.make_key("ingest", "read")
            h = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=server.url, headers=h, timeout=30) as c:
                # given a group that expects two rollouts sharing a prompt
                c.post("/api/v1/groups", json={"uid": "wg", "expected_rollouts": 2}).raise_for_status()
                prompt = list(range(100, 164))
                steps = [
                    {
                        "trajectory_uid": f"wt{r}",
                        "prompt_group_uid": "wg",
                        "step_index": 0,
                        "prompt_ids": prompt,
                        "response_ids": [r + 1, r + 2],
                        "is_last": True,
                    }
                    for r in range(2)
                ]
                # when both rollouts end (the group completes and its merge is enqueued on commit)
                c.post("/api/v1/steps", json={"steps": steps}).raise_for_status()
                # then the worker, not the web process, stores the merge: the stats show it
                deadline = time.monotonic() + 60
                merge = {}
                while time.monotonic() < deadline:
                    merge = c.get("/api/v1/stats").json()["merge"]
                    if merge["total_tokens"]:
                        break
                    time.sleep(0.3)
            assert merge == {"total_tokens": 2 * 66, "unique_tokens": 64 + 2 * 2}, (
                tmp_path / "worker.log"
            ).read_text()
            assert "pool.groups_merge" in (tmp_path / "worker.log").read_text()
        finally:
            worker.terminate()
            worker.wait(timeout=30)


def test_writes_never_wait_on_a_broker_that_is_down(tmp_path):
    # given a server whose broker (Redis) refuses connections
    with (
        refused_port() as port,
        live_server(tmp_path, {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}) as server,
    ):
        key = server.make_key("ingest", "read")
        h = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.url, headers=h, timeout=30) as c:
            c.post("/api/v1/groups", json={"uid": "dg", "expected_rollouts": 1}).raise_for_status()
            step = {
                "trajectory_uid": "dt",
                "prompt_group_uid": "dg",
                "step_index": 0,
                "prompt_ids": [1, 2, 3],
                "response_ids": [4],
                "is_last": True,
            }
            # when a write completes the group (its merge cannot be enqueued)
            t0 = time.monotonic()
            resp = c.post("/api/v1/steps", json={"steps": [step]})
            elapsed = time.monotonic() - t0
            # then the write succeeds at once, and the merge is still served on demand
            assert resp.status_code == 201, resp.text
            assert elapsed < 5, elapsed
            assert c.get("/api/v1/steps/dt:0").json()["response_ids"] == [4]
            tree = c.get("/api/v1/groups/dg/prefix-tree")
            assert tree.status_code == 200 and tree.json()["total_tokens"] == 4
