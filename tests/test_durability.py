"""Restart durability: data written over HTTP to a real server process is read back
byte-exact after a clean restart and after SIGKILL (its own SQLite file, or a fresh
PostgreSQL database when DATABASE_URL is set)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest

from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MAX_ID = 2**31 - 1


@pytest.fixture
def server(tmp_path) -> Iterator[LiveServer]:
    with live_server(tmp_path) as srv:
        yield srv


def client(server: LiveServer, key: str) -> httpx.Client:
    # A new client per server life: pooled connections do not survive the process.
    return httpx.Client(
        base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def ok(resp: httpx.Response) -> httpx.Response:
    assert resp.status_code in (200, 201), resp.text
    return resp


def rollout_steps(rng: random.Random) -> list[dict]:
    """3 rollouts x 4 turns sharing a group prompt, with every step field set on some steps."""
    prompt = [0, MAX_ID] + [rng.randrange(150_000) for _ in range(200)]
    steps = []
    for r in range(3):
        ctx = list(prompt)
        for t in range(4):
            n = rng.choice([0, 1, 30])
            response = [rng.randrange(2**31) for _ in range(n)]
            step = {
                "uid": f"dur-r{r}-t{t}",
                "trajectory_uid": f"dur-r{r}",
                "prompt_group_uid": "dur-g",
                "step_index": t,
                "prompt_ids": list(ctx),
                "response_ids": response,
                "rollout_logprobs": [-rng.random() * 10 for _ in response],
                "policy_version": 1 + t // 2,
                "finish_reason": "stop" if response else "length",
                "messages": [{"role": "user", "content": f"turn {t} \u00e9\u4e2d\U0001f600"}],
                "response_text": f"answer {r}.{t}",
                "metadata": {"turn": t, "nested": {"x": [1.5, None, True]}},
            }
            if t % 2:
                step["reward"] = rng.choice([0.0, -1.25, 1e-7])
            steps.append(step)
            ctx = ctx + response + [rng.randrange(150_000) for _ in range(10)]
    return steps


def read_everything(c: httpx.Client, step_uids: list[str]) -> dict[str, bytes]:
    """Raw response bytes of every read endpoint that shows the written data."""
    paths = [f"steps/{u}" for u in step_uids] + [
        "steps?page_size=1000",
        "trajectories?page_size=1000",
        "trajectories/dur-r0",
        "trajectories/dur-explicit",
        "groups/dur-g",
        "events?page_size=1000",
        "feedback?page_size=1000",
        "policy-versions",
        "stats",
    ]
    return {p: ok(c.get(p)).content for p in paths}


def test_everything_written_survives_restart_and_sigkill(server):
    key = server.make_key("ingest", "read", "policy")
    rng = random.Random(42)
    steps = rollout_steps(rng)
    uids = [s["uid"] for s in steps]

    # given a pool written over HTTP: a group, an explicit trajectory, steps in two batches,
    # policy versions, late rewards, completions with rewards, events and feedback
    with client(server, key) as c:
        ok(
            c.post(
                "groups",
                json={
                    "uid": "dur-g",
                    "expected_rollouts": 3,
                    "dataset": "d",
                    "ground_truth": {"answer": "42"},
                },
            )
        )
        ok(c.post("trajectories", json={"uid": "dur-explicit", "channel": "val", "metadata": {"k": "v"}}))
        ok(c.post("steps", json={"steps": steps[:5]}))
        ok(c.post("steps", json={"steps": steps[5:]}))
        ok(c.post("policy-versions", json={"version": 2, "metadata": {"ckpt": "step-200"}}))
        ok(
            c.post(
                "rewards",
                json={
                    "rewards": [
                        {"step_uid": "dur-r0-t0", "reward": 0.5, "source": "human"},
                        {"trajectory_uid": "dur-r2", "reward": -0.75, "source": "model"},
                    ]
                },
            )
        )
        ok(c.post("trajectories/dur-r0/complete", json={"reward": 1.0, "reward_source": "rule"}))
        ok(c.post("trajectories/dur-r1/complete", json={"status": "failed"}))
        ok(
            c.post(
                "events",
                json={
                    "events": [
                        {
                            "type": "tool_call",
                            "step_uid": "dur-r1-t2",
                            "payload": {"cmd": "ls"},
                            "occurred_at": "2026-03-04T05:06:07.123456Z",
                        },
                        {"type": "env_reset", "trajectory_uid": "dur-r2"},
                    ]
                },
            )
        )
        ok(
            c.post(
                "feedback",
                json={
                    "step_uid": "dur-r2-t3",
                    "rating": -1.0,
                    "label": "wrong",
                    "correction": "use grep",
                    "comment": "c",
                    "author": "ann",
                },
            )
        )
        before = read_everything(c, uids)

        # the steps read back are exactly what was written
        for step in steps:
            got = ok(c.get(f"steps/{step['uid']}")).json()
            expected = dict(step)
            if step["uid"] == "dur-r0-t0":
                expected["reward"] = 0.5
            if step["uid"] == "dur-r0-t3":
                expected["is_last"] = True
            for field, value in expected.items():
                assert got[field] == value, (step["uid"], field)

    # when the server is restarted cleanly
    server.restart()
    # then every read returns the same bytes
    with client(server, key) as c:
        assert read_everything(c, uids) == before
        # and the pool keeps working: a retried batch is a duplicate, a new turn extends a stored one
        assert ok(c.post("steps", json={"steps": steps[:5]})).status_code == 200
        last = steps[-1]
        follow = dict(
            last,
            uid="dur-r2-t4",
            step_index=4,
            prompt_ids=last["prompt_ids"] + last["response_ids"] + [7],
            response_ids=[8, 9],
            rollout_logprobs=[-0.5, -0.25],
        )
        follow.pop("reward", None)
        assert ok(c.post("steps", json={"steps": [follow]})).status_code == 201
        uids.append("dur-r2-t4")
        before = read_everything(c, uids)

    # when the process is killed (SIGKILL) right after that write and started again
    server.restart(kill=True)
    # then nothing was lost
    with client(server, key) as c:
        assert read_everything(c, uids) == before
        got = ok(c.get("steps/dur-r2-t4")).json()
        assert got["prompt_ids"] == follow["prompt_ids"] and got["response_ids"] == [8, 9]
        assert got["rollout_logprobs"] == [-0.5, -0.25]
