"""The X-Claw-Task header: a black-box agent's proxied calls name the task their prompt group
rolls out (the official OpenAI client, a live server, the demo upstream), and the group's
statistics reach that task."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.proxy_support import auth
from tests.live import live_server

pytestmark = pytest.mark.live


def test_proxied_calls_name_their_task_and_fill_its_statistics(tmp_path, demo_upstream):
    with live_server(tmp_path, {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        key = server.make_key("ingest", "read")
        api = httpx.Client(base_url=f"{server.url}/api/v1", headers=auth(key), timeout=30)
        # given a group of two rollouts (a black-box agent's calls carry the task header)
        assert api.post("/groups", json={"uid": "pg", "expected_rollouts": 2}).status_code == 200
        for r in range(2):
            client = openai.OpenAI(
                base_url=f"{server.url}/v1",
                api_key=key,
                max_retries=0,
                timeout=30,
                default_headers={
                    "X-Claw-Trajectory": f"pg-{r}",
                    "X-Claw-Prompt-Group": "pg",
                    "X-Claw-Task": "web-goal-7",
                },
            )
            client.chat.completions.create(model="claw-demo", messages=[{"role": "user", "content": "go"}])
            # when each rollout ends with a reward
            done = api.post(f"/trajectories/pg-{r}/complete", json={"reward": float(r)})
            assert done.status_code == 200, done.text
        # then the task was created by the header and counts the group
        [task] = api.get("/tasks", params={"uid": "web-goal-7"}).json()["results"]
        assert task["prompt"] is None and task["set"] == ""
        s = task["stats"]
        assert (s["seen"], s["attempted"], s["rewarded"], s["passes"], s["informative_groups"]) == (
            1,
            2,
            2,
            1,
            1,
        )
        # and a task uid longer than a uid may be is a 400 before anything is sent
        bad = httpx.post(
            f"{server.url}/v1/chat/completions",
            headers={**auth(key), "X-Claw-Task": "x" * 200},
            json={"model": "claw-demo", "messages": [{"role": "user", "content": "go"}]},
        )
        assert bad.status_code == 400
